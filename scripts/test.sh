#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test
# (unit, multi-rank as threads and processes, failure scenarios, the example
# job, a benchmark smoke run). GPU tests skip on machines without a GPU.
#
# Usage: scripts/test.sh                 normal build in build/
#        scripts/test.sh --sanitize address   ASan+UBSan build in build-asan/
#        scripts/test.sh --sanitize thread    TSan build in build-tsan/ (multi-rank tests)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SAN=""
if [ "${1:-}" = "--sanitize" ]; then SAN="$2"; fi

case "$SAN" in
  "")
    BUILD="$ROOT/build"
    # torch/numpy/pytest (tests/python), venv/pip/wheel (the wheel test), Open MPI and
    # Slurm (the mpirun and srun launcher tests)
    "$ROOT/scripts/install_deps.sh" --python --mpi --slurm
    "$ROOT/scripts/build.sh" "$BUILD" -DHORA_SANITIZE=
    cd "$BUILD"
    ctest --output-on-failure -j "$(nproc)" --timeout 300
    echo "== example jobs: PyTorch (2 ranks), C (4 ranks)"
    "$ROOT/scripts/run_example.sh" -np 2 | tail -n 4
    "$ROOT/scripts/run_example.sh" --c -np 4 | tail -n 4
    if [ -x "$BUILD/bench/hora-bench" ] && [ -x "$ROOT/bench/run_bench.sh" ]; then
      echo "== benchmark smoke run (checks results, timings not asserted)"
      HORA_BENCH="$BUILD/bench/hora-bench" "$ROOT/bench/run_bench.sh" -np 2 --quick | tail -n 20
    fi
    ;;
  address)
    BUILD="$ROOT/build-asan"
    "$ROOT/scripts/build.sh" "$BUILD" -DHORA_SANITIZE=address -DHORA_BUILD_BENCH=OFF
    cd "$BUILD"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      ctest --output-on-failure -j "$(nproc)" --timeout 600 -LE launcher
    # The launcher tests' probe ranks exit on purpose mid-job (killed peers,
    # failing ranks) without hora_shutdown: leaks at exit are expected there.
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      ctest --output-on-failure -j "$(nproc)" --timeout 600 -L launcher
    ;;
  thread)
    BUILD="$ROOT/build-tsan"
    "$ROOT/scripts/build.sh" "$BUILD" -DHORA_SANITIZE=thread -DHORA_BUILD_BENCH=OFF
    cd "$BUILD"
    # The multi-rank suites: ranks as threads share one process (what TSan
    # checks); the process-mode and killed/stalled-rank tests fork before any
    # thread starts, so they run instrumented too (about 15 s of the ~80 s).
    TSAN_OPTIONS="halt_on_error=1 suppressions=$ROOT/scripts/tsan.supp" \
      ctest --output-on-failure -j "$(nproc)" --timeout 900 -L multirank
    # abort() from another thread, exercised directly (TSan cannot see the
    # shared-memory protocol itself: peers map segments at other addresses).
    TSAN_OPTIONS="halt_on_error=1 suppressions=$ROOT/scripts/tsan.supp" \
      ctest --output-on-failure -j "$(nproc)" --timeout 900 -R "GlooBackendTest\.|ShmBackendTest\."
    ;;
  *)
    echo "unknown sanitizer '$SAN' (address or thread)" >&2
    exit 2
    ;;
esac
