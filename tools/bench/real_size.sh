#!/usr/bin/env bash
# tools/bench/real_size.sh: real-size policies on one GPU (docs/PERFORMANCE.md, "Real-size
# policies"), from crucible, bench_decode and bench_learner in BUILD (default build) to run folders,
# logs and JSON in OUT (default runs/bench/real_size). Each step logs to OUT/STEP.log, its rc and
# time to OUT/pipeline.log. First the disk's own rate (dd, 8 GiB, O_DIRECT). Then, for each SIZE of
# SIZES (default "1.5b 7b-lora"), configs/gpu-SIZE.yaml to its end, or paused after N learner steps
# and resumed for a SIZE:N of PAUSES (default "7b-lora:15"), the device's memory sampled each
# second meanwhile (OUT/gpu-SIZE.smi.csv). Then, for each SIZE of BENCH_SIZES (default SIZES), on
# the run's model (made by init-model when no run of that size is there; SIZES="" runs none):
# decoding (bench_decode against decode_hf.py, 8 rows, 4096 + 512), a learner update (bench_learner
# against hf_real_size.py, 8 sequences of 4096 + 2048 tokens, activation checkpointing) and
# checkpoint I/O, model alone and whole training state, cold reads. The 1.5B fits a GPU of 80 GB;
# the 7B LoRA config was run on 141 GB. PYTHON: the interpreter with torch, transformers and peft
# (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/real_size}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
B="$BUILD"
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible bench_decode bench_learner >>"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }

real_step() { # NAME COMMAND...: one step, its output in OUT/NAME.log, its rc and time in OUT/pipeline.log
  local name="$1" start rc
  shift
  start=$(date +%s)
  echo "[$(date +%T)] $name: start" >>"$OUT/pipeline.log"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "[$(date +%T)] $name: rc $rc in $(( $(date +%s) - start )) s" >>"$OUT/pipeline.log"
}

real_preset() { # SIZE: the init-model preset and bench_learner's LoRA flag of a size
  case "$1" in
    1.5b) echo "qwen2.5-coder-1.5b-instruct" ;;
    7b-lora) echo "qwen2.5-coder-7b-instruct --lora" ;;
    *) return 1 ;;
  esac
}

# The runs first (the issue's figures), then the side-by-side benches. The disk's own rate, the
# limit under both sides' checkpoint figures: 8 GiB written with O_DIRECT, then read back.
real_step disk bash -c "dd if=/dev/zero of=$OUT/dd.bin bs=16M count=512 oflag=direct conv=fsync 2>&1 | tail -1;
  dd if=$OUT/dd.bin of=/dev/null bs=16M iflag=direct 2>&1 | tail -1; rm -f $OUT/dd.bin"
for size in ${SIZES-1.5b 7b-lora}; do
  name="gpu-$size"
  real_preset "$size" >/dev/null || { echo "[$(date +%T)] unknown size $size" >>"$OUT/pipeline.log"; continue; }
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 1000 >"$OUT/$name.smi.csv" &
  smi=$!
  pause=""
  for p in ${PAUSES:-7b-lora:15}; do [[ ${p%%:*} == "$size" ]] && pause=${p##*:}; done
  if [[ -n $pause ]]; then
    real_step "$name.train" "$B/tools/crucible" train "configs/$name.yaml" --set run.dir="$OUT" --pause-after "$pause"
    real_step "$name.resume" "$B/tools/crucible" resume "$OUT/$name"
  else
    real_step "$name.train" "$B/tools/crucible" train "configs/$name.yaml" --set run.dir="$OUT"
  fi
  kill "$smi" 2>/dev/null
  # The next size needs the disk: a checkpoint of the 1.5B with its optimiser state is ~21 GB.
  rm -rf "$OUT/$name/checkpoints" "$OUT/$name/policy"
done
for size in ${BENCH_SIZES-${SIZES-1.5b 7b-lora}}; do
  name="gpu-$size"
  read -r preset lora < <(real_preset "$size") || continue
  model="$OUT/$name/model"
  if [[ ! -f "$model/config.json" ]]; then
    # No run of this size here: the same model its config makes (the published shape, random
    # weights), with the tokenizer of a run that has one.
    tok=""
    for d in "$OUT"/gpu-*/model; do [[ -d $d ]] && { tok=$d; break; }; done
    [[ -n $tok ]] || { echo "[$(date +%T)] $name: no tokenizer to make its model with" >>"$OUT/pipeline.log"; continue; }
    real_step "$name.init" "$B/tools/crucible" init-model --preset "$preset" --tokenizer "$tok" --out "$model"
    [[ -f "$model/config.json" ]] || continue
  fi
  # Decoding at a 4096-token prompt: 512 new tokens give the steady rate at 4-5k tokens of context.
  real_step "$name.decode" "$B/tools/bench/bench_decode" --model "$model" --batches 8 --prompt 4096 --new 512 --fused on
  real_step "$name.decode_hf" "$PYTHON" tools/bench/decode_hf.py --model "$model" --batches 8 --prompt 4096 --new 512
  # shellcheck disable=SC2086 # $lora is empty or one flag
  real_step "$name.learner" "$B/tools/bench/bench_learner" --figures matmul,grpo,checkpoint --preset "$preset" --groups 1 \
    --samples 8 --prompt 4096 --completion 2048 --steps 3 --warmup 1 --checkpointing $lora --checkpoint-dir "$OUT/ckpt-bench"
  rm -rf "$OUT/ckpt-bench"
  # shellcheck disable=SC2086
  real_step "$name.hf" "$PYTHON" tools/bench/hf_real_size.py --model "$model" --figures checkpoint,train \
    --train-sequences 8 --prompt-tokens 4096 --new-tokens 2048 --train-steps 2 --warmup 1 --grad-checkpointing $lora \
    --state-checkpoint --checkpoint-dir "$OUT/ckpt-hf" --out "$OUT/$name.hf.json"
  rm -rf "$OUT/ckpt-hf"
done
echo "[$(date +%T)] steps: end" >>"$OUT/pipeline.log"
