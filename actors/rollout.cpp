// Rollout actor: task sampler -> exemplar actor (exemplars) -> prompt builder -> engine actor (G
// completions) -> exemplar actor (group announce) -> response parser -> evaluator pool ->
// exemplar actor (scored variants, which complete the group for the learners).
#include "actors/rollout.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "actors/actor_config.hpp"
#include "actors/group_book.hpp"
#include "env/prompt/task_sampler.hpp"

namespace crucible {

rollout_actor_options rollout_actor_options::from(const config& cfg, std::uint64_t index) {
  const auto& r = cfg.rollout;
  rollout_actor_options o;
  o.group_size = static_cast<std::uint32_t>(std::clamp<std::int64_t>(r.group_size, 0, std::numeric_limits<std::uint32_t>::max()));
  o.sampling.temperature = r.temperature;
  o.sampling.top_p = r.top_p;
  o.sampling.top_k = static_cast<std::int32_t>(std::clamp<std::int64_t>(r.top_k, 0, std::numeric_limits<std::int32_t>::max()));
  o.sampling.max_new_tokens =
    static_cast<std::uint32_t>(std::clamp<std::int64_t>(r.max_new_tokens, 0, std::numeric_limits<std::uint32_t>::max()));
  o.sampling.stop = r.stop;
  o.max_groups_in_flight = static_cast<std::uint64_t>(std::max<std::int64_t>(0, r.max_groups_in_flight));
  o.turns = static_cast<std::uint32_t>(std::clamp<std::int64_t>(r.turns, 0, 1024));
  o.turn_stop_speedup = r.turn_stop_speedup;
  o.sampler = r.sampler;
  o.sampler_mix = r.sampler_mix;
  o.hardware = r.hardware;
  o.retry_s = r.retry_s;
  o.on_stop = r.on_stop;
  o.index = index;
  o.seed = cfg.run.seed;
  return o;
}

result<void> rollout_actor_options::validate() const {
  if (group_size < 1)
    return fail(errc::config, "rollout.group_size: must be at least 1");
  if (turns < 1 || turns > 16)
    return fail(errc::config, "rollout.turns: must be between 1 and 16");
  if (!(turn_stop_speedup >= 0) || !std::isfinite(turn_stop_speedup))
    return fail(errc::config, "rollout.turn_stop_speedup: must be a number >= 0");
  if (max_groups_in_flight < 1)
    return fail(errc::config, "rollout.max_groups_in_flight: must be at least 1");
  if (admitted < -1)
    return fail(errc::invalid_arg, "rollout actor: admitted must be -1 (no limit) or at least 0, got ",
                std::to_string(admitted));
  if (!(sampler_mix >= 0 && sampler_mix <= 1))
    return fail(errc::config, "rollout.sampler_mix: must be in [0, 1]");
  // At most a day: the delay travels as a caf::timespan (int64 nanoseconds).
  if (!(retry_s > 0 && retry_s <= 86400))
    return fail(errc::config, "rollout.retry_s: must be > 0 and at most 86400 (a day)");
  if (!(sampling.temperature >= 0) || !std::isfinite(sampling.temperature))
    return fail(errc::config, "rollout.temperature: must be a number >= 0");
  if (!(sampling.top_p > 0 && sampling.top_p <= 1))
    return fail(errc::config, "rollout.top_p: must be in (0, 1]");
  if (sampling.top_k < 0)
    return fail(errc::config, "rollout.top_k: must be >= 0");
  if (sampling.max_new_tokens < 1)
    return fail(errc::config, "rollout.max_new_tokens: must be at least 1");
  if (index >= (std::uint64_t{1} << 23))
    return fail(errc::config, "rollout actor index ", std::to_string(index), ": must be below 2^23");
  return {};
}

result<prompt_setup> make_prompt_setup(const config& cfg, std::shared_ptr<const policy::tokenizer> tokenizer) {
  // Behind an endpoint (policy.backend openai) the prompt goes out as messages and the endpoint
  // applies its chat template; the budget is counted in policy.tokenizer's tokens when given.
  const bool endpoint = cfg.policy.backend == "openai";
  if (!tokenizer && !endpoint)
    return fail(errc::invalid_arg, "prompt setup: no tokenizer");
  auto file = env::resolve_prompt_template(cfg.prompt.template_file);
  if (!file.ok())
    return file.error();
  auto templ = env::load_prompt_template(*file);
  if (!templ.ok())
    return templ.error();
  env::chat_format chat;
  if (!endpoint)
    chat = {tokenizer->chat_template(), tokenizer->special_tokens_map()};
  const bool plain = cfg.prompt.chat_template == chat_template_mode::none || chat.chat_template.empty();
  env::token_counter count = [tokenizer, plain](std::string_view text) -> std::size_t {
    return tokenizer ? tokenizer->encode(text, plain).size() : (text.size() + 2) / 3;
  };
  auto sections = templ->sections;
  auto builder = env::prompt_builder::create(std::move(*templ), cfg.prompt, chat, std::move(count));
  if (!builder.ok())
    return builder.error();
  prompt_setup out;
  out.builder = std::make_shared<const env::prompt_builder>(std::move(*builder));
  out.parse = env::parse_options_from(cfg.prompt, std::move(sections));
  out.add_special_tokens = plain;
  if (cfg.rollout.turns > 1) {
    auto fb = env::load_configured_feedback_template(cfg.prompt.feedback_template);
    if (!fb.ok())
      return fb.error();
    out.feedback = std::make_shared<const env::feedback_template>(std::move(*fb));
  }
  return out;
}

namespace {

constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One completion of a group on its way to a verdict; with rollout.turns > 1, one episode, whose
// fields are its current turn's.
struct member {
  variant_id variant;
  std::string code;           // the candidate; the raw response for a format error
  std::string completion;     // the whole response, for the replay store
  policy_version version;     // weights that sampled it
  bool format_error = false;
  verdict format_verdict;     // when format_error
  bool done = false;          // reported, or lost to an evaluator failure (an episode: ended)
  // Multi-turn only.
  std::uint32_t turn = 0;                  // the current turn, from 0
  std::vector<env::episode_turn> history;  // each earlier turn's answer and the feedback on it
  std::string prompt;                      // the current turn's prompt text, for the replay store
  generation_request next;                 // the next turn's request while it is generated (a retry resends it)
  bool generating = false;
};

enum class phase : std::uint8_t { exemplars, generating, announcing, evaluating };

struct group_work {
  group_id id;
  task_id task;
  std::uint32_t turns = 1;              // turns an episode may take (rollout.turns; a reopened group's own)
  phase step = phase::exemplars;
  std::vector<variant_id> exemplar_ids; // the exemplars the prompt showed
  std::string prompt;                   // the prompt text the policy saw (moved from the request once generated), for the replay store
  env::built_prompt first;              // multi-turn: the first prompt, which every later turn continues
  generation_request request;           // kept for a retry
  group_announce announce;              // kept for a retry; cleared once accepted
  std::vector<member> members;
  std::size_t open = 0;                 // members not done
  bool holds_admission = false;         // it took one of the actor's admissions and has not given it back
};

struct rollout_state {
  // Not an aggregate: CAF constructs a state from the actor pointer when it can, and C++20
  // would let an aggregate try that through its first member.
  rollout_state() = default;

