#!/usr/bin/env bash
# tools/bench/mps_boundary.sh [MODE...]: what the device's switches between contexts cost a verdict
# across the CUDA boundary, and whether CUDA MPS takes them out (docs/PERFORMANCE.md, "The CUDA
# boundary's context switches: MPS (issue 85, first measurement)" and "Sealed copies across the
# CUDA boundary"). On one GPU, run as root on a
# lent machine after its set-up (tools/bench/lent_machine.sh; a build in BUILD, default build-gpu).
# Modes, each one `crucible eval --pairs PAIRS --device cuda:0 --no-cache` into OUT/rec_MODE.jsonl
# (default: all, in this order):
#   shared         the shared path (one worker for the reference and the candidate), with
#                  SHARED_CRUCIBLE: a crucible built from a tree before the path was removed (its
#                  last commit 288dd5a: `mkdir .old-tree && git archive 288dd5a | tar -x -C .old-tree`,
#                  built as boundary_steps.sh's setold step builds it); a mode of the shared path
#                  without it is passed over, saying so
#   boundary       across the trust boundary, as every verdict is
#   user           the same, the whole evaluator run as user 65534 (the control for mps)
#   mps            the same with an MPS control daemon of the script's (root's, its pipe directory
#                  /tmp/nvidia-mps open to every user) given to crucible as CUDA_MPS_PIPE_DIRECTORY
#                  with evaluator.cuda_mps=on: the evaluator's device agent (env/eval/device/device_agent.hpp)
#                  and the workers, both as nobody, are its clients; OUT/mps_MODE/ keeps the
#                  daemon's logs
#   mps_shared     the shared path under the same MPS set-up (SHARED_CRUCIBLE)
#   mps_self       mps on SELF (the CPU suite's references against themselves,
#                  tools/bench/reference_as_candidate.py)
#   user_self      user on SELF
#   own            the boundary with the evaluator's own MPS daemon (evaluator.cuda_mps=on), run as
#                  root (the agent and the workers as nobody); own_shared and own_self: the shared
#                  path (SHARED_CRUCIBLE), and SELF, so
#   own_poll, own_self_poll  own and own_self with evaluator.cuda_clock_poll=true (the clock's window
#                  closed by its host's reads of the done word, not a wait queued on the device)
# Modes without MPS set evaluator.cuda_mps=off.
# PAIRS (default OUT/pairs.jsonl, made from data/cuda-l1/3090.json, tools/bench/fetch_cuda_l1.sh):
# CUDA-L1's kernels for KernelBench level 1 tasks 12, 40, 53 and level 2 task 14, and task 40's
# reference as its own candidate. CRUCIBLE: the binary (default BUILD/tools/crucible). EVAL_ARGS:
# more `crucible eval` options for every mode (e.g. "--verbose --set evaluator.warm_workers=0");
# SELF_ORDER=reverse: SELF's pairs in reverse order (whether a verdict's place in the set or its
# task decides its figure).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build-gpu}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/mps_boundary}")"
CR="${CRUCIBLE:-$BUILD/tools/crucible}"
PIPE=/tmp/nvidia-mps
MPSLOG=/tmp/mps-log
mkdir -p "$OUT"
modes=("$@")
[[ ${#modes[@]} -gt 0 ]] || modes=(shared boundary user mps mps_shared mps_self user_self own own_shared own_self)

PAIRS="${PAIRS:-$OUT/pairs.jsonl}"
if [[ ! -f $PAIRS ]]; then
  python3 - "$ROOT/data/cuda-l1/3090.json" "$PAIRS" <<'EOF' || exit 1
import json, re, sys
want = [(1, 12), (1, 40), (1, 53), (2, 14)]
rows = {}
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        rows[(r["level_id"], r["task_id"])] = r
with open(sys.argv[2], "w") as out:
    for lv, t in want:
        r = dict(rows[(lv, t)], name=f"L{lv}_T{t} (CUDA-L1 3090 release)")
        out.write(json.dumps(r) + "\n")
    r = rows[(1, 40)]
    same = re.sub(r"\bModel\b", "ModelNew", r["ref_code"])  # as tools/bench/reference_as_candidate.py
    out.write(json.dumps(dict(r, custom_code=same, name="L1_T40 reference as candidate (identity)")) + "\n")
EOF
fi
SELF="$OUT/self/pairs.tsv"
[[ -f $SELF ]] || python3 tools/bench/reference_as_candidate.py env/tasks/cpu "$OUT/self" >/dev/null

# Everything the user-65534 modes need: a home, the build readable, a control group it may write.
GROUP="/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/mps-65534"
as_user() {
  mkdir -p /tmp/mps-home "$GROUP" && chown 65534:65534 /tmp/mps-home "$GROUP" "$GROUP"/cgroup.procs \
    "$GROUP"/cgroup.threads "$GROUP"/cgroup.subtree_control
  local d
  for d in "$ROOT" "$BUILD"; do # the checkout and the build reachable (a build under /root is not)
    chmod -R a+rX "$d" 2>/dev/null
    while [[ $d != / ]]; do chmod a+x "$d"; d=$(dirname "$d"); done
  done
  ( echo $BASHPID > "$GROUP/cgroup.procs"
    exec setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp/mps-home TMPDIR=/tmp/mps-home "$@" )
}
mps_start() {
  rm -rf "$PIPE" "$MPSLOG"; mkdir -p "$MPSLOG"; chmod 1777 "$MPSLOG"
  CUDA_MPS_PIPE_DIRECTORY=$PIPE CUDA_MPS_LOG_DIRECTORY=$MPSLOG nvidia-cuda-mps-control -d
  chmod a+rwx,+t "$PIPE"
}
mps_stop() { # $1: where the daemon's logs go
  echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$PIPE nvidia-cuda-mps-control > "$1.servers" 2>&1
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$PIPE timeout 20 nvidia-cuda-mps-control
  mkdir -p "$1" && cp -r "$MPSLOG/." "$1/"
  echo "mps: $(grep -ci 'new client' "$1/control.log") clients connected ($1/control.log)"
}
trap 'echo quit | CUDA_MPS_PIPE_DIRECTORY=$PIPE timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1' EXIT

B=()
S=(--set evaluator.cuda_boundary=false) # the shared path, in SHARED_CRUCIBLE's older build
OFF=(--set evaluator.cuda_mps=off)
ON=(--set evaluator.cuda_mps=on)
for mode in "${modes[@]}"; do
  pairs=$PAIRS args=("${OFF[@]}") user=0 mps=0 cr=$CR
  case "$mode" in
    shared) args+=("${S[@]}") ;;
    boundary) args+=("${B[@]}") ;;
    user) args+=("${B[@]}"); user=1 ;;
    mps) args=("${ON[@]}" "${B[@]}"); mps=1 ;;
    mps_shared) args=("${ON[@]}" "${S[@]}"); mps=1 ;;
    mps_self) args=("${ON[@]}" "${B[@]}"); mps=1; pairs=$SELF ;;
    user_self) args+=("${B[@]}"); user=1; pairs=$SELF ;;
    own) args=("${ON[@]}" "${B[@]}") ;;
    own_shared) args=("${ON[@]}" "${S[@]}") ;;
    own_self) args=("${ON[@]}" "${B[@]}"); pairs=$SELF ;;
    own_poll) args=("${ON[@]}" "${B[@]}" --set evaluator.cuda_clock_poll=true) ;;
    own_self_poll) args=("${ON[@]}" "${B[@]}" --set evaluator.cuda_clock_poll=true); pairs=$SELF ;;
    *) echo "mps_boundary: unknown mode '$mode' (--help)" >&2; exit 2 ;;
  esac
  if [[ $mode == *shared ]]; then
    cr=${SHARED_CRUCIBLE:-}
    if [[ ! -x $cr ]]; then
      echo "mode $mode: passed over: the shared path needs SHARED_CRUCIBLE, a crucible built from a tree before its removal (--help)"
      continue
    fi
  fi
  # Pairs and records where user 65534 reaches them; the records are copied to OUT afterwards.
  mkdir -p /tmp/mps-home/run && cp "$pairs" /tmp/mps-home/run/pairs.${pairs##*.} && chmod -R a+rwX /tmp/mps-home
  [[ $pairs == "$SELF" ]] && cp -r "$(dirname "$SELF")/candidates" /tmp/mps-home/run/
  if [[ $pairs == "$SELF" && ${SELF_ORDER:-} == reverse ]]; then
    { grep '^#' "$SELF"; grep -v '^#' "$SELF" | tac; } > /tmp/mps-home/run/pairs.tsv
  fi
  cmd=("$cr" eval --pairs /tmp/mps-home/run/pairs.${pairs##*.} --device cuda:0 --no-cache --json
       --set evaluator.extensions_dir=/tmp/mps-home/extensions --out /tmp/mps-home/run/rec.jsonl "${args[@]}")
  # shellcheck disable=SC2206 # EVAL_ARGS is a list of options
  [[ -n ${EVAL_ARGS:-} ]] && cmd+=(${EVAL_ARGS})
  rm -f /tmp/mps-home/run/rec.jsonl
  s=$(date +%s)
  if ((mps)); then
    mps_start
    CUDA_MPS_PIPE_DIRECTORY=$PIPE "${cmd[@]}" > "$OUT/sum_$mode.json" 2> "$OUT/err_$mode.log"
    mps_stop "$OUT/mps_$mode"
  elif ((user)); then
    as_user "${cmd[@]}" > "$OUT/sum_$mode.json" 2> "$OUT/err_$mode.log"
  else
    "${cmd[@]}" > "$OUT/sum_$mode.json" 2> "$OUT/err_$mode.log"
  fi
  cp /tmp/mps-home/run/rec.jsonl "$OUT/rec_$mode.jsonl" 2>/dev/null
  echo "mode $mode: $(( $(date +%s) - s )) s"
  python3 - "$OUT/rec_$mode.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]) if __import__("os").path.exists(sys.argv[1]) else []:
    if line.strip():
        r = json.loads(line)
        name = str((r.get("input") or {}).get("name") or r.get("pair", ""))
        print(f'  {name[:44]:44} {r.get("status")} {r.get("message", "")[:90]}')
EOF
done
