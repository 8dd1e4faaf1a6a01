#!/usr/bin/env bash
# tools/bench/gpu_session.sh: on a GPU machine (see docs/building.md), builds crucible and runs
# the evaluator and decode figures of docs/PERFORMANCE.md, writing logs to $OUT (or ./gpu-out).
#   tools/bench/gpu_session.sh [gpu_evaluator] [evals] [phases] [initprobe] [firstcall] [placement] [interference] [baselines] [throughput] [connections] [holds] [concurrency] [precision] [probe] [decode] [trace] [projections] [wide] [launch] [halfwarps] [timeline] [chain] [learner] [grpo] [dp] [allreduce]
# PRECISION_ONLY=a,b limits `precision` to those tasks; `probe` runs tools/bench/timing_probe.py
# on two tasks; `trace` profiles decoding at batch 1 (bench_decode --trace; TRACE_KERNELS names the
# variants, by default the engine's kernels, the same with the attention split and combined instead
# of wide, and with every read after the wait); `wide` tests and measures those three side by side (three rotated passes, medians);
# `launch` tests and measures the decoding kernels launching the next as they begin against after their wait
# (and transformers beside them); `halfwarps` tests and measures the one-row gate/up projection a unit
# a half-warp against a unit a warp; `layers` tests and measures a one-row step's layers in one persistent kernel
# against five kernels a layer (LAYERS_HF= adds transformers);
# `chain` measures what a chain of dependent kernels costs by itself (bench_kernel_chain); `timeline`
# times the blocks of a one-row layer's five kernels (TIMELINE_KERNELS names the variants);
# `projections` tests and measures the one-row projections with one and two rounds of weight loads; `gpu_engine` runs the engine's and the fused kernels' GPU tests; `learner` runs the
# data-parallel GPU tests, bench_learner on every GPU and torch.distributed's all-reduce beside it.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT" .deps/prefix
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/prefix; done
PREFIX="$ROOT/.deps/prefix/usr"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The worker needs pyzmq (and the decode comparison transformers); the machine cannot download,
# so wheels carried in .whl/ are installed when an import fails.
python3 -c 'import zmq, transformers' 2>/dev/null || { ls .whl/*.whl >/dev/null 2>&1 &&
  python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/*.whl; }
B=build-gpu
if [[ ! -f $B/build.ninja ]]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRUCIBLE_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$PREFIX;$PREFIX/lib/x86_64-linux-gnu/cmake;$PREFIX/share/cmake" \
    -DCRUCIBLE_PYTHON="$(command -v python3)" -DCRUCIBLE_CUDA=ON > "$OUT/configure.log" 2>&1
fi
targets=(crucible)
[[ " $* " == *" throughput "* || " $* " == *" holds "* || " $* " == *" connections "* || " $* " == *" concurrency "* ]] && targets+=(bench_eval_throughput)
[[ " $* " == *" gpu_evaluator "* ]] && targets+=(test_gpu_evaluator)
[[ " $* " == *" decode "* || " $* " == *" trace "* || " $* " == *" gpu_engine "* || " $* " == *" projections "* || " $* " == *" wide "* || " $* " == *" launch "* || " $* " == *" layers "* || " $* " == *" halfwarps "* || " $* " == *" timeline "* ]] && targets+=(bench_decode test_gpu_engine test_gpu_kernels)
[[ " $* " == *" learner "* || " $* " == *" allreduce "* || " $* " == *" dp "* ]] && targets+=(bench_learner test_gpu_dp)
# The GRPO update alone needs neither the CLI nor the NCCL tests.
[[ "$*" == "grpo" ]] && targets=(bench_learner test_gpu_kernels)
[[ " $* " == *" chain "* ]] && targets+=(bench_kernel_chain)
[[ "$*" == "chain" ]] && targets=(bench_kernel_chain)
start=$(date +%s)
cmake --build $B -j "$(nproc)" --target "${targets[@]}" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "gpu_session: build took $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for what in "$@"; do
  case "$what" in
    precision)
      python3 tools/bench/eval_precision.py --crucible $B/tools/crucible --repeat 10 ${PRECISION_ONLY:+--only "$PRECISION_ONLY"} \
        --out "$OUT/precision.json" 2>&1 | tee "$OUT/precision.txt" ;;
    probe)
      for t in layernorm_manual gelu_tanh_affine; do
        (cd tools/bench && python3 timing_probe.py --task $t --processes 8 --out "$OUT/probe_$t.json") 2>&1 | tail -6 | tee -a "$OUT/probe.txt"
      done ;;
    trace)
      # Where a batch-1 decoding step's time goes: LibTorch's profiler over one call.
      m=/tmp/crucible-decode-0.5b
      [[ -f $m/config.json ]] || python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches 1 --prompt 16 --new 8 --skip-hf > "$OUT/trace_setup.txt" 2>&1
      $B/tools/bench/bench_decode --model $m --device cuda:0 --batches 1 --prompt 512 --new 64 --kernels "${TRACE_KERNELS:-small,small_split,small_late}" \
        --trace "$OUT/trace" > "$OUT/trace.txt" 2>&1
      # Per-kernel time of the median step of each variant; the traces themselves stay behind.
      for f in "$OUT"/trace-*.json; do python3 tools/bench/trace_steps.py "$f"; rm -f "$f"; done 2>&1 | tee "$OUT/trace_steps.txt" ;;
    gpu_evaluator)
      timeout 400 $B/tests/gpu/test_gpu_evaluator -s 2>&1 | tee "$OUT/gpu_evaluator.txt" | tail -60 ;;
    learner)
      # NCCL collectives, DP and ZeRO-1 against one GPU, weight sync; then the learner figures
      # (bf16 matmul rate, GRPO MFU, all-reduce bus bandwidth, DP scaling, weight sync s/GB) and
      # torch.distributed's all-reduce of the same bytes.
      timeout 600 $B/tests/gpu/test_gpu_dp 2>&1 | tail -40 | tee "$OUT/gpu_dp.txt"
      timeout 900 $B/tools/bench/bench_learner 2>&1 | tee "$OUT/learner.jsonl"
      timeout 300 python3 tools/bench/allreduce_torch.py 2>&1 | tee "$OUT/allreduce_torch.jsonl" ;;
    grpo)
      # The fused log-softmax's tests; one GPU's GRPO update (tokens/s, MFU against the measured
      # bf16 matmul rate) with the fused output log-softmax and with LibTorch's, in both orders;
      # then one more update under the profiler: its 40 longest operators and kernels.
      [[ -x $B/tests/gpu/test_gpu_kernels ]] && timeout 300 $B/tests/gpu/test_gpu_kernels -tc='*log-softmax*,*training forward*,*silu_mul_pair*' 2>&1 | tee "$OUT/gpu_kernels_train.txt" | grep -E "worst|ERROR|FAIL|test cases|assertions" | tail -40
      for heads in fused,libtorch libtorch,fused; do
        timeout 300 $B/tools/bench/bench_learner --figures matmul,grpo --kernels $heads 2>&1 | tee -a "$OUT/grpo.jsonl"
      done
      timeout 300 $B/tools/bench/bench_learner --figures grpo --steps 2 --trace /tmp/grpo-trace.json 2>&1 \
        | tee -a "$OUT/grpo.jsonl" | python3 -c 'import json,sys
for line in sys.stdin:
    try: r = json.loads(line)
    except ValueError: print(line.rstrip()); continue
    if r.get("figure") != "grpo_profile": print(line.rstrip()); continue
    print("device ms", round(r["device_ms"], 1))
    kinds = {}
    for t in r["top"]:
        if t["device"] != "cuda": continue
        n = t["name"]
        k = ("gemm" if any(w in n for w in ("nvjet", "gemm", "cutlass", "xmma")) else "attention" if any(w in n for w in ("sdpa", "flash", "fmha"))
             else "crucible" if "crucible" in n else "other")
        kinds[k] = kinds.get(k, 0) + t["total_ms"]
    print("device ms by kind:", {k: round(v, 1) for k, v in sorted(kinds.items())})
    for t in r["top"][:45]: print("%9.2f ms %6d  %-4s %s" % (t["total_ms"], t["count"], t["device"], t["name"][:110]))' ;;
    dp)
      # The data-parallel tests over NCCL, then one GPU's GRPO update (both kernel choices) and
      # data-parallel scaling on every GPU with the fused kernels, and weight sync.
      timeout 300 $B/tests/gpu/test_gpu_dp 2>&1 | tail -20 | tee "$OUT/gpu_dp.txt"
      timeout 400 $B/tools/bench/bench_learner --figures matmul,grpo,scaling,sync --kernels libtorch,fused 2>&1 | tee "$OUT/dp.jsonl" ;;
    allreduce)
      # The gradient all-reduce alone, side by side: our communicator (non-blocking, as shipped),
      # the same with NCCL_COMM_BLOCKING=1, and torch.distributed, twice over; then the DP tests.
      for i in 1 2; do
        $B/tools/bench/bench_learner --figures allreduce --sizes-mb 25,100 2>&1 | tee -a "$OUT/allreduce.jsonl"
        NCCL_COMM_BLOCKING=1 $B/tools/bench/bench_learner --figures allreduce --sizes-mb 25,100 2>&1 \
          | sed 's/"crucible-nccl"/"crucible-nccl-blocking"/' | tee -a "$OUT/allreduce.jsonl"
        timeout 300 python3 tools/bench/allreduce_torch.py --sizes-mb 25,100 2>&1 | tee -a "$OUT/allreduce.jsonl"
      done
      timeout 300 $B/tests/gpu/test_gpu_dp 2>&1 | tail -20 | tee "$OUT/gpu_dp.txt" ;;
    gpu_engine)
      timeout 300 $B/tests/gpu/test_gpu_engine 2>&1 | tee "$OUT/gpu_engine.txt" | tail -40
      timeout 300 $B/tests/gpu/test_gpu_kernels 2>&1 | tee "$OUT/gpu_kernels.txt" | tail -60 ;;
    throughput)
      # Side by side: untimed device work shared (the default) and one at a time, and a fourth
      # and a sixth evaluating thread.
      for run in "3 evaluator.share_untimed=true" "3 evaluator.share_untimed=false" "4 evaluator.share_untimed=true" "6 evaluator.share_untimed=true"; do
        read -r conc setting <<< "$run"
        echo "== concurrency $conc, $setting" | tee -a "$OUT/throughput.txt"
        $B/tools/bench/bench_eval_throughput --device cuda:0 --concurrency "$conc" --candidates 20 --set "$setting" 2>&1 | tee -a "$OUT/throughput.txt"
      done ;;
    connections)
      # Workers' CUDA_DEVICE_MAX_CONNECTIONS: a fresh context's cost under each setting, then
      # throughput at concurrency 4 with 8 (the driver's), 1 and 2 queues, and at 3, 5 and 6 with 1.
      python3 tools/bench/context_probe.py --processes 5 --together 4 --out "$OUT/context_probe.json" 2>&1 | tee "$OUT/context_probe.txt"
      for run in "4 0" "4 1" "4 2" "5 1" "6 1" "3 1"; do
        read -r conc conn <<< "$run"
        echo "== concurrency $conc, evaluator.cuda_max_connections=$conn" | tee -a "$OUT/connections.txt"
        $B/tools/bench/bench_eval_throughput --device cuda:0 --concurrency "$conc" --candidates 20 \
          --set evaluator.cuda_max_connections=$conn 2>&1 | grep -Ev "NVML|raw_cnt|DeprecationWarning|pid = os.fork" | tee -a "$OUT/connections.txt"
      done ;;
    holds)
      # Which steps of a worker's device initialisation wait for no timing (evaluator.init_hold):
      # the context only (the default) against all three, 40 verdicts each (8 per task), with each
      # task's spread under that load, and the time timings waited for untimed work to finish.
      # Alternated (HOLDS_ORDER), since passes of one setting differ by more than the settings do.
      for h in ${HOLDS_ORDER:-context all}; do
        echo "== concurrency 4, evaluator.init_hold=$h" | tee -a "$OUT/holds.txt"
        $B/tools/bench/bench_eval_throughput --device cuda:0 --concurrency 4 --candidates 40 \
          --set evaluator.init_hold=$h 2>&1 | grep -Ev "NVML|raw_cnt|DeprecationWarning|pid = os.fork" | tee -a "$OUT/holds.txt"
      done ;;
    concurrency)
      # Verdicts per minute and the timed share at several concurrencies with the defaults,
      # 40 candidates each (CANDIDATES=N: N) (CONCURRENCIES, in order; both passes of each run count).
      # Each measured pass's gate timeline goes to $OUT/timeline_N_cC.txt, with its breakdown
      # (tools/bench/gate_timeline.py) after the pass's figures. EVAL_SETS: extra --set options for
      # every run; RUN_SETS: "|"-separated, the Nth field's --set options for the Nth run only.
      # LAPS=1: --verbose 1, each run's log in $OUT/laps_N.txt, its steps' medians (eval_laps.py).
      n=0
      IFS='|' read -r -a run_sets <<< "${RUN_SETS:-}"
      for c in ${CONCURRENCIES:-5 6 5}; do
        n=$((n + 1))
        extra="${EVAL_SETS:-} ${run_sets[$((n - 1))]:-}"
        sets=(); for s in $extra; do sets+=(--set "$s"); done
        echo "== concurrency $c $extra" | tee -a "$OUT/concurrency.txt"
        verbose=(); [[ "${LAPS:-}" == 1 ]] && verbose=(--verbose 1)
        $B/tools/bench/bench_eval_throughput --device cuda:0 --concurrency "$c" --candidates "${CANDIDATES:-40}" "${sets[@]}" "${verbose[@]}" \
          --timeline "$OUT/timeline_${n}_c$c.txt" > "$OUT/laps_$n.txt" 2>&1
        grep -Ev "NVML|raw_cnt|DeprecationWarning|pid = os.fork| DEBUG |^\s*$" "$OUT/laps_$n.txt" | tee -a "$OUT/concurrency.txt"
        python3 tools/bench/gate_timeline.py "$OUT/timeline_${n}_c$c.txt" 2>&1 | tee -a "$OUT/concurrency.txt"
        [[ "${LAPS:-}" == 1 ]] && python3 tools/bench/eval_laps.py "$OUT/laps_$n.txt" 2>&1 | tee -a "$OUT/concurrency.txt"
        [[ "${LAPS:-}" == 1 ]] || rm -f "$OUT/laps_$n.txt"
      done ;;
    phases)
      # Three verdicts per GPU candidate in one evaluator, with every phase's elapsed time, the
      # workers' readiness and the timed rounds (--verbose); the first, untimed, builds extensions.
      for n in relu_affine gelu_tanh_affine layernorm_manual row_sumsq softmax_manual; do
        $B/tools/crucible eval --task tools/bench/eval_gpu/tasks/$n.py --candidate tools/bench/eval_gpu/candidates/$n.py \
          --device cuda:0 --no-cache > /dev/null 2>&1
        echo "== $n" >> "$OUT/phases.txt"
        $B/tools/crucible eval --task tools/bench/eval_gpu/tasks/$n.py --candidate tools/bench/eval_gpu/candidates/$n.py \
          --device cuda:0 --no-cache --repeat 3 --verbose >> "$OUT/phases.txt" 2>&1
      done
      grep -E "^==|at \+|ready in|waited|faster|slower" "$OUT/phases.txt" | cut -c1-200 | tail -150 ;;
    firstcall)
      # A Triton and a load_inline candidate's import and first forward call in fresh processes, under cProfile.
      for n in gelu_tanh_affine relu_affine; do
        python3 tools/bench/first_call_probe.py --task tools/bench/eval_gpu/tasks/$n.py \
          --candidate tools/bench/eval_gpu/candidates/$n.py --processes 3 --top 40 2>&1 | tee -a "$OUT/firstcall.txt"
      done ;;
    placement)
      # Whether a kernel's speed depends on its buffers' placement, per fresh process (layernorm_manual's candidate).
      (cd tools/bench && python3 placement_probe.py --task layernorm_manual --model candidate --processes 8 \
        --out "$OUT/placement.json") 2>&1 | tee "$OUT/placement.txt" ;;
    interference)
      # Whether a starting worker's device initialisation disturbs a kernel timed beside it.
      python3 tools/bench/init_interference.py --helpers 12 --out "$OUT/interference.json" 2>&1 | grep -Ev "NVML|raw_cnt" | tee "$OUT/interference.txt" ;;
    initprobe)
      python3 tools/bench/worker_init_probe.py --processes 5 2>&1 | tee "$OUT/initprobe.txt" ;;
    evals)
      # One verdict per GPU candidate with each phase's elapsed time (--verbose).
      for n in relu_affine gelu_tanh_affine; do
        $B/tools/crucible eval --task tools/bench/eval_gpu/tasks/$n.py --candidate tools/bench/eval_gpu/candidates/$n.py \
          --device cuda:0 --no-cache --verbose 2>&1 | tee -a "$OUT/evals.txt"
      done ;;
    baselines)
      # The same candidate against each reference baseline.
      for b in eager compile compile-reduce-overhead cuda-graph; do
        echo "== baseline $b" | tee -a "$OUT/baselines.txt"
        $B/tools/crucible eval --task tools/bench/eval_gpu/tasks/relu_affine.py \
          --candidate tools/bench/eval_gpu/candidates/relu_affine.py --device cuda:0 --no-cache \
          --set evaluator.baseline=$b 2>&1 | tee -a "$OUT/baselines.txt"
      done ;;
    wide)
      # The wide attention (one block per query head, no combine kernel) and the early reads
      # against the split attention and every read after the wait: the GPU tests, then decoding
      # side by side (and LibTorch ops, and transformers).
      timeout 400 $B/tests/gpu/test_gpu_kernels 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -30
      timeout 300 $B/tests/gpu/test_gpu_engine > "$OUT/gpu_engine.txt" 2>&1; grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
      # Three passes, each starting one variant later; each variant's median pass is shown.
      python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches 1,4,16 --prompt 512 --new 512 \
        --rounds 3 --kernels small,small_split,small_late,libtorch --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt" ;;
    launch)
      # Each decoding kernel launching the next as it begins (policy::set_decode_early_launch, at
      # one row) against after its wait: the GPU tests, then decoding side by side (three rotated
      # passes) and transformers' generate.
      timeout 400 $B/tests/gpu/test_gpu_kernels 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -30
      timeout 300 $B/tests/gpu/test_gpu_engine > "$OUT/gpu_engine.txt" 2>&1; grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
      python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches ${LAUNCH_BATCHES:-1,16,64} --prompt 512 --new 512 \
        --rounds 3 --kernels small,small_launch_late --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt" ;;
    halfwarps)
      # The one-row gate/up projection a unit a half-warp (policy::set_small_gemm_half_warps: one
      # wave of blocks) against a unit a warp: the GPU tests, then decoding side by side (three
      # rotated passes; HALFWARPS_HF=--skip-hf leaves transformers out) and the traced batch-1 step of each.
      timeout 300 $B/tests/gpu/test_gpu_kernels -tc="${HALFWARPS_TESTS:-*}" -tce='*persistent*' 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -30
      timeout 300 $B/tests/gpu/test_gpu_engine > "$OUT/gpu_engine.txt" 2>&1; grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
      python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches ${HALFWARPS_BATCHES:-1,16,64} --prompt 512 --new 512 \
        --rounds 3 --kernels ${HALFWARPS_KERNELS:-small,small_gate_up_warps} ${HALFWARPS_HF:-} --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt"
      $B/tools/bench/bench_decode --model /tmp/crucible-decode-0.5b --device cuda:0 --batches 1 --prompt 512 --new 64 \
        --kernels ${HALFWARPS_KERNELS:-small,small_gate_up_warps} --trace "$OUT/trace" > "$OUT/trace.txt" 2>&1
      for f in "$OUT"/trace-*.json; do python3 tools/bench/trace_steps.py "$f"; rm -f "$f"; done 2>&1 | tee "$OUT/trace_steps.txt" ;;
    layers)
      # A one-row step's layers in one persistent kernel (policy::set_decode_layers) against five
      # kernels a layer: its GPU test first, then the other kernel tests and the engine's, then
      # decoding side by side (three rotated passes) and transformers' generate.
      timeout 300 $B/tests/gpu/test_gpu_kernels -tc='*persistent*' 2>&1 | tee "$OUT/gpu_layers.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -20
      timeout 300 $B/tests/gpu/test_gpu_kernels -tce='*persistent*' 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -30
      timeout 300 $B/tests/gpu/test_gpu_engine > "$OUT/gpu_engine.txt" 2>&1; grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
      python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches ${LAYERS_BATCHES:-1,16,64} --prompt 512 --new 512 \
        --rounds 3 --kernels small,small_layers,small_layers_l2 ${LAYERS_HF:---skip-hf} --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt"
      # Where the persistent kernel's layer time goes: its blocks' timeline of the stages.
      $B/tools/bench/bench_decode --model /tmp/crucible-decode-0.5b --device cuda:0 --batches 1 --prompt 512 --new 64 \
        --kernels small_layers,small_layers_l2 --layers-timeline 2>&1 | grep -E "layers_timeline|ms_per_step" | tee "$OUT/layers_timeline.jsonl" ;;
    timeline)
      # Where a one-row layer's time goes with five kernels: the timeline's GPU test, then each
      # variant's blocks stamping the device clock (bench_decode --layers-timeline; the last step,
      # at about the average length of the decode figures), beside its ms/step in the same process.
      timeout 300 $B/tests/gpu/test_gpu_kernels -tc="${TIMELINE_TESTS:-*timeline*,*launch the next as they begin*}" 2>&1 | tee "$OUT/gpu_timeline.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -20
      m=/tmp/crucible-decode-0.5b
      [[ -f $m/config.json ]] || python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches 1 --prompt 16 --new 8 --skip-hf > "$OUT/timeline_setup.txt" 2>&1
      $B/tools/bench/bench_decode --model $m --device cuda:0 --batches 1 --prompt 512 --new 256 --rounds 3 \
        --kernels "${TIMELINE_KERNELS:-small}" --layers-timeline 2>&1 | tee "$OUT/timeline.jsonl" | grep -E "kernels_timeline|error" ;;
    chain)
      # Chains of dependent kernels with no work but their weight loads: uniform ones, and one
      # with the launch shapes and bytes of a batch-1 decoding step of Qwen2.5-0.5B's shape.
      # CHAIN_ARGS replaces the arguments (e.g. several --decode-blocks).
      $B/tools/bench/bench_kernel_chain ${CHAIN_ARGS:---blocks 14,132,264,1216 --mib 0,6} 2>&1 | tee "$OUT/chain.jsonl" ;;
    projections)
      # The one-row projections' single round of weight loads against two rounds: their GPU tests,
      # then decoding side by side (and LibTorch ops, and transformers).
      timeout 300 $B/tests/gpu/test_gpu_kernels -tc='*small-batch*,*fused decoding step*,*greedy*' 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|test cases|assertions" | tail -30
      timeout 300 $B/tests/gpu/test_gpu_engine > "$OUT/gpu_engine.txt" 2>&1; grep -E "ERROR|FATAL|MESSAGE|test cases|assertions" "$OUT/gpu_engine.txt" | tail -40
      python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches 1 --prompt 512 --new 512 \
        --kernels small,small_rounds,libtorch --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt" ;;
    decode)
      # Ours beside transformers' generate on a random Qwen2.5-0.5B-shaped model (made first).
      # transformers must import in python3; wheels in .whl/ are installed if it does not.
      # The engine's GPU tests (CPU/CUDA parity, CUDA graphs against eager; the fused decoding
      # kernels against LibTorch, whose MESSAGE lines give the error figures) first.
      timeout 300 $B/tests/gpu/test_gpu_engine 2>&1 | tail -30 | tee "$OUT/gpu_engine.txt"
      timeout 300 $B/tests/gpu/test_gpu_kernels 2>&1 | tee "$OUT/gpu_kernels.txt" | grep -E "ERROR|FATAL|fused|LibTorch|test cases|assertions" | tail -60
      # Three variants of our engine: the default (small-batch projections at up to 4 rows), the
      # fused kernels with cuBLAS projections, LibTorch ops only.
      python3 tools/bench/decode_compare.py --build $B --device cuda:0 --batches 1,4,16,64 --prompt 512 --new 512 \
        --kernels small,fused,libtorch --out "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt" ;;
  esac
done
