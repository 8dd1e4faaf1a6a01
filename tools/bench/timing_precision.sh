#!/usr/bin/env bash
# tools/bench/timing_precision.sh [STEP...]: timing precision on small kernels on one GPU
# (docs/PERFORMANCE.md, "Timing precision (issue 41)"), from crucible in BUILD (default build) and
# the pairs under data/ to records in OUT (default runs/bench/timing). Each step runs once: a mark
# file OUT/STEP.done says it is done (remove it to run the step again). Steps (default: all, in
# this order):
#   smoke        one verdict of KernelBench's 19_ReLU against itself, its timing laps shown
#   dev6         data/dev6/pairs.tsv: six released CUDA-L1 kernels, 10 verdicts each
#   self-l1      KernelBench level 1, each task against itself (reference_as_candidate.py)
#   t51-solo     L2_T51's ten pairs alone on the device, one at a time, with the worker's laps
#   hacks        every GPU hack candidate once (tools/bench/gpu_candidates.sh hacks)
#   kb-dev6      KernelBench's own timing of three verdicts of each dev6 kernel
#   before-dev6  the same pairs with one call a sample (evaluator.sample_ms=0)
#   kb-self      KernelBench's own timing of the first 25 level 1 tasks against themselves
#   before-self  the same with one call a sample
# Every step but the first logs to OUT/STEP.log, its stdout to OUT/STEP.out, its rc and time
# to OUT/pipeline.log; dev6 and self-l1 then print tools/bench/band_check.py's reading of their
# records. CONC, WARM: the evaluator's concurrency and warm workers (6, 12). Needs
# data/kernelbench (tools/bench/fetch_kernelbench.sh) and data/dev6 (tools/bench/pick_pairs.py
# data/cuda-l1/3090.json data/dev6 --lines 114,53,109,151,36,40 --repeat 10). Then
# tools/bench/band_check.py OUT/dev6.jsonl (--self for OUT/self-l1.jsonl) and
# tools/bench/compare_timing.py read the records. PYTHON: the interpreter with torch (default
# .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/timing}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
CRUCIBLE="$BUILD/tools/crucible"
SETARGS=(--device cuda:0 --json --set evaluator.concurrency="${CONC:-6}" --set evaluator.warm_workers="${WARM:-12}")
ALL=(smoke dev6 self-l1 t51-solo hacks kb-dev6 before-dev6 kb-self before-self)

step() { # NAME COMMAND...: COMMAND once, logging to OUT/NAME.log
  local name="$1" t0
  shift
  echo "[$(date +%T)] $name: start" >>"$OUT/pipeline.log"
  t0=$(date +%s)
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.log"
  echo "[$(date +%T)] $name: rc $? after $(( $(date +%s) - t0 )) s" >>"$OUT/pipeline.log"
}

absolute() { # DIR: a pairs file's relative paths made absolute (they were relative to DIR)
  awk -F'\t' -v OFS='\t' -v d="$1" '{ for (i = 1; i <= 2; i++) if (substr($i, 1, 1) != "/") $i = d "/" $i; print }'
}

prepare() { # the pair sets of the steps
  "$PYTHON" tools/bench/reference_as_candidate.py data/kernelbench/level1 data/self-l1 >/dev/null
  # The partial pair files live with the records, not in the data folders: on a lent machine a
  # later call that carries data/dev6 again replaces that folder while the steps run.
  grep -v '^#' data/self-l1/pairs.tsv | head -25 | absolute "$ROOT/data/self-l1" >"$OUT/self-l1-25.tsv"
  grep -E '_r[123]\.py$' data/dev6/pairs.tsv | absolute "$ROOT/data/dev6" >"$OUT/dev6-3.tsv"
  grep -E 'L2_T51_' data/dev6/pairs.tsv | absolute "$ROOT/data/dev6" >"$OUT/t51.tsv"
}

steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=("${ALL[@]}")
for s in "${steps[@]}"; do
  [[ " ${ALL[*]} " == *" $s "* ]] || { echo "timing_precision: unknown step '$s' (steps: ${ALL[*]})" >&2; exit 2; }
done
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
prepared=0
for s in "${steps[@]}"; do
  [[ -f "$OUT/$s.done" ]] && continue
  if [[ $s != smoke && $prepared == 0 ]]; then prepare; prepared=1; fi
  case "$s" in
    smoke) # one verdict first, in the open: a broken build shows here
      "$PYTHON" tools/bench/reference_as_candidate.py data/kernelbench/level1 data/self-l1 >/dev/null
      timeout 120 "$CRUCIBLE" eval --task data/kernelbench/level1/19_ReLU.py --candidate data/self-l1/candidates/19_ReLU.py \
        --device cuda:0 --no-cache --verbose 2>&1 | grep -oE "timing: [^;]+|^(message|status) .*|.*(error|Error).*" | cut -c1-600 ;;
    dev6) # each kernel's spread, widest band and coverage
      step dev6 "$CRUCIBLE" eval --pairs data/dev6/pairs.tsv --out "$OUT/dev6.jsonl" --no-cache "${SETARGS[@]}"
      "$PYTHON" tools/bench/band_check.py "$OUT/dev6.jsonl" ;;
    self-l1) # the tasks off 1.00 ± 2% or credited, then the counts
      step self-l1 "$CRUCIBLE" eval --pairs data/self-l1/pairs.tsv --out "$OUT/self-l1.jsonl" "${SETARGS[@]}"
      "$PYTHON" tools/bench/band_check.py "$OUT/self-l1.jsonl" --self ;;
    t51-solo) # alone on the device, one verdict at a time, each with the worker's laps (clock, calls
      # per sample, gate timeouts): whether its spread comes from the other verdicts
      step t51-solo "$CRUCIBLE" eval --pairs "$OUT/t51.tsv" --out "$OUT/t51-solo.jsonl" --no-cache --verbose \
        "${SETARGS[@]}" --set evaluator.concurrency=1 ;;
    hacks) # none may be credited
      step hacks env OUT="$OUT" SIDES=new BUILD="$BUILD" PYTHON="$PYTHON" tools/bench/gpu_candidates.sh hacks ;;
    kb-dev6) step kb-dev6 "$PYTHON" tools/bench/kernelbench_timing.py --pairs "$OUT/dev6-3.tsv" --out "$OUT/kb-dev6.jsonl" --json ;;
    before-dev6) step before-dev6 "$CRUCIBLE" eval --pairs "$OUT/dev6-3.tsv" --out "$OUT/before-dev6.jsonl" --no-cache \
      "${SETARGS[@]}" --set evaluator.sample_ms=0 ;;
    # KernelBench's timing took 22 s a task of level 1 on an H100 (2026-11-25): 25 of them.
    kb-self) step kb-self "$PYTHON" tools/bench/kernelbench_timing.py --pairs "$OUT/self-l1-25.tsv" --out "$OUT/kb-self-l1.jsonl" --json ;;
    before-self) step before-self "$CRUCIBLE" eval --pairs "$OUT/self-l1-25.tsv" --out "$OUT/before-self-l1.jsonl" --no-cache \
      "${SETARGS[@]}" --set evaluator.sample_ms=0 ;;
  esac
  touch "$OUT/$s.done"
done
[[ $prepared == 0 ]] || echo "[$(date +%T)] steps: end" >>"$OUT/pipeline.log"
