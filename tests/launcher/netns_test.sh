#!/usr/bin/env bash
# Multi-host jobs on one machine: three network namespaces are three "hosts".
#   h0 (horarun and rank 0) --10.77.1.0/24-- h1 (interface eth1)
#   h0                      --10.77.2.0/24-- h2 (interface wan0)
# h0 routes between the two subnets. Each host also has its own UTS namespace
# (its own hostname): hora tells hosts apart by hostname + kernel boot id
# (core/host_identity), and the boot id is one per kernel, so without this
# every "host" is the same machine to hora, which then uses shared memory and
# sends no collective over the emulated links. A UTS namespace is kept alive
# by a bind mount (unshare --uts=FILE), entered with nsenter together with
# the network namespace. The remote shell is that nsenter behind a small
# wrapper (the way a cluster substitutes its own). horarun must pick a
# different store address per host (by route, the interface names differ),
# ranks on h1 and h2 rendezvous across real interfaces, an allreduce between
# h0 and h1 must go through Gloo and put its payload on the h0-h1 link (veth
# byte counters; ranks on one host use shared memory and must not), --check
# passes (and fails for an unknown host), and cutting h2's link mid-job ends
# the job with a clear error instead of a hang. Namespaces only: no traffic
# leaves them, nothing in the root namespace changes.
source "$(dirname "$0")/lib.sh"
command -v ip >/dev/null || skip "no 'ip' command (install iproute2: scripts/install_deps.sh)"
command -v unshare >/dev/null && command -v nsenter >/dev/null ||
  skip "no unshare/nsenter (util-linux): cannot give each emulated host its own hostname"
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
UTS_DIR=/run/hora-uts
# Namespaces and hostname mounts left by a run that was killed (ctest
# timeout): their creator is gone.
for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hora[0-9]+_h[012]$'); do
  p=${n#hora}; p=${p%_h*}
  kill -0 "$p" 2>/dev/null || ip netns del "$n" 2>/dev/null
done
for f in "$UTS_DIR"/hora*_h[012]; do
  [ -e "$f" ] || continue
  n=${f##*/}; p=${n#hora}; p=${p%_h*}
  kill -0 "$p" 2>/dev/null && continue
  umount "$f" 2>/dev/null; rm -f "$f"
done
T=hora$$
N0=${T}_h0 N1=${T}_h1 N2=${T}_h2
cleanup() {
  for n in $N0 $N1 $N2; do
    ip netns del "$n" 2>/dev/null
    umount "$UTS_DIR/$n" 2>/dev/null; rm -f "$UTS_DIR/$n"
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE
ip netns add $N0 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip netns add $N1 && ip netns add $N2 || fail "ip netns add"
# One UTS namespace per host, named after it ("hora<pid>-h1").
mkdir -p "$UTS_DIR"
for n in $N0 $N1 $N2; do
  touch "$UTS_DIR/$n"
  unshare --uts="$UTS_DIR/$n" hostname "${n/_/-}" 2>"$WORK/uts.err" ||
    skip "cannot create a UTS namespace per host: $(head -n 1 "$WORK/uts.err")"
done
# Runs a command inside host NS: its network and its hostname.
in_host() { local ns=$1; shift; nsenter --net=/run/netns/$ns --uts="$UTS_DIR/$ns" -- "$@"; }
[ "$(in_host $N1 hostname)" = "$T-h1" ] || fail "h1 does not have its own hostname"
[ "$(hostname)" != "$T-h1" ] || fail "the root namespace's hostname changed"
set -e
ip link add h0a netns $N0 type veth peer name eth1 netns $N1
ip link add h0b netns $N0 type veth peer name wan0 netns $N2
ip -n $N0 addr add 10.77.1.1/24 dev h0a
ip -n $N0 addr add 10.77.2.1/24 dev h0b
ip -n $N1 addr add 10.77.1.2/24 dev eth1
ip -n $N2 addr add 10.77.2.2/24 dev wan0
for n in $N0 $N1 $N2; do ip -n $n link set lo up; done
ip -n $N0 link set h0a up; ip -n $N0 link set h0b up
ip -n $N1 link set eth1 up; ip -n $N2 link set wan0 up
ip -n $N1 route add default via 10.77.1.1
ip -n $N2 route add default via 10.77.2.1
ip netns exec $N0 sysctl -qw net.ipv4.ip_forward=1
set +e
ip -n $N1 route get 10.77.2.2 >/dev/null || fail "namespaces not routed"

cat >"$WORK/rsh.sh" <<RSH
#!/usr/bin/env bash
# remote shell: host -> namespace
host=\$1; shift
case \$host in
  10.77.1.2) ns=$N1 ;;
  10.77.2.2) ns=$N2 ;;
  *) echo "rsh: unknown host \$host" >&2; exit 255 ;;
