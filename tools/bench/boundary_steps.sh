#!/usr/bin/env bash
# tools/bench/boundary_steps.sh start STEP...|wait SECONDS [STEP]|collect: the CUDA boundary's
# figures of docs/PERFORMANCE.md (issues 85 and 89) as one background job on a lent GPU machine,
# one step at a time on the device, across device calls (a call lasts at most 10 minutes; the
# machine stays warm between calls that follow each other).
#
#   start STEP...    the lent set-up and a build (tools/bench/lent_machine.sh, BUILD default
#                    /root/bg, kept out of the carried tree), then the steps in the order given, in
#                    a job of its own; returns at once. Steps:
#                      hacks       test_gpu_evaluator's hack suite across the boundary (its three
#                                  parts, each its own case), HACKS_S seconds (900); HACKS_TC:
#                                  the parts to run (a doctest -tc pattern, default all three,
#                                  "*hack suite on CUDA*"; e.g. "*part 2 of 3*,*part 3 of 3*")
#                      evaluator   test_gpu_evaluator's other cases (all but the hack suite's parts), EV_S
#                                  seconds (600); EV_TC: which (a doctest -tc pattern, default all)
#                      mps         test_gpu_mps, MPS_S seconds (300); MPS_TC: its cases (a doctest -tc
#                                  pattern, default all; "*device agent*": the faults and the
#                                  attacks on the MPS set-up alone)
#                      join        test_gpu_join (a node with cuda:0 joining a run), JOIN_S seconds (300)
#                      handoff     test_gpu_engine's weight handoff across two GPUs (engine.devices:
#                                  a learner on cuda:0, its engine on cuda:1), 300 s
#                      visible     test_gpu_visible (a run under CUDA_VISIBLE_DEVICES naming the last
#                                  GPU judges there; two GPUs), JOIN_S seconds (300)
#                      pairs       tools/bench/mps_boundary.sh own_poll: CUDA-L1's 3090 kernels for
#                                  level1/12, 40, 53 and level2/14 and an identity, with their
#                                  bounds (data/cuda-l1, fetch_cuda_l1.sh)
#                      set         PAIRS=SET tools/bench/mps_boundary.sh own_poll own_shared: the
#                                  pairs of SET across and shared (a file of tools/bench/rate_set.py,
#                                  e.g. its set.jsonl from data/cuda-l1/h100.json; default
#                                  data/cuda-l1/set.jsonl, made where missing: rate_set.py's
#                                  h100.json --torch 18 --inline 6 --self 6 and the 3090
#                                  release's level1/12 and 40); SET_MODES: the modes in their
#                                  order (default "own_poll own_shared"; the shared path's modes
#                                  with SHARED_CRUCIBLE, default the setold step's build: run
#                                  `setold set` with .old-tree at 288dd5a, the shared path's last
#                                  commit)
#                      setold      the same set across (SETOLD_MODES, default "own_poll") with an older
#                                  tree's build, for a timing change's honest figures old and new side
#                                  by side in one job: OLD_TREE (default .old-tree, made here with
#                                  `mkdir .old-tree && git archive REV | tar -x -C .old-tree`, ignored
#                                  through .git/info/exclude, and carried) is copied to /root/old-tree
#                                  and built there (crucible, crucible-device; about 90 s); its
#                                  records in JOB/set-old. Another OLD_TREE, .old-tree-X, is built
#                                  in /root/old-tree-X (a second job's beside the first's)
#                      kbself      KernelBench level 1's references against themselves across,
#                                  tasks KB_FROM (default 1) to KB_TO (100), or KB_RANGES (e.g.
#                                  "45-100,1-20": those ranges' tasks, in that order), KB_S seconds (450),
#                                  on KB_DEVICES (default cuda:0; on two GPUs cuda:0,cuda:1: one
#                                  process, a verdict a device at a time), with EVAL_ARGS (e.g.
#                                  --verbose: each verdict's laps in JOB/kbself.err)
#                                  (data/kernelbench, fetch_kernelbench.sh)
#                      l1set       CUDA-L1's kernels for KernelBench level 1 (L1_RELEASE, default
#                                  data/cuda-l1/h100.json: every task with one, rate_set.py --level 1)
#                                  across on KB_DEVICES, L1_S seconds (900), each beside its task's
#                                  bound (tools/bench/bounds_table.py over docs/bounds-kernelbench-l1.md:
#                                  JOB/l1set/bounds.md; the table's rows filled already keep their
#                                  cells unless this step judged their kernel); records in
#                                  JOB/l1set. L1_TASKS (e.g. "93,97,99,100"): only those tasks'
#                                  kernels; L1_PRIOR: an earlier step's rec.jsonl (carried) that
#                                  the table reads first
#                      rate        tools/bench/verdict_rate.sh: verdicts per GPU-minute, crucible (as
#                                  configured by default) against KernelBench's harness on
#                                  CUDA-L1's H100 pairs, RATE_STEPS (default "kb cold"), RATE_SET_ARGS
#                                  (default "--torch 8 --inline 4 --self 4 --copies 3"), RATE_S
#                                  seconds (900); records in JOB/rate
#                      bounds      tools/bench/task_bounds.py over level 1 from task BOUNDS_FROM (1),
#                                  BOUNDS_S seconds (420)
#                      balance     issue 88: asynchronous against synchronous at the split the pace
#                                  plan gives. BAL_CONFIG (configs/gpu-1.5b-balance.yaml) through its
#                                  warm start and SFT, paused; a probe of BAL_PROBE_STEPS (4; 0: none,
#                                  where the split is fixed) RL steps on BAL_PROBE_DEVICES (cuda:1); `crucible report`'s pace line of
#                                  the probe: "about N evaluator GPUs"; then tools/bench/train_modes.sh,
#                                  BAL_STEPS (12) RL steps each way from the paused run on
#                                  BAL_EVAL_DEVICES (default cuda:1 to cuda:N, at most every GPU but
#                                  cuda:0), BAL_MODES (default "async async-open sync": async-open
#                                  is the asynchronous loop without staleness-aware admission;
#                                  async-engine and sync-engine put the engines on GPUs of their own
#                                  (default cuda:0) and the learner on cuda:1, train_modes.sh's
#                                  ENGINE_DEVICES and LEARNER_DEVICE), and
#                                  each run's report (its GPU busy table and pace lines,
#                                  the plan against the measured step). BAL_ARGS: more KEY=VALUE
#                                  settings for every run; BAL_S seconds in all (3000). Records in
#                                  JOB/balance. Verdicts per minute on one, two and three GPUs: the
#                                  rate step with RATE_STEPS="cold warm1 warm2 warm3"
#                  The job runs from a copy of the tree (SNAP, default /root/tree, made afresh by each
#                  start): the device tool copies the working tree in again at every call, and a
#                  step must not read sources edited after its build. NOBUILD=1: no build (a second
#                  job beside a first that built, started once the first's log says `build done`;
#                  give it a JOB and a SNAP of its own, and CUDA_VISIBLE_DEVICES to keep the two
#                  jobs, their MPS daemons included, on devices of their own).
#   wait SECONDS [STEP]  waits until STEP (default: every step) is done or SECONDS pass, then prints
#                    the job's log; SECONDS at most about 560 to stay inside one device call.
#   collect          packs the job's folder into $OUT/boundary_steps.tgz.
#
# The job's folder is JOB (default /root/boundary-steps): job.log marks each step's start and end
# (`=== STEP done`); each step writes its own logs and records there. Carry data/cuda-l1,
# data/kernelbench, .deps/debs and .whl on the `start` call.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
JOB="${JOB:-/root/boundary-steps}"
export BUILD="${BUILD:-/root/bg}"

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

