#!/usr/bin/env bash
# tools/bench/multiturn_gpu.sh: turn 1 against turn 2 of two-turn episodes at real size on one GPU
# (docs/PERFORMANCE.md, "Multi-turn episodes (issue 69)"), with a policy that learned to write code
# in crucible's own SFT stage. configs/gpu-1.5b.yaml (Qwen2.5-Coder-1.5B's shapes, random weights, a
# 512-token BPE trained on the suite) with rollout.turns=2, from crucible in BUILD (default build;
# tools/build.sh builds it first) to the run OUT/gpu-1.5b-2turn (OUT default runs/bench/multiturn),
# its output in OUT/train.log, the device's memory each second in OUT/smi.csv. Overrides (all
# `--set`, the config file unchanged):
#   - SFT_STEPS (150) updates of SFT_BATCH (4) seed variants, every second one a second turn
#     (docs/training.md, "SFT of second turns"), at LR (0.0002) after WARMUP (10) updates, cosine down
#     to LR x MIN_LR_RATIO (0.05) at the last SFT update: RL then trains at 1e-5, the config's own
#     rate;
#   - no self-supervised step;
#   - RL_STEPS (10) RL steps, or RL_MINUTES (5; 0: no limit) of RL, whichever ends first;
#   - MAX_NEW (2560) tokens a turn: the longest seed variant (15_add_layernorm_bf16/cuda_fused.py,
#     4,085 characters, about 2 a token) with its sections passes the config's 2,048.
# EXTRA: more arguments for `crucible train`, e.g. EXTRA="--set rollout.temperature=0.7".
# MAX_SECONDS (0: none): the run is ended (SIGKILL) after that many seconds and the figures are
# taken from the records written so far (a lent machine's lease). FINAL_CHECKPOINT=0 ends the
# process as its final checkpoint (the 1.5B's weights and AdamW state, about 21 GB) begins: every
# step's records are written by then.
# Then `crucible report` (OUT/gpu-1.5b-2turn/report/report.html) and, printed last and kept in
# OUT/turns.txt: the report's "By turn" list; from metrics.jsonl the SFT losses, the RL stage's
# verdicts per turn and per task and turn (samples, correct share, mean speedup of the correct
# ones, format errors, every status) and each RL step's times; from replay.db the format errors'
# reasons and the prompt and completion lengths by turn (characters; tokens of the shortest and
# longest prompt and of the longest completion of each turn).
# PYTHON: python3 with sqlite3 (default .venv/bin/python, else python3).
# The defaults are those of the first run (H200, 2026-11-27, with RL_MINUTES=4.8 MAX_SECONDS=702
# FINAL_CHECKPOINT=0 for the lease): SFT loss 12.09 -> 0.03-0.12 in its last 10 updates, yet every
# RL sample of both turns was a format error at the config's temperature of 1.0. The second (H100,
# 2026-11-28, SFT_STEPS=400 RL_STEPS=6 RL_MINUTES=0 MAX_SECONDS=700 FINAL_CHECKPOINT=0
# EXTRA="--set rollout.temperature=0.3", ended by MAX_SECONDS after 5 RL steps): SFT loss 12.08 ->
# 0.0004-0.0007 in its last 10 updates; turn 1 32 of 40 correct (80%, mean speedup 5.74x, all
# verbatim seed variants), turn 2 0 of 40, each a format error (unterminated fence 27, no code
# block 19, missing section 2 of 48 trained): scrambled CUDA that begins mid-kernel. Keep the final
# checkpoint (the default) to try the SFT policy again (`crucible resume`, `crucible generate`).
#
#   tools/bench/multiturn_gpu.sh
#   SFT_STEPS=300 RL_STEPS=20 RL_MINUTES=0 tools/bench/multiturn_gpu.sh
#   tools/bench/lent_machine.sh tools/bench/multiturn_gpu.sh      # on a lent machine (BUILD=build-gpu)
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/multiturn}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
SFT_STEPS="${SFT_STEPS:-150}" SFT_BATCH="${SFT_BATCH:-4}" LR="${LR:-0.0002}" WARMUP="${WARMUP:-10}"
MIN_LR_RATIO="${MIN_LR_RATIO:-0.05}" RL_STEPS="${RL_STEPS:-10}" RL_MINUTES="${RL_MINUTES:-5}"
MAX_NEW="${MAX_NEW:-2560}" MAX_SECONDS="${MAX_SECONDS:-0}" FINAL_CHECKPOINT="${FINAL_CHECKPOINT:-1}"
NAME=gpu-1.5b-2turn
RUN="$OUT/$NAME"
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
[[ -e $RUN ]] && { echo "multiturn_gpu: $RUN exists; move it away or set OUT" >&2; exit 2; }

