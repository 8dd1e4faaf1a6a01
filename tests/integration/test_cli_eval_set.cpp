// `crucible eval` over a set of pairs, in real processes on the CPU: a suite folder with
// variants, a TSV list and a CUDA-L1-style JSONL; per-pair records, resuming from them (a cut
// last line included), the summary checked against the records, and bad input.
#include <doctest/doctest.h>

#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "process.hpp"
#include "tests/test_util/read_text.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::json_value;
using crucible::testing::read_text;
using crucible::testing::run_process;
using crucible::testing::temp_dir;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};
const fs::path suite = source_dir / "env" / "tasks" / "cpu";
const fs::path candidates = source_dir / "tests" / "candidates";

// Settings that make a CPU verdict take about a second on two cores: two trials, four rounds in
// two buckets, no warm-up, a small cache flush, no second measurement of a large speedup (four
// rounds are too few for two measurements to agree), and two evaluations in flight.
std::vector<std::string> fast_flags() {
  return {"--no-cache", "--device", "cpu",
          "--set", "evaluator.trials=2", "--set", "evaluator.rounds=4", "--set", "evaluator.min_rounds=4",
          "--set", "evaluator.max_rounds=4", "--set", "evaluator.buckets=2", "--set", "evaluator.warmup_ms=0",
          "--set", "evaluator.flush_bytes=1048576", "--set", "evaluator.recheck_above=1000",
          "--set", "evaluator.concurrency=2"};
}

auto cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args);
}

auto eval_set(std::vector<std::string> args) {
  args.insert(args.begin(), "eval");
  auto flags = fast_flags();
  args.insert(args.end(), flags.begin(), flags.end());
  return cli(std::move(args));
}