  rollout_deps deps;
  rollout_actor_options opt;
  std::optional<env::task_sampler> sampler;
  std::uint64_t seed = 0;                      // this actor's stream, from opt.seed and opt.index
  std::map<std::uint64_t, group_work> groups;  // by group id
  rollout_stats stats;
  std::string kind;    // hardware kind candidates are evaluated on
  std::string device;  // its device model, as prompts and format-error verdicts name it
  bool resolved = false, resolving = false;
  bool stopping = false, advance_pending = false;
  bool resumed = false;  // the reopened groups of opt.resume are under way
  std::uint64_t next_group = 0, next_variant = 0;
  std::int64_t admitted = -1;  // groups it may still start (opt.admitted, admit_atom); -1: no limit
  std::vector<caf::typed_response_promise<rollout_stats, sampler_state>> stop_waiting;
  static inline const char* name = "crucible.rollout";
};

using rollout_pointer = rollout_impl_actor::stateful_pointer<rollout_state>;

rollout_impl_actor me(rollout_pointer self) {
  return caf::actor_cast<rollout_impl_actor>(self);
}

caf::timespan retry_delay(rollout_pointer self) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(self->state.opt.retry_s));
}

group_work* find(rollout_pointer self, group_id id) {
  auto it = self->state.groups.find(id.value);
  return it == self->state.groups.end() ? nullptr : &it->second;
}

