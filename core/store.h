// Store: the key/value rendezvous interface.
//
// Ranks publish and look up connection details here at start-up (Gloo pair
// addresses, the coordinator's control-plane address, process-set
// rendezvous). Implementations: TcpStoreClient (core/tcp_store.h, the real
// one, authenticated), MemoryStore (core/memory_store.h, in-process, for
// thread-mode tests) and PrefixStore (namespacing wrapper).
//
// Called from the thread that initializes a runtime or a process set (never
// on the hot path). Implementations must be safe to call from several threads
// at once, because two runtimes in one process may share a MemoryStore.
// Values are arbitrary bytes held in std::string.
#pragma once

#include <chrono>
#include <cstdint>
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

}  // namespace hora
