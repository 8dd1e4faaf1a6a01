#!/usr/bin/env bash
# tools/bench/boundary_gpu.sh [STEP...]: the trust boundary's CUDA figures on one GPU
# (docs/PERFORMANCE.md, "The reward's trust boundary"), from crucible and test_gpu_evaluator in
# BUILD (default build) to logs and records in OUT (default runs/bench/boundary_gpu). Steps
# (default: all, in this order):
#   fast      two fast GPU-suite variants across the boundary, --verbose: the
#             verdicts and their sample laps (OUT/err_VARIANT.log)
#   test      test_gpu_evaluator's case that runs the CPU suite's tasks on CUDA
#   identity  the CPU suite's references against themselves on cuda:0 (reference_as_candidate.py),
#             cuda_boundary true then false (IDENTITY_MODES): OUT/selfc_MODE.jsonl, one line a
#             verdict, each mode's wall time, then band_check.py --self
#   kb        KernelBench's level 1 tasks KB_FROM (1) to KB_TASKS (26), by their leading number
#             (or those KB_LIST names, e.g. "4 5 19"), against themselves, cuda_boundary true (KB_MODES): OUT/selfkb_MODE.jsonl, then
#             band_check.py --self. Needs data/kernelbench (tools/bench/fetch_kernelbench.sh)
#   pairs     the pairs of PAIRS (a --pairs file, default data/l1sub/pairs.tsv: CUDA-L1's released
#             kernels) on cuda:0, cuda_boundary true then false (PAIRS_MODES): OUT/pairs_MODE.jsonl
#             (records), OUT/pairs_MODE.json (summary), each mode's wall time
#   hacks     each hack of tests/candidates/boundary and tests/candidates/gpu/boundary (or the
#             files of HACKS) on its task on cuda:0, cuda_boundary false then true (HACK_MODES):
#             OUT/hacks.jsonl, one line a verdict (file, mode, status, speedup, checks, wall time)
# Every step runs with evaluator.cuda_mps=off (the default was off when its figures were taken).
# A mode `false` (cuda_boundary false: the shared path, one worker for the reference and the
# candidate) runs SHARED_CRUCIBLE, a crucible built from a tree before the shared path was removed
# (its last commit 288dd5a; tools/bench/mps_boundary.sh --help), and is passed over without it.
# EVAL_ARGS: more `crucible eval` options for the identity, kb, pairs and hacks steps (e.g.
# "--set evaluator.cuda_mps=on": the boundary under MPS with the evaluator's device agent).
# CRUCIBLE and TEST_GPU_EVALUATOR: binaries built earlier (no build then); TEST_CASES: the test
# step's cases (doctest -tc, default its CPU-suite case), TEST_TIMEOUT_S its limit (200).
# PYTHON: the interpreter with torch (default .venv/bin/python, else python3). On a lent machine:
# tools/bench/gpu_session.sh boundary [STEP...].
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/boundary_gpu}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
STEPS=("$@")
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=(fast test identity kb pairs hacks)
for step in "${STEPS[@]}"; do
  case "$step" in fast | test | identity | kb | pairs | hacks) ;; *) echo "boundary_gpu: unknown step $step" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
start=$(date +%s)
if [[ -z ${CRUCIBLE:-} ]]; then
  CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible test_gpu_evaluator >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "boundary_gpu: build $(( $(date +%s) - start )) s"
