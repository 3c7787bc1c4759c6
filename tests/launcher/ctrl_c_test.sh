#!/usr/bin/env bash
# Ctrl-C (SIGINT to horarun) tears the whole job down: exit 130, no worker
# left, within the grace period. Then SIGTERM the same way (exit 143).
source "$(dirname "$0")/lib.sh"
for sig in INT TERM; do
  "$HORARUN" -np 3 --grace-seconds 2 "$PROBE" train 1000000 >"$WORK/$sig.out" 2>"$WORK/$sig.err" &
  hr=$!
  for r in 0 1 2; do
    wait_for_line "probe ready rank $r pid" 15 "$WORK/$sig.out" || fail "rank $r never got ready"
  done
  t0=$(now)
  kill -$sig $hr
  wait $hr
  rc=$?
  dt=$(elapsed "$t0")
  want=$([ $sig = INT ] && echo 130 || echo 143)
  [ $rc -eq "$want" ] || fail "SIG$sig: horarun exited $rc, expected $want"
  less_than "$dt" 5 || fail "SIG$sig: teardown took $dt s"
  expect_grep "got SIG$sig: stopping 3 ranks" "$WORK/$sig.err" "no interruption message"
  expect_no_survivors "$WORK/$sig.out"
  echo "SIG$sig: job torn down in $dt s"
done