setold_step() { # the set across with an older tree's build (the setold step)
  # /root/old-tree for .old-tree (the shared path's SHARED_CRUCIBLE), /root/old-tree-X for .old-tree-X:
  # two jobs beside each other can each build an older tree of their own.
  local name
  name=$(basename "${OLD_TREE:-.old-tree}")
  local old="/root/${name#.}"
  rm -rf "$old"
  if ! cp -r "${OLD_TREE:-.old-tree}" "$old"; then
    echo "setold: no older tree in ${OLD_TREE:-.old-tree}"
    return
  fi
  ln -sfn "$ROOT/.deps" "$old/.deps" && ln -sfn "$ROOT/.whl" "$old/.whl"
  # The older tree's own set-up and build, in a shell of its own.
  # shellcheck disable=SC2016 # expanded by that shell
  if ! OUT="$JOB/old" BUILD="$old/build" bash -c 'source "$1/tools/bench/lent_machine.sh" && mkdir -p "$OUT" &&
    lent_build crucible crucible-device' _ "$old" > "$JOB/setold-build.log" 2>&1; then
    echo "setold: the older tree's build failed"
    tail -20 "$JOB/setold-build.log"
    return
  fi
  chmod -R a+rX "$old"
  # shellcheck disable=SC2086 # SETOLD_MODES is a list of modes
  CRUCIBLE="$old/build/tools/crucible" PAIRS="${SET:-data/cuda-l1/set.jsonl}" OUT="$JOB/set-old" \
    tools/bench/mps_boundary.sh ${SETOLD_MODES:-own_poll}
  echo "rc $?"
}

