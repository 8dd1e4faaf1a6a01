// Engine actor: rollouts -> (bounded queue, batches of equal sampling settings) -> runner on its
// own thread -> policy::engine -> completions back to each rollout; weights replaced between calls.
#include "actors/engine.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <deque>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "actors/actor_config.hpp"
#include "env/eval/device_gate.hpp"
#include "actors/waiting_requests.hpp"
#include "policy/model/model_config.hpp"

namespace crucible {

engine_actor_options engine_actor_options::from(const config& cfg) {
  engine_actor_options o;
  o.max_queued = static_cast<std::uint64_t>(cfg.engine.max_queued);
  o.max_batch_prompts = static_cast<std::uint64_t>(cfg.engine.max_batch_prompts);
  o.max_batch_samples = static_cast<std::uint64_t>(cfg.engine.max_batch_samples);
  o.max_prompt_tokens = static_cast<std::uint64_t>(cfg.engine.max_prompt_tokens);
  return o;
}

result<void> engine_actor_options::validate() const {
  if (max_queued < 1)
    return fail(errc::config, "engine.max_queued: must be at least 1");
  if (max_batch_prompts < 1)
    return fail(errc::config, "engine.max_batch_prompts: must be at least 1");
  if (max_batch_samples < 1)
    return fail(errc::config, "engine.max_batch_samples: must be at least 1");
  if (max_queued_updates < 1)
    return fail(errc::config, "engine actor: max_queued_updates must be at least 1");
  return {};
}

namespace {

// -- runner ---------------------------------------------------------------------------------

struct runner_state {
  // Not an aggregate: CAF constructs a state from the actor pointer when it can, and C++20
  // would let an aggregate try that through its first member.
  runner_state() = default;

