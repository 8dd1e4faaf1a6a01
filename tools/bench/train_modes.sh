#!/usr/bin/env bash
# tools/bench/train_modes.sh CONFIG RL_STEPS [--set KEY=VALUE]...: asynchronous against synchronous
# contrastive RL from the same point, for the same number of samples on the same devices.
#
# 1. `crucible train CONFIG` runs the warm start and SFT and pauses at SFT's end (its checkpoint).
# 2. The paused run is copied twice; each copy is resumed for RL_STEPS RL steps, one with
#    run.mode=async and one with run.mode=sync, each with an empty verdict cache of its own (the
#    compiled-extension cache is shared: the warm start built the seed variants' extensions).
# 3. For each: the RL stage's wall time (resume to the last update, and to the finish), samples,
#    samples/s, and the actor-system overhead per step (tools/bench/actor_overhead.py); then the
#    ratios.
# Results: $OUT/train_modes.json (OUT defaults to ./bench-out), logs beside it.
# To split the work over several calls: BASE=NAME reuses the paused run RUNS/NAME (RUNS defaults
# to $OUT/runs) instead of starting one (each resume takes this call's --set options),
# MODES="async" (or "sync") runs only those modes; MODES may also name async-open, the asynchronous
# loop with stages.rl.admission=open (every rollout actor keeps its groups under way whatever the
# learner's queue holds), for the staleness-aware admission's figures side by side; async-engine
# and sync-engine, each mode with the engines on GPUs of their own (engine.devices=[ENGINE_DEVICES],
# default cuda:0; e.g. "cuda:0,cuda:2" for two engines) and the learner on LEARNER_DEVICE
# (model.device, default cuda:1); the summary is
# written once the async and sync runs exist, with every other mode's run beside them; MODES=none
# only makes the paused run. CLI names the crucible binary (default
# build/tools/crucible). Reproduces the goals table's row "asynchronous RL against synchronous"
# (docs/PERFORMANCE.md), and the runs that tools/bench/actor_overhead.py reads for the
# actor-system overhead.
set -euo pipefail
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLI="${CLI:-$ROOT/build/tools/crucible}"
OUT="${OUT:-$ROOT/bench-out}"
[[ $# -ge 2 ]] || { echo "usage: $0 CONFIG RL_STEPS [--set KEY=VALUE]..." >&2; exit 2; }
cfg=$1 steps=$2
shift 2
mkdir -p "$OUT"
runs="${RUNS:-$OUT/runs}"
base="${BASE:-modes-$(date +%Y%m%d-%H%M%S)}"
# awk reads to the end: leaving early would end `config show` by SIGPIPE, and pipefail this script.
sft=$("$CLI" config show --file "$cfg" "$@" | awk '/^stages:/{s=1} s&&/^  sft:/{t=1} t&&!n&&/^    steps:/{print $2; n=1}')
[[ -n "$sft" && "$sft" -gt 0 ]] || { echo "$0: $cfg has no SFT steps (stages.sft.steps); nothing to start RL from" >&2; exit 2; }
if [[ ! -d "$runs/$base" ]]; then
  echo "== warm start and $sft SFT steps ($cfg): $runs/$base"
  start=$(date +%s)
  "$CLI" train "$cfg" "$@" --set "run.dir=$runs" --set "run.name=$base" --set "stages.rl.steps=$steps" \
    --pause-after "$sft" > "$OUT/$base-sft.log" 2>&1 || { tail -30 "$OUT/$base-sft.log"; exit 1; }
  echo "   $(( $(date +%s) - start )) s"
fi
grep -q '"state":"paused"' "$runs/$base/status.json" || { echo "$0: $runs/$base is not paused" >&2; exit 2; }
modes="${MODES:-async sync}"
[[ $modes == none ]] && modes=""
for mode in $modes; do
  case "$mode" in
    async | sync) how=(--set "run.mode=$mode") ;;
    async-open) how=(--set run.mode=async --set stages.rl.admission=open) ;;
    async-engine | sync-engine)
      how=(--set "run.mode=${mode%-engine}" --set "engine.devices=[${ENGINE_DEVICES:-cuda:0}]"
        --set "model.device=${LEARNER_DEVICE:-cuda:1}") ;;
    *) echo "$0: unknown mode '$mode' (async, sync, async-open, async-engine, sync-engine)" >&2; exit 2 ;;
  esac
  run="$runs/$base-$mode"
  rm -rf "$run"
  cp -r "$runs/$base" "$run"
  rm -f "$run/run.lock"
  sed -i "0,/^  name: .*/s//  name: \"$base-$mode\"/" "$run/config.yaml"
  echo "== $mode: $steps RL steps"
  start=$(date +%s)
  # The --set options again: the paused run may have been made by an earlier call with others
  # (BASE), and this call's (evaluator.devices, say) are the ones its resumes run with.
  "$CLI" resume "$run" "$@" "${how[@]}" --set "stages.rl.steps=$steps" --set "evaluator.cache=$run/verdicts.db" \
    > "$OUT/$base-$mode.log" 2>&1 || { tail -30 "$OUT/$base-$mode.log"; exit 1; }
  echo "   $(( $(date +%s) - start )) s"
  python3 "$ROOT/tools/bench/actor_overhead.py" "$run" | tee "$OUT/$base-$mode-overhead.txt"