rollout_stats snapshot(rollout_pointer self) {
  auto out = self->state.stats;
  out.in_flight = self->state.groups.size();
  return out;
}

sampler_state saved(rollout_pointer self) {
  return sampler_state{self->state.sampler->save()};
}

bool is_busy(const caf::error& e) {
  return to_error(e).code == errc::busy;
}

void fill(rollout_pointer self);

// Takes one admission for a group it starts: true when it held one (none is taken without a limit).
bool take_admission(rollout_state& st) {
  if (st.admitted <= 0)
    return false;
  --st.admitted;
  return true;
}

// Answers the stops waiting once nothing is in flight, and quits.
void check_stopped(rollout_pointer self) {
  auto& st = self->state;
  if (!st.stopping || !st.groups.empty())
    return;
  auto out = snapshot(self);
  auto sampler = saved(self);
  for (auto& rp : st.stop_waiting)
    rp.deliver(out, sampler);
  st.stop_waiting.clear();
  self->quit();
}

// Takes no new task; `drop`: abandons the groups in flight and has the engine drop this actor's
// requests still waiting (it would otherwise sample them before the next stage's: at 7B, four
// groups took 100 s at a stage change); else waits for them. Replies once nothing is in flight.
caf::result<rollout_stats, sampler_state> stop(rollout_pointer self, bool drop) {
  auto& st = self->state;
  st.stats.running = false;
  st.stopping = true;
  if (drop) {
    st.stats.groups_abandoned += st.groups.size();
    st.groups.clear();
    self->send(st.deps.engine, cancel_atom_v);
  }
  if (st.groups.empty()) {
    self->quit();
    return caf::result<rollout_stats, sampler_state>{snapshot(self), saved(self)};
  }
  auto rp = self->make_response_promise<rollout_stats, sampler_state>();
  st.stop_waiting.push_back(rp);
  return rp;
}

void schedule_advance(rollout_pointer self) {
  auto& st = self->state;
  if (st.advance_pending || !st.stats.running || st.stopping)
    return;
  st.advance_pending = true;
  self->delayed_send(me(self), retry_delay(self), advance_atom_v);
}

void finish(rollout_pointer self, group_id id) {
  auto& st = self->state;
  if (st.groups.erase(id.value) == 0)
    return;
  ++st.stats.groups_finished;
  check_stopped(self);
  fill(self);
}

// Gives up on a group before its evaluation; the next task follows after retry_s, so a failing
// collaborator is not hammered.
void abandon(rollout_pointer self, group_id id) {
  auto& st = self->state;
  const auto it = st.groups.find(id.value);
  if (it == st.groups.end())
    return;
  if (it->second.holds_admission)
    ++st.admitted; // it never reaches the trainer's queue: its admission comes back here
  st.groups.erase(it);
  ++st.stats.groups_abandoned;
  check_stopped(self);
  schedule_advance(self);
}

void retry_later(rollout_pointer self, group_id id, std::uint32_t slot) {
  ++self->state.stats.retries;
  self->delayed_send(me(self), retry_delay(self), retry_atom_v, id.value, slot);
}

void send_turn_generation(rollout_pointer self, group_id id, std::uint32_t slot);

// Member `m` as completion `c` makes it: a fresh variant id, the weights and the text, and the
// code cut from it, or a format error's verdict where there is none.
void take_completion(rollout_state& st, member& m, const completion& c) {
  m.variant = variant_id{(st.opt.index << rollout_id_shift) | ++st.next_variant};
  m.version = c.policy_version;
  m.completion = c.text;
  auto parsed = env::parse_response(c.text, st.deps.parse);
  m.format_error = !parsed.ok;
  if (parsed.ok) {
    m.code = std::move(parsed.response.code);
  } else {
    m.code = c.text;
    m.format_verdict = env::format_error_verdict(parsed, st.deps.reward, st.device);
  }
}

// Ends member `slot` (an episode: at its current turn); the group finishes with its last.
void end_member(rollout_pointer self, group_id id, std::size_t slot) {
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done)
    return;
  g->members[slot].done = true;
  if (--g->open == 0)
    finish(self, id);
}

