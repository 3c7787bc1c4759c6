// GlooStoreAdapter: presents a hora::Store as a gloo::rendezvous::Store so
// that gloo::rendezvous::Context::connectFullMesh can exchange pair addresses
// through hora's rendezvous (TCP store, or MemoryStore in thread-mode tests).
//
// Used only by createGlooBackend, on the thread that builds the backend, for
// the duration of connectFullMesh. Gloo's Store interface reports failure by
// throwing, so this adapter throws gloo::IoException; it also keeps the first
// hora Status that failed so the factory can return that (with its code, e.g.
// kTimeout naming the missing key) instead of a flattened Gloo message.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/store.h"

namespace hora {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // `store` should already be namespaced (PrefixStore); `timeout` bounds every
  // get/wait, including Gloo's wait() overload that carries no timeout.
  GlooStoreAdapter(std::shared_ptr<hora::Store> store, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first hora-side failure seen, or OK.
  Status firstError() const;

 private:
  // Records `s` (if it is the first failure) and throws gloo::IoException.
  [[noreturn]] void fail(const Status& s);

  std::shared_ptr<hora::Store> store_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  Status firstError_;  // guarded by mu_
};

}  // namespace hora
