// Hosts and slots: parses `-H host:slots,...` and hostfiles (`host slots=N`
// lines), and assigns ranks to slots host by host, the way horovodrun does:
// local rank = slot index on its host; cross rank = index of the host among
// the hosts that have that local rank; cross size = how many hosts have it.
//
// Called by horarun's main thread before anything is started; pure logic (no
// I/O except reading the hostfile), so it is unit-testable.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace horarun {

struct HostSpec {
  std::string name;  // as given: a host name or an IPv4 address
  int slots = 1;
};

struct Slot {
  int rank = 0;
  int size = 0;
  int localRank = 0;
  int localSize = 0;
  int crossRank = 0;
  int crossSize = 0;
  int hostIndex = 0;  // into the host list
  std::string host;
};

// A host named more than once (`-H a:2,b:1,a:2`, or on two hostfile lines) is
// one host with the slots added up (a:4, then b), in the place it was first
// named; a note per such host goes to *notes (when given) for horarun to print.
// Two entries of one machine would otherwise both get local rank 0, and pick
// the same GPU. (Names are compared as written: localhost and 127.0.0.1 stay
// two hosts.) launcher/README.md compares this with horovodrun.

// "a:2,b:4,c" (slots default to 1). False with *error on a malformed entry, or
// when a repeated host's slots add up to more than 999999.
bool parseHostList(const std::string& text, std::vector<HostSpec>* out, std::string* error,
                   std::vector<std::string>* notes = nullptr);
// The most bytes parseHostfile reads (a hostfile of a million hosts is ~20 MiB).
constexpr size_t kMaxHostfileBytes = size_t{32} << 20;
// One host per line: "name [slots=N]" ("name:N" also accepted); '#' starts a
// comment. False with *error naming the file and line; also when the file is
// longer than kMaxHostfileBytes (/dev/zero, a FIFO that never ends).
bool parseHostfile(const std::string& path, std::vector<HostSpec>* out, std::string* error,
                   std::vector<std::string>* notes = nullptr);
// Assigns np ranks to the hosts' slots in order; hosts left without ranks are
// dropped. False when the hosts have fewer than np slots in total.
bool assignSlots(const std::vector<HostSpec>& hosts, int np, std::vector<Slot>* out,
                 std::string* error);
// True for names that mean this machine: localhost, 127.x, ::1, this host's
// name, or an address of one of its interfaces.
bool isLocalHost(const std::string& name);

}  // namespace horarun
