#include "ops/p2p/p2p_inbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace hora {
namespace {

constexpr size_t kPage = 4096;

size_t ctlOffset() { return kPage; }
size_t roundPage(size_t n) { return (n + kPage - 1) / kPage * kPage; }
size_t fastOffset(uint32_t rings) { return kPage + roundPage(rings * sizeof(P2pRingCtl)); }
size_t dataOffset(uint32_t rings) {
  return fastOffset(rings) + roundPage(rings * sizeof(P2pFastArea));
}
std::string errnoText(int e) { return std::string(std::strerror(e)); }

}  // namespace

P2pInbox::P2pInbox(void* base, size_t bytes, uint32_t rings, uint64_t ringBytes, std::string path,
                   bool owner)
    : base_(base),
      bytes_(bytes),
      rings_(rings),
      ringBytes_(ringBytes),
      path_(std::move(path)),
      owner_(owner) {}

Result<std::unique_ptr<P2pInbox>> P2pInbox::create(const std::string& dir, const std::string& name,
                                                   uint32_t rings, uint64_t ringBytes) {
  if (rings == 0 || ringBytes < 4096 || (ringBytes & (ringBytes - 1)) != 0)
    return invalidArgument("point-to-point inbox: " + std::to_string(ringBytes) +
                           "-byte rings (HORA_P2P_RING_BYTES must be a power of two >= 4096)");
  const std::string path = dir + "/" + name;
  const size_t bytes = dataOffset(rings) + static_cast<size_t>(rings) * ringBytes;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return systemError("cannot create point-to-point inbox " + path + ": " + errnoText(errno));
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return systemError("cannot reserve " + std::to_string(bytes >> 10) + " KiB in " + dir +
                       " for the point-to-point inbox " + path + ": " + errnoText(rc) +
                       " (is /dev/shm too small? HORA_P2P_RING_BYTES sets the size per peer)");
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::unlink(path.c_str());
    return systemError("cannot map " + path + ": " + errnoText(mapErr));
  }
  auto* h = new (base) P2pInboxHeader();
  h->magic = kP2pInboxMagic;
  h->version = kP2pInboxVersion;
  h->pid = static_cast<int32_t>(::getpid());
  h->rings = rings;
  h->ringBytes = ringBytes;
  auto* ctl = reinterpret_cast<P2pRingCtl*>(static_cast<uint8_t*>(base) + ctlOffset());
  for (uint32_t i = 0; i < rings; ++i) new (&ctl[i]) P2pRingCtl();
  auto* fast = reinterpret_cast<P2pFastArea*>(static_cast<uint8_t*>(base) + fastOffset(rings));
  for (uint32_t i = 0; i < rings; ++i) new (&fast[i]) P2pFastArea();
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<P2pInbox>(new P2pInbox(base, bytes, rings, ringBytes, path, true));
}

Result<std::unique_ptr<P2pInbox>> P2pInbox::open(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  if (name.find('/') != std::string::npos || name.rfind("hora-", 0) != 0)
    return protocolError("point-to-point inbox name \"" + name + "\" from the store is not hora's");
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return systemError("cannot open a peer's point-to-point inbox " + path + ": " +
                       errnoText(errno) + " (are both ranks on this host and sharing /dev/shm?)");
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kPage) {
    ::close(fd);
    return systemError("a peer's point-to-point inbox " + path + " is too small");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (base == MAP_FAILED) return systemError("cannot map " + path + ": " + errnoText(mapErr));
  std::atomic_thread_fence(std::memory_order_acquire);
  auto* h = static_cast<P2pInboxHeader*>(base);
  const bool ok = h->magic == kP2pInboxMagic && h->version == kP2pInboxVersion && h->rings > 0 &&
                  h->ringBytes >= 4096 && (h->ringBytes & (h->ringBytes - 1)) == 0 &&
                  h->rings <= (1u << 20) &&
                  dataOffset(h->rings) + static_cast<size_t>(h->rings) * h->ringBytes == bytes;
  if (!ok) {
    ::munmap(base, bytes);
    return protocolError("a peer's point-to-point inbox " + path + " is not a hora v" +
                         std::to_string(kP2pInboxVersion) + " inbox");
  }
  return std::unique_ptr<P2pInbox>(new P2pInbox(base, bytes, h->rings, h->ringBytes, path, false));
}

