// policy/training/episodes.hpp against values computed by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "policy/training/episodes.hpp"

using namespace crucible;
using namespace crucible::policy;

namespace {

std::vector<double> returns_of(std::vector<double> r, turn_return_kind k, double gamma) {
  auto out = turn_returns(r, k, gamma);
  REQUIRE(out.ok());
  return *out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
}

} // namespace

TEST_CASE("turn returns: discounted return-to-go, best reached from each turn, each turn alone") {
  // Rewards of three turns: a failure, a 1.5x kernel, a 1.2x one; gamma 0.5.
  const std::vector<double> r{0.0, 1.5, 1.2};
  // Discounted: G2 = 1.2; G1 = 1.5 + 0.5 * 1.2 = 2.1; G0 = 0 + 0.5 * 2.1 = 1.05.
  check_close(returns_of(r, turn_return_kind::discounted, 0.5), {1.05, 2.1, 1.2});
  // Best: G2 = 1.2; G1 = max(1.5, 0.6) = 1.5; G0 = max(0, 0.75) = 0.75.
  check_close(returns_of(r, turn_return_kind::best, 0.5), {0.75, 1.5, 1.2});
  check_close(returns_of(r, turn_return_kind::immediate, 0.5), {0.0, 1.5, 1.2});
  // gamma 1 sums, gamma 0 keeps each turn's own reward.
  check_close(returns_of(r, turn_return_kind::discounted, 1.0), {2.7, 2.7, 1.2});
  check_close(returns_of(r, turn_return_kind::discounted, 0.0), {0.0, 1.5, 1.2});
  check_close(returns_of({}, turn_return_kind::discounted, 0.9), {});
  CHECK(turn_returns(r, turn_return_kind::discounted, 1.5).error().message.find("gamma") != std::string::npos);
  std::vector<double> bad{1.0, std::numeric_limits<double>::quiet_NaN()};
  CHECK(turn_returns(bad, turn_return_kind::best, 0.9).error().message.find("turn 1") != std::string::npos);
}

TEST_CASE("turn advantages: GRPO and TRLOO at each turn over the episodes that reached it") {
  // Three episodes: A ends after one turn, B after three, C after two.
  const std::vector<std::vector<double>> g{{1.0}, {3.0, 2.0, 4.0}, {2.0, 0.0}};
  // Turn 0: returns 1, 3, 2: mean 2, sample std 1. Turn 1: B 2, C 0: mean 1, std sqrt(2).
  // Turn 2: B alone: 0.
  auto grpo = turn_advantages(g, turn_advantage_kind::grpo, true, 0.0);
  REQUIRE(grpo.ok());
  check_close((*grpo)[0], {-1.0});
  check_close((*grpo)[1], {1.0, 1.0 / std::sqrt(2.0), 0.0});
  check_close((*grpo)[2], {0.0, -1.0 / std::sqrt(2.0)});
  auto centred = turn_advantages(g, turn_advantage_kind::grpo, false, 0.0);
  REQUIRE(centred.ok());
  check_close((*centred)[1], {1.0, 1.0, 0.0});
  // TRLOO: turn 0: A 1 - (3 + 2) / 2 = -1.5, B 3 - 1.5 = 1.5, C 2 - 2 = 0; turn 1: B 2 - 0 = 2,
  // C 0 - 2 = -2; turn 2: 0.
  auto loo = turn_advantages(g, turn_advantage_kind::trloo, true, 0.0);
  REQUIRE(loo.ok());
  check_close((*loo)[0], {-1.5});
  check_close((*loo)[1], {1.5, 2.0, 0.0});
  check_close((*loo)[2], {0.0, -2.0});
  // Equal returns at a turn carry no preference.
  auto same = turn_advantages({{2.0, 1.0}, {2.0, 3.0}}, turn_advantage_kind::grpo, true, 1e-6);
  REQUIRE(same.ok());
  CHECK((*same)[0][0] == 0.0);
  CHECK((*same)[1][0] == 0.0);
  CHECK((*same)[0][1] < 0.0);
  CHECK(turn_advantages({{1.0, std::numeric_limits<double>::infinity()}}, turn_advantage_kind::trloo, true, 0.0)
          .error().message.find("episode 0 at turn 1") != std::string::npos);
}

TEST_CASE("an episode's tokens: completions in the loss, prompt and feedback masked, rows per turn") {
  episode_tokens e;
  e.prompt = {1, 2, 3};
  e.completions = {{10, 11}, {20}, {30, 31, 32}};
  e.feedback = {{90, 91}, {92}};
  auto s = flatten(e);
  REQUIRE(s.ok());
  CHECK(s->tokens == std::vector<std::int32_t>{1, 2, 3, 10, 11, 90, 91, 20, 92, 30, 31, 32});
  CHECK(s->mask == std::vector<std::uint8_t>{0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1});
  CHECK(s->turn == std::vector<std::int32_t>{-1, -1, -1, 0, 0, -1, -1, 1, -1, 2, 2, 2});
  auto rows = turn_rows(e);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 3);
  CHECK((*rows)[0].context == std::vector<std::int32_t>{1, 2, 3});
  CHECK((*rows)[1].context == std::vector<std::int32_t>{1, 2, 3, 10, 11, 90, 91});
  CHECK((*rows)[2].context == std::vector<std::int32_t>{1, 2, 3, 10, 11, 90, 91, 20, 92});
  CHECK((*rows)[2].completion == std::vector<std::int32_t>{30, 31, 32});
  // The rows' completions are exactly the sequence's masked-in tokens, turn by turn.
  std::vector<std::int32_t> masked;
  for (std::size_t i = 0; i < s->tokens.size(); ++i)
    if (s->mask[i])
      masked.push_back(s->tokens[i]);
  CHECK(masked == std::vector<std::int32_t>{10, 11, 20, 30, 31, 32});

  episode_tokens wrong = e;
  wrong.feedback.pop_back();
  CHECK(flatten(wrong).error().message.find("needs 2 feedback turns, got 1") != std::string::npos);
  CHECK(turn_rows(episode_tokens{{1}, {}, {}}).error().message.find("at least one turn") != std::string::npos);
  CHECK(flatten(episode_tokens{{}, {{5}}, {}}).error().message.find("prompt is empty") != std::string::npos);
}
