// horarun --check: before a real job, checks that every host answers through
// the remote shell, that the rendezvous store horarun is hosting can be
// reached (TCP connect) from each host, that the command exists there, and
// reports hora versions (this libhora, and `horarun --version` on remote
// hosts when it is on their PATH).
//
// Called by main() on the main thread after the store started and before the
// Job runs (so the blocking waits here never race the Job's SIGCHLD handling).
#pragma once

#include <string>
#include <vector>

#include "netif.h"
#include "options.h"

namespace horarun {

// hosts: unique host names in rank order. Prints one line per host and a
// summary to stderr; true when every check passed.
bool runChecks(const Options& opt, const std::vector<std::string>& hosts, const StorePlan& plan,
               int storePort);

std::string versionText();

}  // namespace horarun
