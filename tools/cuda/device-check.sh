#!/usr/bin/env bash
# The GPU checks of the CUDA backend, in one run on the GPU machine. Run it from the repository
# root, with .gpu/ from tools/cuda/prepare-device-check.sh carried there:
#   device run: bash .gpu/device-check.sh [--bench]     (carry: [".gpu"]) Logs go to $OUT (default
# ./gpu-out). Each part has its own time limit so one hang cannot eat the device time:
#   1. the device and its libraries (nvidia-smi);
#   2. every op on the GPU against the CPU (cuda_ops) and against PyTorch's values
#      (torch_fixtures on_gpu::*), and the kernel compile check on the device's own NVRTC
#      (cuda_kernels);
#   3. train.device = "cuda" against PyTorch's CPU losses (train_alignment on_gpu::*, and the
#      llama fixtures: train_llama on_gpu::*, grouped-query attention with the key/value heads
#      repeated), dropout and GPU-to-CPU resume (train_device), two data-parallel ranks on one
#      GPU (train_parallel);
#   4. with --bench: GPT-2 small steps, weft beside PyTorch eager (tools/bench/gpu_gpt2.py).
set -uo pipefail
if [ ! -x .gpu/bin/weft ]; then
  echo "run from the repository root, after tools/cuda/prepare-device-check.sh" >&2
  exit 2
fi
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export WEFT_TEST_REPO="$PWD" WEFT_TEST_BIN="$PWD/.gpu/bin/weft" RUST_BACKTRACE=1
summary="$OUT/summary.txt"
: > "$summary"
part() { # name, seconds, command...
  local name=$1 secs=$2
  shift 2
  local t0=$(date +%s)
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s" >> "$summary"
  grep -E "^test result|FAILED|panicked" "$OUT/$name.log" | head -20 >> "$summary"
}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
part cuda_kernels 60 .gpu/bin/cuda_kernels
part cuda_ops 240 .gpu/bin/cuda_ops --test-threads 4
part torch_fixtures_gpu 60 .gpu/bin/torch_fixtures on_gpu
part train_device 120 .gpu/bin/train_device --test-threads 1
part train_alignment_gpu 240 .gpu/bin/train_alignment on_gpu --test-threads 2
part train_llama_gpu 120 .gpu/bin/train_llama on_gpu --test-threads 1
part train_parallel_gpu 120 .gpu/bin/train_parallel gpt_adamw_at_dp_2_on_one_gpu
if [ "${1:-}" = "--bench" ]; then
  part gpu_gpt2 300 python3 tools/bench/gpu_gpt2.py --weft .gpu/bin/weft --out "$OUT/gpu_gpt2"
  cat "$OUT/gpu_gpt2.log" >> "$summary"
fi
cat "$summary"
