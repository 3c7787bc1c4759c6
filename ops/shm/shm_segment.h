// ShmSegment: one rank's shared-memory segment for ShmBackend, and the
// cross-process wait/notify it needs.
//
// Each rank of a process set on one host owns one segment (a file in
// /dev/shm, unlinked once every peer has mapped it, so nothing outlives the
// job): a header of progress counters that only the owner writes and peers
// read, followed by two data slots the owner packs its input into and peers
// read from. Peers map each other's segments; the counters are lock-free
// atomics in the shared mapping (release on publish, acquire on read orders
// the slot data with them).
//
// Waiting: a rank spins briefly, then sleeps on a futex word ("doorbell") in
// its own header; whoever publishes progress rings the doorbell of each peer
// that announced it is sleeping. Sleeps are bounded (a few ms) so that the
// waiter re-checks abort flags, its deadline and whether the peer's process
// still exists: a peer that died or stalls cannot hang the waiter.
//
// Created and mapped on the process set's init thread; afterwards used by
// that set's executor thread only, except ringDoorbell(), which abort() may
// call from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace hora {

struct alignas(64) ShmCounter {
  std::atomic<uint32_t> value{0};
};

// Layout of the first page of a segment. Counters count chunks since the
// backend was created (wrapping at 2^32; compared by signed difference).
struct ShmHeader {
  uint64_t magic;
  uint32_t version;
  int32_t pid;  // owner's process, to tell a dead peer from a slow one
  uint64_t slotBytes;
  ShmCounter packed;    // chunks whose input this rank has packed into its slot
  ShmCounter reduced;   // chunks whose part this rank has reduced (in its slot)
  ShmCounter consumed;  // chunks this rank has finished reading from all slots
  ShmCounter sleeping;  // 1 while the owner may be asleep on `doorbell`
  ShmCounter doorbell;  // futex word the owner sleeps on
  // 1 once the owner's backend was aborted (its set failed or shut down): a
  // peer waiting for it, or for a rank that waits for it, gives up at once
  // instead of after the timeout. The owner's control thread may be the one
  // waiting (HORA_RUN_ON_CONTROL_MAX_BYTES), reading no abort frames.
  ShmCounter gaveUp;
  // An allreduce packed ahead of its agreement (ShmBackend::prepackAllreduce
  // with a peer key): the chunk whose slot holds its first chunk (c + 1; 0:
  // none) and its key (the peer key mixed with the chunk's length), the key
  // written before the chunk. A peer that runs the allreduce of that key at
  // that chunk reads the slot without waiting for `packed`: the wait the
  // pack ahead saves is then a round of the owner's scheduling.
  ShmCounter prepackedChunk;
  struct alignas(64) {
    std::atomic<uint64_t> value{0};
  } prepackedKey;
};

constexpr uint64_t kShmMagic = 0x686f72612d73686dULL;  // "hora-shm"
constexpr uint32_t kShmVersion = 3;
constexpr size_t kShmHeaderBytes = 4096;
static_assert(sizeof(ShmHeader) <= kShmHeaderBytes, "header must fit its page");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

class ShmSegment {
 public:
  // Creates this rank's segment as a new file `dir`/<name> with two slots of
  // `slotBytes`, reserves its memory (posix_fallocate: a full /dev/shm is an
  // error here, not a SIGBUS later) and maps it with its pages populated.
  static Result<std::unique_ptr<ShmSegment>> create(const std::string& dir, const std::string& name,
                                                    size_t slotBytes);
  // Maps a peer's segment and checks its header (magic, version, slot size).
  static Result<std::unique_ptr<ShmSegment>> open(const std::string& dir, const std::string& name,
                                                  size_t slotBytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes the file (the mapping stays valid). Idempotent; owner only.
  void unlink() noexcept;

  ShmHeader& header() { return *static_cast<ShmHeader*>(base_); }
  uint8_t* slot(uint32_t chunk) {
    return static_cast<uint8_t*>(base_) + kShmHeaderBytes + (chunk % 2) * slotBytes_;
  }
  size_t slotBytes() const { return slotBytes_; }
  const std::string& path() const { return path_; }

 private:
  ShmSegment(void* base, size_t bytes, size_t slotBytes, std::string path, bool owner)
      : base_(base), bytes_(bytes), slotBytes_(slotBytes), path_(std::move(path)), owner_(owner) {}
  void* base_;
  size_t bytes_;
  size_t slotBytes_;
  std::string path_;
  bool owner_;
  bool unlinked_ = false;
};

// Sleeps on `word` while it still holds `expected`, at most `timeoutMs`
// (spurious and early wake-ups are fine: callers re-check). Works across
// processes (shared futex).
void shmFutexWait(std::atomic<uint32_t>& word, uint32_t expected, int timeoutMs) noexcept;
// Bumps `word` and wakes every sleeper on it.
void shmFutexWakeAll(std::atomic<uint32_t>& word) noexcept;

// Whether counter value `have` has reached `want` (modulo 2^32).
inline bool shmReached(uint32_t have, uint32_t want) {
  return static_cast<int32_t>(have - want) >= 0;
}

}  // namespace hora
