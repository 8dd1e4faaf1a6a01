// `crucible report` in real processes: on a run made by `crucible train configs/quickstart.yaml`,
// on a run with SFT and RL records (its plots read back by matplotlib), without matplotlib, and on
// bad input.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "process.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::run_process;
using crucible::testing::temp_dir;

namespace {

auto cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Reads a PNG with matplotlib's own reader; prints "WIDTHxHEIGHT".
const char* png_size = "import sys, matplotlib.image as m; a = m.imread(sys.argv[1]); print(f'{a.shape[1]}x{a.shape[0]}')";

} // namespace

TEST_CASE("crucible report on a quickstart run writes report.html and says what has no data yet") {
  temp_dir tmp;
  auto train = cli({"train", std::string{CRUCIBLE_SOURCE_DIR} + "/configs/quickstart.yaml", "--set", "stages.sft.steps=0", "--set",
                    "stages.rl.steps=0", "--set", "tasks.warm_start=false", "--set", "evaluator.warm_workers=0", "--set",
                    "tasks.suite=" + std::string{CRUCIBLE_SOURCE_DIR} + "/env/tasks/cpu", "--set",
                    "run.dir=" + tmp.path().string(), "--set", "log.level=warn"});
  INFO(train.err);
  REQUIRE(train.exit_code == 0);
  auto run = tmp.path() / "quickstart";
  auto r = cli({"report", run.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto html_path = run / "report" / "report.html";
  CHECK(r.out.rfind(html_path.string() + "\n", 0) == 0);
  auto html = slurp(html_path);
  CHECK(contains(html, "<h1>Run quickstart</h1>"));
  CHECK(contains(html, "<td>state</td><td>finished</td>"));
  CHECK(contains(html, "run_started 1"));
  CHECK(contains(html, "run_finished 1"));
  // Every plot listed was drawn, and is on the page with its caption.
  std::istringstream lines(r.out);
  std::string line;
  std::getline(lines, line); // report.html
  while (std::getline(lines, line) && line.rfind("learning:", 0) != 0 && line.rfind("pace:", 0) != 0) {
    CAPTURE(line);
    CHECK(fs::exists(line));
    CHECK(contains(html, "<img src=\"" + fs::path{line}.filename().string() + "\""));
  }
}

TEST_CASE("crucible report --out draws SFT and RL apart with matplotlib, each plot on the page with its caption") {
  temp_dir tmp;
  auto run = tmp.path() / "r";
  fs::create_directories(run);
  std::ofstream(run / "config.yaml") << "run:\n  name: r\n";
  std::ofstream m(run / "metrics.jsonl");
  for (int s = 1; s <= 4; ++s)
    m << R"({"event":"train_step","stage":"sft","step":)" << s << R"(,"loss":)" << 2.0 / s << "}\n";
  for (int s = 5; s <= 7; ++s) {
    m << R"({"event":"verdict","stage":"rl","step":)" << s - 1
      << R"(,"task":"softmax","status":"ok","correct":true,"speedup":1.3,"hardware":"h100"})" "\n";
    m << R"({"event":"verdict","stage":"rl","step":)" << s - 1 << R"(,"task":"gemm","status":"timeout","correct":false})" "\n";
    m << R"({"event":"train_step","stage":"rl","step":)" << s
      << R"(,"loss":0.1,"mean_reward":0.6,"samples":2,"correct_share":0.5,"mean_speedup":1.3,"best_speedup":1.3})" "\n";
  }
  m.close();
  auto out = tmp.path() / "out";
  auto r = cli({"report", run.string(), "--out", out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.rfind((out / "report.html").string() + "\n", 0) == 0);
  CHECK_FALSE(fs::exists(run / "report"));
  auto html = slurp(out / "report.html");
  // The SFT loss and the RL steps on plots of their own, in that order, each with its caption.
  const auto sft = html.find("<figure id=\"sft_loss\">");
  const auto rl = html.find("<figure id=\"rl_steps\">");
  REQUIRE(sft != std::string::npos);
  REQUIRE(rl != std::string::npos);
  CHECK(sft < rl);
  CHECK(contains(html.substr(sft, rl - sft), "<figcaption>SFT stage, 4 updates (steps 1-4)"));
  for (const char* id : {"sft_loss", "rl_steps"}) {
    CAPTURE(id);
    auto png = out / (std::string{id} + ".png");
    REQUIRE(fs::exists(png));
    CHECK(contains(r.out, png.string() + "\n"));
    auto py = run_process({std::string{CRUCIBLE_PYTHON}, "-c", png_size, png.string()});
    INFO(py.err);
    CHECK(py.exit_code == 0);
    CHECK(py.out.rfind("880x", 0) == 0);
  }
  // Without matplotlib (a fresh virtual environment has none), the page says why it has no plots.
  const auto venv = tmp.path() / "bare-venv";
  auto made = run_process({"/usr/bin/python3", "-m", "venv", "--without-pip", venv.string()});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  const auto python = (venv / "bin" / "python").string();
  auto bare = run_process({"/usr/bin/env", "CRUCIBLE_PYTHON=" + python, CRUCIBLE_CLI, "report", run.string(), "--out",
                           (tmp.path() / "bare").string()});
  INFO(bare.err);
  REQUIRE(bare.exit_code == 0);
  CHECK(contains(bare.err, "No plots: " + python + " "));
  CHECK(contains(bare.err, "No module named 'matplotlib'"));
  CHECK(contains(slurp(tmp.path() / "bare" / "report.html"), "<p class=\"no-data\">No plots: " + python + " "));
}

TEST_CASE("crucible report refuses a missing run and a bad record naming the file and line") {
  temp_dir tmp;
  auto r = cli({"report", (tmp.path() / "nope").string()});
  CHECK(r.exit_code == 2);
  CHECK(contains(r.err, (tmp.path() / "nope").string() + ": not a run directory"));
  auto run = tmp.path() / "r";
  fs::create_directories(run);
  std::ofstream(run / "config.yaml") << "run:\n  name: r\n";
  std::ofstream(run / "metrics.jsonl") << R"({"event":"run_started","step":0})" "\n"
                                       << R"({"event":"train_step","step":1,"mean_reward":true})" "\n";
  r = cli({"report", run.string()});
  CHECK(r.exit_code == 2);
  CHECK(contains(r.err, "metrics.jsonl:2: key 'mean_reward': expected a number or null, got boolean"));
  CHECK_FALSE(fs::exists(run / "report" / "report.html"));
}
