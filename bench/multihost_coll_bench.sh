#!/usr/bin/env bash
# multihost_coll_bench.sh: reducescatter, allgather, broadcast, barrier and
# alltoall (and allreduce, if --ops names it) across emulated hosts: hora on its tcp ring, hora on Gloo and Open
# MPI, in the same run, over the same network namespaces.
#
#   bench/multihost_coll_bench.sh [--rate 1gbit] [--hosts 2] [--per-host 1] [--rounds 1]
#                                 [--ops LIST] [--sizes LIST] [--iters N] [--md FILE]
#                                 [--modes "ring gloo noinline nooverlap flatring nodrive"]
#                                 [--variant NAME:VAR=VAL[,VAR=VAL...]]...
#
# Builds a test bed with bench/netns_bed.sh (HOSTS network + UTS namespaces,
# links shaped with tbf at RATE), then per round, in an order rotated each
# round (so use as many rounds as runs per round, or a multiple):
#   ring: hora-coll-bench through horarun with the defaults (across hosts
#         every collective on hora's tcp ring, alltoall over its mesh; with
#         several ranks per host the hierarchy's rest on that ring, and its
#         allgather and reducescatter hierarchical from 1 MiB:
#         HORA_HIER_COLLECTIVE_MIN_BYTES);
#   gloo: the same with HORA_HIER_CROSS=gloo (every collective on Gloo, or
#         with the hierarchy its cross stage and rest);
#   noinline (only if in --modes): the default with HORA_INLINE_MAX_BYTES=0
#         (no collective travels inside the negotiation);
#   nooverlap (only if in --modes): the default with HORA_HIER_OVERLAP=0
#         (hierarchical allgather and reducescatter in one piece, their
#         stages one after the other);
#   nodrive (only if in --modes): the default with HORA_CALLER_DRIVES=0
#         (the control thread alone reads and sends the negotiation);
#   flatring (only if in --modes): the default with
#         HORA_HIER_COLLECTIVE_MIN_BYTES at its maximum (with the hierarchy,
#         allgather and reducescatter on the ring over all ranks);
#   NAME (each --variant): the default with the variables given (e.g.
#         --variant spin0:HORA_SPIN_US=0), a column of its own;
#   mpi:  mpi-coll-bench through mpirun, TCP BTL over the bed's subnet.
# Float32; every result element is checked by both binaries (a wrong element
# fails the run). Prints per op and size the median over rounds of each
# one's median time (max over ranks) and the time ratios MODE/ring and
# mpi/ring (>1: the ring is faster). --md FILE also writes the table as
# markdown. Barrier never reaches a data plane (the negotiation is the
# barrier), so its ring and gloo rows time the same path. The run fails if a
# "ring" run's data plane is not on the tcp ring (e.g. an exported
# HORA_GLOO_ALGORITHM kept Gloo); a run that exits non-zero is left out of
# the table. Defaults: ops reducescatter,allgather,broadcast,barrier,alltoall,
# sizes 64,4K,64K,1M,16M (the whole buffer of the collective, as
# hora-coll-bench defines it).
#
# Environment: BUILD_DIR (default <repo>/build-bench), BENCH_LOG_DIR, HORA_*
# (passed to every hora rank), MPIRUN_ARGS. Needs root, iproute2,
# util-linux, Open MPI (scripts/install_deps.sh --mpi).
set -u

