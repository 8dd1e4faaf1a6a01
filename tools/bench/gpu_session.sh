#!/usr/bin/env bash
# tools/bench/gpu_session.sh MODE [ARG...]: on a lent GPU machine, the GPU figures of the goals table
# in docs/PERFORMANCE.md, one mode per figure. The lent set-up first (tools/bench/lent_machine.sh:
# Debian's packages from .deps/debs, wheels from .whl, build-gpu configured against them), then the
# figure's own command or script of tools/bench, the one any GPU machine runs (docs/building.md).
# Modes that outlast a device call run in a session of their own: start, wait, collect. Logs and
# records under $OUT (default ./gpu-out). --help lists the modes.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: tools/bench/gpu_session.sh MODE [ARG...]
On a lent GPU machine (docs/building.md): the set-up of tools/bench/lent_machine.sh (Debian's .debs
from .deps/debs, wheels from .whl where an import fails, build-gpu configured against them), a
build of what MODE needs, then MODE's measurement, writing logs and records under $OUT (default
./gpu-out). One mode a call. Each mode names the command or script that does the measuring, which
runs as it is on any GPU machine with a build in build/ (docs/PERFORMANCE.md gives it per figure);
its --help says more. Environment variables of those scripts pass through.

Modes (the goals table's row in brackets):
  throughput          [evaluator throughput] tools/bench/eval_throughput.sh (CONCURRENCIES,
                      CANDIDATES, EVAL_SETS, RUN_SETS, LAPS). Output: $OUT/concurrency.txt.
  precision           [sequential verdicts] tools/bench/eval_precision.py --repeat 10 over the
                      five pairs of tools/bench/eval_gpu (PRECISION_ONLY=a,b: those tasks).
                      Output: $OUT/precision.json, precision.txt.
  timing start|wait|collect
                      [timing precision] tools/bench/timing_precision.sh: `start` builds, runs its
                      steps gate and smoke in the open, then the others (STEPS="a b": those only)
                      in a session of their own, across device calls, records in
                      data/runs/precision; `wait` waits until they end or WAIT_S seconds (540)
                      pass; `collect` packs every record and log into $OUT/precision.tgz. CONC,
                      WARM: the evaluator's concurrency and warm workers (6, 12). Carry
                      data/kernelbench (fetch_kernelbench.sh) and data/dev6 (pick_pairs.py) on
                      `start` only.
  hacks [CANDIDATE...]
                      [reward hacks] tools/bench/gpu_candidates.sh hacks, from each side of SIDES
                      (default here "new old": this checkout in build-gpu, OLD_SRC in
                      OLD_SRC/build). Output: $OUT/hacks.jsonl.
  variants [FILTER...]
                      [legitimate kernels of the GPU suite] tools/bench/gpu_candidates.sh
                      variants, SIDES as for hacks. Output: $OUT/variants.jsonl.
  cuda_l1 build|start|wait|collect
                      [CUDA-L1's released kernels] `crucible eval --pairs SET` (default
                      data/cuda-l1/3090.json, fetch_cuda_l1.sh) into data/runs/NAME.jsonl across
                      several device calls (an interrupted run resumes from it); CONC, WARM (6,
                      12); EVAL_ARGS: more crucible eval options; WAIT_S (540). `collect` copies
                      the records and summary to $OUT.
  checks [PASSES]     [a verdict's wall time after the timed-call checks] tools/bench/verdict_wall.sh
                      OLD_SRC PASSES (3), OLD_SRC (default old-src) a checkout of 216711e, built
                      beside this one (TASKS, ROUNDS, EVAL_ARGS). Output: $OUT/isolation_cost.jsonl.
  sandbox [PASSES]    [a verdict's wall time with the workers' sandbox] the same, OLD_SRC a
                      checkout of ec61a03 (before the sandbox).
  suite FILTER...     [the GPU task suite] tools/bench/gpu_suite.sh FILTER... (level1, level2/0,
                      ...), TORCH_CUDA_ARCH_LIST 9.0 unless set. Output: $OUT/check_FILTER.json.
  decode              [decode throughput] tools/bench/decode.sh (DECODE_TESTS, DECODE_KERNELS,
                      DECODE_BATCHES, DECODE_HF). Output: $OUT/decode.json, decode.txt,
                      trace_steps.txt.
  chain               [the floor under a decoding step's kernels] bench_kernel_chain (CHAIN_ARGS
                      replaces its arguments, default "--blocks 14,132,264,1216 --mib 0,6").
                      Output: $OUT/chain.jsonl.
  grpo                [GRPO update MFU, one GPU] tools/bench/learner_gpu.sh grpo.
                      Output: $OUT/grpo.jsonl.
  dp                  [data-parallel learners, weight sync] tools/bench/learner_gpu.sh dp.
                      Output: $OUT/dp.jsonl.
  allreduce           [the gradient all-reduce] tools/bench/learner_gpu.sh allreduce.
                      Output: $OUT/allreduce.jsonl.
  real_size start|wait|collect
                      [real-size policies] tools/bench/real_size.sh (SIZES, BENCH_SIZES, PAUSES)
                      in a session of its own across device calls, as `timing`; WAIT_S (540).
                      Output: $OUT/real.tgz (runs' logs and metrics, the benches' JSON); the runs
                      stay in data/runs/real.
  multi start|wait|collect
                      [runs that need several GPUs] tools/bench/gpu_runs.sh with the parts of
                      PARTS (default "tests modes zero four scale"; MODE_STEPS, FOUR_SFT, FOUR_RL,
                      ZERO_RL, ZERO_MODE, ZERO_TIMEOUT_S, ZERO_GPUS, ZERO_DIR, STACKS, QUIET_S), as
                      `real_size` across calls; WAIT_S (540). Output: $OUT/multi.tgz; the runs stay
                      in data/runs/multi.
  rate start|wait|collect
                      [verdicts per GPU-minute against KernelBench's harness; two GPUs against
                      one] tools/bench/verdict_rate.sh (STEPS, SET_ARGS, CONC, WARM, LAPS,
                      EVAL_ARGS; carry data/cuda-l1, fetch_cuda_l1.sh, on `start` only) in a
                      session of its own across device calls, as `real_size`; WAIT_S (540).
                      Output: $OUT/rate.tgz (records, walls.txt, summary.txt, laps); the run
                      stays in data/runs/rate.
  boundary [STEP...]  [the trust boundary on CUDA] tools/bench/boundary_gpu.sh STEP... (fast, test,
                      identity; IDENTITY_MODES), built in BUILD (default /root/bg, outside the
                      checkout). Output: $OUT/selfc_MODE.jsonl, err_VARIANT.log, t_suite.log.
  mps [MODE...]       [the CUDA boundary under MPS] a build (crucible, crucible-device,
                      test_gpu_mps) in BUILD (default /root/bg), test_gpu_mps (the device agent,
                      verdicts, identity, faults and the attacks on MPS; OUT/t_mps.log), then
                      tools/bench/mps_boundary.sh MODE... (default "shared own own_self boundary")
                      into OUT/mps (EVAL_ARGS, SELF_ORDER pass through).
Environment: OUT (./gpu-out), OLD_SRC (old-src), SIDES, WAIT_S, SET, CONC, WARM, EVAL_ARGS,
PRECISION_ONLY, STEPS, CHAIN_ARGS, PARTS, TORCH_CUDA_ARCH_LIST, and those of the scripts above.
EOF
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
MODE="$1"
shift
case "$MODE" in
  throughput | precision | timing | hacks | variants | cuda_l1 | checks | sandbox | suite | decode | chain | grpo | dp | allreduce | real_size | multi | rate | boundary | mps) ;;
  *) echo "gpu_session: unknown mode '$MODE'" >&2; usage >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