balance_step() { # issue 88's runs (the balance step)
  local out="$JOB/balance" cli="$BUILD/tools/crucible" cfg="${BAL_CONFIG:-configs/gpu-1.5b-balance.yaml}"
  local runs="$JOB/balance/runs" gpus n devices a
  local -a args sets=()
  read -r -a args <<< "${BAL_ARGS:-}"
  for a in "${args[@]}"; do sets+=(--set "$a"); done
  mkdir -p "$runs"
  # The warm start and SFT, paused at SFT's end; then the probe: train_modes.sh's asynchronous copy
  # of the paused run, a few RL steps on one evaluator GPU, and its pace line. The runs at the
  # split below replace that copy.
  # BAL_PROBE_STEPS=0: no probe (where the split is fixed, two GPUs or BAL_EVAL_DEVICES): the
  # paused run alone; the runs at the split print their own plans.
  local probe="${BAL_PROBE_STEPS:-4}" modes=async
  ((probe > 0)) || { modes=none; probe=1; }
  if ! MODES=$modes BASE=base RUNS="$runs" OUT="$out" CLI="$cli" tools/bench/train_modes.sh "$cfg" \
    "$probe" "${sets[@]}" --set "evaluator.devices=[${BAL_PROBE_DEVICES:-cuda:1}]" > "$out/probe.txt" 2>&1; then
    echo "balance: the paused run or the probe failed"
    tail -20 "$out/probe.txt"
    return
  fi
  python3 tools/bench/balance_lines.py sft "$runs/base/metrics.jsonl"
  if [[ $modes == async ]]; then
    "$cli" report "$runs/base-async" > "$out/probe_report.txt" 2>&1
    rm -rf "$runs/base-async/checkpoints" # a 1.5B's is about 21 GB, and the machine's disk holds four runs
    grep -E "^(pace|learning)" "$out/probe_report.txt"
    n=$(grep -oE "about [0-9]+ evaluator GPU" "$out/probe_report.txt" | head -1 | grep -oE "[0-9]+")
  fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [[ -n ${BAL_EVAL_DEVICES:-} ]]; then
    devices=$BAL_EVAL_DEVICES
  else
    if ((gpus < 2)); then
      echo "balance: no GPU for the evaluators besides cuda:0 (set BAL_EVAL_DEVICES)"
      return
    fi
    n=${n:-1}
    ((n > gpus - 1)) && n=$((gpus - 1))
    ((n < 1)) && n=1
    devices=$(seq -s, -f 'cuda:%g' 1 "$n")
  fi
  echo "balance: the plan asks for ${n:-?} evaluator GPUs; the runs judge on [$devices]"
  MODES="${BAL_MODES:-async async-open sync}" BASE=base RUNS="$runs" OUT="$out" CLI="$cli" tools/bench/train_modes.sh "$cfg" "${BAL_STEPS:-12}" \
    "${sets[@]}" --set "evaluator.devices=[$devices]" > "$out/modes.txt" 2>&1
  echo "modes rc $?"
  tail -30 "$out/modes.txt"
  for a in async async-open sync async-engine sync-engine; do
    [[ -d $runs/base-$a ]] || continue
    "$cli" report "$runs/base-$a" > "$out/report_$a.txt" 2>&1
    echo "-- $a"
    grep -E "^(pace|learning)" "$out/report_$a.txt"
    python3 tools/bench/balance_lines.py busy "$runs/base-$a/status.json"
  done
}

