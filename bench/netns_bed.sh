#!/usr/bin/env bash
# netns_bed.sh: a multi-host test bed on one machine. Every emulated host is a
# network namespace plus a UTS namespace (its own hostname), so hora and Open
# MPI see separate machines; the hosts hang off one bridge (a switch, in its
# own namespace) through veth links shaped with tc.
#
#   bench/netns_bed.sh up     [--name NAME] [--hosts N] [--rate RATE] [--owner PID]
#   bench/netns_bed.sh down   [--name NAME]     remove the bed (no error if absent)
#   bench/netns_bed.sh clean                    remove every bed whose owner process is gone
#   bench/netns_bed.sh exec   [--name NAME] HOST CMD [ARG...]   run CMD on HOST (argv as is)
#   bench/netns_bed.sh status [--name NAME]     hosts, addresses, qdiscs, link byte counters
#   bench/netns_bed.sh rsh    [--name NAME]     print the path of the remote-shell wrapper
#   bench/netns_bed.sh hosts  [--name NAME]     print the hosts' addresses, one a line
#   bench/netns_bed.sh counters [--name NAME] HOST   "RX TX": bytes through HOST's eth0
#
# Defaults: NAME "bed", 2 hosts, rate 1gbit ("none" leaves the links unshaped).
# Host i is NAME-h<i> at 10.78.0.<i+1>/24 on interface eth0; the switch port
# towards it (in namespace hbed-NAME-sw) is p<i>. Every link is shaped both
# ways with tbf at RATE (host egress on eth0, switch egress on p<i>), like a
# full-duplex NIC on a switch. Addresses are the same in every bed: beds never
# share a namespace, so they cannot clash.
#
# HOST (for exec and the wrapper) is an index (0, 1, ...), h<i>, the hostname
# NAME-h<i> or the address.
#
# Remote shell: `netns_bed.sh rsh` prints a wrapper that behaves like ssh
# (`rsh HOST [COMMAND WORDS...]`: the words are joined and run by bash -c on
# HOST; no words: an interactive shell). Use it as
#   horarun --ssh-command "$(bench/netns_bed.sh rsh) {host}" -H 10.78.0.1:2,10.78.0.2:2 ...
#   mpirun --mca plm_rsh_agent "$(bench/netns_bed.sh rsh)" -H 10.78.0.1:2,10.78.0.2:2 ...
# starting horarun / mpirun itself on host 0 (`netns_bed.sh exec 0 ...`).
# exec and the wrapper enter the network and UTS namespaces only (no mount
# namespace): files, /dev/shm and /tmp are shared as on one machine, and
# /sys/class/net shows the root namespace's devices (use `ip` or `counters`).
#
# Delay: not available. This kernel has tbf and htb but neither netem nor the
# qdiscs that honour a BPF-set departure time (fq, etf), so no tc-only way to
# add latency exists here; a user-space relay (NFQUEUE or a TCP proxy) could,
# but it would burn the same two cores the ranks need. `up --delay` refuses.
#
# State lives in /run/hora-bed/NAME (the hostname bind mounts, the wrapper, the
# host list, the owner pid). `--owner PID` ties the bed to a process: `clean`
# (also run by every `up`) removes beds whose owner is gone, e.g. after a
# killed bench run. Needs root, iproute2 and util-linux (unshare, nsenter).
set -u

STATE_ROOT=/run/hora-bed
NAME=bed
HOSTS=2
RATE=1gbit
OWNER=
SUBNET=10.78.0

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "netns_bed.sh: $*" >&2; exit 1; }

ns_of() { echo "hbed-$NAME-h$1"; }
sw_of() { echo "hbed-$NAME-sw"; }