fi
echo "boundary_gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
C="${CRUCIBLE:-$BUILD/tools/crucible}"
crucible_for() { # MODE: the binary of a cuda_boundary mode, or nothing (the shared path without SHARED_CRUCIBLE)
  if [[ $1 == false ]]; then
    [[ -x ${SHARED_CRUCIBLE:-} ]] && echo "$SHARED_CRUCIBLE"
  else
    echo "$C"
  fi
}
passed_over() { echo "cuda_boundary=$1: passed over: the shared path needs SHARED_CRUCIBLE (--help)"; }
T="${TEST_GPU_EVALUATOR:-$BUILD/tests/gpu/test_gpu_evaluator}"
for step in "${STEPS[@]}"; do
  start=$(date +%s)
  case "$step" in
    fast)
      for pair in level2/04_layernorm_manual_fp32:fast_functional level2/08_diag_matmul_fp32:fast_broadcast; do
        t=${pair%%:*}; v=${pair##*:}
        echo "== $t $v"
        timeout 90 "$C" eval --task "env/tasks/gpu/$t.py" --candidate "env/tasks/gpu/variants/$t/$v.py" --device cuda:0 --set evaluator.cuda_mps=off \
          --json --no-cache --verbose 2> "$OUT/err_$v.log" | cut -c1-300
        grep -E "floor|laps|rror" "$OUT/err_$v.log" | tail -3 | cut -c1-300
      done ;;
    test)
      timeout "${TEST_TIMEOUT_S:-200}" "$T" -s -tc="${TEST_CASES:-CPU-suite tasks on CUDA*}" > "$OUT/t_suite.log" 2>&1
      echo "test rc=$?"
      grep -E "MESSAGE|test cases" "$OUT/t_suite.log" | sed 's/.*MESSAGE: //' | grep -v "^host" | cut -c1-200 ;;
    identity)
      "$PYTHON" tools/bench/reference_as_candidate.py env/tasks/cpu /tmp/selfc 2>/dev/null
      for mode in ${IDENTITY_MODES:-true false}; do
        s=$(date +%s)
        bin=$(crucible_for "$mode") || { passed_over "$mode"; continue; }
        rm -f "$OUT/selfc_$mode.jsonl"
        timeout 200 "$bin" eval --pairs /tmp/selfc/pairs.tsv --device cuda:0 --set evaluator.cuda_mps=off --no-cache --json \
          --set evaluator.cuda_boundary="$mode" ${EVAL_ARGS:-} --out "$OUT/selfc_$mode.jsonl" > /dev/null 2> "$OUT/selfc_$mode.err"
        echo "identity cuda_boundary=$mode rc=$? $(( $(date +%s) - s )) s"
        "$PYTHON" tools/bench/band_check.py "$OUT/selfc_$mode.jsonl" --self 2>&1 | tail -4
      done ;;
    kb)
      "$PYTHON" tools/bench/reference_as_candidate.py data/kernelbench/level1 /tmp/selfkb >/dev/null
      if [[ -n ${KB_LIST:-} ]]; then
        grep -v '^#' /tmp/selfkb/pairs.tsv | awk -F'\t' -v list=" $KB_LIST " '{ n = $1; sub(/.*\//, "", n); sub(/_.*/, "", n); if (index(list, " " n " ")) print }' >/tmp/selfkb/first.tsv
      else
        grep -v '^#' /tmp/selfkb/pairs.tsv | head -"${KB_TASKS:-26}" | tail -n +"${KB_FROM:-1}" >/tmp/selfkb/first.tsv
      fi
      for mode in ${KB_MODES:-true}; do
        s=$(date +%s)
        bin=$(crucible_for "$mode") || { passed_over "$mode"; continue; }
        rm -f "$OUT/selfkb_$mode.jsonl"
        timeout "${KB_TIMEOUT_S:-900}" "$bin" eval --pairs /tmp/selfkb/first.tsv --device cuda:0 --set evaluator.cuda_mps=off --no-cache --json \
          --set evaluator.cuda_boundary="$mode" ${EVAL_ARGS:-} --out "$OUT/selfkb_$mode.jsonl" > /dev/null 2> "$OUT/selfkb_$mode.err"
        echo "kb cuda_boundary=$mode rc=$? $(( $(date +%s) - s )) s"
        "$PYTHON" tools/bench/band_check.py "$OUT/selfkb_$mode.jsonl" --self 2>&1 | tail -8
      done ;;
    pairs)
      for mode in ${PAIRS_MODES:-true false}; do
        s=$(date +%s)
        bin=$(crucible_for "$mode") || { passed_over "$mode"; continue; }
        rm -f "$OUT/pairs_$mode.jsonl"
        timeout "${PAIRS_TIMEOUT_S:-600}" "$bin" eval --pairs "${PAIRS:-data/l1sub/pairs.tsv}" --device cuda:0 --set evaluator.cuda_mps=off --no-cache --json \
          --set evaluator.cuda_boundary="$mode" ${EVAL_ARGS:-} --out "$OUT/pairs_$mode.jsonl" > "$OUT/pairs_$mode.json" 2> "$OUT/pairs_$mode.err"
        echo "pairs cuda_boundary=$mode rc=$? $(( $(date +%s) - s )) s"
        "$PYTHON" -c 'import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        print(r["pair"], r["task"], r["status"], r.get("speedup"), r.get("wall_s"), ",".join(r.get("checks_failed") or []))' \
          "$OUT/pairs_$mode.jsonl" 2>&1 | cut -c1-200
      done ;;
    hacks)
      rm -f "$OUT/hacks.jsonl"
      # shellcheck disable=SC2086 # HACKS and EVAL_ARGS are lists
      for f in ${HACKS:-tests/candidates/boundary/hack_*.py tests/candidates/gpu/boundary/hack_*.py}; do
        task="$(sed -n 's/^# task:[[:space:]]*//p' "$f" | head -1)"
        for mode in ${HACK_MODES:-false true}; do
          bin=$(crucible_for "$mode") || { passed_over "$mode"; continue; }
          timeout 300 "$bin" eval --task "$task" --candidate "$f" --device cuda:0 --set evaluator.cuda_mps=off --json --no-cache \
            --set evaluator.cuda_boundary="$mode" ${EVAL_ARGS:-} 2>>"$OUT/hacks.err" |
            "$PYTHON" -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"candidate": sys.argv[1], "cuda_boundary": sys.argv[2], "status": v["status"],
                          "speedup": v["speedup"], "checks": v["checks_failed"], "wall_s": v.get("wall_s"),
                          "message": v["message"][:240]}))' "$(basename "$f")" "$mode" | tee -a "$OUT/hacks.jsonl" | cut -c1-260
        done
      done ;;
  esac
  echo "boundary_gpu: $step $(( $(date +%s) - start )) s"
done
