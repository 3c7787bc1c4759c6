#include "ops/gloo/gloo_store_adapter.h"

#include <gloo/common/error.h>

#include <algorithm>

namespace hora {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<hora::Store> store,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  Status s = store_->set(key, std::string(data.begin(), data.end()));
  if (!s.isOk()) fail(s.withContext("rendezvous set '" + key + "'"));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  Result<std::string> r = store_->get(key, timeout_);
  if (!r.isOk()) fail(r.status().withContext("rendezvous get '" + key + "'"));
  const std::string& v = r.value();
  return std::vector<char>(v.begin(), v.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes its own default (30 s) here; never wait longer than asked
  // by the hora options, and treat a non-positive value as "use ours".
  std::chrono::milliseconds t = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
  Status s = store_->wait(keys, t);
  if (!s.isOk()) fail(s.withContext("rendezvous wait"));
}

Status GlooStoreAdapter::firstError() const {
  std::lock_guard<std::mutex> lock(mu_);
  return firstError_;
}

void GlooStoreAdapter::fail(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (firstError_.isOk()) firstError_ = s;
  }
  throw gloo::IoException(s.toString());
}

}  // namespace hora
