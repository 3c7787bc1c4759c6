#include "check.h"

#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <sstream>

#include "hora/hora.h"
#include "hosts.h"
#include "output.h"
#include "spawn.h"

namespace horarun {

namespace {

// Connects to addr:port within timeoutS (the store drops us before the
// handshake; it logs that only at info level).
bool tcpReachable(const std::string& addr, int port, double timeoutS, std::string* why) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  asio::steady_timer timer(io);
  boost::system::error_code result = asio::error::timed_out;
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(addr, ec);
  if (ec) {
    *why = "bad address " + addr;
    return false;
  }
  sock.async_connect({ip, static_cast<unsigned short>(port)},
                     [&](const boost::system::error_code& e) {
                       result = e;
                       timer.cancel();
                     });
  timer.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000)));
  timer.async_wait([&](const boost::system::error_code& e) {
    if (!e) sock.close();
  });
  io.run();
  if (result) *why = result.message();
  return !result;
}

bool onPath(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return access(cmd.c_str(), X_OK) == 0;
  const char* path = getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((dir + "/" + cmd).c_str(), X_OK) == 0) return true;
  return false;
}

// key=value lines from the probe script.
std::string field(const std::string& output, const std::string& key) {
  std::stringstream ss(output);
  std::string line;
  while (std::getline(ss, line))
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return "";
}

}  // namespace

std::string versionText() {
  int32_t major = 0, minor = 0, patch = 0;
  hora_get_version(&major, &minor, &patch);
  std::ostringstream s;
  s << "horarun " << HORA_VERSION_MAJOR << "." << HORA_VERSION_MINOR << "." << HORA_VERSION_PATCH
    << ", libhora " << major << "." << minor << "." << patch;
  return s.str();
}

bool runChecks(const Options& opt, const std::vector<std::string>& hosts, const StorePlan& plan,
               int storePort) {
  bool allOk = true;
  std::ostringstream out;
  out << "horarun --check: " << versionText() << "; store on port " << storePort << ", bound to "
      << (plan.bindHost.empty() ? "every interface" : plan.bindHost) << "\n";
  const std::string cmd = opt.command.empty() ? "" : opt.command.front();
  for (const auto& h : hosts) {
    std::string line = "  " + h + ": ";
    bool ok = true;
    if (isLocalHost(h)) {
      std::string why;
      bool store = tcpReachable(plan.localAddr, storePort, opt.startTimeoutS, &why);
      line += "this machine; store " + plan.localAddr + ":" + std::to_string(storePort) +
              (store ? " reachable" : " NOT reachable (" + why + ")");
      ok = store;
      if (!cmd.empty()) {
        bool found = onPath(cmd);
        line += found ? "; command found" : "; command '" + cmd + "' NOT found";
        ok = ok && found;
      }
    } else {
      std::string addr = plan.addrForHost.at(h);
      std::ostringstream script;
      script << "{\necho host=$(hostname)\n"
             << "if (exec 3<>/dev/tcp/" << addr << "/" << storePort
             << ") 2>/dev/null; then echo store=ok; else echo store=unreachable; fi\n"
             << "if command -v horarun >/dev/null 2>&1; then echo \"horarun=$(horarun --version "
                "2>&1 | head -n 1)\"; else echo horarun=not-on-PATH; fi\n";
      if (!cmd.empty())
        script << "if command -v " << shellQuote(cmd)
               << " >/dev/null 2>&1; then echo cmd=ok; else echo cmd=missing; fi\n";
      script << "}\n";
      std::string output;
      int rc = runScript(remoteShellFor(opt, h), script.str(), opt.startTimeoutS, &output);
      if (rc != 0 || field(output, "host").empty()) {
        std::string first = output.substr(0, output.find('\n'));
        line += rc < 0
                    ? "NOT reachable (remote shell timed out after " +
                          std::to_string(opt.startTimeoutS) + " s)"
                    : "NOT reachable (remote shell exit " + std::to_string(rc) + ": " + first + ")";
        ok = false;
      } else {
        bool store = field(output, "store") == "ok";
        line += "reachable (hostname " + field(output, "host") + "); store " + addr + ":" +
                std::to_string(storePort) + (store ? " reachable" : " NOT reachable") +
                "; remote horarun: " + field(output, "horarun");
        ok = store;
        if (!cmd.empty()) {
          bool found = field(output, "cmd") == "ok";
          line += found ? "; command found" : "; command '" + cmd + "' NOT found";
          ok = ok && found;
        }
      }
    }
    out << line << (ok ? "  [ok]" : "  [FAILED]") << "\n";
    allOk = allOk && ok;
  }
  out << "horarun --check: " << (allOk ? "all checks passed" : "some checks FAILED") << "\n";
  writeAll(2, out.str());
  return allOk;
}

}  // namespace horarun