// The request of one sample of turn `turn` of episode `slot` of group `g` on prompt `built`.
generation_request turn_request(const rollout_state& st, const group_work& g, std::uint32_t slot, std::uint32_t turn,
                                env::built_prompt built) {
  generation_request req;
  req.group = g.id;
  req.task = g.task;
  for (auto& [role, content] : built.messages)
    req.messages.push_back(chat_turn{role, std::move(content)});
  req.prompt = std::move(built.text);
  req.add_special_tokens = st.opt.add_special_tokens;
  req.samples = 1;
  req.params = st.opt.sampling;
  req.params.seed = splitmix64(st.seed ^ g.id.value ^ splitmix64((std::uint64_t{slot} << 8) | turn));
  return req;
}

// The feedback on turn `turn`'s verdict `v`, as the next user message of an episode of `turns`.
std::string feedback_on(const rollout_state& st, const verdict& v, std::uint32_t turn, std::uint32_t turns) {
  return env::render_feedback(*st.deps.feedback, v, turn + 1, turns - (turn + 1));
}

// Episode `slot`'s current turn as the next prompt shows it (its answer, the feedback on verdict
// `v`) and the request for its next turn, or nothing where the episode ends: its last turn, a
// turn correct at turn_stop_speedup, or a prompt over the budget.
std::optional<std::pair<env::episode_turn, generation_request>> next_turn(rollout_pointer self, group_work& g,
                                                                          std::uint32_t slot, const verdict& v) {
  auto& st = self->state;
  const auto& m = g.members[slot];
  if (g.turns <= 1 || m.turn + 1 >= g.turns || !st.deps.feedback)
    return std::nullopt;
  if (st.opt.turn_stop_speedup > 0 && v.status == verdict_status::ok && v.correct && v.has_speedup() &&
      v.speedup >= st.opt.turn_stop_speedup)
    return std::nullopt;
  auto history = m.history;
  history.push_back({m.completion, feedback_on(st, v, m.turn, g.turns)});
  auto built = st.deps.prompts->continue_episode(g.first, history);
  if (!built.ok()) {
    ++st.stats.turns_over_budget;
    return std::nullopt;
  }
  auto req = turn_request(st, g, slot, m.turn + 1, std::move(*built));
  return std::pair{std::move(history.back()), std::move(req)};
}

// Sends member `slot`'s scored variant to the exemplar actor. One turn: the member is done, and
// the group finishes with its last. An episode that goes on asks for its next turn.
void report(rollout_pointer self, group_id id, std::size_t slot, const verdict& v) {
  auto& st = self->state;
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done || g->members[slot].generating)
    return;
  auto& m = g->members[slot];
  st.sampler->observe(g->task.value, v);
  auto next = next_turn(self, *g, static_cast<std::uint32_t>(slot), v);
  scored_variant x{m.variant, id, g->task, m.code, v, st.kind, m.version, g->exemplar_ids,
                   g->turns > 1 && m.turn > 0 ? m.prompt : g->prompt, m.completion};
  x.episode = static_cast<std::uint32_t>(slot);
  x.turn = m.turn;
  x.continues = next.has_value();
  self->send(st.deps.exemplars, std::move(x));
  if (!next) {
    end_member(self, id, slot);
    return;
  }
  m.history.push_back(std::move(next->first));
  ++m.turn;
  m.next = std::move(next->second);
  m.generating = true;
  send_turn_generation(self, id, static_cast<std::uint32_t>(slot));
}

// A member the evaluators failed on: not reported (no verdict exists), the group goes on; the
// member's place at the exemplar actor is left to its straggler policy. An episode ends there.
void lose(rollout_pointer self, group_id id, std::size_t slot) {
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done)
    return;
  ++self->state.stats.eval_errors;
  end_member(self, id, slot);
}

// Releases the place the exemplar actor holds for turn `turn` of episode `slot` of group `id`
// (a group_extend without a variant): that turn will not come.
void release_place(rollout_pointer self, group_id id, std::uint32_t slot, std::uint32_t turn) {
  group_extend release;
  release.group = id;
  release.episode = slot;
  release.turn = turn;
  self->send(self->state.deps.exemplars, std::move(release));
}

// Member `slot`'s next turn could not be generated: the episode ends at the turn before, and
// the place its last scored variant held open at the exemplar actor is released.
void end_episode_early(rollout_pointer self, group_id id, std::uint32_t slot) {
  auto& st = self->state;
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done)
    return;
  auto& m = g->members[slot];
  m.generating = false;
  release_place(self, id, slot, m.turn);
  ++st.stats.turns_lost;
  end_member(self, id, slot);
}

