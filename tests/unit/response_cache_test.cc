// Unit tests for core/response_cache.h: lookup/peek/touch/put semantics, LRU
// eviction with bit inheritance, in-place replacement, determinism across
// caches (every rank must agree on every bit), and the disabled cache.
#include "core/response_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <list>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace hora {
namespace {

Response resp(const std::string& name, uint64_t signature, int64_t elems = 4) {
  Response r;
  r.kind = ResponseKind::kAllreduce;
  r.name = name;
  r.shape = {elems};
  r.signature = signature;
  return r;
}

TEST(ResponseCacheTest, EmptyCache) {
  ResponseCache c(4);
  EXPECT_EQ(c.capacity(), 4u);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.evictions(), 0u);
  EXPECT_EQ(c.lookup("a", 1), -1);
  EXPECT_EQ(c.peek(0, 1), nullptr);
  EXPECT_EQ(c.touch(0), nullptr);
  EXPECT_EQ(c.touch(12345), nullptr);
}

TEST(ResponseCacheTest, PutAssignsConsecutiveBits) {
  ResponseCache c(8);
  EXPECT_EQ(c.put(resp("a", 1)), 0);
  EXPECT_EQ(c.put(resp("b", 2)), 1);
  EXPECT_EQ(c.put(resp("c", 3)), 2);
  EXPECT_EQ(c.size(), 3u);
}

TEST(ResponseCacheTest, LookupMatchesNameAndSignature) {
  ResponseCache c(8);
  c.put(resp("a", 11));
  c.put(resp("b", 22));
  EXPECT_EQ(c.lookup("a", 11), 0);
  EXPECT_EQ(c.lookup("b", 22), 1);
  EXPECT_EQ(c.lookup("a", 22), -1);  // right name, wrong signature
  EXPECT_EQ(c.lookup("b", 11), -1);
  EXPECT_EQ(c.lookup("c", 11), -1);  // unknown name
}

TEST(ResponseCacheTest, PeekChecksSignature) {
  ResponseCache c(8);
  Response a = resp("a", 11, 17);
  a.dtype = DataType::kFloat64;
  a.op = ReduceOp::kMax;
  a.prescale = 0.5;
  c.put(a);
  const Response* p = c.peek(0, 11);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name, "a");
  EXPECT_EQ(p->shape, std::vector<int64_t>{17});
  EXPECT_EQ(p->dtype, DataType::kFloat64);
  EXPECT_EQ(p->op, ReduceOp::kMax);
  EXPECT_DOUBLE_EQ(p->prescale, 0.5);
  EXPECT_EQ(c.peek(0, 12), nullptr);
  EXPECT_EQ(c.peek(1, 11), nullptr);  // unused bit
  EXPECT_EQ(c.peek(0xffffffffu, 11), nullptr);
}

TEST(ResponseCacheTest, TouchReturnsEntry) {
  ResponseCache c(8);
  c.put(resp("a", 1));
  c.put(resp("b", 2));
  const Response* t = c.touch(1);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name, "b");
  EXPECT_EQ(c.touch(2), nullptr);
}

TEST(ResponseCacheTest, EvictsLeastRecentlyUsedAndInheritsBit) {
  ResponseCache c(3);
  ASSERT_EQ(c.put(resp("a", 1)), 0);
  ASSERT_EQ(c.put(resp("b", 2)), 1);
  ASSERT_EQ(c.put(resp("c", 3)), 2);
  // LRU order (oldest first): a b c. A fourth entry evicts a and takes bit 0.
  EXPECT_EQ(c.put(resp("d", 4)), 0);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.evictions(), 1u);
  EXPECT_EQ(c.lookup("a", 1), -1);
  EXPECT_EQ(c.peek(0, 1), nullptr);  // a's old hit is stale now
  ASSERT_NE(c.peek(0, 4), nullptr);
  EXPECT_EQ(c.peek(0, 4)->name, "d");
  // Next victim is b (bit 1).
  EXPECT_EQ(c.put(resp("e", 5)), 1);
  EXPECT_EQ(c.lookup("b", 2), -1);
  EXPECT_EQ(c.lookup("c", 3), 2);
  EXPECT_EQ(c.evictions(), 2u);
}

