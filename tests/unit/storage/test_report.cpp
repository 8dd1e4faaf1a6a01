// tests/unit/storage/test_report.cpp: report data from synthetic metrics records, the page around
// the plots tools/report_plots.py drew (and its line when there are none), the plots' manifest,
// and errors naming file, line and key.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "storage/report.hpp"
#include "storage_test_util.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::storage::test::temp_dir;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// A run directory holding `metrics` as its metrics.jsonl.
fs::path make_run(const temp_dir& tmp, const std::string& metrics) {
  auto run = tmp.path() / "r1";
  fs::create_directories(run);
  write(run / "config.yaml", "run:\n  name: r1\n");
  write(run / "status.json", R"({"state":"finished","stage":"","step":3,"best_speedup":1.5})" "\n");
  write(run / "events.log", "2026-01-01T00:00:00Z info [coordinator] run_started\n");
  write(run / "metrics.jsonl", metrics);
  return run;
}

const char* lifecycle_only =
    R"({"event":"run_started","time":"t","state":"running","stage":"","step":0,"policy_version":0,"variants":0,"best_speedup":null,"mean_speedup":null,"dropped_stale":0})" "\n"
    R"({"event":"run_finished","time":"t","state":"finished","stage":"","step":0,"policy_version":0,"variants":0,"best_speedup":null,"mean_speedup":null,"dropped_stale":0})" "\n";

const char* full =
    R"({"event":"run_started","step":0,"best_speedup":null,"mean_speedup":null})" "\n"
    R"({"event":"train_step","step":1,"mean_reward":0.25,"loss":1.0})" "\n"
    R"({"event":"train_step","step":2,"mean_reward":0.5,"correct_share":0.5,"best_speedup":1.2,"mean_speedup":0.9})" "\n"
    R"({"kind":"verdict","task":"softmax","status":"correct","speedup":1.4,"hardware":"h100"})" "\n"
    R"({"kind":"verdict","task":"softmax","status":"correct","speedup":2.0,"hardware":"h200"})" "\n"
    R"({"kind":"verdict","task":"matmul","status":"wrong_result","speedup":null})" "\n"
    R"({"kind":"verdict","task":"matmul","status":"compile_error"})" "\n"
    R"({"event":"something_new","x":[1,2]})" "\n"
    R"({"event":"run_finished","step":2,"best_speedup":2.0,"mean_speedup":1.1})" "\n";

} // namespace

TEST_CASE("report data counts records by kind and accepts each kind's fields") {
  std::vector<std::string> lines;
  std::istringstream in(full);
  for (std::string l; std::getline(in, l);)
    lines.push_back(l);
  auto d = collect_report_data(lines, "m.jsonl");
  REQUIRE_MESSAGE(d.ok(), (d.ok() ? std::string{} : d.error().message));
  CHECK(d->kinds.at("something_new") == 1);
  CHECK(d->kinds.at("train_step") == 2);
  CHECK(d->kinds.at("run_finished") == 1);
  CHECK(d->by_turn.empty()); // no verdict with a turn
  CHECK(d->kinds.at("verdict") == 4);
}

TEST_CASE("a run without plots says why on the page, and keeps its tables") {
  temp_dir tmp;
  auto run = make_run(tmp, lifecycle_only);
  auto files = write_report(run, run / "report", {});
  REQUIRE(files.ok());
  CHECK(files->html == run / "report" / "report.html");
  CHECK(files->pngs.empty());
  auto html = slurp(files->html);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(contains(html, "<h2>Plots</h2>\n<p class=\"no-data\">No records to plot yet.</p>"));
  CHECK(contains(html, "<td>state</td><td>finished</td>"));
  CHECK(contains(html, "2 metrics records: run_finished 1, run_started 1."));
  CHECK(contains(html, "[coordinator] run_started"));
  // Plots that could not be drawn: the reason, as the caller gave it.
  files = write_report(run, run / "report", report_plots{{}, "No plots: python3 cannot import matplotlib & co"});
  REQUIRE(files.ok());
  CHECK(contains(slurp(files->html), "<p class=\"no-data\">No plots: python3 cannot import matplotlib &amp; co</p>"));
}