ARGS=(--set run.dir="$OUT" --set run.name="$NAME" --set rollout.turns=2
  --set stages.sft.steps="$SFT_STEPS" --set stages.sft.batch="$SFT_BATCH"
  --set learner.lr="$LR" --set learner.warmup_steps="$WARMUP" --set learner.schedule=cosine
  --set learner.total_steps="$SFT_STEPS" --set learner.min_lr_ratio="$MIN_LR_RATIO"
  --set stages.self_supervised.steps=0
  --set stages.rl.steps="$RL_STEPS" --set stages.rl.max_minutes="$RL_MINUTES"
  --set rollout.max_new_tokens="$MAX_NEW")
# shellcheck disable=SC2206 # EXTRA is split on purpose
ARGS+=(${EXTRA:-})
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
echo "$BUILD/tools/crucible train configs/gpu-1.5b.yaml ${ARGS[*]}" | tee "$OUT/command.txt"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 1000 >"$OUT/smi.csv" &
smi=$!
start=$(date +%s)
"$BUILD/tools/crucible" train configs/gpu-1.5b.yaml "${ARGS[@]}" >"$OUT/train.log" 2>&1 &
train=$!
ended=""
while kill -0 "$train" 2>/dev/null; do
  sleep 2
  now=$(date +%s)
  if ((MAX_SECONDS > 0 && now - start >= MAX_SECONDS)); then
    ended="ended after MAX_SECONDS=$MAX_SECONDS"
    kill -KILL "$train" 2>/dev/null
  elif [[ $FINAL_CHECKPOINT == 0 && -d $RUN/checkpoints && -n "$(ls -A "$RUN/checkpoints" 2>/dev/null)" ]]; then
    ended="ended as the final checkpoint began (FINAL_CHECKPOINT=0)"
    kill -KILL "$train" 2>/dev/null
  fi
done
wait "$train"
rc=$?
kill "$smi" 2>/dev/null
echo "multiturn_gpu: train rc $rc after $(( $(date +%s) - start )) s${ended:+, $ended}" | tee -a "$OUT/command.txt"
[[ -f $RUN/metrics.jsonl ]] || { tail -30 "$OUT/train.log"; exit 1; }
"$BUILD/tools/crucible" report "$RUN" >"$OUT/report.log" 2>&1 || cat "$OUT/report.log"

"$PYTHON" - "$RUN" "$BUILD/tools/crucible" <<'EOF' | tee "$OUT/turns.txt"
import html, json, re, sqlite3, statistics, subprocess, sys, tempfile
from collections import defaultdict
run, crucible = sys.argv[1], sys.argv[2]

recs = []
for line in open(f"{run}/metrics.jsonl"):
    try:
        recs.append(json.loads(line))
    except ValueError:
        pass  # a torn last line
kind = lambda r: r.get("event", r.get("kind"))

try:
    page = open(f"{run}/report/report.html").read()
    m = re.search(r'<ul id="turns">(.*?)</ul>', page, re.S)
    print("By turn (the report, every verdict with a turn):")
    for li in re.findall(r"<li>(.*?)</li>", m.group(1) if m else ""):
        print("  " + html.unescape(li))
except OSError:
    print("no report.html")

sft = [r for r in recs if kind(r) == "train_step" and r.get("stage") == "sft"]
if sft:
    print(f"SFT: {len(sft)} updates, loss (step: loss, lr):")
    marks = sorted({0, 1, 2, 4, len(sft) - 1} | set(range(9, len(sft), 10)))
    print("  " + ", ".join(f"{sft[i]['stage_step'] if 'stage_step' in sft[i] else sft[i]['step']}: "
                           f"{sft[i]['loss']:.4f} ({sft[i].get('lr', 0):.2g})" for i in marks if i < len(sft)))
    secs = [r["step_seconds"] for r in sft if "step_seconds" in r]
    if secs:
        print(f"  step seconds: median {statistics.median(secs):.2f}, min {min(secs):.2f}, max {max(secs):.2f}")

ws = [r for r in recs if kind(r) == "verdict" and r.get("stage") == "warm_start"]
if ws:
    print("Warm start (seed variants): " + "; ".join(
        f"{r['task']} {r['status']}" + (f" {r['speedup']:.2f}x" if r.get("speedup") is not None else "") for r in ws))

