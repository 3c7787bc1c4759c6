#!/usr/bin/env bash
# A rank that exits 3: horarun stops the others and exits 3 within seconds,
# naming rank 1 as the first failure with its last stderr line.
source "$(dirname "$0")/lib.sh"
t0=$(now)
"$HORARUN" -np 3 --grace-seconds 2 "$PROBE" train 100000 fail 1 20 3 >"$WORK/job.out" 2>"$WORK/job.err"
rc=$?
dt=$(elapsed "$t0")
[ $rc -eq 3 ] || fail "horarun exited $rc, expected 3"
less_than "$dt" 10 || fail "took $dt s"
expect_grep "First failure: rank 1 .*exited with code 3" "$WORK/job.err" "no first-failure report"
expect_grep "horarun:   \| probe: rank 1 exiting with code 3" "$WORK/job.err" "report lacks rank 1's stderr"
expect_grep "^\[1\]<stderr>: probe: rank 1 exiting with code 3" "$WORK/job.err" "rank 1's stderr not forwarded"
expect_no_survivors "$WORK/job.out"
echo "exit code 3 propagated in $dt s"