  std::shared_ptr<policy::engine> engine;
  std::shared_ptr<const policy::tokenizer> tokenizer;
  weight_receiver receive;
  engine_actor_options opt;
  std::vector<std::int32_t> eos_ids; // the tokenizer's eos and the model's eos_token_id(s)
  static inline const char* name = "crucible.engine_runner";
};

using runner_pointer = engine_runner_actor::stateful_pointer<runner_state>;

std::vector<std::int32_t> eos_ids_of(const policy::engine& e, const policy::tokenizer& tok) {
  std::vector<std::int32_t> out;
  auto add = [&](std::int64_t id) {
    auto x = static_cast<std::int32_t>(id);
    if (id >= 0 && id < e.config().vocab_size && std::find(out.begin(), out.end(), x) == out.end())
      out.push_back(x);
  };
  if (auto id = tok.eos_id())
    add(*id);
  for (auto id : e.config().eos_token_ids)
    add(id);
  return out;
}

policy::sampling_options to_sampling_options(const generation_request& r, std::vector<std::int32_t> eos) {
  policy::sampling_options o;
  o.temperature = r.params.temperature;
  o.top_p = r.params.top_p;
  o.top_k = r.params.top_k;
  o.max_new_tokens = static_cast<std::int64_t>(r.params.max_new_tokens);
  o.samples_per_prompt = static_cast<std::int64_t>(r.samples);
  o.stop = r.params.stop;
  o.eos_ids = std::move(eos);
  o.seed = r.params.seed;
  return o;
}

// The prompt of `r` as token ids, or why it cannot be sampled.
result<std::vector<std::int32_t>> prompt_ids(const runner_state& st, const generation_request& r) {
  auto ids = r.prompt_token_ids.empty() ? st.tokenizer->encode(r.prompt, r.add_special_tokens) : r.prompt_token_ids;
  const auto who = "generation request " + to_string(r.group) + ": ";
  if (ids.empty())
    return fail(errc::invalid_arg, who, "the prompt is empty");
  if (st.opt.max_prompt_tokens > 0 && ids.size() > st.opt.max_prompt_tokens)
    return fail(errc::invalid_arg, who, "the prompt has ", std::to_string(ids.size()), " tokens, more than engine.max_prompt_tokens (",
                std::to_string(st.opt.max_prompt_tokens), ")");
  const auto vocab = st.engine->config().vocab_size;
  for (auto id : ids)
    if (id < 0 || id >= vocab)
      return fail(errc::invalid_arg, who, "token ", std::to_string(id), " is outside the vocabulary of ", std::to_string(vocab));
  if (r.samples < 1)
    return fail(errc::invalid_arg, who, "samples must be at least 1");
  return ids;
}

generation_batch_result run_batch(runner_state& st, const generation_batch& batch) {
  const auto n = batch.requests.size();
  generation_batch_result out;
  out.results.resize(n);
  out.errors.resize(n);
  std::vector<std::size_t> valid; // indices into batch.requests of the prompts sampled
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& r = batch.requests[i];
    auto ids = prompt_ids(st, r);
    if (!ids.ok()) {
      out.errors[i] = make_error(ids.error());
      continue;
    }
    out.results[i].group = r.group;
    out.results[i].task = r.task;
    out.results[i].prompt_token_ids = *ids;
    valid.push_back(i);
    prompts.push_back(std::move(*ids));
  }
  if (valid.empty())
    return out;
  const auto& first = batch.requests[valid.front()];
  auto opts = to_sampling_options(first, st.eos_ids);
  const auto& tok = *st.tokenizer;
  policy::detokenize_fn detok = [&tok](std::span<const std::int32_t> ids) { return tok.decode(ids, false); };
  result<std::vector<policy::completion>> sampled = fail(errc::device, "the engine call did not run");
  try {
    // Where an evaluator times verdicts on this GPU too, a generation never overlaps its
    // measured rounds (env::device_gate, host work).
    const auto gate = env::gate_for_host_work(st.opt.load.device);
    env::host_hold hold{gate.get()};
    sampled = st.engine->generate(prompts, opts, detok);
  } catch (const std::exception& e) {
    // LibTorch reports allocation failures and kernel errors as exceptions.
    sampled = fail(errc::device, "engine call failed: ", e.what());
  }
  if (!sampled.ok()) {
    for (auto i : valid) {
      out.results[i] = generation_result{};
      out.errors[i] = make_error(sampled.error());
    }
    return out;
  }
  for (auto& c : *sampled) {
    auto& res = out.results[valid[c.prompt_index]];
    completion x;
    x.text = policy::completion_text(c, detok);
    x.token_ids = std::move(c.tokens);
    x.logprobs = std::move(c.logprobs);
    x.policy_version = policy_version{c.policy_version};
    res.completions.push_back(std::move(x));
  }
  return out;
}

caf::error check_version(const runner_state& st, policy_version v) {
  const auto served = st.engine->policy_version();
  if (v.value < served)
    return make_error(errc::invalid_arg, "weights of version " + std::to_string(v.value) + " are older than the version served ("
                                           + std::to_string(served) + ")");
  return {};
}

engine_runner_actor::behavior_type runner(runner_pointer self, engine_deps deps, engine_actor_options opt) {
  auto& st = self->state;
  st.engine = std::move(deps.engine);
  st.tokenizer = std::move(deps.tokenizer);
  st.receive = std::move(deps.receive_weights);
  st.opt = std::move(opt);
  st.eos_ids = eos_ids_of(*st.engine, *st.tokenizer);
  return {
    [=](const generation_batch& batch) -> generation_batch_result { return run_batch(self->state, batch); },
    [=](const weight_update& u) -> caf::result<policy_version> {
      auto& st = self->state;
      if (auto err = check_version(st, u.policy_version))
        return err;
      auto cfg = policy::read_model_config(u.model_dir);
      if (!cfg.ok())
        return make_error(cfg.error());
      if (cfg->vocab_size != st.engine->config().vocab_size)
        return make_error(errc::invalid_arg, u.model_dir + ": vocabulary of " + std::to_string(cfg->vocab_size)
                                               + " tokens, the served model has " + std::to_string(st.engine->config().vocab_size));
      result<std::unique_ptr<policy::engine>> fresh = fail(errc::device, "not loaded");
      try {
        fresh = policy::engine::load(u.model_dir, st.opt.load);
      } catch (const std::exception& e) {
        fresh = fail(errc::device, u.model_dir, ": loading failed: ", e.what());
      }
      if (!fresh.ok())
        return make_error(fresh.error());
      (*fresh)->set_policy_version(u.policy_version.value);
      st.engine = std::shared_ptr<policy::engine>(std::move(*fresh));
      st.eos_ids = eos_ids_of(*st.engine, *st.tokenizer);
      return u.policy_version;
    },
    [=](const weights_published& w) -> caf::result<policy_version> {
      auto& st = self->state;
      if (!st.receive)
        return make_error(errc::unsupported, "this engine has no weight receiver; send a weight_update with a model directory");
      if (auto err = check_version(st, w.policy_version))
        return err;
      result<void> got = fail(errc::device, "not received");
      try {
        got = st.receive(*st.engine, w);
      } catch (const std::exception& e) {
        got = fail(errc::device, "receiving weights of version ", std::to_string(w.policy_version.value), " failed: ", e.what());
      }
      if (!got.ok())
        return make_error(got.error());
      // A receiver may install a newer version than announced (an in-memory handoff installs the
      // newest staged) and says so through the engine's version.
      const auto served = std::max(st.engine->policy_version(), w.policy_version.value);
      st.engine->set_policy_version(served);
      return policy_version{served};
    },
  };
}

// -- front ----------------------------------------------------------------------------------

// A weight update waiting for the runner: a model directory, or an announced broadcast.
struct waiting_update {
  bool published = false;
  weight_update update;
  weights_published announce;
  caf::typed_response_promise<policy_version> rp;
};

struct engine_state {
  // Not an aggregate: CAF constructs a state from the actor pointer when it can, and C++20
  // would let an aggregate try that through its first member.
  engine_state() = default;

