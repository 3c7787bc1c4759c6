// Store: the key/value rendezvous interface.
//
// Ranks publish and look up connection details here at start-up (Gloo pair
// addresses, the coordinator's control-plane address, process-set
// rendezvous). Implementations: TcpStoreClient (core/tcp_store.h, the real
// one, authenticated), MemoryStore (core/memory_store.h, in-process, for
// thread-mode tests), PrefixStore (namespacing wrapper) and WatchedStore
// (waits that end early when a peer is known to be gone).
//
// Called from the thread that initializes a runtime or a process set (never
// on the hot path). Implementations must be safe to call from several threads
// at once, because two runtimes in one process may share a MemoryStore.
// Values are arbitrary bytes held in std::string.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace hora {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists (or `timeout` passes: kTimeout naming the key).
  virtual Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (missing = 0); returns the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists; kTimeout names the keys still missing.
  virtual Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Whether `key` exists now (no waiting).
  virtual Result<bool> check(const std::string& key) = 0;
  virtual Status remove(const std::string& key) = 0;
};

// Prepends "<prefix>/" to every key; shares the underlying store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix) + "/") {}
  Status set(const std::string& key, const std::string& value) override {
    return base_->set(prefix_ + key, value);
  }
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->get(prefix_ + key, timeout);
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return base_->wait(full, timeout);
  }
  Result<bool> check(const std::string& key) override { return base_->check(prefix_ + key); }
  Status remove(const std::string& key) override { return base_->remove(prefix_ + key); }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

// A store whose waits (get and wait) run in slices while `armed` is set,
// calling `check` between two: its error ends the wait at once. For a
// process set's data-plane set-up, where every rank waits for every other's
// keys: a peer whose control connection closed has died and will never
// write them, and its survivors should say so now, not after the start
// timeout. Disarmed (once the set's event loop runs and owns the
// connections), every call passes straight through. Everything else always
// does.
class WatchedStore : public Store {
 public:
  WatchedStore(std::shared_ptr<Store> base, std::function<Status()> check,
               std::shared_ptr<std::atomic<bool>> armed,
               std::chrono::milliseconds slice = std::chrono::milliseconds(100))
      : base_(std::move(base)), check_(std::move(check)), armed_(std::move(armed)), slice_(slice) {}
  Status set(const std::string& key, const std::string& value) override {
    return base_->set(key, value);
  }
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return watched<Result<std::string>>(
        timeout, [&](std::chrono::milliseconds t) { return base_->get(key, t); });
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    return base_->add(key, delta);
  }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return watched<Status>(timeout,
                           [&](std::chrono::milliseconds t) { return base_->wait(keys, t); });
  }
  Result<bool> check(const std::string& key) override { return base_->check(key); }
  Status remove(const std::string& key) override { return base_->remove(key); }

 private:
  static const Status& statusOf(const Status& s) { return s; }
  template <typename T>
  static const Status& statusOf(const Result<T>& r) {
    return r.status();
  }
  template <typename R, typename F>
  R watched(std::chrono::milliseconds timeout, F&& call) {
    if (!armed_ || !armed_->load() || timeout <= slice_) return call(timeout);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      R r = call(std::max(std::chrono::milliseconds(1), std::min(slice_, left)));
      if (statusOf(r).code() != Code::kTimeout || left <= slice_ || !armed_->load()) return r;
      Status alive = check_();
      if (!alive.isOk()) {
        // What this waits for may have been written just before the peer
        // closed (a coordinator that gives up writes why first, then
        // exits): that answer explains more than the closed connection.
        // A plain value from a peer that then died lets the caller go on
        // one step; the loss then surfaces where it next needs that peer
        // (its control connection, a data-plane connect), within their
        // own timeouts.
        R last = call(std::chrono::milliseconds(1));
        if (statusOf(last).isOk()) return last;
        return alive;
      }
    }
  }

  std::shared_ptr<Store> base_;
  std::function<Status()> check_;
  std::shared_ptr<std::atomic<bool>> armed_;
  std::chrono::milliseconds slice_;
};

// Collective over `ranks` (which hold `rank`): publishes `mine` under
// "<key>/<rank>" and returns the values of `ranks`, in their order. An error
// names the first rank that did not publish within `timeout`, with `who` (the
// set-up that asked) as context. The data planes' set-ups agree through it
// (every rank's host, settings, yes or no).
Result<std::vector<std::string>> exchangeValues(Store& store, const std::string& key, int rank,
                                                const std::vector<int>& ranks,
                                                const std::string& mine,
                                                std::chrono::milliseconds timeout,
                                                const std::string& who);
// 0, 1, ..., size - 1.
std::vector<int> allRanks(int size);

}  // namespace hora
