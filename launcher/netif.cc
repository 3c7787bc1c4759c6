#include "netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace horarun {

namespace {

std::string ipv4Text(const sockaddr* sa) {
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  return text;
}

}  // namespace

bool interfaceAddress(const std::string& name, std::string* out, std::string* error) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    *error = std::string("getifaddrs failed: ") + std::strerror(errno);
    return false;
  }
  std::set<std::string> names;
  bool found = false;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    names.insert(a->ifa_name);
    if (!found && name == a->ifa_name) {
      *out = ipv4Text(a->ifa_addr);
      found = true;
    }
  }
  freeifaddrs(list);
  if (!found) {
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    *error = "network interface '" + name + "' has no IPv4 address here (interfaces: " + all + ")";
  }
  return found;
}

bool addressTowards(const std::string& host, std::string* out, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0 || !res) {
    *error = "cannot resolve host '" + host + "': " + gai_strerror(rc);
    return false;
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  ok = ok && getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (ok)
    *out = ipv4Text(reinterpret_cast<sockaddr*>(&local));
  else
    *error = "no route to host '" + host + "': " + std::strerror(errno);
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return ok;
}

std::string interfaceOf(const std::string& addr) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "?";
  std::string name = "?";
  for (ifaddrs* a = list; a; a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && ipv4Text(a->ifa_addr) == addr) {
      name = a->ifa_name;
      break;
    }
  freeifaddrs(list);
  return name;
}

bool planStore(const std::vector<std::string>& remoteHosts, const std::string& forcedInterface,
               StorePlan* out, std::string* error) {
  StorePlan p;
  if (!forcedInterface.empty()) {
    std::string addr;
    if (!interfaceAddress(forcedInterface, &addr, error)) return false;
    p.bindHost = p.localAddr = addr;
    for (const auto& h : remoteHosts) p.addrForHost[h] = addr;
    p.description = addr + " (--network-interface " + forcedInterface + ")";
    *out = p;
    return true;
  }
  if (remoteHosts.empty()) {
    p.bindHost = p.localAddr = "127.0.0.1";
    p.description = "127.0.0.1 (local job)";
    *out = p;
    return true;
  }
  std::set<std::string> distinct;
  for (const auto& h : remoteHosts) {
    std::string addr;
    if (!addressTowards(h, &addr, error)) return false;
    p.addrForHost[h] = addr;
    distinct.insert(addr);
    p.description +=
        (p.description.empty() ? "" : ", ") + h + " via " + addr + " (" + interfaceOf(addr) + ")";
  }
  // One address reaches every host: bind only there. Otherwise hosts sit
  // behind different interfaces: listen on all of them (clients still have
  // to pass the HMAC challenge) and tell each host its own address.
  p.localAddr = p.addrForHost[remoteHosts.front()];
  p.bindHost = distinct.size() == 1 ? p.localAddr : "";
  *out = p;
  return true;
}

}  // namespace horarun
