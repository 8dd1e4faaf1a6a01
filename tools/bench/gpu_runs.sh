#!/usr/bin/env bash
# tools/bench/gpu_runs.sh PART...: training runs and tests on GPUs (docs/PERFORMANCE.md, "The loop on
# one H100" and "Runs on several GPUs"), from crucible, the GPU tests and bench_learner in BUILD
# (default build) to logs, metrics and run folders in OUT (default runs/bench/runs). Each part's
# steps log to OUT/STEP.log, their rc and time to OUT/pipeline.log; every GPU's memory and use is
# sampled each second into OUT/PART.smi.csv while a run goes. Parts, in the order given:
#   loop   one GPU: configs/gpu-1x.yaml on the ten seeded GPU tasks that build no extension, 200
#          SFT steps, 6 minutes of RL of 2 groups a step, updates only from samples above their
#          group's mean (learner.negative_weight 0); then its report (the learning lines) and
#          its actor-system overhead (actor_overhead.py)
#   tests  two or more GPUs: test_gpu_dp, the data-parallel run test, the GPU activation
#          checkpointing test, test_gpu_engine
#   modes  two GPUs: tools/bench/train_modes.sh on cuda:0-1 (policy on one, evaluator on the
#          other; MODE_EVAL_DEVICES="cuda:0, cuda:1": evaluators on both, the policy's GPU
#          included), configs/gpu-1x.yaml on the same ten tasks, SFT 300 steps, MODE_STEPS (6) RL
#          steps of 2 groups, asynchronous against synchronous
#   four   four GPUs: configs/gpu-4x.yaml on the same tasks, FOUR_SFT (100) SFT and FOUR_RL (6) RL
#          steps
#   zero   four GPUs of 141 GB (H200): configs/gpu-7b-full-4x.yaml (7B full fine-tuning, ZeRO-1),
#          ZERO_RL (3) RL steps in ZERO_MODE (async), collectives timing out after
#          ZERO_TIMEOUT_S (240) s, the final checkpoint's files listed in zero.checkpoint.txt;
#          ZERO_GPUS=2: over two GPUs (evaluator on cuda:1, 8 engine rows, one group a rank); the
#          run folder in ZERO_DIR, else OUT where 130 GiB are free, else /dev/shm
#   scale  two and four GPUs: bench_learner's data-parallel scaling, the 0.5B preset against one
#          GPU and the 7B preset with ZeRO-1 and activation checkpointing against two
# STACKS=1: a run whose events.log stays quiet for QUIET_S (600) s has every thread's stack dumped
# (cuda-gdb attaches) into OUT/PART.stacks.K.txt, twice at most; off by default: an attach during
# the 7B run's final checkpoint was followed by the process's end (SIGSEGV) as cuda-gdb detached.
# PYTHON: the interpreter with torch (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/runs}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
B="$BUILD"
# The ten seeded GPU tasks whose seed variants need no load_inline build: a warm start of minutes,
# not of the whole suite's extension builds.
NO_BUILD_TASKS='[level2/04_layernorm_manual_fp32, level2/05_softmax_manual_fp32, level2/09_causal_attention_fp32, level2/12_pairwise_sqdist_fp32, level2/13_logsumexp_manual_fp32, level3/03_mha_block_fp32, level3/04_transformer_layer_fp32, level3/05_resnet_basic_block_fp32, level3/06_lstm_loop_fp32, level3/10_gpt_attention_bf16]'
[[ $# -gt 0 ]] || { echo "usage: tools/bench/gpu_runs.sh PART... (loop tests modes four zero scale; --help)" >&2; exit 2; }
for part in "$@"; do
  case "$part" in loop | tests | modes | four | zero | scale) ;; *) echo "gpu_runs: unknown part '$part'" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible test_gpu_dp test_gpu_train_dp test_gpu_kernels test_gpu_engine bench_learner \
  >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