RATE=1gbit HOSTS=2 PER_HOST=1 ROUNDS=1 MD= ITERS= MODES="ring gloo"
declare -A VARIANTS=()
VARIANT_NAMES=
OPS=reducescatter,allgather,broadcast,barrier,alltoall
SIZES=64,4K,64K,1M,16M
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=${2:?}; shift 2 ;;
    --hosts) HOSTS=${2:?}; shift 2 ;;
    --per-host) PER_HOST=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --ops) OPS=${2:?}; shift 2 ;;
    --sizes) SIZES=${2:?}; shift 2 ;;
    --iters) ITERS=${2:?}; shift 2 ;;
    --md) MD=${2:?}; shift 2 ;;
    --modes) MODES=${2:?}; shift 2 ;;
    --variant)
      v=${2:?}; vname=${v%%:*}; vvars=${v#*:}
      case $vname in ''|*[!a-z0-9_]*) echo "multihost_coll_bench.sh: --variant NAME must be [a-z0-9_]+: $v" >&2; exit 2 ;; esac
      [ "$vvars" != "$v" ] || { echo "multihost_coll_bench.sh: --variant needs NAME:VAR=VAL: $v" >&2; exit 2; }
      VARIANTS[$vname]=$vvars; VARIANT_NAMES+=" $vname"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "multihost_coll_bench.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "multihost_coll_bench.sh: $*" >&2; exit 2; }
for m in $MODES; do case $m in ring|gloo|flatring|noinline|nooverlap|nodrive) ;; *) die "--modes: '$m' is not ring, gloo, flatring, noinline, nooverlap or nodrive" ;; esac; done
for v in $VARIANT_NAMES; do case " $MODES mpi " in *" $v "*) die "--variant $v: the name of a mode" ;; esac; done
MODES="$MODES$VARIANT_NAMES"
case " $MODES " in *" ring "*) ;; *) die "--modes must hold ring (the ratios' base)" ;; esac
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
command -v mpirun >/dev/null || die "no mpirun (scripts/install_deps.sh --mpi)"

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || die "configure failed"
fi
ninja -C "$BUILD_DIR" horarun hora-coll-bench mpi-coll-bench >&2 || die "build failed"
HORARUN=$BUILD_DIR/launcher/horarun HORA_BENCH=$BUILD_DIR/bench/hora-coll-bench
MPI_BENCH=$BUILD_DIR/bench/mpi-coll-bench

LOG_DIR="${BENCH_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/multihost-coll.XXXXXX")}"
mkdir -p "$LOG_DIR"
# Old rounds in the directory would mix into the medians.
[ -z "$(ls -A "$LOG_DIR")" ] || die "BENCH_LOG_DIR $LOG_DIR is not empty"
# shellcheck source=bench/multihost_common.sh
source "$BENCH_DIR/multihost_common.sh"
bed_start mc

ARGS=(--ops "$OPS" --sizes "$SIZES")
[ -n "$ITERS" ] && ARGS+=(--iters "$ITERS")

echo "# multihost_coll_bench: $HOSTS hosts x $PER_HOST ranks ($HOSTLIST), links $RATE (tbf), $ROUNDS round(s), logs in $LOG_DIR"
echo "# machine: $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)), $(uname -r); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
echo "# hora: horarun -np $NP -H $HOSTLIST --ssh-command '$RSH {host}' hora-coll-bench ${ARGS[*]}"
echo "# mpi:  mpirun ${MPI_ARGS[*]} mpi-coll-bench ${ARGS[*]}"

