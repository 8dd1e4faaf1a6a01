// tests/actors/test_group_book.cpp: the one record of a GRPO group between its announce and its
// last verdict (actors/group_book.hpp), without an actor: a group of one turn, a group of
// episodes that grows turn by turn and releases a place, a reopened group, the straggler fill,
// and where each episode of a reopened group stands (episode_points, which the rollout actor
// reads too).
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "actors/actor_config.hpp"
#include "actors/group_book.hpp"

using namespace crucible;

namespace {

const task_id relu{"level1/19_ReLU"};

completion sample(std::int32_t token, std::uint64_t version = 1) {
  return completion{"text", {token}, {-0.5f}, policy_version{version}};
}

verdict scored(double reward) {
  verdict v;
  v.status = verdict_status::ok;
  v.correct = true;
  v.speedup = 1.5;
  v.reward = reward;
  return v;
}

group_announce announce(std::uint64_t group, std::size_t n, std::uint32_t turns = 1) {
  group_announce a;
  a.group = group_id{group};
  a.task = relu;
  a.prompt_token_ids = {1, 2, 3};
  a.turns = turns;
  for (std::size_t i = 0; i < n; ++i) {
    a.completions.push_back(sample(static_cast<std::int32_t>(10 + i)));
    a.variants.push_back(variant_id{group * 100 + i + 1});
  }
  return a;
}

scored_variant verdict_for(std::uint64_t group, std::uint64_t variant, double reward, bool continues = false) {
  scored_variant x;
  x.variant = variant_id{variant};
  x.group = group_id{group};
  x.task = relu;
  x.verdict = scored(reward);
  x.continues = continues;
  return x;
}

} // namespace

TEST_CASE("a group of one turn closes with its last verdict, in completion order, and a second verdict is a duplicate") {
  group_book book;
  CHECK_FALSE(book.check(announce(7, 2)));
  const auto seq = book.open(announce(7, 2));
  CHECK(book.is_open(group_id{7}, seq));
  CHECK(book.check(announce(7, 2))); // open already
  CHECK_FALSE(book.multi_turn(group_id{7}));

  const auto second = verdict_for(7, 702, 0.2);
  auto p = book.find(second);
  REQUIRE(p.what == group_book::placing::member);
  CHECK(p.slot == 1);
  CHECK_FALSE(book.score(p.slot, second).has_value());
  CHECK(book.find(second).what == group_book::placing::duplicate);
  CHECK(book.find(verdict_for(7, 999, 0)).what == group_book::placing::none);
  CHECK(book.find(verdict_for(8, 701, 0)).what == group_book::placing::none);

  const auto first = verdict_for(7, 701, 0.1);
  auto g = book.score(book.find(first).slot, first);
  REQUIRE(g.has_value());
  CHECK(g->group == group_id{7});
  CHECK(g->prompt_token_ids == std::vector<std::int32_t>{1, 2, 3});
  REQUIRE(g->verdicts.size() == 2);
  CHECK(g->verdicts[0].reward == doctest::Approx(0.1));
  CHECK(g->verdicts[1].reward == doctest::Approx(0.2));
  CHECK_FALSE(g->multi_turn());
  CHECK(book.size() == 0);
}

