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

// A group between its announce and its last verdict (or its straggler timeout).
// A group of multi-turn episodes (announce.turns > 1) grows as its episodes go on: each scored
// variant whose episode continues holds one more place open (`reserved`, counted in `missing`),
// and the group_extend of the next turn fills it with a member appended to the announce.
struct open_group {
  group_announce announce;
  std::vector<verdict> verdicts; // verdicts[i] for announce.completions[i] once done[i]
  std::vector<bool> done;
  std::size_t missing = 0;
  std::uint64_t seq = 0; // which announce this is: a timeout of an earlier one does not apply
  // Multi-turn only, one per member: its episode, its turn, the context it was sampled after.
  std::vector<std::uint32_t> episodes, turns;
  std::vector<std::vector<std::int32_t>> contexts;
  std::size_t reserved = 0; // places held open for turns not extended yet

  bool multi_turn() const noexcept { return announce.turns > 1; }
};

struct exemplar_state {
  std::optional<storage::replay_store> store; // set before the first message; owned
  exemplar_actor_options opt;
  std::mt19937_64 rng;
  std::vector<group_sink_actor> learners;
  std::size_t next_learner = 0;
  std::unordered_map<std::uint64_t, open_group> groups; // by group id
  std::uint64_t next_seq = 0;
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

// Sends the group to the next learner and closes it.
void send_group(exemplar_pointer self, std::unordered_map<std::uint64_t, open_group>::iterator it) {
  auto& st = self->state;
  auto& g = it->second;
  rollout_group out{g.announce.group, g.announce.task, std::move(g.announce.prompt_token_ids),
                    std::move(g.announce.completions), std::move(g.verdicts)};
  if (g.multi_turn()) {
    out.episodes = std::move(g.episodes);
    out.turns = std::move(g.turns);
    out.contexts = std::move(g.contexts);
  }
  auto& learner = st.learners[st.next_learner++ % st.learners.size()];
  st.groups.erase(it);
  self->send(learner, std::move(out));
}

// One place of the group fewer to wait for (a verdict in, or an episode's held place released);
// the last sends the group on.
void one_fewer(exemplar_pointer self, std::unordered_map<std::uint64_t, open_group>::iterator it) {
  if (--it->second.missing > 0)
    return;
  send_group(self, it);
  ++self->state.stats.groups_completed;
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// What a later process needs to continue the episode of member `slot` of `g` after its verdict
// in `x`: the member's context (none for turn 0: the group's prompt), tokens and log-probs, and
// the verdict.
storage::episode_turn_data episode_data(const open_group& g, std::size_t slot, const scored_variant& x) {
  storage::episode_turn_data d;
  if (g.turns[slot] > 0)
    d.context = g.contexts[slot];
  d.tokens = g.announce.completions[slot].token_ids;
  d.logprobs = g.announce.completions[slot].logprobs;
  d.verdict = env::to_json(x.verdict);
  d.continues = x.continues;
  return d;
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

// Opens stored group `r` again: its stored turns as members with their verdicts, one place held
// for each episode that goes on (or has no stored turn), and the rollout actor's view of it. A
// group with nothing to wait for goes to a learner at once. nullopt (the samples marked
// unfinished again) when a stored verdict does not parse or the group is open already.
std::optional<episode_resume> reopen(exemplar_pointer self, storage::reopened_episode_group& r) {
  auto& st = self->state;
  auto unfinished = [&] {
    if (!st.store->set_group_fate(r.group.group_id, storage::sample_fate::unfinished, 0).ok())
      ++st.stats.record_errors;
    return std::nullopt;
  };
  if (st.groups.count(r.group.group_id) != 0) // an id this process has open already
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
  out.prompt_token_ids = r.group.prompt_tokens;
  open_group g;
  g.announce.group = out.group;
  g.announce.task = out.task;
  g.announce.prompt_token_ids = std::move(r.group.prompt_tokens);
  g.announce.turns = out.turns;
  std::vector<bool> going_on(out.episodes, false), seen(out.episodes, false);
  for (auto& t : r.turns) {
    auto v = env::verdict_from_json(t.data.verdict);
    if (!v)
      return unfinished();
    stored_turn s;
    s.episode = t.episode;
    s.turn = t.turn;
    s.sampled = completion{std::move(t.completion), std::move(t.data.tokens), std::move(t.data.logprobs),
                           policy_version{t.policy_version}};
    s.context = t.turn == 0 ? g.announce.prompt_token_ids : std::move(t.data.context);
    s.verdict = std::move(*v);
    s.continues = t.data.continues;
    seen[s.episode] = true;
    going_on[s.episode] = s.continues; // the turns come by episode and turn: the last one decides
    g.announce.variants.push_back(stored_variant_id(t.sample_id));
    g.announce.completions.push_back(s.sampled);
    g.verdicts.push_back(s.verdict);
    g.done.push_back(true);
    g.episodes.push_back(s.episode);
    g.turns.push_back(s.turn);
    g.contexts.push_back(s.context);
    out.stored.push_back(std::move(s));
  }
  for (std::uint32_t e = 0; e < out.episodes; ++e)
    if (going_on[e] || !seen[e])
      ++g.reserved;
  g.missing = g.reserved;
  g.seq = st.next_seq++;
  auto it = st.groups.emplace(out.group.value, std::move(g)).first;
  if (it->second.missing == 0) {
    send_group(self, it);
    ++st.stats.groups_completed;
  } else {
    arm_timeout(self, out.group, it->second.seq, out.turns);
  }
  return out;
}

caf::error check_announce(const exemplar_state& st, const group_announce& a) {
  if (a.group.value == 0)
    return make_error(errc::invalid_arg, "group announce: group id 0 is reserved for variants of no group");
  if (a.completions.empty())
    return make_error(errc::invalid_arg, "group announce " + to_string(a.group) + ": no completions");
  if (a.variants.size() != a.completions.size())
    return make_error(errc::invalid_arg, "group announce " + to_string(a.group) + ": "
                                           + std::to_string(a.variants.size()) + " variant ids for "
                                           + std::to_string(a.completions.size()) + " completions");
  std::unordered_set<std::uint64_t> seen;
  for (const auto& v : a.variants)
    if (!seen.insert(v.value).second)
      return make_error(errc::invalid_arg,
                        "group announce " + to_string(a.group) + ": variant " + to_string(v) + " twice");
  if (st.groups.count(a.group.value) != 0)
    return make_error(errc::invalid_arg, "group announce " + to_string(a.group) + ": that group is already open");
  if (a.turns < 1)
    return make_error(errc::invalid_arg, "group announce " + to_string(a.group) + ": turns must be at least 1");
  return {};
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
      if (auto err = check_announce(st, a))
        return err;
      if (st.groups.size() >= st.opt.max_open_groups) {
        ++st.stats.groups_refused;
        return make_error(errc::busy, std::to_string(st.groups.size()) + " groups are waiting for verdicts (limit "
                                        + std::to_string(st.opt.max_open_groups) + "); retry later");
      }
      auto id = a.group;
      auto seq = st.next_seq++;
      auto n = a.completions.size();
      const auto turns = a.turns;
      if (turns > 1)
        record_episode_group(self, a);
      a.system.clear();
      a.user.clear();
      a.prompt.clear();
      open_group g{std::move(a), std::vector<verdict>(n), std::vector<bool>(n, false), n, seq, {}, {}, {}, 0};
      if (g.multi_turn()) {
        for (std::size_t i = 0; i < n; ++i) {
          g.episodes.push_back(static_cast<std::uint32_t>(i));
          g.turns.push_back(0);
          g.contexts.push_back(g.announce.prompt_token_ids);
        }
      }
      st.groups.emplace(id.value, std::move(g));
      arm_timeout(self, id, seq, turns);
      return caf::unit;
    },
    [=](const scored_variant& x) {
      auto& st = self->state;
      auto it = st.groups.end();
      std::size_t slot = 0;
      if (x.group.value != 0) {
        it = st.groups.find(x.group.value);
        if (it != st.groups.end()) {
          const auto& ids = it->second.announce.variants;
          slot = static_cast<std::size_t>(std::find(ids.begin(), ids.end(), x.variant) - ids.begin());
          if (slot == ids.size()) {
            it = st.groups.end();
          } else if (it->second.done[slot]) {
            ++st.stats.duplicates; // recording it again would count the code twice
            return;
          }
        }
        if (it == st.groups.end())
          ++st.stats.unknown; // late (after drop or fill), refused, or never announced
      }
      // A sample of no open group reaches no trainer: its fate is decided here.
      const bool multi = it != st.groups.end() ? it->second.multi_turn() : x.turn > 0 || x.continues;
      std::optional<storage::episode_turn_data> data;
      if (it != st.groups.end() && multi)
        data = episode_data(it->second, slot, x);
      record(self, x, x.group.value != 0 && it == st.groups.end() ? storage::sample_fate::orphan : std::string_view{},
             multi, std::move(data));
      if (it == st.groups.end())
        return;
      auto& g = it->second;
      g.verdicts[slot] = x.verdict;
      g.done[slot] = true;
      if (x.continues && g.multi_turn()) { // the episode's next turn holds a place open
        ++g.reserved;
        ++g.missing;
      }
      one_fewer(self, it);
    },
    [=](group_extend& x) {
      auto& st = self->state;
      auto it = st.groups.find(x.group.value);
      // Turn 0 only for an episode of a reopened group that has no stored turn.
      auto first_of_new_episode = [&](const open_group& g) {
        return std::find(g.episodes.begin(), g.episodes.end(), x.episode) == g.episodes.end();
      };
      if (it == st.groups.end() || !it->second.multi_turn() || it->second.reserved == 0
          || x.turn >= it->second.announce.turns || (x.turn == 0 && !first_of_new_episode(it->second))) {
        ++st.stats.unknown; // sent on or dropped meanwhile, or no place was held open for it
        return;
      }
      auto& g = it->second;
      if (x.variant.value == 0) { // the episode ends without this turn: its place is released
        --g.reserved;
        one_fewer(self, it);
        return;
      }
      const auto& ids = g.announce.variants;
      if (std::find(ids.begin(), ids.end(), x.variant) != ids.end()) {
        ++st.stats.duplicates;
        return;
      }
      --g.reserved; // the place stays counted in `missing` until its verdict
      g.announce.variants.push_back(x.variant);
      g.announce.completions.push_back(std::move(x.sampled));
      g.verdicts.emplace_back();
      g.done.push_back(false);
      g.episodes.push_back(x.episode);
      g.turns.push_back(x.turn);
      g.contexts.push_back(std::move(x.prompt_token_ids));
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
      auto it = st.groups.find(id.value);
      if (it == st.groups.end() || it->second.seq != seq)
        return; // complete before its timeout
      if (st.opt.on_straggler == straggler_policy::drop) {
        st.groups.erase(it);
        ++st.stats.groups_dropped;
        if (!st.store->set_group_fate(id.value, storage::sample_fate::straggler, 0).ok())
          ++st.stats.record_errors;
        return;
      }
      auto& g = it->second;
      for (std::size_t i = 0; i < g.done.size(); ++i) {
        if (g.done[i])
          continue;
        verdict v;
        v.status = verdict_status::timeout;
        v.correct = false;
        v.reward = st.opt.fill_reward;
        v.message = "no verdict within the straggler timeout of " + seconds_text(st.opt.straggler_timeout_s)
                    + " s; filled in by the exemplar actor";
        g.verdicts[i] = std::move(v);
      }
      send_group(self, it);
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
