#!/usr/bin/env bash
# device_cpu_bench.sh: hora against Open MPI on the GPU machine's 16 CPU cores
# (../shared/device/README.md), where every rank has a core of its own, in
# two steps like scripts/gpu_check.sh:
#
#   bench/device_cpu_bench.sh pack   here: stripped bench binaries and libhora
#                                    from BUILD_DIR (default build/) into
#                                    .benchpack/, with the libraries that
#                                    machine lacks (its own Open MPI is used)
#   bench/device_cpu_bench.sh run    there (carry .benchpack): the allreduce
#                                    sweep (shm_negotiation_bench.sh, 2/4/8
#                                    ranks, HORA_AUTOTUNE=0), the ResNet-50 step
#                                    (resnet50_vs_mpi.sh, defaults) and the
#                                    interleaved send/recv ping-pong; logs in $OUT
#
# The MPI peers are rebuilt there with its mpicc when it has one. Results:
# bench/results/2026-11-27-sixteen-cores-vs-mpi.md.
set -u
cd "$(dirname "$0")/.."
P=$PWD/.benchpack
B=$P/build
case "${1:-}" in
  pack)
    set -e
    src=${BUILD_DIR:-build}
    rm -rf "$P"
    mkdir -p "$B/bench" "$B/bindings/c" "$P/libs"
    for b in hora-bench hora-negotiation-probe mpi-allreduce-bench mpi-p2p-bench hora-mpi-p2p-bench; do
      strip -o "$B/bench/$b" "$src/bench/$b"
    done
    cp -P "$src"/bindings/c/libhora.so* "$B/bindings/c/"
    strip "$B"/bindings/c/libhora.so.*.*
    bash ../shared/device/pack-libs.sh "$B" "$P/all-libs" >/dev/null
    # Not the MPI stack: the binaries load that machine's own Open MPI.
    find "$P/all-libs" -type f ! -name 'libmpi*' ! -name 'libopen-*' ! -name 'libevent*' \
      ! -name 'libhwloc*' ! -name 'libhora*' -exec mv {} "$P/libs/" \;
    rm -rf "$P/all-libs"
    du -sh "$P"
    ;;
  run)
    O=${OUT:-device-cpu-bench-logs}
    mkdir -p "$O"
    export LD_LIBRARY_PATH=$P/libs:$B/bindings/c${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} BUILD_DIR=$B
    { nproc; lscpu | grep -E "Model name|Core|Socket|L3"; mpirun --version | head -n 1; } | tee "$O/machine.txt"
    if command -v mpicc >/dev/null; then
      mpicc -O2 -o "$B/bench/mpi-allreduce-bench" bench/mpi_allreduce_bench.c
      mpicc -O2 -Ibench -o "$B/bench/mpi-p2p-bench" bench/mpi_p2p_bench.c
    fi
    echo "== allreduce sweep (HORA_AUTOTUNE=0)"
    HORA_AUTOTUNE=0 timeout 150 bash bench/shm_negotiation_bench.sh -reps 2 -np "2 4 8" \
      -sizes "4 1024 65536 1048576 4194304 16777216" -variants "hora" >"$O/sweep.txt" 2>&1
    grep -v '^RAW' "$O/sweep.txt" | tail -n 24
    echo "== ResNet-50 step (defaults)"
    timeout 200 bash bench/resnet50_vs_mpi.sh -reps 2 -np "2 4 8" -steps 10 >"$O/resnet.txt" 2>&1
    tail -n 8 "$O/resnet.txt"
    echo "== send/recv ping-pong, hora and MPI interleaved"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    timeout 60 mpirun "${root[@]}" -np 2 --bind-to core --mca pml ob1 --mca btl self,vader \
      -x HORA_STORE_ADDR=127.0.0.1 -x HORA_STORE_PORT="$port" -x HORA_SECRET=x -x LD_LIBRARY_PATH \
      "$B/bench/hora-mpi-p2p-bench" --sizes 4,32,1K >"$O/p2p.txt" 2>&1
    tail -n 8 "$O/p2p.txt"
    ;;
  *)
    echo "usage: bench/device_cpu_bench.sh pack|run" >&2
    exit 2
    ;;
esac
