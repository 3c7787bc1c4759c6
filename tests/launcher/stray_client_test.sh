#!/usr/bin/env bash
# A stray client with the wrong secret connects to the store horarun hosts:
# it is refused (and gets an authentication error), horarun logs the
# refusal with the peer address, and the job still succeeds.
source "$(dirname "$0")/lib.sh"
"$HORARUN" -np 2 "$PROBE" train 60 sleep 50 >"$WORK/job.out" 2>"$WORK/job.err" &
hr=$!
wait_for_line "probe ready rank 0 pid" 15 "$WORK/job.out" || fail "job did not start"
pid=$(sed -nE 's/.*probe ready rank 0 pid ([0-9]+).*/\1/p' "$WORK/job.out")
port=$(tr '\0' '\n' </proc/$pid/environ | sed -n 's/^HORA_STORE_PORT=//p')
[ -n "$port" ] || fail "cannot read the store port"
HORA_RANK=1 HORA_SIZE=2 HORA_STORE_ADDR=127.0.0.1 HORA_STORE_PORT=$port HORA_STORE_EXTERNAL=1 \
  HORA_SECRET=wrong-secret HORA_START_TIMEOUT_S=3 "$TRAIN" >"$WORK/stray.out" 2>"$WORK/stray.err"
src=$?
[ $src -ne 0 ] || fail "stray client with a wrong secret succeeded"
expect_grep "authentication|auth" "$WORK/stray.err" "stray client's error does not mention authentication"
wait $hr
rc=$?
[ $rc -eq 0 ] || fail "job disturbed by the stray client: horarun exited $rc"
expect_grep "\[hora store\].*rejected store client 127\.0\.0\.1" "$WORK/job.err" "refusal not logged by horarun's store"
grep -m1 "rejected store client" "$WORK/job.err"
echo "stray client refused; job unaffected"
