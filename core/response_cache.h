// ResponseCache: the negotiated responses of recently seen tensors, each
// addressed by a small integer "bit", so steady-state negotiation sends bits
// instead of names, shapes and dtypes.
//
// Why it stays consistent without extra messages: every rank of a process set
// applies exactly the same sequence of operations (touch on a cached item,
// put on a full cacheable item) in the coordinator's response order, so LRU
// order, evictions and bit assignments agree everywhere. A rank's hit may
// still race with an eviction that is in flight towards it; hits therefore
// carry the request's signature and the coordinator only accepts a hit whose
// bit still holds that signature (otherwise it asks for the full request).
//
// Owned by one process set's control thread; not thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace hora {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t size() const { return byName_.size(); }

  // The bit holding `name` with this signature, or -1. No LRU change.
  int32_t lookup(const std::string& name, uint64_t signature) const;
  // The response at `bit` if its signature matches, else nullptr. No LRU change.
  const Response* peek(uint32_t bit, uint64_t signature) const;
  // The response at `bit` (must exist), marking it most recently used.
  const Response* touch(uint32_t bit);
  // Inserts or replaces the entry for response.name (cacheable responses
  // only), evicting the least recently used entry when full; returns its bit,
  // or -1 when the cache is disabled (capacity 0).
  int32_t put(const Response& response);
  // Entries evicted so far (for the "cache too small" hint).
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    Response response;
    uint32_t bit;
  };
  size_t capacity_;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> byName_;
  std::vector<std::list<Entry>::iterator> byBit_;
  std::vector<bool> bitUsed_;
  uint64_t evictions_ = 0;
};

}  // namespace hora
