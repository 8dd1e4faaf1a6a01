// tests/actors/test_rollout_episodes.cpp: multi-turn episodes of rollout actors on CAF's deterministic
// scheduler (the fixture of test_rollout.cpp): verdicts fed back as the next turn's prompt, episodes
// that end early, and groups of episodes left in flight by a crash reopened and continued.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/rollout.hpp"
#include "storage/replay_store.hpp"
#include "tests/actors/rollout_fixture.hpp"

using namespace crucible;
using namespace std::chrono_literals;
using namespace crucible::testing::rollout;
using crucible::testing::temp_dir;

// -- multi-turn episodes ----------------------------------------------------------------------

namespace {

// The fixture's deps with the feedback template a run of `turns` turns loads (make_prompt_setup).
rollout_deps episode_deps(fixture& f, std::int64_t turns) {
  auto c = f.cfg;
  c.rollout.turns = turns;
  auto p = make_prompt_setup(c, f.tok);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().to_string()));
  REQUIRE(p->feedback != nullptr);
  return rollout_deps{f.engine, f.pool, f.exemplars, f.tasks, p->builder, p->parse, f.cfg.reward, p->feedback};
}

} // namespace

TEST_CASE_FIXTURE(fixture, "two-turn episodes: each member sees its verdict as feedback and tries again, one group holds every turn") {
  collaborators(distribution(0.4, 0.3, 0.3));
  auto opt = options(3, 2, 4);
  opt.turns = 2;
  auto made = spawn_rollout_actor(sys, episode_deps(*this, 2), opt);
  REQUIRE_MESSAGE(made.ok(), (made.ok() ? "" : made.error().to_string()));
  keep(*made);
  sched.run();
  start(*made);
  auto s = stats(*made);
  CHECK(s.groups_started == 4);
  CHECK(s.groups_finished == 4);
  CHECK(s.later_turns == 12); // every episode took its second turn
  CHECK(s.completions == 24);
  CHECK(s.evaluated + s.format_errors == 24);
  CHECK(s.turns_over_budget == 0);
  CHECK(s.turns_lost == 0);
  REQUIRE(groups->size() == 4);
  for (const auto& g : *groups) {
    REQUIRE(g.multi_turn());
    REQUIRE(g.completions.size() == 6);
    REQUIRE(g.verdicts.size() == 6);
    REQUIRE(g.episodes.size() == 6);
    REQUIRE(g.turns.size() == 6);
    REQUIRE(g.contexts.size() == 6);
    std::map<std::uint32_t, std::set<std::uint32_t>> turns_of;
    for (std::size_t i = 0; i < 6; ++i) {
      turns_of[g.episodes[i]].insert(g.turns[i]);
      // The verdict is the table's for the code of this completion.
      const auto id = g.completions[i].token_ids.at(0);
      CHECK(g.verdicts[i].status == (id == fast ? verdict_status::ok
                                     : id == slow ? verdict_status::incorrect
                                                  : verdict_status::format_error));
      if (g.turns[i] == 0) {
        CHECK(g.contexts[i] == g.prompt_token_ids);
        continue;
      }
      // Turn 1 was sampled after the first prompt, the episode's first answer and the feedback
      // on its verdict, in the chat format.
      std::size_t first = 6;
      for (std::size_t j = 0; j < 6; ++j)
        if (g.episodes[j] == g.episodes[i] && g.turns[j] == 0)
          first = j;
      REQUIRE(first < 6);
      const auto ctx = tok->decode(g.contexts[i], false);
      const auto start_text = prompt_text(g);
      CHECK(ctx.rfind(start_text.substr(0, start_text.find("<|im_start|>assistant")), 0) == 0);
      CHECK(ctx.find("Turn 1: ") != std::string::npos);
      const auto& v0 = g.verdicts[first];
      if (v0.status == verdict_status::ok)
        CHECK(ctx.find("Turn 1: correct, 2.00x faster") != std::string::npos);
      else if (v0.status == verdict_status::incorrect)
        CHECK(ctx.find("Turn 1: incorrect. outputs differ") != std::string::npos);
      CHECK(ctx.find("1 more attempts") != std::string::npos); // turn 2 of 2 is the one more
      CHECK(g.contexts[i].size() > g.prompt_token_ids.size());
    }
    CHECK(turns_of.size() == 3);
    for (const auto& [episode, turns] : turns_of)
      CHECK(turns == std::set<std::uint32_t>{0, 1});
  }
  auto x = xstats();
  CHECK(x.recorded == 24);
  CHECK(x.groups_completed == 4);
  CHECK(x.open_groups == 0);
  CHECK(x.unknown == 0);
  // The store keeps each sample's place in its episode.
  auto store = storage::replay_store::open(dir.path() / "replay.db");
  REQUIRE(store.ok());
  auto rows = store->samples(0);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 24);
  std::map<std::uint64_t, std::set<std::pair<std::uint32_t, std::uint32_t>>> places;
  for (const auto& r : *rows) {
    REQUIRE(r.episode.has_value());
    REQUIRE(r.turn.has_value());
    CHECK(places[r.group_id].insert({*r.episode, *r.turn}).second);
  }
  CHECK(places.size() == 4);
}

