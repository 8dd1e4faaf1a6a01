# tools/bench/eval_sides.sh: sourced by hack_suite_gpu.sh and variants_gpu.sh (GPU machine, after
# tools/bench/isolation_cost.sh has built this checkout in build-gpu and OLD_SRC in OLD_SRC/build).
# eval_sides KEY LABEL TASK CANDIDATE JSONL: one verdict of CANDIDATE on TASK (absolute paths) from
# each side in SIDES ("new old" by default), `crucible eval --json --no-cache` on cuda:0, one JSON
# line a verdict appended to JSONL (KEY: LABEL, side, status, speedup, checks, wall time,
# message); each side's stderr goes to JSONL's folder.
eval_sides() {
  local key="$1" label="$2" task="$3" cand="$4" jsonl="$5" side bin base
  for side in ${SIDES:-new old}; do
    if [[ $side == new ]]; then bin="$ROOT/build-gpu/tools/crucible"; base="$ROOT"; else bin="$OLD_SRC/build/tools/crucible"; base="$OLD_SRC"; fi
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
