#!/usr/bin/env bash
# The GPU checks of the GPU path (docs/gpu.md) in two steps, for the GPU machine
# described in ../shared/device/README.md (it has CUDA, NCCL and GoogleTest but
# not Gloo, so the build is made here and carried there):
#
#   scripts/gpu_check.sh build   here: Release build with the CUDA plugin in
#                                build-gpu/ (only what the checks need) and the
#                                libraries that machine lacks in .device-libs/
#   scripts/gpu_check.sh run     there: every gpu test binary, compute-sanitizer
#                                (memcheck, racecheck, synccheck, initcheck)
#                                over the plugin's kernel tests, and the fusion
#                                benchmark, hora.torch with CUDA tensors, hora.jax;
#                                logs in $OUT (or gpu-check-logs/)
#   scripts/gpu_check.sh bench   there: hora's allreduce vs ncclAllReduce at
#                                world size 1, hora.torch vs DDP training step
#
# e.g. through the device tool: carry build-gpu and .device-libs, command
# "bash scripts/gpu_check.sh run". Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:-}

build() {
  set -e
  scripts/install_deps.sh >/dev/null
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHORA_WITH_CUDA=ON \
    -DHORA_BUILD_LAUNCHER=OFF -DHORA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target hora hora_cuda hora_gpu_cuda_plugin_test \
    hora_gpu_fusion_emulation_test hora_gpu_runtime_test gpu-fusion-bench gpu-allreduce-bench
  rm -rf .device-libs
  bash ../shared/device/pack-libs.sh build-gpu .device-libs >/dev/null
  du -sh build-gpu .device-libs
}

run() {
  local out=${OUT:-gpu-check-logs} failed=0
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$PWD/.device-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
  local t
  for t in hora_gpu_fusion_emulation_test hora_gpu_cuda_plugin_test hora_gpu_runtime_test; do
    if ! timeout 240 "build-gpu/tests/$t" >"$out/$t.log" 2>&1; then
      echo "FAILED: $t (see $out/$t.log)"
      failed=1
    fi
    grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | sed "s/^/$t: /"
  done
  # hora.torch with CUDA tensors (tests/python/test_torch_cuda.py) and hora.jax
  # (tests/python/test_jax.py, CPU and GPU arrays): NCCL at world size 1,
  # staging with 2 ranks sharing the GPU. That machine's python3 has a CUDA
  # torch, JAX and pytest; libhora and the plugin come from build-gpu.
  local py lib plugin
  py=$(command -v python3)
  lib=$(find build-gpu -name 'libhora.so' | head -n 1)
  plugin=$(find build-gpu -name 'libhora_cuda.so' | head -n 1)
  if ! PYTHONPATH="$PWD/bindings/python" HORA_LIBRARY="$PWD/$lib" HORA_GPU_PLUGIN="$PWD/$plugin" \
    HORA_TEST_PYTHON="$py" XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 360 "$py" -m pytest -v \
    -p no:cacheprovider tests/python/test_torch_cuda.py tests/python/test_jax.py \
    >"$out/test_python_gpu.log" 2>&1; then
    echo "FAILED: tests/python/test_torch_cuda.py or test_jax.py (see $out/test_python_gpu.log)"
    failed=1
  fi
  grep -E 'PASSED|FAILED|SKIPPED|ERROR|passed|failed' "$out/test_python_gpu.log" | tail -n 24
  local cs
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ -x "$cs" ]]; then
    local tool
    for tool in memcheck racecheck synccheck initcheck; do
      if ! timeout 150 "$cs" --tool "$tool" --error-exitcode 99 \
        build-gpu/tests/hora_gpu_cuda_plugin_test --gtest_filter='CudaPluginTest.*' \
        >"$out/sanitizer-$tool.log" 2>&1; then
        echo "FAILED: compute-sanitizer --tool $tool (see $out/sanitizer-$tool.log)"
        failed=1
      fi
      tail -n 2 "$out/sanitizer-$tool.log" | sed "s/^/sanitizer $tool: /"
    done
  else
    echo "FAILED: compute-sanitizer not found"
    failed=1
  fi
  if ! build-gpu/bench/gpu-fusion-bench >"$out/gpu-fusion-bench.txt" 2>&1; then
    echo "FAILED: gpu-fusion-bench (see $out/gpu-fusion-bench.txt)"
    failed=1
  fi
  cat "$out/gpu-fusion-bench.txt"
  return $failed
}

# The GPU benchmarks of issue 19 beyond the fusion kernels, one run each:
# hora's allreduce against a direct ncclAllReduce at world size 1, and a
# ResNet-50 training step with hora.torch's DistributedOptimizer against DDP.
bench() {
  local out=${OUT:-gpu-check-logs} failed=0 py lib plugin
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$PWD/.device-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  py=$(command -v python3)
  lib=$(find build-gpu -name 'libhora.so' | head -n 1)
  plugin=$(find build-gpu -name 'libhora_cuda.so' | head -n 1)
  if ! HORA_GPU_PLUGIN="$PWD/$plugin" timeout 240 build-gpu/bench/gpu-allreduce-bench \
    >"$out/gpu-allreduce-bench.txt" 2>&1; then
    echo "FAILED: gpu-allreduce-bench (see $out/gpu-allreduce-bench.txt)"
    failed=1
  fi
  cat "$out/gpu-allreduce-bench.txt"
  if ! PYTHONPATH="$PWD/bindings/python" HORA_LIBRARY="$PWD/$lib" HORA_GPU_PLUGIN="$PWD/$plugin" \
    PYTHONUNBUFFERED=1 timeout 300 "$py" bench/torch_gpu_vs_ddp.py >"$out/torch_gpu_vs_ddp.txt" 2>&1; then
    echo "FAILED: bench/torch_gpu_vs_ddp.py (see $out/torch_gpu_vs_ddp.txt)"
    failed=1
  fi
  cat "$out/torch_gpu_vs_ddp.txt"
  return $failed
}

case "$step" in
  build) build ;;
  run) run ;;
  bench) bench ;;
  *)
    echo "usage: scripts/gpu_check.sh build|run|bench" >&2
    exit 2
    ;;
esac