TEST_CASE_FIXTURE(fixture, "an episode correct at rollout.turn_stop_speedup ends early, the others take their turns") {
  collaborators(distribution(0.5, 0.5, 0));
  auto opt = options(4, 1, 3);
  opt.turns = 3;
  opt.turn_stop_speedup = 1.5; // the fast code is ok at 2x: its episode ends with it
  auto made = spawn_rollout_actor(sys, episode_deps(*this, 3), opt);
  REQUIRE(made.ok());
  keep(*made);
  sched.run();
  start(*made);
  REQUIRE(groups->size() == 3);
  std::size_t ended_early = 0, full = 0;
  for (const auto& g : *groups) {
    std::map<std::uint32_t, std::vector<std::size_t>> by_episode;
    for (std::size_t i = 0; i < g.completions.size(); ++i)
      by_episode[g.episodes[i]].push_back(i);
    CHECK(by_episode.size() == 4);
    for (auto& [episode, members] : by_episode) {
      std::sort(members.begin(), members.end(), [&](auto a, auto b) { return g.turns[a] < g.turns[b]; });
      // Every turn before the last was not fast enough; an episode shorter than three turns
      // ended on a fast one.
      for (std::size_t k = 0; k < members.size(); ++k) {
        CHECK(g.turns[members[k]] == k);
        if (k + 1 < members.size())
          CHECK(g.verdicts[members[k]].status != verdict_status::ok);
      }
      if (members.size() < 3)
        CHECK(g.verdicts[members.back()].status == verdict_status::ok);
      if (members.size() < 3)
        ++ended_early;
      else
        ++full;
    }
  }
  CHECK(ended_early + full == 12);
  CHECK(ended_early > 0);
  CHECK(xstats().unknown == 0);
}

