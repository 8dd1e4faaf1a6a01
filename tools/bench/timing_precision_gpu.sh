#!/usr/bin/env bash
# tools/bench/timing_precision_gpu.sh start|wait|collect: the timing precision figures of
# docs/PERFORMANCE.md ("Timing precision") on one GPU machine, across several device calls of one
# lease. `start` builds crucible (tools/bench/eval_set_gpu.sh build), checks the gate
# (tools/bench/gate_probe.py) and one verdict in the open, and starts, in a session of its own
# (setsid), one after the other:
#   1. dev6      six released CUDA-L1 kernels, 10 verdicts each (tools/bench/pick_pairs.py; the
#                pairs in data/dev6, made on the development machine), --no-cache, concurrency
#                CONC (6); 6 min 29 s on an H100 on 2026-11-26 (10 min 21 s before the gate)
#   2. self-l1   every KernelBench level 1 task against itself (tools/bench/reference_as_candidate.py
#                on data/kernelbench/level1): crucible eval --pairs
#   3. kb-dev6   KernelBench's own timing of dev6's pairs, 3 verdicts each (tools/bench/kernelbench_timing.py)
#   4. before-dev6  3 verdicts of each dev6 kernel with one call per timed sample
#                (evaluator.sample_ms=0), the protocol before samples of several calls
#   5. kb-self   KernelBench's timing of the first 25 pairs of self-l1 (22 s a task on an H100)
#   6. before-self  the same 25 with one call per timed sample
#   7. t51-solo  L2_T51's ten pairs of dev6 at concurrency 1, --verbose (the worker's laps)
#   8. hacks     every GPU hack candidate (tests/candidates/gpu) once, tools/bench/hack_suite_gpu.sh
# (run in the order 1, 2, 7, 8, 3, 4, 5, 6) then waits like `wait`. STEPS="dev6 self-l1" runs those steps only. `wait` waits until the
# pipeline ends or WAIT_S seconds (540) have passed; `collect` packs every record and log into
# $OUT/precision.tgz. The data folders travel with the `start` call
# (carry data/kernelbench and data/dev6, with .deps/debs and .whl for the build); carry nothing on
# the `wait` calls: a carried folder replaces the one there while the pipeline reads it. The
# machine goes back after 30 s idle, so issue each `wait` as soon as the last returns.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
RUNS="$ROOT/data/runs/precision"
mkdir -p "$OUT" "$RUNS"
export LD_LIBRARY_PATH="$ROOT/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
CRUCIBLE="$ROOT/build-gpu/tools/crucible"
SETARGS=(--device cuda:0 --json --set evaluator.concurrency="${CONC:-6}" --set evaluator.warm_workers="${WARM:-12}")

step() { # NAME: runs the rest, logging to $RUNS/NAME.log, once (a mark file says it is done)
  local name="$1"; shift
  [[ -f "$RUNS/$name.done" ]] && return 0
  if [[ -n "${STEPS:-}" && " $STEPS " != *" $name "* ]]; then return 0; fi
  echo "[$(date +%T)] $name: start" >>"$RUNS/pipeline.log"
  local t0; t0=$(date +%s)
  "$@" >"$RUNS/$name.out" 2>"$RUNS/$name.log"
  echo "[$(date +%T)] $name: rc $? after $(( $(date +%s) - t0 )) s" >>"$RUNS/pipeline.log"
  touch "$RUNS/$name.done"
}

absolute() { # DIR: a pairs file's relative paths made absolute (they were relative to DIR)
  awk -F'\t' -v OFS='\t' -v d="$1" '{ for (i = 1; i <= 2; i++) if (substr($i, 1, 1) != "/") $i = d "/" $i; print }'
}

