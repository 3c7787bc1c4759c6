#!/usr/bin/env bash
# Heavy interleaved output from 4 ranks (lines up to 9 KB, each written in
# three pieces): every line arrives exactly once, intact, on the right stream
# with the right prefix; --output-filename keeps an unprefixed copy per rank.
source "$(dirname "$0")/lib.sh"
N=1500
t0=$(now)
"$HORARUN" -np 4 --output-filename "$WORK/logs" "$PROBE" lines $N >"$WORK/job.out" 2>"$WORK/job.err"
rc=$?
[ $rc -eq 0 ] || fail "horarun exited $rc"
"$PROBE" verify 4 $N stdout <"$WORK/job.out" || fail "stdout lines lost or corrupted"
"$PROBE" verify 4 $N stderr <"$WORK/job.err" || fail "stderr lines lost or corrupted"
for r in 0 1 2 3; do
  for s in stdout stderr; do
    f="$WORK/logs/rank.$r/$s"
    [ -f "$f" ] || fail "missing $f"
    n=$(grep -c '^L r=' "$f")
    [ "$n" -eq $N ] || fail "$f has $n lines, expected $N"
  done
done
echo "output: $((8 * N)) lines verified in $(elapsed "$t0") s"