run_step() { # STEP: one step, its output in JOB
  local s t
  s=$(date +%s)
  echo "=== $1 start $(date +%T)"
  case "$1" in
    hacks)
      t=$(find "$BUILD" -name test_gpu_evaluator -type f -perm -u+x | head -1)
      timeout "${HACKS_S:-900}" "$t" -s -tc="${HACKS_TC:-*hack suite on CUDA*}" > "$JOB/hacks.log" 2>&1
      echo "rc $?"
      grep -E "hack_.*speedup|test cases|assertions|ERROR|CRASHED" "$JOB/hacks.log" | cut -c1-220 ;;
    evaluator)
      t=$(find "$BUILD" -name test_gpu_evaluator -type f -perm -u+x | head -1)
      timeout "${EV_S:-600}" "$t" -s -tc="${EV_TC:-*}" -tce="*hack suite on CUDA*" > "$JOB/evaluator.log" 2>&1
      echo "rc $?"
      grep -E "MESSAGE|test cases|assertions|ERROR|CRASHED|FAILED" "$JOB/evaluator.log" | cut -c1-220 | tail -60 ;;
    join | visible)
      t=$(find "$BUILD" -name "test_gpu_$1" -type f -perm -u+x | head -1)
      timeout "${JOIN_S:-300}" "$t" -s > "$JOB/$1.log" 2>&1
      echo "rc $?"
      grep -E "test cases|assertions|ERROR|CRASHED|FAILED" "$JOB/$1.log" | cut -c1-220 ;;
    mps)
      t=$(find "$BUILD" -name test_gpu_mps -type f -perm -u+x | head -1)
      timeout "${MPS_S:-300}" "$t" -s -tc="${MPS_TC:-*}" > "$JOB/mps.log" 2>&1
      echo "rc $?"
      grep -E "MESSAGE|test cases|assertions|ERROR|CRASHED" "$JOB/mps.log" | cut -c1-220 ;;
    pairs)
      OUT="$JOB/pairs" timeout 300 tools/bench/mps_boundary.sh own_poll
      echo "rc $?"
      python3 - "$JOB/pairs/rec_own_poll.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        print(" ", str((r.get("input") or {}).get("name") or r.get("pair", ""))[:44], r.get("status"), r.get("speedup"),
              "fraction", r.get("fraction"), r.get("fraction_of"), "reference", r.get("ref_fraction"))
