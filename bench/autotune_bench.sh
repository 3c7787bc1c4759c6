#!/usr/bin/env bash
# Online autotune from a bad start against the best of a hand grid (issue 20):
# builds hora-autotune-bench (Release, in build-bench like run_bench.sh) and
# runs it on N local ranks through run_bench.sh; see bench/autotune_bench.cc.
# Arguments after -np N go to hora-autotune-bench (--rounds N --steps N
# --ref-steps N --grid-steps N --compute-ms MS --bad-fusion BYTES
# --bad-cycle-ms MS --log FILE).
#   bench/autotune_bench.sh -np 2
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  echo "autotune_bench.sh: configuring $BUILD_DIR (Release)" >&2
  cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
echo "autotune_bench.sh: building hora-autotune-bench" >&2
ninja -C "$BUILD_DIR" hora-autotune-bench >&2
HORA_BENCH="$BUILD_DIR/bench/hora-autotune-bench" exec "$REPO/bench/run_bench.sh" "$@"
