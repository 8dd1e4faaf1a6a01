// tests/unit/storage/test_exemplar_select.cpp: exemplar selection: chi-square checks of the
// contrastive bucket softmax and of random selection, fallbacks, filtering and option checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "storage/exemplar_select.hpp"

using namespace crucible;
using namespace crucible::storage;

namespace {

variant_record ok_variant(double reward, const std::string& hash) {
  variant_record v;
  v.task_id = "level1/19_ReLU";
  v.hardware = "h100";
  v.code_hash = hash;
  v.status = "ok";
  v.correct = true;
  v.speedup = 1.0 + reward;
  v.reward = reward;
  return v;
}

// Successful variants in buckets (width 1) 0, 1, 2, 4, then three failures with huge rewards
// that must never be chosen and must not move the global mean.
std::vector<variant_record> fixture() {
  std::vector<variant_record> v{ok_variant(0.2, "a"), ok_variant(0.6, "b"), ok_variant(1.5, "c"),
                                ok_variant(2.1, "d"), ok_variant(2.3, "e"), ok_variant(2.9, "f"),
                                ok_variant(4.0, "g")};
  auto compile_error = ok_variant(100.0, "x");
  compile_error.status = "compile_error";
  auto wrong = ok_variant(50.0, "y");
  wrong.correct = false;
  auto untimed = ok_variant(80.0, "z");
  untimed.speedup.reset();
  v.push_back(compile_error);
  v.push_back(wrong);
  v.push_back(untimed);
  return v;
}

// Bucket label of each fixture index, written out by hand (not computed by the code under test).
const std::vector<int> k_bucket_of{0, 0, 1, 2, 2, 2, 3};  // 4 buckets, labelled 0..3

// Expected bucket probabilities, computed here from the formula.
std::vector<double> expected_bucket_probs(double tau) {
  const std::vector<std::vector<double>> buckets{{0.2, 0.6}, {1.5}, {2.1, 2.3, 2.9}, {4.0}};
  double total = 0.0;
  int count = 0;
  for (const auto& b : buckets)
    for (double s : b) total += s, ++count;
  const double global = total / count;
  std::vector<double> w;
  double sum = 0.0;
  for (const auto& b : buckets) {
    double m = 0.0;
    for (double s : b) m += s;
    m /= static_cast<double>(b.size());
    w.push_back(std::exp((m - global) / tau));
    sum += w.back();
  }
  for (double& x : w) x /= sum;
  return w;
}

double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
  double chi = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i)
    chi += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  return chi;
}

std::vector<std::size_t> pick(std::span<const variant_record> c, const exemplar_options& o,
                              std::mt19937_64& rng) {
  auto r = select_exemplars(c, o, rng);
  REQUIRE(r.ok());
  return *r;
}

constexpr int k_draws = 10'000;

} // namespace

TEST_CASE("contrastive n=1: bucket frequencies match exp((mean - global)/tau)") {
  const auto cands = fixture();
  exemplar_options o;
  o.n = 1;
  o.tau = 1.5;
  o.bucket_width = 1.0;
  std::mt19937_64 rng(12345);
  std::vector<double> observed(4, 0.0);
  for (int i = 0; i < k_draws; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0] < k_bucket_of.size());  // failures (indices 7..9) never chosen
    observed[static_cast<std::size_t>(k_bucket_of[got[0]])] += 1.0;
  }
  auto expected = expected_bucket_probs(o.tau);
  for (double& e : expected) e *= k_draws;
  const double chi = chi_square(observed, expected);
  INFO("chi-square = " << chi);
  CHECK(chi < 16.266);  // 0.999 quantile, 3 dof
}