# shellcheck source=tools/bench/lent_machine.sh
source "$ROOT/tools/bench/lent_machine.sh" # exports OUT and the library path; lent_setup, lent_configure, lent_build
# build-gpu; the boundary mode builds in BUILD (default /root/bg, outside the checkout).
if [[ $MODE == boundary || $MODE == mps ]]; then export BUILD="${BUILD:-/root/bg}"; else export BUILD="$ROOT/build-gpu"; fi
B="$BUILD"
mkdir -p "$OUT"

old_src() { # OLD_SRC as an absolute path (the other side of hacks, variants, checks, sandbox)
  (cd "${OLD_SRC:-old-src}" && pwd) || { echo "gpu_session: OLD_SRC (${OLD_SRC:-old-src}) is not a checkout" >&2; exit 2; }
}

# ---- modes that outlast a device call: a command in a session of its own, its folder DIR ----
bg_running() { [[ -f "$1/pid" ]] && kill -0 "$(cat "$1/pid")" 2>/dev/null; }

bg_start() { # DIR NAME COMMAND...: COMMAND in a session of its own, unless one runs already
  local dir="$1" name="$2"
  shift 2
  if bg_running "$dir"; then echo "$name: already running"; else
    setsid nohup "$@" </dev/null >"$dir/pipeline.stdout" 2>&1 &
    echo $! >"$dir/pid"
  fi
}