void send_candidate(rollout_pointer self, group_id id, std::uint32_t slot) {
  auto& st = self->state;
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done)
    return;
  const auto& m = g->members[slot];
  candidate c{m.variant, g->task, m.code, st.kind, false};
  self->request(st.deps.evaluators, caf::infinite, std::move(c))
    .then(
      [=](const verdict& v) {
        ++self->state.stats.evaluated;
        report(self, id, slot, v);
      },
      [=](const caf::error& e) {
        if (is_busy(e) && find(self, id) != nullptr)
          retry_later(self, id, slot);
        else
          lose(self, id, slot);
      });
}

// Member `slot`'s next turn is sampled: its completion becomes the member's current variant,
// the exemplar actor is told (group_extend, before its scored variant), then it is evaluated
// (or reported at once as a format error).
void on_turn_generated(rollout_pointer self, group_id id, std::uint32_t slot, generation_result& r) {
  auto& st = self->state;
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done || !g->members[slot].generating)
    return;
  st.stats.completions += r.completions.size();
  if (r.completions.size() != 1) {
    end_episode_early(self, id, slot);
    return;
  }
  auto& m = g->members[slot];
  auto& c = r.completions.front();
  m.generating = false;
  take_completion(st, m, c);
  m.prompt = std::move(m.next.prompt);
  m.next = generation_request{};
  if (m.turn > 0)
    ++st.stats.later_turns;
  group_extend x{id, m.variant, slot, m.turn, std::move(r.prompt_token_ids), std::move(c)};
  self->send(st.deps.exemplars, std::move(x));
  if (!m.format_error) {
    send_candidate(self, id, slot);
    return;
  }
  ++st.stats.format_errors;
  auto v = m.format_verdict;
  report(self, id, slot, v);
}

void send_turn_generation(rollout_pointer self, group_id id, std::uint32_t slot) {
  auto* g = find(self, id);
  if (g == nullptr || g->members[slot].done || !g->members[slot].generating)
    return;
  self->request(self->state.deps.engine, caf::infinite, g->members[slot].next)
    .then([=](generation_result& r) { on_turn_generated(self, id, slot, r); },
          [=](const caf::error& e) {
            if (is_busy(e) && find(self, id) != nullptr)
              retry_later(self, id, slot);
            else
              end_episode_early(self, id, slot);
          });
}

void on_announced(rollout_pointer self, group_id id) {
  auto* g = find(self, id);
  if (g == nullptr)
    return;
  g->step = phase::evaluating;
  g->announce = group_announce{}; // the exemplar actor holds the completions now
  const auto n = g->members.size();
  // Candidates first: a report of the last format error may finish the group.
  for (std::uint32_t slot = 0; slot < n; ++slot)
    if (!g->members[slot].format_error)
      send_candidate(self, id, slot);
  for (std::uint32_t slot = 0; slot < n; ++slot) {
    g = find(self, id);
    if (g == nullptr)
      break;
    if (g->members[slot].format_error) {
      ++self->state.stats.format_errors;
      auto v = g->members[slot].format_verdict;
      report(self, id, slot, v);
    }
  }
}

void send_announce(rollout_pointer self, group_id id) {
  auto* g = find(self, id);
  if (g == nullptr)
    return;
  self->request(self->state.deps.exemplars, caf::infinite, g->announce)
    .then([=]() { on_announced(self, id); },
          [=](const caf::error& e) {
            if (is_busy(e))
              retry_later(self, id, no_slot);
            else
              abandon(self, id);
          });
}

void on_generated(rollout_pointer self, group_id id, generation_result& r) {
  auto& st = self->state;
  auto* g = find(self, id);
  if (g == nullptr)
    return;
  st.stats.completions += r.completions.size();
  if (r.completions.empty()) {
    abandon(self, id);
    return;
  }
  g->announce.group = id;
  g->announce.task = g->task;
  g->announce.prompt_token_ids = std::move(r.prompt_token_ids);
  g->announce.turns = g->turns;
  if (g->turns > 1) { // what a later process needs to continue the episodes
    g->announce.system = g->first.system;
    g->announce.user = g->first.user;
    g->announce.prompt = g->request.prompt;
    g->announce.exemplars = g->exemplar_ids;
  }
  for (const auto& c : r.completions) {
    member m;
    take_completion(st, m, c);
    g->announce.variants.push_back(m.variant);
    g->members.push_back(std::move(m));
  }
  g->announce.completions = std::move(r.completions);
  g->open = g->members.size();
  g->prompt = std::move(g->request.prompt); // kept for the replay store; the request is done
  g->request = generation_request{};
  g->step = phase::announcing;
  send_announce(self, id);
}

