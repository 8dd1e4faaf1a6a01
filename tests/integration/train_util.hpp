// tests/integration/train_util.hpp: what test_train.cpp and test_train_recovery.cpp share: the
// `crucible` command, a small CPU run's configuration, and its metrics and status read back.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/json_parse.hpp"
#include "tests/integration/process.hpp"

namespace crucible::testing::train {

namespace fs = std::filesystem;

inline const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

inline process_result cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args, source_dir.string());
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small run: two CPU tasks, a tiny model, a short evaluator protocol, one thread of torch.
inline std::string test_config(const fs::path& runs, const std::string& name, const std::string& stages) {
  return "run:\n  name: " + name + "\n  dir: " + runs.string() + "\n  seed: 5\n  checkpoint_every: 2\n  publish: \"\"\n"
         "log:\n  level: warn\n"
         "actors:\n  threads: 2\n"
         "evaluator:\n  warm_workers: 1\n  rounds: 5\n  max_rounds: 10\n  warmup_ms: 10\n  flush_bytes: 1048576\n"
         "  cache: " + (runs / "verdicts.db").string() + "\n"
         "model:\n  init: tiny\n  tokenizer_vocab: 600\n"
         "tasks:\n  include: [02_silu_bias_residual]\n  suite: " + (source_dir / "env/tasks/cpu").string() + "\n"
         "prompt:\n  chat_template: none\n"
         "rollout:\n  group_size: 2\n  max_new_tokens: 16\n  max_groups_in_flight: 1\n"
         "learner:\n  lr: 0.001\n  micro_batch_tokens: 65536\n"
         "stages:\n" + stages;
}

// The same configuration without the warm start (no evaluations at all: SFT only is deterministic).
inline std::string without_warm_start(std::string t) {
  const std::string key = "tasks:\n  include: [02_silu_bias_residual]\n  suite: " + (source_dir / "env/tasks/cpu").string() + "\n";
  t.insert(t.find(key) + key.size(), "  warm_start: false\n");
  return t;
}

inline fs::path write_config(const fs::path& dir, const std::string& text) {
  auto p = dir / "c.yaml";
  std::ofstream(p) << text;
  return p;
}

// Every metrics record as (event, parsed object).
inline std::vector<crucible::json_value> records(const fs::path& run) {
  std::vector<crucible::json_value> out;
  std::istringstream in(slurp(run / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    auto v = crucible::parse_json(line);
    REQUIRE_MESSAGE(v.ok(), line);
    out.push_back(std::move(*v));
  }
  return out;
}

inline std::string event_of(const crucible::json_value& r) { return r.find("event")->as_string(); }

inline std::vector<std::int64_t> train_steps(const fs::path& run) {
  std::vector<std::int64_t> steps;
  for (const auto& r : records(run))
    if (event_of(r) == "train_step")
      steps.push_back(r.find("step")->as_int());
  return steps;
}

// `crucible status RUN --json` as parsed, with the replay store's samples by fate checked against
// the run's counters (docs/training.md, What a run promises): none undecided once the run has
// stopped, each trainer fate as many as its counter, and the trained and paused ones, with the
// `seeds` scored variants of the warm start, as many as `variants`.
inline crucible::json_value samples_agree(const fs::path& run, std::int64_t seeds, const char* when) {
  auto out = cli({"status", run.string(), "--json"});
  INFO(when, ": ", out.out, out.err);
  REQUIRE(out.exit_code == 0);
  auto st = crucible::parse_json(out.out);
  REQUIRE(st.ok());
  const auto* s = st->find("samples");
  REQUIRE(s != nullptr);
  auto n = [&](const crucible::json_value& x, const char* key) { return x.find(key)->as_int(); };
  MESSAGE(std::string(when) << ": " << out.out);
  CHECK(n(*s, "undecided") == 0);
  CHECK(n(*s, "stale") == n(*st, "dropped_stale"));
  CHECK(n(*s, "discarded") == n(*st, "discarded"));
  CHECK(n(*s, "unfinished") == n(*st, "unfinished"));
  CHECK(n(*s, "trained") + n(*s, "paused") + seeds == n(*st, "variants"));
  CHECK(n(*s, "total") == n(*s, "trained") + n(*s, "paused") + n(*s, "stale") + n(*s, "discarded")
                            + n(*s, "unfinished") + n(*s, "orphan") + n(*s, "straggler"));
  return std::move(*st);
}

inline fs::path latest_dir(const fs::path& run) {
  auto latest = slurp(run / "checkpoints" / "latest");
  while (!latest.empty() && latest.back() == '\n')
    latest.pop_back();
  return run / "checkpoints" / latest;
}

} // namespace crucible::testing::train
