#!/usr/bin/env bash
# The main job: NP ranks on this machine (CPU) train a small CNN with PyTorch
# and hora.torch's DistributedOptimizer (gradients averaged through hora as
# backward produces them); every rank prints its loss, rank 0 checks that all
# ranks end with the same weights. Installs what is missing (Debian packages,
# python3-torch included) and builds first.
#
# Usage: scripts/run_example.sh [-np N] [--c]   (default N=2)
#   --c   the pure-C job instead: a linear model trained by SGD through the
#         C ABI (no Python needed; default N=4 then)
#
# The job is started by horarun (launcher/): it sets the HORA_* environment
# contract (README), hosts the rendezvous store, prefixes output with the
# rank, and stops the whole job as soon as one rank fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NP=""
MODE=torch
while [ $# -gt 0 ]; do
  case "$1" in
    -np) NP="$2"; shift 2 ;;
    --c) MODE=c; shift ;;
    *) echo "usage: scripts/run_example.sh [-np N] [--c]" >&2; exit 2 ;;
  esac
done
if [ "$MODE" = c ]; then
  "$ROOT/scripts/build.sh" "$ROOT/build" >/dev/null
  exec "$ROOT/build/launcher/horarun" -np "${NP:-4}" "$ROOT/build/examples/train_linear"
fi
"$ROOT/scripts/install_deps.sh" --python
"$ROOT/scripts/build.sh" "$ROOT/build" >/dev/null
export PYTHONPATH="$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export HORA_LIBRARY="$ROOT/build/bindings/c/libhora.so"
exec "$ROOT/build/launcher/horarun" -np "${NP:-2}" /usr/bin/python3 "$ROOT/examples/pytorch_mnist_like.py"