TEST_CASE("the report shows the share of time each GPU was held by evaluations and by the policy") {
  temp_dir tmp;
  auto run = make_run(tmp, lifecycle_only);
  write(run / "status.json",
        R"({"state":"paused","stage":"rl","step":3,"devices":[)"
        R"({"device":"cuda:0","seconds":200,"evaluation_s":50,"policy_s":120,"evaluator":true},)"
        R"({"device":"cuda:1","seconds":200,"evaluation_s":150.5,"policy_s":0,"evaluator":true}]})" "\n");
  auto files = write_report(run, run / "report", {});
  REQUIRE(files.ok());
  auto html = slurp(files->html);
  CHECK(contains(html, "<h2>GPU busy</h2>"));
  CHECK(contains(html, "<tr><td>cuda:0</td><td>25.0%</td><td>60.0%</td><td>200</td></tr>"));
  CHECK(contains(html, "<tr><td>cuda:1</td><td>75.2%</td><td>0.0%</td><td>200</td></tr>"));
  CHECK_FALSE(contains(html, "<td>devices</td>")); // not repeated as raw JSON in the status table
  // A record that says what runs on each GPU names it beside the GPU.
  write(run / "status.json",
        R"({"state":"paused","stage":"rl","step":3,"devices":[)"
        R"({"device":"cuda:0","seconds":200,"evaluation_s":0,"policy_s":180,"evaluator":false,"engine":true,"learner":false},)"
        R"({"device":"cuda:1","seconds":200,"evaluation_s":40,"policy_s":30,"evaluator":true,"engine":false,"learner":true}]})"
        "\n");
  files = write_report(run, run / "report", {});
  REQUIRE(files.ok());
  html = slurp(files->html);
  CHECK(contains(html, "<tr><td>cuda:0 (engine)</td><td>0.0%</td><td>90.0%</td><td>200</td></tr>"));
  CHECK(contains(html, "<tr><td>cuda:1 (learner, evaluator)</td><td>20.0%</td><td>15.0%</td><td>200</td></tr>"));
  // A run without GPUs (the CPU) has no such table.
  write(run / "status.json", R"({"state":"finished","stage":"","step":3})" "\n");
  files = write_report(run, run / "report", {});
  REQUIRE(files.ok());
  CHECK_FALSE(contains(slurp(files->html), "GPU busy"));
}

TEST_CASE("the page shows the drawn plots in their order with their captions, and the manifest is read strictly") {
  temp_dir tmp;
  // The last line is torn (no newline): ignored, as read_metrics does.
  auto run = make_run(tmp, std::string{full} + R"({"event":"train_step","step":3,"mean_rew)");
  auto out = tmp.path() / "elsewhere";
  auto plots = parse_plot_manifest(
      R"({"plots": [{"id": "sft_loss", "file": "sft_loss.png", "title": "SFT: loss", "caption": "Loss <by> step."},)"
      R"( {"id": "rl_steps", "file": "rl_steps.png", "title": "RL", "caption": "4 panels \u00d7"}]})");
  REQUIRE(plots.ok());
  REQUIRE(plots->size() == 2);
  CHECK((*plots)[1].caption == "4 panels \u00d7");
  auto files = write_report(run, out, report_plots{*plots, ""});
  REQUIRE(files.ok());
  CHECK(files->html == out / "report.html");
  CHECK(files->pngs == std::vector<fs::path>{out / "sft_loss.png", out / "rl_steps.png"});
  auto html = slurp(files->html);
  const auto first = html.find("<figure id=\"sft_loss\">\n<img src=\"sft_loss.png\" alt=\"SFT: loss\">\n"
                               "<figcaption>Loss &lt;by&gt; step.</figcaption>\n</figure>");
  const auto second = html.find("<figure id=\"rl_steps\">");
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  CHECK(first < second);
  CHECK_FALSE(contains(html, "No records to plot yet"));
  CHECK(contains(html, "9 metrics records"));
  // A manifest that is not the script's, or names a file outside the report's folder, is refused.
  for (const char* bad : {"[]", R"({"plots": {}})", R"({"plots": [{"id": "a", "file": "a.png", "title": "t"}]})",
                          R"({"plots": [{"id": "a", "file": "../a.png", "title": "t", "caption": ""}]})",
                          R"({"plots": [{"id": "a", "file": ".png", "title": "t", "caption": ""}]})",
                          R"({"plots": [{"id": "a", "file": "a.svg", "title": "t", "caption": ""}]})", "not json"}) {
    CAPTURE(bad);
    auto r = parse_plot_manifest(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::corrupt);
  }
}