bg_wait() { # DIR NAME COLLECT: until the command ends or WAIT_S seconds pass; COLLECT every minute and at the end
  local dir="$1" name="$2" collect="$3" until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while bg_running "$dir" && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
    echo "[$(date +%T)] $(tail -1 "$dir/pipeline.log" 2>/dev/null)"
    "$collect" >/dev/null # a call cut short by its limit still brings the records back
  done
  if bg_running "$dir"; then echo "$name: still running"; else echo "$name: ended"; fi
  "$collect"
}

PREC="$ROOT/data/runs/precision"
timing_collect() { # one archive: the device tool brings back only a few files a call
  tar czf "$OUT/precision.tgz.part" -C "$PREC" . 2>/dev/null && mv "$OUT/precision.tgz.part" "$OUT/precision.tgz"
  # shellcheck disable=SC2094 # $f is only read; the sed names it
  for f in "$PREC"/*.log; do tr '\r' '\n' <"$f" | grep -v '^$' | tail -1 | sed "s|^|$(basename "$f"): |"; done
}

REAL="$ROOT/data/runs/real"
real_collect() {
  (cd "$REAL" && tar czf "$OUT/real.tgz.part" --exclude='*/model' --exclude='*/checkpoints' \
    --exclude='*/tasks' --exclude='*/workers' . 2>/dev/null) && mv "$OUT/real.tgz.part" "$OUT/real.tgz"
  tail -4 "$REAL/pipeline.log" 2>/dev/null
}

RATE="$ROOT/data/runs/rate"
rate_collect() { # the records, walls and summary (not the builds, caches or the logs' bulk)
  (cd "$RATE" && tar czf "$OUT/rate.tgz.part" --exclude=kb_build --exclude='xdg_*' --exclude='*.log' . 2>/dev/null) &&
    mv "$OUT/rate.tgz.part" "$OUT/rate.tgz"
  cat "$RATE/walls.txt" 2>/dev/null
}

MULTI="$ROOT/data/runs/multi"
multi_collect() {
  (cd "$MULTI" && tar czf "$OUT/multi.tgz.part" --exclude='*/model' --exclude='*/checkpoints' --exclude='*/tasks' \
    --exclude='*/workers' --exclude='*.db' --exclude='*/extensions' . 2>/dev/null) && mv "$OUT/multi.tgz.part" "$OUT/multi.tgz"
  tail -4 "$MULTI/pipeline.log" 2>/dev/null
}

# ---- cuda_l1: a kernel set through crucible eval --pairs, in the background across device calls ----
SET="${SET:-data/cuda-l1/3090.json}"
NAME="$(basename "${SET%.*}")"
RUNS="$ROOT/data/runs"

