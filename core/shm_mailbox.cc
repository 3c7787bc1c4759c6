#include "core/shm_mailbox.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace hora {
namespace {

constexpr size_t kHeaderBytes = 4096;

size_t mailboxBytes(int ranks, uint64_t ringBytes) {
  const size_t rings = 2 * static_cast<size_t>(ranks);
  return kHeaderBytes + static_cast<size_t>(ranks) * sizeof(ShmMailboxFlag) +
         rings * sizeof(ShmMailboxRing) + rings * static_cast<size_t>(ringBytes);
}

std::string errnoText(int e) { return std::string(std::strerror(e)); }

}  // namespace

ShmMailbox::ShmMailbox(void* base, size_t bytes, int ranks, uint64_t ringBytes, std::string path,
                       bool owner)
    : base_(base),
      bytes_(bytes),
      ranks_(ranks),
      ringBytes_(ringBytes),
      path_(std::move(path)),
      owner_(owner) {}

Result<std::unique_ptr<ShmMailbox>> ShmMailbox::create(const std::string& dir,
                                                       const std::string& name, int ranks,
                                                       uint64_t ringBytes) {
  if (ranks < 1 || ringBytes < 4096 || (ringBytes & (ringBytes - 1)) != 0)
    return invalidArgument("negotiation mailbox: bad rank count or ring size");
  const std::string path = dir + "/" + name;
  const size_t bytes = mailboxBytes(ranks, ringBytes);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return systemError("cannot create the negotiation mailbox " + path + ": " + errnoText(errno));
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return systemError("cannot reserve " + std::to_string(bytes >> 10) + " KiB in " + dir +
                       " for the negotiation mailbox: " + errnoText(rc));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::unlink(path.c_str());
    return systemError("cannot map " + path + ": " + errnoText(mapErr));
  }
  std::unique_ptr<ShmMailbox> m(new ShmMailbox(base, bytes, ranks, ringBytes, path, true));
  for (int r = 0; r < ranks; ++r) new (&m->polling(r)) std::atomic<uint32_t>(0);
  for (uint32_t i = 0; i < 2u * static_cast<uint32_t>(ranks); ++i)
    new (&m->ctl(i)) ShmMailboxRing();
  auto* h = new (base) ShmMailboxHeader();
  h->magic = kShmMailboxMagic;
  h->version = kShmMailboxVersion;
  h->pid = static_cast<int32_t>(::getpid());
  h->ranks = ranks;
  h->ringBytes = ringBytes;
  std::atomic_thread_fence(std::memory_order_release);
  return m;
}

Result<std::unique_ptr<ShmMailbox>> ShmMailbox::open(const std::string& path, int ranks) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return systemError("cannot open the negotiation mailbox " + path + ": " + errnoText(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kHeaderBytes) {
    ::close(fd);
    return systemError("the negotiation mailbox " + path + " is too small");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (base == MAP_FAILED) return systemError("cannot map " + path + ": " + errnoText(mapErr));
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto* h = static_cast<const ShmMailboxHeader*>(base);
  const uint64_t ringBytes = h->ringBytes;
  if (h->magic != kShmMailboxMagic || h->version != kShmMailboxVersion || h->ranks != ranks ||
      ringBytes < 4096 || (ringBytes & (ringBytes - 1)) != 0 ||
      mailboxBytes(ranks, ringBytes) != bytes) {
    ::munmap(base, bytes);
    return systemError(path + " is not a hora v" + std::to_string(kShmMailboxVersion) +
                       " negotiation mailbox for " + std::to_string(ranks) + " ranks");
  }
  return std::unique_ptr<ShmMailbox>(new ShmMailbox(base, bytes, ranks, ringBytes, path, false));
}

ShmMailbox::~ShmMailbox() {
  if (owner_) unlink();
  ::munmap(base_, bytes_);
}

void ShmMailbox::unlink() noexcept {
  if (!owner_ || unlinked_) return;
  unlinked_ = true;
  ::unlink(path_.c_str());
}

std::atomic<uint32_t>& ShmMailbox::polling(int rank) {
  auto* flags = reinterpret_cast<ShmMailboxFlag*>(static_cast<uint8_t*>(base_) + kHeaderBytes);
  return flags[rank].value;
}

std::atomic<int64_t>& ShmMailbox::aliveNs(int rank) {
  auto* flags = reinterpret_cast<ShmMailboxFlag*>(static_cast<uint8_t*>(base_) + kHeaderBytes);
  return flags[rank].aliveNs;
}

ShmMailboxRing& ShmMailbox::ctl(uint32_t ring) const {
  auto* p = static_cast<uint8_t*>(base_) + kHeaderBytes +
            static_cast<size_t>(ranks_) * sizeof(ShmMailboxFlag);
  return reinterpret_cast<ShmMailboxRing*>(p)[ring];
}

uint8_t* ShmMailbox::data(uint32_t ring) const {
  const size_t rings = 2 * static_cast<size_t>(ranks_);
  auto* p = static_cast<uint8_t*>(base_) + kHeaderBytes +
            static_cast<size_t>(ranks_) * sizeof(ShmMailboxFlag) + rings * sizeof(ShmMailboxRing);
  return p + static_cast<size_t>(ring) * static_cast<size_t>(ringBytes_);
}

size_t ShmMailbox::write(uint32_t ring, const void* src, size_t n) {
  ShmMailboxRing& c = ctl(ring);
  const uint64_t head = c.head.load(std::memory_order_relaxed);
  const uint64_t used = head - c.tail.load(std::memory_order_acquire);
  if (used > ringBytes_) return 0;  // corrupted by a misbehaving peer: write nothing
  n = std::min<size_t>(n, static_cast<size_t>(ringBytes_ - used));
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(head & (ringBytes_ - 1));
  const size_t first = std::min(n, static_cast<size_t>(ringBytes_) - at);
  uint8_t* d = data(ring);
  std::memcpy(d + at, src, first);
  if (first < n) std::memcpy(d, static_cast<const uint8_t*>(src) + first, n - first);
  c.head.store(head + n, std::memory_order_release);
  return n;
}

size_t ShmMailbox::readable(uint32_t ring) const {
  ShmMailboxRing& c = ctl(ring);
  const uint64_t avail =
      c.head.load(std::memory_order_acquire) - c.tail.load(std::memory_order_relaxed);
  return avail > ringBytes_ ? 0 : static_cast<size_t>(avail);
}

size_t ShmMailbox::read(uint32_t ring, void* dst, size_t n) {
  ShmMailboxRing& c = ctl(ring);
  const uint64_t tail = c.tail.load(std::memory_order_relaxed);
  const uint64_t avail = c.head.load(std::memory_order_acquire) - tail;
  if (avail > ringBytes_) return 0;
  n = std::min<size_t>(n, static_cast<size_t>(avail));
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(tail & (ringBytes_ - 1));
  const size_t first = std::min(n, static_cast<size_t>(ringBytes_) - at);
  const uint8_t* s = data(ring);
  std::memcpy(dst, s + at, first);
  if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, s, n - first);
  c.tail.store(tail + n, std::memory_order_release);
  return n;
}

}  // namespace hora
