#!/usr/bin/env bash
# tools/bench/gpu_session.sh MODE [ARG...]: on a GPU machine (docs/building.md), the GPU figures of
# the goals table in docs/PERFORMANCE.md, one mode per row; builds what the mode needs in build-gpu
# and writes logs and records under $OUT (default ./gpu-out). --help lists the modes.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: tools/bench/gpu_session.sh MODE [ARG...]
On a GPU machine (docs/building.md): builds what MODE needs in build-gpu (Debian's .debs from
.deps/debs, wheels from .whl where an import fails) and reproduces one row of the goals table of
docs/PERFORMANCE.md, writing logs and records under $OUT (default ./gpu-out). One mode a call.

Modes (the table's row in brackets):
  throughput          [evaluator throughput] bench_eval_throughput at each concurrency of
                      CONCURRENCIES (default "5 6 5"), CANDIDATES candidates (40), both passes;
                      each measured pass's gate timeline in $OUT/timeline_N_cC.txt with its
                      breakdown (gate_timeline.py). EVAL_SETS: --set options for every run;
                      RUN_SETS: "|"-separated, the Nth field's --set options for the Nth run;
                      LAPS=1: --verbose 1, each run's log in $OUT/laps_N.txt and its steps'
                      medians (eval_laps.py). Output: $OUT/concurrency.txt.
  precision           [sequential verdicts] tools/bench/eval_precision.py --repeat 10 over the
                      five pairs of tools/bench/eval_gpu (PRECISION_ONLY=a,b: those tasks).
                      Output: $OUT/precision.json, precision.txt.
  timing start|wait|collect
                      [timing precision] the pipeline of steps dev6, self-l1, t51-solo, hacks,
                      kb-dev6, before-dev6, kb-self, before-self (STEPS="a b": those only) in a
                      session of its own (setsid), across several device calls; records under
                      data/runs/precision. `start` builds, checks the gate (gate_probe.py) and
                      one verdict in the open, starts the pipeline and waits like `wait`;
                      `wait` waits until it ends or WAIT_S seconds (540) pass; `collect` packs
                      every record and log into $OUT/precision.tgz. CONC, WARM: the evaluator's
                      concurrency and warm workers (6, 12). Carry data/kernelbench
                      (fetch_kernelbench.sh) and data/dev6 (pick_pairs.py) on `start` only.
  hacks [CANDIDATE...]
                      [reward hacks] one verdict of each GPU hack candidate (default: every file
                      of tests/candidates/gpu) on its '# task:', from each side of SIDES ("new
                      old": this checkout in build-gpu, OLD_SRC in OLD_SRC/build), alternated.
                      Output: $OUT/hacks.jsonl.
  variants [FILTER...]
                      [legitimate kernels of the GPU suite] the same for every correct variant
                      of env/tasks/gpu/variants whose LEVEL/TASK contains a FILTER (default:
                      all). Output: $OUT/variants.jsonl.
  cuda_l1 build|start|wait|collect
                      [CUDA-L1's released kernels] a kernel set through `crucible eval --pairs`
                      across several device calls: SET (data/cuda-l1/3090.json,
                      fetch_cuda_l1.sh) into data/runs/NAME.jsonl (an interrupted run resumes
                      from it); CONC, WARM (6, 12); EVAL_ARGS: more crucible eval options;
                      WAIT_S (540). `collect` copies the records and summary to $OUT.
  checks [PASSES]     [a verdict's wall time after the timed-call checks] a verdict's wall time
                      on tools/bench/eval_gpu with this checkout and with OLD_SRC (a checkout of
                      216711e, built beside it), alternated task by task, PASSES passes (3),
                      three verdicts per evaluator; the first pass is left out of the medians.
                      TASKS="a b": those tasks; EVAL_ARGS: options of every crucible eval (fixed
                      rounds: "--set evaluator.rounds=30 --set evaluator.min_rounds=30 --set
                      evaluator.max_rounds=30 --set evaluator.recheck_above=1e9").
                      Output: $OUT/isolation_cost.jsonl.
  sandbox [PASSES]    [a verdict's wall time with the workers' sandbox] the same, OLD_SRC a
                      checkout of ec61a03 (before the sandbox).
  suite FILTER...     [the GPU task suite] tools/check_tasks.py over the GPU suite's tasks whose
                      names contain each FILTER (level1, level2/0, ...), with their variants,
                      whose load_inline extensions are built first, all at once
                      (TORCH_CUDA_ARCH_LIST 9.0, MAX_JOBS 4). Output: $OUT/check_FILTER.json.
  decode              [decode throughput] the kernels' and the engine's GPU tests (DECODE_TESTS,
                      default *), tools/bench/decode_compare.py --rounds 3 at DECODE_BATCHES
                      (1,16,64) with the variants DECODE_KERNELS (small,small_gate_up_warps)
                      and transformers' generate (DECODE_HF=--skip-hf leaves it out), then the
                      traced batch-1 step of each variant (trace_steps.py).
                      Output: $OUT/decode.json, decode.txt, trace_steps.txt.
  chain               [the floor under a decoding step's kernels] bench_kernel_chain
                      (CHAIN_ARGS replaces its arguments, default "--blocks 14,132,264,1216
                      --mib 0,6"). Output: $OUT/chain.jsonl.
  grpo                [GRPO update MFU, one GPU] the training kernels' GPU tests, bench_learner
                      --figures matmul,grpo with the fused kernels and LibTorch's in both orders,
                      then one update under the profiler. Output: $OUT/grpo.jsonl.
  dp                  [data-parallel learners, weight sync] test_gpu_dp, then bench_learner
                      --figures matmul,grpo,scaling,sync on every GPU. Output: $OUT/dp.jsonl.
  allreduce           [the gradient all-reduce] bench_learner's all-reduce of 25 and 100 MB,
                      the same with NCCL_COMM_BLOCKING=1, and tools/bench/allreduce_torch.py,
                      twice each; then test_gpu_dp. Output: $OUT/allreduce.jsonl.

  real_size start|wait|collect
                      [real-size policies] for each SIZE of SIZES (default "1.5b 7b-lora"):
                      configs/gpu-SIZE.yaml to its end, or paused after N learner steps and
                      resumed for a SIZE:N of PAUSES (default "7b-lora:15"), the device's memory
                      sampled meanwhile (nvidia-smi, 1 s); first the disk's own rate (dd, 8 GiB,
                      O_DIRECT). Then, for each SIZE of BENCH_SIZES (default SIZES), on the run's
                      model (made by init-model when no run of that size is there; SIZES="" runs
                      none): decoding (bench_decode against decode_hf.py, 8 rows, 4096 + 512),
                      a learner update (bench_learner against hf_real_size.py, 8 sequences of
                      4096 + 2048 tokens, activation checkpointing) and checkpoint I/O, model
                      alone and whole training state, cold reads (both benches' checkpoint
                      figures). In a session of its own across device calls, as
                      `timing`; WAIT_S (540). Output: $OUT/real.tgz (runs' logs and metrics,
                      the benches' JSON); the runs stay in data/runs/real.
  multi start|wait|collect
                      [runs that need several GPUs] for each PART of PARTS (default "tests modes zero four
                      scale"): tests: test_gpu_dp, the data-parallel run test, the GPU
                      checkpointing test, test_gpu_engine; modes: train_modes.sh on cuda:0-1 (policy on one GPU,
                      evaluator on the other), configs/gpu-1x.yaml on the ten seeded tasks that
                      build no extension, SFT 300, MODE_STEPS (6) RL steps of 2 groups, async
                      against sync; four: configs/gpu-4x.yaml on the same tasks, FOUR_SFT (100)
                      SFT and FOUR_RL (6) RL steps; zero: configs/gpu-7b-full-4x.yaml (7B full
                      fine-tuning, ZeRO-1 over four GPUs), ZERO_RL (3) RL steps in ZERO_MODE
                      (async), collectives timing out after ZERO_TIMEOUT_S (240) s, the final
                      checkpoint's files listed in zero.checkpoint.txt; ZERO_GPUS=2: over two
                      GPUs (evaluator on cuda:1, 8 engine rows, one group a rank); the run
                      folder in ZERO_DIR, else where 130 GiB are free (data/runs/multi or
                      /dev/shm); scale: bench_learner's data-parallel scaling over 2 and 4 GPUs,
                      the 0.5B preset against one GPU and the 7B preset with ZeRO-1 and
                      activation checkpointing against two. Every GPU's
                      memory sampled each second. STACKS=1: a run whose events.log stays quiet
                      for QUIET_S (600) s has every thread's stack dumped (cuda-gdb attaches) into
                      NAME.stacks.K.txt, twice at most; off by default: an attach during the 7B
                      run's final checkpoint was followed by the process's end (SIGSEGV) as
                      cuda-gdb detached. As `real_size` across calls; WAIT_S (540).
                      Output: $OUT/multi.tgz; the runs stay in data/runs/multi.
Environment: OUT (./gpu-out), OLD_SRC (old-src), SIDES, TASKS, EVAL_ARGS, EVAL_SETS, RUN_SETS,
CANDIDATES, CONCURRENCIES, LAPS, PRECISION_ONLY, STEPS, SET, CONC, WARM, WAIT_S, DECODE_TESTS,
DECODE_KERNELS, DECODE_BATCHES, DECODE_HF, CHAIN_ARGS, SIZES, BENCH_SIZES, PAUSES, TORCH_CUDA_ARCH_LIST, MAX_JOBS (each
above). The figures of the other rows come from commands named in the table.
EOF
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
MODE="$1"
shift
case "$MODE" in
  throughput | precision | timing | hacks | variants | cuda_l1 | checks | sandbox | suite | decode | chain | grpo | dp | allreduce | real_size | multi) ;;
  *) echo "gpu_session: unknown mode '$MODE'" >&2; usage >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SELF="$ROOT/tools/bench/gpu_session.sh"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/gpu-out}"
B=build-gpu
PREFIX="$ROOT/.deps/prefix/usr"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The Python lines that only say the worker's NVML or fork warnings, left out of the logs shown.
NOISE="NVML|raw_cnt|DeprecationWarning|pid = os.fork"

setup() { # Debian's .debs (CAF, ZeroMQ) unpacked; pyzmq and transformers from .whl where missing
  mkdir -p "$OUT" .deps/prefix
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/prefix; done
  # The machine cannot download, so wheels carried in .whl/ are installed when an import fails.
  python3 -c 'import zmq, transformers' 2>/dev/null || { ls .whl/*.whl >/dev/null 2>&1 &&
    python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/*.whl; }
}

configure() { # SRC BUILD LOG: configured once
  [[ -f $2/build.ninja ]] || cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRUCIBLE_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$PREFIX;$PREFIX/lib/x86_64-linux-gnu/cmake;$PREFIX/share/cmake" \
    -DCRUCIBLE_PYTHON="$(command -v python3)" -DCRUCIBLE_CUDA=ON > "$3" 2>&1
}

build() { # TARGET...: in build-gpu, then the device's name, memory, driver and clock
  setup
  configure "$ROOT" "$B" "$OUT/configure.log" || { tail -30 "$OUT/configure.log"; exit 1; }
  local start
  start=$(date +%s)
  cmake --build $B -j "$(nproc)" --target "$@" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "gpu_session: build took $(( $(date +%s) - start )) s"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
}

old_src() { # OLD_SRC as an absolute path (the other side of hacks, variants, checks, sandbox)
  (cd "${OLD_SRC:-old-src}" && pwd) || { echo "gpu_session: OLD_SRC (${OLD_SRC:-old-src}) is not a checkout" >&2; exit 2; }
}

# One verdict of CANDIDATE on TASK (absolute paths) from each side in SIDES, `crucible eval --json
# --no-cache` on cuda:0, one JSON line a verdict appended to JSONL (KEY: LABEL, side, status,
# speedup, checks, wall time, message); each side's stderr goes to JSONL's folder.
eval_sides() { # KEY LABEL TASK CANDIDATE JSONL
  local key="$1" label="$2" task="$3" cand="$4" jsonl="$5" side bin base
  for side in ${SIDES:-new old}; do
    if [[ $side == new ]]; then bin="$ROOT/$B/tools/crucible"; base="$ROOT"; else bin="$OLD/build/tools/crucible"; base="$OLD"; fi
    (cd "$base" && timeout 300 "$bin" eval --task "$task" --candidate "$cand" --device cuda:0 --json --no-cache \
      2>>"$(dirname "$jsonl")/eval-sides-stderr-$side.log") |
      python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({sys.argv[1]: sys.argv[2], "side": sys.argv[3], "status": v["status"], "speedup": v["speedup"],
                          "checks": v["checks_failed"], "wall_s": v.get("wall_s"), "message": v["message"][:300]}))' \
        "$key" "$label" "$side" | tee -a "$jsonl"
  done
}

build_sides() { # crucible in build-gpu, and in OLD_SRC/build where SIDES has old
  build crucible
  if [[ " ${SIDES:-new old} " == *" old "* ]]; then
    OLD="$(old_src)" || exit 2
    configure "$OLD" "$OLD/build" "$OUT/configure-old.log" || { tail -30 "$OUT/configure-old.log"; exit 1; }
    cmake --build "$OLD/build" --target crucible -j "$(nproc)" > "$OUT/build-old.log" 2>&1 || { tail -30 "$OUT/build-old.log"; exit 1; }
  fi
}

hacks() { # CANDIDATE...: relative to the checkout
  local files=("$@") f task start
  [[ ${#files[@]} -gt 0 ]] || files=(tests/candidates/gpu/*.py)
  for f in "${files[@]}"; do
    task="$(sed -n 's/^# task:[[:space:]]*//p' "$ROOT/$f" | head -1)"
    start=$(date +%s)
    eval_sides candidate "$(basename "$f")" "$ROOT/$task" "$ROOT/$f" "$OUT/hacks.jsonl"
    echo "gpu_session hacks: $(basename "$f") took $(( $(date +%s) - start )) s"
  done
}

variants() { # FILTER...
  local filters=("$@") dir rel keep f cand
  [[ ${#filters[@]} -gt 0 ]] || filters=("")
  for dir in env/tasks/gpu/variants/*/*/; do
    rel="${dir#env/tasks/gpu/variants/}"; rel="${rel%/}"
    keep=0
    for f in "${filters[@]}"; do [[ "$rel" == *"$f"* ]] && keep=1; done
    [[ $keep == 1 ]] || continue
    for cand in "$dir"*.py; do
      [[ $(basename "$cand") == wrong_* ]] && continue
      eval_sides variant "$rel/$(basename "$cand")" "$ROOT/env/tasks/gpu/$rel.py" "$ROOT/$cand" "$OUT/variants.jsonl"
    done
  done
}

wall_sides() { # [PASSES]: a verdict's wall time, this checkout against OLD_SRC
  local passes="${1:-3}" start pass task side bin base
  setup
  OLD="$(old_src)" || exit 2
  configure "$ROOT" "$ROOT/$B" "$OUT/configure.log"
  configure "$OLD" "$OLD/build" "$OUT/configure-old.log"
  start=$(date +%s)
  cmake --build "$ROOT/$B" --target crucible -j 10 > "$OUT/build-new.log" 2>&1 &
  cmake --build "$OLD/build" --target crucible -j 6 > "$OUT/build-old.log" 2>&1 &
  wait
  echo "gpu_session $MODE: builds took $(( $(date +%s) - start )) s"
  [[ -x $B/tools/crucible && -x "$OLD/build/tools/crucible" ]] || { tail -20 "$OUT"/build-*.log; exit 1; }
  for pass in $(seq 1 "$passes"); do
    for task in ${TASKS:-relu_affine gelu_tanh_affine layernorm_manual row_sumsq softmax_manual}; do
      for side in new old; do
        if [[ $side == new ]]; then bin="$ROOT/$B/tools/crucible"; base="$ROOT"; else bin="$OLD/build/tools/crucible"; base="$OLD"; fi
        # shellcheck disable=SC2086 # EVAL_ARGS is a list of options
        (cd "$base" && "$bin" eval --task tools/bench/eval_gpu/tasks/$task.py \
          --candidate tools/bench/eval_gpu/candidates/$task.py --device cuda:0 --repeat 3 --json ${EVAL_ARGS:-} 2>>"$OUT/eval-stderr-$side.log") |
          python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        v = json.loads(line)
        print(json.dumps({"pass": int(sys.argv[1]), "task": sys.argv[2], "side": sys.argv[3], "status": v["status"],
                          "speedup": v["speedup"], "wall_s": v["wall_s"], "message": v["message"][:160]}))' "$pass" "$task" "$side" |
          tee -a "$OUT/isolation_cost.jsonl"
      done
    done
  done
  python3 - "$OUT/isolation_cost.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for task in sorted({r["task"] for r in rows}):
    line = [task]
    med = {}
    for side in ("old", "new"):
        w = [r["wall_s"] for r in rows if r["task"] == task and r["side"] == side and r["pass"] > 1]
        med[side] = statistics.median(w) if w else None
        line.append(f"{side} median {med[side]:.3f} s (n={len(w)})" if w else f"{side} -")
    if med["old"] and med["new"]:
        line.append(f"new/old {med['new'] / med['old']:.3f}")
    print("; ".join(line))
PY
}

suite() { # FILTER...
  local start filter f
  [[ $# -gt 0 ]] || { echo "gpu_session suite: name at least one FILTER (level1, level2/0, ...)" >&2; exit 2; }
  mkdir -p "$OUT"
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-4}" PYTHONUNBUFFERED=1
  start=$(date +%s)
  for filter in "$@"; do
    # shellcheck disable=SC2013 # the suite's file names have no spaces
    for f in $(grep -l load_inline env/tasks/gpu/variants/"${filter%%/*}"/*/*.py 2>/dev/null); do
      [[ "$f" == *"/${filter#*/}"* ]] || continue
      python3 -c 'import importlib.util as u, sys
s = u.spec_from_file_location("variant", sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)' "$f" \
        > /dev/null 2>> "$OUT/prebuild.log" &
    done
  done
  wait
  echo "gpu_session suite: extensions built in $(( $(date +%s) - start )) s"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  for filter in "$@"; do
    start=$(date +%s)
    python3 tools/check_tasks.py --suite env/tasks/gpu --device cuda --variants --only "$filter" --seeds 1 --rounds 15 \
      --timeout 150 --json "$OUT/check_${filter//\//_}.json" 2>&1 | tail -40
    echo "gpu_session suite: $filter took $(( $(date +%s) - start )) s"
  done
}

# ---- timing: the timing precision pipeline, in the background across device calls ----
PREC="$ROOT/data/runs/precision"
CRUCIBLE="$ROOT/$B/tools/crucible"
SETARGS=(--device cuda:0 --json --set evaluator.concurrency="${CONC:-6}" --set evaluator.warm_workers="${WARM:-12}")

step() { # NAME: runs the rest, logging to $PREC/NAME.log, once (a mark file says it is done)
  local name="$1" t0
  shift
  [[ -f "$PREC/$name.done" ]] && return 0
  if [[ -n "${STEPS:-}" && " $STEPS " != *" $name "* ]]; then return 0; fi
  echo "[$(date +%T)] $name: start" >>"$PREC/pipeline.log"
  t0=$(date +%s)
  "$@" >"$PREC/$name.out" 2>"$PREC/$name.log"
  echo "[$(date +%T)] $name: rc $? after $(( $(date +%s) - t0 )) s" >>"$PREC/pipeline.log"
  touch "$PREC/$name.done"
}

absolute() { # DIR: a pairs file's relative paths made absolute (they were relative to DIR)
  awk -F'\t' -v OFS='\t' -v d="$1" '{ for (i = 1; i <= 2; i++) if (substr($i, 1, 1) != "/") $i = d "/" $i; print }'
}

timing_pipeline() {
  python3 tools/bench/reference_as_candidate.py data/kernelbench/level1 data/self-l1 >/dev/null
  # The partial pair files live with the records, not in the data folders: a later call that
  # carries data/dev6 again replaces that folder while the pipeline runs.
  grep -v '^#' data/self-l1/pairs.tsv | head -25 | absolute "$ROOT/data/self-l1" >"$PREC/self-l1-25.tsv"
  grep -E '_r[123]\.py$' data/dev6/pairs.tsv | absolute "$ROOT/data/dev6" >"$PREC/dev6-3.tsv"
  step dev6 "$CRUCIBLE" eval --pairs data/dev6/pairs.tsv --out "$PREC/dev6.jsonl" --no-cache "${SETARGS[@]}"
  step self-l1 "$CRUCIBLE" eval --pairs data/self-l1/pairs.tsv --out "$PREC/self-l1.jsonl" "${SETARGS[@]}"
  # L2_T51's ten kernels alone on the device, one verdict at a time, each with the worker's laps
  # (clock, calls per sample, gate timeouts): whether its spread comes from the other verdicts.
  grep -E 'L2_T51_' data/dev6/pairs.tsv | absolute "$ROOT/data/dev6" >"$PREC/t51.tsv"
  step t51-solo "$CRUCIBLE" eval --pairs "$PREC/t51.tsv" --out "$PREC/t51-solo.jsonl" --no-cache --verbose \
    "${SETARGS[@]}" --set evaluator.concurrency=1
  # Every GPU hack candidate once (tests/candidates/gpu): none may be credited.
  step hacks env OUT="$PREC" SIDES=new OLD_SRC="$ROOT" bash "$SELF" hacks
  step kb-dev6 python3 tools/bench/kernelbench_timing.py --pairs "$PREC/dev6-3.tsv" --out "$PREC/kb-dev6.jsonl" --json
  step before-dev6 "$CRUCIBLE" eval --pairs "$PREC/dev6-3.tsv" --out "$PREC/before-dev6.jsonl" --no-cache \
    "${SETARGS[@]}" --set evaluator.sample_ms=0
  # KernelBench's timing took 22 s a task of level 1 on an H100 (2026-11-25): 25 of them.
  step kb-self python3 tools/bench/kernelbench_timing.py --pairs "$PREC/self-l1-25.tsv" --out "$PREC/kb-self-l1.jsonl" --json
  step before-self "$CRUCIBLE" eval --pairs "$PREC/self-l1-25.tsv" --out "$PREC/before-self-l1.jsonl" --no-cache \
    "${SETARGS[@]}" --set evaluator.sample_ms=0
  echo "[$(date +%T)] pipeline: end" >>"$PREC/pipeline.log"
}

timing_running() { [[ -f "$PREC/pid" ]] && kill -0 "$(cat "$PREC/pid")" 2>/dev/null; }

timing_collect() { # one archive: the device tool brings back only a few files a call
  tar czf "$OUT/precision.tgz.part" -C "$PREC" . 2>/dev/null && mv "$OUT/precision.tgz.part" "$OUT/precision.tgz"
  # shellcheck disable=SC2094 # $f is only read; the sed names it
  for f in "$PREC"/*.log; do tr '\r' '\n' <"$f" | grep -v '^$' | tail -1 | sed "s|^|$(basename "$f"): |"; done
}

timing_wait() {
  local until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while timing_running && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
    echo "[$(date +%T)] $(tail -1 "$PREC/pipeline.log")"
    timing_collect >/dev/null # every minute: a call cut short by its limit still brings the records back
  done
  if timing_running; then echo "timing_precision: still running"; else echo "timing_precision: ended"; fi
  timing_collect
}

timing_start() {
  build crucible
  if [[ ! -f "$PREC/gate.json" ]]; then # the gate itself (tools/bench/gate_probe.py), in the open
    timeout 120 python3 tools/bench/gate_probe.py --kernels $B/env/harness_kernels.fatbin --json \
      >"$PREC/gate.json" 2>"$PREC/gate.log"; echo "gate_probe: rc $?"; cat "$PREC/gate.json"; tail -5 "$PREC/gate.log"
  fi
  if [[ ! -f "$PREC/smoke.done" ]]; then # one verdict first, in the open: a broken build shows here
    python3 tools/bench/reference_as_candidate.py data/kernelbench/level1 data/self-l1 >/dev/null
    timeout 120 "$CRUCIBLE" eval --task data/kernelbench/level1/19_ReLU.py --candidate data/self-l1/candidates/19_ReLU.py \
      --device cuda:0 --no-cache --verbose 2>&1 | grep -oE "timing: [^;]+|^(message|status) .*|.*(error|Error).*" | cut -c1-600
    touch "$PREC/smoke.done"
  fi
  if timing_running; then echo "timing_precision: already running"; else
    setsid nohup bash "$SELF" timing pipeline </dev/null >"$PREC/pipeline.stdout" 2>&1 &
    echo $! >"$PREC/pid"
  fi
  timing_wait
}

# ---- cuda_l1: a kernel set through crucible eval --pairs, in the background across device calls ----
SET="${SET:-data/cuda-l1/3090.json}"
NAME="$(basename "${SET%.*}")"
RUNS="$ROOT/data/runs"

set_launch() {
  # shellcheck disable=SC2086 # EVAL_ARGS is a list of options
  setsid nohup $B/tools/crucible eval --pairs "$SET" --device cuda:0 --out "$RUNS/$NAME.jsonl" --json \
    --set evaluator.concurrency="${CONC:-6}" --set evaluator.warm_workers="${WARM:-12}" ${EVAL_ARGS:-} \
    >"$RUNS/$NAME.summary.json" 2>"$RUNS/$NAME.progress.log" </dev/null &
  echo $! >"$RUNS/$NAME.pid"
  date +%s >"$RUNS/$NAME.started"
  echo "gpu_session cuda_l1: started $SET (pid $(cat "$RUNS/$NAME.pid"))"
}

set_running() { [[ -f "$RUNS/$NAME.pid" ]] && kill -0 "$(cat "$RUNS/$NAME.pid")" 2>/dev/null; }

set_progress() { tr '\r' '\n' <"$RUNS/$NAME.progress.log" 2>/dev/null | grep -v '^$' | tail -1; }

set_collect() {
  cp "$RUNS/$NAME.jsonl" "$RUNS/$NAME.summary.json" "$OUT/" 2>/dev/null
  tr '\r' '\n' <"$RUNS/$NAME.progress.log" | grep -v '^$' >"$OUT/$NAME.progress.log"
  tail -5 "$OUT/$NAME.progress.log"
}

set_wait() {
  local until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while set_running && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
    echo "[$(( $(date +%s) - $(cat "$RUNS/$NAME.started") )) s] $(set_progress)"
  done
  if set_running; then echo "gpu_session cuda_l1: still running"; else echo "gpu_session cuda_l1: ended"; fi
  wc -l <"$RUNS/$NAME.jsonl" 2>/dev/null | sed 's/^/records: /'
  set_collect >/dev/null
}

# ---- real_size: the real-size configs through the loop, then their side-by-side benches ----
REAL="$ROOT/data/runs/real"

pipeline_step() { # DIR NAME COMMAND...: one step of a pipeline, its output in DIR/NAME.log, its rc and time in DIR/pipeline.log
  local dir="$1" name="$2" start rc
  shift 2
  start=$(date +%s)
  echo "[$(date +%T)] $name: start" >>"$dir/pipeline.log"
  "$@" >"$dir/$name.log" 2>&1
  rc=$?
  echo "[$(date +%T)] $name: rc $rc in $(( $(date +%s) - start )) s" >>"$dir/pipeline.log"
}

real_step() { pipeline_step "$REAL" "$@"; }

real_preset() { # SIZE: the init-model preset and bench_learner's LoRA flag of a size
  case "$1" in
    1.5b) echo "qwen2.5-coder-1.5b-instruct" ;;
    7b-lora) echo "qwen2.5-coder-7b-instruct --lora" ;;
    *) return 1 ;;
  esac
}

real_pipeline() { # the runs first (the issue's figures), then the side-by-side benches
  local size name model preset lora smi pause p tok
  # The disk's own rate, the limit under both sides' checkpoint figures: 8 GiB written with
  # O_DIRECT, then read back with O_DIRECT.
  real_step disk bash -c "dd if=/dev/zero of=$REAL/dd.bin bs=16M count=512 oflag=direct conv=fsync 2>&1 | tail -1;
    dd if=$REAL/dd.bin of=/dev/null bs=16M iflag=direct 2>&1 | tail -1; rm -f $REAL/dd.bin"
  for size in ${SIZES-1.5b 7b-lora}; do
    name="gpu-$size"
    real_preset "$size" >/dev/null || { echo "[$(date +%T)] unknown size $size" >>"$REAL/pipeline.log"; continue; }
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 1000 >"$REAL/$name.smi.csv" &
    smi=$!
    pause=""
    for p in ${PAUSES:-7b-lora:15}; do [[ ${p%%:*} == "$size" ]] && pause=${p##*:}; done
    if [[ -n $pause ]]; then
      real_step "$name.train" "$B/tools/crucible" train "configs/$name.yaml" --set run.dir="$REAL" --pause-after "$pause"
      real_step "$name.resume" "$B/tools/crucible" resume "$REAL/$name"
    else
      real_step "$name.train" "$B/tools/crucible" train "configs/$name.yaml" --set run.dir="$REAL"
    fi
    kill "$smi" 2>/dev/null
    # The next size needs the disk: a checkpoint of the 1.5B with its optimiser state is ~21 GB.
    rm -rf "$REAL/$name/checkpoints" "$REAL/$name/policy"
  done
  for size in ${BENCH_SIZES-${SIZES-1.5b 7b-lora}}; do
    name="gpu-$size"
    read -r preset lora < <(real_preset "$size") || continue
    model="$REAL/$name/model"
    if [[ ! -f "$model/config.json" ]]; then
      # No run of this size here: the same model its config makes (the published shape, random
      # weights), with the tokenizer of a run that has one.
      tok=$(ls -d "$REAL"/gpu-*/model 2>/dev/null | head -1)
      [[ -n $tok ]] || { echo "[$(date +%T)] $name: no tokenizer to make its model with" >>"$REAL/pipeline.log"; continue; }
      real_step "$name.init" "$B/tools/crucible" init-model --preset "$preset" --tokenizer "$tok" --out "$model"
      [[ -f "$model/config.json" ]] || continue
    fi
    # Decoding at a 4096-token prompt: 512 new tokens give the steady rate at 4-5k tokens of context.
    real_step "$name.decode" "$B/tools/bench/bench_decode" --model "$model" --batches 8 --prompt 4096 --new 512 --fused on
    real_step "$name.decode_hf" python3 tools/bench/decode_hf.py --model "$model" --batches 8 --prompt 4096 --new 512
    # shellcheck disable=SC2086 # $lora is empty or one flag
    real_step "$name.learner" "$B/tools/bench/bench_learner" --figures matmul,grpo,checkpoint --preset "$preset" --groups 1 \
      --samples 8 --prompt 4096 --completion 2048 --steps 3 --warmup 1 --checkpointing $lora --checkpoint-dir "$REAL/ckpt-bench"
    rm -rf "$REAL/ckpt-bench"
    # shellcheck disable=SC2086
    real_step "$name.hf" python3 tools/bench/hf_real_size.py --model "$model" --figures checkpoint,train \
      --train-sequences 8 --prompt-tokens 4096 --new-tokens 2048 --train-steps 2 --warmup 1 --grad-checkpointing $lora \
      --state-checkpoint --checkpoint-dir "$REAL/ckpt-hf" --out "$REAL/$name.hf.json"
    rm -rf "$REAL/ckpt-hf"
  done
  echo "[$(date +%T)] pipeline: end" >>"$REAL/pipeline.log"
}

real_running() { [[ -f "$REAL/pid" ]] && kill -0 "$(cat "$REAL/pid")" 2>/dev/null; }

real_collect() {
  (cd "$REAL" && tar czf "$OUT/real.tgz.part" --exclude='*/model' --exclude='*/checkpoints' \
    --exclude='*/tasks' --exclude='*/workers' . 2>/dev/null) && mv "$OUT/real.tgz.part" "$OUT/real.tgz"
  tail -4 "$REAL/pipeline.log" 2>/dev/null
}

real_wait() {
  local until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while real_running && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
    echo "[$(date +%T)] $(tail -1 "$REAL/pipeline.log")"
    real_collect >/dev/null
  done
  if real_running; then echo "real_size: still running"; else echo "real_size: ended"; fi
  real_collect
}

real_start() {
  build crucible bench_decode bench_learner
  if real_running; then echo "real_size: already running"; else
    setsid nohup bash "$SELF" real_size pipeline </dev/null >"$REAL/pipeline.stdout" 2>&1 &
    echo $! >"$REAL/pid"
  fi
  real_wait
}

# ---- multi: the runs that need several GPUs (asynchronous against synchronous, gpu-4x, 7B ZeRO-1) ----
MULTI="$ROOT/data/runs/multi"
# The ten seeded GPU tasks whose seed variants need no load_inline build: a warm start of minutes,
# not of the whole suite's extension builds.
NO_BUILD_TASKS='[level2/04_layernorm_manual_fp32, level2/05_softmax_manual_fp32, level2/09_causal_attention_fp32, level2/12_pairwise_sqdist_fp32, level2/13_logsumexp_manual_fp32, level3/03_mha_block_fp32, level3/04_transformer_layer_fp32, level3/05_resnet_basic_block_fp32, level3/06_lstm_loop_fp32, level3/10_gpt_attention_bf16]'

multi_step() { pipeline_step "$MULTI" "$@"; }

multi_smi() { # NAME: samples every GPU's memory and use each second into $MULTI/NAME.smi.csv; prints the pid
  nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -lms 1000 \
    >"$MULTI/$1.smi.csv" 2>/dev/null &
  echo $!
}

# NAME EVENTS PATTERN: while a run matching PATTERN lives, dumps every thread's stack into
# $MULTI/NAME.stacks.K.txt each time EVENTS (its events.log) has been quiet for QUIET_S seconds,
# twice at most: where a hang stands, for a machine that has cuda-gdb but no gdb. Prints the pid
# (none without STACKS=1).
multi_watch() {
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
        >"$MULTI/$name.stacks.$k.txt" 2>&1
      touch "$events" # the next dump waits another QUIET_S
    done
  ) >/dev/null 2>&1 &
  echo $!
}

multi_pipeline() {
  local smi watch
  for part in ${PARTS:-tests modes zero four scale}; do
    case "$part" in
      tests)
        multi_step test_gpu_dp "$B/tests/gpu/test_gpu_dp"
        multi_step test_gpu_train_dp "$B/tests/gpu/test_gpu_train_dp"
        multi_step test_gpu_checkpointing "$B/tests/gpu/test_gpu_kernels" -tc="*activation checkpointing*" -s
        multi_step test_gpu_engine "$B/tests/gpu/test_gpu_engine" ;;
      modes)
        # Policy (engine and learner) on cuda:0, evaluator on cuda:1: the issue's two-GPU layout.
        smi=$(multi_smi modes)
        multi_step modes env CUDA_VISIBLE_DEVICES=0,1 OUT="$MULTI/modes" RUNS="$MULTI/modes/runs" CLI="$B/tools/crucible" \
          tools/bench/train_modes.sh configs/gpu-1x.yaml "${MODE_STEPS:-6}" --set "tasks.include=$NO_BUILD_TASKS" \
          --set stages.sft.steps=300 --set learner.total_steps=300 --set stages.rl.groups=2 --set "evaluator.devices=[cuda:1]"
        kill "$smi" 2>/dev/null
        rm -rf "$MULTI/modes/runs"/*/checkpoints ;;
      four)
        smi=$(multi_smi four)
        watch=$(multi_watch four "$MULTI/gpu-4x/events.log" "crucible train configs/gpu-4x")
        multi_step four "$B/tools/crucible" train configs/gpu-4x.yaml --set run.dir="$MULTI" --set "tasks.include=$NO_BUILD_TASKS" \
          --set stages.sft.steps="${FOUR_SFT:-100}" --set learner.total_steps=200 --set stages.rl.steps="${FOUR_RL:-6}" \
          --set run.checkpoint_every=0
        kill "$smi" $watch 2>/dev/null
        rm -rf "$MULTI/gpu-4x/checkpoints" ;;
      zero)
        # ZERO_GPUS=2: the same config over cuda:0-1, evaluator on cuda:1 only, an engine of 8 rows
        # and one group a rank (memory-plan: 136.3 GB for GPU 0). The run folder (the 15 GB model,
        # a 106.6 GB final checkpoint) goes where there is room for it: ZERO_DIR, else $MULTI if
        # its disk has 130 GiB free, else /dev/shm.
        local zname=gpu-7b-full-4x zsets=() zdir="${ZERO_DIR:-}"
        if [[ "${ZERO_GPUS:-4}" == 2 ]]; then
          zname=gpu-7b-full-2x
          zsets=(--set run.name=$zname --set "learner.devices=[cuda:0, cuda:1]" --set "evaluator.devices=[cuda:1]"
            --set engine.max_batch_samples=8 --set stages.rl.groups=2 --set stages.self_supervised.groups=2)
        fi
        if [[ -z "$zdir" ]]; then
          zdir="$MULTI"
          (( $(df --output=avail -B1G "$MULTI" | tail -1) < 130 )) && zdir=/dev/shm/multi
        fi
        mkdir -p "$zdir"
        df -h "$MULTI" /dev/shm >>"$MULTI/pipeline.log"
        echo "[$(date +%T)] zero: run folder $zdir/$zname" >>"$MULTI/pipeline.log"
        smi=$(multi_smi zero)
        watch=$(multi_watch zero "$zdir/$zname/events.log" "crucible train configs/gpu-7b-full-4x")
        multi_step zero "$B/tools/crucible" train configs/gpu-7b-full-4x.yaml --set run.dir="$zdir" \
          --set stages.rl.steps="${ZERO_RL:-3}" --set learner.collective_timeout_s="${ZERO_TIMEOUT_S:-240}" \
          --set run.mode="${ZERO_MODE:-async}" "${zsets[@]}"
        kill "$smi" $watch 2>/dev/null
        # What the final checkpoint holds (shards, model, manifest), before it goes.
        (cd "$zdir/$zname" && find checkpoints -type f -printf '%s %p\n' 2>/dev/null | sort -k2) \
          >"$MULTI/zero.checkpoint.txt"
        rm -rf "$zdir/$zname/checkpoints" "$zdir/$zname/model"
        [[ "$zdir" == "$MULTI" ]] || { cp -r "$zdir/$zname" "$MULTI/" && rm -rf "$zdir/$zname"; } ;;
      scale)
        # Data-parallel scaling: the 0.5B preset over 2 and 4 GPUs against one (plain learner), and
        # the 7B preset (full fine-tuning does not fit one GPU) with ZeRO-1 over 4 against 2.
        multi_step scale_0.5b "$B/tools/bench/bench_learner" --figures grpo,scaling --scaling-gpus 2,4
        multi_step scale_7b "$B/tools/bench/bench_learner" --figures scaling --preset qwen2.5-coder-7b-instruct --zero1 \
          --checkpointing --scaling-gpus 2,4 --groups 4 --samples 8 --steps 3 --warmup 1 ;;
    esac
  done
  echo "[$(date +%T)] pipeline: end" >>"$MULTI/pipeline.log"
}

multi_running() { [[ -f "$MULTI/pid" ]] && kill -0 "$(cat "$MULTI/pid")" 2>/dev/null; }

multi_collect() {
  (cd "$MULTI" && tar czf "$OUT/multi.tgz.part" --exclude='*/model' --exclude='*/checkpoints' --exclude='*/tasks' \
    --exclude='*/workers' --exclude='*.db' --exclude='*/extensions' . 2>/dev/null) && mv "$OUT/multi.tgz.part" "$OUT/multi.tgz"
  tail -4 "$MULTI/pipeline.log" 2>/dev/null
}

multi_wait() {
  local until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while multi_running && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 30 ? until - $(date +%s) : 30 ))
  done
  if multi_running; then echo "multi: still running"; else echo "multi: ended"; fi
  multi_collect
}

multi_start() {
  build crucible test_gpu_dp test_gpu_train_dp test_gpu_kernels test_gpu_engine bench_learner
  if multi_running; then echo "multi: already running"; else
    setsid nohup bash "$SELF" multi pipeline </dev/null >"$MULTI/pipeline.stdout" 2>&1 &
    echo $! >"$MULTI/pid"
  fi
  multi_wait
}

mkdir -p "$OUT"
case "$MODE" in
  throughput)
    build crucible bench_eval_throughput
    n=0
    IFS='|' read -r -a run_sets <<< "${RUN_SETS:-}"
    for c in ${CONCURRENCIES:-5 6 5}; do
      n=$((n + 1))
      extra="${EVAL_SETS:-} ${run_sets[$((n - 1))]:-}"
      sets=(); for s in $extra; do sets+=(--set "$s"); done
      echo "== concurrency $c $extra" | tee -a "$OUT/concurrency.txt"
      verbose=(); [[ "${LAPS:-}" == 1 ]] && verbose=(--verbose 1)
      $B/tools/bench/bench_eval_throughput --device cuda:0 --concurrency "$c" --candidates "${CANDIDATES:-40}" "${sets[@]}" "${verbose[@]}" \
        --timeline "$OUT/timeline_${n}_c$c.txt" > "$OUT/laps_$n.txt" 2>&1
      grep -Ev "$NOISE| DEBUG |^\s*$" "$OUT/laps_$n.txt" | tee -a "$OUT/concurrency.txt"
      python3 tools/bench/gate_timeline.py "$OUT/timeline_${n}_c$c.txt" 2>&1 | tee -a "$OUT/concurrency.txt"
      [[ "${LAPS:-}" == 1 ]] && python3 tools/bench/eval_laps.py "$OUT/laps_$n.txt" 2>&1 | tee -a "$OUT/concurrency.txt"
      [[ "${LAPS:-}" == 1 ]] || rm -f "$OUT/laps_$n.txt"
    done ;;
  precision)
    build crucible
    python3 tools/bench/eval_precision.py --crucible $B/tools/crucible --repeat 10 ${PRECISION_ONLY:+--only "$PRECISION_ONLY"} \
      --out "$OUT/precision.json" 2>&1 | tee "$OUT/precision.txt" ;;
  timing)
    mkdir -p "$PREC"
    case "${1:-}" in
      start) timing_start ;;
      pipeline) timing_pipeline ;;
      wait) timing_wait ;;
      collect) timing_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh timing start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  multi)
    mkdir -p "$MULTI"
    case "${1:-}" in
      start) multi_start ;;
      pipeline) multi_pipeline ;;
      wait) multi_wait ;;
      collect) multi_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh multi start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  real_size)
    mkdir -p "$REAL"
    case "${1:-}" in
      start) real_start ;;
      pipeline) real_pipeline ;;
      wait) real_wait ;;
      collect) real_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh real_size start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  hacks)
    build_sides
    hacks "$@" ;;
  variants)
    build_sides
    variants "$@" ;;
  cuda_l1)
    mkdir -p "$RUNS"
    case "${1:-}" in
      build) build crucible ;;
      start) build crucible && set_launch && set_wait ;;
      wait) set_wait ;;
      collect) set_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh cuda_l1 build|start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  checks | sandbox)
    wall_sides "$@" ;;
  suite)
    suite "$@" ;;
  decode)
    build crucible bench_decode test_gpu_engine test_gpu_kernels
    kernels="${DECODE_KERNELS:-small,small_gate_up_warps}"
    timeout 300 $B/tests/gpu/test_gpu_kernels -tc="${DECODE_TESTS:-*}" -tce='*persistent*' 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -30
    timeout 300 $B/tests/gpu/test_gpu_engine > "$OUT/gpu_engine.txt" 2>&1; grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
    # Three passes, each starting one variant later; each variant's median pass is shown.
    # shellcheck disable=SC2086 # DECODE_HF is an option or nothing
    python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches "${DECODE_BATCHES:-1,16,64}" --prompt 512 --new 512 \
      --rounds 3 --kernels "$kernels" ${DECODE_HF:-} --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt"
    # Where each variant's batch-1 step goes: LibTorch's profiler over one call, the kernels of the
    # median step; the traces themselves stay behind.
    $B/tools/bench/bench_decode --model /tmp/crucible-decode-0.5b --device cuda:0 --batches 1 --prompt 512 --new 64 \
      --kernels "$kernels" --trace "$OUT/trace" > "$OUT/trace.txt" 2>&1
    for f in "$OUT"/trace-*.json; do python3 tools/bench/trace_steps.py "$f"; rm -f "$f"; done 2>&1 | tee "$OUT/trace_steps.txt" ;;
  chain)
    # Chains of dependent kernels with no work but their weight loads: uniform ones, and one with
    # the launch shapes and bytes of a batch-1 decoding step of Qwen2.5-0.5B's shape.
    build bench_kernel_chain
    # shellcheck disable=SC2086 # CHAIN_ARGS is a list of options
    $B/tools/bench/bench_kernel_chain ${CHAIN_ARGS:---blocks 14,132,264,1216 --mib 0,6} 2>&1 | tee "$OUT/chain.jsonl" ;;
  grpo)
    # The GRPO update alone needs neither the CLI nor the NCCL tests.
    build bench_learner test_gpu_kernels
    [[ -x $B/tests/gpu/test_gpu_kernels ]] && timeout 300 $B/tests/gpu/test_gpu_kernels -tc='*log-softmax*,*training forward*,*silu_mul_pair*' 2>&1 | tee "$OUT/gpu_kernels_train.txt" | grep -E "worst|ERROR|FAIL|test cases|assertions" | tail -40
    for heads in fused,libtorch libtorch,fused; do
      timeout 300 $B/tools/bench/bench_learner --figures matmul,grpo --kernels $heads 2>&1 | tee -a "$OUT/grpo.jsonl"
    done
    # One more update under the profiler: its longest operators and kernels, and device time by kind.
    timeout 300 $B/tools/bench/bench_learner --figures grpo --steps 2 --trace /tmp/grpo-trace.json 2>&1 \
      | tee -a "$OUT/grpo.jsonl" | python3 -c 'import json,sys
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
    timeout 300 $B/tests/gpu/test_gpu_dp 2>&1 | tail -20 | tee "$OUT/gpu_dp.txt"
    timeout 400 $B/tools/bench/bench_learner --figures matmul,grpo,scaling,sync --kernels libtorch,fused 2>&1 | tee "$OUT/dp.jsonl" ;;
  allreduce)
    # The gradient all-reduce alone, side by side: our communicator, the same with
    # NCCL_COMM_BLOCKING=1, and torch.distributed, twice over; then the DP tests.
    build crucible bench_learner test_gpu_dp
    for _ in 1 2; do
      $B/tools/bench/bench_learner --figures allreduce --sizes-mb 25,100 2>&1 | tee -a "$OUT/allreduce.jsonl"
      NCCL_COMM_BLOCKING=1 $B/tools/bench/bench_learner --figures allreduce --sizes-mb 25,100 2>&1 \
        | sed 's/"crucible-nccl"/"crucible-nccl-blocking"/' | tee -a "$OUT/allreduce.jsonl"
      timeout 300 python3 tools/bench/allreduce_torch.py --sizes-mb 25,100 2>&1 | tee -a "$OUT/allreduce.jsonl"
    done
    timeout 300 $B/tests/gpu/test_gpu_dp 2>&1 | tail -20 | tee "$OUT/gpu_dp.txt" ;;
esac
