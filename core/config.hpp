// core/config.hpp: the typed run configuration, decoded once from YAML (plus --set overrides)
// and passed down by value. Every key, its type, default and meaning is declared once, in
// describe() (core/config_keys.hpp); decoding, the resolved YAML and docs/configuration.md all
// come from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/learner_options.hpp"
#include "core/log.hpp"

namespace crucible {

/// How generation, evaluation and training share time (docs/training.md).
enum class run_mode : std::uint8_t {
  async, ///< rollouts keep sampling and evaluating while the learner trains (bounded by max_staleness)
  sync,  ///< each step: sample the step's groups, evaluate them, train, then sample again
};

/// "async", "sync".
const char* to_string(run_mode m) noexcept;

/// What a rollout actor does with the groups it has in flight when it is told to stop (and what a
/// pausing run does with them).
enum class in_flight_policy : std::uint8_t {
  finish, ///< take no new task, finish the groups under way, then stop
  drop,   ///< stop at once; replies still on their way are ignored
};

/// `run:` — naming and placing the run.
struct run_options {
  std::string name = "quickstart"; ///< run directory is `dir/name`
  std::string dir = "runs";        ///< parent of run directories (relative to the working dir)
  std::uint64_t seed = 0;          ///< root of every random stream in the run
  /// ZeroMQ endpoint the coordinator's PUB socket binds (`crucible watch`); empty: none.
  std::string publish = "tcp://127.0.0.1:0";
  double heartbeat_s = 1.0;        ///< seconds between heartbeats on the publish socket
  run_mode mode = run_mode::async; ///< generation, evaluation and training overlapped, or in lock-step
  std::int64_t checkpoint_every = 10; ///< learner steps between checkpoints; 0: only at pause and at the end
  double pause_grace_s = 60;          ///< a pause waits this long for the step under way, then ends it if it only waits for groups
  double stall_timeout_s = 1800;      ///< a learner silent this long, or no group in this long while a step waits: the run stops; 0: off
  in_flight_policy on_pause = in_flight_policy::finish; ///< groups in flight at a pause: finish or abandon
  std::int64_t keep_checkpoints = 2; ///< checkpoints kept (older ones are removed); at least 1
};

/// `log:` — levels for stderr and for the run's events.log.
struct log_options {
  log_level level = log_level::info;       ///< stderr threshold
  log_level file_level = log_level::debug; ///< events.log threshold
  bool tensorboard = true;                 ///< TensorBoard event files in RUN/tensorboard as the run goes
  bool wandb = false;                      ///< an offline Weights & Biases run in RUN/wandb as the run goes
};

/// `actors:` — the actor system of this process.
struct actor_options {
  std::int64_t threads = 0; ///< scheduler worker threads; 0: one per core
};

/// How a verdict becomes a reward (env/reward.hpp).
enum class reward_shape : std::uint8_t {
  speedup,     ///< reward = speedup
  log_speedup, ///< reward = ln(speedup): "twice as fast" and "twice as slow" are symmetric
  clipped,     ///< reward = clamp(speedup, clip_min, clip_max)
};

/// `reward:` — shaping of the evaluator's reward.
struct reward_options {
  reward_shape shape = reward_shape::speedup;
  double clip_min = 0.0;
  double clip_max = 10.0;
  double failed = 0.0;       ///< reward of every status but ok
  double format_error = 0.0; ///< reward of a response without usable code
  double limit_weight = 0.0; ///< added to an ok verdict's reward, times its fraction of the hardware's limit (at most 1)
};

/// What a candidate's speedup is measured against.
enum class timing_baseline : std::uint8_t {
  eager,                   ///< the reference Model as written
  compile,                 ///< torch.compile(reference)
  compile_reduce_overhead, ///< torch.compile(reference, mode="reduce-overhead")
  cuda_graph,              ///< the reference captured in a CUDA graph (CUDA devices only)
};

/// "eager", "compile", "compile-reduce-overhead", "cuda-graph": the names config files use.
const char* to_string(timing_baseline b) noexcept;

/// Which steps of a starting worker's device initialisation wait until no evaluation is timing
/// on the device (they then run beside other evaluations' untimed work only).
enum class device_init_hold : std::uint8_t {
  context, ///< creating the CUDA context; starting the driver and the profiler's first use run at once
  all,     ///< starting the driver, creating the context and the profiler's first use
  none,    ///< nothing: workers initialise at once, beside timed rounds too
};

/// "context", "all", "none": the names config files use.
const char* to_string(device_init_hold h) noexcept;

/// When the warm pool replaces the workers that evaluations take.
enum class worker_refill : std::uint8_t {
  at_once,   ///< as soon as one is taken: its start runs beside the evaluations in flight
  when_idle, ///< while no evaluation is in flight on the device, and one at a time while the pool is empty
};

/// "at-once", "when-idle": the names config files use.
const char* to_string(worker_refill r) noexcept;

/// What the evaluator does where the machine lacks a layer of the workers' sandbox.
enum class isolation_mode : std::uint8_t {
  strict,      ///< refuse to start, naming the missing layer and the kernel feature behind it
  best_effort, ///< start with the layers there are; a warning in the log and in every verdict
};

/// "strict", "best-effort": the names config files use.
const char* to_string(isolation_mode m) noexcept;

/// Whether the evaluator runs its CUDA devices under a private CUDA MPS daemon (env/eval/device/mps.hpp).
enum class cuda_mps_mode : std::uint8_t {
  auto_, ///< where it can: the control program found, no daemon of the user's own, the agents started
  on,    ///< always; an evaluator that cannot refuses to start, naming why
  off,   ///< never
};

/// "auto", "on", "off": the names config files use.
const char* to_string(cuda_mps_mode m) noexcept;

/// `evaluator:` — sandboxed workers, correctness trials and the timing protocol.
struct evaluator_options {
  std::string python;                          ///< "" : .venv/bin/python of the checkout, else python3
  std::vector<std::string> devices{"cpu"};     ///< "cpu" or "cuda:N", one evaluator per entry
  std::int64_t concurrency = 1;                ///< evaluations in flight per device (compiles overlap timing)
  std::int64_t warm_workers = 2;               ///< idle pre-started workers kept per device
  worker_refill refill = worker_refill::at_once; ///< when the pool replaces the workers evaluations take
  std::int64_t trials = 5;                     ///< correctness trials on fresh inputs
  std::int64_t rounds = 30;                    ///< timed paired rounds per measurement
  std::int64_t max_rounds = 120;               ///< cap when unstable measurements add rounds
  std::int64_t min_rounds = 20;                ///< a measurement may stop here when its band is tight
  double early_stop_spread = 0.005;            ///< ... namely within this; 0: always `rounds`
  std::int64_t slow_stop_rounds = 10;          ///< a first look after this many rounds; 0: none
  double slow_stop_below = 0.9;                ///< ... stops a candidate whose whole band is below this
  double warmup_ms = 300;                      ///< untimed rounds before a verdict's first measurement, at least this long
  std::int64_t buckets = 5;
  double max_spread = 0.02;
  double band_floor = 0.015;                   ///< repeat-to-repeat variation added to each verdict's band
  double max_bucket_disagreement = 0.05;
  double win_threshold = 1.01;
  double recheck_above = 3.0;                  ///< speedups above this are measured a second time
  double recheck_tolerance = 0.10;             ///< ... and rejected if the two differ by more
  std::int64_t recheck_rounds = 10;            ///< rounds of that second measurement (on this device)
  timing_baseline baseline = timing_baseline::eager;
  std::uint64_t flush_bytes = 0;               ///< 0: 256 MiB on CUDA, 64 MiB on CPU
  double sample_ms = 1.0;                      ///< a timed sample lasts about this long: calls back to back, each on fresh inputs; 0: one call
  std::int64_t max_calls = 100;                ///< most calls in one timed sample
  std::uint64_t placement_jitter_bytes = 64ull << 20; ///< each round's inputs start 0..this many bytes into their allocations; 0: off
  bool quiet_gc = true;                        ///< workers freeze Python's collector's objects at the job and collect nothing while timing
  bool eval_mode = false;                      ///< Model and ModelNew put in eval mode (.eval()) after construction; false: training mode
  double fp32_atol = 1e-4, fp32_rtol = 1e-4;
  double fp16_atol = 1e-2, fp16_rtol = 1e-2;
  double bf16_atol = 1e-2, bf16_rtol = 1e-2;
  double rounding_factor = 8;                  ///< atol widened by this times the reference's own rounding error; 0: off
  double start_timeout_s = 120;                ///< worker start (torch import, device init)
  double reference_timeout_s = 120;            ///< reference outputs for all trials
  double load_timeout_s = 600;                 ///< candidate import, extension builds included
  double run_timeout_s = 300;                  ///< trials and timing
  std::uint64_t memory_limit_mb = 16384;       ///< address-space limit of CPU workers; 0: none
  std::int64_t cpu_threads = 1;                ///< torch threads in a CPU worker
  std::int64_t cuda_max_connections = 2;       ///< CUDA_DEVICE_MAX_CONNECTIONS of GPU workers; 0: the driver's (8)
  bool huge_pages = false;                      ///< torch's large CPU allocations in workers on transparent huge pages
  bool limits = true;                           ///< verdicts carry the bound of the task on their hardware and both sides' fractions of it
  std::string cache;                           ///< verdict cache (SQLite); "" : ~/.cache/crucible/verdicts.db
  std::string extensions_dir;                  ///< compiled extensions (the build service's cache); "" : ~/.cache/crucible/extensions
  isolation_mode isolation = isolation_mode::strict; ///< a machine without every sandbox layer: refuse, or warn
  std::uint64_t scratch_mb = 2048;             ///< a worker's private tmpfs (scratch, /tmp, its builds)
  bool static_checks = true;
  device_init_hold init_hold = device_init_hold::all; ///< steps of a starting worker's device initialisation kept away from timed rounds
  bool share_untimed = true;                   ///< untimed device work (references, trials, initialisation) of several evaluations at once
  bool starts_beside_warmup = true;            ///< starting workers' held initialisation may run beside a timing's warm-up rounds
  bool untimed_beside_warmup = true;           ///< other evaluations' references and trials may run beside a timing's warm-up rounds
  bool teardown_hold = true;                   ///< a finished worker's exit (its context's teardown) holds the device as untimed work
  std::uint64_t keep_freed_mb = 16384;          ///< CUDA, outputs on the device: freed memory the evaluator's pool keeps
  bool zygote = true;                          ///< fork workers from a process that imported torch once
  cuda_mps_mode cuda_mps = cuda_mps_mode::auto_; ///< CUDA devices under a private MPS daemon (one device context for every process)
  bool cuda_clock_poll = true;                 ///< the device clock's window closed by the host's reads of the done word, not a wait on the device
  bool cuda_own_device_only = true;            ///< a CUDA worker opens no other GPU's device file once its context exists
  double reference_band = 0.10;                ///< a reference slower during a verdict than alone by more than this refuses it
};

/// How exemplars are drawn (storage::selection_method mirrors it; storage converts).
enum class exemplar_method : std::uint8_t {
  contrastive, ///< CUDA-L1: score buckets drawn ∝ exp((bucket mean − global mean)/τ)
  random,      ///< uniformly among successful variants (ablation baseline)
  island,      ///< FunSearch-style islands, contrastive within one (ablation baseline)
};

/// What an exemplar's score bucket is made of (exemplar.score).
enum class exemplar_score : std::uint8_t {
  reward,   ///< the verdict's reward (CUDA-L1's)
  fraction, ///< the candidate's fraction of its task's limit on the hardware (evaluator.limits)
};

/// What happens to a GRPO group whose last completions are still unscored at the timeout.
enum class straggler_policy : std::uint8_t {
  drop, ///< the incomplete group is discarded
  fill, ///< the missing members are filled with failed samples and the group is sent
};

/// `exemplar:` — choosing the exemplars of a prompt and assembling GRPO groups. The selection
/// fields mirror storage::exemplar_options (storage::to_exemplar_options converts); core holds
/// the plain values because core may not depend on storage.
struct exemplar_config {
  exemplar_method method = exemplar_method::contrastive;
  std::int64_t n = 2;                 ///< exemplars per prompt (≥ 1)
  double tau = 1.0;                   ///< temperature of the bucket softmax (> 0)
  exemplar_score score = exemplar_score::reward; ///< what a variant's score is
  double bucket_width = 0.5;          ///< width of a score bucket in the score's units (> 0)
  std::int64_t islands = 4;           ///< islands for `island` (≥ 1)
  bool seeds_only = false;            ///< exemplars drawn from the seed variants only, never from samples
  double straggler_timeout_s = 600;   ///< seconds a group waits for its last completions
  straggler_policy straggler = straggler_policy::drop; ///< key `straggler_policy`
};

/// Whether the prompt is wrapped in the model's chat template.
enum class chat_template_mode : std::uint8_t {
  automatic, ///< `auto`: the tokenizer's chat_template when it has one, else plain text
  none,      ///< always plain text (system message, blank line, user message)
};

/// "contrastive", "random", "island".
const char* to_string(exemplar_method m) noexcept;
/// "drop", "fill".
const char* to_string(straggler_policy p) noexcept;
/// "reward", "fraction".
const char* to_string(exemplar_score s) noexcept;
/// "auto", "none".
const char* to_string(chat_template_mode m) noexcept;

/// `prompt:` — the contrastive prompt (env/prompt/prompt.hpp) and the parsing of responses
/// (env/prompt/response_parser.hpp).
struct prompt_config {
  std::string template_file;            ///< key `template`; "" : configs/prompts/contrastive.yaml of the checkout
  std::string feedback_template;        ///< the feedback after each turn of an episode; "" : configs/prompts/feedback.yaml
  std::int64_t max_tokens = 4096;       ///< token budget of the whole rendered prompt
  std::int64_t max_exemplar_chars = 0;  ///< each exemplar's code cut to this many characters first; 0: no cap
  std::int64_t min_exemplar_chars = 400; ///< shortening stops here; below it an exemplar is dropped
  chat_template_mode chat_template = chat_template_mode::automatic;
  std::int64_t max_response_chars = 200000; ///< longer responses are format errors
  bool require_sections = true;         ///< responses must carry every section heading of the template
};

/// How a rollout actor picks the next task (env/prompt/task_sampler.hpp has the formulas).
enum class task_sampling : std::uint8_t {
  uniform,     ///< every task equally often
  improvement, ///< weighted toward tasks with room to improve: w = 1 / (1 + best speedup so far)
};

/// "uniform", "improvement".
const char* to_string(task_sampling s) noexcept;
/// "finish", "drop".
const char* to_string(in_flight_policy p) noexcept;

/// `rollout:` — the rollout actors (actors/rollout.hpp): tasks in, scored GRPO groups out.
struct rollout_config {
  std::int64_t actors = 1;               ///< rollout actors in the process
  std::int64_t group_size = 4;           ///< G: completions sampled per prompt
  double temperature = 1.0;              ///< sampling temperature (0: greedy)
  double top_p = 1.0;                    ///< nucleus sampling; 1: off
  std::int64_t top_k = 0;                ///< top-k filter; 0: off
  std::int64_t max_new_tokens = 1024;    ///< tokens generated per completion at most
  std::vector<std::string> stop;         ///< stop strings (cut from the completion)
  std::int64_t turns = 1;                ///< turns of an episode (1: one completion per member)
  double turn_stop_speedup = 0;          ///< an episode ends once a turn is correct at this speedup; 0: never early
  std::int64_t max_groups_in_flight = 2; ///< groups one rollout actor works on at once
  task_sampling sampler = task_sampling::uniform;
  double sampler_mix = 0.1;              ///< share of uniform draws under `improvement`
  std::string hardware;                  ///< hardware kind to evaluate on; "": the first evaluator's
  double retry_s = 1.0;                  ///< wait before retrying a request refused as busy
  in_flight_policy on_stop = in_flight_policy::finish;
};

/// `engine:` — the engine actor's queue and batching (actors/engine.hpp).
struct engine_config {
  std::int64_t max_queued = 64;        ///< generation requests waiting; more are refused (busy)
  std::int64_t max_batch_prompts = 8;  ///< requests sampled together in one engine call
  std::int64_t max_batch_samples = 64; ///< completions (sum of G) per engine call
  std::int64_t max_prompt_tokens = 0;  ///< longer prompts are refused; 0: no limit
  /// One engine per entry, each a device of model.device's kind; empty: one engine on model.device.
  std::vector<std::string> devices;
};

/// `model:` — the policy: an existing Hugging Face model directory, or a fresh one made at the
/// start of the run (a byte-level BPE tokenizer trained on the task sources, random weights).
struct model_config {
  std::string dir;                       ///< HF model directory (config.json, *.safetensors, tokenizer); "" : init
  std::string init = "tiny";             ///< preset of a fresh model when `dir` is empty: tiny, small, 0.5b, qwen2.5-coder-{1.5b,7b}-instruct
  std::string family = "qwen2";          ///< fresh model: qwen2 or llama
  std::int64_t tokenizer_vocab = 2048;   ///< fresh model: vocabulary of the tokenizer trained for it
  std::vector<std::string> tokenizer_corpus; ///< fresh model: files or directories; empty: the task suite and seeds
  std::string device = "cpu";            ///< device of the learner and the engine: cpu or cuda:N
  std::string engine_dtype = "float32";  ///< dtype the engine samples in: float32, bfloat16, float16
  std::string handoff = "memory";        ///< new weights to the engine: memory (shared/copied in place) or disk (RUN/policy/vN)
};

/// `tasks:` — the task suite a run trains on, and its seed variants.
struct tasks_config {
  std::string suite = "env/tasks/cpu";   ///< directory of KernelBench-format tasks (level folders allowed)
  std::vector<std::string> include;      ///< task names to use (e.g. "01_relu_scale"); empty: every task
  std::string seeds;                     ///< seed variants: SEEDS/<task name>/*.py; "" : SUITE/variants
  std::vector<std::string> seed_exclude; ///< file-name patterns (`*`, `?`, `[...]`) of seed variants left out
  bool warm_start = true;                ///< evaluate the seed variants into the exemplar store before training
  bool check_references = true;          ///< run every task's reference once before the first step; a broken task stops the run
  bool skip_broken = false;              ///< with check_references: leave broken tasks out (listed) instead of stopping
};

/// `stages.sft:` — supervised fine-tuning on the verified seed variants.
struct sft_stage_config {
  std::int64_t steps = 0;                ///< updates; 0: the stage is skipped
  std::int64_t batch = 8;                ///< examples per update
  double stop_loss = 0.0;                ///< the stage ends early when an update's loss is at most this; 0: never
  double max_minutes = 0.0;              ///< wall-clock budget; 0: none
};

/// `stages.self_supervised:` — sample, keep the policy's own correct variants, train on them.
struct self_supervised_stage_config {
  std::int64_t steps = 0;                ///< updates; 0: the stage is skipped
  std::int64_t groups = 4;               ///< groups sampled per update
  double stop_correct = 0.0;             ///< ends early when a step's share of correct samples reaches this; 0: never
  double max_minutes = 0.0;
};

/// `stages.rl:` — contrastive RL: GRPO on contrastive prompts.
struct rl_stage_config {
  std::int64_t steps = 0;                ///< updates; 0: the stage is skipped
  std::int64_t groups = 4;               ///< complete groups per update
  std::int64_t max_staleness = 2;        ///< groups sampled this many versions before the learner's are dropped
  /// Async: `staleness`, a group starts only while fewer than max(1, max_staleness) x groups are
  /// ahead of the learner (queued or under way), so none is sampled only to be dropped; `open`:
  /// every rollout actor keeps rollout.max_groups_in_flight under way whatever the queue holds.
  std::string admission = "staleness";
  double stop_mean_speedup = 0.0;        ///< ends early when a step's mean speedup of correct samples reaches this; 0: never
  double max_minutes = 0.0;
};

/// `stages.search:` — contrastive search without updates: sample, evaluate, keep the exemplars.
struct search_stage_config {
  std::int64_t steps = 0;                ///< rounds of `groups` groups; 0: the stage is skipped
  std::int64_t groups = 4;               ///< groups sampled and evaluated per round
  double stop_mean_speedup = 0.0;        ///< ends early when a round's mean speedup of correct samples reaches this; 0: never
  double max_minutes = 0.0;
};

/// `stages:` — the schedule, run in this order; a stage with 0 steps is skipped.
struct stages_config {
  sft_stage_config sft;
  self_supervised_stage_config self_supervised;
  rl_stage_config rl;
  search_stage_config search;
};

/// `policy:` — where rollouts sample: crucible's own engine (`local`, the `model:` section) or an
/// OpenAI-compatible endpoint (`openai`: vLLM, SGLang, `crucible serve-policy`, a hosted API).
struct policy_config {
  std::string backend = "local";         ///< local or openai
  std::string base_url;                  ///< openai: the API's base, e.g. http://127.0.0.1:8000/v1
  std::string model;                     ///< openai: the model name the endpoint serves
  std::string api_key_file;              ///< openai: file holding the API key (first line); "": none sent
  std::int64_t concurrency = 8;          ///< openai: requests in flight at most
  std::int64_t retries = 5;              ///< openai: retries of a failed request (connection, 429, 5xx), with backoff
  double timeout_s = 600.0;              ///< openai: one request's limit
  std::string tokenizer;                 ///< openai: tokenizer directory for the prompt budget; "": a token per 3 bytes
  bool logprobs = false;                 ///< openai: ask for the sampled tokens' log-probs (stored with the samples)
  bool token_ids = false;                ///< openai: ask for token ids (vLLM's and serve-policy's return_token_ids)
};

/// `membership:` — nodes that join a running experiment (actors/membership.hpp, docs/scaling.md).
struct membership_config {
  std::string listen = "127.0.0.1:0"; ///< HOST:PORT the membership actor is published on; port 0: any free port; "": none
  std::string token_file;             ///< shared secret of the run; "": `membership.token` in the run directory
  double heartbeat_s = 2.0;           ///< seconds between a node's heartbeats
  double timeout_s = 10.0;            ///< a node silent this long is removed and its work re-queued
};

/// The whole configuration. Plain value; copy freely.
struct config {
  run_options run;
  log_options log;
  actor_options actors;
  evaluator_options evaluator;
  reward_options reward;
  exemplar_config exemplar;
  prompt_config prompt;
  learner_options learner;
  rollout_config rollout;
  engine_config engine;
  model_config model;
  policy_config policy;
  tasks_config tasks;
  stages_config stages;
  membership_config membership;
};

/// Decodes `yaml_text` (named `origin` in messages, e.g. "configs/x.yaml"), applying
/// `overrides` ("key.path=value", as given to --set) on top. Rejects unknown keys, wrong types
/// and invalid values; the error (errc::config) lists every problem, one per line, as
/// `origin:line: key.path: what is wrong` (or `--set key.path=value: ...` for an override).
result<config> parse_config(std::string_view yaml_text, const std::string& origin,
                            const std::vector<std::string>& overrides = {});

/// Reads and decodes a file; errc::not_found / errc::io name the path.
result<config> load_config(const std::filesystem::path& file,
                           const std::vector<std::string>& overrides = {});

/// The engines' devices: engine.devices, or model.device alone where it is empty.
inline std::vector<std::string> engine_devices(const config& cfg) {
  return cfg.engine.devices.empty() ? std::vector<std::string>{cfg.model.device} : cfg.engine.devices;
}

/// The engines' devices other than model.device: the GPUs an engine has to itself.
inline std::vector<std::string> engine_devices_apart(const config& cfg) {
  std::vector<std::string> out;
  for (const auto& d : cfg.engine.devices)
    if (d != cfg.model.device)
      out.push_back(d);
  return out;
}

/// The learner ranks' devices: learner.devices, or model.device alone where it is empty.
inline std::vector<std::string> learner_devices(const config& cfg) {
  return cfg.learner.devices.empty() ? std::vector<std::string>{cfg.model.device} : cfg.learner.devices;
}

/// The configuration with every key, defaults included, as YAML that parse_config accepts.
std::string to_yaml(const config& cfg);

/// The reference of every key (type, default, meaning) as Markdown: docs/configuration.md.
std::string config_reference_markdown();

} // namespace crucible
