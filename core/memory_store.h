// MemoryStore: an in-process Store for thread-mode tests and size-1 jobs.
//
// Several runtimes in one process (ranks as threads) share one instance.
// Thread-safe: one mutex guards the map; waiters sleep on a condition
// variable that every set()/add() signals.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "core/store.h"

namespace hora {

class MemoryStore : public Store {
 public:
  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<bool> check(const std::string& key) override;
  Status remove(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;  // guarded by mu_
};

}  // namespace hora
