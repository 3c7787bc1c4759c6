#!/usr/bin/env bash
# shm_negotiation_bench.sh: allreduce latency of hora before / after a change
# and of Open MPI, interleaved in one run (issue 20).
#
#   bench/shm_negotiation_bench.sh [-reps N] [-np "2 4"] [-sizes "4 65536 1048576 16777216"]
#                                  [-variants "NAME[:VAR=V,VAR=V] ..."] [-hogs N] [-stat mean]
#                                  [-bind core]
#
# -variants runs this tree's library once per variant instead of
# before/after, each with its own HORA_* settings, interleaved the same way,
# e.g. -variants "spin100 spin0:HORA_SPIN_US=0 tcp:HORA_SHM_NEGOTIATION=0".
#
# For each repetition, world size and size, in this order: hora "before"
# (hora-negotiation-probe with LD_LIBRARY_PATH=$BEFORE_LIB, e.g. a copy of
# main's build/bindings/c), hora "after" (this tree's libhora), and
# MPI_Allreduce (mpi-allreduce-bench through mpirun --oversubscribe), each in
# fresh processes. Prints every raw line, then per (np, size) the median over
# repetitions of: hora's per-iteration median (max over ranks) before and
# after, Open MPI's median (max over ranks), and the ratios after/MPI and
# after/before.
#
# -hogs N keeps N busy-loop processes running for the whole run (what data
# loader workers or a second job do to the training cores): hora's waits
# must not hand those processes a time slice per hand-off. -stat mean
# reports each launch's mean per iteration instead of its median (the tail
# that such neighbours add shows there).
#
# -bind core binds each rank to a CPU of its own, as a launcher does
# (mpirun --bind-to core, srun --cpu-bind=cores): hora's rank r through
# taskset to the r-th CPU of this shell's mask (modulo their count), Open
# MPI with --bind-to core (overload allowed: more ranks than CPUs). Without it hora's ranks keep the shell's mask and
# Open MPI its default (--bind-to core up to 2 ranks; none when the ranks
# outnumber the CPUs, --oversubscribe).
#
# Environment: BUILD_DIR (default build), BEFORE_LIB (required for the
# "before" column; empty skips it), HORA_* pass through to hora's ranks.
set -u
REPS=3
VARIANTS=""
NPS="2 4"
SIZES="4 65536 1048576 16777216"
HOGS=0
STAT=median
BIND=none
while [ $# -gt 0 ]; do
  case "$1" in
    -reps) REPS=$2; shift 2 ;;
    -np) NPS=$2; shift 2 ;;
    -sizes) SIZES=$2; shift 2 ;;
    -variants) VARIANTS=$2; shift 2 ;;
    -hogs) HOGS=$2; shift 2 ;;
    -stat) STAT=$2; shift 2 ;;
    -bind) BIND=$2; shift 2 ;;
    *) echo "usage: $0 [-reps N] [-np LIST] [-sizes LIST] [-variants LIST] [-hogs N] [-stat median|mean] [-bind core]" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build}"
PROBE="$BUILD_DIR/bench/hora-negotiation-probe"
MPIB="$BUILD_DIR/bench/mpi-allreduce-bench"
BEFORE_LIB="${BEFORE_LIB:-}"
[ -x "$PROBE" ] || { echo "no $PROBE (ninja -C $BUILD_DIR hora-negotiation-probe)" >&2; exit 2; }
[ -x "$MPIB" ] || { echo "no $MPIB (needs Open MPI: scripts/install_deps.sh --mpi)" >&2; exit 2; }
case "$STAT" in
  median) HORA_KEY=median_us MPI_KEY=mpi_med_us ;;
  mean) HORA_KEY=total_us MPI_KEY=mpi_us ;;
  *) echo "-stat: median or mean, not '$STAT'" >&2; exit 2 ;;
esac
case "$BIND" in
  none) MPI_BIND=() ;;
  core) MPI_BIND=(--bind-to core:overload-allowed) ;;
  *) echo "-bind: core, not '$BIND'" >&2; exit 2 ;;
