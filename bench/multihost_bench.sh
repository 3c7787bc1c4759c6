#!/usr/bin/env bash
# multihost_bench.sh: allreduce across emulated hosts, hora against raw Gloo
# and Open MPI in the same run, over the same network namespaces.
#
#   bench/multihost_bench.sh [--rate 1gbit] [--hosts 2] [--per-host 2] [--rounds 1]
#                            [--sizes 4:64M] [--iters N] [--md FILE]
#
# Builds a test bed with bench/netns_bed.sh (HOSTS network + UTS namespaces on
# a bridge, links shaped with tbf at RATE), then, RANKS = HOSTS x PER_HOST:
#   1. hora-bench --sections sweep through horarun on host 0, remote ranks
#      started through the bed's remote-shell wrapper (--ssh-command): hora
#      (C ABI) and raw Gloo ring and bcube on the same buffers, size by size;
#   2. mpi-allreduce-bench through mpirun on host 0, remote daemons started
#      through the same wrapper (--mca plm_rsh_agent), TCP BTL only
#      (--mca btl tcp,self), interfaces limited to the bed's subnet.
# --rounds N repeats 1-2 N times (alternating) and reports medians per size.
# Float32 sum, in place; every result element is checked by both benches
# (a wrong element fails the run). Prints busbw per implementation, the
# ratios hora/MPI and hora/best raw Gloo (nccl-tests style, >1: hora faster),
# the bytes that crossed host 0's link during each bench, and hora's data
# plane choice (its INFO line); --md FILE also writes the table as markdown.
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