TEST_CASE("multi-turn verdicts get the correct share and speedup by turn, in the data and the page") {
  // Turn 0: 3 samples, 1 correct at 1.5x (a correct flag without ok does not count); turn 1: 2
  // samples, 2 correct at 2x and 3x. One-turn verdicts (no `turn`) are not in the table.
  const std::string metrics =
      R"({"event":"verdict","task":"a","status":"ok","correct":true,"speedup":1.5,"turn":0})" "\n"
      R"({"event":"verdict","task":"a","status":"incorrect","correct":false,"speedup":null,"turn":0})" "\n"
      R"({"event":"verdict","task":"b","status":"runtime_error","correct":true,"speedup":null,"turn":0})" "\n"
      R"({"event":"verdict","task":"a","status":"ok","correct":true,"speedup":2.0,"turn":1})" "\n"
      R"({"event":"verdict","task":"b","status":"ok","correct":true,"speedup":3.0,"turn":1})" "\n"
      R"({"event":"verdict","task":"b","status":"ok","correct":true,"speedup":9.0})" "\n";
  auto lines = std::vector<std::string>{};
  for (std::size_t at = 0, next; at < metrics.size(); at = next + 1) {
    next = metrics.find('\n', at);
    lines.push_back(metrics.substr(at, next - at));
  }
  auto d = collect_report_data(lines, "m");
  REQUIRE(d.ok());
  REQUIRE(d->by_turn.size() == 2);
  CHECK(d->by_turn.at(0).samples == 3);
  CHECK(d->by_turn.at(0).correct == 1);
  CHECK(d->by_turn.at(0).mean_speedup() == doctest::Approx(1.5));
  CHECK(d->by_turn.at(1).samples == 2);
  CHECK(d->by_turn.at(1).correct_share() == doctest::Approx(1.0));
  CHECK(d->by_turn.at(1).mean_speedup() == doctest::Approx(2.5));
  CHECK(to_string(0, d->by_turn.at(0)) == "turn 1: 3 samples, 33.3% correct, mean speedup of correct samples 1.50x");
  temp_dir tmp;
  auto run = make_run(tmp, metrics);
  auto files = write_report(run, run / "report", {});
  REQUIRE(files.ok());
  auto html = slurp(files->html);
  CHECK(contains(html, "<h2>By turn</h2>"));
  CHECK(contains(html, "turn 2: 2 samples, 100.0% correct, mean speedup of correct samples 2.50x"));
  // A run without turns has no such section.
  auto plain = make_run(tmp, lifecycle_only);
  REQUIRE(write_report(plain, plain / "report", {}).ok());
  CHECK_FALSE(contains(slurp(plain / "report" / "report.html"), "By turn"));
}

TEST_CASE("bad runs and bad records are refused naming the file, the line and the key") {
  temp_dir tmp;
  auto missing = write_report(tmp.path() / "nope", tmp.path() / "out", {});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);
  CHECK(contains(missing.error().message, (tmp.path() / "nope").string()));

  auto run = make_run(tmp, std::string{lifecycle_only} + R"({"event":"train_step","step":"3","mean_reward":0.1})" "\n");
  auto metrics = (run / "metrics.jsonl").string();
  auto r = write_report(run, run / "report", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::corrupt);
  CHECK(r.error().message == metrics + ":3: key 'step': expected a non-negative integer, got string");
  CHECK_FALSE(fs::exists(run / "report" / "report.html"));

  write(run / "metrics.jsonl", R"({"kind":"verdict","task":"a","status":"correct","speedup":"fast"})" "\n");
  r = write_report(run, run / "report", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == metrics + ":1: key 'speedup': expected a number or null, got string");

  write(run / "metrics.jsonl", std::string{lifecycle_only} + R"({"kind":"verdict","status":"correct"})" "\n");
  r = write_report(run, run / "report", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == metrics + ":3: key 'task': missing");

  write(run / "metrics.jsonl", R"({"step":1})" "\n");
  r = write_report(run, run / "report", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == metrics + ":1: record has no 'event' or 'kind' key");

  write(run / "metrics.jsonl", "[1]\n");
  r = write_report(run, run / "report", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == metrics + ":1: expected a JSON object, got array");

  write(run / "metrics.jsonl", std::string{lifecycle_only} + "{\"event\": }\n");
  r = write_report(run, run / "report", {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::corrupt);
  CAPTURE(r.error().message);
  CHECK(r.error().message.rfind(metrics + ":3:11: ", 0) == 0); // line 3, column 11
}

TEST_CASE("learning progress compares a sampling stage's first and last thirds, pooled over samples") {
  std::vector<std::string> lines = {
    R"({"event":"train_step","stage":"sft","step":1,"loss":2.0})",
    R"({"event":"train_step","stage":"rl","step":2,"samples":8,"correct_share":0.0,"mean_speedup":null})",
    R"({"event":"train_step","stage":"rl","step":3,"samples":8,"correct_share":0.25,"mean_speedup":1.0})",
    R"({"event":"train_step","stage":"rl","step":4,"samples":8,"correct_share":0.5,"mean_speedup":1.5})",
    // Step 5 was done, lost in a crash, and done again: the last record counts.
    R"({"event":"train_step","stage":"rl","step":5,"samples":8,"correct_share":0.0,"mean_speedup":null})",
    R"({"event":"train_step","stage":"rl","step":5,"samples":8,"correct_share":0.75,"mean_speedup":2.0})",
    R"({"event":"train_step","stage":"rl","step":6,"samples":4,"correct_share":1.0,"mean_speedup":3.0})",
    R"({"event":"train_step","stage":"rl","step":7,"samples":8,"correct_share":0.5,"mean_speedup":1.0})",
    "not json",
  };
  auto p = learning_progress(lines);
  REQUIRE(p.size() == 1); // SFT steps have no samples
  CHECK(p[0].stage == "rl");
  CHECK(p[0].steps == 6);
  CHECK(p[0].window == 2);
  CHECK(p[0].first_step == 2);
  CHECK(p[0].last_step == 7);
  CHECK(p[0].first_samples == 16);
  CHECK(p[0].first_correct == doctest::Approx(2.0 / 16));
  CHECK(p[0].first_speedup == doctest::Approx(1.0));
  CHECK(p[0].last_samples == 12);
  CHECK(p[0].last_correct == doctest::Approx(8.0 / 12)); // 4 of 4, then 4 of 8
  CHECK(p[0].last_speedup == doctest::Approx((4 * 3.0 + 4 * 1.0) / 8));
  CHECK(to_string(p[0]).rfind("rl, first 2 against last 2 of 6 steps: correct samples 12.5% -> 66.7%", 0) == 0);
}

