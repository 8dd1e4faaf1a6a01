#include "service/policy_service.hpp"

#include <random>

namespace crucible::service {

namespace {

using clock_type = std::chrono::steady_clock;

// Jobs sampled in one engine call must sample alike.
bool same_sampling(const policy::sampling_options& a, const policy::sampling_options& b) {
  return a.temperature == b.temperature && a.top_p == b.top_p && a.top_k == b.top_k &&
         a.max_new_tokens == b.max_new_tokens && a.samples_per_prompt == b.samples_per_prompt && a.stop == b.stop &&
         a.eos_ids == b.eos_ids;
}

std::int64_t rows_of(const generation_job& j) {
  return static_cast<std::int64_t>(j.prompts.size()) * std::max<std::int64_t>(1, j.options.samples_per_prompt);
}

void finish(generation_state& s, std::optional<crucible::error> failure) {
  {
    std::lock_guard lock{s.mutex};
    s.finished = true;
    s.failure = std::move(failure);
    ++s.version;
  }
  s.changed.notify_all();
}

} // namespace

policy_service::policy_service(std::unique_ptr<policy::engine> engine, policy::detokenize_fn detokenize,
                               policy_service_options options, logger& log)
    : engine_(std::move(engine)), detokenize_(std::move(detokenize)), opt_(options), log_(log),
      next_seed_((static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {
  thread_ = std::thread([this] { run(); });
}

policy_service::~policy_service() {
  std::deque<std::pair<generation_job, std::shared_ptr<generation_state>>> left;
  {
    std::lock_guard lock{mutex_};
    stopping_ = true;
    left.swap(queue_);
  }
  wake_.notify_all();
  for (auto& [job, state] : left)
    finish(*state, crucible::error{errc::cancelled, "the service is stopping"});
  if (thread_.joinable())
    thread_.join();
}

policy_service::ticket policy_service::submit(generation_job job) {
  auto state = std::make_shared<generation_state>();
  {
    std::lock_guard lock{mutex_};
    if (stopping_)
      return {admission::stopping, nullptr};
    if (static_cast<std::int64_t>(queue_.size()) + counters_.running >= opt_.queue_limit) {
      ++counters_.refused_full;
      return {admission::full, nullptr};
    }
    queue_.emplace_back(std::move(job), state);
  }
  wake_.notify_one();
  return {admission::queued, std::move(state)};
}

policy_service::snapshot policy_service::wait(generation_state& s, std::uint64_t& seen, clock_type::time_point until) {
  std::unique_lock lock{s.mutex};
  s.changed.wait_until(lock, until, [&] { return s.finished || s.version != seen; });
  seen = s.version;
  return {s.completions, s.finished, s.failure};
}

const policy::model_config& policy_service::config() const noexcept { return engine_->config(); }

policy_counters policy_service::counters() const {
  std::lock_guard lock{mutex_};
  auto c = counters_;
  c.queued = static_cast<std::int64_t>(queue_.size());
  return c;
}

void policy_service::run() {
  for (;;) {
    std::vector<std::pair<generation_job, std::shared_ptr<generation_state>>> batch;
    {
      std::unique_lock lock{mutex_};
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_)
        return;
      // The oldest job, and after it every queued job that samples alike (none with a seed of its
      // own), while the call's rows stay within max_batch_rows.
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
      std::int64_t rows = rows_of(batch.front().first);
      if (!batch.front().first.seeded)
        for (auto it = queue_.begin(); it != queue_.end();) {
          if (!it->first.seeded && same_sampling(it->first.options, batch.front().first.options) &&
              rows + rows_of(it->first) <= opt_.max_batch_rows) {
            rows += rows_of(it->first);
            batch.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
      counters_.running += static_cast<std::int64_t>(batch.size());
    }
    run_batch(batch);
    std::lock_guard lock{mutex_};
    counters_.running -= static_cast<std::int64_t>(batch.size());
  }
}

void policy_service::run_batch(std::vector<std::pair<generation_job, std::shared_ptr<generation_state>>>& batch) {
  // Jobs whose clients went away before their turn are dropped unsampled.
  std::erase_if(batch, [](auto& b) {
    std::lock_guard lock{b.second->mutex};
    if (b.second->abandoned) {
      b.second->finished = true;
      b.second->failure = crucible::error{errc::cancelled, "the client went away"};
    }
    return b.second->abandoned;
  });
  if (batch.empty())
    return;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::size_t> first_prompt; // per job: the index of its first prompt in the call
  std::int64_t prompt_tokens = 0;
  for (auto& [job, state] : batch) {
    first_prompt.push_back(prompts.size());
    for (auto& p : job.prompts) {
      prompt_tokens += static_cast<std::int64_t>(p.size());
      prompts.push_back(p);
    }
  }
  auto so = batch.front().first.options;
  if (!batch.front().first.seeded)
    so.seed = next_seed_++;
  const auto per_prompt = static_cast<std::size_t>(std::max<std::int64_t>(1, so.samples_per_prompt));
  // Hands each job its slice of the call's completions, prompt indices its own.
  auto distribute = [&](std::span<const policy::completion> all) {
    for (std::size_t j = 0; j < batch.size(); ++j) {
      auto& state = *batch[j].second;
      const std::size_t from = first_prompt[j] * per_prompt, n = batch[j].first.prompts.size() * per_prompt;
      {
        std::lock_guard lock{state.mutex};
        state.completions.assign(all.begin() + static_cast<std::ptrdiff_t>(from),
                                 all.begin() + static_cast<std::ptrdiff_t>(from + n));
        for (auto& c : state.completions)
          c.prompt_index -= first_prompt[j];
        ++state.version;
      }
      state.changed.notify_all();
    }
  };
  so.on_progress = distribute;
  const auto t0 = clock_type::now();
  std::optional<crucible::error> failure;
  std::int64_t generated = 0;
  try {
    auto out = engine_->generate(prompts, so, detokenize_);
    if (!out) {
      failure = out.error();
    } else {
      distribute(*out);
      for (const auto& c : *out)
        generated += static_cast<std::int64_t>(c.tokens.size());
    }
  } catch (const std::exception& e) { // LibTorch failures (out of memory, a device error)
    failure = crucible::error{errc::device, e.what()};
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (failure)
    log_.warn("serve-policy", "an engine call of ", batch.size(), " requests failed: ", failure->message);
  for (auto& [job, state] : batch)
    finish(*state, failure);
  std::lock_guard lock{mutex_};
  ++counters_.engine_calls;
  counters_.engine_seconds += seconds;
  counters_.prompt_tokens += prompt_tokens;
  counters_.generated_tokens += generated;
  counters_.finished += failure ? 0 : static_cast<std::int64_t>(batch.size());
  counters_.failed += failure ? static_cast<std::int64_t>(batch.size()) : 0;
}

} // namespace crucible::service