void copy_into(const fs::path& from, const fs::path& to) {
  fs::create_directories(to.parent_path());
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

json_value parse(const std::string& text) {
  auto doc = crucible::parse_json(text);
  REQUIRE_MESSAGE(doc.ok(), doc.error().message << " in: " << text);
  return *doc;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      out.push_back(line);
  return out;
}

std::vector<json_value> read_records(const fs::path& file) {
  std::vector<json_value> out;
  for (const auto& line : lines_of(read_text(file)))
    out.push_back(parse(line));
  return out;
}

std::string str(const json_value& o, const char* key) {
  const auto* v = o.find(key);
  REQUIRE_MESSAGE(v != nullptr, "no " << key);
  REQUIRE(v->is_string());
  return v->as_string();
}

double number_or_nan(const json_value& o, const char* key) {
  const auto* v = o.find(key);
  REQUIRE_MESSAGE(v != nullptr, "no " << key);
  return v->is_null() ? NAN : v->as_double();
}

std::size_t count(const json_value& o, const char* key) {
  const auto* v = o.find(key);
  REQUIRE_MESSAGE(v != nullptr, "no " << key);
  return static_cast<std::size_t>(v->as_int());
}

// The records by pair number; every pair of 1..pairs exactly once.
std::map<std::int64_t, json_value> by_pair(const std::vector<json_value>& records, std::size_t pairs) {
  std::map<std::int64_t, json_value> out;
  for (const auto& r : records) {
    auto n = r.find("pair")->as_int();
    CHECK_MESSAGE(out.count(n) == 0, "pair " << n << " recorded twice");
    out[n] = r;
  }
  CHECK(out.size() == pairs);
  for (std::size_t i = 1; i <= pairs; ++i)
    CHECK_MESSAGE(out.count(static_cast<std::int64_t>(i)) == 1, "no record for pair " << i);
  return out;
}

// The summary object must say what the records say: counts, credited (ok above 1.01x, the
// evaluator's win threshold), checks, devices, geometric mean and median of the ok speedups, and
// fast_p over all pairs.
void check_summary(const json_value& s, const std::vector<json_value>& records, std::size_t pairs) {
  CHECK(count(s, "pairs") == pairs);
  CHECK(count(s, "recorded") == records.size());
  std::map<std::string, std::size_t> status, checks, devices;
  std::size_t credited = 0, correct = 0, fast1 = 0, fast12 = 0;
  std::vector<double> ok, fractions;
  std::size_t above = 0;
  for (const auto& r : records) {
    ++status[str(r, "status")];
    for (const auto& c : r.find("checks_failed")->as_array())
      ++checks[c.as_string()];
    if (const auto* d = r.find("device"); d->is_string())
      ++devices[d->as_string()];
    const double x = number_or_nan(r, "speedup");
    const bool is_correct = r.find("correct")->as_bool();
    correct += is_correct ? 1 : 0;
    if (str(r, "status") == "ok") {
      REQUIRE_FALSE(std::isnan(x));
      ok.push_back(x);
      credited += x > 1.01 ? 1 : 0;
      if (const auto* f = r.find("fraction"); f != nullptr && f->is_number()) {
        fractions.push_back(f->as_double());
        above += f->as_double() > 1.0 ? 1 : 0;
      }
    }
    fast1 += is_correct && x > 1.0 ? 1 : 0;
    fast12 += is_correct && x > 1.2 ? 1 : 0;
  }
  auto counts_of = [&](const char* key) {
    std::map<std::string, std::size_t> out;
    for (const auto& m : s.find(key)->as_object())
      out[m.key] = static_cast<std::size_t>(m.value.as_int());
    return out;
  };
  CHECK(counts_of("by_status") == status);
  CHECK(counts_of("checks_failed") == checks);
  CHECK(counts_of("devices") == devices);
  CHECK(count(s, "credited") == credited);
  CHECK(count(s, "correct") == correct);
  CHECK(count(s, "ok") == ok.size());
  CHECK(s.find("win_threshold")->as_double() == doctest::Approx(1.01));
  const auto& fast = *s.find("fast_p");
  CHECK(fast.find("1.0")->as_double() == doctest::Approx(static_cast<double>(fast1) / static_cast<double>(pairs)));
  CHECK(fast.find("1.2")->as_double() == doctest::Approx(static_cast<double>(fast12) / static_cast<double>(pairs)));
  // How far from the limit: the ok records that carry a bound, their median fraction of it and
  // how many are above 1.0.
  const auto& limit = *s.find("limit");
  CHECK(count(limit, "with_bound") == fractions.size());
  CHECK(count(limit, "above") == above);
  if (fractions.empty()) {
    CHECK(limit.find("median_fraction")->is_null());
  } else {
    std::sort(fractions.begin(), fractions.end());
    const auto m = fractions.size();
    CHECK(limit.find("median_fraction")->as_double()
          == doctest::Approx(m % 2 == 1 ? fractions[m / 2] : (fractions[m / 2 - 1] + fractions[m / 2]) / 2));
  }
  if (ok.empty()) {
    CHECK(s.find("geomean_speedup")->is_null());
    CHECK(s.find("median_speedup")->is_null());
    return;
  }
  double logs = 0;
  for (double x : ok)
    logs += std::log(x);
  std::sort(ok.begin(), ok.end());
  const auto n = ok.size();
  const double median = n % 2 == 1 ? ok[n / 2] : (ok[n / 2 - 1] + ok[n / 2]) / 2;
  CHECK(s.find("geomean_speedup")->as_double() == doctest::Approx(std::exp(logs / static_cast<double>(n))));
  CHECK(s.find("median_speedup")->as_double() == doctest::Approx(median));
}

// Every field `crucible eval --json` prints is in the record.
void check_verdict_fields(const json_value& r) {
  for (const char* key : {"status", "correct", "speedup", "speedup_spread", "ref_ms", "cand_ms", "reward",
                          "checks_failed", "message", "hardware", "cache_hit", "rounds", "wall_s", "baseline", "judged"})
    CHECK_MESSAGE(r.find(key) != nullptr, "record lacks " << key);
}

// The progress lines on stderr (not a terminal here: one line per recorded pair).
std::vector<std::string> progress_lines(const std::string& err) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(err))
    if (line.rfind("[", 0) == 0)
      out.push_back(line);
  return out;
}

