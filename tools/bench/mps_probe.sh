#!/usr/bin/env bash
# tools/bench/mps_probe.sh: whether the clock's pending cuStreamWaitValue32 slows the other MPS
# client's short kernels, or the hardware queue a new stream lands on does (docs/PERFORMANCE.md,
# "The device agent under MPS (issue 85, third measurement)": under MPS one of a verdict's two
# workers gains 2-16 µs a call on kernels of 3-60 µs, alternating by verdict; without MPS, or on
# kernels of a millisecond, not). tools/bench/mps_probe.cu reproduces crucible's timed sample with
# one kept clock process and two fresh workers a pair, and closes the window four ways: `wait`
# (crucible's pending semaphore acquire), `host` (nothing pending: the clock's host polls a shared
# host word), `event` (an interprocess event), `spin` (a one-block kernel on the done word), `copy`
# (nothing pending: the clock's host reads the done word by 4-byte copies, evaluator.cuda_clock_poll). If the
# alternating gap is there under `wait` and gone under `host`, the pending acquire is the cause
# (hypothesis A); if it stays under `host` and moves with --clock-streams-per-sample or
# --worker-skip-streams, the hardware queue is (hypothesis B). One GPU, run as root on a lent H200
# (no sudo); about two minutes.
#
#   tools/bench/mps_probe.sh [--help]
#
# Builds BUILD/mps_probe (default /tmp/mps_probe_build) with nvcc, starts an MPS control daemon
# (pipe /tmp/mps-probe/pipe, logs /tmp/mps-probe/log) and runs under it, in this order: wait, host,
# copy, event, wait_fresh (a fresh clock stream a sample), wait_skip (each worker's stream one hardware
# queue further on, --worker-skip-streams 1), spin, wait_ba (B started first), wait_50us (~50 µs
# kernels: 24M floats, 20 calls); then stops the daemon (`quit`) and runs nomps_wait, wait without
# MPS, the control. Each run at most 60 s; runs under MPS that would start past MPS_UNTIL - 10 s
# (default 170) are skipped.
# RUNS: the runs under MPS to make, in their order (default the nine above); beside them, a
# handshake a call (--per-call: each call's buffer copied out by the clock before the next call's go,
# as a candidate that hands back one output buffer needs) against one a sample with the same copies
# after done (--copy-out): percall_wait, percall_spin, percall_copy, percall_host and copyout_wait,
# copyout_copy, copyout_host on the short kernels, and percall_copy_10us, percall_host_10us,
# percall_wait_10us, copyout_copy_10us (2M floats, ~10 µs kernels), e.g.
# RUNS="percall_wait percall_copy percall_host copyout_copy copyout_host".
# PAIRS (default 8), SAMPLES (40), CALLS (100) a run; WORKER_CONNECTIONS:
# CUDA_DEVICE_MAX_CONNECTIONS for the workers; PROBE_ARGS: more `mps_probe run` options, every run.
# Outputs: OUT/probe.jsonl (default /tmp/mps_probe_out): a JSON line a pair and a summary line a
# run, each with its "label" (mps or nomps) and options; OUT/RUN.log: each run's stderr;
# OUT/mps_log/: the daemon's logs. On stdout: a line a run (b/a, the time a call, by pair).
# Exit status 1 if any run failed or was skipped.
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(realpath -m "${BUILD:-/tmp/mps_probe_build}")"
OUT="$(realpath -m "${OUT:-/tmp/mps_probe_out}")"
PAIRS="${PAIRS:-8}" SAMPLES="${SAMPLES:-40}" CALLS="${CALLS:-100}"
MPSDIR=/tmp/mps-probe
BIN="$BUILD/mps_probe"
START=$SECONDS
mkdir -p "$BUILD" "$OUT" || exit 1
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
"$NVCC" -arch=sm_90 -O2 -o "$BIN" "$ROOT/tools/bench/mps_probe.cu" || { echo "mps_probe.sh: build failed" >&2; exit 1; }
: >"$OUT/probe.jsonl"

