// actors/group_book.cpp: announces, turns and verdicts in (from the exemplar actor's messages),
// complete GRPO groups out (to the exemplar actor, which sends them on to the learners).
#include "actors/group_book.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>

#include "actors/actor_config.hpp"
#include "env/verdict.hpp"

namespace crucible {

std::vector<episode_point> episode_points(const episode_resume& r) {
  std::vector<episode_point> out(r.episodes);
  for (const auto& t : r.stored) {
    if (t.episode >= r.episodes)
      continue;
    auto& p = out[t.episode];
    p.seen = true;
    p.goes_on = t.continues;
    p.turn = t.turn;
  }
  return out;
}

caf::error group_book::check(const group_announce& a) const {
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
  if (groups_.count(a.group.value) != 0)
    return make_error(errc::invalid_arg, "group announce " + to_string(a.group) + ": that group is already open");
  if (a.turns < 1)
    return make_error(errc::invalid_arg, "group announce " + to_string(a.group) + ": turns must be at least 1");
  return {};
}

std::uint64_t group_book::open(group_announce a) {
  const auto id = a.group;
  const auto seq = next_seq_++;
  const auto n = a.completions.size();
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
  groups_.emplace(id.value, std::move(g));
  return seq;
}

std::optional<rollout_group> group_book::reopen(const episode_resume& r, const std::vector<variant_id>& ids,
                                                std::uint64_t& seq) {
  open_group g;
  g.announce.group = r.group;
  g.announce.task = r.task;
  g.announce.prompt_token_ids = r.prompt_token_ids;
  g.announce.turns = r.turns;
  for (std::size_t i = 0; i < r.stored.size(); ++i) {
    const auto& s = r.stored[i];
    g.announce.variants.push_back(ids[i]);
    g.announce.completions.push_back(s.sampled);
    g.verdicts.push_back(s.verdict);
    g.done.push_back(true);
    g.episodes.push_back(s.episode);
    g.turns.push_back(s.turn);
    g.contexts.push_back(s.context);
  }
  for (const auto& p : episode_points(r))
    if (p.open())
      ++g.reserved;
  g.missing = g.reserved;
  g.seq = seq = next_seq_++;
  auto it = groups_.emplace(r.group.value, std::move(g)).first;
  if (it->second.missing == 0)
    return close(it);
  return std::nullopt;
}

group_book::place group_book::find(const scored_variant& x) const {
  if (x.group.value == 0)
    return {};
  auto it = groups_.find(x.group.value);
  if (it == groups_.end())
    return {};
  const auto& ids = it->second.announce.variants;
  const auto slot = static_cast<std::size_t>(std::find(ids.begin(), ids.end(), x.variant) - ids.begin());
  if (slot == ids.size())
    return {};
  return {it->second.done[slot] ? placing::duplicate : placing::member, slot};
}

bool group_book::multi_turn(group_id id) const {
  auto it = groups_.find(id.value);
  return it != groups_.end() && it->second.multi_turn();
}

storage::episode_turn_data group_book::turn_data(group_id id, std::size_t slot, const scored_variant& x) const {
  const auto& g = groups_.at(id.value);
  storage::episode_turn_data d;
  if (g.turns[slot] > 0)
    d.context = g.contexts[slot];
  d.tokens = g.announce.completions[slot].token_ids;
  d.logprobs = g.announce.completions[slot].logprobs;
  d.verdict = env::to_json(x.verdict);
  d.continues = x.continues;
  return d;
}

std::optional<rollout_group> group_book::score(std::size_t slot, const scored_variant& x) {
  auto it = groups_.find(x.group.value);
  auto& g = it->second;
  g.verdicts[slot] = x.verdict;
  g.done[slot] = true;
  if (x.continues && g.multi_turn()) { // the episode's next turn holds a place open
    ++g.reserved;
    ++g.missing;
  }
  return one_fewer(it);
}

group_book::extension group_book::extend(group_extend x, std::optional<rollout_group>& complete) {
  auto it = groups_.find(x.group.value);
  // Turn 0 only for an episode of a reopened group that has no stored turn.
  auto first_of_new_episode = [&](const open_group& g) {
    return std::find(g.episodes.begin(), g.episodes.end(), x.episode) == g.episodes.end();
  };
  if (it == groups_.end() || !it->second.multi_turn() || it->second.reserved == 0
      || x.turn >= it->second.announce.turns || (x.turn == 0 && !first_of_new_episode(it->second)))
    return extension::unknown; // sent on or dropped meanwhile, or no place was held open for it
  auto& g = it->second;
  if (x.variant.value == 0) { // the episode ends without this turn: its place is released
    --g.reserved;
    complete = one_fewer(it);
    return extension::released;
  }
  const auto& ids = g.announce.variants;
  if (std::find(ids.begin(), ids.end(), x.variant) != ids.end())
    return extension::duplicate;
  --g.reserved; // the place stays counted in `missing` until its verdict
  g.announce.variants.push_back(x.variant);
  g.announce.completions.push_back(std::move(x.sampled));
  g.verdicts.emplace_back();
  g.done.push_back(false);
  g.episodes.push_back(x.episode);
  g.turns.push_back(x.turn);
  g.contexts.push_back(std::move(x.prompt_token_ids));
  return extension::added;
}

bool group_book::is_open(group_id id, std::uint64_t seq) const {
  auto it = groups_.find(id.value);
  return it != groups_.end() && it->second.seq == seq;
}

rollout_group group_book::fill(group_id id, const verdict& filler) {
  auto it = groups_.find(id.value);
  auto& g = it->second;
  for (std::size_t i = 0; i < g.done.size(); ++i)
    if (!g.done[i])
      g.verdicts[i] = filler;
  return close(it);
}

// One place of the group fewer to wait for (a verdict in, or an episode's held place released);
// the last closes the group.
std::optional<rollout_group> group_book::one_fewer(iterator it) {
  if (--it->second.missing > 0)
    return std::nullopt;
  return close(it);
}

rollout_group group_book::close(iterator it) {
  auto& g = it->second;
  rollout_group out{g.announce.group, g.announce.task, std::move(g.announce.prompt_token_ids),
                    std::move(g.announce.completions), std::move(g.verdicts)};
  if (g.multi_turn()) {
    out.episodes = std::move(g.episodes);
    out.turns = std::move(g.turns);
    out.contexts = std::move(g.contexts);
  }
  groups_.erase(it);
  return out;
}

} // namespace crucible
