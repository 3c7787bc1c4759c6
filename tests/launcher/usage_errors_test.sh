#!/usr/bin/env bash
# Bad command lines end horarun with exit status 2 (its usage errors) and one
# message naming the flag, the value and what is allowed; nothing starts, no
# crash, no silent clamp. A host named twice in -H is one host with its slots
# added up, with a note (launcher/README.md).
source "$(dirname "$0")/lib.sh"
# usage_error "EXPECTED MESSAGE (an ERE)" ARGS...
usage_error() {
  local want="$1"
  shift
  "$HORARUN" "$@" >"$WORK/u.out" 2>"$WORK/u.err"
  local rc=$?
  [ $rc -eq 2 ] || fail "horarun $* exited $rc, expected 2"
  grep -qE -- "^horarun: $want" "$WORK/u.err" || fail "horarun $*: no message '$want' in: $(cat "$WORK/u.err")"
  [ ! -s "$WORK/u.out" ] || fail "horarun $* printed on stdout"
}
for np in 0 -1 99999999999 99999999999999999999999 1048577 2x 1.5 ""; do
  usage_error "-np expects an integer from 1 to 1048576, got '$np'" -np "$np" "$PROBE"
done
usage_error "--min-np expects an integer from 1 to 1048576, got '0'" --min-np 0 "$PROBE"
usage_error "--max-np expects an integer from 1 to 1048576, got '4294967297'" --max-np 4294967297 "$PROBE"
usage_error "--slots expects an integer from 1 to 65536, got '-2'" --max-np 2 --slots -2 "$PROBE"
usage_error "-p expects an integer from 1 to 65535, got '65536'" -np 1 -p 65536 "$PROBE"
usage_error "--start-timeout expects a number of seconds from 0.001 to 1000000000, got 'inf'" \
  -np 1 --start-timeout inf "$PROBE"
usage_error "--peer-timeout-seconds expects a number of seconds from 0.001 to 1000000000, got '0'" \
  -np 1 --peer-timeout-seconds 0 "$PROBE"
HORARUN_START_TIMEOUT_S=abc usage_error \
  "HORARUN_START_TIMEOUT_S \(horarun's environment\) expects a number of seconds" -np 1 "$PROBE"
usage_error "-x '=V': the variable name is empty" -np 1 -x =V "$PROBE"
usage_error "--env 'A B=1': 'A B' is not a variable name" -np 1 --env "A B=1" "$PROBE"
usage_error "-x needs a value" -np 1 -x
# horovodrun's single-dash spellings, in both of argparse's forms; refused flags name why.
usage_error "-np expects an integer from 1 to 1048576, got '0'" -np=0 "$PROBE"
usage_error "not supported by hora: -prefix-timestamp \(" -np 1 -prefix-timestamp "$PROBE"
usage_error "unknown option '--bogus' \(horarun --help lists them\)" -np 1 --bogus "$PROBE"

# --help: exit 0, the usage and the groups on stdout, nothing on stderr.
"$HORARUN" --help >"$WORK/help.out" 2>"$WORK/help.err" || fail "horarun --help exited $?"
[ ! -s "$WORK/help.err" ] || fail "horarun --help wrote to stderr: $(cat "$WORK/help.err")"
for want in "^usage: horarun -np N" "^hosts:$" "^output and failures:$" "^elastic mode \(" \
  "^tuning \(" "^horovodrun's other flags \(" "^  -np, --num-proc N " "^  -cb, --check-build "; do
  grep -qE -- "$want" "$WORK/help.out" || fail "horarun --help: no line '$want'"
done

# -x NAME= exports an empty value; a repeated host adds its slots up (4 ranks fit, 5 do not).
"$HORARUN" -np 4 -H localhost:2,localhost:2 -x HORA_TEST_EMPTY= \
  sh -c 'echo "local=$HORA_LOCAL_RANK/$HORA_LOCAL_SIZE cross=$HORA_CROSS_SIZE empty=[${HORA_TEST_EMPTY-unset}]"' \
  >"$WORK/job.out" 2>"$WORK/job.err" || fail "horarun -np 4 -H localhost:2,localhost:2 failed"
expect_grep "horarun: -H: host 'localhost' is listed 2 times: its slots are added up, 2\+2 = 4" \
  "$WORK/job.err" "no note on the repeated host"
for r in 0 1 2 3; do
  expect_grep "^\[$r\]<stdout>: local=$r/4 cross=1 empty=\[\]$" "$WORK/job.out" "rank $r's identity"
done
usage_error "-np 5 needs 5 slots but the hosts offer 4" -np 5 -H localhost:2,localhost:2 "$PROBE"
echo "usage errors exit 2 with their messages; --help groups the flags; repeated hosts merged"