common=(--pairs "$PAIRS" --samples "$SAMPLES")
[[ -n ${WORKER_CONNECTIONS:-} ]] && common+=(--worker-connections "$WORKER_CONNECTIONS")
read -r -a extra <<<"${PROBE_ARGS:-}"
failed=0
# run NAME LABEL UNTIL ARGS...: one `mps_probe run`, for at most 60 s and never past UNTIL seconds
# of the script (skipped with less than 10 s left): the whole script ends within 4 minutes.
run() {
  local name=$1 label=$2 limit=$(($3 - (SECONDS - START))) t0=$SECONDS
  shift 3
  ((limit > 60)) && limit=60
  if ((limit < 10)); then
    echo "$name: skipped (the script's time is spent)"
    failed=1
    return
  fi
  timeout -k 5 "$limit" "$BIN" run --label "$label" --calls "$CALLS" "${common[@]}" "$@" "${extra[@]}" \
    >>"$OUT/probe.jsonl" 2>"$OUT/$name.log"
  local rc=$?
  ((rc == 0)) || { failed=1; echo "$name: FAILED (exit $rc; 124: its time ran out), $OUT/$name.log:"; }
  sed "s/^# /$name: /" "$OUT/$name.log"
  echo "$name: $((SECONDS - t0)) s"
}

mps_started=0
stop_mps() {
  ((mps_started)) || return 0
  local pid
  pid="$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null)"
  echo quit | timeout 20 nvidia-cuda-mps-control
  # The daemon exits once its server has: the control run must not find it.
  if [[ $pid =~ ^[0-9]+$ ]]; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  else
    sleep 2
  fi
  mps_started=0
  rm -rf "$OUT/mps_log"
  cp -r "$CUDA_MPS_LOG_DIRECTORY" "$OUT/mps_log" 2>/dev/null
}
trap stop_mps EXIT
trap 'exit 130' INT TERM

if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$MPSDIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPSDIR/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if [[ -e $CUDA_MPS_PIPE_DIRECTORY/control ]]; then # a daemon of an earlier run
    echo quit | timeout 20 nvidia-cuda-mps-control
    sleep 1
  fi
  rm -rf "${CUDA_MPS_LOG_DIRECTORY:?}"/*
  if nvidia-cuda-mps-control -d; then
    mps_started=1
    # In the order of their worth, should the time run short.
    for r in ${RUNS:-wait host copy event wait_fresh wait_skip spin wait_ba wait_50us}; do
      case "$r" in
        wait | host | copy | event | spin) run "$r" mps "${MPS_UNTIL:-170}" --mode "$r" ;;
        wait_fresh) run wait_fresh mps "${MPS_UNTIL:-170}" --mode wait --clock-streams-per-sample ;;
        wait_skip) run wait_skip mps "${MPS_UNTIL:-170}" --mode wait --worker-skip-streams 1 ;;
        wait_ba) run wait_ba mps "${MPS_UNTIL:-170}" --mode wait --start-order ba ;;
        wait_50us) run wait_50us mps "${MPS_UNTIL:-170}" --mode wait --elems 25165824 --calls 20 ;;
        percall_wait | percall_spin | percall_copy | percall_host) run "$r" mps "${MPS_UNTIL:-170}" --mode "${r#percall_}" --per-call ;;
        copyout_wait | copyout_copy | copyout_host) run "$r" mps "${MPS_UNTIL:-170}" --mode "${r#copyout_}" --copy-out ;;
        percall_*_10us) m=${r#percall_}; run "$r" mps "${MPS_UNTIL:-170}" --mode "${m%_10us}" --per-call --elems 2097152 ;;
        copyout_*_10us) m=${r#copyout_}; run "$r" mps "${MPS_UNTIL:-170}" --mode "${m%_10us}" --copy-out --elems 2097152 ;;
        *) echo "mps_probe.sh: unknown run '$r'" >&2; failed=1 ;;
      esac
    done
    stop_mps
  else
    echo "mps_probe.sh: nvidia-cuda-mps-control -d failed; only the control runs" >&2
    failed=1
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  echo "mps_probe.sh: no nvidia-cuda-mps-control; only the control runs" >&2
  failed=1
fi
[[ -e /tmp/nvidia-mps/control ]] && echo "mps_probe.sh: a daemon at /tmp/nvidia-mps may serve the control run too" >&2
run nomps_wait nomps $((${MPS_UNTIL:-170} + 65)) --mode wait
echo "mps_probe.sh: $((SECONDS - START)) s; JSON lines in $OUT/probe.jsonl"
exit "$failed"
