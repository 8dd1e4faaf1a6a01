// core/config_keys.hpp (internal to core/config.cpp): the one declaration of every configuration
// key, its default, its constraint and its documentation, as describe(visitor, config). The
// decoder (YAML to config), the encoder (config to YAML) and the documenter
// (docs/configuration.md) of core/config.cpp each walk it. A new key is one v.field line here.
#pragma once

#include "core/config_values.hpp"

namespace crucible::config_detail {

template <class V>
void describe_learner(V& v, learner_options& l) {
  v.section("learner", "GRPO and SFT updates: losses, AdamW, schedule, micro-batching, LoRA (policy/training/learner.hpp).", [&] {
    v.field("lr", l.lr, "Peak learning rate.", positive<double>("a positive number"));
    v.field("beta1", l.beta1, "AdamW's first-moment decay.", below_one());
    v.field("beta2", l.beta2, "AdamW's second-moment decay.", below_one());
    v.field("eps", l.eps, "AdamW's denominator epsilon.", positive<double>("a positive number"));
    v.field("weight_decay", l.weight_decay,
            "Decoupled weight decay (PyTorch's AdamW: p -= lr * weight_decay * p), on matrices and embeddings only.",
            non_negative_number());
    v.field("warmup_steps", l.warmup_steps, "Linear warm-up: update n (from 1) uses lr * n / warmup_steps.",
            at_least(0, "an integer ≥ 0"));
    v.field("schedule", l.schedule, "Learning rate after the warm-up.");
    v.field("total_steps", l.total_steps,
            "`cosine`: the update at which the rate reaches lr * min_lr_ratio (and stays); unused by `constant`.",
            at_least(0, "an integer ≥ 0"));
    v.field("min_lr_ratio", l.min_lr_ratio, "Floor of the cosine schedule as a fraction of lr.",
            between(0, 1, "a number between 0 and 1"));
    v.field("grad_clip", l.grad_clip, "Global L2 norm the gradient is clipped to; 0: no clipping.", non_negative_number());
    v.field("reset_moments", l.reset_moments,
            "A training stage (SFT, self-supervised, RL) that follows another stage's updates starts with fresh AdamW "
            "moments (the learning-rate schedule goes on), as a separate run would; false: the moments carry over. "
            "Fresh moments make the first updates about lr on every weight: pair them with a lower rate for the stage.");
    v.field("micro_batch_tokens", l.micro_batch_tokens,
            "Padded tokens (rows × longest row) per forward/backward; gradients accumulate over micro-batches.",
            positive<std::int64_t>("a positive integer"));
    v.field("activation_checkpointing", l.activation_checkpointing,
            "Keep of each decoder layer only its input during the training forward and run the layer again in the "
            "backward pass: activation memory falls from every layer's intermediates to one input per layer, for one "
            "more forward of each layer (about a third more compute per update). Gradients are unchanged "
            "(docs/learner.md). Works with LoRA, data parallel (overlap, ZeRO-1) and the fused kernels.");
    v.field("clip_low", l.clip_low, "The ratio is clipped below at 1 - clip_low.", below_one());
    v.field("clip_high", l.clip_high, "The ratio is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28).",
            non_negative_number());
    v.field("kl_coef", l.kl_coef,
            "Weight of the per-token KL to the frozen reference model; 0: no reference. The reference is the policy "
            "as the RL stage starts: the model directory's weights, or, after SFT or self-supervised updates, a copy "
            "of the policy taken before the first GRPO update (kept in checkpoints).",
            non_negative_number());
    v.field("kl_estimator", l.kl, "KL estimator: `k1` (logp - ref_logp) or `k3` (exp(d) - d - 1, d = ref_logp - logp).");
    v.field("aggregation", l.aggregation,
            "Per-token losses to one number: token mean over the batch, mean of sequence means, or sum / (sequences × "
            "constant_tokens).");
    v.field("constant_tokens", l.constant_tokens,
            "Normaliser of `constant` (Dr.GRPO: the generation budget); 0: the batch's longest completion.",
            at_least(0, "an integer ≥ 0"));
    v.field("std_normalize", l.std_normalize, "Divide group advantages by the group's standard deviation (false: Dr.GRPO).");
    v.field("std_eps", l.std_eps, "Advantage = (r - mean) / (std + std_eps).", positive<double>("a positive number"));
    v.field("negative_weight", l.negative_weight,
            "Scale of negative advantages: 1 is GRPO; 0 reinforces only the samples better than their group's mean, "
            "and samples worse than it carry no gradient (docs/training.md).",
            between(0, 1, "a number between 0 and 1"));
    v.field("reward_transform", l.rewards,
            "Before advantages: `normalize_clip` (CUDA-L1) standardises the batch's rewards and clips them to ±reward_clip.");
    v.field("reward_clip", l.reward_clip, "k of `normalize_clip`.", positive<double>("a positive number"));
    v.field("is_cap", l.is_cap,
            "Cap of the stale-sample weight min(exp(old_logp - behaviour_logp), is_cap) on each token's loss; 0: no "
            "correction.",
            non_negative_number());
    v.field("turn_return", l.turn_returns,
            "Multi-turn episodes (rollout.turns > 1): a turn's return from its episode's rewards: `discounted` "
            "(the return-to-go, sum of gamma^k r_{t+k}), `best` (the best gamma^k r_{t+k} from that turn on) or "
            "`immediate` (the turn's own reward).");
    v.field("turn_gamma", l.turn_gamma, "Discount of later turns' rewards in a turn's return (Kevin-32B: 0.4).",
            between(0, 1, "a number between 0 and 1"));
    v.field("turn_advantage", l.turn_advantages,
            "Multi-turn episodes: a turn's advantage across its group's episodes that reached that turn: `grpo` (the "
            "return's deviation from their mean, divided by their std when std_normalize) or `trloo` (the return "
            "minus the mean of the others' returns at that turn, Dr.Kernel's turn-level leave-one-out).");
    v.field("old_logprobs", l.old_log_probs,
            "The ratio's denominator: recomputed by a no-grad forward, the engine's behaviour log-probs, or `auto` "
            "(behaviour when every sample is on-policy).");
    v.field("dtype", l.dtype, "Parameter dtype; with bfloat16 the optimiser keeps float32 master weights and state.",
            learner_dtype());
    v.field("lora", l.lora, "Train LoRA adapters only (the base weights stay frozen).");
    v.field("lora_rank", l.lora_rank, "LoRA rank.", positive<std::int64_t>("a positive integer"));
    v.field("lora_alpha", l.lora_alpha, "LoRA scale numerator: scale = lora_alpha / lora_rank.",
            positive<double>("a positive number"));
    v.field("lora_targets", l.lora_targets, "Projections that get an adapter.", lora_target_list());
    v.field("devices", l.devices,
            "Data parallel: one learner rank per device, `cpu` or `cuda:N` (all CPU or all CUDA, no GPU twice); the "
            "first must be `model.device`, where rank 0 trains (beside the engine, unless `engine.devices` names other "
            "GPUs) and hands the engine each version. Each rank "
            "loads the model onto its device and trains on its share of every batch (groups r, r + N, ...), so "
            "`stages.*.groups` and `stages.sft.batch` must be at least the number of ranks. On the CPU the ranks are "
            "threads (`cpu` repeated); on GPUs they reduce over NCCL. Empty: one learner on `model.device` "
            "(docs/learner.md).",
            learner_device_list());
    v.field("bucket_mb", l.bucket_mb,
            "Data parallel: MiB of float32 gradient reduced per collective; buckets fill in backward order and are "
            "reduced as each completes.",
            positive<double>("a positive number"));
    v.field("overlap", l.overlap,
            "Data parallel: reduce each gradient bucket during the last micro-batch's backward pass, as soon as it is "
            "complete (false: all buckets after the backward).");
    v.field("zero1", l.zero1,
            "Data parallel: shard AdamW's moments and float32 master weights over the learners (ZeRO-1: gradients "
            "reduce-scattered, parameters all-gathered after the update).");
    v.field("memory_check", l.memory_check,
            "On CUDA, refuse to start when `crucible memory-plan --config` of this configuration (learner state, "
            "activations, engine; docs/scaling.md) exceeds a learner GPU's memory, naming both figures, instead of "
            "running out of memory while loading. false: start anyway (the plan is an estimate).");
    v.field("collective_timeout_s", l.collective_timeout_s,
            "Seconds a collective (gradient reduction, weight sync) may take; past it the call fails naming the "
            "operation and rank, and the communicator is aborted.",
            positive<double>("a positive number"));
    v.field("sync_bucket_mb", l.sync_bucket_mb,
            "Weight sync: MiB of weights per broadcast from the learner to the engines; larger tensors go alone.",
            positive<double>("a positive number"));
  });
}

template <class V>
void describe(V& v, config& c) {
  v.section("run", "Naming and placing the run.", [&] {
    v.field("name", c.run.name, "Run name; the run directory is `run.dir/run.name`.", run_name());
    v.field("dir", c.run.dir, "Directory that holds the run directories.", non_empty());
    v.field("seed", c.run.seed, "Root of every random stream in the run.");
    v.field("publish", c.run.publish,
            "ZeroMQ endpoint on which the coordinator publishes events and metrics for `crucible "
            "watch` (port 0: any free port; the bound endpoint goes into status.json as `publish`). "
            "Loopback by default; empty publishes nothing.",
            zmq_endpoint());
    v.field("heartbeat_s", c.run.heartbeat_s, "Seconds between heartbeats (the run's status) on `run.publish`.",
            positive<double>("a positive number"));
    v.field("mode", c.run.mode,
            "`async`: rollouts keep sampling and evaluating while the learner trains, bounded by "
            "`stages.rl.max_staleness`; `sync`: each step samples its groups, evaluates them, trains, then samples again.");
    v.field("checkpoint_every", c.run.checkpoint_every,
            "Learner steps between checkpoints (`RUN/checkpoints/`); 0: only when the run pauses or ends.",
            at_least(0, "a non-negative integer"));
    v.field("pause_grace_s", c.run.pause_grace_s,
            "A pause (crucible pause, SIGINT, SIGTERM) waits this long for the step under way; then, if that step only "
            "waits for groups (rollouts that are slow, or evaluators that went silent), it ends without training and "
            "the run pauses at the last completed step (the groups that had arrived are not trained on). A step in "
            "its update or its evaluations is waited for, and the log says so. 0: always wait.",
            non_negative_number());
    v.field("stall_timeout_s", c.run.stall_timeout_s,
            "The longest the trainer waits for the learner's answer (an update, a checkpoint) or, while a step waits "
            "for rollout groups, for the next group. Past it the role is named as silent in the log and the run stops "
            "with that error (state `crashed`); its last checkpoint stays, and `crucible resume` goes on from there. "
            "Groups are checked once a period: a step is stopped after one to two periods without a group. 0: wait "
            "for ever.",
            non_negative_number());
    v.field("on_pause", c.run.on_pause,
            "Groups in flight when the run pauses: `finish` them (their variants are stored) or `drop` them (their "
            "prompts are sampled again after resume).");
    v.field("keep_checkpoints", c.run.keep_checkpoints, "Checkpoints kept; older ones are removed once a newer one is complete.",
            positive<std::int64_t>("a positive integer"));
  });
  v.section("log", "Logging to stderr and to the run directory's `events.log`.", [&] {
    v.field("level", c.log.level, "Threshold for messages on stderr.");
    v.field("file_level", c.log.file_level, "Threshold for messages in `events.log`.");
    v.field("tensorboard", c.log.tensorboard,
            "Write TensorBoard event files of every metrics record into the run's `tensorboard/` as the run "
            "goes (tools/metrics_tensorboard.py, with the workers' Python; its output in `tensorboard.log`; "
            "docs/report.md). Without tensorboard in that Python the run says so once and goes on.");
    v.field("wandb", c.log.wandb,
            "Also write an offline Weights & Biases run of the same records into the run's `wandb/` as the run "
            "goes (the same writer, with wandb in the workers' Python); upload it with `wandb sync RUN/wandb/"
            "latest-run`. Rewritten from metrics.jsonl at each start, so a step done again after a resume "
            "appears once. Without wandb in that Python the run says so once and goes on.");
  });
  v.section("actors", "The actor system of each crucible process.", [&] {
    v.field("threads", c.actors.threads, "Scheduler worker threads; 0 means one per core.",
            at_least(0, "a non-negative integer"));
  });
  auto& e = c.evaluator;
  v.section("evaluator", "Sandboxed workers, correctness trials and the timing protocol (docs/evaluator.md).", [&] {
    v.field("python", e.python, "Python interpreter of the workers; empty: `.venv/bin/python` of the checkout, else `python3`.");
    v.field("devices", e.devices, "Devices with one evaluator each: `cpu` or `cuda:N`. The policy's own GPU (model.device, engine.devices, learner.devices) may be one of them: its evaluator then times verdicts between the policy's generations and updates, never beside them (docs/evaluator.md, Evaluators on every GPU).", device_list());
    v.field("concurrency", e.concurrency, "Evaluations in flight per device; candidates compile while another is timed.",
            positive<std::int64_t>("a positive integer"));
    v.field("warm_workers", e.warm_workers, "Idle pre-started workers per device (torch imported, device initialised). A worker forked "
            "from the zygote starts in well under a second; one started as a new interpreter takes seconds, longer "
            "than a warm verdict.",
            at_least(0, "a non-negative integer"));
    v.field("refill", e.refill,
            "When the warm pool replaces the workers evaluations take. `at-once`: as soon as one is taken; on a GPU "
            "its start (its CUDA context above all) then runs beside the evaluations in flight, and the next "
            "timing's measured rounds wait for it. `when-idle`: while no evaluation is in flight on the device, "
            "several at once, and one at a time while the pool is empty. With a pool as large as the bursts of "
            "candidates that arrive (configs/gpu-*.yaml), a burst is timed without worker starts: on an H100, 20 "
            "queued candidates at concurrency 6 with 20 warm workers had timing 81-89% of the wall, against 65-79% "
            "with at-once and 6 (docs/evaluator.md, The warm pool).");
    v.field("trials", e.trials, "Correctness trials, each on fresh random inputs; distributions alternate.",
            positive<std::int64_t>("a positive integer"));
    v.field("rounds", e.rounds, "Timed paired rounds (reference and candidate, order random per round) per measurement.",
            at_least(4, "an integer ≥ 4"));
    v.field("max_rounds", e.max_rounds, "Upper bound on rounds when unstable measurements are extended.",
            at_least(4, "an integer ≥ 4"));
    v.field("min_rounds", e.min_rounds,
            "A measurement stops after this many rounds when their band is already within `early_stop_spread` "
            "and their buckets agree; otherwise it goes on to `rounds`.",
            at_least(4, "an integer ≥ 4"));
    v.field("early_stop_spread", e.early_stop_spread,
            "Band (relative half-width) within which a measurement stops at `min_rounds`; 0: every measurement "
            "takes `rounds`.",
            non_negative_number());
    v.field("slow_stop_rounds", e.slow_stop_rounds,
            "A first look at a measurement after this many rounds: a candidate whose whole band, and every "
            "bucket's mean, already lies below `slow_stop_below` times the reference's speed is clearly slower and "
            "its measurement ends there (its speedup is the measured figure, below 1). 0: no such look. At least "
            "evaluator.buckets. Error rates of the rule: docs/evaluator.md, Timing: stopping a clearly slower "
            "candidate early.",
            at_least(0, "an integer ≥ 0"));
    v.field("slow_stop_below", e.slow_stop_below,
            "The speedup below which a candidate's whole band must lie for the look after `slow_stop_rounds` "
            "to end its measurement.",
            between(0.01, 1, "a number between 0.01 and 1"));
    v.field("warmup_ms", e.warmup_ms,
            "Untimed paired rounds before a verdict's first measurement (after idle seconds a GPU's clocks are "
            "low and the first rounds run slower): at least 3 rounds, and more until this many milliseconds have "
            "passed; 0: 3 rounds. Later measurements of the verdict (more rounds, a recheck) follow at once.",
            non_negative_number());
    v.field("buckets", e.buckets, "Buckets of consecutive rounds; the speedup is the median of their mean ratios.",
            at_least(2, "an integer ≥ 2"));
    v.field("max_spread", e.max_spread, "Widest acceptable 95% band (relative half-width) before adding rounds.",
            positive<double>("a positive number"));
    v.field("band_floor", e.band_floor,
            "Relative half-width by which repeated verdicts of one kernel differ beyond their own rounds' band "
            "(each verdict's fresh worker, allocations and device state), added in quadrature to that band: the "
            "band a verdict reports and credits by. 0.015: the smallest floor under which 95% of 10 repeated "
            "verdicts of six kernels covered each other on an H100 (docs/evaluator.md, Timing: the band).",
            between(0, 1, "a number between 0 and 1"));
    v.field("max_bucket_disagreement", e.max_bucket_disagreement,
            "Largest (max − min bucket mean) / speedup before adding rounds.", positive<double>("a positive number"));
    v.field("win_threshold", e.win_threshold, "A speedup counts as a win only above this.", positive<double>("a positive number"));
    v.field("recheck_above", e.recheck_above, "Speedups above this are measured again (on a second device of the same kind if any).",
            positive<double>("a positive number"));
    v.field("recheck_tolerance", e.recheck_tolerance, "Relative disagreement of the two measurements above which the candidate is rejected.",
            between(0, 1, "a number between 0 and 1"));
    v.field("recheck_rounds", e.recheck_rounds,
            "Rounds of the second measurement of a speedup above `recheck_above` on the same device: it only has "
            "to agree with the first within `recheck_tolerance`; when it does, the speedup comes from the rounds "
            "of both together.",
            at_least(4, "an integer ≥ 4"));
    v.field("baseline", e.baseline, "What the speedup is measured against.");
    v.field("flush_bytes", e.flush_bytes, "Bytes written to flush caches before each timed call; 0: 256 MiB on CUDA, 64 MiB on CPU.");
    v.field("sample_ms", e.sample_ms,
            "A timed sample lasts about this long: each model is called several times back to back between one "
            "start and one stop, each call on its own fresh inputs, as many calls as make the faster model's "
            "sample last this long by the first calls' times (at most `max_calls`, fewer where the inputs would not "
            "hold more than 256 MiB of inputs a sample, and one call a sample once two calls hand back the same "
            "memory). A single call of a "
            "10 us kernel is as short as the clock's jitter; 0: one call per sample. The times are per call "
            "(docs/evaluator.md, Timing).",
            non_negative_number());
    v.field("max_calls", e.max_calls, "Most calls in one timed sample (`sample_ms`).", positive<std::int64_t>("a positive integer"));
    v.field("placement_jitter_bytes", e.placement_jitter_bytes,
            "Each timing round copies its inputs into allocations with a random lead of up to this many bytes, so a "
            "verdict averages over many buffer placements (a kernel's speed can depend on where its buffers lie); "
            "0: off. Both workers allocate the timed samples' input buffers anew every round, each at such a lead.");
    v.field("quiet_gc", e.quiet_gc,
            "When a job arrives, the worker moves every object alive (torch, the harness and its snapshots) out of "
            "the reach of Python's cyclic garbage collector: a full collection over those objects took 162-170 ms "
            "on an H100's host. The job's own objects are still collected outside timing; during the timing both "
            "workers turn the collector off, as timeit does, whatever this says.");
    v.field("eval_mode", e.eval_mode,
            "false: Model and ModelNew run in training mode, as modules are built and as KernelBench's harness runs "
            "them (BatchNorm normalises with the batch's statistics, Dropout drops). true: both are put in eval mode "
            "(`.eval()`) once constructed, as CUDA-L1's harness does, so BatchNorm uses its running statistics and "
            "Dropout passes its input through: kernels written for inference (a BatchNorm folded into a convolution) "
            "are judged by the function they were written for (docs/evaluator.md, Correctness).");
    v.field("fp32_atol", e.fp32_atol, "Absolute tolerance for float32 (and float64) outputs.", non_negative_number());
    v.field("fp32_rtol", e.fp32_rtol, "Relative tolerance for float32 (and float64) outputs.", non_negative_number());
    v.field("fp16_atol", e.fp16_atol, "Absolute tolerance for float16 outputs.", non_negative_number());
    v.field("fp16_rtol", e.fp16_rtol, "Relative tolerance for float16 outputs.", non_negative_number());
    v.field("bf16_atol", e.bf16_atol, "Absolute tolerance for bfloat16 outputs.", non_negative_number());
    v.field("bf16_rtol", e.bf16_rtol, "Relative tolerance for bfloat16 outputs.", non_negative_number());
    v.field("rounding_factor", e.rounding_factor,
            "Outputs may differ from the reference by this many times the reference's own rounding error, beyond atol and rtol: per output and trial, the largest difference between the reference's output and a float64 copy of the reference on the same inputs. A sum taken in another order stays within it; a result computed in lower precision does not. 0: the fixed tolerances only.", non_negative_number());
    v.field("start_timeout_s", e.start_timeout_s, "Deadline for a worker to start (torch import, device initialisation).",
            positive<double>("a positive number"));
    v.field("reference_timeout_s", e.reference_timeout_s, "Deadline for the reference outputs of all trials.",
            positive<double>("a positive number"));
    v.field("load_timeout_s", e.load_timeout_s, "Deadline for importing the candidate, extension builds included.",
            positive<double>("a positive number"));
    v.field("run_timeout_s", e.run_timeout_s, "Deadline for the candidate's trials and timing.", positive<double>("a positive number"));
    v.field("memory_limit_mb", e.memory_limit_mb, "Address-space limit of CPU workers in MiB; 0: none (CUDA workers have none).");
    v.field("cpu_threads", e.cpu_threads, "Torch threads in a CPU worker.", positive<std::int64_t>("a positive integer"));
    v.field("cuda_max_connections", e.cuda_max_connections,
            "CUDA_DEVICE_MAX_CONNECTIONS of GPU workers: the hardware queues a worker's CUDA context gets. Fewer make "
            "each worker's context cheaper to create (every verdict needs one); streams then share queues, so a "
            "candidate's streams may overlap less. 0: the driver's default (8).",
            constraint<std::int64_t>{"an integer between 0 and 32", [](std::int64_t v) { return v >= 0 && v <= 32; }});
    v.field("limits", e.limits,
            "Every verdict carries the lower bound on a call of its task on its hardware (`bound`: the task's "
            "bytes at the device's copy rate, its FLOPs at their dtype's matrix-product rate) and the candidate's "
            "and the reference's fractions of it (`fraction`, `ref_fraction`: 1.0 is at the limit). The "
            "hardware's peaks are measured once a process, by the reference's worker of its first verdict there, "
            "before any candidate code runs (about a second on the CPU). Off: no peaks, no bound. The reward "
            "is not changed by it (docs/evaluator.md, How far from the limit).");
    v.field("huge_pages", e.huge_pages,
            "Workers put torch's large CPU allocations on transparent huge pages (THP_MEM_ALLOC_ENABLE; where the "
            "kernel's transparent_hugepage mode is madvise or always). Both sides of a verdict get it. On the 2-core "
            "CI VM it made two processes of one code measure closer (the references against themselves within 3.0% "
            "instead of 8.8%) and references of several passes over large tensors up to a third faster, which "
            "lowers the speedups of the kernels that fuse those passes (4.10x to 2.70x on 04_layernorm_manual; "
            "docs/PERFORMANCE.md, Huge pages for the workers).");
    v.field("cuda_mps", e.cuda_mps,
            "CUDA devices under a CUDA MPS control daemon of this process's own (its own pipe directory, "
            "stopped when it exits), or the user's own where CUDA_MPS_PIPE_DIRECTORY is set: the evaluator's "
            "device work runs in a device agent a device (crucible-device, a process of its own, as the workers' "
            "user: nobody where crucible runs as root), and the agents and every worker are clients of one MPS "
            "server a device, so the device does not switch between their contexts inside a timed sample across "
            "the boundary (docs/evaluator.md, Trust boundary). `auto`: where `nvidia-cuda-mps-control` is found "
            "and the agents start, a warning saying why not elsewhere, as with `off` (across the boundary without "
            "MPS the device switches contexts inside every timed sample, and speedups come out lower). `on`: refuses to start "
            "where it cannot, naming why. `off`: never. A fault under MPS, which MPS reports to every client of "
            "the device, ends the device's agent; the evaluator clears the server's clients, starts the agent "
            "again and judges the faulting candidate again alone (docs/evaluator.md, CUDA MPS).");
    v.field("cuda_clock_poll", e.cuda_clock_poll,
            "Across the CUDA boundary: how the device clock closes a timed sample's window. On (the default): "
            "nothing of the clock's process waits on the device during the worker's calls; its host reads the "
            "done word with 4-byte copies and queues the copy out once it has the sample's number. Off: a wait "
            "for the done word queued on the clock's stream, the copy out behind it. Under MPS the queued wait "
            "slowed one of a verdict's two workers: the CPU suite's 18 references against themselves on an "
            "H200, 7 of 18 within 1.00 +- 2% with the wait (up to 1.265x), 15 of 18 with the poll "
            "(0.962-1.028x), run side by side (docs/PERFORMANCE.md, The clock's close at scale).");
    v.field("cuda_own_device_only", e.cuda_own_device_only,
            "A CUDA worker, once its device's context exists and before any candidate code loads, may open no "
            "device file of the host's other GPUs (/dev/nvidiaN but its own GPU's, found by its PCI address in "
            "/proc/driver/nvidia/gpus): a second Landlock layer, which its child processes keep, so that no "
            "process of the candidate's computes on a second GPU inside its sample's window (docs/evaluator.md, "
            "Trust boundary). Off: every device file under /dev, as before 2026-11-30; for a host whose driver "
            "needs a file this leaves out, or that has no /proc/driver/nvidia (a worker then fails to start, "
            "saying so).");
    v.field("reference_band", e.reference_band,
            "After the timing, the candidate's worker ends and the reference is timed "
            "alone in its own worker (10 samples, kept per task, protocol and calls per sample; timed again, "
            "with 10 more samples before a refusal, when the verdict's reference was slower than the kept "
            "figure). The verdict is refused (`runtime:slow_reference`: something of the candidate's slowed "
            "the reference) when the median of the reference's samples during the verdict is slower than "
            "alone by more than this fraction, and the fastest quarter of them slower, by the same fraction, "
            "than the slowest quarter alone (a machine whose load changes moves both together). Not where another "
            "evaluation was in flight on the device during the measured rounds: its compiles share the host with "
            "them and not with the reference alone.",
            positive<double>("a positive number"));
    v.field("cache", e.cache, "Verdict cache (SQLite file); empty: `~/.cache/crucible/verdicts.db`.");
    v.field("extensions_dir", e.extensions_dir,
            "Compiled-extension cache; empty: `~/.cache/crucible/extensions`. Only the evaluator writes it: the "
            "`load_inline` and `load` calls a candidate's module makes are built by a sandboxed builder process, "
            "keyed by the whole request, and workers load the result read-only.");
    v.field("isolation", e.isolation,
            "Where this machine cannot give workers every layer of the sandbox (namespaces, a read-only file "
            "system with a private scratch, an unprivileged identity, no_new_privs, Landlock, seccomp: "
            "`crucible info` lists them): `strict` refuses to start and names the missing layer and why; "
            "`best-effort` starts with the layers there are and says what is missing in the log and in every "
            "verdict's message.");
    v.field("scratch_mb", e.scratch_mb,
            "Size in MiB of a worker's private tmpfs, which holds its scratch directory, its /tmp and its "
            "extension and Triton builds: what a candidate writes never reaches the disk, and a candidate that "
            "fills it gets ENOSPC. It is memory, counted while the worker lives.",
            constraint<std::uint64_t>{"an integer between 64 and 65536",
                                      [](std::uint64_t v) { return v >= 64 && v <= 65536; }});
    v.field("static_checks", e.static_checks, "Run the static anti-hacking checks on candidate sources.");
    v.field("init_hold", e.init_hold,
            "Which steps of a starting worker's device initialisation are kept away from measured rounds (beside "
            "other evaluations' references and trials they may run, and beside a timing's warm-up with "
            "starts_beside_warmup). `all`: starting the driver, creating the CUDA context and the profiler's first "
            "use. `context`: creating the context alone, which raised the 99th percentile of a kernel timed beside "
            "it by 10-13% (starting the driver: 5%); with starts_beside_warmup the profiler's first use then ran "
            "beside measured rounds and on an H100 made measurements unstable (60-130 rounds instead of 20-40). "
            "`none`: workers initialise at once.");
    v.field("share_untimed", e.share_untimed,
            "Timed rounds always have the device to themselves. Untimed device work (references, correctness "
            "trials, workers' device initialisation) of several evaluations may run on it at once; false: one at a "
            "time. It changes throughput, not verdicts.");
    v.field("starts_beside_warmup", e.starts_beside_warmup,
            "With share_untimed: the steps of a starting worker's initialisation that init_hold keeps away from "
            "timed rounds may still run beside a timing's warm-up (its first calls, clock warm-up and warm-up "
            "rounds, none of which is measured); the measured rounds wait for them to finish and let none begin. "
            "False: they wait for the whole timing. It changes throughput, not verdicts.");
    v.field("untimed_beside_warmup", e.untimed_beside_warmup,
            "With share_untimed: other evaluations' untimed device work (references, correctness trials, the "
            "evaluator's copies and comparisons) may also run beside a timing's warm-up; the measured rounds wait "
            "for the phases inside to finish and let none begin. False: untimed work waits for the whole timing, and "
            "a timing for the untimed work inside. It changes throughput, not verdicts.");
    v.field("teardown_hold", e.teardown_hold,
            "A finished worker's exit, in which the driver tears its CUDA context down on the device, holds the "
            "device as untimed work: it runs beside references, trials and (with untimed_beside_warmup) warm-ups, "
            "never beside measured rounds. False: workers end at any time. It changes throughput and what may "
            "disturb measured rounds, not what is measured.");
    v.field("keep_freed_mb", e.keep_freed_mb,
            "With outputs on a CUDA device: how much freed memory (MiB) the evaluator's own memory pool keeps "
            "for the next verdicts' reference copies instead of returning it to the driver. Memory it returns must "
            "be mapped again for the next copy, a call that waits behind other processes' context creations.");
    v.field("zygote", e.zygote,
            "Fork each worker from a zygote process that has imported torch and the harness but never used the "
            "device (tens of milliseconds instead of seconds per worker); every worker is forked from the zygote, "
            "never from another worker. False: every worker is a new interpreter. A forked worker that fails to "
            "start turns it off for that device.");
  });
  v.section("reward", "How a verdict becomes the reward the learner sees.", [&] {
    v.field("shape", c.reward.shape, "Reward of a correct candidate from its speedup.");
    v.field("clip_min", c.reward.clip_min, "Lower clip for `clipped`.");
    v.field("clip_max", c.reward.clip_max, "Upper clip for `clipped`.");
    v.field("failed", c.reward.failed, "Reward of every status but `ok`.");
    v.field("format_error", c.reward.format_error, "Reward of a response without usable code.");
    v.field("limit_weight", c.reward.limit_weight,
            "Added to the reward of an ok verdict that carries a bound (evaluator.limits): this weight times the "
            "candidate's fraction of its task's limit on the hardware, at most 1 (1.0: a call as fast as the "
            "hardware's copy and matrix-product rates allow). 0 (the default) leaves the reward the speedup's "
            "alone. What it changes: two kernels of one speedup over a slow and a fast reference are told apart "
            "(the speedup says how slow the reference was, the fraction how close the kernel is to the "
            "hardware), and a group near the limit keeps a signal. The bound's FLOP part counts the "
            "reference's algorithm, so a kernel faster than it is measured against the bytes part alone "
            "(docs/evaluator.md, How far from the limit).");
  });
  v.section("exemplar", "Exemplars shown in the contrastive prompt (CUDA-L1) and the assembly of GRPO groups.", [&] {
    auto& x = c.exemplar;
    v.field("method", x.method, "How exemplars are drawn: CUDA-L1's score buckets, or the `random` and `island` ablations.");
    v.field("n", x.n, "Exemplars per prompt; fewer are shown when fewer succeeded (none: the reference only).",
            positive<std::int64_t>("a positive integer"));
    v.field("tau", x.tau, "Temperature τ of the bucket softmax exp((bucket mean − global mean)/τ).",
            positive<double>("a positive number"));
    v.field("score", x.score,
            "What a variant's score bucket is made of: its `reward` (CUDA-L1's), or its `fraction` of its task's limit "
            "on the hardware (evaluator.limits; docs/evaluator.md, How far from the limit), which means the same on "
            "every task (0.9: near the hardware's limit) where a speedup says how slow the reference was. With "
            "`fraction`, variants whose verdict carried no bound are left out where others of the task have one "
            "(where none has, the reward decides), and `bucket_width` and `tau` are in fraction units: 0.1 and 0.1 "
            "suit it.");
    v.field("bucket_width", x.bucket_width, "Width of a score bucket, in the score's units (reward, or fraction).",
            positive<double>("a positive number"));
    v.field("islands", x.islands, "Islands of the `island` method.", positive<std::int64_t>("a positive integer"));
    v.field("seeds_only", x.seeds_only,
            "Exemplars are drawn from the seed variants only (the warm start's), never from the policy's samples.");
    v.field("straggler_timeout_s", x.straggler_timeout_s,
            "Seconds a GRPO group waits for its last scored completions before `straggler_policy` applies.",
            positive<double>("a positive number"));
    v.field("straggler_policy", x.straggler,
            "What happens to a group still incomplete at the timeout: `drop` it, or `fill` the missing members with failed samples.");
  });
  v.section("prompt", "The contrastive prompt and the parsing of the policy's responses (docs/prompts.md).", [&] {
    auto& p = c.prompt;
    v.field("template", p.template_file,
            "Prompt-template YAML file; empty: `configs/prompts/contrastive.yaml` of the checkout.");
    v.field("feedback_template", p.feedback_template,
            "Feedback-template YAML file: the verdict on a turn of a multi-turn episode as the next user message "
            "(`crucible serve`'s `/v1/prompt` with `turns`); empty: `configs/prompts/feedback.yaml` of the checkout.");
    v.field("max_tokens", p.max_tokens,
            "Token budget of the whole rendered prompt, chat template included; exemplars are shortened, then dropped, to fit.",
            positive<std::int64_t>("a positive integer"));
    v.field("max_exemplar_chars", p.max_exemplar_chars,
            "Each exemplar's code is first cut to this many characters; 0: no cap.",
            at_least(0, "an integer ≥ 0"));
    v.field("min_exemplar_chars", p.min_exemplar_chars,
            "Shortening stops at this many characters of code; an exemplar that still does not fit is dropped.",
            positive<std::int64_t>("a positive integer"));
    v.field("chat_template", p.chat_template,
            "`auto`: wrap the prompt in the tokenizer's chat template when it has one; `none`: plain text.");
    v.field("max_response_chars", p.max_response_chars, "Responses longer than this are format errors.",
            positive<std::int64_t>("a positive integer"));
    v.field("require_sections", p.require_sections,
            "A response must carry every section heading the template asks for (else: format error).");
  });
  describe_learner(v, c.learner);
  v.section("rollout", "Rollout actors: task, exemplars, prompt, G completions, parsing, evaluation, scored variants (docs/rollout.md).", [&] {
    auto& r = c.rollout;
    v.field("actors", r.actors, "Rollout actors in the process; each keeps its own groups in flight.",
            positive<std::int64_t>("a positive integer"));
    v.field("group_size", r.group_size, "G: completions sampled per prompt, one GRPO group.",
            positive<std::int64_t>("a positive integer"));
    v.field("temperature", r.temperature, "Sampling temperature; 0 is greedy.", non_negative_number());
    v.field("top_p", r.top_p, "Nucleus sampling: the most likely tokens whose probabilities sum to top_p; 1: off.",
            constraint<double>{"a number in (0, 1]", [](double x) { return x > 0 && x <= 1; }});
    v.field("top_k", r.top_k, "Only the top_k most likely tokens; 0: off.", at_least(0, "an integer ≥ 0"));
    v.field("max_new_tokens", r.max_new_tokens, "Tokens generated per completion at most.",
            positive<std::int64_t>("a positive integer"));
    v.field("stop", r.stop, "Stop strings: generation ends after one of them, which is cut from the completion.",
            constraint<std::vector<std::string>>{"a list of non-empty strings", [](const std::vector<std::string>& xs) {
              return std::none_of(xs.begin(), xs.end(), [](const std::string& x) { return x.empty(); });
            }});
    v.field("turns", r.turns,
            "Turns of an episode: 1, a completion is judged once; more, each of the G episodes of a group gets the "
            "verdict on its answer as feedback (prompt.feedback_template) and tries again, up to this many turns, each "
            "turn evaluated as it comes (docs/training.md, \"Multi-turn episodes\").",
            constraint<std::int64_t>{"an integer between 1 and 16", [](std::int64_t v) { return v >= 1 && v <= 16; }});
    v.field("turn_stop_speedup", r.turn_stop_speedup,
            "An episode ends before its last turn once a turn is correct with at least this speedup; 0: every episode "
            "takes all its turns.",
            non_negative_number());
    v.field("max_groups_in_flight", r.max_groups_in_flight,
            "Groups one rollout actor works on at once (prompt, generation, evaluation); the next task is taken when one "
            "finishes.",
            positive<std::int64_t>("a positive integer"));
    v.field("sampler", r.sampler,
            "Task choice: `uniform`, or `improvement`: weight 1 / (1 + best speedup so far) per task, mixed with uniform "
            "by `sampler_mix`.");
    v.field("sampler_mix", r.sampler_mix, "Share of uniform draws under `improvement`, so no task starves.",
            between(0, 1, "a number between 0 and 1"));
    v.field("hardware", r.hardware, "Hardware kind candidates are evaluated on; empty: that of the first evaluator.");
    v.field("retry_s", r.retry_s, "Seconds before a request refused as busy (engine, evaluators, exemplar actor) is sent again.",
            positive<double>("a positive number"));
    v.field("on_stop", r.on_stop,
            "Groups in flight when the run stops its rollouts to keep what they finish (a synchronous step, a pause "
            "with `run.on_pause: finish`): `finish` them first, or `drop` them. Where the run discards them anyway (a "
            "stage change, a pause with `run.on_pause: drop`) they are dropped at once, and the engine drops their "
            "requests still waiting.");
  });
  v.section("model", "The policy: a Hugging Face model directory, or a fresh model made when the run starts (docs/training.md).", [&] {
    auto& m = c.model;
    v.field("dir", m.dir, "Hugging Face model directory (config.json, safetensors, tokenizer files); empty: a fresh model "
            "(`init`) is made in `RUN/model/`.");
    v.field("init", m.init,
            "Preset of the fresh model when `dir` is empty: `tiny`, `small`, `0.5b`, or the published shapes of "
            "`qwen2.5-coder-1.5b-instruct` and `qwen2.5-coder-7b-instruct` (random weights in bfloat16, the published "
            "vocabulary and Qwen2.5's chat template; the tokenizer trained for the run uses the first "
            "`tokenizer_vocab` rows).",
            constraint<std::string>{"one of tiny, small, 0.5b, qwen2.5-coder-1.5b-instruct, qwen2.5-coder-7b-instruct",
                                    [](const std::string& x) {
                                      return x == "tiny" || x == "small" || x == "0.5b" ||
                                             x == "qwen2.5-coder-1.5b-instruct" || x == "qwen2.5-coder-7b-instruct";
                                    }});
    v.field("family", m.family, "Architecture of the fresh model: `qwen2` or `llama`.",
            constraint<std::string>{"one of qwen2, llama", [](const std::string& x) { return x == "qwen2" || x == "llama"; }});
    v.field("tokenizer_vocab", m.tokenizer_vocab, "Vocabulary of the byte-level BPE tokenizer trained for the fresh model.",
            at_least(300, "an integer ≥ 300"));
    v.field("tokenizer_corpus", m.tokenizer_corpus, "Files or directories the fresh model's tokenizer is trained on; empty: "
            "the task suite and its seed variants.");
    v.field("device", m.device, "Device of the learner (its rank 0) and the engine (unless `engine.devices` names others): `cpu` or `cuda:N`.",
            constraint<std::string>{"\"cpu\" or \"cuda:N\"", is_device_name});
    v.field("engine_dtype", m.engine_dtype, "Dtype the engine samples in: `float32`, `bfloat16` or `float16`.",
            constraint<std::string>{"one of float32, bfloat16, float16", [](const std::string& x) {
              return x == "float32" || x == "bfloat16" || x == "float16"; }});
    v.field("handoff", m.handoff,
            "How each new version reaches the engine. `memory`: in place, in the process's memory: the engine's "
            "tensors that cannot change are the learner's own (under LoRA the frozen base: embeddings, norms, every "
            "projection without an adapter), the rest are copied device to device after each update (adapted "
            "projections as their merged weight). `disk`: each version is written to `RUN/policy/vN` (a Hugging Face "
            "directory, the last few kept) and the engine loads it, holding two copies of the weights while it does.",
            constraint<std::string>{"\"memory\" or \"disk\"", [](const std::string& x) {
              return x == "memory" || x == "disk"; }});
  });
  v.section("tasks", "The task suite the run trains on and its seed variants (docs/training.md).", [&] {
    auto& t = c.tasks;
    v.field("suite", t.suite, "Directory of KernelBench-format tasks (level folders allowed), relative to the working directory.",
            non_empty());
    v.field("include", t.include, "Task names to train on, e.g. `01_relu_scale` or `level1/03_gemm`; empty: every task.");
    v.field("seeds", t.seeds, "Seed variants, `SEEDS/<task name>/*.py` (`wrong_*.py` are known-incorrect); empty: `SUITE/variants`.");
    v.field("seed_exclude", t.seed_exclude, "File-name patterns of seed variants to leave out, e.g. `cpp_*.py` "
            "(`*`, `?` and `[...]` as in the shell); they are neither measured nor trained on.");
    v.field("warm_start", t.warm_start, "Evaluate the seed variants into the exemplar store when the run starts, so the "
            "first prompts show measured exemplars.");
    v.field("check_references", t.check_references,
            "Before its first step (of a new run and of each resume), the run builds and runs every task's reference "
            "once through the evaluator pool; a task whose reference fails (a syntax error, an exception, a "
            "reference that is not deterministic) stops the run with the task's name and the error, before any "
            "training. To leave broken tasks out, name the others in `include`, set `skip_broken`, or import the "
            "suite with `crucible tasks import --skip-broken`.");
    v.field("skip_broken", t.skip_broken,
            "With `check_references`: a task whose reference fails is left out of the run instead of stopping it "
            "(unless every task fails): it is named with its error in the log, listed under `skipped_tasks` in "
            "status.json and by `crucible status`, and neither sampled, warm-started nor used for SFT. Checked again "
            "on each resume; the task samplers then start fresh.");
  });
  v.section("stages", "The stage schedule, run in order SFT, self-supervised, contrastive RL; a stage with 0 steps is skipped.", [&] {
    auto& g = c.stages;
    v.section("sft", "Supervised fine-tuning on the correct seed variants, each as the response to its task's contrastive prompt.", [&] {
      v.field("steps", g.sft.steps, "Updates; 0 skips the stage.", at_least(0, "a non-negative integer"));
      v.field("batch", g.sft.batch, "Examples per update.", positive<std::int64_t>("a positive integer"));
      v.field("stop_loss", g.sft.stop_loss, "The stage ends early after an update whose loss is at most this; 0: never.",
              non_negative_number());
      v.field("max_minutes", g.sft.max_minutes, "Wall-clock budget of the stage; 0: none.", non_negative_number());
    });
    v.section("self_supervised", "Sample groups, keep the policy's own correct variants, train on them (SFT).", [&] {
      v.field("steps", g.self_supervised.steps, "Updates; 0 skips the stage.", at_least(0, "a non-negative integer"));
      v.field("groups", g.self_supervised.groups, "Groups sampled and evaluated per update.",
              positive<std::int64_t>("a positive integer"));
      v.field("stop_correct", g.self_supervised.stop_correct,
              "The stage ends early after a step whose share of correct samples is at least this; 0: never.",
              between(0, 1, "a number between 0 and 1"));
      v.field("max_minutes", g.self_supervised.max_minutes, "Wall-clock budget of the stage; 0: none.", non_negative_number());
    });
    v.section("rl", "Contrastive RL: GRPO updates on groups sampled from contrastive prompts (CUDA-L1).", [&] {
      v.field("steps", g.rl.steps, "Updates; 0 skips the stage.", at_least(0, "a non-negative integer"));
      v.field("groups", g.rl.groups, "Complete groups per update.", positive<std::int64_t>("a positive integer"));
      v.field("max_staleness", g.rl.max_staleness,
              "Groups sampled more than this many policy versions before the learner's are dropped (and counted).",
              at_least(0, "a non-negative integer"));
      v.field("admission", g.rl.admission,
              "Asynchronous runs: `staleness`, a group starts only while fewer than max(1, max_staleness) x `groups` "
              "groups are ahead of the learner (in its queue or under way at the rollout actors), so that none is "
              "sampled, evaluated and then dropped as stale (the engine's and the evaluators' time goes to groups that "
              "are trained on); `open`, each rollout actor keeps rollout.max_groups_in_flight groups under way whatever "
              "the queue holds, and groups past the bound are dropped when they arrive (docs/training.md, "
              "\"Staleness-aware admission\").",
              constraint<std::string>{"\"staleness\" or \"open\"",
                                      [](const std::string& x) { return x == "staleness" || x == "open"; }});
      v.field("stop_mean_speedup", g.rl.stop_mean_speedup,
              "The stage ends early after a step whose mean speedup over its correct samples is at least this; 0: never.",
              non_negative_number());
      v.field("max_minutes", g.rl.max_minutes, "Wall-clock budget of the stage; 0: none.", non_negative_number());
    });
    v.section("search", "Contrastive search without updates (CUDA-L1's loop with a fixed model): each round samples "
              "groups on contrastive prompts, evaluates them and keeps every variant in the exemplar store, so later "
              "prompts show the best so far. Runs after RL; the only sampling stage of `policy.backend: openai`.", [&] {
      v.field("steps", g.search.steps, "Rounds; 0 skips the stage.", at_least(0, "a non-negative integer"));
      v.field("groups", g.search.groups, "Groups sampled and evaluated per round.", positive<std::int64_t>("a positive integer"));
      v.field("stop_mean_speedup", g.search.stop_mean_speedup,
              "The stage ends early after a round whose mean speedup over its correct samples is at least this; 0: never.",
              non_negative_number());
      v.field("max_minutes", g.search.max_minutes, "Wall-clock budget of the stage; 0: none.", non_negative_number());
    });
  });
  v.section("policy", "Where rollouts sample (docs/service.md, \"A fixed model behind an endpoint\"): crucible's own engine "
            "(`local`: the `model:` section, trained by the stages), or any OpenAI-compatible endpoint (`openai`: vLLM, "
            "SGLang, `crucible serve-policy`, a hosted API), which nothing trains: only `stages.search` runs then.", [&] {
    auto& p = c.policy;
    v.field("backend", p.backend, "`local` or `openai`.",
            constraint<std::string>{"\"local\" or \"openai\"", [](const std::string& x) { return x == "local" || x == "openai"; }});
    v.field("base_url", p.base_url, "`openai`: the API's base URL, e.g. `http://127.0.0.1:8000/v1` (chat completions are "
            "posted to `BASE_URL/chat/completions`).");
    v.field("model", p.model, "`openai`: the model name the endpoint serves (its `GET /models`).");
    v.field("api_key_file", p.api_key_file, "`openai`: file whose first line is the API key, sent as `Authorization: Bearer "
            "KEY`; refused when others may read it (chmod 600). Empty: no key is sent.");
    v.field("concurrency", p.concurrency, "`openai`: requests in flight at most (one request is one group: `n` = "
            "`rollout.group_size`).", positive<std::int64_t>("a positive integer"));
    v.field("retries", p.retries, "`openai`: retries of a request that failed to connect or was answered 408, 429 or 5xx, "
            "after 1, 2, 4, ... seconds (at most 30; a Retry-After header is honoured). Other answers are not retried.",
            at_least(0, "a non-negative integer"));
    v.field("timeout_s", p.timeout_s, "`openai`: one request's time limit.", positive<double>("a positive number"));
    v.field("tokenizer", p.tokenizer, "`openai`: a tokenizer directory (tokenizer.json) the prompt budget "
            "(`prompt.max_tokens`) is counted in; empty: a token per 3 bytes of UTF-8. The endpoint applies its own chat "
            "template to the messages.");
    v.field("logprobs", p.logprobs, "`openai`: ask for the sampled tokens' log-probs (`logprobs: true`), stored with the "
            "samples.");
    v.field("token_ids", p.token_ids, "`openai`: ask for the prompt's and the completions' token ids "
            "(`return_token_ids: true`, as vLLM and `crucible serve-policy` answer), stored with the samples. An "
            "endpoint that refuses unknown parameters (OpenAI's own) needs it off.");
  });
  v.section("engine", "The engine actor's request queue and batching (docs/rollout.md).", [&] {
    auto& e = c.engine;
    v.field("max_queued", e.max_queued, "Generation requests waiting for the engine; more are refused as busy.",
            positive<std::int64_t>("a positive integer"));
    v.field("max_batch_prompts", e.max_batch_prompts, "Waiting requests with the same sampling settings sampled in one call.",
            positive<std::int64_t>("a positive integer"));
    v.field("max_batch_samples", e.max_batch_samples,
            "Completions (the sum of the requests' G) per call; a larger single request runs alone.",
            positive<std::int64_t>("a positive integer"));
    v.field("max_prompt_tokens", e.max_prompt_tokens, "Longer prompts are refused; 0: no limit.",
            at_least(0, "an integer ≥ 0"));
    v.field("devices", e.devices,
            "One engine per entry, each generating for its own rollout actors (actor i samples from engine i mod "
            "N): `cuda:N` devices of `model.device`'s kind (`cpu` may repeat, as threads), or empty: one engine on "
            "`model.device`, beside the learner's rank 0. On a GPU of its own an engine generates while the "
            "learner updates, instead of taking turns with it on one GPU; with `model.handoff: memory` the learner "
            "copies each version across to a staging area on each such GPU, which that engine installs (nothing is "
            "shared). `model.device` may be one of them (an engine beside rank 0); another learner rank's GPU may "
            "not. An evaluator may list an engine's GPU too: it times between that engine's generations "
            "(docs/scaling.md, Splitting GPUs between the policy and the evaluators).",
            learner_device_list());
  });
  v.section("membership", "Evaluator nodes that join a running experiment with `crucible evaluator --join` (docs/scaling.md).", [&] {
    auto& m = c.membership;
    v.field("listen", m.listen,
            "HOST:PORT on which the coordinator's membership actor accepts nodes (port 0: any free port). "
            "Loopback by default: set an address other hosts reach (e.g. `0.0.0.0:7460`) "
            "for a multi-node run. Empty: no node can join. While the run runs, status.json names the bound "
            "address as `join`.",
            listen_address());
    v.field("token_file", m.token_file,
            "File holding the run's shared secret (its first line); a node must present the same token. Refused "
            "when others may read or write it (chmod 600). Empty: `membership.token` in the run directory, "
            "created with a fresh random token (mode 600) when missing.");
    v.field("heartbeat_s", m.heartbeat_s, "Seconds between a joined node's heartbeats (and between the coordinator's checks).",
            positive<double>("a positive number"));
    v.field("timeout_s", m.timeout_s,
            "A node whose heartbeats stop for this long is removed and its in-flight candidates are re-queued (a "
            "node whose connection closes is removed at once).",
            positive<double>("a positive number"));
  });
}

} // namespace crucible::config_detail
