#!/usr/bin/env bash
# tools/bench/eval_set_gpu.sh build|hacks|start|wait|collect: a whole kernel set through `crucible eval --pairs`
# on one GPU machine, across several device calls (each at most 10 minutes) of one lease.
#   build    builds `crucible` in build-gpu (Debian's .debs in .deps/debs, pyzmq in .whl: see
#            docs/building.md).
#   start    builds, and starts the set run in a session of its own (setsid), so it
#            outlives the call; then waits like `wait`.
#   wait     waits until the run ends or WAIT_S seconds (default 540) have passed, printing the
#            progress line every minute.
#   collect  copies the records, the summary and the progress log to $OUT (`wait` does too).
#   hacks    (after start's build, before the set) the GPU hack candidates (tests/candidates/gpu)
#            through `crucible eval --pairs`, checked against their headers
#            (tools/bench/check_expectations.py); records in $OUT/gpu-hacks.jsonl.
# SET names the pairs (default data/cuda-l1/3090.json, tools/bench/fetch_cuda_l1.sh); records go
# to data/runs/NAME.jsonl (an interrupted run resumes from them); CONC and WARM set
# evaluator.concurrency and evaluator.warm_workers (default 6 and 12: candidates' C++ extensions
# build on the host's cores while one candidate is timed). The run's own wall time is the
# summary's `wall_s` (a resumed run counts only its own part; the records' wall_s are per pair).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
SET="${SET:-data/cuda-l1/3090.json}"
NAME="$(basename "${SET%.*}")"
RUNS="$ROOT/data/runs"
mkdir -p "$OUT" "$RUNS"
PREFIX="$ROOT/.deps/prefix/usr"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

build() {
  local t0; t0=$(date +%s)
  mkdir -p .deps/prefix
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/prefix; done
  python3 -c 'import zmq' 2>/dev/null || python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/*.whl
  if [[ ! -f build-gpu/build.ninja ]]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_PREFIX_PATH="$PREFIX;$PREFIX/lib/x86_64-linux-gnu/cmake;$PREFIX/share/cmake" \
      -DCRUCIBLE_PYTHON="$(command -v python3)" -DCRUCIBLE_CUDA=ON >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  fi
  cmake --build build-gpu --target crucible -j "$(nproc)" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "eval_set_gpu: build $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
}

hacks() {
  python3 tools/bench/check_expectations.py --tsv tests/candidates/gpu >"$RUNS/gpu-hacks.tsv"
  rm -f "$RUNS/gpu-hacks.jsonl"
  timeout 400 build-gpu/tools/crucible eval --pairs "$RUNS/gpu-hacks.tsv" --device cuda:0 --out "$RUNS/gpu-hacks.jsonl" \
    --no-cache --json --set evaluator.concurrency="${CONC:-6}" --set evaluator.warm_workers="${WARM:-12}" \
    >"$OUT/gpu-hacks.summary.json" 2>"$OUT/gpu-hacks.progress.log"
  cp "$RUNS/gpu-hacks.jsonl" "$OUT/"
  python3 tools/bench/check_expectations.py "$RUNS/gpu-hacks.jsonl"
}

launch() {
  setsid nohup build-gpu/tools/crucible eval --pairs "$SET" --device cuda:0 --out "$RUNS/$NAME.jsonl" --json \
    --set evaluator.concurrency="${CONC:-6}" --set evaluator.warm_workers="${WARM:-12}" ${EVAL_ARGS:-} \
    >"$RUNS/$NAME.summary.json" 2>"$RUNS/$NAME.progress.log" </dev/null &
  echo $! >"$RUNS/$NAME.pid"
  date +%s >"$RUNS/$NAME.started"
  echo "eval_set_gpu: started $SET (pid $(cat "$RUNS/$NAME.pid"))"
}

running() { [[ -f "$RUNS/$NAME.pid" ]] && kill -0 "$(cat "$RUNS/$NAME.pid")" 2>/dev/null; }

progress() { tr '\r' '\n' <"$RUNS/$NAME.progress.log" 2>/dev/null | grep -v '^$' | tail -1; }

wait_run() {
  local until=$(( $(date +%s) + ${WAIT_S:-540} ))
  while running && (( $(date +%s) < until )); do
    sleep $(( until - $(date +%s) < 60 ? until - $(date +%s) : 60 ))
    echo "[$(( $(date +%s) - $(cat "$RUNS/$NAME.started") )) s] $(progress)"
  done
  if running; then echo "eval_set_gpu: still running"; else echo "eval_set_gpu: ended"; fi
  wc -l <"$RUNS/$NAME.jsonl" 2>/dev/null | sed 's/^/records: /'
  collect >/dev/null
}

collect() {
  cp "$RUNS/$NAME.jsonl" "$RUNS/$NAME.summary.json" "$OUT/" 2>/dev/null
  tr '\r' '\n' <"$RUNS/$NAME.progress.log" | grep -v '^$' >"$OUT/$NAME.progress.log"
  tail -5 "$OUT/$NAME.progress.log"
}

case "${1:-}" in
  start) build && launch && wait_run ;;
  build) build ;;
  hacks) hacks ;;
  wait) wait_run ;;
  collect) collect ;;
  *) sed -n 2,18p "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