esac
exec nsenter --net=/run/netns/\$ns --uts=$UTS_DIR/\$ns -- "\$@"
RSH
chmod +x "$WORK/rsh.sh"
RSH="$WORK/rsh.sh {host}"
HOSTS=10.77.1.1:1,10.77.1.2:2,10.77.2.2:1
run0() { in_host $N0 "$@"; }
# The same as an argv, for jobs started in the background (nsenter execs: $! is the job).
IN_H0=(nsenter --net=/run/netns/$N0 --uts="$UTS_DIR/$N0" --)

# 1. --check: every host reachable, store reachable from each.
run0 "$HORARUN" -np 4 -H $HOSTS --ssh-command "$RSH" --check "$TRAIN" >"$WORK/check.out" 2>"$WORK/check.err"
[ $? -eq 0 ] || fail "--check failed"
expect_grep "10.77.1.2: reachable .*store 10.77.1.1:[0-9]+ reachable" "$WORK/check.err" "h1 check"
expect_grep "10.77.2.2: reachable .*store 10.77.2.1:[0-9]+ reachable" "$WORK/check.err" "h2 check (own address)"
expect_grep "all checks passed" "$WORK/check.err" "check summary"
run0 "$HORARUN" -np 2 -H 10.77.1.1:1,10.77.2.99:1 --ssh-command "$RSH" --start-timeout 5 --check \
  >"$WORK/check2.out" 2>"$WORK/check2.err" && fail "--check passed with an unknown host"
expect_grep "10.77.2.99: NOT reachable" "$WORK/check2.err" "unknown host not reported"
echo "--check ok"

# 2. The example across three hosts (4 ranks).
t0=$(now)
run0 "$HORARUN" -np 4 -H $HOSTS --ssh-command "$RSH" --verbose "$TRAIN" >"$WORK/job.out" 2>"$WORK/job.err"
rc=$?
[ $rc -eq 0 ] || fail "multi-host job exited $rc"
for r in 0 1 2 3; do expect_grep "^\[$r\]<stdout>: rank $r: converged" "$WORK/job.out" "rank $r"; done
expect_grep "rendezvous store on port [0-9]+, reached at 10.77.1.2 via 10.77.1.1 \(h0a\), 10.77.2.2 via 10.77.2.1 \(h0b\)" \
  "$WORK/job.err" "store address choice"
echo "multi-host job ok in $(elapsed "$t0") s"

# 3. Topology and addresses each remote rank received.
run0 "$HORARUN" -np 4 -H $HOSTS --ssh-command "$RSH" "$PROBE" env >"$WORK/env.out" 2>"$WORK/env.err" || fail "env job"
v() { sed -nE "s/^\[$1\]<stdout>: $2=(.*)$/\1/p" "$WORK/env.out"; }
[ "$(v 3 HORA_STORE_ADDR)" = 10.77.2.1 ] || fail "rank 3 store addr $(v 3 HORA_STORE_ADDR)"
[ "$(v 1 HORA_STORE_ADDR)" = 10.77.1.1 ] || fail "rank 1 store addr"
[ "$(v 2 HORA_HOSTNAME)" = 10.77.1.2 ] || fail "rank 2 hostname"
[ "$(v 2 HORA_LOCAL_RANK) $(v 2 HORA_LOCAL_SIZE) $(v 2 HORA_CROSS_RANK) $(v 2 HORA_CROSS_SIZE)" = "1 2 0 1" ] ||
  fail "rank 2 topology"
[ "$(v 3 HORA_CROSS_RANK) $(v 3 HORA_CROSS_SIZE)" = "2 3" ] || fail "rank 3 cross rank"
[ "$(v 3 HORA_SECRET_LEN)" = 64 ] || fail "remote rank did not get the secret"

# 3b. Every host is its own machine to hora, and collectives cross the links.
# Ranks see their host's name (through the remote shell too).
run0 "$HORARUN" -np 3 -H 10.77.1.1:1,10.77.1.2:1,10.77.2.2:1 --ssh-command "$RSH" hostname \
  >"$WORK/hostname.out" 2>"$WORK/hostname.err" || fail "hostname job"
for r in 0 1 2; do expect_grep "^\[$r\]<stdout>: $T-h$r\$" "$WORK/hostname.out" "rank $r hostname"; done
# Byte counters of h1's end of the h0-h1 link.
link_bytes() { ip netns exec $N1 cat /sys/class/net/eth1/statistics/$1_bytes; }
AR_BYTES=$((4 << 20)) AR_ITERS=5
# One rank on h0, one on h1: hora must refuse shared memory (different hosts)
# and the ring must carry the payload over the link, both ways: each rank
# sends 2(n-1)/n * size = size per allreduce.
rx0=$(link_bytes rx) tx0=$(link_bytes tx)
HORA_LOG_LEVEL=info run0 "$HORARUN" -np 2 -H 10.77.1.1:1,10.77.1.2:1 --ssh-command "$RSH" \
  "$PROBE" allreduce $AR_BYTES $AR_ITERS >"$WORK/cross.out" 2>"$WORK/cross.err" ||
  fail "allreduce between h0 and h1 failed"
