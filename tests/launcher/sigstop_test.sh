#!/usr/bin/env bash
# A rank stopped with SIGSTOP (alive, sockets open, silent: a hung host) while
# the job allreduces: the others declare it lost after the peer timeout (2 s
# here) and exit 1; horarun names the STOPPED rank as the first failure (it
# went silent while still running), not a survivor that exited first, shows
# the noticing rank's error, SIGKILLs the stopped rank and exits 1.
source "$(dirname "$0")/lib.sh"
"$HORARUN" -np 3 --grace-seconds 1 --peer-timeout-seconds 2 "$PROBE" train 1000000 \
  >"$WORK/job.out" 2>"$WORK/job.err" &
hr=$!
wait_for_line "probe ready rank 1 pid" 15 "$WORK/job.out" || fail "rank 1 never got ready"
pid=$(sed -nE 's/.*probe ready rank 1 pid ([0-9]+).*/\1/p' "$WORK/job.out")
t0=$(now)
kill -STOP "$pid"
wait $hr
rc=$?
dt=$(elapsed "$t0")
[ $rc -eq 1 ] || fail "horarun exited $rc, expected 1 (the noticing rank's status)"
less_than "$dt" 20 || fail "job took $dt s to end after the SIGSTOP"
expect_grep "First failure: rank 1 .*went silent while still running" "$WORK/job.err" \
  "the stopped rank is not named as the first failure"
expect_grep "horarun:   \| .*rank 1" "$WORK/job.err" "report lacks the noticing rank's error naming rank 1"
expect_no_survivors "$WORK/job.out"
echo "SIGSTOP of rank 1: named in $dt s"
grep -A3 "First failure" "$WORK/job.err" | head -n 6
