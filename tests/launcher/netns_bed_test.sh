#!/usr/bin/env bash
# The multi-host test bed (bench/netns_bed.sh): two hosts with their own
# hostnames and tbf-shaped links, its ssh-like remote shell driving horarun,
# an allreduce between the hosts that goes over the link (byte counters),
# the other collectives on the tcp ring at 2 x 1 and 2 x 2 ranks, and teardown: `down`, and `clean` for a bed whose owner
# died. Needs root; skipped otherwise.
source "$(dirname "$0")/lib.sh"
BED="$(cd "$(dirname "$0")/../../bench" && pwd)/netns_bed.sh"
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
for c in ip tc unshare nsenter; do command -v $c >/dev/null || skip "no '$c' (iproute2, util-linux)"; done
NAME=nb$$ STALE=nbs$$
cleanup() { "$BED" down --name $NAME; "$BED" down --name $STALE; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE
"$BED" up --name $NAME --hosts 2 --rate 1gbit --owner $$ >"$WORK/up.out" 2>&1 || {
  grep -qE "ip netns add|UTS namespace" "$WORK/up.out" && skip "$(cat "$WORK/up.out")"
  fail "bed up: $(cat "$WORK/up.out")"
}
RSH=$("$BED" rsh --name $NAME) || fail "no wrapper"

# Own hostnames; the wrapper is ssh-like (words joined, run by bash -c); unknown host: 255.
[ "$("$RSH" 10.78.0.2 'echo $(hostname)')" = "$NAME-h1" ] || fail "h1's hostname through the wrapper"
[ "$("$RSH" h0 hostname)" = "$NAME-h0" ] || fail "h0's hostname through the wrapper"
[ "$("$BED" exec --name $NAME 1 hostname)" = "$NAME-h1" ] || fail "exec 1 hostname"
[ "$(hostname)" != "$NAME-h0" ] || fail "the root namespace's hostname changed"
"$RSH" 10.78.0.9 true 2>/dev/null; [ $? -eq 255 ] || fail "unknown host not refused with 255"
for h in 0 1; do
  tc -n hbed-$NAME-h$h qdisc show dev eth0 | grep -q "tbf .*rate 1Gbit" || fail "h$h eth0 not shaped"
  tc -n hbed-$NAME-sw qdisc show dev p$h | grep -q "tbf .*rate 1Gbit" || fail "switch port p$h not shaped"
done

# horarun on h0, one rank per host through the wrapper: Gloo, over the link.
read -r rx0 tx0 < <("$BED" counters --name $NAME 1)
BYTES=$((1 << 20)) ITERS=4
HORA_LOG_LEVEL=info "$BED" exec --name $NAME 0 "$HORARUN" -np 2 -H 10.78.0.1:1,10.78.0.2:1 \
  --ssh-command "$RSH {host}" "$PROBE" allreduce $BYTES $ITERS >"$WORK/ar.out" 2>"$WORK/ar.err" ||
  fail "allreduce over the bed failed"
read -r rx1 tx1 < <("$BED" counters --name $NAME 1)
for r in 0 1; do expect_grep "^\[$r\]<stdout>: probe allreduce rank $r: $BYTES bytes x $ITERS ok" "$WORK/ar.out" "rank $r"; done
expect_grep "data plane tcp-ring\+gloo .*different hosts" "$WORK/ar.err" "hora did not see two hosts"
echo "allreduce h0<->h1 ($ITERS x $BYTES B): h1 rx $((rx1 - rx0)) B, tx $((tx1 - tx0)) B"
[ $((rx1 - rx0)) -ge $((BYTES * ITERS)) ] && [ $((tx1 - tx0)) -ge $((BYTES * ITERS)) ] ||
  fail "the allreduce did not cross the link"

# Every other collective across the hosts, on hora's tcp ring (alltoall over
# its mesh): one rank per host (the whole set on the ring), and two per host
# (the hierarchy: its allgather and reducescatter hierarchical above 1 MiB,
# the rest on a ring over all four ranks); every element checked by the
# probe. 2000000 bytes: above HORA_HIER_COLLECTIVE_MIN_BYTES.
for layout in 10.78.0.1:1,10.78.0.2:1 10.78.0.1:2,10.78.0.2:2; do
  np=2; want="data plane tcp-ring\+gloo .*different hosts"
  case $layout in *:2,*) np=4; want="data plane hier\(2 hosts x 2 ranks: shm, tcp-ring across; tcp-ring\+gloo for the rest\)" ;; esac
  HORA_LOG_LEVEL=info "$BED" exec --name $NAME 0 "$HORARUN" -np $np -H $layout \
    --ssh-command "$RSH {host}" "$PROBE" collectives 2000000 3 >"$WORK/coll.out" 2>"$WORK/coll.err" ||
    fail "collectives over the bed ($layout) failed: $(tail -n 5 "$WORK/coll.err")"
  for ((r = 0; r < np; r++)); do
    expect_grep "^\[$r\]<stdout>: probe collectives rank $r: 2000000 bytes x 3 ok" "$WORK/coll.out" "collectives rank $r ($layout)"
  done
  expect_grep "$want" "$WORK/coll.err" "collectives ($layout) not on the tcp ring"
done
echo "collectives over the bed ok"

# down removes everything; clean removes a bed whose owner is gone.
"$BED" down --name $NAME
ip netns list | grep -q "hbed-$NAME-" && fail "namespaces left after down"
[ -e /run/hora-bed/$NAME ] && fail "state left after down"
grep -q "/run/hora-bed/$NAME/" /proc/self/mountinfo && fail "hostname mounts left after down"
sh -c 'exit 0' & dead=$!; wait $dead
"$BED" up --name $STALE --hosts 1 --rate none --owner $dead >/dev/null || fail "bed up (stale)"
"$BED" clean 2>"$WORK/clean.err"
expect_grep "removing bed '$STALE'" "$WORK/clean.err" "stale bed not reported"
ip netns list | grep -q "hbed-$STALE-" && fail "stale bed's namespaces left after clean"
grep -q "/run/hora-bed/$STALE/" /proc/self/mountinfo && fail "stale bed's mounts left after clean"
echo "bed up/down/clean ok"
