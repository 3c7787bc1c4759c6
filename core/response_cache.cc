#include "core/response_cache.h"

namespace hora {

int32_t ResponseCache::lookup(const std::string& name, uint64_t signature) const {
  auto it = byName_.find(name);
  if (it == byName_.end() || it->second->response.signature != signature) return -1;
  return static_cast<int32_t>(it->second->bit);
}

const Response* ResponseCache::peek(uint32_t bit, uint64_t signature) const {
  if (bit >= byBit_.size() || !bitUsed_[bit]) return nullptr;
  const Response& r = byBit_[bit]->response;
  return r.signature == signature ? &r : nullptr;
}

const Response* ResponseCache::touch(uint32_t bit) {
  if (bit >= byBit_.size() || !bitUsed_[bit]) return nullptr;
  auto it = byBit_[bit];
  lru_.splice(lru_.begin(), lru_, it);
  return &it->response;
}

int32_t ResponseCache::put(const Response& response) {
  if (capacity_ == 0) return -1;
  auto found = byName_.find(response.name);
  if (found != byName_.end()) {
    // Same name, new parameters (e.g. a shape changed): replace in place so
    // the bit keeps meaning "this name"; stale hits fail the signature check.
    found->second->response = response;
    lru_.splice(lru_.begin(), lru_, found->second);
    return static_cast<int32_t>(found->second->bit);
  }
  uint32_t bit;
  if (byName_.size() >= capacity_) {
    // The new entry inherits the evicted entry's bit, as all ranks do alike.
    auto victim = std::prev(lru_.end());
    bit = victim->bit;
    byName_.erase(victim->response.name);
    lru_.erase(victim);
    ++evictions_;
  } else {
    bit = static_cast<uint32_t>(byBit_.size());
    for (uint32_t b = 0; b < bitUsed_.size(); ++b)
      if (!bitUsed_[b]) {
        bit = b;
        break;
      }
    if (bit == byBit_.size()) {
      byBit_.emplace_back();
      bitUsed_.push_back(false);
    }
  }
  lru_.push_front(Entry{response, bit});
  byName_[response.name] = lru_.begin();
  byBit_[bit] = lru_.begin();
  bitUsed_[bit] = true;
  return static_cast<int32_t>(bit);
}

}  // namespace hora