TEST_CASE_FIXTURE(fixture, "more than one turn without a feedback template is refused, naming it") {
  collaborators(distribution(1, 0, 0));
  auto opt = options(2, 1);
  opt.turns = 2;
  rollout_deps deps{engine, pool, exemplars, tasks, prompts.builder, prompts.parse, cfg.reward};
  auto r = spawn_rollout_actor(sys, deps, opt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("feedback template") != std::string::npos);
  opt.turns = 17;
  CHECK(spawn_rollout_actor(sys, episode_deps(*this, 2), opt).error().message.find("rollout.turns") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "a group of episodes left in flight by a crash is reopened and continued at the turn each episode reached") {
  collaborators(distribution(0.5, 0.5, 0));
  table->hold = true;
  auto opt = options(4, 1, 1);
  opt.turns = 3;
  auto deps = episode_deps(*this, 3);
  auto a = spawn_rollout_actor(sys, deps, opt);
  REQUIRE(a.ok());
  keep(*a);
  sched.run();
  start(*a);
  // One real verdict comes in; every other candidate is still being evaluated at the crash.
  REQUIRE_FALSE(table->received.empty());
  const auto first = table->received.front().variant.value;
  release(first, first);
  // The crash: the rollout actor and the exemplar actor are gone; the store keeps what came.
  self->send_exit(*a, caf::exit_reason::kill);
  self->send_exit(exemplars, caf::exit_reason::kill);
  sched.run();
  const auto evaluated_before = table->received.size();
  std::vector<storage::sample_record> before;
  {
    auto store = storage::replay_store::open(dir.path() / "replay.db");
    REQUIRE(store.ok());
    auto rows = store->samples(0);
    REQUIRE(rows.ok());
    before = *rows;
    REQUIRE_FALSE(before.empty());
    auto settled = store->settle_samples(std::nullopt);
    REQUIRE(settled.ok());
    CHECK(*settled == static_cast<std::int64_t>(before.size()));
  }
  // The next process: a new exemplar actor on the store reopens the group.
  auto got = std::make_shared<groups_seen>();
  group_sink_actor learner = sys.spawn(sink, got);
  keep(learner);
  auto xopt = exemplar_actor_options::from(cfg, dir.path() / "replay.db");
  xopt.detached = false;
  auto x2 = spawn_exemplar_actor(sys, xopt, {learner});
  REQUIRE(x2.ok());
  keep(*x2);
  sched.run();
  std::optional<episode_reopening> reopened;
  auto rh = self->request(*x2, caf::infinite, reopen_atom_v, std::uint64_t{0}, std::uint64_t{100}, std::uint64_t{10});
  sched.run();
  REQUIRE_FALSE(self->mailbox().empty());
  rh.receive([&](episode_reopening& x) { reopened = std::move(x); }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
  REQUIRE(reopened.has_value());
  REQUIRE(reopened->groups.size() == 1);
  CHECK(reopened->samples == static_cast<std::int64_t>(before.size()));
  CHECK(reopened->max_group == before.front().group_id);
  const auto& r = reopened->groups.front();
  CHECK(r.group.value == before.front().group_id);
  CHECK(r.episodes == 4);
  CHECK(r.turns == 3);
  CHECK(r.stored.size() == before.size());
  CHECK_FALSE(r.prompt.empty());
  CHECK_FALSE(r.user.empty());
  {
    auto store = storage::replay_store::open(dir.path() / "replay.db");
    REQUIRE(store.ok());
    auto counts = store->count_samples();
    REQUIRE(counts.ok());
    CHECK(counts->pending == static_cast<std::int64_t>(before.size())); // undecided again
    CHECK(counts->unfinished == 0);
  }
  // Where each episode stood.
  std::map<std::uint32_t, std::uint32_t> stored_turns;
  std::map<std::uint32_t, bool> going_on;
  for (const auto& t : r.stored) {
    ++stored_turns[t.episode];
    going_on[t.episode] = t.continues;
  }
  // The crash caught episodes of every kind: one that went on after a stored turn, and one with
  // no stored turn (its evaluation was held).
  CHECK(std::any_of(going_on.begin(), going_on.end(), [](const auto& x) { return x.second; }));
  CHECK(stored_turns.size() < 4);
  // A new rollout actor continues it; it takes no new task (one group at most).
  table->hold = false;
  auto opt2 = options(4, 1, 1);
  opt2.turns = 3;
  opt2.index = 1;
  opt2.resume = reopened->groups;
  deps.exemplars = *x2;
  auto b = spawn_rollout_actor(sys, deps, opt2);
  REQUIRE(b.ok());
  keep(*b);
  sched.run();
  start(*b);
  release(); // what the first process left held goes nowhere now
  auto s = stats(*b);
  CHECK(s.groups_resumed == 1);
  CHECK(s.groups_started == 1);
  CHECK(s.groups_finished == 1);
  REQUIRE(got->size() == 1);
  const auto& g = got->front();
  CHECK(g.group.value == r.group.value);
  REQUIRE(g.multi_turn());
  // Every episode's turns once each, from 0 without a gap; the stored ones as they were.
  std::map<std::uint32_t, std::set<std::uint32_t>> turns_of;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < g.completions.size(); ++i) {
    CHECK(turns_of[g.episodes[i]].insert(g.turns[i]).second);
    for (const auto& t : r.stored)
      if (t.episode == g.episodes[i] && t.turn == g.turns[i]) {
        ++kept;
        CHECK(g.completions[i] == t.sampled);
        CHECK(g.verdicts[i] == t.verdict);
        CHECK(g.contexts[i] == t.context);
      }
  }
  CHECK(kept == r.stored.size());
  CHECK(turns_of.size() == 4);
  for (const auto& [episode, turns] : turns_of) {
    CHECK(*turns.rbegin() + 1 == turns.size());
    // An episode that had ended took no more turns; one that went on, or had none, took more.
    if (stored_turns.count(episode) && !going_on[episode])
      CHECK(turns.size() == stored_turns[episode]);
    else
      CHECK(turns.size() > stored_turns[episode]);
  }
  // A continued episode's next turn was sampled after its stored answers and their feedback.
  for (std::size_t i = 0; i < g.completions.size(); ++i) {
    const auto e = g.episodes[i];
    if (g.turns[i] == 0 || g.turns[i] != stored_turns[e])
      continue;
    const auto ctx = tok->decode(g.contexts[i], false);
    CHECK(ctx.find("Turn " + std::to_string(g.turns[i]) + ": ") != std::string::npos);
    for (const auto& t : r.stored)
      if (t.episode == e)
        CHECK(ctx.find(t.sampled.text.substr(0, 40)) != std::string::npos);
  }
  // Nothing stored was evaluated again: the second process's candidates are its own new turns.
  std::size_t new_candidates = 0;
  for (std::size_t i = evaluated_before; i < table->received.size(); ++i)
    if (table->received[i].variant.value >> rollout_id_shift == 1)
      ++new_candidates;
  std::size_t new_code_turns = 0;
  for (std::size_t i = 0; i < g.completions.size(); ++i)
    if (g.verdicts[i].status != verdict_status::format_error && std::none_of(r.stored.begin(), r.stored.end(), [&](const stored_turn& t) {
          return t.episode == g.episodes[i] && t.turn == g.turns[i];
        }))
      ++new_code_turns;
  CHECK(new_candidates == new_code_turns);
  // The store holds each (episode, turn) of the group once.
  auto store = storage::replay_store::open(dir.path() / "replay.db");
  REQUIRE(store.ok());
  auto rows = store->samples(r.group.value);
  REQUIRE(rows.ok());
  std::set<std::pair<std::uint32_t, std::uint32_t>> places;
  for (const auto& row : *rows)
    CHECK(places.insert({*row.episode, *row.turn}).second);
  CHECK(places.size() == g.completions.size());
}
