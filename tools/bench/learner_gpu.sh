#!/usr/bin/env bash
# tools/bench/learner_gpu.sh grpo|dp|allreduce: the learner's GPU figures (docs/PERFORMANCE.md,
# "Learners"), from bench_learner and the GPU tests in BUILD (default build) to OUT (default
# runs/bench/learner), the GPU tests first.
#   grpo       one GPU: the training kernels' GPU tests, bench_learner --figures matmul,grpo with the
#              fused kernels and LibTorch's in both orders, then one update under the profiler (its
#              longest operators and kernels, device time by kind). Output: OUT/grpo.jsonl.
#   dp         every GPU (two or more): test_gpu_dp, then bench_learner --figures
#              matmul,grpo,scaling,sync (weight sync: cuda:0 to cuda:1). Output: OUT/dp.jsonl.
#   allreduce  every GPU (two or more): bench_learner's all-reduce of 25 and 100 MB, the same with
#              NCCL_COMM_BLOCKING=1, and tools/bench/allreduce_torch.py (torch.distributed on the same
#              NCCL), twice each; then test_gpu_dp. Output: OUT/allreduce.jsonl.
# PYTHON: the interpreter with torch (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/learner}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
B="$BUILD"
mkdir -p "$OUT"

build() { # TARGET...
  CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh "$@" >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
}

case "${1:-}" in
  grpo)
    # The GRPO update alone needs neither the CLI nor the NCCL tests.
    build bench_learner test_gpu_kernels
    [[ -x $B/tests/gpu/test_gpu_kernels ]] && timeout 300 "$B/tests/gpu/test_gpu_kernels" -tc='*log-softmax*,*training forward*,*silu_mul_pair*' 2>&1 |
      tee "$OUT/gpu_kernels_train.txt" | grep -E "worst|ERROR|FAIL|test cases|assertions" | tail -40
    for heads in fused,libtorch libtorch,fused; do
      timeout 300 "$B/tools/bench/bench_learner" --figures matmul,grpo --kernels $heads 2>&1 | tee -a "$OUT/grpo.jsonl"
    done
    # One more update under the profiler: its longest operators and kernels, and device time by kind.
    timeout 300 "$B/tools/bench/bench_learner" --figures grpo --steps 2 --trace /tmp/grpo-trace.json 2>&1 \
      | tee -a "$OUT/grpo.jsonl" | "$PYTHON" -c 'import json,sys
for line in sys.stdin:
    try: r = json.loads(line)
    except ValueError: print(line.rstrip()); continue
    if r.get("figure") != "grpo_profile": print(line.rstrip()); continue
    print("device ms", round(r["device_ms"], 1))
    kinds = {}
    for t in r["top"]:
        if t["device"] != "cuda": continue
        n = t["name"]
        k = ("gemm" if any(w in n for w in ("nvjet", "gemm", "cutlass", "xmma")) else "attention" if any(w in n for w in ("sdpa", "flash", "fmha"))
             else "crucible" if "crucible" in n else "other")
        kinds[k] = kinds.get(k, 0) + t["total_ms"]
    print("device ms by kind:", {k: round(v, 1) for k, v in sorted(kinds.items())})
    for t in r["top"][:45]: print("%9.2f ms %6d  %-4s %s" % (t["total_ms"], t["count"], t["device"], t["name"][:110]))' ;;
  dp)
    # The data-parallel tests over NCCL, then one GPU's GRPO update (both kernel choices) and
    # data-parallel scaling on every GPU with the fused kernels, and weight sync.
    build crucible bench_learner test_gpu_dp
    timeout 300 "$B/tests/gpu/test_gpu_dp" 2>&1 | tail -20 | tee "$OUT/gpu_dp.txt"
    timeout 400 "$B/tools/bench/bench_learner" --figures matmul,grpo,scaling,sync --kernels libtorch,fused 2>&1 | tee "$OUT/dp.jsonl" ;;
  allreduce)
    # The gradient all-reduce alone, side by side: our communicator, the same with
    # NCCL_COMM_BLOCKING=1, and torch.distributed, twice over; then the DP tests.
    build crucible bench_learner test_gpu_dp
    for _ in 1 2; do
      "$B/tools/bench/bench_learner" --figures allreduce --sizes-mb 25,100 2>&1 | tee -a "$OUT/allreduce.jsonl"
      NCCL_COMM_BLOCKING=1 "$B/tools/bench/bench_learner" --figures allreduce --sizes-mb 25,100 2>&1 \
        | sed 's/"crucible-nccl"/"crucible-nccl-blocking"/' | tee -a "$OUT/allreduce.jsonl"
      timeout 300 "$PYTHON" tools/bench/allreduce_torch.py --sizes-mb 25,100 2>&1 | tee -a "$OUT/allreduce.jsonl"
    done
    timeout 300 "$B/tests/gpu/test_gpu_dp" 2>&1 | tail -20 | tee "$OUT/gpu_dp.txt" ;;
  *) echo "usage: tools/bench/learner_gpu.sh grpo|dp|allreduce (--help)" >&2; exit 2 ;;
esac