void send_generation(rollout_pointer self, group_id id) {
  auto* g = find(self, id);
  if (g == nullptr)
    return;
  self->request(self->state.deps.engine, caf::infinite, g->request)
    .then([=](generation_result& r) { on_generated(self, id, r); },
          [=](const caf::error& e) {
            if (is_busy(e))
              retry_later(self, id, no_slot);
            else
              abandon(self, id);
          });
}

void on_exemplars(rollout_pointer self, group_id id, const exemplar_set& set) {
  auto& st = self->state;
  auto* g = find(self, id);
  if (g == nullptr)
    return;
  auto task = st.deps.tasks->find(g->task);
  if (task == st.deps.tasks->end()) {
    abandon(self, id);
    return;
  }
  env::prompt_request pr;
  pr.task_name = g->task.value;
  pr.reference_code = task->second.source;
  pr.hardware = st.device;
  for (const auto& x : set.exemplars)
    pr.exemplars.push_back({x.code, x.verdict.has_speedup() ? x.verdict.speedup : 1.0, st.device});
  auto built = st.deps.prompts->build(pr);
  if (!built.ok()) {
    abandon(self, id);
    return;
  }
  for (std::size_t i = 0; i < set.exemplars.size() && i < built->exemplars.size(); ++i)
    if (built->exemplars[i].kept)
      g->exemplar_ids.push_back(set.exemplars[i].variant);
  if (g->turns > 1)
    g->first = *built; // every later turn's prompt continues it
  auto& req = g->request;
  req.group = id;
  req.task = g->task;
  req.messages = {chat_turn{"system", built->system}, chat_turn{"user", built->user}};
  req.prompt = std::move(built->text);
  req.add_special_tokens = st.opt.add_special_tokens;
  req.samples = st.opt.group_size;
  req.params = st.opt.sampling;
  req.params.seed = splitmix64(st.seed ^ id.value);
  g->step = phase::generating;
  send_generation(self, id);
}

void launch(rollout_pointer self) {
  auto& st = self->state;
  const auto& name = st.sampler->next();
  group_work g;
  g.id = group_id{(st.opt.index << rollout_id_shift) | ++st.next_group};
  g.task = task_id{name};
  g.turns = st.opt.turns;
  g.holds_admission = take_admission(st);
  auto id = g.id;
  st.groups.emplace(id.value, std::move(g));
  ++st.stats.groups_started;
  self->request(st.deps.exemplars, caf::infinite, exemplar_request{task_id{name}, st.kind, 0})
    .then([=](const exemplar_set& set) { on_exemplars(self, id, set); },
          [=](const caf::error&) { abandon(self, id); });
}

// Picks the hardware kind and device model from the pool's devices; tries again after retry_s
// while the pool has none of the wanted kind (its evaluators may still be starting).
void resolve(rollout_pointer self) {
  auto& st = self->state;
  if (st.resolving)
    return;
  st.resolving = true;
  self->request(st.deps.evaluators, caf::infinite, caf::get_atom_v)
    .then(
      [=](const std::vector<device_info>& devices) {
        auto& st = self->state;
        st.resolving = false;
        const auto& want = st.opt.hardware;
        auto it = std::find_if(devices.begin(), devices.end(), [&](const device_info& d) {
          return want.empty() || d.hardware == want || d.name == want;
        });
        if (it == devices.end()) {
          schedule_advance(self);
          return;
        }
        st.kind = it->hardware;
        st.device = it->name;
        st.resolved = true;
        fill(self);
      },
      [=](const caf::error&) {
        self->state.resolving = false;
        schedule_advance(self);
      });
}

