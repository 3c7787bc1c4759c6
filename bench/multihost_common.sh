# multihost_common.sh: sourced by multihost_bench.sh and
# multihost_coll_bench.sh once their arguments are read. bed_start PREFIX
# brings a test bed up (bench/netns_bed.sh, HOSTS hosts at RATE, removed when
# the script exits) and sets what both benches launch with:
#   RSH       the bed's remote shell (for horarun's --ssh-command and
#             mpirun's plm_rsh_agent)
#   HOSTLIST  "addr:PER_HOST,..." for horarun -H and mpirun -H
#   NP        HOSTS x PER_HOST
#   MPI_ARGS  mpirun's arguments: the bed's hosts, TCP BTL over its subnet,
#             yielding when idle where ranks outnumber cores, $MPIRUN_ARGS
#   on0 CMD   runs CMD on host 0
# and round_order LIST ROUND: LIST rotated by ROUND - 1, the order of a
# round's runs, so that over as many rounds as LIST has runs each takes
# every position once (a run's place in the round moves its time by up to
# 10-20% here: the middle of three ran fastest in a fixed reversal).
# Needs: BENCH_DIR, HOSTS, RATE, PER_HOST, die().
bed_start() {
  BED="$BENCH_DIR/netns_bed.sh"
  NAME=$1$$
  # shellcheck disable=SC2317
  cleanup() { "$BED" down --name "$NAME"; }
  trap cleanup EXIT
  trap 'exit 130' INT TERM HUP
  "$BED" up --name "$NAME" --hosts "$HOSTS" --rate "$RATE" --owner $$ >&2 || die "test bed failed"
  RSH=$("$BED" rsh --name "$NAME")
  HOSTLIST=$("$BED" hosts --name "$NAME" | awk -v s="$PER_HOST" '{printf "%s%s:%s", (NR > 1 ? "," : ""), $1, s}')
  NP=$((HOSTS * PER_HOST))
  local subnet
  subnet=$("$BED" hosts --name "$NAME" | head -n 1 | sed 's/\.[0-9]*$/.0\/24/')
  MPI_ARGS=(--allow-run-as-root --oversubscribe --bind-to none -np "$NP" -H "$HOSTLIST"
    --mca plm_rsh_agent "$RSH" --mca btl tcp,self
    --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet")
  # More ranks than cores: a rank spinning in MPI's progress loop steals its
  # peer's time slice (4-8 ms per 4-byte allreduce at 4 ranks on 2 cores);
  # yielding while idle is Open MPI's own setting for oversubscribed nodes.
  [ "$NP" -gt "$(nproc)" ] && MPI_ARGS+=(--mca mpi_yield_when_idle 1)
  # shellcheck disable=SC2206
  [ -n "${MPIRUN_ARGS:-}" ] && MPI_ARGS+=($MPIRUN_ARGS)
  return 0
}
on0() { "$BED" exec --name "$NAME" 0 "$@"; }
round_order() {
  local -a runs
  read -r -a runs <<<"$1"
  local n=${#runs[@]} k=$(($2 - 1)) i
  for ((i = 0; i < n; i++)); do printf '%s ' "${runs[$(((i + k) % n))]}"; done
}