  engine_runner_actor runner;
  engine_actor_options opt;
  std::deque<waiting_request> queue;
  std::deque<waiting_update> updates;
  bool busy = false; // the runner has a call or an update
  engine_status status;
  static inline const char* name = "crucible.engine";
};

using engine_pointer = engine_actor::stateful_pointer<engine_state>;

// Requests that may share an engine call: equal sampling settings but the seed.
bool compatible(const generation_request& a, const generation_request& b) {
  auto pa = a.params, pb = b.params;
  pa.seed = pb.seed = 0;
  return a.samples == b.samples && pa == pb;
}

void pump(engine_pointer self);

void start_update(engine_pointer self) {
  auto& st = self->state;
  auto job = std::move(st.updates.front());
  st.updates.pop_front();
  st.busy = true;
  auto done = [=](const policy_version& v) mutable {
    auto& st = self->state;
    st.status.policy_version = v;
    ++st.status.weight_updates;
    job.rp.deliver(v);
    st.busy = false;
    pump(self);
  };
  auto failed = [=](const caf::error& e) mutable {
    job.rp.deliver(e);
    self->state.busy = false;
    pump(self);
  };
  if (job.published)
    self->request(st.runner, caf::infinite, job.announce).then(done, failed);
  else
    self->request(st.runner, caf::infinite, job.update).then(done, failed);
}

void start_batch(engine_pointer self) {
  auto& st = self->state;
  std::vector<waiting_request> taken;
  std::uint64_t samples = 0;
  for (auto it = st.queue.begin(); it != st.queue.end() && taken.size() < st.opt.max_batch_prompts;) {
    bool first = taken.empty();
    if (first || (compatible(taken.front().req, it->req) && samples + it->req.samples <= st.opt.max_batch_samples)) {
      samples += it->req.samples;
      taken.push_back(std::move(*it));
      it = st.queue.erase(it);
    } else {
      ++it;
    }
  }
  generation_batch batch;
  std::vector<caf::typed_response_promise<generation_result>> promises;
  for (auto& w : taken) {
    batch.requests.push_back(std::move(w.req));
    promises.push_back(std::move(w.rp));
  }
  st.busy = true;
  st.status.running = promises.size();
  ++st.status.batches;
  self->request(st.runner, caf::infinite, std::move(batch))
    .then(
      [=](generation_batch_result& out) mutable {
        auto& st = self->state;
        for (std::size_t i = 0; i < promises.size(); ++i) {
          if (i < out.errors.size() && out.errors[i]) {
            ++st.status.failed;
            promises[i].deliver(out.errors[i]);
          } else if (i < out.results.size()) {
            ++st.status.requests;
            st.status.samples += out.results[i].completions.size();
            promises[i].deliver(std::move(out.results[i]));
          } else {
            ++st.status.failed;
            promises[i].deliver(make_error(errc::protocol, "the engine runner answered fewer requests than it got"));
          }
        }
        st.status.running = 0;
        st.busy = false;
        pump(self);
      },
      [=](const caf::error& e) mutable {
        auto& st = self->state;
        for (auto& rp : promises)
          rp.deliver(e);
        st.status.failed += promises.size();
        st.status.running = 0;
        st.busy = false;
        pump(self);
      });
}

void pump(engine_pointer self) {
  auto& st = self->state;
  if (st.busy)
    return;
  if (!st.updates.empty())
    start_update(self);
  else if (!st.queue.empty())
    start_batch(self);
}

caf::error refuse_update(engine_pointer self) {
  return make_error(errc::busy, std::to_string(self->state.updates.size()) + " weight updates are waiting (limit "
                                  + std::to_string(self->state.opt.max_queued_updates) + "); retry later");
}

engine_actor::behavior_type engine_front(engine_pointer self, engine_deps deps, engine_actor_options opt) {
  auto& st = self->state;
  st.status.policy_version = policy_version{deps.engine->policy_version()};
  st.opt = opt;
  if (opt.detached)
    st.runner = self->spawn<caf::detached + caf::linked>(runner, std::move(deps), opt);
  else
    st.runner = self->spawn<caf::linked>(runner, std::move(deps), opt);
  return {
    [=](generation_request& req) -> caf::result<generation_result> {
      return queue_generation(self, req, "", [](engine_pointer s) { pump(s); });
    },
    [=](cancel_atom) {
      auto& st = self->state;
      st.status.cancelled += cancel_waiting_from(st.queue, self->current_sender(), "ran");
    },
    [=](weight_update& u) -> caf::result<policy_version> {
      auto& st = self->state;
      if (st.updates.size() >= st.opt.max_queued_updates)
        return refuse_update(self);
      auto rp = self->make_response_promise<policy_version>();
      st.updates.push_back({false, std::move(u), {}, rp});
      pump(self);
      return rp;
    },
    [=](weights_published& w) -> caf::result<policy_version> {
      auto& st = self->state;
      if (st.updates.size() >= st.opt.max_queued_updates)
        return refuse_update(self);
      auto rp = self->make_response_promise<policy_version>();
      st.updates.push_back({true, {}, std::move(w), rp});
      pump(self);
      return rp;
    },
    [=](caf::get_atom) -> engine_status {
      auto out = self->state.status;
      out.queued = self->state.queue.size();
      return out;
    },
  };
}

} // namespace

result<engine_actor> spawn_engine_actor(caf::actor_system& sys, engine_deps deps, engine_actor_options opt) {
  if (auto ok = opt.validate(); !ok.ok())
    return ok.error();
  if (!deps.engine)
    return fail(errc::invalid_arg, "engine actor: no engine");
  if (!deps.tokenizer)
    return fail(errc::invalid_arg, "engine actor: no tokenizer");
  const auto vocab = deps.engine->config().vocab_size;
  if (static_cast<std::int64_t>(deps.tokenizer->vocab_size()) > vocab)
    return fail(errc::invalid_arg, "engine actor: the tokenizer has ", std::to_string(deps.tokenizer->vocab_size()),
                " tokens, the model's vocabulary only ", std::to_string(vocab));
  engine_actor h = sys.spawn(engine_front, std::move(deps), std::move(opt));
  return h;
}

} // namespace crucible
