#!/usr/bin/env bash
# A rank SIGKILLed from outside while the job is allreducing: horarun reports
# it as the first failure (killed by SIGKILL), stops the others, exits 137
# within seconds, and leaves no process behind.
source "$(dirname "$0")/lib.sh"
"$HORARUN" -np 3 --grace-seconds 2 "$PROBE" train 1000000 >"$WORK/job.out" 2>"$WORK/job.err" &
hr=$!
wait_for_line "probe ready rank 2 pid" 15 "$WORK/job.out" || fail "rank 2 never got ready"
wait_for_line "probe ready rank 0 pid" 5 "$WORK/job.out" || fail "rank 0 never got ready"
pid=$(sed -nE 's/.*probe ready rank 2 pid ([0-9]+).*/\1/p' "$WORK/job.out")
t0=$(now)
kill -9 "$pid"
wait $hr
rc=$?
dt=$(elapsed "$t0")
[ $rc -eq 137 ] || fail "horarun exited $rc, expected 137 (128+SIGKILL)"
less_than "$dt" 8 || fail "job took $dt s to end after the kill"
expect_grep "First failure: rank 2 .*killed by SIGKILL" "$WORK/job.err" "no first-failure report naming rank 2"
expect_grep "rank 0: (exited with code 1|was killed by SIGTERM \(sent by horarun\))" "$WORK/job.err" "rank 0's end not reported"
expect_no_survivors "$WORK/job.out"
echo "SIGKILL of rank 2 ended the job in $dt s"