TEST(ResponseCacheTest, TouchProtectsFromEviction) {
  ResponseCache c(3);
  c.put(resp("a", 1));
  c.put(resp("b", 2));
  c.put(resp("c", 3));
  ASSERT_NE(c.touch(0), nullptr);     // a becomes most recently used: order b c a
  EXPECT_EQ(c.put(resp("d", 4)), 1);  // evicts b, d inherits bit 1
  EXPECT_EQ(c.lookup("a", 1), 0);
  EXPECT_EQ(c.lookup("b", 2), -1);
  EXPECT_EQ(c.lookup("d", 4), 1);
  EXPECT_EQ(c.put(resp("e", 5)), 2);  // evicts c
  EXPECT_EQ(c.lookup("c", 3), -1);
}

TEST(ResponseCacheTest, LookupAndPeekDoNotChangeLruOrder) {
  ResponseCache c(2);
  c.put(resp("a", 1));
  c.put(resp("b", 2));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(c.lookup("a", 1), 0);
    EXPECT_NE(c.peek(0, 1), nullptr);
  }
  // a is still least recently used and is evicted.
  EXPECT_EQ(c.put(resp("c", 3)), 0);
  EXPECT_EQ(c.lookup("a", 1), -1);
  EXPECT_EQ(c.lookup("b", 2), 1);
}

TEST(ResponseCacheTest, ReplaceSameNameKeepsBitChangesSignature) {
  ResponseCache c(4);
  c.put(resp("a", 1));
  ASSERT_EQ(c.put(resp("w", 100, 8)), 1);
  c.put(resp("b", 2));
  // w's shape changed: new signature, same name.
  EXPECT_EQ(c.put(resp("w", 200, 16)), 1);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.evictions(), 0u);
  EXPECT_EQ(c.peek(1, 100), nullptr);  // stale hits fail
  ASSERT_NE(c.peek(1, 200), nullptr);
  EXPECT_EQ(c.peek(1, 200)->shape, std::vector<int64_t>{16});
  EXPECT_EQ(c.lookup("w", 100), -1);
  EXPECT_EQ(c.lookup("w", 200), 1);
}

TEST(ResponseCacheTest, ReplaceMakesEntryMostRecentlyUsed) {
  ResponseCache c(2);
  c.put(resp("a", 1));
  c.put(resp("b", 2));
  EXPECT_EQ(c.put(resp("a", 10)), 0);  // a refreshed: order b a
  EXPECT_EQ(c.put(resp("c", 3)), 1);   // evicts b
  EXPECT_EQ(c.lookup("a", 10), 0);
  EXPECT_EQ(c.lookup("b", 2), -1);
}

TEST(ResponseCacheTest, ReplaceWhenFullDoesNotEvict) {
  ResponseCache c(2);
  c.put(resp("a", 1));
  c.put(resp("b", 2));
  EXPECT_EQ(c.put(resp("b", 3)), 1);
  EXPECT_EQ(c.put(resp("a", 4)), 0);
  EXPECT_EQ(c.evictions(), 0u);
  EXPECT_EQ(c.size(), 2u);
}

TEST(ResponseCacheTest, SameSignatureReputIsIdempotent) {
  ResponseCache c(2);
  EXPECT_EQ(c.put(resp("a", 1)), 0);
  EXPECT_EQ(c.put(resp("a", 1)), 0);
  EXPECT_EQ(c.size(), 1u);
}

TEST(ResponseCacheTest, CapacityOneAlwaysReusesBitZero) {
  ResponseCache c(1);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(c.put(resp("t" + std::to_string(i), static_cast<uint64_t>(i))), 0);
    EXPECT_EQ(c.size(), 1u);
  }
  EXPECT_EQ(c.evictions(), 9u);
  EXPECT_EQ(c.lookup("t9", 9), 0);
  EXPECT_EQ(c.lookup("t8", 8), -1);
}

TEST(ResponseCacheTest, CapacityZeroDisables) {
  ResponseCache c(0);
  EXPECT_EQ(c.put(resp("a", 1)), -1);
  EXPECT_EQ(c.put(resp("a", 1)), -1);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.lookup("a", 1), -1);
  EXPECT_EQ(c.peek(0, 1), nullptr);
  EXPECT_EQ(c.touch(0), nullptr);
  EXPECT_EQ(c.evictions(), 0u);
}

TEST(ResponseCacheTest, BitsNeverExceedCapacity) {
  ResponseCache c(5);
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    int32_t bit = c.put(resp("n" + std::to_string(rng() % 40), rng() % 3));
    ASSERT_GE(bit, 0);
    ASSERT_LT(bit, 5);
    ASSERT_LE(c.size(), 5u);
  }
}