esac
# The CPUs this shell may use, for -bind core.
read -r -a CPUS <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
HOG_PIDS=()
stop_hogs() { [ ${#HOG_PIDS[@]} -gt 0 ] && kill "${HOG_PIDS[@]}" 2>/dev/null; HOG_PIDS=(); }
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for ((h = 0; h < HOGS; h++)); do
  bash -c 'exec -a hora-bench-hog bash -c "while :; do :; done"' &
  HOG_PIDS+=($!)
done

iters_for() {  # as hora-bench: clamp(256 MiB / size, 10, 200), 2000 for tiny sizes
  local s=$1
  if [ "$s" -le 64 ]; then echo 2000; return; fi
  local i=$(( (256 << 20) / s )); [ $i -lt 10 ] && i=10; [ $i -gt 200 ] && i=200; echo $i
}

hora_run() {  # np bytes iters libdir -> "max median over ranks"
  local np=$1 bytes=$2 iters=$3 lib=$4 port out pids=() r
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  out=$(mktemp -d)
  for ((r = 0; r < np; r++)); do
    local pin=()
    [ "$BIND" = core ] && pin=(taskset -c "${CPUS[$((r % ${#CPUS[@]}))]}")
    HORA_RANK=$r HORA_SIZE=$np HORA_STORE_ADDR=127.0.0.1 HORA_STORE_PORT=$port \
      HORA_SECRET=bench LD_LIBRARY_PATH="${lib:-${LD_LIBRARY_PATH:-}}" "${pin[@]}" timeout 300 "$PROBE" --bytes "$bytes" \
      --iters "$iters" --warmup $((iters / 10 + 1)) --no-hops >"$out/$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  grep -h PROBE "$out"/* | sed "s/.* $HORA_KEY=\([0-9.]*\).*wrong=\([0-9]*\).*/\1 \2/" |
    awk '{ if ($1 > m) m = $1; w += $2 } END { printf "%s %d\n", m, w }'
  cat "$out"/* >&2
  rm -rf "$out"
}

mpi_run() {  # np bytes iters -> median
  timeout 300 mpirun --allow-run-as-root --oversubscribe "${MPI_BIND[@]}" -np "$1" "$MPIB" --sizes "$2" \
    --iters "$3" 2>/dev/null | grep RESULT | sed "s/.* $MPI_KEY=\([0-9.]*\).*mpi_wrong=\([0-9]*\).*/\1 \2/"
}

echo "# shm_negotiation_bench: reps $REPS, np $NPS, sizes $SIZES, $HOGS busy-loop processes, per-launch $STAT, bind $BIND; $(uptime)"
for ((rep = 1; rep <= REPS; rep++)); do
  for np in $NPS; do
    for s in $SIZES; do
      it=$(iters_for "$s")
      if [ -n "$VARIANTS" ]; then
        for v in $VARIANTS; do
          name=${v%%:*} assigns=""
          [ "$name" != "$v" ] && assigns=${v#*:}
          echo "RAW rep=$rep np=$np bytes=$s impl=$name $(
            [ -n "$assigns" ] && export ${assigns//,/ }
            hora_run "$np" "$s" "$it" "" 2>/dev/null
          )"
        done
      else
        if [ -n "$BEFORE_LIB" ]; then echo "RAW rep=$rep np=$np bytes=$s impl=before $(hora_run "$np" "$s" "$it" "$BEFORE_LIB" 2>/dev/null)"; fi
        echo "RAW rep=$rep np=$np bytes=$s impl=after $(hora_run "$np" "$s" "$it" "" 2>/dev/null)"
      fi
      echo "RAW rep=$rep np=$np bytes=$s impl=mpi $(mpi_run "$np" "$s" "$it")"
    done
  done
  echo "# after rep $rep: $(uptime)"
done | tee /tmp/shm_negotiation_bench.$$.log
python3 - /tmp/shm_negotiation_bench.$$.log <<'PY'
import sys, statistics, collections
d = collections.defaultdict(list); wrong = 0
for line in open(sys.argv[1]):
    if not line.startswith("RAW"): continue
    f = dict(kv.split("=") for kv in line.split()[1:5])
    v = line.split()[5:]
    if len(v) >= 1:
        d[(int(f["np"]), int(f["bytes"]), f["impl"])].append(float(v[0]))
        wrong += int(v[1]) if len(v) > 1 else 0
impls = []
for k in d:
    if k[2] != "mpi" and k[2] not in impls: impls.append(k[2])
print("\n| np | bytes | " + " | ".join(f"hora {i} (us)" for i in impls) + " | Open MPI (us) | " +
      " | ".join(f"{i}/MPI" for i in impls) + " |")
print("|---|---|" + "---|" * (2 * len(impls) + 1))
for (np, b) in sorted({(k[0], k[1]) for k in d}):
    med = {i: statistics.median(d[(np, b, i)]) if d[(np, b, i)] else float("nan") for i in impls + ["mpi"]}
    print(f"| {np} | {b} | " + " | ".join(f"{med[i]:.1f}" for i in impls) + f" | {med['mpi']:.1f} | " +
          " | ".join(f"{med[i]/med['mpi']:.2f}" for i in impls) + " |")
print(f"\n#wrong total: {wrong}")
PY
rm -f /tmp/shm_negotiation_bench.$$.log
