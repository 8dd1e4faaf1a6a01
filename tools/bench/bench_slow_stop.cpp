// tools/bench/bench_slow_stop.cpp: the error rates of the evaluator's early stop for a clearly
// slower candidate (env::clearly_slower at evaluator.slow_stop_rounds rounds), by simulation.
//
//   bench_slow_stop [--trials 20000] [--rounds 10] [--below 0.9] [--seed 1] [--json]
//
// Each simulated measurement is `rounds` paired rounds, summarised by env::summarize_rounds as the
// evaluator does (5 buckets, band_floor 0.015). A round's times are
// the true times times noise: a factor both calls of the round share (the device's clock, other
// load: lognormal, sigma `drift`), each call's own lognormal noise (sigma `noise`), and with
// probability `outliers` one of the two calls taken 1.5-3x as long (a preemption, a page fault).
// For each true speedup and noise model it prints the share of measurements the rule stops: for a
// true speedup at or above `below` that share is the rule's error (a candidate called clearly
// slower that is not), below it the share of measurements it saves rounds on.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "env/eval/timing.hpp"

using namespace crucible;

namespace {

constexpr const char* help_text =
    "bench_slow_stop: the error rates of the evaluator's early stop for a clearly slower candidate\n"
    "(env::clearly_slower), by simulation of paired rounds under several noise models.\n"
    "\n"
    "usage: bench_slow_stop [--trials 20000] [--rounds 10] [--below 0.9] [--seed 1] [--json]\n"
    "\n"
    "  --trials  simulated measurements per true speedup and noise model (20000)\n"
    "  --rounds  rounds of the first look (evaluator.slow_stop_rounds, 10)\n"
    "  --below   evaluator.slow_stop_below (0.9)\n"
    "  --seed    the generator's seed (1)\n"
    "  --json    one JSON object a line instead of the table\n"
    "\n"
    "Reproduces the error rates in docs/evaluator.md (Timing: stopping a clearly slower candidate\n"
    "early). Runs on the CPU in seconds; no environment variables.\n";

struct noise_model {
  const char* name;
  double noise;    // each call's own lognormal sigma
  double drift;    // the round's shared lognormal sigma
  double outliers; // probability that one call of the round is 1.5-3x as long
};

} // namespace

int main(int argc, char** argv) {
  long trials = 20000;
  long rounds = 10;
  double below = 0.9;
  unsigned seed = 1;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_slow_stop: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(help_text, stdout);
      return 0;
    } else if (a == "--trials") {
      trials = std::atol(value());
    } else if (a == "--rounds") {
      rounds = std::atol(value());
    } else if (a == "--below") {
      below = std::atof(value());
    } else if (a == "--seed") {
      seed = static_cast<unsigned>(std::atol(value()));
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "bench_slow_stop: unknown option %s (--help)\n", a.c_str());
      return 2;
    }
  }
  env::timing_policy policy;
  policy.buckets = 5;
  policy.band_floor = 0.015;
  if (trials < 1 || rounds < static_cast<long>(policy.buckets) || !(below > 0 && below <= 1)) {
    std::fprintf(stderr, "bench_slow_stop: needs --trials >= 1, --rounds >= %zu and 0 < --below <= 1\n", policy.buckets);
    return 2;
  }
  const std::vector<noise_model> models{
    {"quiet (1% a call)", 0.01, 0.005, 0.0},
    {"GPU-like (3% a call, 2% drift, 2% outliers)", 0.03, 0.02, 0.02},
    {"loaded CPU (10% a call, 5% drift, 5% outliers)", 0.10, 0.05, 0.05},
    {"very noisy (20% a call, 10% drift, 10% outliers)", 0.20, 0.10, 0.10},
  };
  const std::vector<double> truths{1.10, 1.00, 0.95, 0.92, 0.90, 0.88, 0.85, 0.80, 0.70, 0.50};
  std::mt19937_64 rng{seed};
  std::normal_distribution<double> unit{0.0, 1.0};
  std::uniform_real_distribution<double> u01{0.0, 1.0};
  if (!json)
    std::printf("rule: stop after %ld rounds when speedup x (1 + band) < %.2f; %ld measurements a cell\n", rounds,
                below, trials);
  for (const auto& m : models) {
    if (!json) {
      std::printf("\n%s\n  true speedup:", m.name);
      for (double t : truths)
        std::printf(" %6.2f", t);
      std::printf("\n  stopped:     ");
    }
    for (double truth : truths) {
      long stopped = 0;
      std::vector<double> ref(static_cast<std::size_t>(rounds)), cand(static_cast<std::size_t>(rounds));
      for (long k = 0; k < trials; ++k) {
        for (long r = 0; r < rounds; ++r) {
          const double shared = std::exp(m.drift * unit(rng));
          double a = 1.0 * shared * std::exp(m.noise * unit(rng));
          double b = (1.0 / truth) * shared * std::exp(m.noise * unit(rng));
          if (u01(rng) < m.outliers)
            (u01(rng) < 0.5 ? a : b) *= 1.5 + 1.5 * u01(rng);
          ref[static_cast<std::size_t>(r)] = a;
          cand[static_cast<std::size_t>(r)] = b;
        }
        if (env::clearly_slower(env::summarize_rounds(ref, cand, policy), below))
          ++stopped;
      }
      const double share = static_cast<double>(stopped) / static_cast<double>(trials);
      if (json)
        std::printf("{\"model\":\"%s\",\"noise\":%g,\"drift\":%g,\"outliers\":%g,\"rounds\":%ld,\"below\":%g,"
                    "\"true_speedup\":%g,\"trials\":%ld,\"stopped\":%ld,\"share\":%.6f}\n",
                    m.name, m.noise, m.drift, m.outliers, rounds, below, truth, trials, stopped, share);
      else
        std::printf(" %6.4f", share);
    }
    if (!json)
      std::printf("\n");
  }
  return 0;
}