EOF
      ;;
    set)
      if [[ -z ${SET:-} && ! -f data/cuda-l1/set.jsonl ]]; then # the 32-pair set of docs/PERFORMANCE.md
        python3 tools/bench/rate_set.py data/cuda-l1/h100.json "$JOB/set-pairs" --torch 18 --inline 6 --self 6 \
          --copies 1 --also data/cuda-l1/3090.json:1/12 --also data/cuda-l1/3090.json:1/40 &&
          cp "$JOB/set-pairs/set.jsonl" data/cuda-l1/set.jsonl
      fi
      # shellcheck disable=SC2086 # SET_MODES is a list of modes
      # The shared path's modes run an older tree's build (the setold step's, where it ran first).
      SHARED_CRUCIBLE="${SHARED_CRUCIBLE:-/root/old-tree/build/tools/crucible}" PAIRS="${SET:-data/cuda-l1/set.jsonl}" \
        OUT="$JOB/set" tools/bench/mps_boundary.sh ${SET_MODES:-own_poll own_shared}
      echo "rc $?" ;;
    setold) setold_step ;;
    balance) timeout "${BAL_S:-3000}" "$0" _balance ;;
    handoff)
      timeout 300 "$BUILD/tests/gpu/test_gpu_engine" -s -tc="*weight handoff across two GPUs*" > "$JOB/handoff.log" 2>&1
      echo "rc $?"; tail -15 "$JOB/handoff.log" ;;
    kbself)
      rm -rf /tmp/kbself && mkdir -p /tmp/kbself
      python3 tools/bench/reference_as_candidate.py data/kernelbench/level1 /tmp/kbself > /dev/null
      { grep '^#' /tmp/kbself/pairs.tsv
        grep -v '^#' /tmp/kbself/pairs.tsv | awk -F'\t' -v ranges="${KB_RANGES:-${KB_FROM:-1}-${KB_TO:-100}}" \
          '{ n = $1; sub(/.*\//, "", n); split(n, a, "_"); task[NR] = a[1] + 0; line[NR] = $0 }
           END { k = split(ranges, r, ",")
                 for (i = 1; i <= k; ++i) { split(r[i], b, "-"); if (b[2] == "") b[2] = b[1]
                   for (j = 1; j <= NR; ++j)
                     if (!(j in done) && task[j] >= b[1] + 0 && task[j] <= b[2] + 0) { print line[j]; done[j] = 1 } } }'; } > /tmp/kbself/from.tsv
      chmod -R a+rwX /tmp/kbself
      # shellcheck disable=SC2086 # EVAL_ARGS is a list of options
      timeout "${KB_S:-450}" "$BUILD/tools/crucible" eval --pairs /tmp/kbself/from.tsv --device "${KB_DEVICES:-cuda:0}" --no-cache --json \
        --out "$JOB/kbself.jsonl" --set evaluator.cuda_mps=on --set evaluator.extensions_dir=/tmp/kbself/ext \
        ${EVAL_ARGS:-} > "$JOB/kbself_summary.json" 2> "$JOB/kbself.err"
      echo "rc $?; $(wc -l < "$JOB/kbself.jsonl") verdicts"
      python3 tools/bench/band_check.py "$JOB/kbself.jsonl" --self | tail -30 ;;
    l1set)
      rm -rf /tmp/l1set "$JOB/l1set" && mkdir -p /tmp/l1set "$JOB/l1set" && chmod a+rwx /tmp/l1set
      python3 tools/bench/rate_set.py "${L1_RELEASE:-data/cuda-l1/h100.json}" "$JOB/l1set" --level 1 --copies 1
      if [[ -n ${L1_TASKS:-} ]]; then # only these tasks' kernels (e.g. the ones an earlier step did not reach)
        python3 -c 'import json, sys
