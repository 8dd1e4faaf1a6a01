// `crucible watch` in real processes: against a finished `crucible train` run, against a live
// publisher on loopback port 0, and against a peer that never answers.
#include <doctest/doctest.h>

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "process.hpp"
#include "storage/event_publisher.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::run_process;
using crucible::testing::running_process;
using crucible::testing::temp_dir;

namespace {

auto cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args);
}

std::vector<std::string> events_of(const std::string& json_lines) {
  std::vector<std::string> out;
  std::istringstream in(json_lines);
  for (std::string line; std::getline(in, line);)
    out.push_back(YAML::Load(line)["event"].as<std::string>());
  return out;
}

} // namespace

TEST_CASE("crucible watch RUN on a finished quickstart run reports its events up to run_finished") {
  temp_dir tmp;
  auto tr = cli({"train", std::string{CRUCIBLE_SOURCE_DIR} + "/configs/quickstart.yaml", "--set", "stages.sft.steps=0", "--set",
                    "stages.rl.steps=0", "--set", "tasks.warm_start=false", "--set", "evaluator.warm_workers=0", "--set",
                    "tasks.suite=" + std::string{CRUCIBLE_SOURCE_DIR} + "/env/tasks/cpu", "--set",
                 "run.dir=" + tmp.path().string(), "--set", "log.level=warn"});
  INFO(tr.err);
  REQUIRE(tr.exit_code == 0);
  auto run = tmp.path() / "quickstart";
  std::ifstream in(run / "status.json");
  std::string status((std::istreambuf_iterator<char>(in)), {});
  auto endpoint = YAML::Load(status)["publish"].as<std::string>();
  CHECK(endpoint.rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(endpoint != "tcp://127.0.0.1:0"); // the port actually bound

  auto w = cli({"watch", run.string(), "--until", "run_finished", "--json", "--timeout", "30"});
  INFO(w.err);
  CHECK(w.exit_code == 0);
  CHECK(events_of(w.out) == std::vector<std::string>{"run_started", "run_finished"});
  // Readable lines name the time, the event and the step.
  auto h = cli({"watch", run.string()});
  CHECK(h.exit_code == 0);
  CHECK(h.out.find("run_finished") != std::string::npos);
  CHECK(h.out.find("step=0") != std::string::npos);
  CHECK(h.err.find("is finished") != std::string::npos);
  // A verdict line names its task, status and speedup; a training step its stage, loss and
  // sampling figures (records as the trainer writes them, docs/training.md).
  std::ofstream(run / "metrics.jsonl", std::ios::app)
    << "{\"event\":\"verdict\",\"time\":\"2026-01-01T00:00:00.000Z\",\"stage\":\"rl\",\"step\":3,"
       "\"task\":\"level1/1_LogSumExp\",\"status\":\"ok\",\"correct\":true,\"speedup\":1.5,\"reward\":1.5,"
       "\"hardware\":\"cpu\",\"policy_version\":3,\"group\":7,\"cache_hit\":false}\n"
    << "{\"event\":\"train_step\",\"time\":\"2026-01-01T00:00:01.000Z\",\"stage\":\"rl\",\"step\":4,"
       "\"stage_step\":1,\"policy_version\":4,\"loss\":0.25,\"mean_reward\":0.75,\"correct_share\":0.5,"
       "\"mean_speedup\":1.5,\"best_speedup\":2}\n";
  auto detail = cli({"watch", run.string()});
  CHECK(detail.exit_code == 0);
  CHECK(detail.out.find("verdict        stage=rl step=3 policy=v3 task=level1/1_LogSumExp status=ok speedup=1.5x")
        != std::string::npos);
  CHECK(detail.out.find("train_step     stage=rl step=4 policy=v4 loss=0.25 reward=0.75 correct=0.5 mean=1.5x best=2x")
        != std::string::npos);
  // An event the finished run never had is an error, not a wait.
  auto never = cli({"watch", run.string(), "--until", "run_paused"});
  CHECK(never.exit_code == 1);
  CHECK(never.err.find("before run_paused") != std::string::npos);
}

TEST_CASE("crucible watch HOST:PORT prints live events and exits at --until") {
  auto pub = crucible::storage::event_publisher::bind("tcp://127.0.0.1:0");
  REQUIRE(pub.ok());
  auto host_port = pub->endpoint().substr(6); // "127.0.0.1:PORT"
  running_process watch({CRUCIBLE_CLI, "watch", host_port, "--json", "--until", "run_finished", "--timeout", "60"});
  // Heartbeats until watch prints the first one: its subscription is live from then on.
  std::string out;
  for (int i = 0; i < 3000 && out.empty(); ++i) {
    pub->publish("heartbeat", R"({"event":"heartbeat","time":"t","state":"running","step":0})");
    watch.read_some(20, out);
  }
  REQUIRE_FALSE(out.empty());
  pub->publish("learner_step", R"({"event":"learner_step","time":"t","step":1,"policy_version":1,"mean_speedup":1.5})");
  pub->publish("run_finished", R"({"event":"run_finished","time":"t","state":"finished","step":1})");
  pub->publish("after", R"({"event":"after"})");
  auto res = watch.wait();
  INFO(res.err);
  CHECK(res.exit_code == 0);
  auto ev = events_of(res.out);
  REQUIRE(ev.size() >= 3);
  CHECK(ev[0] == "heartbeat");
  CHECK(ev[ev.size() - 2] == "learner_step");
  CHECK(ev.back() == "run_finished"); // nothing after --until
}

TEST_CASE("crucible watch on a peer that never answers fails with a clear message, not a hang") {
  auto r = cli({"watch", "127.0.0.1:1", "--silence", "0.3"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("no event from tcp://127.0.0.1:1 within 0.3 s") != std::string::npos);
  r = cli({"watch", "127.0.0.1:1", "--timeout", "0.2", "--until", "run_finished"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("--timeout reached") != std::string::npos);
  r = cli({"watch", "no-such-thing"});
  CHECK(r.exit_code == 2);
}
