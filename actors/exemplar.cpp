// Exemplar actor: rollouts -> (scored variants, group announces) -> replay store and open groups
// -> complete groups -> learners; rollouts <- exemplars drawn from the replay store.
#include "actors/exemplar.hpp"

#include <caf/all.hpp>


#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "actors/actor_config.hpp"
#include "actors/group_book.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/sha256.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"
#include "storage/replay_store.hpp"

namespace crucible {

exemplar_actor_options exemplar_actor_options::from(const config& cfg, std::filesystem::path store) {
  exemplar_actor_options o;
  o.store = std::move(store);
  o.selection = storage::to_exemplar_options(cfg.exemplar);
  o.straggler_timeout_s = cfg.exemplar.straggler_timeout_s;
  o.on_straggler = cfg.exemplar.straggler;
  o.fill_reward = cfg.reward.failed;
  o.seed = cfg.run.seed;
  o.seeds_only = cfg.exemplar.seeds_only;
  return o;
}

result<void> exemplar_actor_options::validate() const {
  if (store.empty())
    return fail(errc::config, "exemplar.store: the replay store path is empty");
  // Positive and at most a week: the timeout travels as a caf::timespan (int64 nanoseconds).
  if (!(straggler_timeout_s > 0) || !(straggler_timeout_s <= 7 * 24 * 3600.0))
    return fail(errc::config, "exemplar.straggler_timeout_s: must be > 0 and at most 604800 (a week), got ",
                std::to_string(straggler_timeout_s));
  if (!std::isfinite(fill_reward))
    return fail(errc::config, "exemplar.fill_reward: must be a finite number");
  if (max_open_groups < 1)
    return fail(errc::config, "exemplar.max_open_groups: must be at least 1");
  return storage::validate(selection);
}

namespace {

// -- replay store <-> messages --------------------------------------------------------------

std::string json_strings(const std::vector<std::string>& xs) {
  std::string out = "[";
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i > 0)
      out += ',';
    append_json_string(out, xs[i]);
  }
  return out + "]";
}

std::string json_ids(const std::vector<variant_id>& xs) {
  std::string out = "[";
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i > 0)
      out += ',';
    out += std::to_string(xs[i].value);
  }
  return out + "]";
}

// A prompt's id in the replay store: "sha256:" and the hex digest of its text, so that a group's
// members and every group sampled on the same prompt share one stored text.
std::string prompt_id_of(std::string_view prompt) {
  return "sha256:" + sha256_hex(prompt);
}

storage::variant_record to_record(const scored_variant& x) {
  storage::variant_record r;
  r.task_id = x.task.value;
  r.task_name = x.task.value; // the actor knows no other name of the task
  r.hardware = x.hardware;
  r.code = x.code;
  r.code_hash = sha256_hex(env::normalize_source(x.code));
  r.status = env::to_string(x.verdict.status);
  r.correct = x.verdict.correct;
  if (x.verdict.has_speedup())
    r.speedup = x.verdict.speedup;
  r.spread = x.verdict.speedup_spread; // NaN is stored as NULL and read back as NaN
  r.ref_ms = x.verdict.ref_ms;
  r.cand_ms = x.verdict.cand_ms;
  r.reward = x.verdict.reward;
  if (const double f = x.verdict.fraction(); std::isfinite(f))
    r.fraction = f;
  r.checks_failed = json_strings(x.verdict.checks_failed);
  r.message = x.verdict.message;
  r.policy_version = x.policy_version.value;
  r.group_id = x.group.value;
  r.exemplar_ids = json_ids(x.exemplars);
  r.completion = x.completion;
  if (!x.prompt.empty())
    r.prompt_id = prompt_id_of(x.prompt);
  return r;
}

// The inverse of to_record for a stored row; `variant` becomes the row id. What the store does
// not keep (device model, cache_hit, rounds, wall time, baseline) stays at its default. The
// JSON columns are canonical arrays (replay_store::record checks them), so a parse failure
// cannot happen short of a damaged file; it leaves the list empty.
scored_variant from_record(const storage::variant_record& r) {
  scored_variant x;
  x.variant = variant_id{static_cast<std::uint64_t>(r.id)};
  x.group = group_id{r.group_id};
  x.task = task_id{r.task_id};
  x.code = r.code;
  auto& v = x.verdict;
  v.status = env::parse_verdict_status(r.status).value_or(env::verdict_status::runtime_error);
  v.correct = r.correct;
  v.speedup = r.speedup.value_or(NAN);
  v.speedup_spread = r.spread;
  v.ref_ms = r.ref_ms;
  v.cand_ms = r.cand_ms;
  v.reward = r.reward;
  if (auto checks = parse_json(r.checks_failed); checks.ok() && checks->is_array())
    for (const auto& c : checks->as_array())
      if (c.is_string())
        v.checks_failed.push_back(c.as_string());
  v.message = r.message;
  x.hardware = r.hardware;
  x.policy_version = policy_version{r.policy_version};
  if (auto ids = parse_json(r.exemplar_ids); ids.ok() && ids->is_array())
    for (const auto& id : ids->as_array())
      if (id.is_int())
        x.exemplars.push_back(variant_id{static_cast<std::uint64_t>(id.as_int())});
  return x;
}

