// The crucible binary in real processes: help, config errors, and a run directory end to end.
#include <doctest/doctest.h>

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/config.hpp"
#include "core/json_parse.hpp"
#include "process.hpp"
#include "storage/metrics_log.hpp"
#include "storage/run_dir.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::run_process;

namespace {

using crucible::testing::temp_dir;

auto cli(std::vector<std::string> args, const std::string& cwd = "") {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args, cwd);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

TEST_CASE("crucible --help lists every command and each command has its own --help") {
  auto top = cli({"--help"});
  CHECK(top.exit_code == 0);
  for (const char* name : {"train", "status", "config", "info", "tokenizer", "init-model", "memory-plan", "generate", "replay", "report", "evaluator", "serve", "serve-policy"}) {
    CAPTURE(name);
    CHECK(top.out.find(std::string{"  "} + name + " ") != std::string::npos);
    auto sub = cli({name, "--help"});
    CHECK(sub.exit_code == 0);
    CHECK(sub.out.find(std::string{"usage: crucible "} + name) == 0);
  }
}

TEST_CASE("unknown commands and options are refused with exit code 2 and a hint") {
  auto r = cli({"trian"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("unknown command 'trian'") != std::string::npos);
  r = cli({"train", "x.yaml", "--sett", "a=b"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("unknown option --sett (did you mean --set?)") != std::string::npos);
  r = cli({"train"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("missing CONFIG") != std::string::npos);
  r = cli({});
  CHECK(r.exit_code == 2);
}

TEST_CASE("crucible eval refuses a task or candidate that is not a readable text file, naming it") {
  temp_dir tmp;
  const std::string task = std::string{CRUCIBLE_SOURCE_DIR} + "/env/tasks/cpu/01_relu_scale.py";
  const auto binary = tmp.path() / "model.so";
  std::ofstream(binary, std::ios::binary) << std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10);
  const auto latin1 = tmp.path() / "latin1.py";
  std::ofstream(latin1, std::ios::binary) << "# caf\xe9\nclass ModelNew: pass\n";
  struct bad { std::vector<std::string> args; std::string named, what; };
  for (const auto& b : std::vector<bad>{
         {{"--task", task, "--candidate", tmp.path().string()}, "--candidate " + tmp.path().string(), "is a directory"},
         {{"--task", task, "--candidate", binary.string()}, "--candidate " + binary.string(), "a NUL byte at offset 7"},
         {{"--task", task, "--candidate", latin1.string()}, "--candidate " + latin1.string(), "not UTF-8 at offset 5"},
         {{"--task", tmp.path().string(), "--candidate", latin1.string()}, "--task " + tmp.path().string(), "is a directory"},
         {{"--task", binary.string(), "--candidate", task}, "--task " + binary.string(), "not a text file"}}) {
    std::vector<std::string> args{"eval", "--device", "cpu"};
    args.insert(args.end(), b.args.begin(), b.args.end());
    auto r = cli(args);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(b.named) != std::string::npos);
    CHECK(r.err.find(b.what) != std::string::npos);
    CHECK(r.out.empty()); // no verdict
  }
}

TEST_CASE("crucible eval on a CUDA device this machine lacks says so in one line, and judges nothing") {
  // cuda:99: no machine here has it (without a GPU the driver is missing; with one, the number is
  // past the visible devices). Without MPS, whose daemon would be started for it first.
  const std::string src = CRUCIBLE_SOURCE_DIR;
  auto r = cli({"eval", "--task", src + "/env/tasks/cpu/01_relu_scale.py", "--candidate",
                src + "/env/tasks/cpu/variants/01_relu_scale/fast_inplace.py", "--device", "cuda:99", "--set",
                "evaluator.cuda_mps=off", "--json"});
  CAPTURE(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("crucible eval: cuda:99: no CUDA device") != std::string::npos);
  CHECK(r.err.find("Traceback") == std::string::npos); // not a worker's failure to start
  CHECK(r.out.empty());
}

TEST_CASE("crucible tasks import runs every reference once and names a task that does not run, with its line") {
  temp_dir tmp;
  const auto kb = tmp.path() / "kb" / "level1";
  fs::create_directories(kb);
  fs::copy_file(fs::path{CRUCIBLE_SOURCE_DIR} / "env/tasks/cpu/01_relu_scale.py", kb / "1_relu_scale.py");
  const std::string tail = "\ndef get_inputs():\n    return [torch.randn(4, 3)]\n\ndef get_init_inputs():\n    return []\n";
  std::ofstream(kb / "2_syntax.py") << "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                       "    def forward(self, x)\n        return x\n" << tail;
  std::ofstream(kb / "3_shapes.py") << "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                                       "    def forward(self, x):\n        return x @ x\n" << tail;
  const auto dir = (tmp.path() / "kb").string();
  auto r = cli({"tasks", "import", dir});
  CAPTURE(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("task level1/2_syntax does not run") != std::string::npos);
  CHECK(r.err.find((kb / "2_syntax.py").string() + "\", line 5") != std::string::npos);
  CHECK(r.err.find("SyntaxError") != std::string::npos);
  CHECK(r.err.find("task level1/3_shapes does not run") != std::string::npos);
  CHECK(r.err.find((kb / "3_shapes.py").string() + "\", line 6") != std::string::npos);
  CHECK(r.err.find("relu_scale does not run") == std::string::npos);
  CHECK(r.err.find("2 of 3 tasks") != std::string::npos);

  auto skip = cli({"tasks", "import", dir, "--skip-broken", "--json"});
  CAPTURE(skip.err);
  REQUIRE(skip.exit_code == 0);
  auto doc = crucible::parse_json(skip.out);
  REQUIRE(doc.ok());
  REQUIRE(doc->find("tasks")->as_array().size() == 1);
  CHECK(doc->find("tasks")->as_array()[0].find("name")->as_string() == "level1/1_relu_scale");
  CHECK(doc->find("broken")->as_array().size() == 2);

  auto unchecked = cli({"tasks", "import", dir, "--no-check", "--json"});
  REQUIRE(unchecked.exit_code == 0);
  CHECK(crucible::parse_json(unchecked.out)->find("tasks")->as_array().size() == 3);
}

TEST_CASE("a config with an unknown or mistyped key is refused naming file, line and key") {
  temp_dir tmp;
  auto cfg = tmp.path() / "bad.yaml";
  std::ofstream(cfg) << "run:\n  name: t\n  dir: " << tmp.path().string() << "\nlog:\n  levle: info\nactors:\n  threads: many\n";
  auto r = cli({"train", cfg.string()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(cfg.string() + ":5: log.levle: unknown key (did you mean log.level?)") != std::string::npos);
  CHECK(r.err.find(cfg.string() + ":7: actors.threads: expected a non-negative integer, got \"many\"") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path() / "t"));  // nothing was created for a refused config
  r = cli({"config", "check", "--file", cfg.string()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("log.levle") != std::string::npos);
}

TEST_CASE("every verdict crosses the trust boundary: the withdrawn keys of the shared path are refused, naming why, "
          "unless they ask for the boundary") {
  temp_dir tmp;
  auto cfg = tmp.path() / "c.yaml";
  std::ofstream(cfg) << "run:\n  name: r1\nevaluator:\n  warm_workers: 0\ntasks:\n  suite: " << CRUCIBLE_SOURCE_DIR
                     << "/env/tasks/cpu\n  warm_start: false\n";
  for (const char* key : {"evaluator.boundary=shared", "evaluator.cuda_boundary=false", "evaluator.outputs_on_device=false"}) {
    auto r = cli({"train", cfg.string(), "--set", "run.dir=" + tmp.path().string(), "--set", key});
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.err.find(std::string{"--set "} + key + ": ") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find(": withdrawn: ") != std::string::npos, r.err);
    CHECK_FALSE(fs::exists(tmp.path() / "r1")); // nothing was created for a refused config
  }
  auto r = cli({"train", cfg.string(), "--set", "run.dir=" + tmp.path().string(), "--set", "evaluator.boundary=shared"});
  CHECK_MESSAGE(r.err.find("the shared path, one worker for both, was removed") != std::string::npos, r.err);
  std::ofstream(tmp.path() / "token") << "0123456789abcdef0123456789abcdef\n";
  fs::permissions(tmp.path() / "token", fs::perms::owner_read | fs::perms::owner_write);
  r = cli({"serve", "--listen", "127.0.0.1:0", "--token-file", (tmp.path() / "token").string(), "--device", "cpu",
           "--no-cache", "--set", "evaluator.boundary=shared"});
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find("evaluator.boundary: withdrawn") != std::string::npos, r.err);
  // A configuration written before the keys went (a run's config.yaml) still loads: each asks for
  // what is now always so.
  std::ofstream(tmp.path() / "old.yaml") << "evaluator:\n  boundary: process\n  cuda_boundary: true\n"
                                            "  outputs_on_device: true\n  timing_reserve: true\n  cuda_host_bound: false\n";
  r = cli({"config", "check", "--file", (tmp.path() / "old.yaml").string()});
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  std::ofstream(tmp.path() / "old.yaml") << "evaluator:\n  timing_reserve: false\n";
  r = cli({"config", "check", "--file", (tmp.path() / "old.yaml").string()});
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find(":2: evaluator.timing_reserve: withdrawn: ") != std::string::npos, r.err);
  // crucible eval's verdict says how it was judged.
  const std::string task = std::string{CRUCIBLE_SOURCE_DIR} + "/env/tasks/cpu/01_relu_scale.py";
  const std::string cand = std::string{CRUCIBLE_SOURCE_DIR} + "/env/tasks/cpu/variants/01_relu_scale/fast_inplace.py";
  r = cli({"eval", "--task", task, "--candidate", cand, "--device", "cpu", "--no-cache"});
  CHECK(r.exit_code == 0);
  CHECK_MESSAGE(r.out.find("judged      boundary (the reference and the candidate in two workers)") != std::string::npos, r.out);
  CHECK(r.out.find("work        no counted FLOPs; 8.39 MB read, 8.39 MB written (the reference's call)") != std::string::npos);
  r = cli({"eval", "--task", task, "--candidate", cand, "--device", "cpu", "--json", "--no-cache"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\"judged\":\"boundary\"") != std::string::npos);
  // The reference's work in one call: 01_relu_scale has no matrix product, and reads and writes
  // one 1024 x 2048 float32 tensor.
  CHECK_MESSAGE(r.out.find("\"work\":{\"flops\":{},\"bytes_read\":8388608") != std::string::npos, r.out);
  // How far from the limit (evaluator.limits, on by default): the CPU's peaks measured by the
  // reference's worker, the bound its bytes at the copy rate (no FLOPs counted), and both
  // fractions of it.
  auto doc = crucible::parse_json(r.out);
  REQUIRE(doc.ok());
  const auto* bound = doc->find("bound");
  REQUIRE_MESSAGE(bound != nullptr, r.out);
  CHECK(bound->find("flops_ms")->as_double() == 0);
  CHECK(bound->find("bytes_ms")->as_double() > 0);
  CHECK(bound->find("ms")->as_double() == bound->find("bytes_ms")->as_double());
  CHECK(doc->find("fraction")->as_double()
        == doctest::Approx(bound->find("ms")->as_double() / doc->find("cand_ms")->as_double()));
  CHECK(doc->find("ref_fraction")->as_double() > 0);
  r = cli({"eval", "--task", task, "--candidate", cand, "--device", "cpu", "--no-cache"});
  CHECK_MESSAGE(r.out.find("limit       ") != std::string::npos, r.out);
  CHECK(r.out.find("a call on this hardware (bytes ") != std::string::npos);
  r = cli({"eval", "--task", task, "--candidate", cand, "--device", "cpu", "--json", "--no-cache", "--set", "evaluator.limits=false"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\"bound\"") == std::string::npos);
  CHECK(r.out.find("\"fraction\"") == std::string::npos);
}