TEST_CASE("a group of episodes waits for each turn that goes on, and a released place closes it") {
  group_book book;
  book.open(announce(5, 2, 3));
  CHECK(book.multi_turn(group_id{5}));
  // Episode 0 goes on; episode 1 ends at turn 0.
  CHECK_FALSE(book.score(0, verdict_for(5, 501, 0.0, true)).has_value());
  CHECK_FALSE(book.score(1, verdict_for(5, 502, 1.0)).has_value());

  std::optional<rollout_group> complete;
  group_extend next{group_id{5}, variant_id{503}, 0, 1, {1, 2, 3, 4}, sample(20, 2)};
  CHECK(book.extend(next, complete) == group_book::extension::added);
  CHECK_FALSE(complete.has_value());
  CHECK(book.extend(next, complete) == group_book::extension::unknown); // no place is held for another
  // Its turn 1 goes on again, and turn 2 cannot be sampled: the place is released.
  const auto turn1 = verdict_for(5, 503, 0.5, true);
  REQUIRE(book.find(turn1).slot == 2);
  CHECK(book.turn_data(group_id{5}, 2, turn1).context == std::vector<std::int32_t>{1, 2, 3, 4});
  CHECK(book.turn_data(group_id{5}, 0, turn1).context.empty()); // turn 0: the group's prompt
  CHECK_FALSE(book.score(2, turn1).has_value());
  CHECK(book.extend(group_extend{group_id{5}, variant_id{0}, 0, 2, {}, {}}, complete)
        == group_book::extension::released);
  REQUIRE(complete.has_value());
  CHECK(complete->episodes == std::vector<std::uint32_t>{0, 1, 0});
  CHECK(complete->turns == std::vector<std::uint32_t>{0, 0, 1});
  REQUIRE(complete->contexts.size() == 3);
  CHECK(complete->contexts[0] == std::vector<std::int32_t>{1, 2, 3});
  CHECK(complete->contexts[2] == std::vector<std::int32_t>{1, 2, 3, 4});
  CHECK(book.size() == 0);
}

TEST_CASE("a reopened group holds a place for each episode that goes on or has no stored turn") {
  episode_resume r;
  r.group = group_id{9};
  r.task = relu;
  r.turns = 3;
  r.episodes = 3;
  r.prompt_token_ids = {1, 2, 3};
  // Episode 0: turn 0 went on, turn 1 ended; episode 1: turn 0 went on; episode 2: none stored.
  r.stored = {stored_turn{0, 0, sample(10), {1, 2, 3}, scored(0.1), true},
              stored_turn{0, 1, sample(11), {1, 2, 3, 9}, scored(0.2), false},
              stored_turn{1, 0, sample(12), {1, 2, 3}, scored(0.3), true},
              stored_turn{7, 0, sample(13), {1, 2, 3}, scored(0.4), false}}; // beyond the episodes
  const auto points = episode_points(r);
  REQUIRE(points.size() == 3);
  CHECK((points[0].seen && !points[0].goes_on && points[0].turn == 1 && !points[0].open()));
  CHECK((points[1].seen && points[1].goes_on && points[1].turn == 0 && points[1].open()));
  CHECK((!points[2].seen && points[2].open()));

  group_book book;
  std::uint64_t seq = 0;
  const std::vector<variant_id> ids{variant_id{1}, variant_id{2}, variant_id{3}, variant_id{4}};
  CHECK_FALSE(book.reopen(r, ids, seq).has_value()); // two places held
  CHECK(book.is_open(group_id{9}, seq));
  std::optional<rollout_group> complete;
  CHECK(book.extend(group_extend{group_id{9}, variant_id{0}, 1, 1, {}, {}}, complete)
        == group_book::extension::released);
  CHECK(book.extend(group_extend{group_id{9}, variant_id{0}, 2, 0, {}, {}}, complete)
        == group_book::extension::released);
  REQUIRE(complete.has_value());
  CHECK(complete->verdicts.size() == 4);
  CHECK(complete->turns == std::vector<std::uint32_t>{0, 1, 0, 0});

  // Nothing left to wait for: closed at once.
  r.stored = {stored_turn{0, 0, sample(10), {1, 2, 3}, scored(0.1), false}};
  r.episodes = 1;
  auto at_once = book.reopen(r, {variant_id{1}}, seq);
  REQUIRE(at_once.has_value());
  CHECK(at_once->verdicts.size() == 1);
  CHECK(book.size() == 0);
}

TEST_CASE("a straggler group is filled where verdicts are missing, or dropped") {
  group_book book;
  const auto seq = book.open(announce(3, 2));
  book.score(0, verdict_for(3, 301, 0.7));
  verdict filler;
  filler.status = verdict_status::timeout;
  filler.reward = -1;
  auto g = book.fill(group_id{3}, filler);
  CHECK(g.verdicts[0].reward == doctest::Approx(0.7));
  CHECK(g.verdicts[1].status == verdict_status::timeout);
  CHECK_FALSE(book.is_open(group_id{3}, seq));
  const auto again = book.open(announce(3, 2));
  CHECK(again != seq); // a timeout armed for the first opening does not apply
  book.drop(group_id{3});
  CHECK(book.size() == 0);
}
