// service/policy_service.hpp: one policy engine behind `crucible serve-policy` (docs/service.md).
// A bounded queue of generation jobs run by one engine thread (the engine is not thread-safe);
// queued jobs with the same sampling options and no seed of their own are sampled together in
// one engine call, as a rollout batch is. A job's completions are visible as they grow (the
// engine's host syncs), for streaming. No HTTP here: tools/crucible/cmd_serve_policy.cpp speaks
// the OpenAI protocol over it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "policy/model/engine.hpp"

namespace crucible::service {

/// One request to the engine: prompts (token ids) and how to sample them. Plain value.
struct generation_job {
  std::vector<std::vector<std::int32_t>> prompts;
  policy::sampling_options options; ///< on_progress is the service's own; a set one is ignored
  /// The client gave the seed: the job is sampled alone, so that the same request gives the same
  /// completions. Otherwise the service seeds it and may batch it with others.
  bool seeded = false;
};

/// A submitted job as the engine thread fills it. Read it through policy_service::wait.
struct generation_state {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<policy::completion> completions; ///< prompt-major, as engine::generate returns them
  std::uint64_t version = 0;                   ///< bumped on each change
  bool finished = false;
  std::optional<crucible::error> failure;     ///< set when the job failed (finished too)
  bool abandoned = false;                      ///< the client went away: nobody reads the result
};

/// Limits of the service. Plain value.
struct policy_service_options {
  std::int64_t queue_limit = 64;     ///< jobs waiting or running, at most; more are refused at once
  std::int64_t max_batch_rows = 64;  ///< completions (prompts x samples) one engine call takes, at most
};

/// Counters for the metrics endpoint. Plain value.
struct policy_counters {
  std::int64_t queued = 0, running = 0, finished = 0, failed = 0, refused_full = 0;
  std::int64_t engine_calls = 0, prompt_tokens = 0, generated_tokens = 0;
  double engine_seconds = 0;
};

class policy_service {
public:
  /// Takes the engine; `detokenize` turns ids into text (stop strings). Starts the engine thread.
  policy_service(std::unique_ptr<policy::engine> engine, policy::detokenize_fn detokenize,
                 policy_service_options options, logger& log);
  /// Stops: the running engine call finishes, queued jobs fail ("the service is stopping").
  ~policy_service();
  policy_service(const policy_service&) = delete;
  policy_service& operator=(const policy_service&) = delete;

  enum class admission : std::uint8_t { queued, full, stopping };
  struct ticket {
    admission how = admission::queued;
    std::shared_ptr<generation_state> state; ///< null unless queued
  };
  /// Queues `job` (errc-free: a full queue or a stopping service is an admission, not an error).
  ticket submit(generation_job job);

  /// What a reader sees: the job's completions when they changed past `seen` (a version), or
  /// when it finished, or at `until`. Returns a copy; `seen` is updated.
  struct snapshot {
    std::vector<policy::completion> completions;
    bool finished = false;
    std::optional<crucible::error> failure;
  };
  static snapshot wait(generation_state& s, std::uint64_t& seen, std::chrono::steady_clock::time_point until);

  const policy::model_config& config() const noexcept;
  policy_counters counters() const;

private:
  void run();
  void run_batch(std::vector<std::pair<generation_job, std::shared_ptr<generation_state>>>& batch);

  std::unique_ptr<policy::engine> engine_;
  policy::detokenize_fn detokenize_;
  policy_service_options opt_;
  logger& log_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<generation_job, std::shared_ptr<generation_state>>> queue_;
  bool stopping_ = false;
  policy_counters counters_;
  std::uint64_t next_seed_;
  std::thread thread_;
};

} // namespace crucible::service
