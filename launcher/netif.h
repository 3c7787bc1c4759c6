// Network interface selection for the rendezvous store: which local address
// the workers on each host can reach. Called by main() before the store
// starts, on the main thread.
//
// "By reachability": for every remote host, the kernel's route to that host
// decides which local address it would see us from (a connected UDP socket's
// local name: no packet is sent). Hosts whose interfaces have different names
// (eth0 here, ib0 there) are therefore handled without any name matching.
// --network-interface overrides with one interface's IPv4 address.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace horarun {

// IPv4 address of interface `name`. False with *error listing the interfaces.
bool interfaceAddress(const std::string& name, std::string* out, std::string* error);
// The local IPv4 address the route to `host` uses. False with *error.
bool addressTowards(const std::string& host, std::string* out, std::string* error);
// Name of the interface holding local address `addr` ("?" when none).
std::string interfaceOf(const std::string& addr);

struct StorePlan {
  std::string bindHost;                            // "" = every interface
  std::map<std::string, std::string> addrForHost;  // host name -> HORA_STORE_ADDR there
  std::string localAddr;                           // for ranks on this machine
  std::string description;                         // for --verbose and errors
};

// remoteHosts may be empty (local job: loopback). False with *error when a
// host cannot be routed to.
bool planStore(const std::vector<std::string>& remoteHosts, const std::string& forcedInterface,
               StorePlan* out, std::string* error);

}  // namespace horarun
