#!/usr/bin/env bash
# multihost_bench.sh: allreduce across emulated hosts, hora against raw Gloo
# and Open MPI in the same run, over the same network namespaces.
#
#   bench/multihost_bench.sh [--rate 1gbit] [--hosts 2] [--per-host 2] [--rounds 1]
#                            [--sizes 4:64M] [--iters N] [--modes "hier flat"] [--md FILE]
#                            [--variant NAME:VAR=VAL[,VAR=VAL...]]...
#
# Builds a test bed with bench/netns_bed.sh (HOSTS network + UTS namespaces on
# a bridge, links shaped with tbf at RATE), then, RANKS = HOSTS x PER_HOST:
#   1. hora-bench --sections sweep through horarun on host 0, remote ranks
#      started through the bed's remote-shell wrapper (--ssh-command): hora
#      (C ABI) and raw Gloo ring and bcube on the same buffers, size by size;
#      once per hora mode in --modes: "hier" (HORA_HIER_ALLREDUCE=auto, the
#      default: the hierarchical allreduce when every host runs several
#      ranks) and "flat" (HORA_HIER_ALLREDUCE=flat: one Gloo ring over all);
#      each --variant NAME is "hier" with those variables set (e.g. --variant
#      noclaim:HORA_SHM_CLAIM_LINES=0), a column of its own with its own ratio
#      to flat, for A/B runs inside one launch;
#   2. mpi-allreduce-bench through mpirun on host 0, remote daemons started
#      through the same wrapper (--mca plm_rsh_agent), TCP BTL only
#      (--mca btl tcp,self), interfaces limited to the bed's subnet.
# --rounds N repeats 1-2 N times (the hora modes in an order rotated each round) and
# reports medians per size (raw Gloo: over every hora-bench run).
# Float32 sum, in place; every result element is checked by both benches
# (a wrong element fails the run). Prints busbw per implementation, the
# ratios hier/flat, hier/MPI and hier/best raw Gloo (nccl-tests style, >1:
# hier faster), the bytes that crossed host 0's link during each bench, and
# hora's data plane choice per mode (its INFO line); --md FILE also writes
# the table as markdown.
#
# Environment:
#   BUILD_DIR    build tree (default <repo>/build-bench, configured when missing); horarun,
#                hora-bench and mpi-allreduce-bench are brought up to date
#   HORARUN, HORA_BENCH, MPI_BENCH   prebuilt binaries (all three: no build)
#   MPIRUN_ARGS  extra mpirun arguments (e.g. "--mca coll_tuned_use_dynamic_rules 1 ...")
#   BENCH_LOG_DIR  where the logs go (default: a fresh mktemp directory)
#   HORA_*       passed to every hora rank (horarun forwards them)
# Needs root (namespaces), iproute2, util-linux, Open MPI (scripts/install_deps.sh --mpi).
set -u

RATE=1gbit HOSTS=2 PER_HOST=2 ROUNDS=1 SIZES=4:64M ITERS= MD= MODES="hier flat"
declare -A VARIANTS=()
VARIANT_NAMES=
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=${2:?}; shift 2 ;;
    --hosts) HOSTS=${2:?}; shift 2 ;;
    --per-host) PER_HOST=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --sizes) SIZES=${2:?}; shift 2 ;;
    --iters) ITERS=${2:?}; shift 2 ;;
    --md) MD=${2:?}; shift 2 ;;
    --modes) MODES=${2:?}; shift 2 ;;
    --variant)
      v=${2:?}; vname=${v%%:*}; vvars=${v#*:}
      case $vname in ''|*[!a-z0-9_]*) echo "multihost_bench.sh: --variant NAME must be [a-z0-9_]+: $v" >&2; exit 2 ;; esac
      [ "$vvars" != "$v" ] || { echo "multihost_bench.sh: --variant needs NAME:VAR=VAL: $v" >&2; exit 2; }
      VARIANTS[$vname]=$vvars; VARIANT_NAMES+=" $vname"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "multihost_bench.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "multihost_bench.sh: $*" >&2; exit 2; }
for m in $MODES; do case $m in hier|flat) ;; *) die "--modes: '$m' is not hier or flat" ;; esac; done
[ -n "$MODES" ] || die "--modes is empty"
for v in $VARIANT_NAMES; do case " hier flat mpi " in *" $v "*) die "--variant $v: the name of a mode" ;; esac; done
MODES="$MODES$VARIANT_NAMES"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
command -v mpirun >/dev/null || die "no mpirun (scripts/install_deps.sh --mpi)"

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REPO/build-bench}"
if [ -n "${HORARUN:-}" ] && [ -n "${HORA_BENCH:-}" ] && [ -n "${MPI_BENCH:-}" ]; then
  :
