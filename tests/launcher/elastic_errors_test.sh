#!/usr/bin/env bash
# Elastic mode's bad input: a discovery script that fails, prints garbage or hangs, and a
# discovery that never offers --min-np slots, each end the job with a one-line error naming
# the script (its exit status, a sample of its output) within a deadline; bad flags are
# refused before anything starts.
source "$(dirname "$0")/lib.sh"
: "${ELASTIC_WORKER:?set ELASTIC_WORKER to build/tests/elastic_worker}"
D="$WORK/d"; mkdir -p "$D"

# run_job DEADLINE ARGS...: runs horarun with ARGS, fails the test past DEADLINE seconds.
run_job() {
  local deadline=$1; shift
  "$HORARUN" "$@" > "$WORK/job.out" 2> "$WORK/job.err" &
  local pid=$!
  wait_for_exit "$deadline" $pid || fail "horarun $* did not end within $deadline s"
}

printf '#!/bin/sh\necho localhost:2\necho "no cluster manager here" >&2\nexit 3\n' > "$D/fails.sh"
printf '#!/bin/sh\necho "Traceback (most recent call last):"\necho "  oops"\n' > "$D/garbage.sh"
printf '#!/bin/sh\necho localhost:2\nsleep 30\n' > "$D/hangs.sh"
printf '#!/bin/sh\necho localhost:1\n' > "$D/small.sh"
printf 'localhost:2\n' > "$D/not_executable.sh"
chmod +x "$D/fails.sh" "$D/garbage.sh" "$D/hangs.sh" "$D/small.sh"

run_job 10 --min-np 2 --host-discovery-script "$D/fails.sh" "$ELASTIC_WORKER" "$D"
[ "$JOB_RC" = 1 ] || fail "failing script: exit status $JOB_RC, expected 1"
expect_grep "host discovery script '$D/fails.sh' exited with code 3 .*it printed 'localhost:2'; its stderr: 'no cluster manager here'" \
  "$WORK/job.err" "failing script: the error names the script, its code and output"
echo "ok: failing script"

run_job 10 --min-np 2 --host-discovery-script "$D/garbage.sh" "$ELASTIC_WORKER" "$D"
[ "$JOB_RC" = 1 ] || fail "garbage script: exit status $JOB_RC, expected 1"
expect_grep "host discovery script '$D/garbage.sh' printed something that is not a host list: line 1 'Traceback \(most recent call last\):'" \
  "$WORK/job.err" "garbage script: the error names the script and the bad line"
echo "ok: garbage"

start=$(now)
HORARUN_DISCOVERY_TIMEOUT_S=1 run_job 10 --min-np 2 --host-discovery-script "$D/hangs.sh" "$ELASTIC_WORKER" "$D"
[ "$JOB_RC" = 1 ] || fail "hanging script: exit status $JOB_RC, expected 1"
expect_grep "host discovery script '$D/hangs.sh' did not finish within 1.00 s \(killed\); it printed 'localhost:2'" \
  "$WORK/job.err" "hanging script: the error says it timed out"
echo "ok: hanging script ($(elapsed "$start") s)"

start=$(now)
run_job 10 --min-np 2 --elastic-timeout 2 --host-discovery-script "$D/small.sh" "$ELASTIC_WORKER" "$D"
[ "$JOB_RC" = 1 ] || fail "too few slots: exit status $JOB_RC, expected 1"
expect_grep "host discovery script '$D/small.sh' offered 1 slots \(localhost:1\), fewer than --min-np 2, for 2 s" \
  "$WORK/job.err" "too few slots: the error"
ls "$D"/*.env >/dev/null 2>&1 && fail "too few slots: a worker was started"
echo "ok: fewer than --min-np ($(elapsed "$start") s)"

# Flags: refused at once with exit 2 and a one-line reason.
refused() {  # refused PATTERN ARGS...
  local pattern=$1; shift
  run_job 5 "$@" "$ELASTIC_WORKER" "$D"
  [ "$JOB_RC" = 2 ] || fail "horarun $* exited $JOB_RC, expected 2 (usage error)"
  expect_grep "$pattern" "$WORK/job.err" "horarun $*"
}
refused "is not an executable file" --min-np 1 --host-discovery-script "$D/not_executable.sh"
refused "No such file or directory" --min-np 1 --host-discovery-script "$D/missing.sh"
refused "--min-np expects an integer from 1 to 1048576, got '0'" --min-np 0 --host-discovery-file "$D/hosts"
refused "--min-np 3 is larger than --max-np 2" --min-np 3 --max-np 2 --host-discovery-script "$D/small.sh"
refused "-np 1 must lie between --min-np 2 and --max-np 4" -np 1 --min-np 2 --max-np 4 --host-discovery-script "$D/small.sh"
refused "give one source of hosts" -H localhost:2 --min-np 1 --host-discovery-script "$D/small.sh"
echo "ok: flags"
echo "PASS elastic_errors"
