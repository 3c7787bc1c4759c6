#include "core/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

namespace hora {

namespace {

int64_t wallMinusSteady() {
  using namespace std::chrono;
  const int64_t wall = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
  const int64_t steady = duration_cast<nanoseconds>(Clock::now().time_since_epoch()).count();
  return wall - steady;
}

const char* laneName(int lane) {
  switch (lane) {
    case 0:
      return "negotiation";
    case 1:
      return "queued";
    case 2:
      return "data plane";
    case 4:
      return "point-to-point";
    default:
      return "markers";
  }
}

}  // namespace

std::string jsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

Timeline::Timeline(TimelineOptions options)
    : opts_(std::move(options)), wallMinusSteadyNs_(wallMinusSteady()) {}

Timeline::~Timeline() { stop(); }

std::string Timeline::path() const {
  std::lock_guard<std::mutex> lk(mu_);
  return path_;
}

Status Timeline::start(const std::string& path, bool markCycles) {
  if (path.empty()) return invalidArgument("timeline: the file path is empty");
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ >= 0)
    return invalidUsage("timeline: rank " + std::to_string(opts_.rank) + " already records to " +
                        path_ + "; stop it (stop_timeline) before starting another");
  // Rank 0 starts the file; the others only ever append to it.
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (opts_.rank == 0 ? O_TRUNC : 0);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0)
    return Status(Code::kSystemError, "timeline: rank " + std::to_string(opts_.rank) +
                                          " cannot open " + path + ": " + std::strerror(errno) +
                                          " (is the folder there and writable?)");
  fd_ = fd;
  path_ = path;
  written_ = 0;
  headerDone_ = false;
  truncatedNoted_ = false;
  buffer_.clear();
  dropped_ = 0;
  markCycles_ = markCycles;
  active_ = true;
  // The opening bracket goes first, before any rank's events: the others
  // write nothing until the file holds something (flush()).
  if (opts_.rank == 0) writeLocked("[\n");
  return Status::ok();
}

bool Timeline::stop() {
  flush();
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0) return false;
  active_ = false;
  ::close(fd_);
  fd_ = -1;
  buffer_.clear();
  return true;
}

uint32_t Timeline::intern(const std::string& s) {
  auto it = ids_.find(s);
  if (it != ids_.end()) return it->second;
  // Names are tensor names: bounded by the model. A runaway (auto-named
  // tensors forever) starts the table again rather than growing without end.
  if (strings_.size() >= (1u << 20) && buffer_.empty()) {
    strings_.clear();
    ids_.clear();
  }
  strings_.push_back(s);
  const auto id = static_cast<uint32_t>(strings_.size() - 1);
  ids_.emplace(s, id);
  return id;
}

void Timeline::record(TimelineLane lane, const std::string& name, const char* category,
                      int64_t startNs, int64_t endNs, const std::string& detail, int64_t packNs,
                      int64_t unpackNs) {
  if (!active()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0) return;
  if (buffer_.size() >= opts_.bufferEvents || written_ >= opts_.maxBytes) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto us = [](int64_t ns) {
    return ns < 0 ? -1 : static_cast<int32_t>(std::min<int64_t>(ns / 1000, INT32_MAX));
  };
  buffer_.push_back(Event{startNs, endNs, intern(name), detail.empty() ? 0 : intern(detail) + 1,
                          category, us(packNs), us(unpackNs), lane});
}

void Timeline::writeLocked(const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A full disk or a vanished file: stop recording, never fail training.
      std::fprintf(stderr, "[hora rank %d] timeline: writing %s failed (%s); recording stopped\n",
                   opts_.rank, path_.c_str(), std::strerror(errno));
      active_ = false;
      return;
    }
    off += static_cast<size_t>(n);
  }
  written_ += static_cast<int64_t>(text.size());
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0 || (!active_ && buffer_.empty())) return;
  // A rank other than 0 may start before rank 0 created the file: it keeps
  // its events (bounded) until rank 0's "[" is there.
  if (opts_.rank != 0 && written_ == 0) {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || st.st_size == 0) return;
  }
  std::string out;
  const std::string pid = std::to_string(opts_.rank);
  if (!headerDone_) {
    headerDone_ = true;
    out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"args\":{\"name\":\"rank " + pid + " (" + jsonEscape(opts_.host) + ")\"}},\n";
    out += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"args\":{\"sort_index\":" + pid + "}},\n";
    for (int lane = 0; lane < kTimelineLanes; ++lane)
      out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
             ",\"tid\":" + std::to_string(lane) + ",\"args\":{\"name\":\"" + laneName(lane) +
             "\"}},\n";
  }
  char num[64];
  for (const Event& e : buffer_) {
    out += "{\"name\":\"" + jsonEscape(strings_[e.name]) + "\",\"cat\":\"" + e.category + "\",";
    std::snprintf(num, sizeof num, "%.3f", (e.startNs + wallMinusSteadyNs_) / 1e3);
    if (e.endNs > 0) {
      out += std::string("\"ph\":\"X\",\"ts\":") + num;
      std::snprintf(num, sizeof num, "%.3f", (e.endNs - e.startNs) / 1e3);
      out += std::string(",\"dur\":") + num;
    } else {
      out += std::string("\"ph\":\"i\",\"s\":\"t\",\"ts\":") + num;
    }
    out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(static_cast<int>(e.lane));
    if (e.detail) {
      const std::string& d = strings_[e.detail - 1];
      if (e.packUs >= 0 && d.size() > 1 && d.back() == '}')
        out += ",\"args\":" + d.substr(0, d.size() - 1) +
               ",\"pack_us\":" + std::to_string(e.packUs) +
               ",\"unpack_us\":" + std::to_string(e.unpackUs) + "}";
      else
        out += ",\"args\":" + d;
    }
    out += "},\n";
  }
  buffer_.clear();
  const uint64_t lost = dropped_.exchange(0);
  if (lost) {
    const bool full = written_ + static_cast<int64_t>(out.size()) >= opts_.maxBytes;
    if (full && truncatedNoted_) return;  // said once; nothing more goes to the file
    truncatedNoted_ = truncatedNoted_ || full;
    std::snprintf(
        num, sizeof num, "%.3f",
        (std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
             .count() +
         wallMinusSteadyNs_) /
            1e3);
    out += "{\"name\":\"timeline: " + std::to_string(lost) + " events dropped (" +
           (full ? "HORA_TIMELINE_MAX_MB reached; no more events from this rank"
                 : "buffer full: HORA_TIMELINE_BUFFER_EVENTS") +
           ")\",\"cat\":\"timeline\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" + num + ",\"pid\":" + pid +
           ",\"tid\":3},\n";
  }
  if (!out.empty()) writeLocked(out);
}

}  // namespace hora
