// Whether a local worker's processes are stopped (SIGSTOP, SIGTSTP, SIGTTIN,
// SIGTTOU): read from /proc, for Job's watch on ranks that stopped (a stopped
// rank with every other rank finished would otherwise keep horarun waiting
// for ever). Linux only; elsewhere, and for remote workers, nothing is known.
//
// Called by Job on horarun's main thread, about once a second; pure reads.
#pragma once

#include <sys/types.h>

#include <string>

namespace horarun {

struct GroupState {
  bool known = false;    // /proc was readable and some process of the group exists
  bool stopped = false;  // some process of the group is stopped by a signal (state T)
  bool active = false;   // some process of the group runs or waits on I/O (state R or D)
  pid_t stoppedPid = 0;  // that process
  std::string comm;      // and its command name
};

// The state of process group `pgid` (a worker is the leader of its own
// group: its shell and the program it starts). A process stopped under a
// debugger (state t, tracing stop) does not count: someone is looking at it.
// `active` tells a rank that still works from one whose group holds a
// stopped process only (a stopped helper child of a rank that runs on).
GroupState processGroupState(pid_t pgid);

// How long every running worker may stay stopped before horarun ends the
// job (Job's stopped-rank watch): HORARUN_STOPPED_TIMEOUT_S (seconds, > 0),
// 60 when unset; an unusable value is said on stderr and the default kept.
double stoppedTimeoutFromEnv();

// Parses one /proc/<pid>/stat line: the state letter, the process group and
// the command name (which may hold spaces and parentheses). False when the
// line does not have that form.
bool parseProcStat(const std::string& line, char* state, pid_t* pgrp, std::string* comm);

}  // namespace horarun