TEST_CASE("learning progress weighs each task equally, from the verdicts of the windows' steps") {
  auto verdict = [](int step, const char* task, bool correct, double speedup) {
    std::string sp = correct ? std::to_string(speedup) : std::string{"null"};
    return std::string{R"({"event":"verdict","stage":"rl","step":)"} + std::to_string(step) + R"(,"task":")" + task
           + R"(","status":")" + (correct ? "ok" : "incorrect") + R"(","correct":)" + (correct ? "true" : "false")
           + R"(,"speedup":)" + sp + "}";
  };
  auto step = [](int n, int samples, double share) {
    return R"({"event":"train_step","stage":"rl","step":)" + std::to_string(n) + R"(,"samples":)"
           + std::to_string(samples) + R"(,"correct_share":)" + std::to_string(share) + "}";
  };
  std::vector<std::string> lines = {
    R"({"event":"run_started"})",
    R"({"event":"verdict","stage":"warm_start","step":0,"task":"a","correct":true,"speedup":9.0})",
    // Step 10 (the first window): task a twice (one correct at 2x), task b once (correct, 20x).
    verdict(10, "a", true, 2.0), verdict(10, "a", false, 0), verdict(10, "b", true, 20.0), step(11, 3, 2.0 / 3),
    // Step 11 (the middle): task c only.
    verdict(11, "c", true, 1.0), step(12, 1, 1.0),
    // Step 12 (the last window), first sampled before a crash, then again after the resume.
    verdict(12, "a", false, 0), R"({"event":"run_resumed"})",
    verdict(12, "a", true, 3.0), verdict(12, "a", true, 5.0), verdict(12, "b", true, 10.0), verdict(12, "b", false, 0),
    verdict(12, "c", true, 7.0), step(13, 5, 0.8),
  };
  auto p = learning_progress(lines);
  REQUIRE(p.size() == 1);
  CHECK(p[0].window == 1);
  // Task c was not sampled in the first window: only a and b are compared.
  REQUIRE(p[0].tasks.size() == 2);
  CHECK(p[0].tasks[0].task == "a");
  CHECK(p[0].tasks[0].first_samples == 2);
  CHECK(p[0].tasks[0].last_samples == 2); // the verdict before the crash is replaced
  CHECK(p[0].tasks[0].first_correct == doctest::Approx(0.5));
  CHECK(p[0].tasks[0].last_correct == doctest::Approx(1.0));
  CHECK(p[0].tasks[0].first_speedup == doctest::Approx(2.0));
  CHECK(p[0].tasks[0].last_speedup == doctest::Approx(4.0));
  CHECK(p[0].tasks[1].task == "b");
  CHECK(p[0].tasks[1].last_correct == doctest::Approx(0.5));
  CHECK(p[0].first_task_correct == doctest::Approx((0.5 + 1.0) / 2));
  CHECK(p[0].last_task_correct == doctest::Approx((1.0 + 0.5) / 2));
  CHECK(p[0].speedup_tasks == 2);
  CHECK(p[0].first_task_speedup == doctest::Approx((2.0 + 20.0) / 2));
  CHECK(p[0].last_task_speedup == doctest::Approx((4.0 + 10.0) / 2));
  // Pooled, the speedup fell (mostly task b's 20x in the first window); per task it did not fall for a.
  CHECK(to_string(p[0]).find("; each of the 2 tasks sampled in both weighted equally: correct 75.0% -> 75.0%, "
                             "mean speedup 11.00x -> 7.00x")
        != std::string::npos);
  CHECK(to_string(p[0].tasks[0]) == "a: correct 50.0% -> 100.0%, mean speedup 2.00x -> 4.00x (2 and 2 samples)");
}
