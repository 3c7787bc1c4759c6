#!/usr/bin/env bash
# The main job: trains a linear model with NP ranks on this machine (CPU,
# Gloo), averaging gradients through hora; every rank prints its loss.
# Installs what is missing and builds first.
#
# Usage: scripts/run_example.sh [-np N]      (default N=4)
#
# Until horarun lands this script is the launcher: it starts N processes with
# the HORA_* environment contract (README), prefixes their output with the
# rank, and stops the whole job as soon as one rank fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NP=4
if [ "${1:-}" = "-np" ]; then NP="$2"; shift 2; fi
"$ROOT/scripts/build.sh" "$ROOT/build" >/dev/null
BIN="$ROOT/build/examples/train_linear"

PORT=$(( 20000 + RANDOM % 20000 ))
export HORA_SIZE="$NP" HORA_STORE_ADDR=127.0.0.1 HORA_STORE_PORT="$PORT"
export HORA_SECRET="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
pids=()
for ((r = 0; r < NP; r++)); do
  ( HORA_RANK=$r HORA_LOCAL_RANK=$r HORA_LOCAL_SIZE=$NP exec "$BIN" 2>&1 | sed -u "s/^/[$r] /" ) &
  pids+=($!)
done
status=0
# Wait for every rank; the first failure ends the job.
while [ ${#pids[@]} -gt 0 ]; do
  if wait -n; then :; else
    status=$?
    echo "hora example: a rank failed (exit $status); stopping the others" >&2
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    break
  fi
  alive=()
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
  pids=("${alive[@]+"${alive[@]}"}")
done
exit $status
