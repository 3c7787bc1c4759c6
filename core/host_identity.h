// hostIdentity(): which machine (and kernel boot) this process runs on, so
// that ranks can tell which of them share a host: the shm data plane needs
// one /dev/shm, the GPU path needs to know when ranks share a physical GPU.
// ipv4Interfaces(): the host's interfaces that hold an IPv4 address
// (HORA_GLOO_IFACE's check at init, the tcp ring's address).
// Pure functions of the machine; any thread.
#pragma once

#include <map>
#include <string>

namespace hora {

// Differs between hosts (and between boots of one host), equal for processes
// that share a kernel: the hostname plus the kernel's boot id.
std::string hostIdentity();

// The identity a rank reports to its peers: hostIdentity() unless the
// test-only HORA_HOST_ID (`override`) says otherwise: "address" stands for
// `address` (the rank's HORA_HOSTNAME), any other non-empty value for itself.
std::string hostIdentity(const std::string& override, const std::string& address);

// The kernel's boot id inside an identity from hostIdentity(): equal for
// ranks that share a kernel (and so its cores) whatever their host names,
// e.g. network/UTS-namespace or container hosts on one machine. Empty for
// an override, "-" (no identity reported) or anything else without one.
std::string bootIdOf(const std::string& identity);
// A count of ranks sharing a kernel as a set-up exchange carries it: a
// positive decimal of at most 9 digits. False for anything else (empty,
// zero, a sign, too long), leaving *out as it was.
bool parseKernelCount(const std::string& text, int* out);

// Interface name -> its first IPv4 address ("lo" -> "127.0.0.1"). False when
// the interfaces cannot be listed (getifaddrs failed).
bool ipv4Interfaces(std::map<std::string, std::string>* out);

}  // namespace hora