// -- the actor ------------------------------------------------------------------------------

struct exemplar_state {
  std::optional<storage::replay_store> store; // set before the first message; owned
  exemplar_actor_options opt;
  std::mt19937_64 rng;
  std::vector<group_sink_actor> learners;
  std::size_t next_learner = 0;
  group_book groups; // the open groups, from their announce to their last verdict
  exemplar_stats stats;
  static inline const char* name = "crucible.exemplar";
};

using exemplar_pointer = exemplar_impl_actor::stateful_pointer<exemplar_state>;

// Stores a scored variant; a policy sample's row starts with `fate` (empty: undecided until the
// trainer decides it).
// `multi_turn`: x is a turn of an episode, and its sample row keeps its place; with `data` also
// what a later process needs to continue its episode.
void record(exemplar_pointer self, const scored_variant& x, std::string_view fate, bool multi_turn = false,
            std::optional<storage::episode_turn_data> data = std::nullopt) {
  auto& st = self->state;
  // The prompt first (once per text: its id is its hash), so that no stored variant points at
  // a prompt the store lacks.
  if (!x.prompt.empty() && !st.store->record_prompt(prompt_id_of(x.prompt), x.prompt).ok()) {
    ++st.stats.record_errors;
    return;
  }
  auto row = to_record(x);
  row.sample_fate = fate;
  if (multi_turn) {
    row.episode = x.episode;
    row.turn = x.turn;
    row.episode_data = std::move(data);
  }
  if (st.store->record(row).ok())
    ++st.stats.recorded;
  else
    ++st.stats.record_errors; // an empty hardware kind, or the disk; the group goes on regardless
}

