#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "rank_harness.h"

namespace htest {

hora_config_t testConfig(int rank, int size, int port) {
  hora_config_t c;
  hora_config_init(&c);
  c.rank = rank;
  c.size = size;
  c.store_addr = "127.0.0.1";
  c.store_port = port;
  c.store_external = 0;
  c.secret = "test-secret";
  c.start_timeout_s = 30;
  c.peer_timeout_s = 10;
  c.log_level = "error";
  return c;
}

void runThreads(int size, const std::function<void(int, hora_runtime_t)>& body,
                const std::function<void(hora_config_t&)>& tweak, double deadlineS) {
  int port = freePort();
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      hora_config_t c = testConfig(r, size, port);
      if (tweak) tweak(c);
      hora_runtime_t rt = nullptr;
      hora_status_t s = hora_init(&c, &rt);
      EXPECT_EQ(s, HORA_SUCCESS) << "rank " << r << " hora_init: " << hora_last_error_message();
      if (s == HORA_SUCCESS) {
        body(r, rt);
        hora_status_t sd = hora_shutdown(rt);  // the body may have shut down already
        EXPECT_TRUE(sd == HORA_SUCCESS || sd == HORA_ERR_SHUT_DOWN) << hora_last_error_message();
      }
      std::lock_guard<std::mutex> lk(mu);
      ++finished;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lk(mu);
  bool ok =
      cv.wait_for(lk, std::chrono::duration<double>(deadlineS), [&] { return finished == size; });
  lk.unlock();
  if (!ok) {
    // A hang: report and abort the whole test binary (ctest marks it failed)
    // rather than block CI on threads that will never return.
    std::fprintf(stderr, "runThreads: %d of %d ranks still running after %.0f s: hang\n",
                 size - finished, size, deadlineS);
    std::fflush(stderr);
    std::_Exit(3);
  }
  for (auto& t : threads) t.join();
}

namespace {

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// The server process: starts the server, reports its port (0: failed), then
// sets each (key, value) it is sent and acknowledges it, until its input
// closes.
[[noreturn]] void serveStore(const std::string& secret, int in, int out) {
  hora_store_server_t server = nullptr;
  int32_t port = 0;
  if (hora_store_server_start("127.0.0.1", 0, secret.c_str(), &server) != HORA_SUCCESS ||
      hora_store_server_port(server, &port) != HORA_SUCCESS)
    port = 0;
  writeAll(out, &port, sizeof(port));
  uint32_t lens[2];
  while (port != 0 && readAll(in, lens, sizeof(lens))) {
    std::string key(lens[0], '\0'), value(lens[1], '\0');
    if (!readAll(in, &key[0], key.size()) || !readAll(in, &value[0], value.size())) break;
    const char ok =
        hora_store_server_set(server, key.c_str(), value.data(), value.size()) == HORA_SUCCESS;
    if (!writeAll(out, &ok, 1)) break;
  }
  if (server) hora_store_server_stop(server);
  _exit(0);
}

}  // namespace

ForkedStoreServer::ForkedStoreServer(const std::string& secret) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) std::abort();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Gone with this process if it is killed (it would keep the test's
    // output open otherwise).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(down[1]);
    close(up[0]);
    serveStore(secret, down[0], up[1]);
  }
  // A server process that died makes set() fail instead of killing this
  // process with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  close(down[0]);
  close(up[1]);
  pid_ = pid;
  toServer_ = down[1];
  fromServer_ = up[0];
  int32_t port = 0;
  if (pid > 0 && readAll(fromServer_, &port, sizeof(port))) port_ = port;
  EXPECT_NE(port_, 0) << "the store server process did not start";
}

ForkedStoreServer::~ForkedStoreServer() {
  if (toServer_ >= 0) close(toServer_);
  if (fromServer_ >= 0) close(fromServer_);
  if (pid_ > 0) {
    int st = 0;
    waitpid(pid_, &st, 0);
  }
}

bool ForkedStoreServer::set(const std::string& key, const std::string& value) {
  const uint32_t lens[2] = {static_cast<uint32_t>(key.size()), static_cast<uint32_t>(value.size())};
  char ok = 0;
  return port_ != 0 && writeAll(toServer_, lens, sizeof(lens)) &&
         writeAll(toServer_, key.data(), key.size()) &&
         writeAll(toServer_, value.data(), value.size()) && readAll(fromServer_, &ok, 1) && ok == 1;
}

