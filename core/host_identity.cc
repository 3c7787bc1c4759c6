#include "core/host_identity.h"

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

}  // namespace hora