done
[[ -f "$runs/$base-async/metrics.jsonl" && -f "$runs/$base-sync/metrics.jsonl" ]] || exit 0
python3 - "$runs/$base" "$OUT/train_modes.json" <<'PY'
import json, os, sys
from datetime import datetime
base, out = sys.argv[1], sys.argv[2]
def t(s): return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
res = {}
for mode in ("async", "sync", "async-open", "async-engine", "sync-engine"):
    if mode not in ("async", "sync") and not os.path.exists(f"{base}-{mode}/metrics.jsonl"):
        continue
    recs = [json.loads(l) for l in open(f"{base}-{mode}/metrics.jsonl")]
    resumed = max(i for i, r in enumerate(recs) if r["event"] == "run_resumed")
    after = recs[resumed:]
    end = [r for r in after if r["event"] == "run_finished"]
    steps = [r for r in after if r["event"] == "train_step" and r.get("stage") == "rl"]
    samples = sum(r.get("samples", 0) for r in steps)
    wall = t(end[-1]["time"]) - t(after[0]["time"]) if end else float("nan")
    # To the last update: the same samples trained on in both modes. The rest of `wall` is the
    # stop: asynchronous rollouts finish the groups they have in flight (rollout.on_stop).
    to_last = t(steps[-1]["time"]) - t(after[0]["time"]) if steps else float("nan")
    correct = sum(r.get("samples", 0) * r.get("correct_share", 0) for r in steps)
    res[mode] = {"rl_steps": len(steps), "samples": samples, "wall_s": wall, "to_last_update_s": to_last,
                 "samples_per_s": samples / to_last,
                 "correct_share": correct / samples if samples else None,
                 "dropped_stale": sum(r.get("dropped_stale", 0) for r in steps)}
res["sync_over_async_wall"] = res["sync"]["wall_s"] / res["async"]["wall_s"]
res["sync_over_async_to_last_update"] = res["sync"]["to_last_update_s"] / res["async"]["to_last_update_s"]
if "async-open" in res:
    res["async_open_over_async_to_last_update"] = res["async-open"]["to_last_update_s"] / res["async"]["to_last_update_s"]
if "async-engine" in res:  # the engine on a GPU of its own, against the synchronous loop on one
    res["sync_over_async_engine_to_last_update"] = res["sync"]["to_last_update_s"] / res["async-engine"]["to_last_update_s"]
    if "sync-engine" in res:
        res["sync_engine_over_async_engine_to_last_update"] = (res["sync-engine"]["to_last_update_s"]
                                                               / res["async-engine"]["to_last_update_s"])
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
