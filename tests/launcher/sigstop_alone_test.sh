#!/usr/bin/env bash
# A rank stopped (SIGSTOP) after every other rank finished: no peer is left to
# miss it, so before the stopped-rank watch horarun waited for ever. Now
# horarun says it is stopped, ends the job once it stayed stopped for
# HORARUN_STOPPED_TIMEOUT_S (3 s here), names it as the first failure and
# exits non-zero. Then the other side: a rank stopped for a moment and
# continued finishes the job normally (exit 0, no failure). Last, the same in
# elastic mode: the job ends with the elastic failure naming the worker.
source "$(dirname "$0")/lib.sh"
cat >"$WORK/rank.sh" <<'RANK'
if [ "$HORA_RANK" = 2 ]; then
  echo "rank 2 stopping pid $$"
  kill -STOP $$
fi
echo "rank $HORA_RANK done"
RANK

t0=$(now)
HORARUN_STOPPED_TIMEOUT_S=3 "$HORARUN" -np 3 --grace-seconds 1 bash "$WORK/rank.sh" \
  >"$WORK/job.out" 2>"$WORK/job.err" &
hr=$!
wait $hr
rc=$?
dt=$(elapsed "$t0")
[ $rc -ne 0 ] || fail "horarun exited 0 although rank 2 never finished"
less_than "$dt" 20 || fail "job took $dt s to end (stopped timeout 3 s)"
expect_grep "rank 2 .*has been stopped \(SIGSTOP or SIGTSTP\)" "$WORK/job.err" \
  "horarun did not say that rank 2 is stopped"
expect_grep "kill -CONT [0-9]+" "$WORK/job.err" "the message does not say how to resume it"
expect_grep "First failure: rank 2 .*stayed stopped" "$WORK/job.err" \
  "the stopped rank is not named as the first failure"
expect_grep "rank 0: exited with code 0" "$WORK/job.err" "rank 0's clean exit is not reported"
pid=$(sed -nE 's/.*rank 2 stopping pid ([0-9]+).*/\1/p' "$WORK/job.out")
[ -n "$pid" ] || fail "rank 2 never got to its stop"
if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fail "the stopped rank (pid $pid) survived the job"; fi
echo "rank 2 stopped alone: job ended in $dt s (exit $rc)"
grep "First failure" "$WORK/job.err"

# Stopped for a moment, then continued: the job finishes as if nothing happened.
HORARUN_STOPPED_TIMEOUT_S=30 "$HORARUN" -np 3 --grace-seconds 1 bash "$WORK/rank.sh" \
  >"$WORK/job2.out" 2>"$WORK/job2.err" &
hr=$!
wait_for_line "rank 2 stopping pid" 15 "$WORK/job2.out" || fail "rank 2 never got to its stop"
pid=$(sed -nE 's/.*rank 2 stopping pid ([0-9]+).*/\1/p' "$WORK/job2.out")
sleep 1.5
kill -CONT "$pid"
wait $hr
rc=$?
[ $rc -eq 0 ] || fail "horarun exited $rc after rank 2 was continued (expected 0)"
expect_grep "rank 2 done" "$WORK/job2.out" "rank 2 did not finish after SIGCONT"
if grep -q "FAILED" "$WORK/job2.err"; then fail "a continued rank was reported as a failure"; fi
echo "rank 2 stopped 1.5 s and continued: job exited 0"

# Elastic mode: worker w0 finishes (training is over), w1 stops itself: the job ends with the
# elastic failure naming w1 instead of waiting for it.
echo 'echo localhost:2' >"$WORK/discover.sh"
chmod +x "$WORK/discover.sh"
cat >"$WORK/worker.sh" <<'WORKER'
if [ "$HORA_RANK" = 1 ]; then
  echo "worker stopping pid $$"
  kill -STOP $$
fi
echo "worker $HORA_RANK done"
WORKER
t0=$(now)
HORARUN_STOPPED_TIMEOUT_S=3 "$HORARUN" -np 2 --min-np 1 --max-np 2 \
  --host-discovery-script "$WORK/discover.sh" --grace-seconds 1 bash "$WORK/worker.sh" \
  >"$WORK/job3.out" 2>"$WORK/job3.err" &
hr=$!
wait $hr
rc=$?
dt=$(elapsed "$t0")
[ $rc -ne 0 ] || fail "elastic horarun exited 0 although worker w1 never finished"
less_than "$dt" 20 || fail "elastic job took $dt s to end (stopped timeout 3 s)"
expect_grep "job FAILED: worker w1 .*stayed stopped" "$WORK/job3.err" \
  "the elastic job's failure does not name the stopped worker"
pid=$(sed -nE 's/.*worker stopping pid ([0-9]+).*/\1/p' "$WORK/job3.out")
[ -n "$pid" ] || fail "worker w1 never got to its stop"
if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fail "the stopped worker (pid $pid) survived"; fi
echo "elastic: worker w1 stopped alone: job ended in $dt s (exit $rc)"
