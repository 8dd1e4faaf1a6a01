// `crucible serve` in a real process on loopback (port 0), talked to over HTTP: verdicts as
// `crucible eval` gives them, the token on every request, bad requests answered with what is
// wrong, ids that are judged once, a full queue refused at once, a client that leaves mid-request
// and a worker killed mid-request losing nothing. One server a test case (each starts its workers).
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "process.hpp"
#include "tests/test_util/read_text.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using crucible::testing::read_text;
using crucible::testing::run_process;
using crucible::testing::running_process;
using crucible::testing::temp_dir;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};
const fs::path suite = source_dir / "env" / "tasks" / "cpu";
const std::string token = "test-token-0123456789abcdef";

// A CPU verdict in about a second (as test_cli_eval_set's): two trials, four rounds; the reference
// alone is held to a band of 500% (other tests load the machine beside this one, and the check of
// the reference's times is not what these cases are about: test_evaluator's are).
std::vector<std::string> fast_sets() {
  return {"--set", "evaluator.trials=2", "--set", "evaluator.rounds=4", "--set", "evaluator.min_rounds=4",
          "--set", "evaluator.max_rounds=4", "--set", "evaluator.buckets=2", "--set", "evaluator.warmup_ms=0",
          "--set", "evaluator.flush_bytes=1048576", "--set", "evaluator.recheck_above=1000",
          "--set", "evaluator.reference_band=5"};
}

// `crucible serve` on a free loopback port, and a client of it.
struct server {
  temp_dir dir{"serve"};
  std::unique_ptr<running_process> proc;
  int port = 0;
  std::string banner; // what it printed up to its address

  explicit server(std::vector<std::string> extra = {}, const std::string& device = "cpu", bool suite_flag = true) {
    std::ofstream(dir.path() / "token") << token << "\n";
    fs::permissions(dir.path() / "token", fs::perms::owner_read | fs::perms::owner_write); // as read_token_file asks
    std::vector<std::string> argv{CRUCIBLE_CLI, "serve", "--listen", "127.0.0.1:0", "--token-file",
                                  (dir.path() / "token").string(), "--device", device, "--no-cache"};
    if (suite_flag) {
      argv.push_back("--suite");
      argv.push_back(suite.string());
    }
    auto sets = fast_sets();
    argv.insert(argv.end(), sets.begin(), sets.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = std::make_unique<running_process>(argv);
    std::string out;
    REQUIRE_MESSAGE(proc->read_until("listening on http://", 120000, out), out);
    proc->read_until(")\n", 10000, out);
    std::smatch m;
    REQUIRE(std::regex_search(out, m, std::regex{R"(listening on http://127\.0\.0\.1:(\d+))"}));
    port = std::stoi(m[1]);
    banner = out;
  }
  httplib::Client client(bool with_token = true) const {
    httplib::Client c{"127.0.0.1", port};
    c.set_read_timeout(300, 0);
    if (with_token)
      c.set_bearer_token_auth(token);
    return c;
  }
};

json post(const server& s, const std::string& path, const json& body, int& status) {
  auto c = s.client();
  auto r = c.Post(path, body.dump(), "application/json");
  REQUIRE(r);
  status = r->status;
  auto j = json::parse(r->body, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), r->body);
  return j;
}

// The evaluator's workers below `root` (the server's pid): the processes running the harness whose
// parent runs it too (forked from the zygote; the zygote's own parent does not), the busiest first
// (most CPU time: a worker judging before a spare waiting).
std::vector<int> forked_workers(int root) {
  std::map<int, int> parent;
  std::map<int, long long> ticks;
  std::map<int, bool> harness;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const int pid = std::stoi(name);
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state, field;
    int ppid = 0;
    rest >> state >> ppid;
    for (int k = 5; k <= 13; ++k) // fields 5..13: pgrp .. majflt
      rest >> field;
    long long utime = 0, stime = 0;
    rest >> utime >> stime;
    parent[pid] = ppid;
    ticks[pid] = utime + stime;
    std::ifstream cmd(e.path() / "cmdline");
    std::string argv((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    harness[pid] = argv.find("worker.py") != std::string::npos;
  }
  auto below_root = [&](int pid) {
    for (int p = pid, hops = 0; p > 1 && hops < 64; p = parent[p], ++hops)
      if (p == root)
        return true;
    return false;
  };
  std::vector<int> out;
  for (const auto& [pid, h] : harness)
    if (h && harness[parent[pid]] && below_root(pid))
      out.push_back(pid);
  std::sort(out.begin(), out.end(), [&](int a, int b) { return ticks[a] > ticks[b]; });
  return out;
}

std::string variant(const std::string& task, const std::string& file) {
  return read_text(suite / "variants" / task / file);
}

} // namespace

