// ShmMailbox: the shared memory a process set negotiates through when every
// one of its ranks runs on one host (issue 20).
//
// Set rank 0 (the coordinator) creates one file in /dev/shm for the set; the
// other ranks map it and it is unlinked once all have (nothing outlives the
// job). It holds, for every worker rank r, two single-producer
// single-consumer byte rings: "up" (r writes, the coordinator reads) and
// "down" (the coordinator writes, r reads), and one "polling" word per rank
// that counts that rank's threads polling the mailbox now (its control
// thread, a framework thread doing its work); at 0 they may all sleep, and a
// writer must wake the rank another way (the control plane sends a doorbell
// frame over its TCP connection, controllers/shm_lane.h),
// next to a liveness time it refreshes while it is busy elsewhere (running
// a collective itself: its peers then do not take its silence on the
// sockets for a stall).
// The rings carry byte streams; the framing of what travels in them is the
// control plane's (controllers/shm_lane.h).
//
// Threads: each ring is written by one control thread and read by one
// other (of another process); head and tail are the only words both sides
// touch (release on publish, acquire on read orders the ring data with
// them). Created and mapped on the thread that creates the process set.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace hora {

struct alignas(64) ShmMailboxRing {
  std::atomic<uint64_t> head{0};  // bytes written so far (producer)
  char pad0[56];
  std::atomic<uint64_t> tail{0};  // bytes read so far (consumer)
  char pad1[56];
};

struct alignas(64) ShmMailboxFlag {
  std::atomic<uint32_t> value{0};
  // CLOCK_MONOTONIC (ns) when this rank's control thread last said it is
  // alive while busy outside its event loop (ShmLane::markAlive); 0: never.
  std::atomic<int64_t> aliveNs{0};
};

struct ShmMailboxHeader {
  uint64_t magic;
  uint32_t version;
  int32_t pid;  // the creator's process
  int32_t ranks;
  uint32_t reserved;
  uint64_t ringBytes;
};

constexpr uint64_t kShmMailboxMagic = 0x686f72612d6e6567ULL;  // "hora-neg"
constexpr uint32_t kShmMailboxVersion = 2;

class ShmMailbox {
 public:
  // Creates `dir`/`name` for `ranks` ranks with rings of `ringBytes` (a
  // power of two, at least 4096), its memory reserved up front.
  static Result<std::unique_ptr<ShmMailbox>> create(const std::string& dir, const std::string& name,
                                                    int ranks, uint64_t ringBytes);
  // Maps a mailbox the coordinator created and checks its header.
  static Result<std::unique_ptr<ShmMailbox>> open(const std::string& path, int ranks);
  ~ShmMailbox();
  ShmMailbox(const ShmMailbox&) = delete;
  ShmMailbox& operator=(const ShmMailbox&) = delete;

  // The ring worker `rank` writes to the coordinator, and the one back.
  static uint32_t upRing(int rank) { return 2u * static_cast<uint32_t>(rank); }
  static uint32_t downRing(int rank) { return 2u * static_cast<uint32_t>(rank) + 1; }

  // Producer: copies up to n bytes into `ring`; returns how many fit.
  size_t write(uint32_t ring, const void* data, size_t n);
  // Consumer: bytes waiting in `ring`, and reading up to n of them.
  size_t readable(uint32_t ring) const;
  size_t read(uint32_t ring, void* data, size_t n);
  // 1 while `rank`'s control thread polls the mailbox.
  std::atomic<uint32_t>& polling(int rank);
  // `rank`'s liveness time (ShmMailboxFlag::aliveNs).
  std::atomic<int64_t>& aliveNs(int rank);

  int ranks() const { return ranks_; }
  uint64_t ringBytes() const { return ringBytes_; }
  const std::string& path() const { return path_; }
  // Removes the file (mappings stay valid). Idempotent; creator only.
  void unlink() noexcept;

 private:
  ShmMailbox(void* base, size_t bytes, int ranks, uint64_t ringBytes, std::string path, bool owner);
  ShmMailboxRing& ctl(uint32_t ring) const;
  uint8_t* data(uint32_t ring) const;

  void* base_;
  size_t bytes_;
  int ranks_;
  uint64_t ringBytes_;
  std::string path_;
  bool owner_;
  bool unlinked_ = false;
};

}  // namespace hora
