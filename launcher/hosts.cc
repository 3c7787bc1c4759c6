#include "hosts.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>

namespace horarun {

namespace {

constexpr int kMaxSlotsPerEntry = 999999;  // six digits

bool parseSlots(const std::string& text, int* out) {
  if (text.empty() || text.size() > 6) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  *out = std::stoi(text);
  return *out > 0;
}

bool validHostName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
      return false;
  return true;
}

bool parseHostEntry(const std::string& entry, HostSpec* out, std::string* error) {
  auto colon = entry.rfind(':');
  HostSpec h;
  h.name = entry.substr(0, colon);
  if (colon != std::string::npos && !parseSlots(entry.substr(colon + 1), &h.slots)) {
    *error = "host entry '" + entry + "': slots must be a positive number (host:slots)";
    return false;
  }
  if (!validHostName(h.name)) {
    *error = "host entry '" + entry + "': host names may contain letters, digits, '.', '-', '_'";
    return false;
  }
  *out = h;
  return true;
}

// The host list being built: a host named again gets its slots added to its
// first entry (see hosts.h), and each repeated host is noted once.
class HostMerger {
 public:
  explicit HostMerger(std::vector<HostSpec>* out) : out_(out) {}

  // `line`: the hostfile line `h` is on (0 for -H); `where` prefixes an error.
  bool add(const HostSpec& h, int line, const std::string& where, std::string* error) {
    auto found = index_.find(h.name);
    if (found == index_.end()) {
      index_[h.name] = out_->size();
      out_->push_back(h);
    } else {
      HostSpec& first = (*out_)[found->second];
      if (first.slots > kMaxSlotsPerEntry - h.slots) {
        *error = where + "host '" + h.name +
                 "' is listed again and its slots add up to more than " +
                 std::to_string(kMaxSlotsPerEntry);
        return false;
      }
      first.slots += h.slots;
    }
    parts_[h.name].push_back({h.slots, line});
    return true;
  }

  // "SOURCE: host 'a' is listed 2 times (lines 1, 3): its slots are added up, 2+2 = 4".
  void note(const std::string& source, std::vector<std::string>* notes) const {
    if (!notes) return;
    for (const auto& h : *out_) {
      auto it = parts_.find(h.name);
      if (it == parts_.end() || it->second.size() < 2) continue;
      std::string sum, lines;
      for (const Part& p : it->second) {
        sum += (sum.empty() ? "" : "+") + std::to_string(p.slots);
        if (p.line > 0) lines += (lines.empty() ? "" : ", ") + std::to_string(p.line);
      }
      notes->push_back(source + ": host '" + h.name + "' is listed " +
                       std::to_string(it->second.size()) + " times" +
                       (lines.empty() ? "" : " (lines " + lines + ")") +
                       ": its slots are added up, " + sum + " = " + std::to_string(h.slots));
    }
  }

 private:
  struct Part {
    int slots;
    int line;
  };
  std::vector<HostSpec>* out_;
  std::map<std::string, size_t> index_;  // name -> its entry in *out_
  std::map<std::string, std::vector<Part>> parts_;
};

}  // namespace

bool parseHostList(const std::string& text, std::vector<HostSpec>* out, std::string* error,
                   std::vector<std::string>* notes) {
  std::stringstream ss(text);
  std::string entry;
  HostMerger merged(out);
  while (std::getline(ss, entry, ',')) {
    if (entry.empty()) continue;
    HostSpec h;
    if (!parseHostEntry(entry, &h, error)) return false;
    if (!merged.add(h, 0, "-H entry '" + entry + "': ", error)) return false;
  }
  if (out->empty()) {
    *error = "-H '" + text + "' names no hosts";
    return false;
  }
  merged.note("-H", notes);
  return true;
}

bool parseHostfile(const std::string& path, std::vector<HostSpec>* out, std::string* error,
                   std::vector<std::string>* notes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = "cannot read hostfile '" + path + "'";
    return false;
  }
  // Read at most kMaxHostfileBytes (+1 to notice more): a path to /dev/zero, a
  // FIFO that never ends or a multi-gigabyte file must not make horarun
  // allocate without bound before it has parsed a single host.
  std::string text(kMaxHostfileBytes + 1, '\0');
  f.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.size() > kMaxHostfileBytes) {
    *error = "hostfile '" + path + "' is longer than " + std::to_string(kMaxHostfileBytes >> 20) +
             " MiB (is it the right file? a device or a pipe that never ends?)";
    return false;
  }
  if (f.bad()) {
    *error = "cannot read hostfile '" + path + "'";
    return false;
  }
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  HostMerger merged(out);
  while (std::getline(in, line)) {
    ++lineNo;
    line = line.substr(0, line.find('#'));
    std::stringstream ls(line);
    std::string name, word;
    if (!(ls >> name)) continue;
    HostSpec h;
    std::string where = path + ":" + std::to_string(lineNo) + ": ";
    if (!parseHostEntry(name, &h, error)) {
      *error = where + *error;
      return false;
    }
    while (ls >> word) {
      if (word.rfind("slots=", 0) == 0 && parseSlots(word.substr(6), &h.slots)) continue;
      *error = where + "expected 'host slots=N', got '" + word + "'";
      return false;
    }
    if (!merged.add(h, lineNo, where, error)) return false;
  }
  if (out->empty()) {
    *error = "hostfile '" + path + "' names no hosts";
    return false;
  }
  merged.note("hostfile '" + path + "'", notes);
  return true;
}

bool assignSlots(const std::vector<HostSpec>& hosts, int np, std::vector<Slot>* out,
                 std::string* error) {
  int64_t total = 0;  // many hosts of 999999 slots overflow an int
  for (const auto& h : hosts) total += h.slots;
  if (np < 1 || total < np) {
    *error = "-np " + std::to_string(np) + " needs " + std::to_string(np) +
             " slots but the hosts offer " + std::to_string(total);
    return false;
  }
  out->clear();
  std::vector<int> perHost;  // ranks placed on each used host
  for (size_t i = 0; i < hosts.size() && static_cast<int>(out->size()) < np; ++i) {
    int n = std::min(hosts[i].slots, np - static_cast<int>(out->size()));
    for (int l = 0; l < n; ++l) {
      Slot s;
      s.rank = static_cast<int>(out->size());
      s.size = np;
      s.localRank = l;
      s.localSize = n;
      s.hostIndex = static_cast<int>(i);
      s.host = hosts[i].name;
      out->push_back(s);
    }
    perHost.push_back(n);
  }
  // Cross rank: among the hosts having local rank l, in host order. One pass
  // (ranks are in host order), not ranks x hosts: a million ranks on a
  // hundred thousand hosts must not take minutes.
  std::vector<int> hostsWithLocal(
      perHost.empty() ? 0 : *std::max_element(perHost.begin(), perHost.end()));
  for (auto& s : *out) s.crossRank = hostsWithLocal[s.localRank]++;
  for (auto& s : *out) s.crossSize = hostsWithLocal[s.localRank];
  return true;
}

bool isLocalHost(const std::string& name) {
  if (name == "localhost" || name.rfind("127.", 0) == 0 || name == "::1") return true;
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) == 0 && name == buf) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
    found = name == text;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace horarun