// Continues the groups an earlier process left in flight (opt.resume): each episode at the turn
// it reached. An episode whose last stored turn went on is given its next turn (its prompt the
// first prompt, the stored answers and the feedback on their verdicts), one without a stored
// turn its first, and the others have ended; the exemplar actor holds a place for each of the
// first two kinds (it reopened the group). Each counts as a group started.
void resume_groups(rollout_pointer self) {
  auto& st = self->state;
  st.resumed = true;
  auto resume = std::move(st.opt.resume);
  st.opt.resume.clear();
  for (auto& r : resume) {
    if (st.groups.count(r.group.value) != 0 || r.episodes == 0)
      continue;
    group_work g;
    g.id = r.group;
    g.task = r.task;
    g.turns = r.turns;
    g.step = phase::evaluating;
    g.exemplar_ids = std::move(r.exemplars);
    g.prompt = r.prompt;
    g.first.system = std::move(r.system);
    g.first.user = std::move(r.user);
    g.first.text = std::move(r.prompt);
    g.first.messages = {{"system", g.first.system}, {"user", g.first.user}};
    g.members.resize(r.episodes);
    for (auto& t : r.stored)
      if (t.episode < r.episodes)
        g.members[t.episode].history.push_back({t.sampled.text, feedback_on(st, t.verdict, t.turn, g.turns)});
    // Where each episode stands, as the exemplar actor's group book holds places for them.
    const auto points = episode_points(r);
    ++st.stats.groups_started;
    ++st.stats.groups_resumed;
    g.holds_admission = take_admission(st); // a reopened group is ahead of the learner as a new one is
    // A task no longer in the pool (tasks.include changed at the resume) takes no more turns: its
    // held places are released and the group goes on with what is stored.
    const bool known = st.deps.tasks->find(g.task) != st.deps.tasks->end();
    for (std::uint32_t slot = 0; slot < r.episodes; ++slot) {
      auto& m = g.members[slot];
      const auto& p = points[slot];
      m.turn = p.turn;
      if (!p.open()) {
        m.done = true; // ended in the earlier process
        continue;
      }
      if (!known) {
        m.done = true;
        ++st.stats.turns_lost;
        release_place(self, g.id, slot, p.seen ? m.turn + 1 : 0);
        continue;
      }
      if (!p.seen) {
        m.next = turn_request(st, g, slot, 0, g.first);
        m.turn = 0;
      } else if (auto built = st.deps.prompts->continue_episode(g.first, m.history); built.ok()) {
        m.next = turn_request(st, g, slot, m.turn + 1, std::move(*built));
        ++m.turn;
      } else {
        ++st.stats.turns_over_budget;
        m.done = true;
        release_place(self, g.id, slot, m.turn + 1);
        continue;
      }
      m.generating = true;
      ++g.open;
    }
    const auto id = g.id;
    const bool open = g.open > 0;
    st.groups.emplace(id.value, std::move(g));
    if (!open) {
      finish(self, id);
      continue;
    }
    for (std::uint32_t slot = 0; slot < r.episodes; ++slot)
      send_turn_generation(self, id, slot);
  }
}

void fill(rollout_pointer self) {
  auto& st = self->state;
  if (!st.stats.running || st.stopping)
    return;
  if (!st.resolved) {
    resolve(self);
    return;
  }
  if (!st.resumed)
    resume_groups(self);
  while (st.groups.size() < st.opt.max_groups_in_flight && st.admitted != 0
         && (st.opt.max_groups == 0 || st.stats.groups_started < st.opt.max_groups)) {
    launch(self);
  }
}

