#include <doctest/doctest.h>

#include <random>

#include "env/timing.hpp"

using namespace crucible::env;

TEST_CASE("a constant ratio gives that speedup with zero spread") {
  std::vector<double> ref(20, 2.0), cand(20, 1.0);
  auto s = summarize_rounds(ref, cand, {});
  CHECK(s.speedup == doctest::Approx(2.0));
  CHECK(s.spread == doctest::Approx(0.0));
  CHECK(s.stable);
  CHECK(s.bucket_means.size() == 5);
  CHECK(s.ref_ms == 2.0);
  CHECK(s.cand_ms == 1.0);
}

TEST_CASE("one wild round moves the median of bucket means little") {
  std::vector<double> ref(25, 1.5), cand(25, 1.0);
  ref[3] = 150.0; // one preempted round
  auto s = summarize_rounds(ref, cand, {});
  CHECK(s.speedup == doctest::Approx(1.5));
  CHECK_FALSE(s.stable); // but the buckets disagree, so the evaluator measures more
  CHECK(s.disagreement > 1.0);
}

TEST_CASE("the band narrows with less noise and covers the true ratio") {
  std::mt19937 rng{7};
  std::normal_distribution<double> noise{0.0, 0.05};
  std::vector<double> ref, cand;
  for (int i = 0; i < 200; ++i) {
    cand.push_back(1.0 * (1 + noise(rng)));
    ref.push_back(1.2 * (1 + noise(rng)));
  }
  auto s = summarize_rounds(ref, cand, {});
  CHECK(s.speedup == doctest::Approx(1.2).epsilon(0.02));
  CHECK(s.spread > 0.0);
  CHECK(s.spread < 0.03);
  CHECK(std::abs(s.speedup - 1.2) / s.speedup < s.spread * 2);
}

TEST_CASE("rounding is toward 1.00 on both sides") {
  CHECK(round_toward_one(1.2369) == doctest::Approx(1.23));
  CHECK(round_toward_one(1.23) == doctest::Approx(1.23));
  CHECK(round_toward_one(0.8731) == doctest::Approx(0.88));
  CHECK(round_toward_one(1.0) == doctest::Approx(1.0));
  CHECK(round_toward_one(1.0099) == doctest::Approx(1.0));
  CHECK(round_toward_one(0.999) == doctest::Approx(1.0));
}

TEST_CASE("Student t quantiles") {
  CHECK(student_t95(4) == doctest::Approx(2.776));
  CHECK(student_t95(1000) == doctest::Approx(1.96).epsilon(0.01));
}
