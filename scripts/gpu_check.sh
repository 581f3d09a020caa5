#!/usr/bin/env bash
# Runs on the GPU host over a copy of the tree with a build folder built on the
# development machine (carried with the call): GPU tests, the example, host
# overhead and prefill benchmarks. Logs go to $OUT (or ./gpu-out).
#   scripts/gpu_check.sh [BUILD_DIR] [tests|bench|all]     (SWEEP=1 adds a tile sweep)
# The GPU tests run one process per test case, JOBS (default 8) at a time,
# sharing one disk cache: most of a case's time is NVRTC on one CPU core, so
# the suite takes about 4 minutes on the H200 host instead of about 30.
# JOBS=1 runs them in one process. SANITIZE=memcheck (or another
# compute-sanitizer tool) runs each case under compute-sanitizer; a case with
# a report fails (exit 99).
set -uo pipefail
build=${1:-build}
what=${2:-all}
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export JITATTN_CACHE_DIR=${JITATTN_CACHE_DIR:-/tmp/jitattn-cache}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

if [[ $what == tests || $what == all ]]; then
  jobs=${JOBS:-8}
  if (( jobs > 1 )) && "$build/tests/jitattn_gpu_tests" -ltc > "$out/gpu_cases.txt" 2>&1; then
    echo "== GPU tests, one process per case, $jobs at a time"
    count=$(grep -vc '^\[doctest\]\|^=*$' "$out/gpu_cases.txt")
    rm -rf "$out/gpu_cases" && mkdir -p "$out/gpu_cases"
    sanitizer=""
    if [[ -n ${SANITIZE:-} ]]; then
      sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer) --tool $SANITIZE"
      sanitizer+=" --error-exitcode 99 --print-limit 30"
    fi
    # doctest's --first/--last count the cases from 1 in file order.
    seq 1 "$count" | BUILD="$build" CASES="$out/gpu_cases" SANITIZER="$sanitizer" xargs -P "$jobs" -I{} bash -c \
      'log=$CASES/$(printf %03d {}).log; $SANITIZER "$BUILD/tests/jitattn_gpu_tests" --first={} --last={} --duration=true > "$log" 2>&1; echo "exit $?" >> "$log"'
    failed=0
    for log in "$out"/gpu_cases/*.log; do
      if ! grep -q '^exit 0$' "$log"; then
        failed=$((failed + 1)); status=1
        grep -h -A6 'ERROR\|^exit\|^========= [A-Z]' "$log" | head -60
      fi
    done
    cat "$out"/gpu_cases/*.log > "$out/gpu_tests.log"
    echo "GPU test cases: $count, failed: $failed; assertions: $(grep -h 'assertions:' "$out"/gpu_cases/*.log \
      | awk '{n += $3; f += $8} END {print n " (" f " failed)"}')" | tee -a "$out/gpu_tests.log"
  else
    echo "== GPU tests"
    "$build/tests/jitattn_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" | tail -25 || status=1
  fi
  echo "== example"
  "$build/examples/attention_example" --seqlen 2048 --causal 2>&1 | tee "$out/example.log" || status=1
  "$build/examples/attention_example" --seqlen 1000 --head-dim 64 --heads 12 --kv-heads 4 --f16 2>&1 | tee -a "$out/example.log" || status=1
fi
if [[ $what == bench || $what == all ]]; then
  echo "== host costs"
  rm -rf /tmp/jitattn-first && export JITATTN_CACHE_DIR=/tmp/jitattn-first
  { "$build/bench/jitattn_bench_host" first-call   # cold: compiles
    "$build/bench/jitattn_bench_host" first-call   # fresh process, warm disk cache
    "$build/bench/jitattn_bench_host" first-call
    "$build/bench/jitattn_bench_host" overhead 10000; } 2>&1 | tee "$out/host.log"
  export JITATTN_CACHE_DIR=/tmp/jitattn-cache
  echo "== compiler resource report of the shipped kernels"
  "$build/bench/jitattn_bench_host" compile sm_90a 2>&1 | tee "$out/resources.log"
  echo "== jitattn tune (separate cache, so the comparison below uses the built-in tiles)"
  JITATTN_CACHE_DIR=/tmp/jitattn-tune "$build/jitattn" tune --dtype bf16 --head-dim 64,128 --seqlen 512,4096 --iters 5 \
      2>&1 | tee "$out/tune.log" || status=1
  echo "== jitattn beside PyTorch SDPA"
  PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --lib "$build/libjitattn.so" --dtype both \
      --json "$out/compare_torch.json" 2>&1 | tee "$out/compare_torch.log" || status=1
  echo "== fused RoPE beside the same attention without it, and beside PyTorch RoPE + FA2"
  PYTHONUNBUFFERED=1 python3 bench/bench_rope.py --lib "$build/libjitattn.so" --json "$out/rope.json" 2>&1 \
      | tee "$out/rope.log" || status=1
  echo "== decoding (forward_kvcache) beside PyTorch's cuDNN and FA2 backends"
  PYTHONUNBUFFERED=1 python3 bench/bench_decode.py --lib "$build/libjitattn.so" --json "$out/decode.json" 2>&1 \
      | tee "$out/decode.log" || status=1
  if [[ -n ${SWEEP:-} ]]; then
    echo "== tile sweep"
    "$build/bench/jitattn_bench_prefill" --dtype ${BENCH_DTYPE:-bf16} --tiles all --iters 10 \
        --json "$out/prefill.json" > "$out/prefill.log" 2>&1 || status=1
    grep -E "best|error" "$out/prefill.log" | head -60
  fi
fi
exit $status