pipeline() {
  python3 tools/bench/reference_as_candidate.py data/kernelbench/level1 data/self-l1 >/dev/null
  # The partial pair files live with the records, not in the data folders: a later call that
  # carries data/dev6 again replaces that folder while the pipeline runs.
  grep -v '^#' data/self-l1/pairs.tsv | head -25 | absolute "$ROOT/data/self-l1" >"$RUNS/self-l1-25.tsv"
  grep -E '_r[123]\.py$' data/dev6/pairs.tsv | absolute "$ROOT/data/dev6" >"$RUNS/dev6-3.tsv"
  step dev6 "$CRUCIBLE" eval --pairs data/dev6/pairs.tsv --out "$RUNS/dev6.jsonl" --no-cache "${SETARGS[@]}"
  step self-l1 "$CRUCIBLE" eval --pairs data/self-l1/pairs.tsv --out "$RUNS/self-l1.jsonl" "${SETARGS[@]}"
  # L2_T51's ten kernels alone on the device, one verdict at a time, each with the worker's laps
  # (clock, calls per sample, gate timeouts): whether its spread comes from the other verdicts.
  grep -E 'L2_T51_' data/dev6/pairs.tsv | absolute "$ROOT/data/dev6" >"$RUNS/t51.tsv"
  step t51-solo "$CRUCIBLE" eval --pairs "$RUNS/t51.tsv" --out "$RUNS/t51-solo.jsonl" --no-cache --verbose \
    "${SETARGS[@]}" --set evaluator.concurrency=1
  # Every GPU hack candidate once (tests/candidates/gpu): none may be credited.
  step hacks env OUT="$RUNS" SIDES=new OLD_SRC="$ROOT" tools/bench/hack_suite_gpu.sh
  step kb-dev6 python3 tools/bench/kernelbench_timing.py --pairs "$RUNS/dev6-3.tsv" --out "$RUNS/kb-dev6.jsonl" --json
  step before-dev6 "$CRUCIBLE" eval --pairs "$RUNS/dev6-3.tsv" --out "$RUNS/before-dev6.jsonl" --no-cache \
    "${SETARGS[@]}" --set evaluator.sample_ms=0
  # KernelBench's timing took 22 s a task of level 1 on an H100 (2026-11-25): 25 of them.
  step kb-self python3 tools/bench/kernelbench_timing.py --pairs "$RUNS/self-l1-25.tsv" --out "$RUNS/kb-self-l1.jsonl" --json
  step before-self "$CRUCIBLE" eval --pairs "$RUNS/self-l1-25.tsv" --out "$RUNS/before-self-l1.jsonl" --no-cache \
    "${SETARGS[@]}" --set evaluator.sample_ms=0
  echo "[$(date +%T)] pipeline: end" >>"$RUNS/pipeline.log"
}

running() { [[ -f "$RUNS/pid" ]] && kill -0 "$(cat "$RUNS/pid")" 2>/dev/null; }

collect() { # one archive: the device tool brings back only a few files a call
  tar czf "$OUT/precision.tgz.part" -C "$RUNS" . 2>/dev/null && mv "$OUT/precision.tgz.part" "$OUT/precision.tgz"
  for f in "$RUNS"/*.log; do tr '\r' '\n' <"$f" | grep -v '^$' | tail -1 | sed "s|^|$(basename "$f"): |"; done
}

wait_run() {
  local until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while running && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
    echo "[$(date +%T)] $(tail -1 "$RUNS/pipeline.log")"
    collect >/dev/null # every minute: a call cut short by its limit still brings the records back
  done
  if running; then echo "timing_precision: still running"; else echo "timing_precision: ended"; fi
  collect
}

case "${1:-}" in
  start)
    tools/bench/eval_set_gpu.sh build || exit 1
    if [[ ! -f "$RUNS/gate.json" ]]; then # the gate itself (tools/bench/gate_probe.py), in the open
      timeout 120 python3 tools/bench/gate_probe.py --kernels build-gpu/env/harness_kernels.fatbin --json \
        >"$RUNS/gate.json" 2>"$RUNS/gate.log"; echo "gate_probe: rc $?"; cat "$RUNS/gate.json"; tail -5 "$RUNS/gate.log"
    fi
    if [[ ! -f "$RUNS/smoke.done" ]]; then # one verdict first, in the open: a broken build shows here
      python3 tools/bench/reference_as_candidate.py data/kernelbench/level1 data/self-l1 >/dev/null
      timeout 120 "$CRUCIBLE" eval --task data/kernelbench/level1/19_ReLU.py --candidate data/self-l1/candidates/19_ReLU.py \
        --device cuda:0 --no-cache --verbose 2>&1 | grep -oE "timing: [^;]+|^(message|status) .*|.*(error|Error).*" | cut -c1-600
      touch "$RUNS/smoke.done"
    fi
    if running; then echo "timing_precision: already running"; else
      setsid nohup bash "$0" pipeline </dev/null >"$RUNS/pipeline.stdout" 2>&1 &
      echo $! >"$RUNS/pid"
    fi
    wait_run ;;
  pipeline) pipeline ;;
  wait) wait_run ;;
  collect) collect ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
