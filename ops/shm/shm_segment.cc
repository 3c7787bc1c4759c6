#include "ops/shm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>

namespace hora {
namespace {

std::string errnoText(int e) { return std::string(std::strerror(e)); }

}  // namespace

Result<std::unique_ptr<ShmSegment>> ShmSegment::create(const std::string& dir,
                                                       const std::string& name, size_t slotBytes) {
  const std::string path = dir + "/" + name;
  const size_t bytes = kShmHeaderBytes + 2 * slotBytes;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return systemError("cannot create shared-memory segment " + path + ": " + errnoText(errno));
  // posix_fallocate returns the error instead of setting errno.
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return systemError("cannot reserve " + std::to_string(bytes >> 20) + " MiB in " + dir +
                       " for " + path + ": " + errnoText(rc) +
                       " (is /dev/shm too small? HORA_SHM_CHUNK_BYTES sets the size)");
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::unlink(path.c_str());
    return systemError("cannot map " + path + ": " + errnoText(mapErr));
  }
  auto* h = new (base) ShmHeader();
  h->magic = kShmMagic;
  h->version = kShmVersion;
  h->pid = static_cast<int32_t>(::getpid());
  h->slotBytes = slotBytes;
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<ShmSegment>(new ShmSegment(base, bytes, slotBytes, path, true));
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& dir,
                                                     const std::string& name, size_t slotBytes) {
  const std::string path = dir + "/" + name;
  const size_t bytes = kShmHeaderBytes + 2 * slotBytes;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return systemError("cannot open peer segment " + path + ": " + errnoText(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    return systemError("peer segment " + path + " has the wrong size");
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mapErr = errno;
  ::close(fd);
  if (base == MAP_FAILED) return systemError("cannot map " + path + ": " + errnoText(mapErr));
  std::atomic_thread_fence(std::memory_order_acquire);
  auto* h = static_cast<ShmHeader*>(base);
  if (h->magic != kShmMagic || h->version != kShmVersion || h->slotBytes != slotBytes) {
    ::munmap(base, bytes);
    return systemError("peer segment " + path + " is not a hora v" + std::to_string(kShmVersion) +
                       " segment with " + std::to_string(slotBytes) + "-byte slots");
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(base, bytes, slotBytes, path, false));
}

ShmSegment::~ShmSegment() {
  if (owner_) unlink();
  ::munmap(base_, bytes_);
}

void ShmSegment::unlink() noexcept {
  if (!owner_ || unlinked_) return;
  unlinked_ = true;
  ::unlink(path_.c_str());
}

void shmFutexWait(std::atomic<uint32_t>& word, uint32_t expected, int timeoutMs) noexcept {
  struct timespec ts;
  ts.tv_sec = timeoutMs / 1000;
  ts.tv_nsec = static_cast<long>(timeoutMs % 1000) * 1000000L;
  // Shared (not FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED mapping
  // that other processes map at other addresses.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void shmFutexWakeAll(std::atomic<uint32_t>& word) noexcept {
  word.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

}  // namespace hora
