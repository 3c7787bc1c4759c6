#include "core/host_identity.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <fstream>

namespace hora {

std::string hostIdentity() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

std::string hostIdentity(const std::string& override, const std::string& address) {
  if (override.empty()) return hostIdentity();
  if (override == "address") return "address:" + address;
  return "id:" + override;
}

std::string bootIdOf(const std::string& identity) {
  if (identity.rfind("id:", 0) == 0 || identity.rfind("address:", 0) == 0) return "";
  const size_t slash = identity.rfind('/');
  return slash == std::string::npos ? "" : identity.substr(slash + 1);
}

bool parseKernelCount(const std::string& text, int* out) {
  if (text.empty() || text.size() > 9) return false;
  int n = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    n = n * 10 + (ch - '0');
  }
  if (n <= 0) return false;
  *out = n;
  return true;
}

bool ipv4Interfaces(std::map<std::string, std::string>* out) {
  out->clear();
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || out->count(i->ifa_name))
      continue;
    char buf[INET_ADDRSTRLEN] = {0};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf)) (*out)[i->ifa_name] = buf;
  }
  ::freeifaddrs(list);
  return true;
}

}  // namespace hora