P2pInbox::~P2pInbox() {
  if (owner_) unlink();
  ::munmap(base_, bytes_);
}

void P2pInbox::unlink() noexcept {
  if (!owner_ || unlinked_) return;
  unlinked_ = true;
  ::unlink(path_.c_str());
}

P2pRingCtl& P2pInbox::ctl(uint32_t ring) const {
  return reinterpret_cast<P2pRingCtl*>(static_cast<uint8_t*>(base_) + ctlOffset())[ring];
}

P2pFastArea& P2pInbox::fast(uint32_t ring) const {
  return reinterpret_cast<P2pFastArea*>(static_cast<uint8_t*>(base_) + fastOffset(rings_))[ring];
}

uint8_t* P2pInbox::data(uint32_t ring) const {
  return static_cast<uint8_t*>(base_) + dataOffset(rings_) + static_cast<size_t>(ring) * ringBytes_;
}

size_t P2pInbox::write(uint32_t ring, const void* src, size_t n) {
  P2pRingCtl& c = ctl(ring);
  const uint64_t head = c.head.load(std::memory_order_relaxed);
  const uint64_t tail = c.tail.load(std::memory_order_acquire);
  const uint64_t used = head - tail;
  if (used > ringBytes_) return 0;  // corrupted by a misbehaving peer: write nothing
  const size_t room = static_cast<size_t>(ringBytes_ - used);
  if (n > room) n = room;
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(head & (ringBytes_ - 1));
  const size_t first = std::min(n, static_cast<size_t>(ringBytes_) - at);
  uint8_t* d = data(ring);
  std::memcpy(d + at, src, first);
  if (first < n) std::memcpy(d, static_cast<const uint8_t*>(src) + first, n - first);
  c.head.store(head + n, std::memory_order_release);
  return n;
}

size_t P2pInbox::writable(uint32_t ring) const {
  P2pRingCtl& c = ctl(ring);
  const uint64_t used =
      c.head.load(std::memory_order_relaxed) - c.tail.load(std::memory_order_acquire);
  return used > ringBytes_ ? 0 : static_cast<size_t>(ringBytes_ - used);
}

size_t P2pInbox::readable(uint32_t ring) const {
  P2pRingCtl& c = ctl(ring);
  const uint64_t avail =
      c.head.load(std::memory_order_acquire) - c.tail.load(std::memory_order_relaxed);
  return avail > ringBytes_ ? 0 : static_cast<size_t>(avail);
}

size_t P2pInbox::read(uint32_t ring, void* dst, size_t n) {
  P2pRingCtl& c = ctl(ring);
  const uint64_t tail = c.tail.load(std::memory_order_relaxed);
  const uint64_t avail = c.head.load(std::memory_order_acquire) - tail;
  if (avail > ringBytes_) return 0;
  if (n > avail) n = static_cast<size_t>(avail);
  if (n == 0) return 0;
  if (dst) {
    const size_t at = static_cast<size_t>(tail & (ringBytes_ - 1));
    const size_t first = std::min(n, static_cast<size_t>(ringBytes_) - at);
    const uint8_t* s = data(ring);
    std::memcpy(dst, s + at, first);
    if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, s, n - first);
  }
  c.tail.store(tail + n, std::memory_order_release);
  return n;
}

void P2pInbox::ring() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header().sleeping.value.load(std::memory_order_seq_cst) != 0)
    shmFutexWakeAll(header().doorbell.value);
}

void sweepDeadP2pInboxes(const std::string& dir) noexcept {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const uid_t me = ::getuid();
  while (struct dirent* e = ::readdir(d)) {
    // hora-<pid>-p2p-<hex>
    const char* n = e->d_name;
    if (std::strncmp(n, "hora-", 5) != 0 || !std::strstr(n, "-p2p-")) continue;
    char* end = nullptr;
    long pid = std::strtol(n + 5, &end, 10);
    if (pid <= 0 || !end || std::strncmp(end, "-p2p-", 5) != 0) continue;
    const std::string path = dir + "/" + n;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || st.st_uid != me) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(path.c_str());
  }
  ::closedir(d);
}

}  // namespace hora