runs_step() { # NAME COMMAND...: one step, its output in OUT/NAME.log, its rc and time in OUT/pipeline.log
  local name="$1" start rc
  shift
  start=$(date +%s)
  echo "[$(date +%T)] $name: start" >>"$OUT/pipeline.log"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "[$(date +%T)] $name: rc $rc in $(( $(date +%s) - start )) s" >>"$OUT/pipeline.log"
}

runs_smi() { # NAME: samples every GPU's memory and use each second into OUT/NAME.smi.csv; prints the pid
  nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 1000 \
    >"$OUT/$1.smi.csv" 2>/dev/null &
  echo $!
}

# NAME EVENTS PATTERN: while a run matching PATTERN lives, dumps every thread's stack into
# OUT/NAME.stacks.K.txt each time EVENTS (its events.log) has been quiet for QUIET_S seconds,
# twice at most: where a hang stands, for a machine that has cuda-gdb but no gdb. Prints the pid
# (none without STACKS=1).
runs_watch() {
  local name="$1" events="$2" pat="$3"
  [[ "${STACKS:-0}" == 1 ]] || return 0
  (
    k=0
    while ((k < 2)); do
      sleep 15
      pid=$(pgrep -f -o -- "$pat") || continue
      [[ -f "$events" ]] || continue
      (( $(date +%s) - $(stat -c %Y "$events") >= ${QUIET_S:-600} )) || continue
      k=$((k + 1))
      timeout 150 cuda-gdb -p "$pid" -batch -ex "set pagination off" -ex "info threads" -ex "thread apply all bt 40" \
        >"$OUT/$name.stacks.$k.txt" 2>&1
      touch "$events" # the next dump waits another QUIET_S
    done
  ) >/dev/null 2>&1 &
  echo $!
}

