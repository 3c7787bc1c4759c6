#!/usr/bin/env bash
# Elastic mode: a worker is killed and discovery shrinks to 1 slot, below --min-np 2: after
# --elastic-timeout the job ends with the error, stops the survivor and exits 1.
source "$(dirname "$0")/lib.sh"
: "${ELASTIC_WORKER:?set ELASTIC_WORKER to build/tests/elastic_worker}"
D="$WORK/d"; mkdir -p "$D"
echo localhost:2 > "$D/hosts"
"$HORARUN" --min-np 2 --host-discovery-file "$D/hosts" --elastic-timeout 2 --grace-seconds 2 \
  "$ELASTIC_WORKER" "$D" > "$WORK/job.out" 2> "$WORK/job.err" &
JOB=$!
wait_for_file 10 "$D/w0.env" && wait_for_file 10 "$D/w1.env" || fail "the first two workers did not start"
echo localhost:1 > "$D/hosts.new" && mv "$D/hosts.new" "$D/hosts"
sleep 1.2  # discovery has seen the smaller file
start=$(now)
kill -9 "$(field "$D/w1.env" pid)"
wait_for_exit 10 $JOB || fail "horarun did not end within 10 s below --min-np (timeout 2 s)"
t=$(elapsed "$start")
echo "job ended $t s after the kill"
less_than 1.9 "$t" || fail "the job ended after $t s, before the 2 s --elastic-timeout"
[ "$JOB_RC" = 1 ] || fail "exit status $JOB_RC, expected 1"
expect_grep 'job FAILED: only 1 worker ran, below --min-np 2, for 2 s' "$WORK/job.err" "the below-min-np error"
[ -f "$D/w2.env" ] && fail "a worker was started although discovery offers 1 slot"
expect_no_elastic_survivors "$D"
echo "PASS elastic_below_min"
