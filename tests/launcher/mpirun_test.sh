#!/usr/bin/env bash
# hora under Debian's Open MPI without horarun: mpirun starts 3 copies of the
# example; hora takes rank/size/local rank from OMPI_COMM_WORLD_*, rank 0
# hosts the store at HORA_STORE_ADDR, and every rank converges.
# Skipped when mpirun is missing (scripts/install_deps.sh --mpi installs it).
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || skip "no mpirun (install Open MPI with scripts/install_deps.sh --mpi)"
mpirun --version 2>&1 | grep -q "Open MPI" || skip "mpirun is not Open MPI"
# A claimed port: one drawn at random could be another test's store (ctest -j).
claim_port
port=$CLAIMED_PORT
export HORA_SECRET="mpi-test-$RANDOM$RANDOM"
t0=$(now)
mpirun --allow-run-as-root --oversubscribe -np 3 \
  -x HORA_STORE_ADDR=127.0.0.1 -x HORA_STORE_PORT=$port -x HORA_SECRET \
  "$TRAIN" >"$WORK/mpi.out" 2>"$WORK/mpi.err"
rc=$?
[ $rc -eq 0 ] || fail "mpirun exited $rc"
for r in 0 1 2; do
  expect_grep "^rank $r: converged" "$WORK/mpi.out" "rank $r did not converge under mpirun"
  expect_grep "^rank $r/3 step 59" "$WORK/mpi.out" "rank $r did not see size 3"
done
echo "mpirun -np 3: ok in $(elapsed "$t0") s"
