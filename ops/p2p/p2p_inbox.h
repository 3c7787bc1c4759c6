// P2pInbox: one rank's shared-memory inbox for point-to-point messages from
// the other ranks of its process set on the same host.
//
// The owner creates it lazily, on its set's first send or receive, and
// publishes its name through the set's store; a peer maps it the first time
// it talks to the owner. It holds one single-producer single-consumer byte
// ring per sending rank (ring s carries what set rank s sends to the owner)
// and a doorbell the owner sleeps on when it has nothing to do. A byte
// stream per ordered pair keeps the point-to-point protocol
// (ops/p2p/p2p_engine.h) independent of how the bytes travel.
//
// Beside each ring, a fast box (P2pFastArea): a few one-cache-line slots
// that carry a whole small message (header and up to 32 bytes of data) and
// one line of acknowledgements. A ring message costs the receiver the ring's
// head, a 128-byte frame and the payload, and the sender the receiver's
// 128-byte accept frame: five or more cache lines that cross between cores,
// one after another. A fast-box message is one line each way, which is what
// a 4-byte send/recv needs to come near Open MPI's shared-memory fast box.
// Everything in area s of an inbox is written by set rank s and read by the
// owner.
//
// Threads: the producer side (write) is used by the sending peer's engine,
// the consumer side (readable/read) by the owner's engine, each under its
// engine's lock; head and tail are the only words both sides touch (release
// on publish, acquire on read orders the ring data with them).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "ops/shm/shm_segment.h"

namespace hora {

struct alignas(64) P2pRingCtl {
  std::atomic<uint64_t> head{0};  // bytes written so far (producer)
  char pad0[56];
  std::atomic<uint64_t> tail{0};  // bytes read so far (consumer)
  char pad1[56];
};

struct P2pInboxHeader {
  uint64_t magic;
  uint32_t version;
  int32_t pid;  // the owner, to tell a dead peer from a slow one
  uint32_t rings;
  uint32_t reserved;
  uint64_t ringBytes;
  ShmCounter sleeping;  // 1 while the owner may be asleep on `doorbell`
  ShmCounter doorbell;
  ShmCounter closed;  // 1 once the owner shut down: what it has not sent never comes
  // 1 + the CPU the owner's polling thread last started polling on (0: not
  // known): a peer that waits on the same CPU yields to it instead of
  // spinning (P2pEngine::poll).
  ShmCounter pollerCpu;
};

// One small message in one cache line. The sender fills the line and stores
// `stamp` last (release); the receiver owns it once it reads the stamp it
// expects (acquire). A sender reuses a slot only after the message it held
// was accepted or rejected, so the receiver never sees a slot half rewritten.
constexpr uint32_t kP2pFastSlots = 8;
constexpr size_t kP2pFastDataBytes = 32;
constexpr int kP2pFastMaxDims = 4;
struct alignas(64) P2pFastSlot {
  std::atomic<uint32_t> stamp{0};  // fast-box sequence number + 1 (mod 2^32)
  uint32_t seqLow = 0;             // low 32 bits of the message's sequence number
  int64_t tag = 0;
  uint8_t dtype = 0;
  uint8_t ndim = 0;
  uint16_t bytes = 0;
  uint16_t dims[kP2pFastMaxDims] = {};
  uint32_t reserved = 0;
  unsigned char data[kP2pFastDataBytes] = {};
};
static_assert(sizeof(P2pFastSlot) == 64, "a fast-box slot is one cache line");

// acked[i] = fast-box sequence number + 1 of the last message in slot i of
// the *other* direction that the writer of this area accepted.
struct alignas(64) P2pFastAcks {
  std::atomic<uint32_t> acked[kP2pFastSlots] = {};
};

struct P2pFastArea {
  P2pFastSlot slots[kP2pFastSlots];
  P2pFastAcks acks;
};

constexpr uint64_t kP2pInboxMagic = 0x686f72612d703270ULL;  // "hora-p2p"
constexpr uint32_t kP2pInboxVersion = 2;                    // 2: fast boxes

class P2pInbox {
 public:
  // Creates `dir`/`name` with `rings` rings of `ringBytes` (a power of two),
  // its memory reserved up front (a full /dev/shm is an error here, not a
  // SIGBUS later).
  static Result<std::unique_ptr<P2pInbox>> create(const std::string& dir, const std::string& name,
                                                  uint32_t rings, uint64_t ringBytes);
  // Maps a peer's inbox and checks its header.
  static Result<std::unique_ptr<P2pInbox>> open(const std::string& dir, const std::string& name);
  ~P2pInbox();
  P2pInbox(const P2pInbox&) = delete;
  P2pInbox& operator=(const P2pInbox&) = delete;

  // Producer: copies up to n bytes into ring `ring`; returns how many fit.
  size_t write(uint32_t ring, const void* data, size_t n);
  size_t writable(uint32_t ring) const;
  // Consumer: bytes waiting in ring `ring`, and reading them (up to n; data
  // null discards them).
  size_t readable(uint32_t ring) const;
  size_t read(uint32_t ring, void* data, size_t n);
  // Fast box `ring`: written by set rank `ring`, read by the owner.
  P2pFastArea& fast(uint32_t ring) const;

  P2pInboxHeader& header() { return *static_cast<P2pInboxHeader*>(base_); }
  int32_t ownerPid() const { return static_cast<const P2pInboxHeader*>(base_)->pid; }
  uint32_t rings() const { return rings_; }
  uint64_t ringBytes() const { return ringBytes_; }
  // Wakes the owner if it said it may be asleep.
  void ring() noexcept;
  // Removes the file (mappings stay valid); owner only, idempotent.
  void unlink() noexcept;
  const std::string& path() const { return path_; }

 private:
  P2pInbox(void* base, size_t bytes, uint32_t rings, uint64_t ringBytes, std::string path,
           bool owner);
  P2pRingCtl& ctl(uint32_t ring) const;
  uint8_t* data(uint32_t ring) const;

  void* base_;
  size_t bytes_;
  uint32_t rings_;
  uint64_t ringBytes_;
  std::string path_;
  bool owner_;
  bool unlinked_ = false;
};

// Removes inboxes in `dir` left by processes of this user that no longer
// exist (a rank that crashed cannot unlink its own).
void sweepDeadP2pInboxes(const std::string& dir) noexcept;

}  // namespace hora
