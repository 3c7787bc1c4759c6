#!/usr/bin/env bash
# run_bench.sh: builds (if needed) and runs hora-bench as N local ranks.
#
#   bench/run_bench.sh -np 2 [--quick] [hora-bench options...]
#
# Spawns N processes of hora-bench with HORA_RANK, HORA_SIZE,
# HORA_STORE_ADDR=127.0.0.1 and HORA_STORE_PORT (a free port; rank 0 hosts the
# store), prints rank 0's output (tables, RESULT and TARGET lines), keeps the
# other ranks' output in a log directory, and exits with rank 0's status (or
# the first failing rank's). If any rank fails, the others are stopped.
#
# Environment:
#   BUILD_DIR      build directory (default: <repo>/build-bench); configured and
#                  configured when missing; hora-bench is brought up to date on every run
#   HORA_BENCH     path to an already built hora-bench (skips the build)
#   BENCH_TIMEOUT  seconds before the whole run is stopped (default 1800)
#   BENCH_LOG_DIR  where per-rank logs go (default: a fresh mktemp directory)
#   HORA_*         passed through to every rank (e.g. HORA_CYCLE_TIME_MS)
set -u

usage() {
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
}

NP=2
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -np|--np|-n) NP="${2:?-np needs a number}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
case "$NP" in ''|*[!0-9]*) echo "run_bench.sh: -np must be a positive integer" >&2; exit 2 ;; esac
[ "$NP" -ge 1 ] || { echo "run_bench.sh: -np must be >= 1" >&2; exit 2; }

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"

if [ -n "${HORA_BENCH:-}" ]; then
  BIN="$HORA_BENCH"
else
  BIN="$BUILD_DIR/bench/hora-bench"
  # Always brought up to date (a no-op when it is): a stale binary would
  # report another version's numbers as this one's.
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null ||
      { echo "run_bench.sh: configure failed" >&2; exit 2; }
  fi
  ninja -C "$BUILD_DIR" hora-bench >&2 || { echo "run_bench.sh: build failed" >&2; exit 2; }
fi
[ -x "$BIN" ] || { echo "run_bench.sh: $BIN is not executable" >&2; exit 2; }

# A free TCP port for the store: ask the kernel for an ephemeral one.
pick_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()' && return
  fi
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  echo 29500
}
PORT="${HORA_STORE_PORT:-$(pick_port)}"
LOG_DIR="${BENCH_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/hora-bench.XXXXXX")}"
mkdir -p "$LOG_DIR"
TIMEOUT="${BENCH_TIMEOUT:-1800}"
# A per-run secret for the rendezvous store (hora-bench's raw-Gloo store client reads it too).
if [ -z "${HORA_SECRET:-}" ] && [ -z "${HORA_SECRET_FILE:-}" ]; then
  HORA_SECRET="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  export HORA_SECRET
fi

echo "# run_bench.sh: $NP ranks, store 127.0.0.1:$PORT, logs in $LOG_DIR, binary $BIN" >&2

TO=()
command -v timeout >/dev/null 2>&1 && TO=(timeout --kill-after=10 "$TIMEOUT")

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
}
trap 'cleanup; kill "${TAIL:-}" 2>/dev/null; exit 130' INT TERM

# The logs exist before the ranks start: tail -f gives up on a file that is
# not there yet, and rank 0's output would then never be shown.
for ((r = 0; r < NP; r++)); do : >"$LOG_DIR/rank$r.out"; done
for ((r = 0; r < NP; r++)); do
  # Rank 0's stderr goes straight to ours; its stdout to a log we follow live.
  if [ "$r" -eq 0 ]; then
    HORA_RANK=$r HORA_SIZE=$NP HORA_STORE_ADDR=127.0.0.1 HORA_STORE_PORT=$PORT \
      "${TO[@]+"${TO[@]}"}" "$BIN" "${ARGS[@]+"${ARGS[@]}"}" >"$LOG_DIR/rank$r.out" &
  else
    HORA_RANK=$r HORA_SIZE=$NP HORA_STORE_ADDR=127.0.0.1 HORA_STORE_PORT=$PORT \
      "${TO[@]+"${TO[@]}"}" "$BIN" "${ARGS[@]+"${ARGS[@]}"}" >"$LOG_DIR/rank$r.out" 2>"$LOG_DIR/rank$r.err" &
  fi
  PIDS+=($!)
done
tail -n +1 -f --pid="${PIDS[0]}" "$LOG_DIR/rank0.out" &
TAIL=$!

# Wait for ranks; on the first failure stop the rest (they would otherwise
# block in collectives until their timeouts).
STATUS=0
declare -A RC
remaining=$NP
while [ "$remaining" -gt 0 ]; do
  wait -n "${PIDS[@]}" 2>/dev/null
  for ((r = 0; r < NP; r++)); do
    [ -n "${RC[$r]:-}" ] && continue
    p=${PIDS[$r]}
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p" 2>/dev/null; rc=$?
      RC[$r]=$rc
      remaining=$((remaining - 1))
      if [ "$rc" -ne 0 ]; then
        [ "$STATUS" -eq 0 ] && STATUS=$rc
        if [ "$r" -eq 0 ]; then echo "run_bench.sh: rank 0 exited with status $rc" >&2; else echo "run_bench.sh: rank $r exited with status $rc (log: $LOG_DIR/rank$r.err)" >&2; fi
        [ "$rc" -eq 124 ] && echo "run_bench.sh: rank $r timed out after ${TIMEOUT}s" >&2
        if [ "$rc" -ne 1 ]; then  # 1 = wrong results (all ranks finish); else stop the others
          for q in "${PIDS[@]}"; do kill "$q" 2>/dev/null; done
        fi
      fi
    fi
  done
done
wait "$TAIL" 2>/dev/null

for ((r = 1; r < NP; r++)); do
  if [ -s "$LOG_DIR/rank$r.err" ] && [ "${RC[$r]:-0}" -ne 0 ]; then
    echo "---- rank $r stderr (tail) ----" >&2
    tail -n 20 "$LOG_DIR/rank$r.err" >&2
  fi
done
[ "${RC[0]:-0}" -ne 0 ] && [ "$STATUS" -eq 0 ] && STATUS=${RC[0]}
exit "$STATUS"
