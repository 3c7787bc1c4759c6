#!/usr/bin/env bash
# Elastic mode: a discovery file that grows from 2 to 4 slots gets 2 newcomers (and no more
# than --max-np when it offers 6); the worker ids are never reused; live follows; Ctrl-C
# (SIGINT) still stops every worker.
source "$(dirname "$0")/lib.sh"
: "${ELASTIC_WORKER:?set ELASTIC_WORKER to build/tests/elastic_worker}"
D="$WORK/d"; mkdir -p "$D"
echo localhost > "$D/hosts"
# A bare host gets --slots slots.
"$HORARUN" --min-np=2 --max-np 4 --slots 2 --host-discovery-file "$D/hosts" --grace-seconds 2 \
  "$ELASTIC_WORKER" "$D" > "$WORK/job.out" 2> "$WORK/job.err" &
JOB=$!
wait_for_file 10 "$D/w0.env" && wait_for_file 10 "$D/w1.env" || fail "the first two workers did not start"
wait_for_field 10 "$D/w0.store" live 2 || fail "hora/el/live is not 2"
start=$(now)
printf 'localhost:4\n' > "$D/hosts.new" && mv "$D/hosts.new" "$D/hosts"
wait_for_file 10 "$D/w2.env" && wait_for_file 10 "$D/w3.env" || fail "2 newcomers did not start within 10 s of the file growing to 4 slots"
echo "newcomers started $(elapsed "$start") s after the file grew"
for w in w2 w3; do
  [ "$(field "$D/$w.env" newcomer)" = 1 ] || fail "$w: HORA_ELASTIC_NEWCOMER not 1"
  [ "$(field "$D/$w.env" rank)" = - ] || fail "$w: a newcomer got HORA_RANK"
done
wait_for_field 10 "$D/w0.store" live 4 || fail "hora/el/live is not 4"
# More slots than --max-np: nothing more.
printf 'localhost:6\n' > "$D/hosts.new" && mv "$D/hosts.new" "$D/hosts"
sleep 2.5
[ -f "$D/w4.env" ] && fail "a fifth worker started beyond --max-np 4"
kill -0 $JOB 2>/dev/null || fail "horarun ended early"

start=$(now)
kill -INT $JOB
wait_for_exit 10 $JOB || fail "horarun did not stop within 10 s of SIGINT"
[ "$JOB_RC" = 130 ] || fail "exit status $JOB_RC after SIGINT, expected 130"
echo "stopped $(elapsed "$start") s after SIGINT"
expect_no_elastic_survivors "$D"
echo "PASS elastic_grow"