def table(title, groups):
    print(title)
    for key in sorted(groups):
        v = groups[key]
        n = len(v)
        ok = [x["speedup"] for x in v if x.get("status") == "ok" and x.get("correct") and x.get("speedup") is not None]
        st = defaultdict(int)
        for x in v:
            st[x["status"]] += 1
        fe = st.get("format_error", 0)
        mean = f"{sum(ok) / len(ok):.2f}x" if ok else "-"
        print(f"  {key}: {n} samples, {len(ok)} correct ({100 * len(ok) / n:.1f}%), mean speedup of correct {mean}, "
              f"format errors {fe} ({100 * fe / n:.1f}%); " + ", ".join(f"{k} {c}" for k, c in sorted(st.items())))

rl = [r for r in recs if kind(r) == "verdict" and r.get("stage") == "rl"]
by_turn, by_task_turn = defaultdict(list), defaultdict(list)
for r in rl:
    t = f"turn {r.get('turn', -1) + 1}"
    by_turn[t].append(r)
    by_task_turn[f"{r['task']}, {t}"].append(r)
if rl:
    table(f"RL stage verdicts by turn ({len(rl)}):", by_turn)
    table("RL stage verdicts by task and turn:", by_task_turn)

steps = [r for r in recs if kind(r) == "train_step" and r.get("stage") == "rl"]
if steps:
    print(f"RL steps ({len(steps)}): step seconds, update, waiting for groups, samples, correct share, "
          "format errors, turns (samples/correct share/mean speedup)")
    for r in steps:
        turns = " ".join(f"[{t['samples']}/{t['correct_share']:.2f}/"
                         + (f"{t['mean_speedup']:.2f}" if t.get("mean_speedup") is not None else "-") + "]"
                         for t in r.get("turns", []))
        print(f"  {r['step']}: {r['step_seconds']:.1f} s, {r['seconds']:.1f} s, {r['wait_seconds']:.1f} s, "
              f"{r.get('samples')}, {r.get('correct_share', 0):.3f}, {r.get('format_error_share', 0):.3f}, {turns}")

try:
    db = sqlite3.connect(f"file:{run}/replay.db?mode=ro", uri=True)
    rows = db.execute("SELECT s.turn, p.text, s.completion FROM samples s "
                      "JOIN prompts p ON p.prompt_id = s.prompt_id WHERE s.turn IS NOT NULL").fetchall()
except sqlite3.Error as e:
    rows = []
    print(f"replay.db: {e}")
def tokens(text):  # with the run's own tokenizer
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(text)
        f.flush()
        try:
            out = subprocess.run([crucible, "tokenizer", "encode", "--tokenizer", f"{run}/model", "--file", f.name,
                                  "--no-special", "--json"], capture_output=True, text=True, timeout=60).stdout
            return json.loads(out)["count"]
        except Exception:
            return "?"
try:  # why the format errors were refused, by turn (the samples the learner got)
    kinds = db.execute("SELECT s.turn, substr(v.message, 1, instr(v.message || ':', ':') - 1), count(*) FROM samples s "
                       "JOIN variants v ON v.id = s.variant_id WHERE s.turn IS NOT NULL AND s.fate = 'trained' "
                       "AND v.status = 'format_error' GROUP BY 1, 2 ORDER BY 1, 3 DESC").fetchall()
    for t in sorted({k[0] for k in kinds}):
        print(f"Turn {t + 1} format errors (trained samples): " + ", ".join(f"{k[1]} {k[2]}" for k in kinds if k[0] == t))
except (sqlite3.Error, NameError):
    pass
lens = defaultdict(list)
for t, prompt, completion in rows:
    lens[t].append((prompt, completion))
for t in sorted(lens):
    v = lens[t]
    p = sorted(len(x[0]) for x in v)
    c = sorted(len(x[1]) for x in v)
    lo, hi = min(v, key=lambda x: len(x[0]))[0], max(v, key=lambda x: len(x[0]))[0]
    longest = max(v, key=lambda x: len(x[1]))[1]
    print(f"Turn {t + 1} in replay.db: {len(v)} samples; prompt characters min {p[0]} ({tokens(lo)} tokens), "
          f"median {statistics.median(p):.0f}, max {p[-1]} ({tokens(hi)} tokens); completion characters min {c[0]}, "
          f"median {statistics.median(c):.0f}, max {c[-1]} ({tokens(longest)} tokens); "
          f"completions with a ```python block: {sum('```python' in x[1] for x in v)}")
EOF
