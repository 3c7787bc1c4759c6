#!/usr/bin/env bash
# p2p_bench.sh: hora send/recv against Open MPI's MPI_Send/MPI_Recv, in one run.
#
#   bench/p2p_bench.sh [--rounds N] [--quick] [hora-p2p-bench/mpi-p2p-bench options...]
#
# Builds hora-p2p-bench and mpi-p2p-bench (Release, in BUILD_DIR), then runs
# them alternately on 2 local ranks, hora, MPI, hora, MPI, ... (--rounds N
# each, default 3), so that load from other processes on the machine hits
# both about equally, and prints per size the median over the rounds of the
# one-way latency (mean round trip / 2) and of the bandwidth (bytes / one-way
# time), with the ratios hora/MPI. Every round's own table is printed too.
# Options after the script's own go to both binaries (--quick, --sizes LIST).
#
# hora's ranks are started by run_bench.sh (HORA_RANK, HORA_SIZE,
# HORA_STORE_ADDR/PORT, a random HORA_SECRET); HORA_* variables pass through
# (e.g. HORA_P2P_SPIN_US, HORA_P2P_EAGER_BYTES, HORA_P2P_RING_BYTES). MPI's
# by mpirun -np 2 --oversubscribe --bind-to none --mca pml ob1 --mca btl
# self,<shared-memory btl> (vader, or sm on Open MPI 5), plus
# --allow-run-as-root as root.
#
# Environment:
#   BUILD_DIR      build directory (default: <repo>/build-bench; configured when missing)
#   MPIRUN_ARGS    extra mpirun arguments (e.g. "--bind-to core" to let MPI pin its ranks)
#   P2P_LOG_DIR    where each round's output goes (default: a fresh mktemp directory)
# Exit status: 0 ok, 1 a wrong byte somewhere, 2 a build or run failed.
set -u

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }

ROUNDS=3
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="${2:?--rounds needs a number}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
case "$ROUNDS" in ''|*[!0-9]*|0) echo "p2p_bench.sh: --rounds must be a positive integer" >&2; exit 2 ;; esac

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"

command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1 ||
  { echo "p2p_bench.sh: mpirun/mpicc not found (scripts/install_deps.sh --mpi)" >&2; exit 2; }
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  echo "p2p_bench.sh: configuring $BUILD_DIR (Release)" >&2
  cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null ||
    { echo "p2p_bench.sh: configure failed" >&2; exit 2; }
fi
if ! ninja -C "$BUILD_DIR" -t targets all 2>/dev/null | grep -q '^mpi-p2p-bench:'; then
  # MPI was installed after the first configure: look again.
  cmake "$BUILD_DIR" >/dev/null
  ninja -C "$BUILD_DIR" -t targets all 2>/dev/null | grep -q '^mpi-p2p-bench:' ||
    { echo "p2p_bench.sh: CMake found no MPI (C); mpi-p2p-bench cannot be built" >&2; exit 2; }
fi
echo "p2p_bench.sh: building hora-p2p-bench and mpi-p2p-bench in $BUILD_DIR" >&2
ninja -C "$BUILD_DIR" hora-p2p-bench mpi-p2p-bench >&2 || { echo "p2p_bench.sh: build failed" >&2; exit 2; }
HORA_BIN="$BUILD_DIR/bench/hora-p2p-bench"
MPI_BIN="$BUILD_DIR/bench/mpi-p2p-bench"

# Open MPI's shared-memory transport: vader up to 4.x, sm from 5.0.
SHM_BTL=vader
if command -v ompi_info >/dev/null 2>&1 && ! ompi_info 2>/dev/null | grep -q 'MCA btl: vader'; then
  ompi_info 2>/dev/null | grep -q 'MCA btl: sm' && SHM_BTL=sm
fi
MPIRUN=(mpirun -np 2 --oversubscribe --bind-to none --mca pml ob1 --mca btl "self,$SHM_BTL")
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
# shellcheck disable=SC2206
[ -n "${MPIRUN_ARGS:-}" ] && MPIRUN+=($MPIRUN_ARGS)

LOG_DIR="${P2P_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/hora-p2p-bench.XXXXXX")}"
mkdir -p "$LOG_DIR"
echo "p2p_bench.sh: $ROUNDS rounds of hora and MPI, logs in $LOG_DIR" >&2
echo "p2p_bench.sh: mpirun: ${MPIRUN[*]}" >&2

