#!/usr/bin/env bash
# A rank SIGKILLed mid-job: the survivors write their flight recorders into
# the job's dump folder, which horarun picks per job and names when the job
# fails; a job that succeeds leaves no empty folder behind.
source "$(dirname "$0")/lib.sh"
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
# ignore-term: horarun's SIGTERM to the survivors (300 ms after the first
# failure) must not stop one before it noticed the loss and wrote its dump;
# on a loaded machine noticing can take longer than that. It SIGKILLs them
# after the 2 s grace if they have not ended by then.
"$HORARUN" -np 3 --grace-seconds 2 "$PROBE" train 1000000 ignore-term >"$WORK/job.out" 2>"$WORK/job.err" &
hr=$!
wait_for_line "probe ready rank 2 pid" 15 "$WORK/job.out" || fail "rank 2 never got ready"
wait_for_line "probe ready rank 0 pid" 5 "$WORK/job.out" || fail "rank 0 never got ready"
pid=$(sed -nE 's/.*probe ready rank 2 pid ([0-9]+).*/\1/p' "$WORK/job.out")
kill -9 "$pid"
wait $hr
[ $? -eq 137 ] || fail "horarun did not report the kill"
expect_grep "flight recorder dumps and hang reports of this job are in $TMPDIR/hora-$(id -u)/job-" "$WORK/job.err" "horarun did not name the dump folder"
dir=$(sed -nE 's/.*hang reports of this job are in ([^ ]+) .*/\1/p' "$WORK/job.err")
[ -d "$dir" ] || fail "named folder $dir is not there"
# The survivors notice the loss and dump (SIGTERM cannot stop them first).
f=$(ls "$dir"/hora-flight-global-rank[01]-pid*.txt 2>/dev/null | head -1)
[ -n "$f" ] || fail "no flight recorder dump of a survivor in $dir: $(ls "$dir")"
expect_grep "why: (the process set failed|a collective failed)" "$f" "the dump does not say why"
expect_grep "rank 2" "$f" "the dump does not name the lost rank"
# A clean job: no folder left.
"$HORARUN" -np 2 "$PROBE" train 20 >"$WORK/ok.out" 2>"$WORK/ok.err" || fail "clean job failed: $(cat "$WORK/ok.err")"
left=$(ls -d "$TMPDIR"/hora-$(id -u)/job-* | grep -vc "^$dir$")
[ "$left" -eq 0 ] || fail "a clean job left a dump folder behind"
echo "dumps of the failed job in $dir"