std::string json_string(const std::string& s) {
  std::string out;
  crucible::append_json_string(out, s);
  return out;
}

} // namespace

TEST_CASE("crucible eval --help describes the three set forms, --out and several devices") {
  auto r = cli({"eval", "--help"});
  REQUIRE(r.exit_code == 0);
  for (const char* text : {"--set-dir DIR", "--pairs FILE", "TASK<TAB>CANDIDATE", "ref_code", "custom_code", "--out FILE.jsonl",
                           "fast_1.0", "cuda:0,cuda:1", "docs/eval-sets.md"})
    CHECK_MESSAGE(r.out.find(text) != std::string::npos, "help lacks " << text);
}

TEST_CASE("a set folder: each DIR/variants/TASK/*.py against DIR/TASK.py, one record per pair, a summary that agrees") {
  temp_dir tmp;
  const auto dir = tmp.path() / "suite";
  copy_into(suite / "01_relu_scale.py", dir / "01_relu_scale.py");
  copy_into(suite / "02_silu_bias_residual.py", dir / "02_silu_bias_residual.py");
  copy_into(suite / "03_softmax_rows.py", dir / "03_softmax_rows.py"); // no candidates: no pairs
  const auto v1 = dir / "variants" / "01_relu_scale";
  copy_into(suite / "variants" / "01_relu_scale" / "fast_inplace.py", v1 / "fast_inplace.py");
  copy_into(suite / "variants" / "01_relu_scale" / "wrong_clamp_before_shift.py", v1 / "wrong_clamp_before_shift.py");
  copy_into(candidates / "hack_threads.py", v1 / "hack_threads.py");
  copy_into(suite / "variants" / "02_silu_bias_residual" / "fast_addcmul.py",
       dir / "variants" / "02_silu_bias_residual" / "fast_addcmul.py");
  const auto out = tmp.path() / "records.jsonl";

  auto r = eval_set({"--set-dir", dir.string(), "--out", out.string(), "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto records = read_records(out);
  REQUIRE(records.size() == 4);
  auto pairs = by_pair(records, 4);
  // The suite's order: task, then the candidate's file name.
  const std::vector<std::pair<fs::path, fs::path>> expected = {
    {dir / "01_relu_scale.py", v1 / "fast_inplace.py"},
    {dir / "01_relu_scale.py", v1 / "hack_threads.py"},
    {dir / "01_relu_scale.py", v1 / "wrong_clamp_before_shift.py"},
    {dir / "02_silu_bias_residual.py", dir / "variants" / "02_silu_bias_residual" / "fast_addcmul.py"}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& rec = pairs.at(static_cast<std::int64_t>(i + 1));
    CAPTURE(i);
    CHECK(str(rec, "task") == expected[i].first.string());
    CHECK(str(rec, "candidate") == expected[i].second.string());
    CHECK(str(rec, "device") == "cpu");
    check_verdict_fields(rec);
  }
  CHECK(str(pairs.at(1), "status") == "ok");
  CHECK(str(pairs.at(2), "status") == "rejected");
  CHECK(pairs.at(2).find("checks_failed")->as_array().at(0).as_string() == "static:threads");
  CHECK(str(pairs.at(3), "status") == "incorrect");
  CHECK(str(pairs.at(4), "status") == "ok");

  auto summary = parse(r.out);
  check_summary(summary, records, 4);
  CHECK(count(summary, "evaluated") == 4);
  CHECK(count(summary, "resumed") == 0);
  CHECK(str(summary, "out") == out.string());
  // One progress line per pair, counting up to 4/4, with credited, refused and the ETA.
  auto progress = progress_lines(r.err);
  REQUIRE(progress.size() == 4);
  for (std::size_t i = 0; i < progress.size(); ++i)
    CHECK(progress[i].rfind("[" + std::to_string(i + 1) + "/4] credited ", 0) == 0);
  CHECK(progress.back().find("refused 1") != std::string::npos);
  CHECK(progress.back().find("ETA 0s") != std::string::npos);

  // The table names the same numbers.
  auto table = eval_set({"--set-dir", dir.string(), "--out", out.string()});
  REQUIRE(table.exit_code == 0);
  CHECK(table.out.find("pairs          4 (0 recorded now, 4 resumed from --out)") != std::string::npos);
  CHECK(table.out.find("checks failed  static:threads 1") != std::string::npos);
  CHECK(table.out.find("fast_1.0") != std::string::npos);
}

TEST_CASE("a TSV list: paths relative to its folder, bad files as error records, and a rerun that resumes and drops a cut last line") {
  temp_dir tmp;
  const auto files = tmp.path() / "files";
  copy_into(suite / "01_relu_scale.py", files / "relu.py");
  copy_into(suite / "variants" / "01_relu_scale" / "fast_inplace.py", files / "fast.py");
  copy_into(candidates / "fail_syntax.py", files / "syntax.py");
  copy_into(candidates / "fail_wrong.py", files / "wrong.py");
  std::ofstream(files / "not_a_task.py") << "import torch\n";
  const auto list = tmp.path() / "lists" / "pairs.tsv";
  fs::create_directories(list.parent_path());
  std::ofstream(list) << "# task\tcandidate\n"
                      << "../files/relu.py\t../files/fast.py\n"
                      << "../files/relu.py\t../files/syntax.py\n"
                      << "\n"
                      << "../files/relu.py\t../files/missing.py\n"
                      << "../files/not_a_task.py\t../files/fast.py\n"
                      << (files / "relu.py").string() << "\t../files/wrong.py\r\n"
                      << "../files/relu.py\t../files/fast.py\n"; // the first pair again: evaluated once
  const auto relu = (files / "relu.py").string();
  const auto out = tmp.path() / "out.jsonl";

  auto r = eval_set({"--pairs", list.string(), "--out", out.string(), "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find(list.string() + ":8: the same pair as line 2: evaluated once") != std::string::npos);
  auto records = read_records(out);
  REQUIRE(records.size() == 5);
  auto pairs = by_pair(records, 5);
  CHECK(str(pairs.at(1), "task") == relu);
  CHECK(str(pairs.at(1), "candidate") == (files / "fast.py").string());
  CHECK(pairs.at(1).find("line")->as_int() == 2);
  CHECK(str(pairs.at(1), "status") == "ok");
  CHECK(str(pairs.at(2), "status") == "compile_error");
  CHECK(str(pairs.at(3), "status") == "error");
  CHECK(str(pairs.at(3), "message").find("missing.py") != std::string::npos);
  CHECK(pairs.at(3).find("device")->is_null());
  CHECK(str(pairs.at(4), "status") == "error");
  CHECK(str(pairs.at(4), "message").find("not a KernelBench task") != std::string::npos);
  CHECK(str(pairs.at(5), "status") == "incorrect");
  CHECK(str(pairs.at(5), "task") == relu); // an absolute path stays as it is
  CHECK(pairs.at(5).find("line")->as_int() == 7);
  check_summary(parse(r.out), records, 5);
  CHECK(progress_lines(r.err).size() == 5);

  // An interrupted run: pair 1's record (its speedup changed, to tell it from a new
  // measurement), pair 3's, and pair 2's cut in the middle, as a writer killed mid-line leaves it.
  const auto lines = lines_of(read_text(out));
  auto line_of = [&](std::int64_t pair) {
    for (const auto& l : lines)
      if (parse(l).find("pair")->as_int() == pair)
        return l;
    FAIL("no line for pair " << pair);
    return std::string{};
  };
  auto kept = line_of(1);
  const auto at = kept.find("\"speedup\":");
  REQUIRE(at != std::string::npos);
  kept = kept.substr(0, at) + "\"speedup\":1.1" + kept.substr(kept.find(',', at));
  const auto partial = tmp.path() / "partial.jsonl";
  const auto cut = line_of(2).substr(0, line_of(2).size() / 2);
  std::ofstream(partial) << kept << "\n" << line_of(3) << "\n" << cut;

  auto resumed = eval_set({"--pairs", list.string(), "--out", partial.string(), "--json"});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.err.find(partial.string() + ":3: dropped an incomplete record") != std::string::npos);
  CHECK(resumed.err.find("2 of 5 pairs already recorded") != std::string::npos);
  auto after = read_records(partial);
  REQUIRE(after.size() == 5);
  auto again = by_pair(after, 5);
  CHECK(lines_of(read_text(partial)).at(0) == kept); // kept as it was, not measured again
  CHECK(again.at(1).find("speedup")->as_double() == 1.1);
  CHECK(str(again.at(2), "status") == "compile_error");
  CHECK(str(again.at(4), "status") == "error");
  CHECK(str(again.at(5), "status") == "incorrect");
  auto summary = parse(resumed.out);
  check_summary(summary, after, 5);
  CHECK(count(summary, "resumed") == 2);
  CHECK(count(summary, "evaluated") == 3);
  // The one ok verdict is the kept one: credited (above 1.01x), fast_1.0 but not fast_1.2.
  CHECK(summary.find("median_speedup")->as_double() == 1.1);
  CHECK(count(summary, "credited") == 1);
  CHECK(summary.find("fast_p")->find("1.0")->as_double() == doctest::Approx(0.2));
  CHECK(summary.find("fast_p")->find("1.2")->as_double() == 0);
  // Progress counts from the records already there.
  auto progress = progress_lines(resumed.err);
  REQUIRE(progress.size() == 3);
  CHECK(progress.front().rfind("[3/5]", 0) == 0);
  CHECK(progress.back().rfind("[5/5]", 0) == 0);

  // Everything recorded: nothing is evaluated, no evaluator starts, the summary is the same.
  auto done = eval_set({"--pairs", list.string(), "--out", partial.string(), "--json"});
  REQUIRE(done.exit_code == 0);
  CHECK(done.err.find("to evaluate") == std::string::npos);
  CHECK(read_records(partial).size() == 5);
  auto same = parse(done.out);
  check_summary(same, after, 5);
  CHECK(count(same, "evaluated") == 0);
  CHECK(count(same, "resumed") == 5);
}

TEST_CASE("a CUDA-L1 JSONL: sources from ref_code and custom_code, ids and line in the record, other fields echoed") {
  temp_dir tmp;
  const auto relu = read_text(suite / "01_relu_scale.py");
  const auto silu = read_text(suite / "02_silu_bias_residual.py");
  const auto file = tmp.path() / "release.jsonl";
  std::ofstream(file) << "{\"level_id\":1,\"task_id\":1,\"ref_code\":" << json_string(relu)
                      << ",\"custom_code\":" << json_string(read_text(suite / "variants/01_relu_scale/fast_inplace.py"))
                      << ",\"custom_speedup\":1.5,\"note\":\"theirs\"}\n"
                      << "\n"
                      << "{\"level_id\":1,\"task_id\":2,\"ref_code\":" << json_string(silu) << ",\"custom_code\":"
                      << json_string(read_text(suite / "variants/02_silu_bias_residual/wrong_gate_without_bias.py"))
                      << ",\"score_default\":[0.9,null]}\n"
                      << "{\"level_id\":2,\"task_id\":\"7\",\"ref_code\":" << json_string(relu)
                      << ",\"custom_code\":null}\n" // CUDA-L1's lines without a kernel, null or "None"
                      << "{\"level_id\":2,\"task_id\":8,\"ref_code\":" << json_string(relu) << ",\"custom_code\":\"None\"}\n";
  const auto out = tmp.path() / "verdicts.jsonl";
  auto r = eval_set({"--pairs", file.string(), "--out", out.string(), "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto records = read_records(out);
  REQUIRE(records.size() == 4);
  auto pairs = by_pair(records, 4);
  const auto& first = pairs.at(1);
  CHECK(first.find("level_id")->as_int() == 1);
  CHECK(first.find("task_id")->as_int() == 1);
  CHECK(first.find("line")->as_int() == 1);
  CHECK(str(first, "candidate") == file.string() + ":1");
  CHECK(str(first, "status") == "ok");
  CHECK(str(first, "device") == "cpu");
  check_verdict_fields(first);
  const auto* input = first.find("input");
  REQUIRE(input != nullptr);
  CHECK(input->find("custom_speedup")->as_double() == 1.5);
  CHECK(input->find("note")->as_string() == "theirs");
  CHECK(input->find("ref_code") == nullptr);
  CHECK(input->find("custom_code") == nullptr);
  CHECK(pairs.at(2).find("line")->as_int() == 3);
  CHECK(str(pairs.at(2), "status") == "incorrect");
  CHECK(pairs.at(2).find("input")->find("score_default")->as_array().size() == 2);
  CHECK(str(pairs.at(3), "status") == "error");
  CHECK(str(pairs.at(3), "message").find("custom_code is empty") != std::string::npos);
  CHECK(pairs.at(3).find("task_id")->as_string() == "7");
  CHECK(str(pairs.at(4), "status") == "error");
  CHECK(str(pairs.at(4), "message").find("\"None\"") != std::string::npos);
  auto summary = parse(r.out);
  check_summary(summary, records, 4);
  CHECK(count(summary, "evaluated") == 4);
  CHECK(r.err.find(file.string() + ":4: custom_code is empty") != std::string::npos);
}

TEST_CASE("bad input: exit 2 naming the flag, file and line at fault, and nothing is evaluated") {
  temp_dir tmp;
  auto expect_usage = [&](std::vector<std::string> args, const std::string& named) {
    auto r = eval_set(std::move(args));
    CAPTURE(named);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.err.find(named) != std::string::npos, r.err);
    CHECK(r.err.find("to evaluate") == std::string::npos);
  };
  const auto task = (suite / "01_relu_scale.py").string();
  const auto cand = (suite / "variants/01_relu_scale/fast_inplace.py").string();
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(tmp.path() / name) << text;
    return (tmp.path() / name).string();
  };

  // The set itself.
  expect_usage({"--set-dir", (tmp.path() / "nope").string()}, (tmp.path() / "nope").string() + ": not a directory");
  fs::create_directories(tmp.path() / "bare");
  std::ofstream(tmp.path() / "bare" / "01_relu_scale.py") << read_text(suite / "01_relu_scale.py");
  expect_usage({"--set-dir", (tmp.path() / "bare").string()}, "no variants folder");
  fs::create_directories(tmp.path() / "bare" / "variants" / "other");
  expect_usage({"--set-dir", (tmp.path() / "bare").string()}, "no candidates");
  expect_usage({"--pairs", (tmp.path() / "missing.tsv").string()}, (tmp.path() / "missing.tsv").string());
  auto tsv = write("one_field.tsv", task + "\t" + cand + "\n" + task + "\n");
  expect_usage({"--pairs", tsv}, tsv + ":2: expected TASK<TAB>CANDIDATE");
  tsv = write("three_fields.tsv", "# header\n" + task + "\t" + cand + "\tx\n");
  expect_usage({"--pairs", tsv}, tsv + ":2: expected TASK<TAB>CANDIDATE (two paths separated by a tab), got 3 fields");
  tsv = write("spaces.tsv", task + " " + cand + "\n");
  expect_usage({"--pairs", tsv}, tsv + ":1: expected TASK<TAB>CANDIDATE");
  expect_usage({"--pairs", write("empty.tsv", "# nothing\n")}, "no pairs");
  const std::string line1 = "{\"level_id\":1,\"task_id\":1,\"ref_code\":\"x\",\"custom_code\":\"y\"}\n";
  auto jsonl = write("bad.jsonl", line1 + "{\"level_id\":1,\"task_id\":2,\"ref_code\":\"x\",\n");
  expect_usage({"--pairs", jsonl}, jsonl + ":2: not JSON");
  jsonl = write("no_custom.jsonl", "{\"level_id\":1,\"task_id\":1,\"ref_code\":\"x\"}\n");
  expect_usage({"--pairs", jsonl}, jsonl + ":1: no custom_code");
  jsonl = write("no_ref.jsonl", line1 + line1 + "{\"custom_code\":\"y\"}\n");
  expect_usage({"--pairs", jsonl}, jsonl + ":3: no ref_code");
  jsonl = write("number.jsonl", "{\"ref_code\":3,\"custom_code\":\"y\"}\n");
  expect_usage({"--pairs", jsonl}, jsonl + ":1: ref_code is a JSON integer, expected a string");
  jsonl = write("array.jsonl", "[1,2]\n");
  expect_usage({"--pairs", jsonl}, jsonl + ":1: a JSON array, expected an object");
  expect_usage({"--pairs", write("pairs.csv", task + "," + cand + "\n")}, "cannot tell the format");
  const auto good = write("good.tsv", task + "\t" + cand + "\n");
  expect_usage({"--pairs", good, "--format", "xml"}, "--format xml: expected tsv or jsonl");

  // Flags that do not go together.
  expect_usage({"--pairs", good, "--set-dir", tmp.path().string()}, "give one of --set-dir DIR and --pairs FILE");
  expect_usage({"--pairs", good, "--task", task}, "--task is for one pair");
  expect_usage({"--pairs", good, "--repeat", "3"}, "--repeat is for one pair");
  expect_usage({"--pairs", good, "--device", "gpu"}, "--device: \"gpu\" is not a device; expected cpu, cuda or cuda:N");
  expect_usage({"--pairs", good, "--device", "cpu,cpu"}, "--device cpu: given twice");
  expect_usage({"--task", task, "--candidate", cand, "--out", (tmp.path() / "o.jsonl").string()},
               "--out is for a set of pairs");
  expect_usage({"--task", task, "--candidate", cand, "--device", "cpu"}, "one pair is evaluated on one --device");
  expect_usage({"--pairs", good, "--out", good}, "is the set itself");

  // An --out file that is not this set's records.
  auto out = write("corrupt.jsonl", "not a record\n{\"pair\":1,\"task\":\"" + task + "\",\"candidate\":\"" + cand
                                     + "\",\"status\":\"ok\",\"correct\":true,\"speedup\":1.5,\"checks_failed\":[]}\n");
  expect_usage({"--pairs", good, "--out", out}, out + ":1: not a record of crucible eval");
  out = write("other.jsonl", "{\"pair\":1,\"task\":\"a.py\",\"candidate\":\"b.py\",\"status\":\"ok\",\"correct\":true,"
                             "\"speedup\":1.5,\"checks_failed\":[]}\n");
  expect_usage({"--pairs", good, "--out", out}, "none of them a pair of this set");
  CHECK(read_text(out).find("b.py") != std::string::npos); // left as it was
  // An --out file another run holds.
  out = (tmp.path() / "held.jsonl").string();
  const int fd = ::open(out.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  expect_usage({"--pairs", good, "--out", out}, "another crucible eval is writing it");
  ::close(fd);
}

TEST_CASE("the summary's numbers from known records: credited above the win threshold, fast_p over all pairs, mean and median") {
  temp_dir tmp;
  // Seven pairs, all recorded already (their files need not exist: nothing is evaluated), in a
  // list whose extension does not say its format.
  const std::vector<std::string> rows = {
    R"("status":"ok","correct":true,"speedup":0.9,"checks_failed":[])",
    R"("status":"ok","correct":true,"speedup":1.005,"checks_failed":[])",
    R"("status":"ok","correct":true,"speedup":1.1,"checks_failed":[])",
    R"("status":"ok","correct":true,"speedup":1.5,"checks_failed":[])",
    R"("status":"rejected","correct":true,"speedup":null,"checks_failed":["runtime:threads","runtime:below_floor"])",
    R"("status":"rejected","correct":false,"speedup":null,"checks_failed":["runtime:threads"])",
    R"("status":"error","correct":false,"speedup":null,"checks_failed":[])"};
  std::ofstream list(tmp.path() / "set.list");
  std::ofstream out(tmp.path() / "out.jsonl");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto task = (tmp.path() / ("t" + std::to_string(i) + ".py")).string();
    const auto cand = (tmp.path() / ("c" + std::to_string(i) + ".py")).string();
    list << task << "\t" << cand << "\n";
    out << "{\"pair\":" << i + 1 << ",\"task\":" << json_string(task) << ",\"candidate\":" << json_string(cand)
        << ",\"device\":" << (i == 6 ? "null" : "\"cuda:" + std::to_string(i % 2) + "\"") << "," << rows[i] << "}\n";
  }
  list.close();
  out.close();
  auto r = eval_set({"--pairs", (tmp.path() / "set.list").string(), "--format", "tsv", "--out",
                     (tmp.path() / "out.jsonl").string(), "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("to evaluate") == std::string::npos);
  auto s = parse(r.out);
  check_summary(s, read_records(tmp.path() / "out.jsonl"), 7);
  CHECK(count(s, "credited") == 2); // 1.1 and 1.5; 1.005 is within the win threshold
  CHECK(count(s, "ok") == 4);
  CHECK(s.find("fast_p")->find("1.0")->as_double() == doctest::Approx(3.0 / 7)); // 1.005, 1.1, 1.5
  CHECK(s.find("fast_p")->find("1.2")->as_double() == doctest::Approx(1.0 / 7));
  CHECK(s.find("median_speedup")->as_double() == doctest::Approx((1.005 + 1.1) / 2));
  CHECK(s.find("geomean_speedup")->as_double() == doctest::Approx(std::pow(0.9 * 1.005 * 1.1 * 1.5, 0.25)));
  CHECK(s.find("checks_failed")->find("runtime:threads")->as_int() == 2);
  CHECK(s.find("checks_failed")->find("runtime:below_floor")->as_int() == 1);
  CHECK(s.find("devices")->find("cuda:0")->as_int() == 3);
  CHECK(s.find("devices")->find("cuda:1")->as_int() == 3);
  CHECK(s.find("by_status")->find("error")->as_int() == 1);
  auto table = eval_set({"--pairs", (tmp.path() / "set.list").string(), "--format=tsv", "--out",
                         (tmp.path() / "out.jsonl").string()});
  REQUIRE(table.exit_code == 0);
  CHECK(table.out.find("credited       2 (status ok and speedup above 1.01x)") != std::string::npos);
  CHECK(table.out.find("status         error 1, ok 4, rejected 2") != std::string::npos);
  CHECK(table.out.find("checks failed  runtime:below_floor 1, runtime:threads 2") != std::string::npos);
  CHECK(table.out.find("fast_1.0       0.429 (3 of 7)") != std::string::npos);
  CHECK(table.out.find("fast_1.2       0.143 (1 of 7)") != std::string::npos);
  CHECK(table.out.find("devices        cuda:0 3, cuda:1 3") != std::string::npos);
}
