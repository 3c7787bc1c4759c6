#!/usr/bin/env bash
# The main job: trains a linear model with NP ranks on this machine (CPU,
# Gloo), averaging gradients through hora; every rank prints its loss.
# Installs what is missing and builds first.
#
# Usage: scripts/run_example.sh [-np N]      (default N=4)
#
# The job is started by horarun (launcher/): it sets the HORA_* environment
# contract (README), hosts the rendezvous store, prefixes output with the
# rank, and stops the whole job as soon as one rank fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NP=4
if [ "${1:-}" = "-np" ]; then NP="$2"; shift 2; fi
"$ROOT/scripts/build.sh" "$ROOT/build" >/dev/null
exec "$ROOT/build/launcher/horarun" -np "$NP" "$ROOT/build/examples/train_linear"