TEST_CASE("contrastive n=2: distinct, and ordered pairs follow draws without replacement") {
  const auto cands = fixture();
  exemplar_options o;
  o.n = 2;
  o.tau = 1.5;
  o.bucket_width = 1.0;
  const auto p = expected_bucket_probs(o.tau);
  std::mt19937_64 rng(777);
  std::map<std::pair<int, int>, double> observed;
  for (int i = 0; i < k_draws; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(got.size() == 2);
    REQUIRE(got[0] != got[1]);
    REQUIRE(got[0] < k_bucket_of.size());
    REQUIRE(got[1] < k_bucket_of.size());
    const int a = k_bucket_of[got[0]], b = k_bucket_of[got[1]];
    REQUIRE(a != b);  // distinct buckets
    observed[{a, b}] += 1.0;
  }
  std::vector<double> obs, exp;
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      if (a == b) continue;
      obs.push_back(observed[{a, b}]);
      exp.push_back(k_draws * p[a] * p[b] / (1.0 - p[a]));
    }
  const double chi = chi_square(obs, exp);
  INFO("chi-square = " << chi);
  CHECK(chi < 31.264);  // 0.999 quantile, 11 dof
}

TEST_CASE("fewer buckets than n: every bucket once") {
  const auto cands = fixture();
  exemplar_options o;
  o.n = 10;
  o.bucket_width = 1.0;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(got.size() == 4);
    std::set<int> buckets;
    for (auto idx : got) {
      REQUIRE(idx < k_bucket_of.size());
      buckets.insert(k_bucket_of[idx]);
    }
    CHECK(buckets.size() == 4);
  }
}

TEST_CASE("no successful variants: empty (reference only), for every method") {
  auto cands = fixture();
  cands.erase(cands.begin(), cands.begin() + 7);  // only the three failures remain
  std::mt19937_64 rng(5);
  for (auto m : {selection_method::contrastive, selection_method::random, selection_method::island}) {
    exemplar_options o;
    o.method = m;
    CHECK(pick(cands, o, rng).empty());
    CHECK(pick(std::span<const variant_record>{}, o, rng).empty());
  }
}

TEST_CASE("random: uniform over successful variants, distinct, failures never chosen") {
  const auto cands = fixture();
  exemplar_options o;
  o.method = selection_method::random;
  o.n = 1;
  std::mt19937_64 rng(99);
  std::vector<double> observed(7, 0.0);
  for (int i = 0; i < k_draws; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0] < 7);
    observed[got[0]] += 1.0;
  }
  const double chi = chi_square(observed, std::vector<double>(7, k_draws / 7.0));
  INFO("chi-square = " << chi);
  CHECK(chi < 22.458);  // 0.999 quantile, 6 dof

  o.n = 5;
  for (int i = 0; i < 200; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(got.size() == 5);
    std::set<std::size_t> s(got.begin(), got.end());
    CHECK(s.size() == 5);
    CHECK(*s.rbegin() < 7);
  }
  o.n = 20;
  CHECK(pick(cands, o, rng).size() == 7);
}

TEST_CASE("island: distinct successful picks from one island, deterministic per seed") {
  const auto cands = fixture();
  exemplar_options o;
  o.method = selection_method::island;
  o.n = 3;
  o.islands = 3;
  o.bucket_width = 1.0;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(!got.empty());
    std::set<std::size_t> s(got.begin(), got.end());
    CHECK(s.size() == got.size());
    CHECK(*s.rbegin() < 7);
  }
  o.islands = 1;  // one island: just contrastive over everything, so all four buckets for n = 4
  o.n = 4;
  CHECK(pick(cands, o, rng).size() == 4);

  for (auto m : {selection_method::contrastive, selection_method::random, selection_method::island}) {
    o.method = m;
    std::mt19937_64 a(42), b(42);
    CHECK(pick(cands, o, a) == pick(cands, o, b));
  }
}

TEST_CASE("invalid options are refused with errc::config naming the field") {
  const auto cands = fixture();
  std::mt19937_64 rng(0);
  auto refused = [&](exemplar_options o, const std::string& field) {
    auto r = select_exemplars(cands, o, rng);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::config);
    CHECK(r.error().message.find(field) != std::string::npos);
    CHECK_FALSE(validate(o).ok());
  };
  exemplar_options o;
  o.n = 0;
  refused(o, "exemplar.n");
  o = {};
  o.tau = 0.0;
  refused(o, "exemplar.tau");
  o.tau = -1.0;
  refused(o, "exemplar.tau");
  o.tau = std::nan("");
  refused(o, "exemplar.tau");
  o = {};
  o.bucket_width = 0.0;
  refused(o, "exemplar.bucket_width");
  o = {};
  o.method = selection_method::island;
  o.islands = 0;
  refused(o, "exemplar.islands");
  CHECK(validate(exemplar_options{}).ok());
}