else
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S "$REPO" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || die "configure failed"
  fi
  ninja -C "$BUILD_DIR" horarun hora-bench mpi-allreduce-bench >&2 || die "build failed"
  HORARUN=$BUILD_DIR/launcher/horarun HORA_BENCH=$BUILD_DIR/bench/hora-bench
  MPI_BENCH=$BUILD_DIR/bench/mpi-allreduce-bench
fi
for b in "$HORARUN" "$HORA_BENCH" "$MPI_BENCH"; do [ -x "$b" ] || die "$b is not executable"; done

LOG_DIR="${BENCH_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/multihost-bench.XXXXXX")}"
mkdir -p "$LOG_DIR"
# shellcheck source=bench/multihost_common.sh
source "$BENCH_DIR/multihost_common.sh"
bed_start mh
link_total() { local rx tx; read -r rx tx < <("$BED" counters --name "$NAME" 0); echo $((rx + tx)); }

BENCH_ARGS=(--sizes "$SIZES")
[ -n "$ITERS" ] && BENCH_ARGS+=(--iters "$ITERS")

echo "# multihost_bench: $HOSTS hosts x $PER_HOST ranks ($HOSTLIST), links $RATE (tbf), $ROUNDS round(s), logs in $LOG_DIR"
echo "# machine: $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)), $(uname -r); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
echo "# hora: horarun -np $NP -H $HOSTLIST --ssh-command '$RSH {host}' hora-bench --sections sweep ${BENCH_ARGS[*]}"
echo "# mpi:  mpirun ${MPI_ARGS[*]} mpi-allreduce-bench ${BENCH_ARGS[*]}"

STATUS=0
# hier: HORA_HIER_ALLREDUCE=auto (what a job gets by default); flat: one Gloo ring.
mode_value() { [ "$1" = flat ] && echo flat || echo auto; }
run_hora() (  # mode round (a subshell: a variant's variables stay in it)
  local extra=() kv
  [ -n "${VARIANTS[$1]:-}" ] && IFS=, read -r -a extra <<<"${VARIANTS[$1]}"
  for kv in "${extra[@]}"; do export "${kv?}"; done
  HORA_HIER_ALLREDUCE=$(mode_value "$1") HORA_LOG_LEVEL=${HORA_LOG_LEVEL:-info} on0 "$HORARUN" -np "$NP" -H "$HOSTLIST" \
    --ssh-command "$RSH {host}" \
    "$HORA_BENCH" --sections sweep "${BENCH_ARGS[@]}" >"$LOG_DIR/$1.$2.out" 2>"$LOG_DIR/$1.$2.err"
)
for ((round = 1; round <= ROUNDS; round++)); do
  order=$(round_order "$MODES" "$round")
  for mode in $order; do
    b0=$(link_total)
    run_hora "$mode" "$round"
    rc=$?
    b1=$(link_total)
    echo "# round $round: hora-bench ($mode, load $(cut -d' ' -f1 /proc/loadavg)) exit $rc, host 0 link rx+tx $(((b1 - b0) >> 20)) MiB"
    [ $rc -eq 0 ] || { STATUS=1; echo "hora-bench ($mode) failed (exit $rc):" >&2; tail -n 20 "$LOG_DIR/$mode.$round.err" >&2; }
    echo "${mode}_link_bytes=$((b1 - b0))" >>"$LOG_DIR/link.$round"
  done
  b1=$(link_total)
  on0 mpirun "${MPI_ARGS[@]}" "$MPI_BENCH" "${BENCH_ARGS[@]}" >"$LOG_DIR/mpi.$round.out" 2>"$LOG_DIR/mpi.$round.err"
  rc=$?
  b2=$(link_total)
  echo "# round $round: mpi-allreduce-bench (load $(cut -d' ' -f1 /proc/loadavg)) exit $rc, host 0 link rx+tx $(((b2 - b1) >> 20)) MiB"
  [ $rc -eq 0 ] || { STATUS=1; echo "mpi-allreduce-bench failed (exit $rc):" >&2; tail -n 20 "$LOG_DIR/mpi.$round.err" >&2; }
  echo "mpi_link_bytes=$((b2 - b1))" >>"$LOG_DIR/link.$round"
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in $MODES; do
  plane=$(grep -h "data plane" "$LOG_DIR"/$mode.*.err 2>/dev/null | sed 's/.*INFO //' | sort | uniq -c | sed 's/^ *//')
  echo "# hora's data plane, $mode (ranks reporting it): ${plane:-no INFO line (HORA_LOG_LEVEL above info?)}"
done

/usr/bin/env python3 - "$LOG_DIR" "$ROUNDS" "$NP" "$HOSTS" "${MD:-}" "$MODES" <<'PY' || STATUS=1
import os, re, statistics, sys
log, rounds, np_, hosts, md = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
modes = sys.argv[6].split()
def results(path):
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        line = re.sub(r"^\[\d+\]<stdout>: ", "", line.strip())
        if line.startswith("RESULT section=allreduce"):
            kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            out[int(kv["bytes"])] = kv
    return out
