// tests/unit/env/test_task_sampler.cpp: the task sampler's draw frequencies against its formulas
// (chi-square over 10k draws), what verdicts change, determinism under a seed, checkpoints.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "env/prompt/task_sampler.hpp"

using namespace crucible;
using namespace crucible::env;

namespace {

std::vector<std::string> pool(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i)
    out.push_back("cpu/" + std::to_string(i) + "_task");
  return out;
}

verdict ok(double speedup) {
  verdict v;
  v.status = verdict_status::ok;
  v.correct = true;
  v.speedup = speedup;
  return v;
}

verdict failed(verdict_status s) {
  verdict v;
  v.status = s;
  return v;
}

// Pearson's statistic of `draws` draws against probabilities `p`.
double chi_square(task_sampler& s, const std::vector<double>& p, int draws) {
  std::vector<int> counts(p.size(), 0);
  for (int i = 0; i < draws; ++i)
    ++counts[s.next_index()];
  double x2 = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] * draws;
    x2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return x2;
}

// The 0.999 quantile of chi-square with 4 degrees of freedom: a correct sampler exceeds it once
// in a thousand seeds (the seeds here are fixed, so the test is deterministic).
constexpr double chi2_4_999 = 18.467;

} // namespace

TEST_CASE("uniform draws match 1/N (chi-square over 10k draws)") {
  auto s = task_sampler::create(pool(5), task_sampling::uniform, 0.1, 42);
  REQUIRE(s.ok());
  s->observe("cpu/0_task", ok(5.0)); // uniform ignores what it has seen
  CHECK(s->probabilities() == std::vector<double>(5, 0.2));
  auto x2 = chi_square(*s, s->probabilities(), 10000);
  MESSAGE("uniform: chi-square " << x2 << " (df 4, 0.999 quantile " << chi2_4_999 << ")");
  CHECK(x2 < chi2_4_999);
}

TEST_CASE("improvement draws match (1 - mix) w_i / sum w + mix / N with w = 1 / (1 + best speedup)") {
  const std::vector<double> best{0.0, 1.0, 3.0, 0.5, 9.0};
  const double mix = 0.1;
  auto s = task_sampler::create(pool(5), task_sampling::improvement, mix, 7);
  REQUIRE(s.ok());
  for (std::size_t i = 0; i < best.size(); ++i) {
    if (best[i] > 0) {
      REQUIRE(s->observe(s->tasks()[i], ok(best[i] / 2)));
      REQUIRE(s->observe(s->tasks()[i], ok(best[i])));
      REQUIRE(s->observe(s->tasks()[i], ok(best[i] / 3)));
    }
    REQUIRE(s->observe(s->tasks()[i], failed(verdict_status::incorrect)));
  }
  std::vector<double> w, expected;
  double total = 0;
  for (auto b : best) {
    w.push_back(1.0 / (1.0 + b));
    total += w.back();
  }
  for (auto x : w)
    expected.push_back((1 - mix) * x / total + mix / 5);
  auto p = s->probabilities();
  REQUIRE(p.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(p[i] == doctest::Approx(expected[i]).epsilon(1e-12));
    CHECK(s->records()[i].best_speedup == best[i]);
  }
  // The task never solved is drawn most, the one at 9x least.
  CHECK(p[0] > p[3]);
  CHECK(p[3] > p[1]);
  CHECK(p[1] > p[2]);
  CHECK(p[2] > p[4]);
  auto x2 = chi_square(*s, expected, 10000);
  MESSAGE("improvement: chi-square " << x2 << " (df 4, 0.999 quantile " << chi2_4_999 << ")");
  CHECK(x2 < chi2_4_999);
}

TEST_CASE("a sampler that does not follow the formula fails the frequency check") {
  // The check above can fail: draws from uniform judged against the improvement formula.
  auto s = task_sampler::create(pool(5), task_sampling::uniform, 0.1, 7);
  REQUIRE(s.ok());
  std::vector<double> skewed{0.35, 0.2, 0.15, 0.2, 0.1};
  CHECK(chi_square(*s, skewed, 10000) > chi2_4_999);
}

