#include "elastic.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace horarun {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// Host names and IPv4 addresses; anything else (spaces, quotes, shell noise) is garbage, and
// refusing it here gives a clear error instead of a worker that cannot be started later.
bool validHostName(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  for (char c : h)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_'))
      return false;
  return true;
}

std::string shown(const std::string& line) {
  return line.size() > 80 ? line.substr(0, 80) + "..." : line;
}

}  // namespace

bool parseDiscoveryOutput(const std::string& text, int defaultSlots, std::vector<HostSpec>* out,
                          std::string* error) {
  std::vector<HostSpec> hosts;
  std::istringstream in(text);
  std::string raw;
  for (int lineNo = 1; std::getline(in, raw); ++lineNo) {
    std::string line = raw;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    line = trim(line);
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      *error = "line " + std::to_string(lineNo) + " '" + shown(trim(raw)) + "': " + why +
               " (expected 'host' or 'host:slots')";
      return false;
    };
    HostSpec h;
    auto colon = line.find(':');
    h.name = line.substr(0, colon);
    h.slots = defaultSlots;
    if (colon != std::string::npos) {
      std::string s = line.substr(colon + 1);
      if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos)
        return bad("slots '" + s + "' is not a positive integer");
      h.slots = std::stoi(s);
      if (h.slots < 1 || h.slots > 65536) return bad("slots must be between 1 and 65536");
    }
    if (!validHostName(h.name)) return bad("'" + shown(h.name) + "' is not a host name");
    auto same = std::find_if(hosts.begin(), hosts.end(),
                             [&](const HostSpec& o) { return o.name == h.name; });
    if (same != hosts.end())
      same->slots = h.slots;
    else
      hosts.push_back(h);
  }
  *out = std::move(hosts);
  return true;
}

Blacklist::Blacklist(double lowS, double highS, uint64_t seed)
    : lowS_(lowS), highS_(highS), rng_(seed) {}

void Blacklist::fail(const std::string& host, double nowS) {
  Entry& e = hosts_[host];
  if (e.until < 0 || (e.failures > 0 && e.until > nowS)) return;  // already blocked
  ++e.failures;
  if (highS_ < 0) {
    e.until = -1;
    return;
  }
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double base = lowS_ * std::ldexp(1.0, std::min(e.failures - 1, 30));
  double wait = std::min(highS_, std::max(lowS_, base * (1.0 + u(rng_))));
  e.until = nowS + wait;
}

bool Blacklist::blocked(const std::string& host, double nowS) const {
  auto it = hosts_.find(host);
  if (it == hosts_.end()) return false;
  return it->second.until < 0 || it->second.until > nowS;
}

double Blacklist::until(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? 0 : it->second.until;
}

std::string Blacklist::describe(double nowS) const {
  std::string out;
  for (const auto& kv : hosts_) {
    if (!blocked(kv.first, nowS)) continue;
    char when[64];
    if (kv.second.until < 0)
      std::snprintf(when, sizeof(when), "for good");
    else
      std::snprintf(when, sizeof(when), "back in %.0f s", std::ceil(kv.second.until - nowS));
    out += (out.empty() ? "" : ", ") + kv.first + " (" + when + ")";
  }
  return out;
}

std::vector<std::string> planSpawns(const std::vector<HostSpec>& discovered,
                                    const std::map<std::string, int>& runningOnHost,
                                    const std::vector<std::string>& blockedHosts, int maxNp) {
  int running = 0;
  for (const auto& kv : runningOnHost) running += kv.second;
  std::vector<std::string> out;
  for (const auto& h : discovered) {
    if (std::find(blockedHosts.begin(), blockedHosts.end(), h.name) != blockedHosts.end()) continue;
    auto it = runningOnHost.find(h.name);
    int free = h.slots - (it == runningOnHost.end() ? 0 : it->second);
    for (; free > 0 && running + static_cast<int>(out.size()) < maxNp; --free)
      out.push_back(h.name);
  }
  return out;
}

int usableSlots(const std::vector<HostSpec>& discovered,
                const std::vector<std::string>& blockedHosts) {
  int n = 0;
  for (const auto& h : discovered)
    if (std::find(blockedHosts.begin(), blockedHosts.end(), h.name) == blockedHosts.end())
      n += h.slots;
  return n;
}

}  // namespace horarun
