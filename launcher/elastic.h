// Elastic mode's decisions, as pure functions (docs/elastic.md, docs/launching.md "Elastic
// mode"): what a host discovery script printed, which hosts are blacklisted and when they
// come back, and how many new workers to start on which hosts.
//
// Called by the Job (job_elastic.cc) on horarun's main thread, and by the unit tests
// (tests/unit/launcher_elastic_test.cc). No I/O, no clock: times are passed in as seconds on
// any monotonic scale, randomness comes from a seeded generator, so every decision can be
// replayed in a test.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hosts.h"

namespace horarun {

// The worker count that no --max-np means (published as hora/el/max_np).
constexpr int kUnboundedNp = 2147483647;

// Parses a discovery script's (or --host-discovery-file's) output: one host per line, `host`
// (defaultSlots slots) or `host:slots`; blank lines and `#` comments are skipped, surrounding
// whitespace ignored. A host listed twice keeps its last line (horovodrun does the same).
// False with *error naming the first bad line (number and text) on anything else: spaces
// inside a line, an empty host, slots that are not a positive integer up to 65536.
// IPv6 literals are not accepted (the ':' is the slots separator).
bool parseDiscoveryOutput(const std::string& text, int defaultSlots, std::vector<HostSpec>* out,
                          std::string* error);

// Hosts whose workers failed. A failed host is not given new workers until its cool-down ends.
// The n-th cool-down of a host lasts min(hi, lo * 2^(n-1) * (1 + u)) seconds, u uniform in
// [0, 1): random, never shorter than lo nor longer than hi, and doubling for a host that keeps
// failing (horovodrun's exponential back-off). hi < 0 means "forever" (horovodrun without
// --blacklist-cooldown-range); horarun's default is lo = 1, hi = 600, see options.h.
class Blacklist {
 public:
  Blacklist(double lowS, double highS, uint64_t seed);
  // A worker on `host` failed at time nowS. A failure while the host is already cooling down
  // does not extend it (the workers that were there fail together, one failure counts).
  void fail(const std::string& host, double nowS);
  bool blocked(const std::string& host, double nowS) const;
  // When `host` comes back (seconds on the caller's scale); < 0 = never; 0 = not blocked.
  double until(const std::string& host) const;
  // "a (back in 3 s), b (forever)" for error messages; "" when none is blocked.
  std::string describe(double nowS) const;

 private:
  struct Entry {
    int failures = 0;
    double until = 0;  // < 0: forever
  };
  double lowS_, highS_;
  std::mt19937_64 rng_;
  std::map<std::string, Entry> hosts_;
};

// What to start, given what discovery offers and what runs. Hosts are filled in discovery
// order, each up to its slots minus the workers already running there, skipping blocked
// hosts, until `running + result.size()` reaches maxNp. One entry per new worker: its host.
// runningOnHost: host -> workers running there now (hosts not discovered any more may appear).
std::vector<std::string> planSpawns(const std::vector<HostSpec>& discovered,
                                    const std::map<std::string, int>& runningOnHost,
                                    const std::vector<std::string>& blockedHosts, int maxNp);

// Slots of the discovered hosts that are not blocked (what the job could use now).
int usableSlots(const std::vector<HostSpec>& discovered,
                const std::vector<std::string>& blockedHosts);

}  // namespace horarun
