// core/config.hpp: the typed run configuration, decoded once from YAML (plus --set overrides)
// and passed down by value. Every key, its type, default and meaning is declared once, in
// config.cpp's describe(); decoding, the resolved YAML and docs/configuration.md all come from it.
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

/// `run:` — naming and placing the run.
struct run_options {
  std::string name = "quickstart"; ///< run directory is `dir/name`
  std::string dir = "runs";        ///< parent of run directories (relative to the working dir)
  std::uint64_t seed = 0;          ///< root of every random stream in the run
};

/// `log:` — levels for stderr and for the run's events.log.
struct log_options {
  log_level level = log_level::info;       ///< stderr threshold
  log_level file_level = log_level::debug; ///< events.log threshold
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

/// `evaluator:` — sandboxed workers, correctness trials and the timing protocol.
struct evaluator_options {
  std::string python;                          ///< "" : .venv/bin/python of the checkout, else python3
  std::vector<std::string> devices{"cpu"};     ///< "cpu" or "cuda:N", one evaluator per entry
  std::int64_t concurrency = 1;                ///< evaluations in flight per device (compiles overlap timing)
  std::int64_t warm_workers = 1;               ///< idle pre-started workers kept per device
  std::int64_t trials = 5;                     ///< correctness trials on fresh inputs
  std::int64_t rounds = 30;                    ///< timed paired rounds per measurement
  std::int64_t max_rounds = 120;               ///< cap when unstable measurements add rounds
  std::int64_t buckets = 5;
  double max_spread = 0.02;
  double max_bucket_disagreement = 0.05;
  double win_threshold = 1.01;
  double recheck_above = 3.0;                  ///< speedups above this are measured a second time
  double recheck_tolerance = 0.10;             ///< ... and rejected if the two differ by more
  timing_baseline baseline = timing_baseline::eager;
  std::uint64_t flush_bytes = 0;               ///< 0: 256 MiB on CUDA, 64 MiB on CPU
  double fp32_atol = 1e-4, fp32_rtol = 1e-4;
  double fp16_atol = 1e-2, fp16_rtol = 1e-2;
  double bf16_atol = 1e-2, bf16_rtol = 1e-2;
  double start_timeout_s = 120;                ///< worker start (torch import, device init)
  double reference_timeout_s = 120;            ///< reference outputs for all trials
  double load_timeout_s = 600;                 ///< candidate import, extension builds included
  double run_timeout_s = 300;                  ///< trials and timing
  std::uint64_t memory_limit_mb = 16384;       ///< address-space limit of CPU workers; 0: none
  std::int64_t cpu_threads = 1;                ///< torch threads in a CPU worker
  std::string cache;                           ///< verdict cache (SQLite); "" : ~/.cache/crucible/verdicts.db
  std::string extensions_dir;                  ///< compiled extensions; "" : ~/.cache/crucible/extensions
  bool static_checks = true;
};

/// The whole configuration. Plain value; copy freely.
struct config {
  run_options run;
  log_options log;
  actor_options actors;
  evaluator_options evaluator;
  reward_options reward;
  learner_options learner;
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

/// The configuration with every key, defaults included, as YAML that parse_config accepts.
std::string to_yaml(const config& cfg);

/// The reference of every key (type, default, meaning) as Markdown: docs/configuration.md.
std::string config_reference_markdown();

} // namespace crucible