RATE=1gbit HOSTS=2 PER_HOST=2 ROUNDS=1 SIZES=4:64M ITERS= MD=
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
    -h|--help) usage; exit 0 ;;
    *) echo "multihost_bench.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "multihost_bench.sh: $*" >&2; exit 2; }
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
BED="$BENCH_DIR/netns_bed.sh"
NAME=mh$$
cleanup() { "$BED" down --name "$NAME"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
"$BED" up --name "$NAME" --hosts "$HOSTS" --rate "$RATE" --owner $$ >&2 || die "test bed failed"
RSH=$("$BED" rsh --name "$NAME")
HOSTLIST=$("$BED" hosts --name "$NAME" | awk -v s="$PER_HOST" '{printf "%s%s:%s", (NR > 1 ? "," : ""), $1, s}')
NP=$((HOSTS * PER_HOST))
SUBNET=$("$BED" hosts --name "$NAME" | head -n 1 | sed 's/\.[0-9]*$/.0\/24/')
on0() { "$BED" exec --name "$NAME" 0 "$@"; }
link_total() { local rx tx; read -r rx tx < <("$BED" counters --name "$NAME" 0); echo $((rx + tx)); }

BENCH_ARGS=(--sizes "$SIZES")
[ -n "$ITERS" ] && BENCH_ARGS+=(--iters "$ITERS")
MPI_ARGS=(--allow-run-as-root --oversubscribe --bind-to none -np "$NP" -H "$HOSTLIST"
  --mca plm_rsh_agent "$RSH" --mca btl tcp,self
  --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET")
# More ranks than cores: a rank spinning in MPI's progress loop steals its peer's
# time slice (4-8 ms per 4-byte allreduce at 4 ranks on 2 cores); yielding while
# idle is Open MPI's own setting for oversubscribed nodes.
[ "$NP" -gt "$(nproc)" ] && MPI_ARGS+=(--mca mpi_yield_when_idle 1)
# shellcheck disable=SC2206
[ -n "${MPIRUN_ARGS:-}" ] && MPI_ARGS+=($MPIRUN_ARGS)

echo "# multihost_bench: $HOSTS hosts x $PER_HOST ranks ($HOSTLIST), links $RATE (tbf), $ROUNDS round(s), logs in $LOG_DIR"
echo "# machine: $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)), $(uname -r); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
echo "# hora: horarun -np $NP -H $HOSTLIST --ssh-command '$RSH {host}' hora-bench --sections sweep ${BENCH_ARGS[*]}"
echo "# mpi:  mpirun ${MPI_ARGS[*]} mpi-allreduce-bench ${BENCH_ARGS[*]}"

STATUS=0
for ((round = 1; round <= ROUNDS; round++)); do
  b0=$(link_total)
  HORA_LOG_LEVEL=${HORA_LOG_LEVEL:-info} on0 "$HORARUN" -np "$NP" -H "$HOSTLIST" --ssh-command "$RSH {host}" \
    "$HORA_BENCH" --sections sweep "${BENCH_ARGS[@]}" >"$LOG_DIR/hora.$round.out" 2>"$LOG_DIR/hora.$round.err"
  rc=$?
  b1=$(link_total)
  echo "# round $round: hora-bench exit $rc, host 0 link rx+tx $(((b1 - b0) >> 20)) MiB"
  [ $rc -eq 0 ] || { STATUS=1; echo "hora-bench failed (exit $rc):" >&2; tail -n 20 "$LOG_DIR/hora.$round.err" >&2; }
  echo "hora_link_bytes=$((b1 - b0))" >>"$LOG_DIR/link.$round"
  on0 mpirun "${MPI_ARGS[@]}" "$MPI_BENCH" "${BENCH_ARGS[@]}" >"$LOG_DIR/mpi.$round.out" 2>"$LOG_DIR/mpi.$round.err"
  rc=$?
  b2=$(link_total)
  echo "# round $round: mpi-allreduce-bench exit $rc, host 0 link rx+tx $(((b2 - b1) >> 20)) MiB"
  [ $rc -eq 0 ] || { STATUS=1; echo "mpi-allreduce-bench failed (exit $rc):" >&2; tail -n 20 "$LOG_DIR/mpi.$round.err" >&2; }
  echo "mpi_link_bytes=$((b2 - b1))" >>"$LOG_DIR/link.$round"
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
plane=$(grep -h "data plane" "$LOG_DIR"/hora.*.err | sed 's/.*INFO //' | sort | uniq -c | sed 's/^ *//')
echo "# hora's data plane (ranks reporting it): ${plane:-no INFO line (HORA_LOG_LEVEL above info?)}"

/usr/bin/env python3 - "$LOG_DIR" "$ROUNDS" "$NP" "$HOSTS" "${MD:-}" <<'PY' || STATUS=1
import glob, os, re, statistics, sys
log, rounds, np_, hosts, md = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
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
runs = [(results(f"{log}/hora.{r}.out"), results(f"{log}/mpi.{r}.out")) for r in range(1, rounds + 1)]
sizes = sorted(set().union(*[set(h) | set(m) for h, m in runs]))
def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None
rows, wrong, payload = [], 0, 0
for s in sizes:
    def col(which, key):
        return med([float(run[which][s][key]) if s in run[which] else None for run in runs])
    hora, ring, bcube = col(0, "hora_busbw"), col(0, "ring_busbw"), col(0, "bcube_busbw")
    hus, mus = col(0, "hora_us"), col(1, "mpi_us")
    mpi = col(1, "mpi_busbw")
    for run in runs:
        if s in run[0]:
            wrong += sum(int(run[0][s][k]) for k in ("hora_wrong", "ring_wrong", "bcube_wrong"))
            payload += s * (int(run[0][s]["iters"]) + int(run[0][s]["warmup"]))
        if s in run[1]:
            wrong += int(run[1][s]["mpi_wrong"])
    rus, bus = col(0, "ring_us"), col(0, "bcube_us")
    best_us = min([v for v in (rus, bus) if v is not None], default=None)
    # busbw ratio = time ratio inverted (computed from times: tiny busbw values round to 0)
    ratio = lambda peer_us, own_us: (peer_us / own_us) if peer_us is not None and own_us else None
    rows.append((s, hus, hora, ring, bcube, mus, mpi, ratio(mus, hus), ratio(best_us, hus)))
def f(v, fmt):
    return "-" if v is None else fmt % v
def size(b):
    for unit, sh in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return f"{b >> sh} {unit}"
    return f"{b} B"
print(f"\n# busbw in GB/s (algbw x 2(n-1)/n, n = {np_}); time = mean per allreduce, max over ranks;"
      f" median of {rounds} round(s)")
hdr = ("size", "hora us", "hora", "gloo ring", "gloo bcube", "mpi us", "mpi", "hora/mpi", "hora/best gloo")
print("%10s %10s %8s %10s %10s %10s %8s %9s %14s" % hdr)
for s, hus, hora, ring, bcube, mus, mpi, rm, rg in rows:
    print("%10s %10s %8s %10s %10s %10s %8s %9s %14s" % (size(s), f(hus, "%.1f"), f(hora, "%.4f"),
          f(ring, "%.4f"), f(bcube, "%.4f"), f(mus, "%.1f"), f(mpi, "%.4f"), f(rm, "%.2f"), f(rg, "%.2f")))
print(f"# wrong elements (all implementations, all rounds): {wrong}")
# An allreduce across two hosts moves at least its size each way per host;
# hora-bench's own hora iterations alone must have put that much on the link.
link = 0
for r in range(1, rounds + 1):
    for line in open(f"{log}/link.{r}"):
        if line.startswith("hora_link_bytes="):
            link += int(line.split("=")[1])
print(f"# host 0 link during hora-bench: {link} B rx+tx; hora's payload alone needs >= {2 * payload} B")
if md:
    with open(md, "w") as o:
        o.write("| size | hora busbw | raw Gloo ring | raw Gloo bcube | Open MPI | hora / MPI | hora / best Gloo | hora time | MPI time |\n")
        o.write("|---|---|---|---|---|---|---|---|---|\n")
        for s, hus, hora, ring, bcube, mus, mpi, rm, rg in rows:
            o.write(f"| {size(s)} | {f(hora, '%.4f')} | {f(ring, '%.4f')} | {f(bcube, '%.4f')} | {f(mpi, '%.4f')} |"
                    f" {f(rm, '%.2f')} | {f(rg, '%.2f')} | {f(hus, '%.1f')} us | {f(mus, '%.1f')} us |\n")
bad = wrong > 0 or not rows or (hosts > 1 and link < 2 * payload)
if hosts > 1 and link < 2 * payload:
    print("FAIL: hora-bench moved less over host 0's link than hora's allreduces need: not across hosts?")
if wrong:
    print("FAIL: wrong results")
sys.exit(1 if bad else 0)
PY
exit $STATUS