STATUS=0
for ((round = 1; round <= ROUNDS; round++)); do
  echo "## round $round: hora"
  HORA_BENCH="$HORA_BIN" BENCH_TIMEOUT="${BENCH_TIMEOUT:-600}" BENCH_LOG_DIR="$LOG_DIR/hora-$round" \
    "$BENCH_DIR/run_bench.sh" -np 2 "${ARGS[@]+"${ARGS[@]}"}" >/dev/null 2>"$LOG_DIR/hora-$round.err"
  rc=$?
  # Rank 0's own log, not run_bench.sh's copy of it on stdout.
  cp "$LOG_DIR/hora-$round/rank0.out" "$LOG_DIR/hora-$round.out" 2>/dev/null
  cat "$LOG_DIR/hora-$round.out" 2>/dev/null
  if [ "$rc" -eq 0 ] && ! grep -q '^RESULT ' "$LOG_DIR/hora-$round.out" 2>/dev/null; then
    echo "p2p_bench.sh: hora round $round printed no results" >&2
    rc=2
  fi
  if [ "$rc" -ne 0 ]; then
    echo "p2p_bench.sh: hora round $round exited with $rc ($LOG_DIR/hora-$round.err):" >&2
    tail -n 20 "$LOG_DIR/hora-$round.err" >&2
    [ "$rc" -eq 1 ] && STATUS=1 || exit 2
  fi
  echo "## round $round: MPI"
  timeout --kill-after=10 "${BENCH_TIMEOUT:-600}" "${MPIRUN[@]}" "$MPI_BIN" "${ARGS[@]+"${ARGS[@]}"}" \
    2>"$LOG_DIR/mpi-$round.err" | tee "$LOG_DIR/mpi-$round.out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ] && ! grep -q '^RESULT ' "$LOG_DIR/mpi-$round.out"; then
    echo "p2p_bench.sh: MPI round $round printed no results" >&2
    rc=2
  fi
  if [ "$rc" -ne 0 ]; then
    echo "p2p_bench.sh: MPI round $round exited with $rc ($LOG_DIR/mpi-$round.err):" >&2
    tail -n 20 "$LOG_DIR/mpi-$round.err" >&2
    [ "$rc" -eq 1 ] && STATUS=1 || exit 2
  fi
done

# Medians over the rounds, per implementation and size.
cat "$LOG_DIR"/hora-*.out "$LOG_DIR"/mpi-*.out | grep '^RESULT ' | awk -v rounds="$ROUNDS" '
function val(key,   i, kv) {
  for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == key) return kv[2] }
  return ""
}
function median(list,   a, n, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
  impl = val("impl"); b = val("bytes") + 0
  lat[impl, b] = lat[impl, b] " " val("oneway_us")
  med[impl, b] = med[impl, b] " " val("median_us")
  bw[impl, b] = bw[impl, b] " " val("gbps")
  wrong += val("wrong")
  if (!(b in seen)) { seen[b] = 1; sizes[++ns] = b }
}
function human(b) {
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
  return b " B"
}
END {
  for (i = 2; i <= ns; i++) for (j = i; j > 1 && sizes[j-1] > sizes[j]; j--) { t = sizes[j]; sizes[j] = sizes[j-1]; sizes[j-1] = t }
  printf "\n## Medians over %d rounds (one-way latency = mean round trip / 2; GB/s = bytes / one-way time)\n\n", rounds
  printf "| size | hora us | MPI us | hora/MPI latency | hora GB/s | MPI GB/s | hora/MPI bandwidth | hora median-RTT/2 us | MPI median-RTT/2 us |\n"
  printf "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
  for (i = 1; i <= ns; i++) {
    b = sizes[i]
    hl = median(lat["hora", b]); ml = median(lat["mpi", b])
    hb = median(bw["hora", b]); mb = median(bw["mpi", b])
    printf "| %s | %.2f | %.2f | %.2fx | %.3f | %.3f | %.2fx | %.2f | %.2f |\n", human(b), hl, ml, (ml > 0 ? hl / ml : 0), hb, mb, (mb > 0 ? hb / mb : 0), median(med["hora", b]), median(med["mpi", b])
    if (b == 4) t4 = sprintf("TARGET 4-byte latency hora/MPI %.2fx (target <= 2x): %s", (ml > 0 ? hl / ml : 0), (hl <= 2 * ml ? "met" : "NOT met"))
    if (b == 16777216) t16 = sprintf("TARGET 16 MiB bandwidth hora/MPI %.2fx (target >= 0.9x): %s", (mb > 0 ? hb / mb : 0), (hb >= 0.9 * mb ? "met" : "NOT met"))
  }
  printf "\n"
  if (t4 != "") print t4
  if (t16 != "") print t16
  printf "wrong bytes in all rounds: %d\n", wrong
}'
exit "$STATUS"
