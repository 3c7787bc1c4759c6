#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/reliability.md) for a while
# each: configures build-fuzz/ with clang, ASan+UBSan and -DHORA_FUZZ=ON,
# seeds each corpus with the encoders' output, keeps what libFuzzer finds.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
#   e.g. scripts/fuzz.sh 3600          an hour each
#        scripts/fuzz.sh 600 message   one target
# Corpora grow in build-fuzz/corpus/<target>/; crashes land in build-fuzz/crash-*
# (replay one with: build-fuzz/tests/fuzz/hora_fuzz_<target> build-fuzz/crash-...).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-60}"
shift || true
BUILD="$ROOT/build-fuzz"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DHORA_SANITIZE=address -DHORA_FUZZ=ON \
  -DHORA_BUILD_BENCH=OFF -DHORA_BUILD_EXAMPLES=OFF -DHORA_BUILD_LAUNCHER=OFF >/dev/null
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  for f in "$ROOT"/tests/fuzz/fuzz_*.cc; do
    n="$(basename "$f" .cc)"
    TARGETS+=("${n#fuzz_}")
  done
fi
for t in "${TARGETS[@]}"; do
  cmake --build "$BUILD" -j "$(nproc)" --target "hora_fuzz_$t" "hora_libfuzzer_$t" >/dev/null
  mkdir -p "$BUILD/corpus/$t"
  "$BUILD/tests/fuzz/hora_fuzz_$t" --write-seeds "$BUILD/corpus/$t" >/dev/null
  echo "== $t: ${SECONDS_EACH} s"
  (cd "$BUILD" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$BUILD/tests/fuzz/hora_libfuzzer_$t" "$BUILD/corpus/$t" -max_total_time="$SECONDS_EACH" \
    -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 2>&1 | tail -n 12)
done