set_launch() {
  # shellcheck disable=SC2086 # EVAL_ARGS is a list of options
  setsid nohup "$B/tools/crucible" eval --pairs "$SET" --device cuda:0 --out "$RUNS/$NAME.jsonl" --json \
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

case "$MODE" in
  throughput)
    lent_build crucible bench_eval_throughput
    tools/bench/eval_throughput.sh ;;
  precision)
    lent_build crucible
    python3 tools/bench/eval_precision.py --crucible "$B/tools/crucible" --repeat 10 ${PRECISION_ONLY:+--only "$PRECISION_ONLY"} \
      --out "$OUT/precision.json" 2>&1 | tee "$OUT/precision.txt" ;;
  timing)
    mkdir -p "$PREC"
    case "${1:-}" in
      start)
        lent_build crucible
        OUT="$PREC" tools/bench/timing_precision.sh gate smoke
        # shellcheck disable=SC2086 # STEPS is a list of step names
        bg_start "$PREC" timing_precision env OUT="$PREC" tools/bench/timing_precision.sh \
          ${STEPS:-dev6 self-l1 t51-solo hacks kb-dev6 before-dev6 kb-self before-self}
        bg_wait "$PREC" timing_precision timing_collect ;;
      wait) bg_wait "$PREC" timing_precision timing_collect ;;
      collect) timing_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh timing start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  hacks | variants)
    export SIDES="${SIDES:-new old}"
    lent_build crucible
    if [[ " $SIDES " == *" old "* ]]; then
      OLD="$(old_src)" || exit 2
      lent_configure "$OLD" "$OLD/build" "$OUT/configure-old.log" || { tail -30 "$OUT/configure-old.log"; exit 1; }
      export OLD_SRC="$OLD"
    fi
    tools/bench/gpu_candidates.sh "$MODE" "$@" ;;
  cuda_l1)
    mkdir -p "$RUNS"
    case "${1:-}" in
      build) lent_build crucible ;;
      start) lent_build crucible && set_launch && set_wait ;;
      wait) set_wait ;;
      collect) set_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh cuda_l1 build|start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  checks | sandbox)
    lent_setup
    OLD="$(old_src)" || exit 2
    lent_configure "$ROOT" "$B" "$OUT/configure.log"
    lent_configure "$OLD" "$OLD/build" "$OUT/configure-old.log"
    tools/bench/verdict_wall.sh "$OLD" "${1:-3}" ;;
  suite)
    TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" tools/bench/gpu_suite.sh "$@" ;;
  decode)
    lent_build crucible bench_decode test_gpu_engine test_gpu_kernels
    tools/bench/decode.sh ;;
  chain)
    # Chains of dependent kernels with no work but their weight loads: uniform ones, and one with
    # the launch shapes and bytes of a batch-1 decoding step of Qwen2.5-0.5B's shape.
    lent_build bench_kernel_chain
    # shellcheck disable=SC2086 # CHAIN_ARGS is a list of options
    "$B/tools/bench/bench_kernel_chain" ${CHAIN_ARGS:---blocks 14,132,264,1216 --mib 0,6} 2>&1 | tee "$OUT/chain.jsonl" ;;
  grpo)
    lent_build bench_learner test_gpu_kernels
    tools/bench/learner_gpu.sh grpo ;;
  dp | allreduce)
    lent_build crucible bench_learner test_gpu_dp
    tools/bench/learner_gpu.sh "$MODE" ;;
  real_size)
    mkdir -p "$REAL"
    case "${1:-}" in
      start)
        lent_build crucible bench_decode bench_learner
        bg_start "$REAL" real_size env OUT="$REAL" tools/bench/real_size.sh
        bg_wait "$REAL" real_size real_collect ;;
      wait) bg_wait "$REAL" real_size real_collect ;;
      collect) real_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh real_size start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  rate)
    mkdir -p "$RATE"
    case "${1:-}" in
      start)
        lent_build crucible
        bg_start "$RATE" rate env OUT="$RATE" BUILD="$B" PYTHON=python3 tools/bench/verdict_rate.sh
        bg_wait "$RATE" rate rate_collect ;;
      wait) bg_wait "$RATE" rate rate_collect ;;
      collect) rate_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh rate start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  multi)
    mkdir -p "$MULTI"
    case "${1:-}" in
      start)
        lent_build crucible test_gpu_dp test_gpu_train_dp test_gpu_kernels test_gpu_engine bench_learner
        # shellcheck disable=SC2086 # PARTS is a list of part names
        bg_start "$MULTI" multi env OUT="$MULTI" tools/bench/gpu_runs.sh ${PARTS:-tests modes zero four scale}
        bg_wait "$MULTI" multi multi_collect ;;
      wait) bg_wait "$MULTI" multi multi_collect ;;
      collect) multi_collect ;;
      *) echo "usage: tools/bench/gpu_session.sh multi start|wait|collect (--help: all modes)" >&2; exit 2 ;;
    esac ;;
  boundary)
    lent_setup
    lent_configure "$ROOT" "$B" "$OUT/configure.log" || { tail -20 "$OUT/configure.log"; exit 1; }
    tools/bench/boundary_gpu.sh "$@" ;;
  mps)
    lent_build crucible crucible-device test_gpu_mps
    timeout 600 "$B/tests/gpu/test_gpu_mps" -s > "$OUT/t_mps.log" 2>&1
    echo "test_gpu_mps rc=$?"
    grep -E "MESSAGE|ERROR|test cases" "$OUT/t_mps.log" | sed 's/.*MESSAGE: //' | cut -c1-220
    # shellcheck disable=SC2046 # the modes are words
    OUT="$OUT/mps" tools/bench/mps_boundary.sh $([[ $# -gt 0 ]] && echo "$@" || echo shared own own_self boundary) ;;
esac
