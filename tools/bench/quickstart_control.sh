#!/usr/bin/env bash
# tools/bench/quickstart_control.sh: the quickstart against its own frozen-weights control.
#
#   tools/bench/quickstart_control.sh [SEED]...      (default: 1234)
#
# For each seed: tools/quickstart.sh --set run.seed=SEED, keeping the checkpoint written at the
# end of SFT; then a copy of the run directory is rolled back to that checkpoint (later
# checkpoints, the RL records of metrics.jsonl and the sampled variants of replay.db removed)
# and resumed through the same RL steps with the learning rate at 0 (`learner.min_lr_ratio=0`:
# the cosine schedule ends at SFT's last step, so every RL update is scaled by 0). Both reports'
# learning lines are printed one after the other. Whatever the RL run gains over its control
# is learning; what the control itself "gains" is the drift of sampling and measurement alone
# (docs/PERFORMANCE.md, Quickstart). Reproduces the goals table's quickstart row (with seeds
# 1234 11 7). Needs build/tools/crucible (tools/quickstart.sh builds it); no environment
# variables.
set -euo pipefail
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1234)
sft_steps=$(python3 -c "import yaml; print(yaml.safe_load(open('configs/quickstart.yaml'))['stages']['sft']['steps'])")

for seed in "${seeds[@]}"; do
  case "$seed" in ''|*[!0-9]*) echo "quickstart_control: seed '$seed' is not a non-negative integer" >&2; exit 2;; esac
  before=$(ls -d runs/quickstart-* 2>/dev/null | sort || true)
  echo "== seed $seed: tools/quickstart.sh"
  tools/quickstart.sh --set "run.seed=$seed" --set run.checkpoint_every=100 --set run.keep_checkpoints=100
  run=$(comm -13 <(echo "$before") <(ls -d runs/quickstart-* | sort) | tail -1)
  [ -n "$run" ] || { echo "quickstart_control: no new run directory under runs/" >&2; exit 1; }
  ck="$run/checkpoints/step-$sft_steps"
  [ -d "$ck" ] || { echo "quickstart_control: $ck is missing (SFT's last checkpoint)" >&2; exit 1; }
  frozen="$run-frozen"
  rm -rf "$frozen"
  cp -a "$run" "$frozen"
  rm -f "$frozen/run.lock"
  python3 - "$frozen" "$sft_steps" <<'EOF'
import json, os, shutil, sqlite3, sys
run, sft = sys.argv[1], int(sys.argv[2])
cks = os.path.join(run, "checkpoints")
for name in os.listdir(cks):
    if name.startswith("step-") and int(name[5:]) > sft:
        shutil.rmtree(os.path.join(cks, name))
with open(os.path.join(cks, "latest"), "w") as f:
    f.write(f"step-{sft}\n")
kept = []
with open(os.path.join(run, "metrics.jsonl")) as f:
    for line in f:
        rec = json.loads(line)
        if rec.get("stage") == "rl" or rec.get("step", 0) > sft or rec.get("event") in ("run_finished", "run_paused"):
            continue
        kept.append(line)
with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.writelines(kept)
db = sqlite3.connect(os.path.join(run, "replay.db"))
db.execute("DELETE FROM variants WHERE policy_version > 0")  # the warm start's seeds are version 0
db.execute("DELETE FROM hack_checks WHERE variant_id NOT IN (SELECT id FROM variants)")
db.commit()
db.close()
status = os.path.join(run, "status.json")
st = json.load(open(status))
st.update(state="paused", stage="sft", step=sft, policy_version=sft)
json.dump(st, open(status, "w"))
print(f"quickstart_control: {run} rolled back to step {sft}; {len(kept)} records kept")
EOF
  echo "== seed $seed: frozen control, crucible resume $frozen --set learner.min_lr_ratio=0"
  build/tools/crucible resume "$frozen" --set learner.min_lr_ratio=0
  echo "== seed $seed: the run's report"
  build/tools/crucible report "$run" | grep "^learning" || true
  echo "== seed $seed: the frozen control's report"
  build/tools/crucible report "$frozen" | grep "^learning" || true
done