rollout_impl_actor::behavior_type rollout(rollout_pointer self, rollout_deps deps, rollout_actor_options opt,
                                          std::shared_ptr<env::task_sampler> sampler) {
  auto& st = self->state;
  st.deps = std::move(deps);
  st.opt = std::move(opt);
  st.admitted = st.opt.admitted < 0 ? -1 : st.opt.admitted;
  st.sampler.emplace(std::move(*sampler));
  st.seed = splitmix64(st.opt.seed ^ splitmix64(st.opt.index + 1));
  for (const auto& peer : {caf::actor_cast<caf::actor>(st.deps.engine), caf::actor_cast<caf::actor>(st.deps.evaluators),
                           caf::actor_cast<caf::actor>(st.deps.exemplars)})
    self->monitor(peer);
  self->set_down_handler([=](const caf::down_msg& down) {
    auto& st = self->state;
    st.stats.groups_abandoned += st.groups.size();
    st.groups.clear();
    st.stats.running = false;
    auto out = snapshot(self);
    auto sampler = saved(self);
    for (auto& rp : st.stop_waiting)
      rp.deliver(out, sampler);
    st.stop_waiting.clear();
    self->quit(down.reason ? down.reason : caf::error{make_error(errc::worker_lost, "a collaborator of the rollout actor stopped")});
  });
  return {
    [=](start_atom) {
      auto& st = self->state;
      if (st.stopping)
        return;
      st.stats.running = true;
      fill(self);
    },
    [=](stop_atom) -> caf::result<rollout_stats, sampler_state> {
      return stop(self, self->state.opt.on_stop == in_flight_policy::drop);
    },
    [=](stop_atom, cancel_atom) -> caf::result<rollout_stats, sampler_state> { return stop(self, true); },
    [=](admit_atom, std::uint64_t n) {
      auto& st = self->state;
      if (st.admitted < 0)
        return; // no limit
      st.admitted += static_cast<std::int64_t>(std::min<std::uint64_t>(n, std::numeric_limits<std::int32_t>::max()));
      fill(self);
    },
    [=](caf::get_atom) -> rollout_stats { return snapshot(self); },
    [=](save_atom) -> sampler_state { return saved(self); },
    [=](advance_atom) {
      self->state.advance_pending = false;
      fill(self);
    },
    [=](retry_atom, std::uint64_t group, std::uint32_t slot) {
      auto id = group_id{group};
      auto* g = find(self, id);
      if (g == nullptr)
        return;
      if (slot != no_slot) {
        if (slot < g->members.size() && g->members[slot].generating)
          send_turn_generation(self, id, slot);
        else if (slot < g->members.size())
          send_candidate(self, id, slot);
      } else if (g->step == phase::generating) {
        send_generation(self, id);
      } else if (g->step == phase::announcing) {
        send_announce(self, id);
      }
    },
  };
}

} // namespace

std::vector<std::string> sampler_pool(const task_catalog& tasks) {
  std::vector<std::string> names;
  names.reserve(tasks.size());
  for (const auto& [id, task] : tasks)
    names.push_back(id.value);
  return names;
}

result<env::task_sampler> make_task_sampler(const task_catalog& tasks, const rollout_actor_options& opt) {
  auto sampler = env::task_sampler::create(sampler_pool(tasks), opt.sampler, opt.sampler_mix,
                                           splitmix64(opt.seed ^ splitmix64(opt.index + 1) ^ 0x5a4d));
  if (!sampler.ok() || opt.saved_sampler.empty())
    return sampler;
  if (auto r = sampler->restore(opt.saved_sampler); !r.ok())
    return r.error();
  return sampler;
}

result<rollout_actor> spawn_rollout_actor(caf::actor_system& sys, rollout_deps deps, rollout_actor_options opt) {
  if (auto ok = opt.validate(); !ok.ok())
    return ok.error();
  if (!deps.engine || !deps.evaluators || !deps.exemplars)
    return fail(errc::invalid_arg, "rollout actor: the engine, evaluator pool and exemplar actor are all needed");
  if (!deps.prompts)
    return fail(errc::invalid_arg, "rollout actor: no prompt builder");
  if (!deps.tasks || deps.tasks->empty())
    return fail(errc::invalid_arg, "rollout actor: the task catalogue is empty");
  if (opt.turns > 1 && !deps.feedback)
    return fail(errc::invalid_arg, "rollout actor: rollout.turns = ", std::to_string(opt.turns),
                " needs the feedback template (prompt.feedback_template)");
  if (!opt.resume.empty() && !deps.feedback)
    return fail(errc::invalid_arg, "rollout actor: groups of episodes to continue need the feedback template "
                                   "(prompt.feedback_template)");
  auto sampler = make_task_sampler(*deps.tasks, opt);
  if (!sampler.ok())
    return sampler.error();
  auto shared = std::make_shared<env::task_sampler>(std::move(*sampler));
  rollout_actor h = sys.spawn(rollout, std::move(deps), std::move(opt), std::move(shared));
  return h;
}

result<std::vector<rollout_actor>> spawn_rollout_actors(caf::actor_system& sys, const rollout_deps& deps,
                                                        const config& cfg, bool add_special_tokens) {
  std::vector<rollout_actor> out;
  for (std::int64_t i = 0; i < cfg.rollout.actors; ++i) {
    auto opt = rollout_actor_options::from(cfg, static_cast<std::uint64_t>(i));
    opt.add_special_tokens = add_special_tokens;
    auto r = spawn_rollout_actor(sys, deps, std::move(opt));
    if (!r.ok()) {
      for (const auto& a : out)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      return r.error();
    }
    out.push_back(std::move(*r));
  }
  return out;
}

} // namespace crucible
