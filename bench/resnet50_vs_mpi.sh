#!/usr/bin/env bash
# resnet50_vs_mpi.sh: the ResNet-50 gradient step (bench/resnet50_grad_shapes.txt,
# 161 tensors, 102 MB) through hora and through Open MPI on one host, in one run
# (issue 20's target: hora's step <= 0.9x Open MPI's per-tensor time).
#
#   bench/resnet50_vs_mpi.sh [-reps N] [-np "2 4"] [-steps N]
#
# For each repetition and world size, in this order: hora-bench's fused section
# (bench/run_bench.sh --sections fused: hora grouped = one grouped allreduce of
# all 161, hora individual = 161 hora_allreduce_async then wait all), then
# mpi-allreduce-bench --shapes (MPI per tensor = 161 blocking MPI_Allreduce in
# backward order, MPI flat = one MPI_Allreduce of a buffer holding them all),
# each in fresh processes. Every step's data differs and every element is
# checked by the binaries. Prints every raw line, then per world size the
# median over repetitions of each mean step time (max over ranks) and the
# ratios to MPI per tensor and MPI flat.
#
# Environment: BUILD_DIR (default build); HORA_* pass through to hora's ranks.
# Exit status: 0 ok, 1 a wrong element, 2 a run failed.
set -u
REPS=3
NPS="2"
STEPS=10
while [ $# -gt 0 ]; do
  case "$1" in
    -reps) REPS=$2; shift 2 ;;
    -np) NPS=$2; shift 2 ;;
    -steps) STEPS=$2; shift 2 ;;
    *) echo "usage: $0 [-reps N] [-np LIST] [-steps N]" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build}"
HB="$BUILD_DIR/bench/hora-bench"
MPIB="$BUILD_DIR/bench/mpi-allreduce-bench"
SHAPES="$REPO/bench/resnet50_grad_shapes.txt"
[ -x "$HB" ] || { echo "no $HB (ninja -C $BUILD_DIR hora-bench)" >&2; exit 2; }
[ -x "$MPIB" ] || { echo "no $MPIB (needs Open MPI: scripts/install_deps.sh --mpi)" >&2; exit 2; }
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)

LOG=$(mktemp "${TMPDIR:-/tmp}/resnet50_vs_mpi.XXXXXX")
STATUS=0
echo "# resnet50_vs_mpi: reps $REPS, np $NPS, steps $STEPS; $(uptime)"
for ((rep = 1; rep <= REPS; rep++)); do
  for np in $NPS; do
    out=$(HORA_BENCH="$HB" BENCH_TIMEOUT=900 "$REPO/bench/run_bench.sh" -np "$np" --sections fused \
      --steps "$STEPS" 2>/dev/null | grep '^RESULT section=fused')
    [ -z "$out" ] && { echo "resnet50_vs_mpi: hora-bench printed no result (np $np)" >&2; STATUS=2; }
    echo "RAW rep=$rep np=$np impl=hora $out" | tee -a "$LOG"
    # Open MPI polls while it waits; with more ranks than cores it must yield.
    extra=()
    [ "$np" -gt "$(nproc)" ] && extra=(--mca mpi_yield_when_idle 1)
    out=$(timeout 900 "${MPIRUN[@]}" "${extra[@]}" -np "$np" "$MPIB" --shapes "$SHAPES" \
      --steps "$STEPS" 2>/dev/null | grep '^RESULT section=fused')
    [ -z "$out" ] && { echo "resnet50_vs_mpi: mpi-allreduce-bench printed no result (np $np)" >&2; STATUS=2; }
    echo "RAW rep=$rep np=$np impl=mpi $out" | tee -a "$LOG"
  done
  echo "# after rep $rep: $(uptime)"
done
python3 - "$LOG" <<'PY'
import sys, statistics, collections
vals = collections.defaultdict(list); wrong = 0
for line in open(sys.argv[1]):
    if not line.startswith("RAW"): continue
    kv = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)
    np = int(kv["np"])
    for k in ("hora_grouped_ms", "hora_individual_ms", "mpi_pertensor_ms", "mpi_flat_ms"):
        if k in kv: vals[(np, k)].append(float(kv[k]))
    wrong += int(kv.get("wrong", 0)) + int(kv.get("mpi_wrong", 0))
print("\n| np | hora grouped (ms) | hora individual (ms) | MPI per tensor (ms) | MPI flat (ms) |"
      " grouped/MPI per tensor | individual/MPI per tensor | grouped/MPI flat |")
print("|---|---|---|---|---|---|---|---|")
for np in sorted({k[0] for k in vals}):
    m = {k: statistics.median(vals[(np, k)]) if vals[(np, k)] else float("nan")
         for k in ("hora_grouped_ms", "hora_individual_ms", "mpi_pertensor_ms", "mpi_flat_ms")}
    g, i, p, f = m["hora_grouped_ms"], m["hora_individual_ms"], m["mpi_pertensor_ms"], m["mpi_flat_ms"]
    print(f"| {np} | {g:.1f} | {i:.1f} | {p:.1f} | {f:.1f} | {g/p:.2f} | {i/p:.2f} | {g/f:.2f} |")
print(f"\n#wrong total: {wrong}")
sys.exit(1 if wrong else 0)
PY
rc=$?
rm -f "$LOG"
[ "$STATUS" -ne 0 ] && exit "$STATUS"
exit "$rc"