TEST_CASE("crucible serve judges as crucible eval does, and refuses what is wrong with a reason") {
  server s;
  { // the token is checked on every request
    auto c = s.client(false);
    auto r = c.Get("/v1/health");
    REQUIRE(r);
    CHECK(r->status == 401);
    CHECK(r->body.find("no token") != std::string::npos);
    c.set_bearer_token_auth("wrong-token-wrong-token");
    r = c.Get("/v1/tasks");
    REQUIRE(r);
    CHECK(r->status == 401);
    CHECK(r->body.find("wrong token") != std::string::npos);
    r = s.client().Get("/v1/health");
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(json::parse(r->body)["devices"] == json::array({"cpu"}));
  }
  { // the registered suite is listed
    auto r = s.client().Get("/v1/tasks");
    REQUIRE(r);
    auto j = json::parse(r->body);
    bool found = false;
    for (const auto& t : j["tasks"])
      found = found || t["name"] == "01_relu_scale";
    CHECK(found);
  }
  { // a verdict by task name and by task source, with the CLI's statuses
    int status = 0;
    auto ok = post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", variant("01_relu_scale", "fast_inplace.py")}}, status);
    CHECK(status == 200);
    CHECK(ok["state"] == "judged");
    CHECK(ok["verdict"]["status"] == "ok");
    CHECK(ok["verdict"]["correct"] == true);
    auto wrong = post(s, "/v1/evaluate",
                      json{{"task_source", read_text(suite / "01_relu_scale.py")},
                           {"candidate", variant("01_relu_scale", "wrong_clamp_before_shift.py")}},
                      status);
    CHECK(status == 200);
    CHECK(wrong["verdict"]["status"] == "incorrect");
    // The same pair through `crucible eval --json`: the same status.
    auto cli_args = std::vector<std::string>{CRUCIBLE_CLI, "eval", "--task", (suite / "01_relu_scale.py").string(),
                                             "--candidate", (suite / "variants" / "01_relu_scale" / "wrong_clamp_before_shift.py").string(),
                                             "--device", "cpu", "--json", "--no-cache"};
    auto sets = fast_sets();
    cli_args.insert(cli_args.end(), sets.begin(), sets.end());
    auto cli = run_process(cli_args);
    REQUIRE_MESSAGE(cli.exit_code == 0, cli.err);
    CHECK(json::parse(cli.out)["status"] == wrong["verdict"]["status"]);
  }
  { // bad requests: each a clear answer
    auto c = s.client();
    auto r = c.Post("/v1/evaluate", "{\"task\": ", "application/json");
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK(json::parse(r->body)["error"] == "the body is not JSON");
    int status = 0;
    auto j = post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}}, status);
    CHECK(status == 400);
    CHECK(j["error"] == "the request has no 'candidate'");
    j = post(s, "/v1/evaluate", json{{"task", "no_such_task"}, {"candidate", "x"}}, status);
    CHECK(status == 404);
    CHECK(j["error"].get<std::string>().find("no task 'no_such_task'") != std::string::npos);
    j = post(s, "/v1/evaluate", json{{"task_source", "print(1)"}, {"candidate", "x"}}, status);
    CHECK(status == 400);
    CHECK(j["error"].get<std::string>().find("is not a task") != std::string::npos);
    j = post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", "x"}, {"seed", -3}}, status);
    CHECK(status == 400);
    CHECK(j["error"] == "'seed' is not a non-negative integer");
    // A candidate over the size limit (--max-request-kb, 4096 by default).
    r = c.Post("/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", std::string(5u << 20, 'x')}}.dump(),
               "application/json");
    REQUIRE(r);
    CHECK(r->status == 413);
    CHECK(json::parse(r->body)["error"].get<std::string>().find("larger than this server's limit of 4194304 bytes (--max-request-kb)")
          != std::string::npos);
    // A body sent as a form (curl -d's Content-Type) of more than 8 KiB: read as JSON all the same.
    r = c.Post("/v1/evaluate",
               json{{"task", "01_relu_scale"}, {"candidate", "# " + std::string(20000, 'x') + "\ndef (:"}}.dump(),
               "application/x-www-form-urlencoded");
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(json::parse(r->body)["verdict"]["status"] == "compile_error");
    // No such endpoint: a JSON error naming it.
    r = c.Get("/v1/nothing-here");
    REQUIRE(r);
    CHECK(r->status == 404);
    CHECK(json::parse(r->body)["error"] == "no endpoint GET /v1/nothing-here");
    // A misspelt field is named, with the field it was probably meant to be.
    j = post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", "x"}, {"tmeout_s", 5}}, status);
    CHECK(status == 400);
    CHECK(j["error"].get<std::string>().find("unknown field 'tmeout_s' (did you mean 'timeout_s'?)") != std::string::npos);
    j = post(s, "/v1/evaluate/batch", json{{"requests", json::array()}, {"timeout", 5}}, status);
    CHECK(status == 400);
    CHECK(j["error"].get<std::string>().find("the batch has an unknown field 'timeout'") != std::string::npos);
    // A candidate that is not Python gets its verdict, not an HTTP error.
    j = post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", "def (:"}}, status);
    CHECK(status == 200);
    CHECK(j["verdict"]["status"] == "compile_error");
  }
  { // a request with an id is judged once; its id asks for it again; another request under it is refused
    const json req{{"id", "run-7/sample-3"}, {"task", "01_relu_scale"}, {"candidate", variant("01_relu_scale", "fast_inplace.py")}};
    int status = 0;
    auto first = post(s, "/v1/evaluate", req, status);
    REQUIRE(status == 200);
    auto again = post(s, "/v1/evaluate", req, status);
    CHECK(status == 200);
    CHECK(again["verdict"] == first["verdict"]); // the same verdict, wall time included: not judged twice
    auto r = s.client().Get("/v1/evaluations/run-7/sample-3");
    REQUIRE(r);
    CHECK(json::parse(r->body)["verdict"] == first["verdict"]);
    auto other = req;
    other["candidate"] = variant("01_relu_scale", "wrong_clamp_before_shift.py");
    auto j = post(s, "/v1/evaluate", other, status);
    CHECK(status == 409);
    r = s.client().Get("/v1/metrics");
    REQUIRE(r);
    CHECK(r->body.find("crucible_serve_duplicates_total 1") != std::string::npos);
    CHECK(s.client().Get("/v1/evaluations/never-sent")->status == 404);
  }
  { // a batch: each item its own answer
    int status = 0;
    auto j = post(s, "/v1/evaluate/batch",
                  json{{"requests", json::array({json{{"task", "01_relu_scale"}, {"candidate", variant("01_relu_scale", "fast_inplace.py")}},
                                                 json{{"task", "nope"}, {"candidate", "x"}}})}},
                  status);
    CHECK(status == 200);
    REQUIRE(j["results"].size() == 2);
    INFO(j["results"][0].dump());
    CHECK(j["results"][0]["verdict"]["correct"] == true);
    CHECK(j["results"][1]["error"].get<std::string>().find("no task 'nope'") != std::string::npos);
  }
}