rx=$(( $(link_bytes rx) - rx0 )) tx=$(( $(link_bytes tx) - tx0 ))
for r in 0 1; do expect_grep "^\[$r\]<stdout>: probe allreduce rank $r: $AR_BYTES bytes x $AR_ITERS ok" \
  "$WORK/cross.out" "cross-host allreduce rank $r"; done
expect_grep "data plane tcp-ring\+gloo .*no shared memory: .*different hosts" "$WORK/cross.err" \
  "hora did not see two hosts (data plane line)"
payload=$((AR_BYTES * AR_ITERS))
echo "h0<->h1 allreduce ($AR_ITERS x $AR_BYTES B): link h1 rx $rx B, tx $tx B (payload $payload B each way)"
[ "$rx" -ge "$payload" ] && [ "$tx" -ge "$payload" ] ||
  fail "the allreduce did not cross the h0-h1 link: rx $rx, tx $tx bytes < $payload"
# Control: two ranks on h1 share memory; only the control plane (store, heartbeats) crosses.
rx0=$(link_bytes rx) tx0=$(link_bytes tx)
HORA_LOG_LEVEL=info run0 "$HORARUN" -np 2 -H 10.77.1.2:2 --ssh-command "$RSH" \
  "$PROBE" allreduce $AR_BYTES $AR_ITERS >"$WORK/local.out" 2>"$WORK/local.err" ||
  fail "allreduce on h1 failed"
rx=$(( $(link_bytes rx) - rx0 )) tx=$(( $(link_bytes tx) - tx0 ))
expect_grep "data plane shm" "$WORK/local.err" "two ranks on h1 did not use shared memory"
echo "allreduce within h1: link h1 rx $rx B, tx $tx B"
[ "$rx" -lt "$AR_BYTES" ] && [ "$tx" -lt "$AR_BYTES" ] ||
  fail "an allreduce within h1 put $rx / $tx bytes on its link"

# 4. A remote worker failing: exit code and report come back through the remote shell.
run0 "$HORARUN" -np 3 -H 10.77.1.1:1,10.77.1.2:1,10.77.2.2:1 --ssh-command "$RSH" --grace-seconds 2 \
  "$PROBE" train 100000 fail 2 10 3 >"$WORK/fail.out" 2>"$WORK/fail.err"
rc=$?
[ $rc -eq 3 ] || fail "remote exit 3: horarun exited $rc"
expect_grep "First failure: rank 2 on host 10.77.2.2 .*exited with code 3" "$WORK/fail.err" "remote failure report"
expect_no_survivors "$WORK/fail.out"

# 5. Cut h2's link mid-job: clear error, no hang.
t0=$(now)
"${IN_H0[@]}" "$HORARUN" -np 3 -H 10.77.1.1:1,10.77.1.2:1,10.77.2.2:1 --ssh-command "$RSH" \
  --grace-seconds 2 --peer-timeout-seconds 2 "$PROBE" train 1000000 sleep 10 >"$WORK/cut.out" 2>"$WORK/cut.err" &
hr=$!
for r in 0 1 2; do wait_for_line "probe ready rank $r pid" 20 "$WORK/cut.out" || fail "rank $r not ready"; done
ip -n $N2 link set wan0 down
t1=$(now)
wait $hr
rc=$?
dt=$(elapsed "$t1")
[ $rc -ne 0 ] || fail "job survived a cut link"
less_than "$dt" 15 || fail "job took $dt s to end after the link cut"
expect_grep "First failure: rank" "$WORK/cut.err" "no first-failure report after the cut"
expect_grep "went silent|no heartbeat|silent|closed|lost" "$WORK/cut.err" "no peer-loss error in output"
expect_no_survivors "$WORK/cut.out"
echo "link cut: job ended in $dt s (exit $rc)"
grep -A4 "First failure" "$WORK/cut.err"

# 6. Ctrl-C to horarun tears down remote ranks too (h2's link back up first).
ip -n $N2 link set wan0 up
ip -n $N2 route replace default via 10.77.2.1
# (nsenter execs horarun: $! is horarun itself.)
"${IN_H0[@]}" "$HORARUN" -np 3 -H 10.77.1.1:1,10.77.1.2:1,10.77.2.2:1 --ssh-command "$RSH" \
  --grace-seconds 2 "$PROBE" train 1000000 >"$WORK/int.out" 2>"$WORK/int.err" &
hr=$!
for r in 0 1 2; do wait_for_line "probe ready rank $r pid" 20 "$WORK/int.out" || fail "rank $r not ready"; done
t1=$(now)
kill -INT $hr
wait $hr
rc=$?
dt=$(elapsed "$t1")
[ $rc -eq 130 ] || fail "SIGINT with remote ranks: horarun exited $rc"
less_than "$dt" 5 || fail "SIGINT teardown with remote ranks took $dt s"
sleep 0.3  # the remote script's own kill of its worker group
expect_no_survivors "$WORK/int.out"
echo "SIGINT: remote ranks torn down in $dt s"