STATUS=0
run_hora() (  # mode round (a subshell: a variant's variables stay in it)
  local extra=() kv
  [ -n "${VARIANTS[$1]:-}" ] && IFS=, read -r -a extra <<<"${VARIANTS[$1]}"
  for kv in "${extra[@]}"; do export "${kv?}"; done  # before the defaults below read them
  local cross=${HORA_HIER_CROSS:-tcp} min=${HORA_HIER_COLLECTIVE_MIN_BYTES:-1048576} inl=${HORA_INLINE_MAX_BYTES:--1}
  local ovl=${HORA_HIER_OVERLAP:-1} drv=${HORA_CALLER_DRIVES:-1}
  [ "$1" = gloo ] && cross=gloo
  [ "$1" = flatring ] && min=9223372036854775807
  [ "$1" = noinline ] && inl=0
  [ "$1" = nooverlap ] && ovl=0
  [ "$1" = nodrive ] && drv=0
  BENCH_PLANE=$1 HORA_HIER_CROSS=$cross HORA_HIER_COLLECTIVE_MIN_BYTES=$min HORA_INLINE_MAX_BYTES=$inl HORA_HIER_OVERLAP=$ovl HORA_CALLER_DRIVES=$drv \
    HORA_LOG_LEVEL=${HORA_LOG_LEVEL:-info} on0 "$HORARUN" \
    -np "$NP" -H "$HOSTLIST" --ssh-command "$RSH {host}" \
    "$HORA_BENCH" "${ARGS[@]}" >"$LOG_DIR/$1.$2.out" 2>"$LOG_DIR/$1.$2.err"
)
for ((round = 1; round <= ROUNDS; round++)); do
  order=$(round_order "$MODES mpi" "$round")
  for mode in $order; do
    if [ "$mode" = mpi ]; then
      on0 mpirun "${MPI_ARGS[@]}" "$MPI_BENCH" "${ARGS[@]}" >"$LOG_DIR/mpi.$round.out" 2>"$LOG_DIR/mpi.$round.err"
    else
      run_hora "$mode" "$round"
    fi
    rc=$?
    echo "# round $round: $mode (load $(cut -d' ' -f1 /proc/loadavg)) exit $rc"
    if [ $rc -ne 0 ]; then
      STATUS=1
      echo "$mode failed (exit $rc):" >&2
      tail -n 20 "$LOG_DIR/$mode.$round.err" >&2
      mv "$LOG_DIR/$mode.$round.out" "$LOG_DIR/$mode.$round.failed"  # not in the table
    fi
  done
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in $MODES; do
  plane=$(grep -h "data plane" "$LOG_DIR"/$mode.*.err 2>/dev/null | sed 's/.*INFO //' | sort | uniq -c | sed 's/^ *//')
  echo "# hora's data plane, $mode (ranks reporting it): ${plane:-no INFO line}"
done
if grep -h "data plane" "$LOG_DIR"/ring.*.err 2>/dev/null | grep -qv "tcp-ring+"; then
  echo "multihost_coll_bench.sh: a \"ring\" run's data plane is not on the tcp ring (see above)" >&2
  STATUS=1
fi

/usr/bin/env python3 - "$LOG_DIR" "$ROUNDS" "${MD:-}" "$MODES" <<'PY' || STATUS=1
import glob, re, statistics, sys
log, rounds, md = sys.argv[1], int(sys.argv[2]), sys.argv[3]
impls = sys.argv[4].split() + ["mpi"]
others = [m for m in impls if m != "ring"]
res, wrong = {}, 0  # (op, bytes) -> impl -> [med_us per round]
for mode in impls:
    for f in glob.glob(f"{log}/{mode}.*.out"):
        for line in open(f):
            # horarun prefixes each rank's lines ("[0]<stdout>: RESULT ...").
            if "RESULT " not in line:
                continue
            kv = dict(x.split("=", 1) for x in line.split("RESULT ", 1)[1].split())
            wrong += int(kv["wrong"])
            res.setdefault((kv["op"], int(kv["bytes"])), {}).setdefault(mode, []).append(float(kv["med_us"]))
def med(v):
    return statistics.median(v) if v else None
def fmt(x):
    return "-" if x is None else (f"{x:.1f}" if x < 1000 else f"{x / 1000:.2f} ms")
def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"
head = ["op", "bytes"] + impls + [f"{o}/ring" for o in others]
rows = []
for (op, b), m in sorted(res.items()):
    t = {i: med(m.get(i, [])) for i in impls}
    rows.append([op, str(b)] + [fmt(t[i]) for i in impls] + [ratio(t[o], t["ring"]) for o in others])
print("# median time per call (us unless marked; max over ranks, median over rounds); ratios >1: ring faster")
w = [max(len(x) for x in col) for col in zip(head, *rows)]
for row in [head] + rows:
    print("  ".join(x.rjust(n) for x, n in zip(row, w)))
if md:
    with open(md, "w") as out:
        out.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for row in rows:
            out.write("| " + " | ".join(row) + " |\n")
if wrong:
    print(f"WRONG ELEMENTS: {wrong}")
    sys.exit(1)
PY
exit $STATUS