TEST_CASE("verdicts count attempts and failures, only ok speedups raise the best, unknown tasks are ignored") {
  auto s = task_sampler::create(pool(2), task_sampling::improvement, 0.0, 1);
  REQUIRE(s.ok());
  CHECK(s->observe("cpu/0_task", ok(2.0)));
  CHECK(s->observe("cpu/0_task", ok(1.5)));
  auto timeout = failed(verdict_status::timeout);
  timeout.speedup = 50; // a failed verdict's number never counts
  CHECK(s->observe("cpu/0_task", timeout));
  CHECK(s->observe("cpu/0_task", failed(verdict_status::format_error)));
  CHECK_FALSE(s->observe("cpu/9_unknown", ok(100)));
  CHECK(s->records()[0] == task_record{4, 2, 2.0});
  CHECK(s->records()[1] == task_record{});
  // mix 0: probabilities are the weights alone, 1/3 against 1.
  auto p = s->probabilities();
  CHECK(p[0] == doctest::Approx(0.25));
  CHECK(p[1] == doctest::Approx(0.75));
}

TEST_CASE("the same seed gives the same draws, another seed others") {
  auto draws = [](std::uint64_t seed, task_sampling kind) {
    auto s = task_sampler::create(pool(7), kind, 0.2, seed);
    REQUIRE(s.ok());
    s->observe("cpu/3_task", ok(4.0));
    std::vector<std::size_t> out;
    for (int i = 0; i < 200; ++i)
      out.push_back(s->next_index());
    return out;
  };
  for (auto kind : {task_sampling::uniform, task_sampling::improvement}) {
    CHECK(draws(11, kind) == draws(11, kind));
    CHECK(draws(11, kind) != draws(12, kind));
  }
}

TEST_CASE("save and restore continue the same sequence") {
  auto a = task_sampler::create(pool(4), task_sampling::improvement, 0.3, 99);
  REQUIRE(a.ok());
  a->observe("cpu/1_task", ok(1.0 / 3.0)); // not exact in decimal: the text keeps every bit
  a->observe("cpu/2_task", failed(verdict_status::compile_error));
  for (int i = 0; i < 17; ++i)
    a->next_index();
  auto saved = a->save();
  auto b = task_sampler::create(pool(4), task_sampling::improvement, 0.3, 0);
  REQUIRE(b.ok());
  auto restored = b->restore(saved);
  REQUIRE_MESSAGE(restored.ok(), (restored.ok() ? "" : restored.error().message));
  CHECK(b->records() == a->records());
  for (int i = 0; i < 100; ++i)
    CHECK(a->next_index() == b->next_index());

  auto other = task_sampler::create(pool(3), task_sampling::improvement, 0.3, 0);
  REQUIRE(other.ok());
  auto r = other->restore(saved);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::corrupt);
  CHECK(r.error().message.find("4 tasks saved") != std::string::npos);
  CHECK_FALSE(b->restore("garbage").ok());
}

TEST_CASE("the task names of a saved state are read without a sampler") {
  auto a = task_sampler::create(pool(3), task_sampling::uniform, 0.1, 7);
  REQUIRE(a.ok());
  auto names = task_sampler::saved_tasks(a->save());
  REQUIRE_MESSAGE(names.ok(), (names.ok() ? "" : names.error().message));
  CHECK(*names == pool(3));
  CHECK(task_sampler::saved_tasks("garbage").error().code == errc::corrupt);
  CHECK(task_sampler::saved_tasks("crucible-task-sampler 1\n2\ncpu/0_task\t0\t0\t0x0p+0\n").error().message.find(
          "line of task 1 is missing")
        != std::string::npos);
  CHECK(task_sampler::saved_tasks("crucible-task-sampler 1\n1\nno tab here\n").error().message.find("no task name")
        != std::string::npos);
}

TEST_CASE("an empty pool, a duplicate task or a mix outside [0, 1] is refused") {
  CHECK(task_sampler::create({}, task_sampling::uniform, 0.1, 0).error().code == errc::invalid_arg);
  CHECK(task_sampler::create({"a", "b", "a"}, task_sampling::uniform, 0.1, 0).error().message.find("'a'") != std::string::npos);
  auto bad = task_sampler::create(pool(2), task_sampling::improvement, 1.5, 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("rollout.sampler_mix") != std::string::npos);
}
