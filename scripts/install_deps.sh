#!/usr/bin/env bash
# Installs the Debian packages hora needs to build and test, when missing.
# Idempotent: does nothing (and needs no root) when everything is present.
#
# Usage: scripts/install_deps.sh          build and test dependencies
#        scripts/install_deps.sh --mpi    also Open MPI (openmpi-bin, libopenmpi-dev, ~15
#                                         packages), for tests/launcher/mpirun_test.sh (skipped
#                                         without it) and bench/p2p_bench.sh's MPI peer
#        scripts/install_deps.sh --python also Debian's python3-torch, python3-numpy and
#                                         python3-pytest for the Python binding (tests/python),
#                                         python3-matplotlib for the plotting scripts
#                                         (scripts/render_timeline.py, bench/plot_results.py),
#                                         python3-yaml (tests/python/test_k8s_manifests.py), and
#                                         python3-venv, -pip, -wheel, -setuptools and patchelf for
#                                         the wheel (scripts/build_wheel.sh, tests/install/wheel_test.sh)
#        scripts/install_deps.sh --slurm  also Slurm (slurm-wlm: slurmctld, slurmd, srun; ~7
#                                         packages with munge), for tests/launcher/slurm_test.sh,
#                                         which starts a one-node cluster of its own (skipped
#                                         without it). The packages' own services stay unconfigured.
set -euo pipefail

# iproute2 (`ip netns`, `tc`) and util-linux (`unshare`, `nsenter`): the multi-host launcher
# tests and the test bed bench/netns_bed.sh.
# libcli11-dev: horarun's command-line parser (header-only, build time only).
PACKAGES=(cmake ninja-build g++ make pkg-config libgloo-dev libboost-dev libgtest-dev libdlpack-dev
  libssl-dev libcli11-dev
  iproute2 util-linux)
for arg in "$@"; do
  case "$arg" in
    --mpi) PACKAGES+=(openmpi-bin libopenmpi-dev) ;;
    --python) PACKAGES+=(python3-torch python3-numpy python3-pytest python3-matplotlib python3-yaml
      python3-venv python3-pip python3-wheel python3-setuptools patchelf) ;;
    --slurm) PACKAGES+=(slurm-wlm) ;;
    *) echo "install_deps.sh: unknown option '$arg' (--mpi, --python, --slurm)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "hora: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    SUDO="sudo"
  else
    echo "hora: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
