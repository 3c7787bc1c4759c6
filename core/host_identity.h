// hostIdentity(): which machine (and kernel boot) this process runs on, so
// that ranks can tell which of them share a host: the shm data plane needs
// one /dev/shm, the GPU path needs to know when ranks share a physical GPU.
// Pure function of the machine; any thread.
#pragma once

#include <string>

namespace hora {

// Differs between hosts (and between boots of one host), equal for processes
// that share a kernel: the hostname plus the kernel's boot id.
std::string hostIdentity();

// The identity a rank reports to its peers: hostIdentity() unless the
// test-only HORA_HOST_ID (`override`) says otherwise: "address" stands for
// `address` (the rank's HORA_HOSTNAME), any other non-empty value for itself.
std::string hostIdentity(const std::string& override, const std::string& address);

}  // namespace hora
