// tests/unit/env/test_recheck.cpp: two measurements of a large speedup on two devices of the
// same kind become one verdict (env/eval/recheck.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "env/eval/recheck.hpp"

using namespace crucible;
using namespace crucible::env;

namespace {

verdict ok(double speedup, double reward) {
  verdict v;
  v.status = verdict_status::ok;
  v.correct = true;
  v.speedup = speedup;
  v.speedup_spread = 0.01;
  v.ref_ms = 1.0;
  v.cand_ms = 1.0 / speedup;
  v.reward = reward;
  v.message = "faster";
  v.hardware = "NVIDIA H100 80GB HBM3";
  v.rounds = 30;
  return v;
}

recheck_options options() {
  recheck_options opt;
  opt.above = 3.0;
  opt.tolerance = 0.10;
  opt.reward.failed = -1;
  return opt;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("only ok verdicts with a speedup above the threshold need a recheck") {
  auto opt = options();
  CHECK(needs_recheck(ok(3.5, 3.5), opt));
  CHECK_FALSE(needs_recheck(ok(3.0, 3.0), opt));
  CHECK_FALSE(needs_recheck(ok(1.2, 1.2), opt));
  auto failed = ok(5, 5);
  failed.status = verdict_status::rejected;
  CHECK_FALSE(needs_recheck(failed, opt));
  verdict none; // NaN speedup
  none.status = verdict_status::ok;
  CHECK_FALSE(needs_recheck(none, opt));
}

TEST_CASE("recheck options come from evaluator.recheck_* and reward:") {
  evaluator_options e;
  e.recheck_above = 4;
  e.recheck_tolerance = 0.05;
  reward_options r;
  r.failed = -2;
  auto opt = recheck_options::from(e, r);
  CHECK(opt.above == 4);
  CHECK(opt.tolerance == 0.05);
  CHECK(opt.reward.failed == -2);
}

TEST_CASE("two agreeing measurements give the verdict with the lower speedup, noting both") {
  auto opt = options();
  auto first = ok(4.0, 4.0);
  auto second = ok(3.7, 3.7);
  second.cand_ms = 0.27;
  auto v = reconcile_recheck(first, "device 0 (H100)", second, "device 1 (H100)", opt);
  CHECK(v.status == verdict_status::ok);
  CHECK(v.speedup == 3.7);
  CHECK(v.reward == 3.7); // the reward belongs to the speedup it comes with
  CHECK(v.cand_ms == 0.27);
  CHECK(v.checks_failed.empty());
  CHECK_MESSAGE(contains(v.message, "faster; recheck agrees: 4.000x on device 0 (H100) and 3.700x on device 1 (H100)"),
                v.message);

  // Whichever device measured it: the lower one wins.
  v = reconcile_recheck(second, "device 1 (H100)", first, "device 0 (H100)", opt);
  CHECK(v.speedup == 3.7);
  CHECK(contains(v.message, "3.700x on device 1 (H100) and 4.000x on device 0 (H100)"));

  // Exactly at the tolerance (relative to the lower) still agrees.
  v = reconcile_recheck(ok(5.5, 5.5), "a", ok(5.0, 5.0), "b", opt);
  CHECK(v.status == verdict_status::ok);
  CHECK(v.speedup == 5.0);
}

TEST_CASE("two measurements further apart than the tolerance reject the candidate") {
  auto opt = options();
  auto first = ok(4.5, 4.5);
  first.cache_hit = true;
  auto v = reconcile_recheck(first, "device 0 (H100)", ok(4.0, 4.0), "device 1 (H100)", opt);
  CHECK(v.status == verdict_status::rejected);
  CHECK(v.correct);
  CHECK_FALSE(v.has_speedup());
  CHECK(std::isnan(v.speedup_spread));
  CHECK(v.reward == -1); // reward.failed
  CHECK(v.checks_failed == std::vector<std::string>{"runtime:recheck"});
  CHECK_FALSE(v.cache_hit);
  CHECK_MESSAGE(contains(v.message, "4.500x on device 0 (H100) and 4.000x on device 1 (H100)"), v.message);
  CHECK_MESSAGE(contains(v.message, "10%"), v.message);

  // A first verdict that already failed the check elsewhere does not list it twice.
  first.checks_failed = {"runtime:recheck"};
  v = reconcile_recheck(first, "a", ok(2.0, 2.0), "b", opt);
  CHECK(v.checks_failed == std::vector<std::string>{"runtime:recheck"});

  // The reward is computed under the reward options, not copied.
  opt.reward.failed = -7;
  CHECK(reconcile_recheck(first, "a", ok(2.0, 2.0), "b", opt).reward == -7);
}

TEST_CASE("a second measurement that is not ok gives the second verdict") {
  auto opt = options();
  verdict crash;
  crash.status = verdict_status::runtime_error;
  crash.message = "worker died: signal 11";
  crash.reward = -1;
  crash.checks_failed = {"runtime:memory"};
  auto v = reconcile_recheck(ok(5.0, 5.0), "device 0 (H100)", crash, "device 1 (H100)", opt);
  CHECK(v.status == verdict_status::runtime_error);
  CHECK(v.reward == -1);
  CHECK(v.checks_failed == crash.checks_failed);
  CHECK_MESSAGE(contains(v.message, "worker died: signal 11"), v.message);
  CHECK_MESSAGE(contains(v.message, "recheck on device 1 (H100) of 5.000x on device 0 (H100)"), v.message);
}

TEST_CASE("a lost recheck leaves the first verdict standing, saying so") {
  auto first = ok(5.0, 5.0);
  auto v = recheck_lost(first, "the evaluator of device 1 (H100) went down");
  CHECK(v.status == verdict_status::ok);
  CHECK(v.speedup == 5.0);
  CHECK(v.reward == 5.0);
  CHECK(v.message == "faster; the recheck on a second device was lost: the evaluator of device 1 (H100) went down");
  first.message.clear();
  CHECK(recheck_lost(first, "x").message == "the recheck on a second device was lost: x");
}
