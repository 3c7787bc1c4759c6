#include "core/memory_store.h"

namespace hora {

Status MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
  return Status::ok();
}

Result<std::string> MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return data_.count(key) > 0; }))
    return timeoutError("store key '" + key + "' did not appear within " +
                        std::to_string(timeout.count()) + " ms");
  return data_[key];
}

Result<int64_t> MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) v = std::stoll(it->second);
    v += delta;
    data_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

Status MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  auto allThere = [&] {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (!cv_.wait_for(lk, timeout, allThere)) {
    std::string missing;
    for (const auto& k : keys)
      if (!data_.count(k)) missing += (missing.empty() ? "" : ", ") + k;
    return timeoutError("store keys still missing after " + std::to_string(timeout.count()) +
                        " ms: " + missing);
  }
  return Status::ok();
}

Result<bool> MemoryStore::check(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  return data_.count(key) > 0;
}

Status MemoryStore::remove(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  data_.erase(key);
  return Status::ok();
}

}  // namespace hora