// Sends a group the book closed to the next learner.
void send_group(exemplar_pointer self, rollout_group g) {
  auto& st = self->state;
  auto& learner = st.learners[st.next_learner++ % st.learners.size()];
  self->send(learner, std::move(g));
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Stores the first prompt of a group of multi-turn episodes, for a later process to continue
// them; a failure is counted and the group goes on (it would only not be continued).
void record_episode_group(exemplar_pointer self, const group_announce& a) {
  auto& st = self->state;
  storage::episode_group_record g;
  g.group_id = a.group.value;
  g.task_id = a.task.value;
  g.turns = a.turns;
  g.episodes = static_cast<std::uint32_t>(a.completions.size());
  g.system = a.system;
  g.user = a.user;
  g.prompt_id = prompt_id_of(a.prompt);
  g.exemplar_ids = json_ids(a.exemplars);
  g.prompt_tokens = a.prompt_token_ids;
  if (!st.store->record_prompt(g.prompt_id, a.prompt).ok() || !st.store->record_episode_group(g).ok())
    ++st.stats.record_errors;
}

// Member ids of a reopened group's stored turns: apart from every rollout actor's (index * 2^40
// + n, below 2^63), one per stored sample row.
variant_id stored_variant_id(std::int64_t sample_id) {
  return variant_id{(std::uint64_t{1} << 63) | static_cast<std::uint64_t>(sample_id)};
}

void arm_timeout(exemplar_pointer self, group_id id, std::uint64_t seq, std::uint32_t turns) {
  // An episode group's timeout grows with its turns: each turn is a generation and a verdict.
  auto timeout = std::chrono::duration_cast<caf::timespan>(
    std::chrono::duration<double>(self->state.opt.straggler_timeout_s * static_cast<double>(turns)));
  self->delayed_send(caf::actor_cast<exemplar_impl_actor>(self), timeout, expire_atom_v, id, seq);
}

// Opens stored group `r` again (group_book::reopen: its stored turns as members with their
// verdicts, one place held for each episode that goes on or has no stored turn), and the rollout
// actor's view of it. A group with nothing to wait for goes to a learner at once. nullopt (the
// samples marked unfinished again) when a stored verdict does not parse or the group is open
// already.
std::optional<episode_resume> reopen(exemplar_pointer self, storage::reopened_episode_group& r) {
  auto& st = self->state;
  auto unfinished = [&] {
    if (!st.store->set_group_fate(r.group.group_id, storage::sample_fate::unfinished, 0).ok())
      ++st.stats.record_errors;
    return std::nullopt;
  };
  if (st.groups.is_open(group_id{r.group.group_id})) // an id this process has open already
    return unfinished();
  episode_resume out;
  out.group = group_id{r.group.group_id};
  out.task = task_id{r.group.task_id};
  out.turns = r.group.turns;
  out.episodes = r.group.episodes;
  out.system = std::move(r.group.system);
  out.user = std::move(r.group.user);
  out.prompt = std::move(r.prompt);
  if (auto ids = parse_json(r.group.exemplar_ids); ids.ok() && ids->is_array())
    for (const auto& id : ids->as_array())
      if (id.is_int())
        out.exemplars.push_back(variant_id{static_cast<std::uint64_t>(id.as_int())});
  out.prompt_token_ids = std::move(r.group.prompt_tokens);
  std::vector<variant_id> ids;
  for (auto& t : r.turns) {
    auto v = env::verdict_from_json(t.data.verdict);
    if (!v)
      return unfinished();
    stored_turn s;
    s.episode = t.episode;
    s.turn = t.turn;
    s.sampled = completion{std::move(t.completion), std::move(t.data.tokens), std::move(t.data.logprobs),
                           policy_version{t.policy_version}};
    s.context = t.turn == 0 ? out.prompt_token_ids : std::move(t.data.context);
    s.verdict = std::move(*v);
    s.continues = t.data.continues;
    ids.push_back(stored_variant_id(t.sample_id));
    out.stored.push_back(std::move(s));
  }
  std::uint64_t seq = 0;
  if (auto complete = st.groups.reopen(out, ids, seq)) {
    send_group(self, std::move(*complete));
    ++st.stats.groups_completed;
  } else {
    arm_timeout(self, out.group, seq, out.turns);
  }
  return out;
}

exemplar_impl_actor::behavior_type exemplar(exemplar_pointer self, std::shared_ptr<storage::replay_store> store,
                                            exemplar_actor_options opt, std::vector<group_sink_actor> learners) {
  auto& init = self->state;
  init.store.emplace(std::move(*store));
  init.rng.seed(opt.seed);
  init.opt = std::move(opt);
  init.learners = std::move(learners);
  return {
    [=](const exemplar_request& req) -> caf::result<exemplar_set> {
      auto& st = self->state;
      exemplar_set out{req.task, req.hardware, {}};
      auto rows = st.store->successful_variants(
        req.task.value, req.hardware, st.opt.seeds_only ? storage::variant_fields::full : storage::variant_fields::summary);
      if (!rows.ok())
        return make_error(rows.error());
      if (st.opt.seeds_only)
        std::erase_if(*rows, [](const storage::variant_record& v) { return v.group_id != 0; });
      auto sel = st.opt.selection;
      if (req.count > 0)
        sel.n = req.count;
      auto picked = storage::select_exemplars(*rows, sel, st.rng);
      if (!picked.ok())
        return make_error(picked.error());
      for (auto i : *picked) {
        auto row = st.store->find((*rows)[i].id);
        if (!row.ok())
          return make_error(row.error());
        out.exemplars.push_back(from_record(*row));
      }
      return out;
    },
    [=](group_announce& a) -> caf::result<void> {
      auto& st = self->state;
      if (auto err = st.groups.check(a))
        return err;
      if (st.groups.size() >= st.opt.max_open_groups) {
        ++st.stats.groups_refused;
        return make_error(errc::busy, std::to_string(st.groups.size()) + " groups are waiting for verdicts (limit "
                                        + std::to_string(st.opt.max_open_groups) + "); retry later");
      }
      const auto id = a.group;
      const auto turns = a.turns;
      if (turns > 1)
        record_episode_group(self, a);
      const auto seq = st.groups.open(std::move(a));
      arm_timeout(self, id, seq, turns);
      return caf::unit;
    },
    [=](const scored_variant& x) {
      auto& st = self->state;
      const auto place = st.groups.find(x);
      if (place.what == group_book::placing::duplicate) {
        ++st.stats.duplicates; // recording it again would count the code twice
        return;
      }
      const bool member = place.what == group_book::placing::member;
      if (x.group.value != 0 && !member)
        ++st.stats.unknown; // late (after drop or fill), refused, or never announced
      // A sample of no open group reaches no trainer: its fate is decided here.
      const bool multi = member ? st.groups.multi_turn(x.group) : x.turn > 0 || x.continues;
      std::optional<storage::episode_turn_data> data;
      if (member && multi)
        data = st.groups.turn_data(x.group, place.slot, x);
      record(self, x, x.group.value != 0 && !member ? storage::sample_fate::orphan : std::string_view{}, multi,
             std::move(data));
      if (!member)
        return;
      if (auto complete = st.groups.score(place.slot, x)) {
        send_group(self, std::move(*complete));
        ++st.stats.groups_completed;
      }
    },
    [=](group_extend& x) {
      auto& st = self->state;
      std::optional<rollout_group> complete;
      switch (st.groups.extend(std::move(x), complete)) {
        case group_book::extension::unknown: ++st.stats.unknown; break; // sent on or dropped, or no place held
        case group_book::extension::duplicate: ++st.stats.duplicates; break;
        case group_book::extension::released:
        case group_book::extension::added: break;
      }
      if (complete) {
        send_group(self, std::move(*complete));
        ++st.stats.groups_completed;
      }
    },
    [=](reopen_atom, std::uint64_t min_version, std::uint64_t max_version,
        std::uint64_t limit) -> caf::result<episode_reopening> {
      auto& st = self->state;
      episode_reopening out;
      auto max_group = st.store->max_group_id();
      if (!max_group.ok())
        return make_error(max_group.error());
      out.max_group = *max_group;
      if (limit == 0)
        return out;
      auto groups = st.store->reopen_episode_groups(min_version, max_version, static_cast<std::size_t>(limit));
      if (!groups.ok())
        return make_error(groups.error());
      for (auto& r : *groups) {
        const auto n = static_cast<std::int64_t>(r.turns.size());
        if (auto resume = reopen(self, r)) {
          out.samples += n;
          out.groups.push_back(std::move(*resume));
        }
      }
      return out;
    },
    [=](caf::get_atom) -> exemplar_stats {
      auto out = self->state.stats;
      out.open_groups = self->state.groups.size();
      return out;
    },
    [=](const sample_fates& f) {
      auto& st = self->state;
      for (const auto& g : f.groups)
        if (g.value != 0 && !st.store->set_group_fate(g.value, f.fate, f.step, f.seq).ok())
          ++st.stats.record_errors;
    },
    [=](settle_atom, std::int64_t kept_seq) -> caf::result<std::int64_t> {
      auto& st = self->state;
      st.groups.clear(); // their members still to come are orphans
      auto n = st.store->settle_samples(kept_seq >= 0 ? std::optional<std::int64_t>{kept_seq} : std::nullopt);
      if (!n.ok())
        return make_error(n.error());
      return *n;
    },
    [=](expire_atom, group_id id, std::uint64_t seq) {
      auto& st = self->state;
      if (!st.groups.is_open(id, seq))
        return; // complete before its timeout
      if (st.opt.on_straggler == straggler_policy::drop) {
        st.groups.drop(id);
        ++st.stats.groups_dropped;
        if (!st.store->set_group_fate(id.value, storage::sample_fate::straggler, 0).ok())
          ++st.stats.record_errors;
        for (const auto& sink : st.learners)
          self->send(sink, group_dropped{id});
        return;
      }
      verdict v;
      v.status = verdict_status::timeout;
      v.correct = false;
      v.reward = st.opt.fill_reward;
      v.message = "no verdict within the straggler timeout of " + seconds_text(st.opt.straggler_timeout_s)
                  + " s; filled in by the exemplar actor";
      send_group(self, st.groups.fill(id, v));
      ++st.stats.groups_filled;
    },
  };
}

} // namespace

result<exemplar_actor> spawn_exemplar_actor(caf::actor_system& sys, exemplar_actor_options opt,
                                            std::vector<group_sink_actor> learners) {
  if (auto ok = opt.validate(); !ok.ok())
    return ok.error();
  if (learners.empty())
    return fail(errc::invalid_arg, "exemplar actor: no learner to send complete groups to");
  for (const auto& l : learners)
    if (!l)
      return fail(errc::invalid_arg, "exemplar actor: an invalid learner handle");
  auto store = storage::replay_store::open(opt.store);
  if (!store.ok())
    return store.error();
  // A shared_ptr because spawn copies its arguments; the actor moves the store out of it.
  auto owned = std::make_shared<storage::replay_store>(std::move(*store));
  if (opt.detached) {
    exemplar_actor h = sys.spawn<caf::detached>(exemplar, std::move(owned), std::move(opt), std::move(learners));
    return h;
  }
  exemplar_actor h = sys.spawn(exemplar, std::move(owned), std::move(opt), std::move(learners));
  return h;
}

} // namespace crucible