// A straightforward model of the documented behaviour: a list in MRU order,
// new entries take the lowest free bit or the LRU entry's bit when full.
class ModelCache {
 public:
  explicit ModelCache(size_t cap) : cap_(cap) {}
  int32_t put(const std::string& name, uint64_t sig) {
    if (cap_ == 0) return -1;
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->name == name) {
        E e = *it;
        e.sig = sig;
        lru_.erase(it);
        lru_.push_front(e);
        return static_cast<int32_t>(e.bit);
      }
    }
    uint32_t bit;
    if (lru_.size() >= cap_) {
      bit = lru_.back().bit;
      lru_.pop_back();
    } else {
      bit = static_cast<uint32_t>(lru_.size());  // bits are never freed otherwise
    }
    lru_.push_front({name, sig, bit});
    return static_cast<int32_t>(bit);
  }
  bool touch(uint32_t bit) {
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->bit == bit) {
        E e = *it;
        lru_.erase(it);
        lru_.push_front(e);
        return true;
      }
    }
    return false;
  }
  int32_t lookup(const std::string& name, uint64_t sig) const {
    for (const auto& e : lru_)
      if (e.name == name && e.sig == sig) return static_cast<int32_t>(e.bit);
    return -1;
  }
  size_t size() const { return lru_.size(); }

 private:
  struct E {
    std::string name;
    uint64_t sig;
    uint32_t bit;
  };
  size_t cap_;
  std::list<E> lru_;
};

TEST(ResponseCacheTest, TwoCachesFedSameOperationsStayIdentical) {
  for (size_t capacity : {1u, 2u, 7u, 32u}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    ResponseCache a(capacity);
    ResponseCache b(capacity);
    ModelCache model(capacity);
    std::mt19937 rng(static_cast<uint32_t>(1000 + capacity));
    std::map<std::string, uint64_t> lastSig;
    const int kNames = 48;
    for (int op = 0; op < 1000; ++op) {
      const std::string name = "tensor." + std::to_string(rng() % kNames);
      switch (rng() % 3) {
        case 0:
        case 1: {
          // Put, sometimes with a new signature (shape change).
          uint64_t sig = (rng() % 5 == 0) ? rng() : std::hash<std::string>()(name);
          Response r = resp(name, sig, static_cast<int64_t>(sig % 100));
          int32_t ba = a.put(r);
          int32_t bb = b.put(r);
          ASSERT_EQ(ba, bb) << "op " << op;
          ASSERT_EQ(ba, model.put(name, sig)) << "op " << op;
          lastSig[name] = sig;
          break;
        }
        case 2: {
          // Touch a bit found by lookup, as the coordinator does on a hit.
          auto it = lastSig.find(name);
          if (it == lastSig.end()) break;
          int32_t bit = a.lookup(name, it->second);
          ASSERT_EQ(bit, b.lookup(name, it->second));
          ASSERT_EQ(bit, model.lookup(name, it->second));
          if (bit < 0) break;
          const Response* ta = a.touch(static_cast<uint32_t>(bit));
          const Response* tb = b.touch(static_cast<uint32_t>(bit));
          ASSERT_NE(ta, nullptr);
          ASSERT_NE(tb, nullptr);
          EXPECT_EQ(ta->name, name);
          EXPECT_EQ(tb->name, name);
          ASSERT_TRUE(model.touch(static_cast<uint32_t>(bit)));
          break;
        }
      }
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(a.size(), model.size());
      ASSERT_EQ(a.evictions(), b.evictions());
      // Same bits for every name, on both caches and the model.
      for (const auto& [n, sig] : lastSig) {
        int32_t x = a.lookup(n, sig);
        ASSERT_EQ(x, b.lookup(n, sig)) << n << " op " << op;
        ASSERT_EQ(x, model.lookup(n, sig)) << n << " op " << op;
        if (x >= 0) {
          const Response* pa = a.peek(static_cast<uint32_t>(x), sig);
          const Response* pb = b.peek(static_cast<uint32_t>(x), sig);
          ASSERT_NE(pa, nullptr);
          ASSERT_NE(pb, nullptr);
          EXPECT_EQ(pa->name, n);
          EXPECT_EQ(pa->shape, pb->shape);
        }
      }
    }
    EXPECT_LE(a.size(), capacity);
  }
}

}  // namespace
}  // namespace hora
