#!/usr/bin/env bash
# -np 1..4 on localhost running the example: every rank converges, output is
# prefixed with the rank, horarun exits 0.
source "$(dirname "$0")/lib.sh"
for np in 1 2 3 4; do
  t0=$(now)
  "$HORARUN" -np "$np" "$TRAIN" >"$WORK/np$np.out" 2>"$WORK/np$np.err"
  rc=$?
  [ $rc -eq 0 ] || fail "-np $np: horarun exited $rc"
  for ((r = 0; r < np; r++)); do
    expect_grep "^\[$r\]<stdout>: rank $r: converged" "$WORK/np$np.out" "-np $np: rank $r did not report convergence"
  done
  n=$(grep -c "converged" "$WORK/np$np.out")
  [ "$n" -eq "$np" ] || fail "-np $np: $n converged lines, expected $np"
  echo "-np $np: ok in $(elapsed "$t0") s"
done
