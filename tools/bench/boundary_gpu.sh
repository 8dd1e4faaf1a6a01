#!/usr/bin/env bash
# tools/bench/boundary_gpu.sh [STEP...]: on a GPU machine (docs/building.md), the trust boundary's
# CUDA figures (docs/PERFORMANCE.md, "The reward's trust boundary"). Builds crucible and
# test_gpu_evaluator in $BUILD (default /root/bg, outside the checkout so that it survives between
# calls on a warm machine) and writes logs and records under $OUT (default ./gpu-out). Steps
# (default: all, in this order):
#   fast      two fast GPU-suite variants with evaluator.cuda_boundary=true, --verbose: the
#             verdicts and their sample laps (err_VARIANT.log)
#   test      test_gpu_evaluator's case that runs the CPU suite's tasks on CUDA in every mode
#   identity  the CPU suite's references against themselves on cuda:0 (reference_as_candidate.py),
#             cuda_boundary true then false (IDENTITY_MODES): selfc_MODE.jsonl, one line a verdict below
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/gpu-out}"
BUILD="${BUILD:-/root/bg}"
mkdir -p "$OUT"
source <(sed -n '/^setup() {/,/^}/p;/^configure() {/,/^}/p' tools/bench/gpu_session.sh)
PREFIX="$ROOT/.deps/prefix/usr"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
setup
configure "$ROOT" "$BUILD" "$OUT/configure.log" || { tail -20 "$OUT/configure.log"; exit 1; }
start=$(date +%s)
cmake --build "$BUILD" -j "$(nproc)" --target crucible test_gpu_evaluator > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "boundary_gpu: build $(( $(date +%s) - start )) s; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
C="$BUILD/tools/crucible"
STEPS=("$@")
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=(fast test identity)
for step in "${STEPS[@]}"; do
  start=$(date +%s)
  case "$step" in
    fast)
      for pair in level2/04_layernorm_manual_fp32:fast_functional level2/08_diag_matmul_fp32:fast_broadcast; do
        t=${pair%%:*}; v=${pair##*:}
        echo "== $t $v"
        timeout 90 "$C" eval --task "env/tasks/gpu/$t.py" --candidate "env/tasks/gpu/variants/$t/$v.py" --device cuda:0 \
          --json --no-cache --verbose --set evaluator.cuda_boundary=true 2> "$OUT/err_$v.log" | cut -c1-300
        grep -E "floor|laps|rror" "$OUT/err_$v.log" | tail -3 | cut -c1-300
      done ;;
    test)
      timeout 200 "$BUILD/tests/gpu/test_gpu_evaluator" -s -tc="CPU-suite tasks on CUDA*" > "$OUT/t_suite.log" 2>&1
      echo "test rc=$?"
      grep -E "MESSAGE|test cases" "$OUT/t_suite.log" | sed 's/.*MESSAGE: //' | grep -v "^host" | cut -c1-200 ;;
    identity)
      python3 tools/bench/reference_as_candidate.py env/tasks/cpu /tmp/selfc 2>/dev/null
      for mode in ${IDENTITY_MODES:-true false}; do
        s=$(date +%s)
        rm -f "$OUT/selfc_$mode.jsonl"
        timeout 200 "$C" eval --pairs /tmp/selfc/pairs.tsv --device cuda:0 --no-cache --json \
          --set evaluator.cuda_boundary=$mode --out "$OUT/selfc_$mode.jsonl" > /dev/null 2> "$OUT/selfc_$mode.err"
        echo "identity cuda_boundary=$mode rc=$? $(( $(date +%s) - s )) s"
        python3 tools/bench/band_check.py "$OUT/selfc_$mode.jsonl" --self 2>&1 | tail -4
      done ;;
    *) echo "boundary_gpu: unknown step $step" >&2; exit 2 ;;
  esac
  echo "boundary_gpu: $step $(( $(date +%s) - start )) s"
done
