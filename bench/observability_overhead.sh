#!/usr/bin/env bash
# What observability costs (issue 16): builds hora-obs-bench (Release, in
# build-bench like run_bench.sh) and runs it on N local ranks through
# run_bench.sh. One run compares, in the same processes, runtimes with
# telemetry off, on (the default) and on with a timeline; see
# bench/observability_bench.cc. Arguments after -np N go to hora-obs-bench
# (--rounds N --steps N --lat-iters N --timeline FILE).
#   bench/observability_overhead.sh -np 2
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  echo "observability_overhead.sh: configuring $BUILD_DIR (Release)" >&2
  cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
echo "observability_overhead.sh: building hora-obs-bench" >&2
ninja -C "$BUILD_DIR" hora-obs-bench >&2
HORA_BENCH="$BUILD_DIR/bench/hora-obs-bench" exec "$REPO/bench/run_bench.sh" "$@"
