#!/usr/bin/env bash
# collectives_bench.sh: reducescatter, alltoall and barrier on one host: hora
# through shared memory (HORA_SHM=1), hora through Gloo (HORA_SHM=0) and Open
# MPI (MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Barrier), in one run.
#
#   bench/collectives_bench.sh [--rounds N] [--np "2 4"] [--second gloo|noinline]
#                              [hora-coll-bench options...]
#
# Builds hora-coll-bench and mpi-coll-bench in BUILD_DIR (default
# <repo>/build-bench, Release), then for each world size runs shm, Gloo, MPI,
# shm, Gloo, MPI, ... (--rounds N each, default 3) so that load from other
# processes hits all three alike, and prints per op and size the median over
# the rounds of each one's median time, with the ratios shm/MPI and shm/Gloo.
# --second noinline replaces the Gloo run by shared memory with
# HORA_INLINE_MAX_BYTES=0 (no collective inside the negotiation).
# Options after the script's own (--ops LIST, --sizes LIST, --iters N) go to
# both binaries. Every element of every result is checked by the binaries.
# Exit status: 0 ok, 1 a wrong element somewhere, 2 a build or run failed.
set -u
ROUNDS=3
NPS="2 4"
SECOND=gloo
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="${2:?--rounds needs a number}"; shift 2 ;;
    --np) NPS="${2:?--np needs a list}"; shift 2 ;;
    --second) SECOND="${2:?--second needs gloo or noinline}"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
case $SECOND in gloo|noinline) ;; *) echo "collectives_bench.sh: --second is gloo or noinline, not '$SECOND'" >&2; exit 2 ;; esac
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"
command -v mpirun >/dev/null 2>&1 || { echo "collectives_bench.sh: no mpirun (scripts/install_deps.sh --mpi)" >&2; exit 2; }
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 2
fi
ninja -C "$BUILD_DIR" hora-coll-bench mpi-coll-bench >&2 || { echo "collectives_bench.sh: build failed" >&2; exit 2; }
SHM_BTL=vader
if command -v ompi_info >/dev/null 2>&1 && ! ompi_info 2>/dev/null | grep -q 'MCA btl: vader'; then
  ompi_info 2>/dev/null | grep -q 'MCA btl: sm' && SHM_BTL=sm
fi
LOG_DIR="${COLL_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/hora-coll-bench.XXXXXX")}"
mkdir -p "$LOG_DIR" || exit 2
echo "collectives_bench.sh: logs in $LOG_DIR; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
STATUS=0
run() {  # name np command...
  local name=$1 np=$2; shift 2
  timeout --kill-after=10 "${BENCH_TIMEOUT:-900}" "$@" >"$LOG_DIR/$name.out" 2>"$LOG_DIR/$name.err"
  local rc=$?
  if [ $rc -ne 0 ] || ! grep -q '^RESULT ' "$LOG_DIR/$name.out"; then
    echo "collectives_bench.sh: $name exited with $rc:" >&2; tail -n 5 "$LOG_DIR/$name.err" >&2
    [ $rc -eq 1 ] && STATUS=1 || exit 2
  fi
}
for np in $NPS; do
  MPIRUN=(mpirun -np "$np" --oversubscribe --bind-to none --mca pml ob1 --mca btl "self,$SHM_BTL")
  [ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
  for ((round = 1; round <= ROUNDS; round++)); do
    for plane in shm "$SECOND"; do
      shmv=1 inl=${HORA_INLINE_MAX_BYTES:--1}
      [ "$plane" = gloo ] && shmv=0
      [ "$plane" = noinline ] && inl=0
      echo "## np $np round $round: hora $plane" >&2
      BENCH_PLANE=$plane HORA_INLINE_MAX_BYTES=$inl HORA_SHM=$shmv run "hora-$plane-np$np-$round" "$np" env HORA_BENCH="$BUILD_DIR/bench/hora-coll-bench" \
        BENCH_LOG_DIR="$LOG_DIR/hora-$plane-np$np-$round.d" "$BENCH_DIR/run_bench.sh" -np "$np" "${ARGS[@]+"${ARGS[@]}"}"
    done
    echo "## np $np round $round: MPI" >&2
    run "mpi-np$np-$round" "$np" "${MPIRUN[@]}" "$BUILD_DIR/bench/mpi-coll-bench" "${ARGS[@]+"${ARGS[@]}"}"
  done
done
cat "$LOG_DIR"/*.out | grep '^RESULT ' | sort -u | awk -v rounds="$ROUNDS" -v second="$SECOND" '
function val(key,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == key) return kv[2] } return "" }
function median(list,   a, n, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
  k = val("op") SUBSEP val("np") SUBSEP val("bytes")
  t[k, val("plane")] = t[k, val("plane")] " " val("med_us")
  wrong += val("wrong")
  if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
}
END {
  for (i = 1; i <= nk; i++) {
    split(keys[i], p, SUBSEP)
    s = median(t[keys[i], "shm"]); g = median(t[keys[i], second]); m = median(t[keys[i], "mpi"])
    printf "| %s | %s | %s | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n", p[1], p[2], p[3], s, g, m, (m > 0 ? s / m : 0), (g > 0 ? s / g : 0)
  }
  printf "WRONG %d\n", wrong
}' > "$LOG_DIR/table.txt"
printf "\n## Median over %d rounds of each run's median time (us)\n\n" "$ROUNDS"
printf "| op | np | bytes | hora shm | hora %s | Open MPI | shm/MPI | shm/%s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n" "$SECOND" "$SECOND"
grep '^|' "$LOG_DIR/table.txt" | sort -t'|' -k2,2 -k3,3n -k4,4n
printf "\nwrong elements in all runs: %s\n" "$(sed -n 's/^WRONG //p' "$LOG_DIR/table.txt")"
exit $STATUS
