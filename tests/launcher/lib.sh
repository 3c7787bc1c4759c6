# Helpers shared by the launcher tests (sourced). ctest passes HORARUN, PROBE
# and TRAIN (the train_linear example); running a script by hand works too
# when they point at a build.
set -uo pipefail
: "${HORARUN:?set HORARUN to build/launcher/horarun}"
: "${PROBE:?set PROBE to build/tests/launcher_probe}"
: "${TRAIN:?set TRAIN to build/examples/train_linear}"
WORK="$(mktemp -d /tmp/horarun-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 1' INT TERM HUP PIPE  # still run the EXIT trap

fail() {
  echo "FAIL: $*" >&2
  # A job still running in the background (the test gave up on it): stop it
  # the way a user would, so nothing is left burning CPU.
  local j
  for j in $(jobs -p); do kill -TERM "$j" 2>/dev/null; done
  [ -z "$(jobs -p)" ] || sleep 3
  for f in "$WORK"/*.out "$WORK"/*.err; do
    [ -f "$f" ] && { echo "---- $f (last 40 lines)" >&2; tail -n 40 "$f" >&2; }
  done
  exit 1
}
skip() {
  echo "SKIP: $*"
  exit 77
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# less_than X Y: X < Y as decimals
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
expect_grep() {  # expect_grep PATTERN FILE WHAT
  grep -qE -- "$1" "$2" || fail "$3 (no line matching '$1' in $2)"
}
# Sets CLAIMED_PORT to a store port no other test uses, as the C++ and Python
# harnesses pick theirs: below the kernel's ephemeral range, with an flock on
# /tmp/hora-test-ports/<port> held on fd 9 for the rest of this script, and
# nothing listening there now.
claim_port() {
  mkdir -p /tmp/hora-test-ports
  local lo=10000 hi p
  hi=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  for _ in $(seq 1 1000); do
    p=$((lo + RANDOM % (hi - lo)))
    exec 9>>"/tmp/hora-test-ports/$p"
    if flock -n 9 && ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      CLAIMED_PORT=$p
      return 0
    fi
    exec 9>&-
  done
  fail "no free store port in $lo..$((hi - 1))"
}
# Waits up to $2 seconds for a line matching $1 in file $3.
wait_for_line() {
  local deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    grep -qE -- "$1" "$3" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# No process left whose pid was printed in "probe ready rank R pid P" lines.
expect_no_survivors() {
  local pids
  pids=$(sed -nE 's/.*probe ready rank [0-9]+ pid ([0-9]+).*/\1/p' "$1")
  for p in $pids; do
    if kill -0 "$p" 2>/dev/null && ! grep -q zombie "/proc/$p/status" 2>/dev/null \
       && [ "$(awk '/^State/ {print $2}' /proc/$p/status 2>/dev/null)" != "Z" ]; then
      kill -9 "$p" 2>/dev/null
      fail "worker pid $p survived the job"
    fi
  done
}

# ---- elastic tests (elastic_*_test.sh; the worker is tests/launcher/elastic_worker.cc) ----
# field FILE KEY: the value of KEY in a "k=v k=v" line written by elastic_worker.
field() { tr ' ' '\n' < "$1" 2>/dev/null | sed -n "s|^$2=||p" | head -n 1; }
# wait_for_file SECONDS FILE
wait_for_file() {
  local deadline=$((SECONDS + $1))
  while [ $SECONDS -lt $deadline ]; do [ -f "$2" ] && return 0; sleep 0.05; done
  return 1
}
# wait_for_field SECONDS FILE KEY VALUE
wait_for_field() {
  local deadline=$((SECONDS + $1))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(field "$2" "$3")" = "$4" ] && return 0
    sleep 0.05
  done
  return 1
}
# wait_for_exit SECONDS PID: waits for a background job; its status in $JOB_RC.
wait_for_exit() {
  local deadline=$((SECONDS + $1))
  while [ $SECONDS -lt $deadline ]; do
    if ! kill -0 "$2" 2>/dev/null; then
      wait "$2"
      JOB_RC=$?
      return 0
    fi
    sleep 0.05
  done
  return 1
}
# No elastic_worker left whose pid is in a DIR/*.env file.
expect_no_elastic_survivors() {
  local f p
  for f in "$1"/*.env; do
    [ -f "$f" ] || continue
    p=$(field "$f" pid)
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ "$(awk '/^State/ {print $2}' /proc/$p/status 2>/dev/null)" != "Z" ]; then
      kill -9 "$p" 2>/dev/null
      fail "worker pid $p ($f) survived the job"
    fi
  done
}
