#!/usr/bin/env bash
# A rank that hangs (stops submitting collectives and ignores SIGTERM): the
# other ranks' allreduce fails by the stall shutdown (2 s here), horarun
# reports that first failure, and SIGKILLs the hung rank after the grace
# period. Exit status 1 (the first failed rank's), all within a deadline.
source "$(dirname "$0")/lib.sh"
t0=$(now)
"$HORARUN" -np 3 --grace-seconds 1 --stall-check-shutdown-time-seconds 2 \
  --stall-check-warning-time-seconds 1 \
  "$PROBE" train 1000000 hang 1 30 ignore-term >"$WORK/job.out" 2>"$WORK/job.err"
rc=$?
dt=$(elapsed "$t0")
[ $rc -eq 1 ] || fail "horarun exited $rc, expected 1"
less_than "$dt" 20 || fail "took $dt s"
expect_grep "First failure: rank [02] .*exited with code 1" "$WORK/job.err" "first failure not a waiting rank"
expect_grep "horarun:   \| .*probe: allreduce wait failed" "$WORK/job.err" "report lacks the stalled rank's error"
expect_grep "rank 1: was killed by SIGKILL \(sent by horarun\)" "$WORK/job.err" "hung rank not SIGKILLed"
expect_grep "still running .* after SIGTERM: sending SIGKILL" "$WORK/job.err" "no SIGKILL escalation message"
expect_no_survivors "$WORK/job.out"
echo "hung rank: job ended in $dt s"
grep -A3 "First failure" "$WORK/job.err" | head -n 6