TEST_CASE("scored by the fraction of the limit: buckets of fractions, variants without one left out") {
  // Rewards and fractions disagree: by reward "r" and "s" share a bucket far above "t"; by
  // fraction (width 0.1) "t" is alone at the top and "r", "s" in two buckets below.
  auto r = ok_variant(5.0, "r"), s = ok_variant(5.2, "s"), t = ok_variant(0.3, "t"), u = ok_variant(9.0, "u");
  r.fraction = 0.12;
  s.fraction = 0.25;
  t.fraction = 0.91; // u has none: left out where others have one
  const std::vector<variant_record> cands{r, s, t, u};
  exemplar_options o;
  o.n = 3;
  o.tau = 0.1;
  o.bucket_width = 0.1;
  o.by_fraction = true;
  std::mt19937_64 rng(99);
  std::map<std::size_t, int> first;
  for (int i = 0; i < 2000; ++i) {
    auto got = pick(cands, o, rng);
    REQUIRE(got.size() == 3); // three buckets of fractions: each once, never u
    CHECK(std::set<std::size_t>(got.begin(), got.end()) == std::set<std::size_t>{0, 1, 2});
    ++first[got[0]];
  }
  // The softmax over bucket means: t (0.91) first far more often than r (0.12).
  CHECK(first[2] > 1900);
  // By reward, width 1: r and s share bucket 5, so at most one of them is drawn.
  o.by_fraction = false;
  o.bucket_width = 1.0;
  o.tau = 1.0;
  for (int i = 0; i < 200; ++i) {
    auto got = pick(cands, o, rng);
    CHECK(std::count_if(got.begin(), got.end(), [](std::size_t k) { return k <= 1; }) == 1);
  }
  // None with a fraction: the reward decides, every successful variant may be drawn.
  o.by_fraction = true;
  const std::vector<variant_record> none{ok_variant(0.2, "a"), ok_variant(1.5, "b")};
  o.n = 2;
  CHECK(pick(none, o, rng).size() == 2);
}

TEST_CASE("the exemplar config section converts field by field") {
  auto cfg = parse_config("exemplar:\n  method: island\n  n: 3\n  tau: 0.25\n  bucket_width: 0.1\n  islands: 7\n", "t.yaml");
  REQUIRE(cfg.ok());
  auto o = to_exemplar_options(cfg->exemplar);
  CHECK(o.method == selection_method::island);
  CHECK(o.n == 3);
  CHECK(o.tau == 0.25);
  CHECK(o.bucket_width == 0.1);
  CHECK(o.islands == 7);
  CHECK_FALSE(o.by_fraction);
  CHECK(validate(o).ok());
  auto f = parse_config("exemplar:\n  score: fraction\n", "t.yaml");
  REQUIRE(f.ok());
  CHECK(to_exemplar_options(f->exemplar).by_fraction);
  auto bad_score = parse_config("exemplar:\n  score: speedup\n", "t.yaml");
  REQUIRE_FALSE(bad_score.ok());
  CHECK(bad_score.error().message.find("exemplar.score") != std::string::npos);
  CHECK(to_exemplar_options(exemplar_config{}).method == selection_method::contrastive);
  exemplar_config r;
  r.method = exemplar_method::random;
  CHECK(to_exemplar_options(r).method == selection_method::random);
  // Defaults agree on both sides, so a config without `exemplar:` selects as storage's defaults do.
  auto d = to_exemplar_options(exemplar_config{});
  exemplar_options s;
  CHECK(d.n == s.n);
  CHECK(d.tau == s.tau);
  CHECK(d.bucket_width == s.bucket_width);
  CHECK(d.islands == s.islands);
  exemplar_config bad;
  bad.n = -1;
  CHECK_FALSE(validate(to_exemplar_options(bad)).ok());
}
