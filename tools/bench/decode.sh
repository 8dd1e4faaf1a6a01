#!/usr/bin/env bash
# tools/bench/decode.sh: decode throughput on one GPU (docs/PERFORMANCE.md, "Decode throughput"),
# from bench_decode and the GPU tests in BUILD (default build) to OUT (default runs/bench/decode).
# The decoding kernels' and the engine's GPU tests (DECODE_TESTS: test_gpu_kernels' cases, default
# *), then tools/bench/decode_compare.py --rounds 3 on a random Qwen2.5-0.5B-shaped bf16 model,
# 512-token prompts and 512 new tokens, greedy, at DECODE_BATCHES (1,16,64), for each engine variant
# of DECODE_KERNELS (small,small_gate_up_warps; `small` is the default engine) beside transformers'
# generate (DECODE_HF=--skip-hf leaves it out), then the traced batch-1 step of each variant
# (trace_steps.py). Output: OUT/decode.json, decode.txt, trace_steps.txt. PYTHON: the interpreter
# with torch and transformers (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/decode}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible bench_decode test_gpu_engine test_gpu_kernels >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
kernels="${DECODE_KERNELS:-small,small_gate_up_warps}"
timeout 300 "$BUILD/tests/gpu/test_gpu_kernels" -tc="${DECODE_TESTS:-*}" -tce='*persistent*' 2>&1 | tee "$OUT/gpu_kernels.txt" |
  grep -E "ERROR|FATAL|test cases|assertions" | tail -30
timeout 300 "$BUILD/tests/gpu/test_gpu_engine" > "$OUT/gpu_engine.txt" 2>&1
grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
# Three passes, each starting one variant later; each variant's median pass is shown.
# shellcheck disable=SC2086 # DECODE_HF is an option or nothing
"$PYTHON" tools/bench/decode_compare.py --build "$BUILD" --device cuda:0 --batches "${DECODE_BATCHES:-1,16,64}" --prompt 512 \
  --new 512 --rounds 3 --kernels "$kernels" ${DECODE_HF:-} --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt"
# Where each variant's batch-1 step goes: LibTorch's profiler over one call, the kernels of the
# median step; the traces themselves stay behind.
"$BUILD/tools/bench/bench_decode" --model /tmp/crucible-decode-0.5b --device cuda:0 --batches 1 --prompt 512 --new 64 \
  --kernels "$kernels" --trace "$OUT/trace" > "$OUT/trace.txt" 2>&1
for f in "$OUT"/trace-*.json; do "$PYTHON" tools/bench/trace_steps.py "$f"; rm -f "$f"; done 2>&1 | tee "$OUT/trace_steps.txt"