keep = {int(t) for t in sys.argv[2].split(",")}
lines = [l for l in open(sys.argv[1]) if json.loads(l).get("task_id") in keep]
open(sys.argv[1], "w").writelines(lines)
print(f"l1set: {len(lines)} kernels of tasks {sys.argv[2]}")' "$JOB/l1set/set.jsonl" "$L1_TASKS"
      fi
      # shellcheck disable=SC2086 # EVAL_ARGS is a list of options
      timeout "${L1_S:-900}" "$BUILD/tools/crucible" eval --pairs "$JOB/l1set/set.jsonl" --device "${KB_DEVICES:-cuda:0}" \
        --no-cache --json --out "$JOB/l1set/rec.jsonl" --set evaluator.cuda_mps=on --set evaluator.extensions_dir=/tmp/l1set/ext \
        ${EVAL_ARGS:-} > "$JOB/l1set/summary.json" 2> "$JOB/l1set/eval.err"
      echo "rc $?; $(wc -l < "$JOB/l1set/rec.jsonl") verdicts"
      # L1_PRIOR: an earlier step's records (carried), the table over both (a task's last record wins).
      cat ${L1_PRIOR:+"$L1_PRIOR"} "$JOB/l1set/rec.jsonl" > "$JOB/l1set/all.jsonl"
      python3 tools/bench/bounds_table.py docs/bounds-kernelbench-l1.md "$JOB/l1set/all.jsonl" > "$JOB/l1set/bounds.md"
      tail -c 600 "$JOB/l1set/summary.json" ;;
    rate)
      # Under /tmp: the workers (nobody) load the extensions built into the step's caches.
      rm -rf /tmp/rate && mkdir -p /tmp/rate && chmod a+rwx /tmp/rate
      OUT=/tmp/rate STEPS="${RATE_STEPS:-kb cold}" SET_ARGS="${RATE_SET_ARGS:---torch 8 --inline 4 --self 4 --copies 3}" \
        PYTHON=python3 timeout "${RATE_S:-900}" tools/bench/verdict_rate.sh > "$JOB/rate.log" 2>&1
      echo "rc $?"
      tar -C /tmp --exclude=rate/xdg_cold --exclude=rate/xdg_cold2 --exclude=rate/kb_build -cf - rate | tar -C "$JOB" -xf -
      tail -25 "$JOB/rate.log" ;;
    bounds)
      rm -rf /tmp/bounds-tasks && mkdir -p /tmp/bounds-tasks
      for f in data/kernelbench/level1/*.py; do
        n=$(basename "$f"); ((${n%%_*} >= ${BOUNDS_FROM:-1})) && cp "$f" /tmp/bounds-tasks/
      done
      timeout "${BOUNDS_S:-420}" python3 tools/bench/task_bounds.py /tmp/bounds-tasks --device cuda:0 \
        --out "$JOB/bounds.jsonl" > "$JOB/bounds.txt" 2>&1
      echo "rc $?"; tail -30 "$JOB/bounds.txt" ;;
    *) echo "boundary_steps: unknown step '$1'" ;;
  esac
  echo "=== $1 done $(date +%T) ($(( $(date +%s) - s )) s)"
}

case "${1:-}" in
  -h | --help | "") usage; exit 0 ;;
  start)
    shift
    (($#)) || { echo "boundary_steps: start needs at least one step (--help)" >&2; exit 2; }
    snap="${SNAP:-/root/tree}"
    if [[ $ROOT != "$snap" ]]; then # the job runs from a copy: the tree here is replaced at every device call
      rm -rf "$snap" && mkdir -p "$snap"
      if ! tar -C "$ROOT" --exclude=./build --exclude=./gpu-out -cf - . | tar -C "$snap" -xf -; then
        echo "boundary_steps: cannot copy the tree to $snap" >&2; exit 2
      fi
      exec "$snap/tools/bench/boundary_steps.sh" start "$@"
    fi
    rm -rf "$JOB" && mkdir -p "$JOB"
    # shellcheck disable=SC2016 # expanded by the job's own shell
    setsid nohup bash -c '
      source tools/bench/lent_machine.sh
      export OUT="$1"; shift
      echo "=== build start $(date +%T)"
      if [[ -z ${NOBUILD:-} ]]; then
        lent_build crucible crucible-device test_gpu_evaluator test_gpu_mps test_gpu_join test_gpu_visible test_gpu_engine || { echo "=== build failed"; echo "=== all done"; exit 1; }
      else
        lent_setup # the libraries its LD_LIBRARY_PATH names, under this copy of the tree
      fi
      # The device agent and the workers run as nobody: the build must be reachable.
      chmod a+x /root 2>/dev/null; chmod -R a+rX "$BUILD"
      echo "=== build done $(date +%T)"
      for step in "$@"; do "$0" _step "$step"; done
      echo "=== all done $(date +%T)"' "$0" "$JOB" "$@" > "$JOB/job.log" 2>&1 < /dev/null &
    echo "boundary_steps: started ($*), log $JOB/job.log" ;;
  _step) run_step "$2" ;;
  _balance) balance_step ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    want="=== ${3:-all} done"
    while ((SECONDS < end)); do grep -q -- "$want" "$JOB/job.log" 2>/dev/null && break; sleep 3; done
    tail -80 "$JOB/job.log" ;;
  collect)
    mkdir -p "${OUT:-gpu-out}"
    # Without the balance step's checkpoints and weights (21 GB a 1.5B checkpoint): its runs' records,
    # logs and reports come back.
    tar czf "${OUT:-gpu-out}/boundary_steps.tgz" -C "$(dirname "$JOB")" --exclude='*/self' --exclude='*/checkpoints' \
      --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='verdicts.db*' "$(basename "$JOB")"
    echo "boundary_steps: ${OUT:-gpu-out}/boundary_steps.tgz" ;;
  *) echo "boundary_steps: unknown command '$1' (--help)" >&2; exit 2 ;;
esac
