#include "discovery.h"

#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "elastic.h"
#include "spawn.h"

namespace horarun {

namespace {

constexpr size_t kMaxCapture = 1 << 20;  // a discovery script prints a few lines

// The first lines of what a script printed, on one line, for an error message.
std::string sample(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line) && n < 3) {
    if (line.size() > 100) line = line.substr(0, 100) + "...";
    out += (n++ ? " | " : "") + line;
  }
  if (std::getline(in, line)) out += " | ...";
  return out.empty() ? "nothing" : "'" + out + "'";
}

std::string seconds(std::chrono::duration<double> d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", d.count());
  return buf;
}

}  // namespace

Discovery::Discovery(boost::asio::io_context& io, DiscoverySource source, double timeoutS)
    : io_(io), source_(std::move(source)), timeout_(timeoutS), deadline_(io), exitPoll_(io) {}

Discovery::~Discovery() { stop(); }

std::string Discovery::describe() const {
  switch (source_.kind) {
    case DiscoverySource::Kind::kScript:
      return "host discovery script '" + source_.path + "'";
    case DiscoverySource::Kind::kFile:
      return "host discovery file '" + source_.path + "'";
    default:
      return "the -H/--hostfile hosts";
  }
}

void Discovery::run(std::function<void(DiscoveryResult)> done) {
  DiscoveryResult r;
  if (source_.kind == DiscoverySource::Kind::kFixed) {
    r.ok = true;
    r.hosts = source_.fixed;
  } else if (source_.kind == DiscoverySource::Kind::kFile) {
    std::ifstream in(source_.path);
    if (!in) {
      r.error = describe() + " cannot be read: " + std::strerror(errno) +
                " (it must exist for the whole job; write it atomically with a rename)";
    } else {
      std::ostringstream text;
      text << in.rdbuf();
      std::string why;
      r.ok = parseDiscoveryOutput(text.str(), source_.defaultSlots, &r.hosts, &why);
      if (!r.ok) r.error = describe() + ": " + why;
    }
  } else {
    done_ = std::move(done);
    outText_.clear(), errText_.clear();
    outEof_ = errEof_ = false;
    LaunchSpec spec;
    spec.command = {source_.path};
    SpawnedProcess p;
    std::string why;
    if (!spawnProcess(spec, &p, &why)) {
      r.error = "cannot start " + describe() + ": " + why;
      boost::asio::post(io_, [d = std::move(done_), r] { d(r); });
      return;
    }
    pid_ = p.pid;
    started_ = std::chrono::steady_clock::now();
    out_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, p.outFd);
    err_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, p.errFd);
    const unsigned gen = ++generation_;
    read(out_.get(), &outText_, &outEof_);
    read(err_.get(), &errText_, &errEof_);
    deadline_.expires_after(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_));
    deadline_.async_wait([this, gen](const boost::system::error_code& ec) {
      if (ec || gen != generation_) return;
      kill(-pid_, SIGKILL);
      int st = 0;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      finish(st, true);
    });
    return;
  }
  // A file or fixed hosts: answer through the loop all the same, so callers see one order.
  boost::asio::post(io_, [d = std::move(done), r] { d(r); });
}

void Discovery::read(boost::asio::posix::stream_descriptor* sd, std::string* into, bool* eof) {
  auto buf = std::make_shared<std::array<char, 4096>>();
  const unsigned gen = generation_;
  sd->async_read_some(
      boost::asio::buffer(*buf),
      [this, sd, into, eof, buf, gen](const boost::system::error_code& ec, size_t n) {
        if (gen != generation_) return;
        if (!ec && into->size() < kMaxCapture) into->append(buf->data(), n);
        if (ec) {
          *eof = true;
          if (outEof_ && errEof_) checkExit();
          return;
        }
        read(sd, into, eof);
      });
}

// Both streams closed: the script has exited or is about to. Poll for its status (a script
// that closed its output but keeps running is still bounded by the deadline).
void Discovery::checkExit() {
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    finish(st, false);
    return;
  }
  const unsigned gen = generation_;
  exitPoll_.expires_after(std::chrono::milliseconds(10));
  exitPoll_.async_wait([this, gen](const boost::system::error_code& ec) {
    if (!ec && gen == generation_) checkExit();
  });
}

void Discovery::finish(int st, bool timedOut) {
  ++generation_;
  pid_ = -1;
  deadline_.cancel();
  exitPoll_.cancel();
  out_.reset(), err_.reset();
  const auto took = std::chrono::steady_clock::now() - started_;
  DiscoveryResult r;
  std::string stderrNote = errText_.empty() ? "" : "; its stderr: " + sample(errText_);
  if (timedOut) {
    r.error = describe() + " did not finish within " + seconds(timeout_) +
              " (killed); it printed " + sample(outText_) + stderrNote +
              ". It must print its hosts and exit quickly: it runs every second";
  } else if (WIFSIGNALED(st) || WEXITSTATUS(st) != 0) {
    std::string how = WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                                      : "exited with code " + std::to_string(WEXITSTATUS(st));
    r.error = describe() + " " + how + " after " + seconds(took) + "; it printed " +
              sample(outText_) + stderrNote + ". Run it by hand to see why";
  } else {
    std::string why;
    r.ok = parseDiscoveryOutput(outText_, source_.defaultSlots, &r.hosts, &why);
    if (!r.ok)
      r.error = describe() + " printed something that is not a host list: " + why +
                "; all it printed: " + sample(outText_);
  }
  auto done = std::move(done_);
  done_ = nullptr;
  if (done) done(r);
}

void Discovery::stop() {
  if (pid_ <= 0) return;
  ++generation_;
  kill(-pid_, SIGKILL);
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  deadline_.cancel();
  exitPoll_.cancel();
  out_.reset(), err_.reset();
  done_ = nullptr;
}

}  // namespace horarun