for part in "$@"; do
  case "$part" in
    loop)
      name="gpu-1x-$(date +%Y%m%d-%H%M%S)"
      smi=$(runs_smi loop)
      runs_step loop "$B/tools/crucible" train configs/gpu-1x.yaml --set run.dir="$OUT" --set run.name="$name" \
        --set "tasks.include=$NO_BUILD_TASKS" --set stages.sft.steps=200 --set learner.total_steps=200 \
        --set stages.rl.groups=2 --set learner.negative_weight=0 --set stages.rl.max_minutes=6
      kill "$smi" 2>/dev/null
      runs_step loop.report "$B/tools/crucible" report "$OUT/$name"
      runs_step loop.overhead "$PYTHON" tools/bench/actor_overhead.py "$OUT/$name"
      grep "^learning" "$OUT/loop.report.log"
      cat "$OUT/loop.overhead.log"
      rm -rf "$OUT/$name/checkpoints" ;;
    tests)
      runs_step test_gpu_dp "$B/tests/gpu/test_gpu_dp"
      runs_step test_gpu_train_dp "$B/tests/gpu/test_gpu_train_dp"
      runs_step test_gpu_checkpointing "$B/tests/gpu/test_gpu_kernels" -tc="*activation checkpointing*" -s
      runs_step test_gpu_engine "$B/tests/gpu/test_gpu_engine" ;;
    modes)
      # Policy (engine and learner) on cuda:0, evaluator on cuda:1: the issue's two-GPU layout.
      smi=$(runs_smi modes)
      runs_step modes env CUDA_VISIBLE_DEVICES=0,1 OUT="$OUT/modes" RUNS="$OUT/modes/runs" CLI="$B/tools/crucible" \
        tools/bench/train_modes.sh configs/gpu-1x.yaml "${MODE_STEPS:-6}" --set "tasks.include=$NO_BUILD_TASKS" \
        --set stages.sft.steps=300 --set learner.total_steps=300 --set stages.rl.groups=2 \
        --set "evaluator.devices=[${MODE_EVAL_DEVICES:-cuda:1}]"
      kill "$smi" 2>/dev/null
      rm -rf "$OUT/modes/runs"/*/checkpoints ;;
    four)
      smi=$(runs_smi four)
      watch=$(runs_watch four "$OUT/gpu-4x/events.log" "crucible train configs/gpu-4x")
      runs_step four "$B/tools/crucible" train configs/gpu-4x.yaml --set run.dir="$OUT" --set "tasks.include=$NO_BUILD_TASKS" \
        --set stages.sft.steps="${FOUR_SFT:-100}" --set learner.total_steps=200 --set stages.rl.steps="${FOUR_RL:-6}" \
        --set run.checkpoint_every=0
      # shellcheck disable=SC2086 # $watch is a pid or nothing
      kill "$smi" $watch 2>/dev/null
      rm -rf "$OUT/gpu-4x/checkpoints" ;;
    zero)
      # ZERO_GPUS=2: the same config over cuda:0-1, evaluator on cuda:1 only, an engine of 8 rows
      # and one group a rank (memory-plan: 136.3 GB for GPU 0). The run folder (the 15 GB model,
      # a 106.6 GB final checkpoint) goes where there is room for it: ZERO_DIR, else OUT if its
      # disk has 130 GiB free, else /dev/shm.
      zname=gpu-7b-full-4x zsets=() zdir="${ZERO_DIR:-}"
      if [[ "${ZERO_GPUS:-4}" == 2 ]]; then
        zname=gpu-7b-full-2x
        zsets=(--set "run.name=$zname" --set "learner.devices=[cuda:0, cuda:1]" --set "evaluator.devices=[cuda:1]"
          --set engine.max_batch_samples=8 --set stages.rl.groups=2 --set stages.self_supervised.groups=2)
      fi
      if [[ -z "$zdir" ]]; then
        zdir="$OUT"
        (( $(df --output=avail -B1G "$OUT" | tail -1) < 130 )) && zdir=/dev/shm/multi
      fi
      mkdir -p "$zdir"
      df -h "$OUT" /dev/shm >>"$OUT/pipeline.log"
      echo "[$(date +%T)] zero: run folder $zdir/$zname" >>"$OUT/pipeline.log"
      smi=$(runs_smi zero)
      watch=$(runs_watch zero "$zdir/$zname/events.log" "crucible train configs/gpu-7b-full-4x")
      runs_step zero "$B/tools/crucible" train configs/gpu-7b-full-4x.yaml --set run.dir="$zdir" \
        --set stages.rl.steps="${ZERO_RL:-3}" --set learner.collective_timeout_s="${ZERO_TIMEOUT_S:-240}" \
        --set run.mode="${ZERO_MODE:-async}" "${zsets[@]}"
      # shellcheck disable=SC2086 # $watch is a pid or nothing
      kill "$smi" $watch 2>/dev/null
      # What the final checkpoint holds (shards, model, manifest), before it goes.
      (cd "$zdir/$zname" && find checkpoints -type f -printf '%s %p\n' 2>/dev/null | sort -k2) \
        >"$OUT/zero.checkpoint.txt"
      rm -rf "$zdir/$zname/checkpoints" "$zdir/$zname/model"
      [[ "$zdir" == "$OUT" ]] || { cp -r "$zdir/$zname" "$OUT/" && rm -rf "${zdir:?}/${zname:?}"; } ;;
    scale)
      # Data-parallel scaling: the 0.5B preset over 2 and 4 GPUs against one (plain learner), and
      # the 7B preset (full fine-tuning does not fit one GPU) with ZeRO-1 over 4 against 2.
      runs_step scale_0.5b "$B/tools/bench/bench_learner" --figures grpo,scaling --scaling-gpus 2,4
      runs_step scale_7b "$B/tools/bench/bench_learner" --figures scaling --preset qwen2.5-coder-7b-instruct --zero1 \
        --checkpointing --scaling-gpus 2,4 --groups 4 --samples 8 --steps 3 --warmup 1 ;;
  esac
done
echo "[$(date +%T)] parts: end" >>"$OUT/pipeline.log"