# Resolves HOST to an index, or fails.
host_index() {
  local h=$1 n
  n=$(cat "$STATE_ROOT/$NAME/hosts" 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || die "no bed named '$NAME' (run: $0 up --name $NAME)"
  case $h in
    h[0-9]*) h=${h#h} ;;
    "$NAME"-h[0-9]*) h=${h#"$NAME"-h} ;;
    "$SUBNET".*) h=$((${h##*.} - 1)) ;;
  esac
  case $h in ''|*[!0-9]*) die "unknown host '$1'" ;; esac
  [ "$h" -lt "$n" ] || die "unknown host '$1' (bed '$NAME' has $n hosts)"
  echo "$h"
}

in_host() {  # in_host INDEX CMD...: argv as is
  local i=$1; shift
  nsenter --net="/run/netns/$(ns_of "$i")" --uts="$STATE_ROOT/$NAME/uts/h$i" -- "$@"
}

bed_down() {
  local dir=$STATE_ROOT/$NAME f n
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^hbed-$NAME-(h[0-9]+|sw)\$"); do
    ip netns del "$n" 2>/dev/null
  done
  if [ -d "$dir/uts" ]; then
    for f in "$dir"/uts/*; do
      [ -e "$f" ] || continue
      umount "$f" 2>/dev/null
      rm -f "$f"
    done
  fi
  rm -rf "$dir"
}

# Beds whose owner process is gone (and namespaces of beds with no state left).
clean_stale() {
  local d name owner n
  for d in "$STATE_ROOT"/*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    owner=$(cat "$d/owner" 2>/dev/null)
    [ -n "$owner" ] || continue
    kill -0 "$owner" 2>/dev/null && continue
    echo "netns_bed.sh: removing bed '$name' (owner $owner is gone)" >&2
    NAME=$name bed_down
  done
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hbed-.+-(h[0-9]+|sw)$'); do
    name=${n#hbed-}; name=${name%-*}
    [ -d "$STATE_ROOT/$name" ] || ip netns del "$n" 2>/dev/null
  done
}

write_wrapper() {
  local dir=$STATE_ROOT/$NAME i
  {
    echo '#!/usr/bin/env bash'
    echo "# Remote shell into test bed '$NAME' (bench/netns_bed.sh), like ssh:"
    echo '#   rsh HOST [COMMAND WORDS...]   the words are joined and run by bash -c on HOST'
    echo 'host=$1; shift'
    echo 'case $host in'
    for ((i = 0; i < HOSTS; i++)); do
      echo "  $i|h$i|$NAME-h$i|$SUBNET.$((i + 1))) i=$i ;;"
    done
    echo '  *) echo "rsh: unknown host $host" >&2; exit 255 ;;'
    echo 'esac'
    echo "ns=/run/netns/hbed-$NAME-h\$i uts=$dir/uts/h\$i"
    echo '[ $# -gt 0 ] || exec nsenter --net=$ns --uts=$uts -- bash -i'
    echo 'exec nsenter --net=$ns --uts=$uts -- bash -c "$*"'
  } >"$dir/rsh"
  chmod +x "$dir/rsh"
}

# tbf needs a bucket of at least one (GSO) packet and enough for the timer
# granularity: 1 ms worth of RATE, at least 256 KiB.
shape() {  # shape NS DEV
  local ns=$1 dev=$2 bits burst
  [ "$RATE" = none ] && return 0
  bits=$(rate_bits "$RATE") || die "cannot read rate '$RATE' (e.g. 1gbit, 10gbit, 500mbit)"
  burst=$((bits / 8 / 1000))
  [ "$burst" -ge 262144 ] || burst=262144
  ip -n "$ns" link set "$dev" txqueuelen 1000
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$RATE" burst "$burst" latency 20ms ||
    die "tc tbf on $ns/$dev failed"
}
rate_bits() {
  local r=${1,,} m=1
  case $r in
    *gbit) m=1000000000; r=${r%gbit} ;;
    *mbit) m=1000000; r=${r%mbit} ;;
    *kbit) m=1000; r=${r%kbit} ;;
    *bit) r=${r%bit} ;;
    *) return 1 ;;
  esac
  case $r in ''|*[!0-9]*) return 1 ;; esac
  echo $((r * m))
}

reaches() {  # reaches INDEX ADDR
  local out
  out=$(timeout 3 nsenter --net="/run/netns/$(ns_of "$1")" -- bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
  case $out in *refused*) return 0 ;; esac
  return 1
}

bed_up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, mounts)"
  for c in ip tc unshare nsenter; do command -v $c >/dev/null || die "'$c' not found (iproute2, util-linux)"; done
  case $HOSTS in ''|*[!0-9]*) die "--hosts must be a number" ;; esac
  [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 200 ] || die "--hosts must be 1..200"
  [ "$RATE" = none ] || rate_bits "$RATE" >/dev/null || die "cannot read rate '$RATE'"
  clean_stale
  local dir=$STATE_ROOT/$NAME sw i ns
  [ -e "$dir" ] && die "a bed named '$NAME' exists ($0 down --name $NAME first)"
  mkdir -p "$dir/uts" || die "cannot create $dir"
  [ -n "$OWNER" ] && echo "$OWNER" >"$dir/owner"
  sw=$(sw_of)
  ip netns add "$sw" || { bed_down; die "ip netns add $sw failed"; }
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  : >"$dir/hosts.tmp"
  for ((i = 0; i < HOSTS; i++)); do
    ns=$(ns_of $i)
    ip netns add "$ns" || { bed_down; die "ip netns add $ns failed"; }
    touch "$dir/uts/h$i"
    if ! unshare --uts="$dir/uts/h$i" hostname "$NAME-h$i"; then
      bed_down; die "cannot create a UTS namespace (unshare --uts)"
    fi
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$sw" ||
      { bed_down; die "veth for host $i failed"; }
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0
    shape "$sw" "p$i"
    echo "$i $NAME-h$i $SUBNET.$((i + 1)) $ns" >>"$dir/hosts.tmp"
  done
  mv "$dir/hosts.tmp" "$dir/hosts"
  echo "$RATE" >"$dir/rate"
  write_wrapper
  # Every host reaches host 0 (no ping here: a TCP connect to a closed port
  # answered by "connection refused" proves the path).
  for ((i = 1; i < HOSTS; i++)); do
    reaches $i "$SUBNET.1" || reaches $i "$SUBNET.1" || { bed_down; die "host $i cannot reach host 0"; }
  done
  echo "netns_bed.sh: bed '$NAME' up: $HOSTS hosts ($(awk '{printf "%s%s=%s", (NR > 1 ? ", " : ""), $2, $3}' "$dir/hosts")), links $RATE; remote shell $dir/rsh"
}

counters() {  # counters INDEX: "rx tx" bytes of host INDEX's eth0
  # (ip netns exec mounts a /sys that shows the namespace's own devices)
  ip netns exec "$(ns_of "$1")" sh -c \
    'echo $(cat /sys/class/net/eth0/statistics/rx_bytes) $(cat /sys/class/net/eth0/statistics/tx_bytes)'
}

bed_status() {
  local dir=$STATE_ROOT/$NAME i name addr ns
  [ -f "$dir/hosts" ] || die "no bed named '$NAME'"
  echo "bed '$NAME': links $(cat "$dir/rate"), remote shell $dir/rsh"
  [ -f "$dir/owner" ] && echo "owner pid $(cat "$dir/owner")"
  while read -r i name addr ns; do
    read -r rx tx < <(counters "$i")
    printf '  h%-3s %-20s %-14s hostname=%-20s eth0 rx %s B tx %s B; %s\n' "$i" "$ns" "$addr" \
      "$(in_host "$i" hostname)" "$rx" "$tx" \
      "$(tc -n "$ns" qdisc show dev eth0 | head -n 1)"
  done <"$dir/hosts"
}

CMD=${1:-}
[ -n "$CMD" ] || { usage; exit 2; }
shift
while [ $# -gt 0 ]; do
  case $1 in
    --name) NAME=${2:?--name needs a value}; shift 2 ;;
    --hosts|-n) HOSTS=${2:?--hosts needs a number}; shift 2 ;;
    --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
    --owner) OWNER=${2:?--owner needs a pid}; shift 2 ;;
    --delay) die "--delay: this kernel has no netem (nor fq/etf for a BPF departure time); see the header of $0" ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
case $NAME in ''|*[!A-Za-z0-9_]*) die "--name: letters, digits and _ only" ;; esac

case $CMD in
  up) bed_up ;;
  down) bed_down ;;
  clean) clean_stale ;;
  exec)
    [ $# -ge 2 ] || die "usage: $0 exec [--name NAME] HOST CMD [ARG...]"
    i=$(host_index "$1") || exit 1
    shift
    in_host "$i" "$@" ;;
  status) bed_status ;;
  counters)
    [ $# -ge 1 ] || die "usage: $0 counters [--name NAME] HOST"
    i=$(host_index "$1") || exit 1
    counters "$i" ;;
  rsh) [ -x "$STATE_ROOT/$NAME/rsh" ] || die "no bed named '$NAME'"; echo "$STATE_ROOT/$NAME/rsh" ;;
  hosts) [ -f "$STATE_ROOT/$NAME/hosts" ] || die "no bed named '$NAME'"; awk '{print $3}' "$STATE_ROOT/$NAME/hosts" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$CMD' (up, down, clean, exec, status, rsh, hosts, counters)" ;;
esac
