#include "hosts.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

namespace horarun {

namespace {

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

}  // namespace

bool parseHostList(const std::string& text, std::vector<HostSpec>* out, std::string* error) {
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ',')) {
    if (entry.empty()) continue;
    HostSpec h;
    if (!parseHostEntry(entry, &h, error)) return false;
    out->push_back(h);
  }
  if (out->empty()) {
    *error = "-H '" + text + "' names no hosts";
    return false;
  }
  return true;
}

bool parseHostfile(const std::string& path, std::vector<HostSpec>* out, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = "cannot read hostfile '" + path + "'";
    return false;
  }
  std::string line;
  int lineNo = 0;
  while (std::getline(f, line)) {
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
    out->push_back(h);
  }
  if (out->empty()) {
    *error = "hostfile '" + path + "' names no hosts";
    return false;
  }
  return true;
}

bool assignSlots(const std::vector<HostSpec>& hosts, int np, std::vector<Slot>* out,
                 std::string* error) {
  int total = 0;
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
  // Cross rank: among the hosts having local rank l, in host order.
  for (auto& s : *out) {
    int crossRank = 0, crossSize = 0;
    for (size_t h = 0; h < perHost.size(); ++h) {
      if (perHost[h] > s.localRank) {
        if (static_cast<int>(h) < s.hostIndex) ++crossRank;
        ++crossSize;
      }
    }
    s.crossRank = crossRank;
    s.crossSize = crossSize;
  }
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