rs = range(1, rounds + 1)
hora = {m: [results(f"{log}/{m}.{r}.out") for r in rs] for m in modes}
mpi = [results(f"{log}/mpi.{r}.out") for r in rs]
allruns = [run for m in modes for run in hora[m]]
sizes = sorted(set().union(*[set(run) for run in allruns + mpi]))
def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None
def col(runs, s, key):
    return med([float(run[s][key]) if s in run else None for run in runs])
ratio = lambda peer_us, own_us: (peer_us / own_us) if peer_us is not None and own_us else None
rows, wrong, payload = [], 0, {m: 0 for m in modes}
for s in sizes:
    r = {"size": s}
    for m in modes:
        r[m + "_us"], r[m] = col(hora[m], s, "hora_us"), col(hora[m], s, "hora_busbw")
    r["ring"], r["bcube"] = col(allruns, s, "ring_busbw"), col(allruns, s, "bcube_busbw")
    r["ring_us"], r["bcube_us"] = col(allruns, s, "ring_us"), col(allruns, s, "bcube_us")
    r["mpi_us"], r["mpi"] = col(mpi, s, "mpi_us"), col(mpi, s, "mpi_busbw")
    for m in modes:
        for run in hora[m]:
            if s in run:
                wrong += sum(int(run[s][k]) for k in ("hora_wrong", "ring_wrong", "bcube_wrong"))
                payload[m] += s * (int(run[s]["iters"]) + int(run[s]["warmup"]))
    for run in mpi:
        if s in run:
            wrong += int(run[s]["mpi_wrong"])
    best_us = min([v for v in (r["ring_us"], r["bcube_us"]) if v is not None], default=None)
    lead = modes[0]  # the ratios are of the first mode (hier by default)
    for m in modes:
        if m != "flat":
            r["vs_flat_" + m] = ratio(r.get("flat_us"), r.get(m + "_us"))
    r["vs_mpi"] = ratio(r["mpi_us"], r[lead + "_us"])
    r["vs_gloo"] = ratio(best_us, r[lead + "_us"])
    rows.append(r)
def f(v, fmt):
    return "-" if v is None else fmt % v
def size(b):
    for unit, sh in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return f"{b >> sh} {unit}"
    return f"{b} B"
lead = modes[0]
print(f"\n# busbw in GB/s (algbw x 2(n-1)/n, n = {np_}); time = mean per allreduce, max over ranks;"
      f" median of {rounds} round(s); ratios of hora {lead} (times inverted, >1: {lead} faster)")
cols = [("size", lambda r: size(r["size"]))]
for m in modes:
    cols += [(f"{m} us", lambda r, m=m: f(r[m + "_us"], "%.1f")), (m, lambda r, m=m: f(r[m], "%.4f"))]
cols += [("gloo ring", lambda r: f(r["ring"], "%.4f")), ("gloo bcube", lambda r: f(r["bcube"], "%.4f")),
         ("mpi us", lambda r: f(r["mpi_us"], "%.1f")), ("mpi", lambda r: f(r["mpi"], "%.4f"))]
if "flat" in modes:
    cols += [(f"{m}/flat", lambda r, m=m: f(r["vs_flat_" + m], "%.2f")) for m in modes if m != "flat"]
cols += [(f"{lead}/mpi", lambda r: f(r["vs_mpi"], "%.2f")), (f"{lead}/best gloo", lambda r: f(r["vs_gloo"], "%.2f"))]
print(" ".join("%12s" % c for c, _ in cols))
for r in rows:
    print(" ".join("%12s" % fn(r) for _, fn in cols))
print(f"# wrong elements (all implementations, all rounds): {wrong}")
# An allreduce across two hosts moves at least its size each way per host;
# hora-bench's own hora iterations alone must have put that much on the link.
link = {m: 0 for m in modes}
for r in rs:
    for line in open(f"{log}/link.{r}"):
        k, _, v = line.strip().partition("=")
        if k.endswith("_link_bytes") and k[:-len("_link_bytes")] in link:
            link[k[:-len("_link_bytes")]] += int(v)
short = []
for m in modes:
    print(f"# host 0 link during hora-bench ({m}): {link[m]} B rx+tx; hora's payload alone needs >= {2 * payload[m]} B")
    if hosts > 1 and link[m] < 2 * payload[m]:
        short.append(m)
if md:
    with open(md, "w") as o:
        o.write("| " + " | ".join(c for c, _ in cols) + " |\n")
        o.write("|" + "---|" * len(cols) + "\n")
        for r in rows:
            o.write("| " + " | ".join(fn(r) for _, fn in cols) + " |\n")
for m in short:
    print(f"FAIL: hora-bench ({m}) moved less over host 0's link than hora's allreduces need: not across hosts?")
if wrong:
    print("FAIL: wrong results")
sys.exit(1 if wrong > 0 or not rows or short else 0)
PY
exit $STATUS
