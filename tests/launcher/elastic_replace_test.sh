#!/usr/bin/env bash
# Elastic mode: a killed worker is replaced by a newcomer from the discovery file on the same
# (only) host after the blacklist cool-down; horarun publishes live/min_np/max_np and
# dead/<id> in its store before the replacement starts; the first batch has ranks, the
# newcomer none; the job ends 0 when the last workers exit 0 (the killed one was survived).
source "$(dirname "$0")/lib.sh"
: "${ELASTIC_WORKER:?set ELASTIC_WORKER to build/tests/elastic_worker}"
D="$WORK/d"; mkdir -p "$D"
printf '# one host, two slots\nlocalhost:2\n' > "$D/hosts"
"$HORARUN" --min-np 2 --max-np 3 --host-discovery-file "$D/hosts" --elastic-timeout=20 \
  "$ELASTIC_WORKER" "$D" > "$WORK/job.out" 2> "$WORK/job.err" &
JOB=$!
wait_for_file 10 "$D/w0.env" && wait_for_file 10 "$D/w1.env" || fail "the first two workers did not start"
for w in w0 w1; do
  [ "$(field "$D/$w.env" elastic)" = 1 ] || fail "$w: HORA_ELASTIC not 1"
  [ "$(field "$D/$w.env" external)" = 1 ] || fail "$w: HORA_STORE_EXTERNAL not 1"
  [ "$(field "$D/$w.env" newcomer)" = - ] || fail "$w: first-batch worker marked newcomer"
  [ "$(field "$D/$w.env" size)" = 2 ] || fail "$w: HORA_SIZE not 2"
done
[ "$(field "$D/w0.env" rank)$(field "$D/w1.env" rank)" = 01 ] || fail "first batch ranks are not 0 and 1"
wait_for_field 10 "$D/w0.store" live 2 || fail "hora/el/live is not 2 with two workers"
[ "$(field "$D/w0.store" min_np)/$(field "$D/w0.store" max_np)" = 2/3 ] || fail "min_np/max_np not published as 2/3"
# Discovery offers 2 slots, max-np 3: no third worker.
sleep 1.5
[ -f "$D/w2.env" ] && fail "a third worker started although discovery offers only 2 slots"

start=$(now)
kill -9 "$(field "$D/w1.env" pid)"
wait_for_field 10 "$D/w0.store" dead/w1 "signal_9" || fail "hora/el/dead/w1 is not 'signal 9'"
wait_for_file 15 "$D/w2.env" || fail "the killed worker was not replaced within 15 s"
echo "replacement started $(elapsed "$start") s after the kill"
[ "$(field "$D/w2.env" newcomer)" = 1 ] || fail "w2: HORA_ELASTIC_NEWCOMER not 1"
[ "$(field "$D/w2.env" rank)$(field "$D/w2.env" size)$(field "$D/w2.env" local_rank)" = --- ] ||
  fail "w2: a newcomer must get no HORA_RANK/HORA_SIZE/HORA_LOCAL_RANK"
wait_for_field 10 "$D/w0.store" live 2 || fail "hora/el/live not back to 2"
kill -0 $JOB 2>/dev/null || fail "horarun ended although one worker survived the kill"
expect_grep 'worker w1 .*killed by SIGKILL; 1 worker' "$WORK/job.err" "horarun names the killed worker"
expect_grep 'started newcomer w2 on localhost' "$WORK/job.err" "horarun says it started the newcomer"

echo 0 > "$D/exit.all"
wait_for_exit 15 $JOB || fail "horarun did not end after every worker exited 0"
[ "$JOB_RC" = 0 ] || fail "exit status $JOB_RC, expected 0 (the last workers all exited 0)"
expect_no_elastic_survivors "$D"
echo "PASS elastic_replace"