TEST_CASE("crucible train creates the run directory, runs the lifecycle and status reports it") {
  temp_dir tmp;
  auto cfg = tmp.path() / "c.yaml";
  // The default schedule is empty (every stage has 0 steps): the run starts and finishes.
  std::ofstream(cfg) << "run:\n  name: r1\n  seed: 5\nactors:\n  threads: 2\nevaluator:\n  warm_workers: 0\ntasks:\n  suite: "
                     << CRUCIBLE_SOURCE_DIR << "/env/tasks/cpu\n  warm_start: false\n";
  auto r = cli({"train", cfg.string(), "--set", "run.dir=" + tmp.path().string(), "--set", "log.level=warn"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto run = tmp.path() / "r1";
  // The resolved config holds the overrides and decodes to the same values.
  auto resolved = crucible::load_config(run / "config.yaml");
  REQUIRE(resolved.ok());
  CHECK(resolved->run.seed == 5);
  CHECK(resolved->run.dir == tmp.path().string());
  CHECK(resolved->log.level == crucible::log_level::warn);
  // metrics.jsonl: whole JSON lines, the run's start and finish.
  auto lines = crucible::storage::read_metrics(run / "metrics.jsonl");
  REQUIRE(lines.ok());
  REQUIRE(lines->size() >= 2);
  CHECK(YAML::Load(lines->front())["event"].as<std::string>() == "run_started");
  CHECK(YAML::Load(lines->back())["event"].as<std::string>() == "run_finished");
  CHECK(slurp(run / "events.log").find("[coordinator]") != std::string::npos);
  auto status = YAML::Load(slurp(run / "status.json"));
  CHECK(status["state"].as<std::string>() == "finished");
  // status, human and JSON.
  auto st = cli({"status", run.string(), "--json"});
  CHECK(st.exit_code == 0);
  CHECK(YAML::Load(st.out)["state"].as<std::string>() == "finished");
  st = cli({"status", run.string()});
  CHECK(st.exit_code == 0);
  CHECK(st.out.find("finished") != std::string::npos);
  // The same run name again is refused: nothing is overwritten.
  auto again = cli({"train", cfg.string(), "--set", "run.dir=" + tmp.path().string()});
  CHECK(again.exit_code == 2);
  CHECK(again.err.find("already holds a run") != std::string::npos);
}

TEST_CASE("crucible status says where nodes join only while the run's process holds the run") {
  temp_dir tmp;
  const auto run = tmp.path() / "r";
  fs::create_directories(run);
  std::ofstream(run / "config.yaml") << "run: {name: r}\n";
  std::ofstream(run / "status.json")
    << "{\"state\":\"running\",\"stage\":\"sft\",\"step\":3,\"policy_version\":3,\"variants\":0,"
       "\"best_speedup\":null,\"mean_speedup\":null,\"dropped_stale\":0,\"pid\":1,\"join\":\"node-7:7460\"}\n";
  {
    // This test holds the run's lock, as the run's process would.
    auto held = crucible::storage::run_directory::open(run);
    REQUIRE(held.ok());
    auto st = cli({"status", run.string(), "--json"});
    REQUIRE(st.exit_code == 0);
    auto doc = YAML::Load(st.out);
    CHECK(doc["state"].as<std::string>() == "running");
    CHECK(doc["join"].as<std::string>() == "node-7:7460");
    CHECK(cli({"status", run.string()}).out.find("nodes join at  node-7:7460") != std::string::npos);
  }
  // The process is gone without rewriting status.json (kill -9): crashed, and nothing takes nodes.
  auto st = cli({"status", run.string(), "--json"});
  REQUIRE(st.exit_code == 0);
  auto doc = YAML::Load(st.out);
  CHECK(doc["state"].as<std::string>() == "crashed");
  CHECK_FALSE(doc["join"].IsDefined());
  CHECK(cli({"status", run.string()}).out.find("nodes join") == std::string::npos);
}

TEST_CASE("crucible status shows the share of time each GPU of the run is busy, by evaluations and by the policy") {
  temp_dir tmp;
  const auto run = tmp.path() / "r";
  fs::create_directories(run);
  std::ofstream(run / "config.yaml") << "run: {name: r}\n";
  std::ofstream(run / "status.json")
    << "{\"state\":\"paused\",\"stage\":\"rl\",\"step\":3,\"policy_version\":3,\"variants\":9,"
       "\"best_speedup\":null,\"mean_speedup\":null,\"dropped_stale\":0,\"devices\":["
       "{\"device\":\"cuda:0\",\"seconds\":200,\"evaluation_s\":50,\"policy_s\":120,\"evaluator\":true},"
       "{\"device\":\"cuda:1\",\"seconds\":200,\"evaluation_s\":0,\"policy_s\":30,\"evaluator\":false}]}\n";
  auto text = cli({"status", run.string()});
  REQUIRE(text.exit_code == 0);
  CHECK_MESSAGE(text.out.find("gpu cuda:0     evaluation  25.0%, policy  60.0% of 200 s\n") != std::string::npos, text.out);
  CHECK_MESSAGE(text.out.find("gpu cuda:1     evaluation   0.0%, policy  15.0% of 200 s (no evaluator on it)")
                  != std::string::npos,
                text.out);
  auto json = cli({"status", run.string(), "--json"});
  REQUIRE(json.exit_code == 0);
  auto doc = YAML::Load(json.out);
  REQUIRE(doc["devices"].IsSequence());
  CHECK(doc["devices"][0]["policy_s"].as<double>() == 120);
  // A record that says what runs on each GPU (engine.devices [cuda:0], the learner and an evaluator on cuda:1).
  std::ofstream(run / "status.json")
    << "{\"state\":\"paused\",\"stage\":\"rl\",\"step\":3,\"policy_version\":3,\"variants\":9,"
       "\"best_speedup\":null,\"mean_speedup\":null,\"dropped_stale\":0,\"devices\":["
       "{\"device\":\"cuda:0\",\"seconds\":200,\"evaluation_s\":0,\"policy_s\":180,\"evaluator\":false,"
       "\"engine\":true,\"learner\":false},"
       "{\"device\":\"cuda:1\",\"seconds\":200,\"evaluation_s\":40,\"policy_s\":30,\"evaluator\":true,"
       "\"engine\":false,\"learner\":true}]}\n";
  auto roles = cli({"status", run.string()});
  REQUIRE(roles.exit_code == 0);
  CHECK_MESSAGE(roles.out.find("gpu cuda:0     evaluation   0.0%, policy  90.0% of 200 s (engine)\n") != std::string::npos,
                roles.out);
  CHECK_MESSAGE(roles.out.find("gpu cuda:1     evaluation  20.0%, policy  15.0% of 200 s (learner, evaluator)\n")
                  != std::string::npos,
                roles.out);
  // A bad devices entry is named.
  std::ofstream(run / "status.json")
    << "{\"state\":\"paused\",\"stage\":\"rl\",\"step\":3,\"policy_version\":3,\"variants\":9,"
       "\"best_speedup\":null,\"mean_speedup\":null,\"dropped_stale\":0,\"devices\":{}}\n";
  auto bad = cli({"status", run.string()});
  CHECK(bad.exit_code != 0);
  CHECK_MESSAGE(bad.err.find("devices") != std::string::npos, bad.err);
}

TEST_CASE("crucible status names a directory that is not a run") {
  temp_dir tmp;
  auto r = cli({"status", (tmp.path() / "nope").string()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find((tmp.path() / "nope").string()) != std::string::npos);
}

TEST_CASE("crucible config show prints the resolved configuration and docs the reference") {
  temp_dir tmp;
  auto cfg = tmp.path() / "c.yaml";
  std::ofstream(cfg) << "run:\n  seed: 11\n";
  auto r = cli({"config", "show", "--file", cfg.string(), "--set", "actors.threads=3"});
  REQUIRE(r.exit_code == 0);
  auto parsed = crucible::parse_config(r.out, "stdout");
  REQUIRE(parsed.ok());
  CHECK(parsed->run.seed == 11);
  CHECK(parsed->actors.threads == 3);
  auto docs = cli({"config", "docs"});
  CHECK(docs.exit_code == 0);
  CHECK(docs.out == crucible::config_reference_markdown());
}

TEST_CASE("crucible info reports LibTorch") {
  auto r = cli({"info", "--json"});
  REQUIRE(r.exit_code == 0);
  CHECK(YAML::Load(r.out)["torch"].as<std::string>().rfind("2.11", 0) == 0);
}

TEST_CASE("crucible memory-plan prints the grid, one configuration item by item, and one from a run config") {
  auto grid = cli({"memory-plan"});
  REQUIRE(grid.exit_code == 0);
  // 4 models x 2 modes x 4 GPU counts, each a table row.
  std::size_t rows = 0;
  for (std::size_t at = 0; (at = grid.out.find("\n| ", at)) != std::string::npos; ++at)
    ++rows;
  CHECK(rows == 1 + 32); // and the header (the rule line starts with "|---")
  CHECK(grid.out.find("| 7b | LoRA | 1 | 10.1M |") != std::string::npos);
  auto one = cli({"memory-plan", "--model", "7b", "--lora", "--gpu-gb", "141"});
  REQUIRE(one.exit_code == 0);
  CHECK(one.out.find("**7b**, LoRA rank 16, 1 GPU of 141 GB") == 0);
  CHECK(one.out.find("| learner state | weights (bfloat16) | 15.23 |") != std::string::npos);
  CHECK(one.out.find("Fits in 141 GB") != std::string::npos);
  const std::string config = std::string{CRUCIBLE_SOURCE_DIR} + "/configs/gpu-1x.yaml";
  auto from_config = cli({"memory-plan", "--config", config, "--set", "learner.dtype=bfloat16", "--gpus", "2", "--zero1"});
  REQUIRE(from_config.exit_code == 0);
  CHECK(from_config.out.find("**small**, full fine-tuning, 2 GPUs with ZeRO-1 of 80 GB; prompt 4096 + completion 1024") == 0);
  CHECK(from_config.out.find("engine 64 rows") != std::string::npos);
  // learner.devices gives the GPU count: the 7B full fine-tuning config over four GPUs.
  const std::string four = std::string{CRUCIBLE_SOURCE_DIR} + "/configs/gpu-7b-full-4x.yaml";
  auto from_devices = cli({"memory-plan", "--config", four, "--gpu-gb", "141"});
  REQUIRE(from_devices.exit_code == 0);
  CHECK(from_devices.out.find("full fine-tuning, 4 GPUs with ZeRO-1 of 141 GB") != std::string::npos);
  CHECK(from_devices.out.find("Fits in 141 GB") != std::string::npos);
  // The engine on a GPU of its own: its items are listed apart and planned for that GPU.
  const std::string balance = std::string{CRUCIBLE_SOURCE_DIR} + "/configs/gpu-1.5b-balance.yaml";
  auto split = cli({"memory-plan", "--config", balance, "--set", "engine.devices=[cuda:0]", "--set", "model.device=cuda:1",
                    "--set", "evaluator.devices=[cuda:1]"});
  REQUIRE_MESSAGE(split.exit_code == 0, split.err);
  CHECK(split.out.find("| engine | *engine weights on the engine's GPU* (not summed) | 3.09 |") != std::string::npos);
  CHECK(split.out.find("+ engine 0.00 +") != std::string::npos);
  CHECK(split.out.find("The engine's GPU (engine.devices, 1 apart from the learner's): ") != std::string::npos);
  for (const auto& [args, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
         {{"memory-plan", "--model", "70b"}, "--model: model '70b'"},
         {{"memory-plan", "--model", "7b", "--zero1"}, "zero1"},
         {{"memory-plan", "--model", "7b", "--gpus", "1,2"}, "--gpus"},
         {{"memory-plan", "--grid", "--model", "7b"}, "--grid"},
         {{"memory-plan", "--set", "a=b"}, "--set"},
         {{"memory-plan", "--gpu-gb", "80,x"}, "--gpu-gb"},
         {{"memory-plan", "--model", "7b", "--activation-checkpointing", "maybe"}, "--activation-checkpointing"}}) {
    auto r = cli(args);
    CAPTURE(named);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(named) != std::string::npos);
  }
}

TEST_CASE("crucible tokenizer trains on local files, encodes and decodes, bad flags exit 2") {
  temp_dir dir;
  fs::path src{CRUCIBLE_SOURCE_DIR};
  auto out = dir.path() / "tok";
  auto train = cli({"tokenizer", "train", "--corpus", (src / "docs").string(), "--corpus", (src / "README.md").string(),
                    "--vocab", "1000", "--out", out.string(), "--json"});
  INFO(train.err);
  REQUIRE(train.exit_code == 0);
  CHECK(train.out.find("\"vocab_size\":1000") != std::string::npos);
  CHECK(fs::exists(out / "tokenizer.json"));
  CHECK(fs::exists(out / "tokenizer_config.json"));

  auto enc = cli({"tokenizer", "encode", "--tokenizer", out.string(), "--text", "<|im_start|>user\nhello<|im_end|>"});
  REQUIRE(enc.exit_code == 0);
  CHECK(enc.out.rfind("1 ", 0) == 0); // <|im_start|> has id 1
  std::string ids = enc.out.substr(0, enc.out.find('\n'));
  for (auto& c : ids)
    c = c == ' ' ? ',' : c;
  auto dec = cli({"tokenizer", "decode", "--tokenizer", out.string(), "--ids", ids, "--skip-special"});
  REQUIRE(dec.exit_code == 0);
  CHECK(dec.out == "user\nhello\n");
  auto json = cli({"tokenizer", "encode", "--tokenizer", out.string(), "--text", "x", "--json"});
  CHECK(json.out.find("\"tokens\":[\"x\"]") != std::string::npos);

  CHECK(cli({"tokenizer", "train", "--corpus", "README.md", "--out", out.string()}).exit_code == 2); // no --vocab
  auto small = cli({"tokenizer", "train", "--corpus", (src / "README.md").string(), "--vocab", "10", "--out", out.string()});
  CHECK(small.exit_code == 2);
  CHECK(small.err.find("too small") != std::string::npos);
  auto missing = cli({"tokenizer", "train", "--corpus", (dir.path() / "nope").string(), "--vocab", "500", "--out", out.string()});
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("nope") != std::string::npos);
  CHECK(cli({"tokenizer", "encode", "--tokenizer", out.string(), "--vocab", "3", "--text", "x"}).exit_code == 2);
  CHECK(cli({"tokenizer", "frobnicate"}).exit_code == 2);
  CHECK(cli({"tokenizer", "decode", "--tokenizer", out.string(), "--ids", "1,x"}).exit_code == 2);
  auto bad_dir = cli({"tokenizer", "encode", "--tokenizer", dir.path().string(), "--text", "x"});
  CHECK(bad_dir.exit_code == 2);
  CHECK(bad_dir.err.find("tokenizer.json") != std::string::npos);
}

TEST_CASE("crucible init-model and generate: a self-contained random model, greedy output as transformers'") {
  temp_dir dir;
  fs::path src{CRUCIBLE_SOURCE_DIR};
  const auto tok = dir.path() / "tok", model = dir.path() / "model";
  REQUIRE(cli({"tokenizer", "train", "--corpus", (src / "docs").string(), "--vocab", "600", "--out", tok.string()})
            .exit_code == 0);
  auto init = cli({"init-model", "--preset", "tiny", "--tokenizer", tok.string(), "--out", model.string(), "--seed", "3",
                   "--json"});
  INFO(init.err);
  REQUIRE(init.exit_code == 0);
  CHECK(YAML::Load(init.out)["vocab_size"].as<int>() == 600);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    CHECK(fs::exists(model / f));

  // Greedy generation is deterministic; one log-prob per token.
  const std::string prompt = "The engine samples completions";
  const std::vector<std::string> gen = {"generate", "--model", model.string(), "--prompt", prompt, "--temperature", "0",
                                        "--max-new-tokens", "12", "--json"};
  auto a = cli(gen), b = cli(gen);
  INFO(a.err);
  REQUIRE(a.exit_code == 0);
  CHECK(a.out == b.out);
  auto doc = YAML::Load(a.out);
  REQUIRE(doc["completions"].size() == 1);
  auto c = doc["completions"][0];
  const auto ids = c["token_ids"].as<std::vector<int>>();
  CHECK(!ids.empty());
  CHECK(ids.size() <= 12);
  CHECK(c["logprobs"].size() == ids.size());
  for (const auto& lp : c["logprobs"])
    CHECK(lp.as<double>() <= 0.0);
  CHECK(c["finish_reason"].as<std::string>() == (ids.size() == 12 ? "length" : "eos"));

  // Sampling with several samples, a stop string and plain-text output.
  auto sampled = cli({"generate", "--model", model.string(), "--prompt", prompt, "--samples", "3", "--top-k", "50",
                      "--top-p", "0.9", "--seed", "7", "--max-new-tokens", "8", "--stop", "e", "--json"});
  REQUIRE(sampled.exit_code == 0);
  auto sdoc = YAML::Load(sampled.out);
  REQUIRE(sdoc["completions"].size() == 3);
  for (const auto& s : sdoc["completions"])
    CHECK(s["text"].as<std::string>().find('e') == std::string::npos); // cut before the stop string
  auto text = cli({"generate", "--model", model.string(), "--prompt", prompt, "--max-new-tokens", "4"});
  CHECK(text.exit_code == 0);

  // transformers loads the directory (model and tokenizer) and continues the prompt identically,
  // with the same log-probs.
  auto hf = run_process({CRUCIBLE_PYTHON, (src / "tests" / "integration" / "hf_generate.py").string(), model.string(),
                         prompt, "12"});
  INFO(hf.err);
  REQUIRE(hf.exit_code == 0);
  auto hdoc = YAML::Load(hf.out);
  CHECK(hdoc["prompt_token_ids"].as<std::vector<int>>() == doc["prompt_token_ids"].as<std::vector<int>>());
  CHECK(hdoc["token_ids"].as<std::vector<int>>() == ids);
  const auto hf_logprobs = hdoc["logprobs"].as<std::vector<double>>();
  REQUIRE(hf_logprobs.size() == ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i)
    CHECK(c["logprobs"][i].as<double>() == doctest::Approx(hf_logprobs[i]).epsilon(1e-4));

  // Bad flags and inputs: exit 2, naming the flag or the file.
  auto expect_usage = [&](std::vector<std::string> args, const std::string& named) {
    auto r = cli(std::move(args));
    CAPTURE(named);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(named) != std::string::npos);
  };
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", model.string()}, "not empty");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--preset", "huge"},
               "--preset");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--family", "gpt"},
               "--family");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--seed", "x"}, "--seed");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--vocab-size", "10"},
               "--vocab-size");
  expect_usage({"init-model", "--tokenizer", (dir.path() / "none").string(), "--out", (dir.path() / "m2").string()},
               "--tokenizer: " + (dir.path() / "none").string());
  expect_usage({"init-model", "--out", (dir.path() / "m2").string()}, "--tokenizer");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--preset",
                "qwen2.5-coder-7b-instruct", "--family", "llama"},
               "--preset: model preset 'qwen2.5-coder-7b-instruct' is a qwen2 model");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--preset",
                "qwen2.5-coder-7b-instruct", "--vocab-size", "151936"},
               "--vocab-size 151936: preset qwen2.5-coder-7b-instruct has the published vocabulary of 152064 rows");
  expect_usage({"init-model", "--tokenizer", tok.string(), "--out", (dir.path() / "m2").string(), "--max-shard-size",
                "5XB"},
               "--max-shard-size: shard size '5XB'");
  expect_usage({"generate", "--model", model.string(), "--prompt", "x", "--temperature", "-1"}, "--temperature");
  expect_usage({"generate", "--model", model.string(), "--prompt", "x", "--top-p", "0"}, "--top-p");
  expect_usage({"generate", "--model", model.string(), "--prompt", "x", "--max-new-tokens", "0"}, "--max-new-tokens");
  expect_usage({"generate", "--model", model.string(), "--prompt", "x", "--device", "gpu"}, "--device");
  expect_usage({"generate", "--model", model.string(), "--prompt", "x", "--temprature", "0"}, "--temperature?");
  expect_usage({"generate", "--model", (dir.path() / "none").string(), "--prompt", "x"}, "none");
  expect_usage({"generate", "--model", tok.string(), "--prompt", "x"}, "config.json");
  std::ofstream(model / "model.safetensors", std::ios::trunc) << "not a checkpoint";
  expect_usage({"generate", "--model", model.string(), "--prompt", "x"}, "model.safetensors");
  // --force rewrites the directory, and the same seed gives the same weights back.
  REQUIRE(cli({"init-model", "--preset", "tiny", "--tokenizer", tok.string(), "--out", model.string(), "--seed", "3",
               "--force"})
            .exit_code == 0);
  CHECK(cli(gen).out == a.out);
  // The same weights in shards with an index (and the single file removed) generate the same.
  auto sharded = cli({"init-model", "--preset", "tiny", "--tokenizer", tok.string(), "--out", model.string(), "--seed",
                      "3", "--force", "--max-shard-size", "200KB", "--json"});
  INFO(sharded.err);
  REQUIRE(sharded.exit_code == 0);
  CHECK(YAML::Load(sharded.out)["weight_files"].as<int>() > 1);
  CHECK(fs::exists(model / "model.safetensors.index.json"));
  CHECK_FALSE(fs::exists(model / "model.safetensors"));
  CHECK(cli(gen).out == a.out);
}