std::vector<ProcessResult> runProcesses(
    int size, const std::function<int(int)>& body, double deadlineS,
    const std::function<void(const std::vector<int>&)>& hooks,
    const std::vector<std::pair<std::string, std::string>>& env) {
  int port = freePort();
  std::vector<int> pids(size), fds(size);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < size; ++r) {
    int p[2];
    if (pipe(p) != 0) std::abort();
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[1]);
      setenv("HORA_RANK", std::to_string(r).c_str(), 1);
      setenv("HORA_SIZE", std::to_string(size).c_str(), 1);
      setenv("HORA_STORE_ADDR", "127.0.0.1", 1);
      setenv("HORA_STORE_PORT", std::to_string(port).c_str(), 1);
      setenv("HORA_SECRET", "test-secret", 1);
      setenv("HORA_START_TIMEOUT_S", "30", 1);
      if (!getenv("HORA_LOG_LEVEL")) setenv("HORA_LOG_LEVEL", "warning", 1);
      for (const auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
      int code = body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    pids[r] = pid;
    fds[r] = p[0];
  }
  if (hooks) hooks(pids);
  std::vector<ProcessResult> results(size);
  std::vector<bool> done(size, false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadlineS);
  int remaining = size;
  char buf[4096];
  while (remaining > 0) {
    // Drain output so children never block on a full pipe.
    std::vector<pollfd> pfds;
    for (int r = 0; r < size; ++r)
      if (fds[r] >= 0) pfds.push_back({fds[r], POLLIN, 0});
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 20);
    for (int r = 0; r < size; ++r) {
      if (fds[r] < 0) continue;
      ssize_t n;
      while ((n = read(fds[r], buf, sizeof(buf))) > 0) results[r].output.append(buf, n);
      if (n == 0) {
        close(fds[r]);
        fds[r] = -1;
      }
    }
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        if (WIFEXITED(st)) results[r].exitCode = WEXITSTATUS(st);
        if (WIFSIGNALED(st)) results[r].signal = WTERMSIG(st);
      }
    }
    if (pfds.empty() && remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < size; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          results[r].output +=
              "\n[harness] rank " + std::to_string(r) + " killed after the deadline (hang)\n";
        }
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    }
  }
  for (int r = 0; r < size; ++r) {
    if (fds[r] < 0) continue;
    ssize_t n;
    fcntl(fds[r], F_SETFL, 0);
    while ((n = read(fds[r], buf, sizeof(buf))) > 0) results[r].output.append(buf, n);
    close(fds[r]);
  }
  return results;
}

DLDataType dlType(uint8_t code, uint8_t bits) {
  DLDataType t;
  t.code = code;
  t.bits = bits;
  t.lanes = 1;
  return t;
}

DLTensor makeTensor(void* data, DLDataType dt, std::vector<int64_t>* shape) {
  DLTensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = static_cast<int32_t>(shape->size());
  t.dtype = dt;
  t.shape = shape->data();
  return t;
}

namespace {
thread_local std::string tlsMessage;
}
const std::string& lastMessage() { return tlsMessage; }

std::string metrics(hora_runtime_t rt, int32_t format) {
  size_t need = 0;
  if (hora_metrics_snapshot(rt, nullptr, format, nullptr, 0, &need) != HORA_SUCCESS) return "";
  // The text can grow between the two calls (counters move): retry with the
  // size the library reports, as hora.h says.
  for (int tries = 0; tries < 8; ++tries) {
    std::string buf(need, '\0');
    const hora_status_t s =
        hora_metrics_snapshot(rt, nullptr, format, buf.data(), buf.size(), &need);
    if (s == HORA_SUCCESS) {
      buf.resize(need - 1);
      return buf;
    }
    if (s != HORA_ERR_INVALID_ARGUMENT || need <= buf.size()) return "";
  }
  return "";
}

double metricValue(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? -1.0 : std::stod(json.substr(at + key.size() + 3));
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/hora-test-XXXXXX";
  if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  if (DIR* d = ::opendir(path_.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        ::unlink((path_ + "/" + e->d_name).c_str());
    ::closedir(d);
  }
  ::rmdir(path_.c_str());
}

bool ReadyMarks::waitFor(int n, int timeoutMs) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    int marked = 0;
    for (int r = 0; r < n; ++r)
      marked += ::access((dir_.path() + "/ready." + std::to_string(r)).c_str(), F_OK) == 0;
    if (marked == n) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void markReady(int rank) {
  const char* dir = std::getenv("HTEST_READY_DIR");
  if (!dir || !*dir) return;
  const int fd = ::open((std::string(dir) + "/ready." + std::to_string(rank)).c_str(),
                        O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
}

hora_status_t waitAndFree(hora_request_t req, double timeoutS, std::string* message) {
  hora_status_t s = hora_wait(req, timeoutS);
  tlsMessage = hora_last_error_message();
  if (message) *message = tlsMessage;
  hora_request_free(req);
  return s;
}

}  // namespace htest