TEST_CASE("crucible serve run from outside the checkout, without --suite, registers the checkout's suite") {
  // tasks.suite (env/tasks/cpu) is relative: found above the executable where the working
  // directory does not hold it (as the guide's commands are run, from any directory).
  temp_dir elsewhere{"serve-cwd"};
  const auto was = fs::current_path();
  fs::current_path(elsewhere.path());
  std::unique_ptr<server> s;
  try {
    s = std::make_unique<server>(std::vector<std::string>{}, "cpu", false);
  } catch (...) {
    fs::current_path(was);
    throw;
  }
  fs::current_path(was);
  auto r = s->client().Get("/v1/tasks");
  REQUIRE(r);
  auto j = json::parse(r->body);
  CHECK(fs::path{j["suite"].get<std::string>()} == fs::canonical(suite));
  bool found = false;
  for (const auto& t : j["tasks"])
    found = found || t["name"] == "01_relu_scale";
  CHECK(found);
}

TEST_CASE("crucible serve: a full queue answers at once, a client that leaves loses nothing, a killed worker neither") {
  server s{{"--queue", "1"}};
  // A request that runs for a while (a slow candidate: 0.2 s a call), sent with timeout 0: its
  // answer is `pending` at once, and it holds the queue's one place.
  const std::string slow = "import time\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                           "    def __init__(self, scale=2.0, shift=0.5, clamp_max=6.0):\n        super().__init__()\n"
                           "        self.scale, self.shift, self.clamp_max = scale, shift, clamp_max\n\n"
                           "    def forward(self, x):\n        time.sleep(0.2)\n"
                           "        return torch.clamp((x * self.scale + self.shift).relu(), max=self.clamp_max)\n";
  int status = 0;
  auto pending = post(s, "/v1/evaluate", json{{"id", "slow"}, {"task", "01_relu_scale"}, {"candidate", slow}, {"timeout_s", 0}}, status);
  CHECK(status == 202);
  CHECK(pending["state"] == "pending");
  auto full = post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", slow}}, status);
  CHECK(status == 429);
  CHECK(full["error"] == "the queue is full; retry later");
  // The client left (timeout 0): the request is judged all the same, and its id finds it.
  json got;
  for (int k = 0; k < 600; ++k) {
    auto r = s.client().Get("/v1/evaluations/slow");
    REQUIRE(r);
    got = json::parse(r->body);
    if (got["state"] == "judged")
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // polling a server, not synchronising threads
  }
  REQUIRE(got["state"] == "judged");
  CHECK(got["verdict"]["status"] == "ok");
  // Every worker killed mid-request, the spares too (as an operator or the OOM killer might): the
  // device evaluator retries on fresh workers, and the request gets its verdict as if nothing
  // happened.
  std::size_t victims = 0;
  std::thread killer([&] {
    // Into the request below (it runs for seconds: 0.2 s a call): once the service says it is
    // being judged, every worker is killed.
    auto running = [&] {
      auto h = s.client().Get("/v1/health");
      return h && json::parse(h->body)["running"].get<int>() == 1;
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool busy = false;
    while (!busy && std::chrono::steady_clock::now() < until)
      busy = running();
    const auto pids = forked_workers(s.proc->pid());
    victims = busy ? pids.size() : 0;
    for (int pid : pids)
      ::kill(pid, SIGKILL);
  });
  auto killed = post(s, "/v1/evaluate", json{{"id", "killed"}, {"task", "01_relu_scale"}, {"candidate", slow}}, status);
  killer.join();
  REQUIRE(victims > 0);
  INFO(killed.dump());
  CHECK(status == 200);
  CHECK(killed["state"] == "judged");
  CHECK(killed["verdict"]["correct"] == true);
  auto health = json::parse(s.client().Get("/v1/health")->body);
  CHECK(health["queued"] == 0);
  s.proc->signal(SIGTERM);
  auto end = s.proc->wait();
  CHECK(end.exit_code == 0);
  CHECK(end.out.find("crucible serve: stopped") != std::string::npos);
  CHECK(end.err.find("retrying on a fresh worker") != std::string::npos); // the kill did land mid-request
}

TEST_CASE("crucible serve --join-listen: evaluator nodes that join judge the registered tasks") {
  // No device of its own: every verdict is a node's. A request sent before any node joined waits
  // for one; a task given as source (which nodes do not know) is refused at once.
  server s{{"--join-listen", "127.0.0.1:0"}, "none"};
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(s.banner, m, std::regex{R"(evaluator nodes join at (127\.0\.0\.1:\d+))"}), s.banner);
  const std::string join = m[1];
  const auto candidate = read_text(suite / "variants" / "01_relu_scale" / "fast_inplace.py");
  int status = 0;
  auto refused = post(s, "/v1/evaluate", json{{"task_source", read_text(suite / "01_relu_scale.py")}, {"candidate", candidate}},
                      status);
  CHECK(status == 400);
  CHECK(refused["error"].get<std::string>().find("evaluator nodes only") != std::string::npos);
  CHECK(post(s, "/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", candidate}, {"seed", 7}}, status)
          .contains("error"));
  CHECK(status == 400);

  // The request goes in before the node exists; its answer comes once the node has joined.
  auto client = s.client();
  auto first = std::async(std::launch::async, [&] {
    return client.Post("/v1/evaluate", json{{"task", "01_relu_scale"}, {"candidate", candidate}, {"id", "n1"}}.dump(),
                       "application/json");
  });
  // The request is queued (the health endpoint counts it) before the node is started.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool queued = false;
  while (!queued && std::chrono::steady_clock::now() < until) {
    auto h = s.client().Get("/v1/health");
    REQUIRE(h);
    queued = json::parse(h->body)["queued"].get<int>() == 1;
  }
  CHECK(queued);
  auto sets = fast_sets();
  std::vector<std::string> argv{CRUCIBLE_CLI, "evaluator", "--join", join, "--token-file", (s.dir.path() / "token").string(),
                                "--devices", "cpu", "--no-cache"};
  argv.insert(argv.end(), sets.begin(), sets.end());
  auto node = std::make_unique<running_process>(argv);
  auto r = first.get();
  REQUIRE(r);
  CHECK(r->status == 200);
  auto v = json::parse(r->body);
  INFO(r->body);
  CHECK(v["state"] == "judged");
  CHECK(v["verdict"]["status"] == "ok");
  auto health = json::parse(s.client().Get("/v1/health")->body);
  CHECK(health["devices"] == json::array({"nodes"}));
  node->signal(SIGTERM);
  node->wait();
}
