#!/usr/bin/env bash
# The HORA_* contract each rank receives: identity with local/cross ranks
# computed host by host (two "hosts" that are both this machine), store
# address and port, the secret (only through the environment: it is not on any
# command line), and tuning flags mapped to parameters with their units.
source "$(dirname "$0")/lib.sh"
"$HORARUN" -np 3 -H localhost:2,127.0.0.1:2 --fusion-threshold-mb 2 --cycle-time-ms 3.5 \
  --cache-capacity 7 --log-level info --no-stall-check --peer-timeout-seconds 9 --start-timeout 12 \
  -x PROBE_EXTRA=hello "$PROBE" env >"$WORK/env.out" 2>"$WORK/env.err"
rc=$?
[ $rc -eq 0 ] || fail "horarun exited $rc"
v() { sed -nE "s/^\[$1\]<stdout>: $2=(.*)$/\1/p" "$WORK/env.out"; }
check() { [ "$(v "$1" "$2")" = "$3" ] || fail "rank $1: $2 is '$(v "$1" "$2")', expected '$3'"; }
# rank: local_rank local_size cross_rank cross_size
exp=("0 2 0 2" "1 2 0 1" "0 1 1 2")
for r in 0 1 2; do
  read -r lr ls cr cs <<<"${exp[$r]}"
  check $r HORA_RANK $r; check $r HORA_SIZE 3
  check $r HORA_LOCAL_RANK "$lr"; check $r HORA_LOCAL_SIZE "$ls"
  check $r HORA_CROSS_RANK "$cr"; check $r HORA_CROSS_SIZE "$cs"
  check $r HORA_STORE_ADDR 127.0.0.1; check $r HORA_STORE_EXTERNAL 1
  check $r HORA_FUSION_THRESHOLD_BYTES 2097152; check $r HORA_CYCLE_TIME_MS 3.5
  check $r HORA_CACHE_CAPACITY 7; check $r HORA_LOG_LEVEL info
  check $r HORA_STALL_CHECK 0; check $r HORA_PEER_TIMEOUT_S 9
  check $r PROBE_EXTRA hello; check $r HORA_SECRET set; check $r HORA_SECRET_LEN 64
  [ "$(v $r HORA_START_TIMEOUT_S | cut -d. -f1)" = 12 ] || fail "rank $r: start timeout not 12"
  port=$(v $r HORA_STORE_PORT)
  [ "$port" -gt 0 ] 2>/dev/null || fail "rank $r: bad store port '$port'"
done
# horovodrun's timeline flags become HORA_TIMELINE*.
"$HORARUN" -np 1 --timeline-filename "$WORK/t.json" --timeline-mark-cycles "$PROBE" env >"$WORK/timeline.out" 2>&1 || fail "--timeline-filename refused"
expect_grep "HORA_TIMELINE=$WORK/t.json" "$WORK/timeline.out" "--timeline-filename did not set HORA_TIMELINE"
expect_grep "HORA_TIMELINE_MARK_CYCLES=1" "$WORK/timeline.out" "--timeline-mark-cycles did not set HORA_TIMELINE_MARK_CYCLES"
# So are its autotune flags (Horovod's Bayesian-search knobs: accepted with a note).
"$HORARUN" -np 1 --autotune --autotune-log-file "$WORK/at.csv" --autotune-warmup-samples 3 "$PROBE" env \
  >"$WORK/autotune.out" 2>"$WORK/autotune.err" || fail "--autotune refused"
expect_grep "HORA_AUTOTUNE=1" "$WORK/autotune.out" "--autotune did not set HORA_AUTOTUNE"
expect_grep "HORA_AUTOTUNE_LOG=$WORK/at.csv" "$WORK/autotune.out" "--autotune-log-file did not set HORA_AUTOTUNE_LOG"
expect_grep "horarun: --autotune-warmup-samples 3: accepted, no effect" "$WORK/autotune.err" "--autotune-warmup-samples note missing"
# horovodrun's flags hora has no answer for are refused naming why; its no-op flags are
# accepted with a note.
"$HORARUN" -np 1 --torus-allreduce "$PROBE" env >/dev/null 2>"$WORK/torus.err" && fail "--torus-allreduce accepted"
expect_grep "not supported by hora: --torus-allreduce" "$WORK/torus.err" "--torus-allreduce refusal not explained"
"$HORARUN" -np 1 --gloo --disable-cache "$PROBE" env >/dev/null 2>"$WORK/noop.err" || fail "--gloo refused"
expect_grep "horarun: --disable-cache: accepted, no effect" "$WORK/noop.err" "--disable-cache note missing"
# The secret never appears on a command line: run a job and read every
# process's cmdline while it runs.
"$HORARUN" -np 2 "$PROBE" train 40 sleep 50 >"$WORK/cmd.out" 2>"$WORK/cmd.err" &
hr=$!
wait_for_line "probe ready rank 1" 10 "$WORK/cmd.out" || fail "job did not start"
secret=$(tr '\0' '\n' </proc/$(sed -nE 's/.*probe ready rank 1 pid ([0-9]+).*/\1/p' "$WORK/cmd.out")/environ | sed -n 's/^HORA_SECRET=//p')
[ ${#secret} -eq 64 ] || fail "could not read the worker's secret from its environment"
# The pattern comes from a file: `grep "$secret"` would put it on grep's own command line.
printf '%s\n' "$secret" >"$WORK/secret.pat"
if cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' ' | grep -qF -f "$WORK/secret.pat"; then fail "secret visible on a command line"; fi
wait $hr || fail "job with cmdline check failed"
echo "env contract ok"
