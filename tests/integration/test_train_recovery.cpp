// `crucible train` on the CPU after kill -9, injected faults (killed workers, zygote, run and
// evaluator node, a damaged store, a full disk) and pauses that drop or wait for groups: the resume
// finishes, every step once, and the replay store's samples agree with the run's counters.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/json_parse.hpp"
#include "process.hpp"
#include "tests/integration/train_util.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::process_result;
using crucible::testing::run_process;
using crucible::testing::running_process;
using crucible::testing::temp_dir;
using namespace crucible::testing::train;

namespace {

// The processes below `root` (children, theirs, ...), from /proc: the run's zygote, workers and
// their keepers.
std::vector<pid_t> descendants(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::ifstream in(e.path() / "stat");
    std::string line;
    if (!std::getline(in, line))
      continue;
    auto close = line.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (state != 'Z')
      children.emplace(ppid, static_cast<pid_t>(std::stol(name)));
  }
  std::vector<pid_t> out, todo{root};
  while (!todo.empty()) {
    auto p = todo.back();
    todo.pop_back();
    auto [b, e] = children.equal_range(p);
    for (auto it = b; it != e; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

bool running(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line))
    return false;
  auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z';
}

// Each of `pids` ends within 30 s (the processes below a killed one die with it).
void check_all_end(const std::vector<pid_t>& pids, const std::string& whose) {
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::any_of(pids.begin(), pids.end(), running) && std::chrono::steady_clock::now() < by)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (auto pid : pids)
    CHECK_MESSAGE(!running(pid), "process " << pid << " of " << whose << " still runs");
}

// The seed variants the replay store of `run` holds (rows of group 0, by count), through
// `crucible replay export` into `scratch`.
std::int64_t stored_seeds(const fs::path& run, const fs::path& scratch) {
  const auto out = scratch / "seeds.jsonl";
  auto ex = cli({"replay", "export", run.string(), "--out", out.string()});
  INFO(ex.err);
  REQUIRE(ex.exit_code == 0);
  std::int64_t n = 0;
  std::istringstream in(slurp(out));
  for (std::string line; std::getline(in, line);) {
    auto j = crucible::parse_json(line);
    REQUIRE(j.ok());
    if (j->find("kind") == nullptr && j->find("group_id")->as_int() == 0)
      n += j->find("count")->as_int();
  }
  return n;
}

// Reads `p`'s output until the run has recorded `n` train steps (at most five minutes).
void wait_train_steps(const fs::path& run, running_process& p, std::size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  std::string out;
  while (train_steps(run).size() < n && std::chrono::steady_clock::now() < deadline)
    p.read_some(20, out);
  REQUIRE_MESSAGE(train_steps(run).size() >= n, out, "\nevents.log:\n", slurp(run / "events.log"));
}

// Trains `cfg` with `set` (--set VALUE each) until `pause_after` train steps and pauses it with
// `crucible pause`, then resumes it and kills it with -9 two train steps later, then resumes it
// to the end: the fates agree with the counters after the pause, and the last resume's result is
// returned. `paused` names the pause in the messages.
process_result pause_crash_resume(const fs::path& run, const fs::path& cfg, const std::vector<std::string>& set,
                                  std::size_t pause_after, const char* paused) {
  {
    std::vector<std::string> argv{CRUCIBLE_CLI, "train", cfg.string()};
    for (const auto& v : set)
      argv.insert(argv.end(), {"--set", v});
    running_process p(argv);
    wait_train_steps(run, p, pause_after);
    auto pause = cli({"pause", run.string(), "--timeout", "300"});
    INFO(pause.err);
    CHECK(pause.exit_code == 0);
    CHECK(p.wait().exit_code == 0);
  }
  samples_agree(run, 0, paused);
  {
    const auto before = train_steps(run).size();
    running_process r({CRUCIBLE_CLI, "resume", run.string()});
    wait_train_steps(run, r, before + 2);
    r.signal(SIGKILL);
    CHECK(r.wait().exit_code == 128 + SIGKILL);
  }
  return cli({"resume", run.string()});
}

} // namespace

TEST_CASE("after kill -9 the run resumes from its last checkpoint and finishes, and crucible pause pauses a run") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "killed", "  sft: {steps: 6, batch: 2}\n")));
  const auto run = tmp.path() / "killed";
  {
    running_process p({CRUCIBLE_CLI, "train", cfg.string(), "--set", "run.checkpoint_every=1", "--set", "log.wandb=true"});
    // Wait (bounded) for the first checkpoint, then kill the process without warning.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    std::string out;
    while (!fs::exists(run / "checkpoints" / "latest") && std::chrono::steady_clock::now() < deadline)
      p.read_some(100, out);
    REQUIRE(fs::exists(run / "checkpoints" / "latest"));
    p.signal(SIGKILL);
    auto res = p.wait();
    CHECK(res.exit_code == 128 + SIGKILL);
  }
  auto st = cli({"status", run.string(), "--json"});
  CHECK(st.out.find("\"state\":\"crashed\"") != std::string::npos);
  auto resumed = cli({"resume", run.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 6") != std::string::npos);
  // Steps after the last checkpoint were lost with the process and done again; none is missing.
  auto steps = train_steps(run);
  std::set<std::int64_t> distinct(steps.begin(), steps.end());
  CHECK(distinct == std::set<std::int64_t>{1, 2, 3, 4, 5, 6});
  // TensorBoard's event files, as TensorBoard reads them: every SFT step once, from the resumed
  // process (its writer rewrote them from the metrics cut back at the resume). The writer reads
  // once more after the run's process ended and lets go of its folder's lock: wait for that.
  {
    const auto lock = run / "tensorboard" / ".metrics_tensorboard";
    REQUIRE(fs::exists(lock));
    auto released = run_process({"/usr/bin/flock", "--wait", "120", lock.string(), "true"});
    REQUIRE(released.exit_code == 0);
    const char* read_back =
        "import sys\n"
        "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
        "ea = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0}); ea.Reload()\n"
        "print(' '.join(str(e.step) for e in ea.Scalars('train_step/loss')))\n";
    auto tb = run_process({std::string{CRUCIBLE_PYTHON}, "-c", read_back, (run / "tensorboard" / "sft").string()});
    INFO(tb.err);
    REQUIRE(tb.exit_code == 0);
    CHECK(tb.out == "1 2 3 4 5 6\n");
    CHECK(slurp(run / "events.log").find("TensorBoard event files in ") != std::string::npos);
    // log.wandb: the same writer's offline W&B run, read back record by record (the reader of
    // tests/python/test_metrics_tensorboard.py): every SFT step once, from the resumed process.
    const std::string wandb_back =
        "import sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_metrics_tensorboard import wandb_history\n"
        "from pathlib import Path\n"
        "info, rows = wandb_history(Path(sys.argv[2]))\n"
        "print(info.display_name, ' '.join(str(r['step']) for r in rows if 'train_step/loss' in r))\n";
    auto wb = run_process({std::string{CRUCIBLE_PYTHON}, "-c", wandb_back,
                           (source_dir / "tests" / "python").string(), run.string()});
    INFO(wb.err);
    REQUIRE(wb.exit_code == 0);
    CHECK(wb.out == "killed 1 2 3 4 5 6\n");
    CHECK(slurp(run / "events.log").find("an offline W&B run in ") != std::string::npos);
  }

  // crucible pause: a second run paused from outside.
  running_process p({CRUCIBLE_CLI, "train", cfg.string(), "--set", "run.name=paused", "--set", "stages.sft.steps=1000"});
  const auto prun = tmp.path() / "paused";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  std::string out;
  while (!fs::exists(prun / "checkpoints" / "latest") && std::chrono::steady_clock::now() < deadline)
    p.read_some(100, out);
  REQUIRE(fs::exists(prun / "checkpoints" / "latest"));
  auto pause = cli({"pause", prun.string(), "--timeout", "300"});
  INFO(pause.err);
  CHECK(pause.exit_code == 0);
  CHECK(pause.out.find("paused") != std::string::npos);
  auto res = p.wait();
  CHECK(res.exit_code == 0);
  auto pst = cli({"status", prun.string(), "--json"});
  CHECK(pst.out.find("\"state\":\"paused\"") != std::string::npos);
}

TEST_CASE("the replay store's samples agree with the run's counters after a pause dropping groups in flight and a crash in contrastive RL") {
  temp_dir tmp;
  // Twelve RL steps: the pause, sent after the third step, may land several steps later on a
  // loaded machine (the pause command starts while the run goes on), and the resumed run must
  // still have two steps left before the crash.
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "fates",
                                                                     "  sft: {steps: 1, batch: 2}\n  rl: {steps: 12, groups: 1}\n")));
  const auto run = tmp.path() / "fates";
  // Paused in RL with run.on_pause drop: queued groups are discarded, those in flight unfinished.
  // Resumed, then killed with -9: what the killed process decided after its last checkpoint, and
  // what it left undecided, is unfinished once the run resumes.
  auto fin = pause_crash_resume(run, cfg, {"run.on_pause=drop", "run.checkpoint_every=1"}, 3,
                                "after a pause that dropped the groups in flight");
  INFO(fin.err);
  REQUIRE(fin.exit_code == 0);
  CHECK(fin.out.find("finished at step 13") != std::string::npos);
  auto st = samples_agree(run, 0, "after the crash and the resume to the end");
  CHECK(st.find("samples")->find("trained")->as_int() >= 12);
  // metrics.jsonl agrees as well: what the killed process recorded after its last checkpoint was
  // set aside at the resume (metrics-after-step-N-*.jsonl), so each step and verdict is there once.
  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  std::int64_t verdicts = 0;
  for (const auto& x : records(run))
    verdicts += event_of(x) == "verdict" ? 1 : 0;
  CHECK(verdicts == st.find("variants")->as_int());
}

TEST_CASE("two-turn episodes across a pause and a kill -9: each turn evaluated once, every trained episode whole") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "turns",
                                                                     "  sft: {steps: 1, batch: 2}\n  rl: {steps: 8, groups: 1}\n")));
  const auto run = tmp.path() / "turns";
  // Paused in RL with run.on_pause finish (the default): the episodes in flight play to their end.
  auto fin = pause_crash_resume(run, cfg, {"rollout.turns=2", "run.checkpoint_every=1"}, 3,
                                "after a pause with episodes in flight");
  INFO(fin.err);
  REQUIRE(fin.exit_code == 0);
  CHECK(fin.out.find("finished at step 9") != std::string::npos);
  samples_agree(run, 0, "after the crash and the resume to the end");
  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  // Every sample's place: no (group, episode, turn) twice; a trained group's episodes each begin
  // at turn 0 and go on without a gap, and the train_step records count both turns.
  auto out = cli({"replay", "samples", run.string(), "--out", (tmp.path() / "samples.jsonl").string()});
  REQUIRE(out.exit_code == 0);
  std::map<std::int64_t, std::map<std::int64_t, std::set<std::int64_t>>> trained;
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> seen;
  std::istringstream in(slurp(tmp.path() / "samples.jsonl"));
  std::size_t n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    auto x = crucible::parse_json(line);
    REQUIRE(x.ok());
    REQUIRE_MESSAGE(x->find("turn") != nullptr, line);
    const auto g = x->find("group_id")->as_int(), e = x->find("episode")->as_int(), t = x->find("turn")->as_int();
    CHECK_MESSAGE(seen.insert({g, e, t}).second, "sample twice: ", line);
    if (x->find("fate")->as_string() == "trained")
      trained[g][e].insert(t);
  }
  CHECK(n > 0);
  CHECK(trained.size() >= 8);
  for (const auto& [g, episodes] : trained) {
    CHECK(episodes.size() == 2); // rollout.group_size
    for (const auto& [e, turns] : episodes)
      CHECK(turns == std::set<std::int64_t>{0, 1});
  }
  for (const auto& r : records(run))
    if (event_of(r) == "train_step" && r.find("stage")->as_string() == "rl") {
      const auto* turns = r.find("turns");
      REQUIRE(turns != nullptr);
      CHECK(turns->as_array().size() == 2);
    }
}

TEST_CASE("a pause whose step waits for groups past run.pause_grace_s ends that step and pauses, the resumed run does it again") {
  temp_dir tmp;
  // Long responses (8 of up to 4000 tokens from an untrained model) keep the RL step waiting
  // for its group for seconds; the grace is 50 ms.
  auto text = test_config(tmp.path(), "grace", "  sft: {steps: 1, batch: 2}\n  rl: {steps: 2, groups: 1}\n");
  auto cfg = write_config(tmp.path(), text);
  const auto run = tmp.path() / "grace";
  running_process p({CRUCIBLE_CLI, "train", cfg.string(), "--set", "run.pause_grace_s=0.05", "--set",
                     "rollout.max_new_tokens=4000", "--set", "rollout.group_size=8", "--set",
                     "run.checkpoint_every=0"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  std::string out;
  while (train_steps(run).empty() && std::chrono::steady_clock::now() < deadline)
    p.read_some(20, out);
  REQUIRE(train_steps(run) == std::vector<std::int64_t>{1}); // SFT done; the first RL step waits for its group
  auto pause = cli({"pause", run.string(), "--timeout", "120"});
  INFO(pause.err);
  CHECK(pause.exit_code == 0);
  CHECK(pause.out.find("paused at step 1") != std::string::npos);
  CHECK(p.wait().exit_code == 0);
  CHECK(slurp(run / "events.log").find("waited for groups") != std::string::npos);
  auto resumed = cli({"resume", run.string(), "--set", "rollout.max_new_tokens=16"});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 3") != std::string::npos);
  auto steps = train_steps(run);
  CHECK(steps == std::vector<std::int64_t>{1, 2, 3});
}

TEST_CASE("fault injection: killed workers and zygote, a killed run, a damaged store, a killed evaluator node, the run resumes, every step once, nothing left running") {
  temp_dir tmp;
  std::mt19937 rng{std::random_device{}()};
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "faults", "  sft: {steps: 6, batch: 2}\n  rl: {steps: 4, groups: 1}\n"));
  const auto run = tmp.path() / "faults";
  std::vector<pid_t> seen;
  {
    running_process p({CRUCIBLE_CLI, "train", cfg.string(), "--set", "run.checkpoint_every=1"});
    std::string out;
    // Fault 1, at a random moment while the run checks its tasks and measures its seed variants:
    // every process below the run (the zygote, the workers, their keepers) killed with -9.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    // (The zygote first, then the workers it forks, each a keeper and its child: wait for those.)
    while (descendants(p.pid()).size() < 3 && std::chrono::steady_clock::now() < deadline)
      p.read_some(20, out);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>{0, 1000}(rng)));
    auto victims = descendants(p.pid());
    MESSAGE("fault 1: killing " << victims.size() << " processes below the run");
    for (auto v : victims)
      ::kill(v, SIGKILL);
    // Fault 2, at a random moment after the first checkpoint: the run's own process, with -9.
    while (!fs::exists(run / "checkpoints" / "latest") && std::chrono::steady_clock::now() < deadline + std::chrono::minutes(3))
      p.read_some(20, out);
    REQUIRE_MESSAGE(fs::exists(run / "checkpoints" / "latest"), "no checkpoint; the run: ", out, "\nevents.log:\n",
                    slurp(run / "events.log"));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>{0, 1000}(rng)));
    seen = descendants(p.pid());
    p.signal(SIGKILL);
    CHECK(p.wait().exit_code == 128 + SIGKILL);
  }
  // Nothing of the killed run goes on running: its workers and zygote die with it.
  check_all_end(seen, "the killed run");
  CHECK(cli({"status", run.string(), "--json"}).out.find("\"state\":\"crashed\"") != std::string::npos);
  // Fault 3: the replay store damaged (its first page past the header, WAL gone): the resume is
  // refused naming the file; with the copy back it goes on.
  const auto db = run / "replay.db";
  const auto backup = tmp.path() / "replay-backup";
  fs::create_directories(backup);
  for (const char* f : {"replay.db", "replay.db-wal", "replay.db-shm"})
    if (fs::exists(run / f))
      fs::copy_file(run / f, backup / f);
  fs::remove(run / "replay.db-wal");
  fs::remove(run / "replay.db-shm");
  {
    std::fstream f(db, std::ios::in | std::ios::out | std::ios::binary);
    const std::string junk(4096 - 100, '\x5a');
    f.seekp(100);
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto refused = cli({"resume", run.string()});
  CHECK(refused.exit_code != 0);
  CHECK(refused.err.find(db.string()) != std::string::npos);
  for (const auto& e : fs::directory_iterator(backup))
    fs::copy_file(e.path(), run / e.path().filename(), fs::copy_options::overwrite_existing);
  // Fault 4, during the resume: an evaluator node that joined the run is killed with -9 at a
  // random moment after it joined (while it evaluates, if it has a candidate then); the run goes
  // on and none of the node's processes does. Long responses (8 of up to 800 tokens from an
  // untrained model) keep the resumed run's RL steps going for seconds while the node starts.
  // (tests/integration/test_join.cpp kills a node mid-evaluation and checks its candidate.)
  // The endpoint is the one the resumed run logs (status.json may still name the killed run's).
  const std::string said_join = "evaluator nodes join at ";
  auto joins = [&] {
    const auto log = slurp(run / "events.log");
    std::vector<std::string> at;
    for (auto i = log.find(said_join); i != std::string::npos; i = log.find(said_join, i + 1)) {
      const auto from = i + said_join.size();
      at.push_back(log.substr(from, log.find_first_of(" \n", from) - from));
    }
    return at;
  };
  const auto joins_before = joins().size();
  running_process r({CRUCIBLE_CLI, "resume", run.string(), "--set", "membership.listen=127.0.0.1:0", "--set",
                     "rollout.max_new_tokens=800", "--set", "rollout.group_size=8"});
  std::string out;
  const auto join_by = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (joins().size() <= joins_before && std::chrono::steady_clock::now() < join_by)
    r.read_some(50, out);
  REQUIRE(joins().size() > joins_before);
  const auto endpoint = joins().back();
  std::vector<pid_t> node_seen;
  {
    running_process node({CRUCIBLE_CLI, "evaluator", "--join", endpoint, "--token-file", (run / "membership.token").string(),
                          "--devices", "cpu", "--no-cache", "--verbose", "--set", "evaluator.warm_workers=1"});
    std::string said;
    if (!node.read_until("joined " + endpoint, 180'000, said)) {
      node.signal(SIGKILL);
      auto n = node.wait();
      auto run_end = r.wait();
      FAIL("the node did not join: " << said << n.out << n.err << "\nthe run: " << out << run_end.out << run_end.err
                                     << "\nevents.log:\n" << slurp(run / "events.log"));
    }
    node.read_until("(worker ", std::uniform_int_distribution<int>{0, 2000}(rng), said);
    const bool evaluating = said.find("(worker ") != std::string::npos;
    node_seen = descendants(node.pid());
    MESSAGE("fault 4: killing the evaluator node " << std::string(evaluating ? "while it evaluates" : "between evaluations")
                                                   << " and " << node_seen.size() << " processes below it");
    node.signal(SIGKILL);
    CHECK(node.wait().exit_code == 128 + SIGKILL);
  }
  // The resume finishes the schedule; no committed step is lost or done twice in the end.
  auto resumed = r.wait();
  INFO("resume: " << out << resumed.out << resumed.err << "\nevents.log:\n" << slurp(run / "events.log"));
  REQUIRE(resumed.exit_code == 0);
  CHECK((out + resumed.out).find("finished at step 10") != std::string::npos);
  check_all_end(node_seen, "the killed evaluator node");
  auto steps = train_steps(run);
  CHECK(std::set<std::int64_t>(steps.begin(), steps.end()) == std::set<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(std::is_sorted(steps.begin(), steps.end())); // a step done again comes after its first time, never out of order
  auto st = crucible::parse_json(cli({"status", run.string(), "--json"}).out);
  REQUIRE(st.ok());
  CHECK(st->find("state")->as_string() == "finished");
  CHECK(st->find("step")->as_int() == 10);
  // The replay store and the run's counters agree, sample by sample.
  samples_agree(run, stored_seeds(run, tmp.path()), "after the faults and the resume to the end");
}

TEST_CASE("a full disk while the run saves a checkpoint: it stops naming the file, the last checkpoint stays whole, the resume finishes") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "full", "  sft: {steps: 4, batch: 2}\n")));
  const auto run = tmp.path() / "full";
  auto first = cli({"train", cfg.string(), "--pause-after", "2"});
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  // The largest file the first checkpoint holds; the resumed run may write no file half that size
  // (RLIMIT_FSIZE, with SIGXFSZ ignored: a write past it fails with EFBIG, as one on a full disk
  // fails with ENOSPC), so saving step 4 fails while its logs and status still fit.
  std::uintmax_t largest = 0;
  for (const auto& e : fs::recursive_directory_iterator(run / "checkpoints" / "step-2"))
    if (e.is_regular_file())
      largest = std::max(largest, e.file_size());
  REQUIRE(largest > 256u << 10);
  const auto kib = largest / 2 / 1024;
  auto full = run_process({"/bin/bash", "-c",
                           "trap '' XFSZ; ulimit -S -f " + std::to_string(kib) + "; exec \"$0\" resume \"$1\"",
                           CRUCIBLE_CLI, run.string()});
  INFO("full disk: " << full.out << full.err << "\nevents.log:\n" << slurp(run / "events.log"));
  CHECK(full.exit_code != 0);
  CHECK(full.err.find((run / "checkpoints").string()) != std::string::npos); // the file it could not write
  CHECK(full.err.find("File too large") != std::string::npos);
  CHECK(slurp(run / "checkpoints" / "latest") == "step-2\n"); // still the whole one
  // Room again: the resume goes on from step 2 and finishes, every step once.
  auto resumed = cli({"resume", run.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);
  auto steps = train_steps(run);
  CHECK(std::set<std::int64_t>(steps.begin(), steps.end()) == std::set<std::int64_t>{1, 2, 3, 4});
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) // the half-written one is gone
    CHECK_MESSAGE(e.path().filename().string().find(".tmp") == std::string::npos, e.path());
}

namespace {

struct stored_sample {
  std::int64_t id = 0, version = 0;
  std::string fate;
};

// The run's samples of multi-turn episodes by (group, episode, turn); a place twice fails.
std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, stored_sample> episode_samples(const fs::path& run,
                                                                                               const fs::path& file) {
  auto out = cli({"replay", "samples", run.string(), "--out", file.string()});
  REQUIRE_MESSAGE(out.exit_code == 0, out.err);
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, stored_sample> rows;
  std::istringstream in(slurp(file));
  for (std::string line; std::getline(in, line);) {
    auto x = crucible::parse_json(line);
    REQUIRE(x.ok());
    REQUIRE_MESSAGE(x->find("turn") != nullptr, line);
    stored_sample s{x->find("id")->as_int(), x->find("policy_version")->as_int(), x->find("fate")->as_string()};
    const auto place = std::tuple{x->find("group_id")->as_int(), x->find("episode")->as_int(), x->find("turn")->as_int()};
    CHECK_MESSAGE(rows.emplace(place, s).second, "sample twice: ", line);
  }
  return rows;
}

} // namespace

TEST_CASE("an episode in flight at a kill -9 goes on at the turn it reached after the resume, its stored turn not evaluated again") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "reach",
                                                                     "  sft: {steps: 1, batch: 2}\n  rl: {steps: 12, groups: 1}\n")));
  const auto run = tmp.path() / "reach";
  const auto file = tmp.path() / "samples.jsonl";
  // The run is stopped (SIGSTOP) now and then, and its store looked at, until an episode's first
  // turn is stored and its second is not, in a group none of whose samples has a fate, all
  // sampled by weights the latest checkpoint holds: then it is killed with -9.
  std::tuple<std::int64_t, std::int64_t, std::int64_t> reached{-1, -1, -1};
  std::int64_t first_id = -1;
  {
    running_process p({CRUCIBLE_CLI, "train", cfg.string(), "--set", "rollout.turns=2", "--set", "run.checkpoint_every=1"});
    wait_train_steps(run, p, 2);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    std::string out;
    while (std::get<0>(reached) < 0 && std::chrono::steady_clock::now() < deadline) {
      p.signal(SIGSTOP);
      auto doc = crucible::parse_json(slurp(latest_dir(run) / "trainer.json"));
      REQUIRE(doc.ok());
      const auto version = doc->find("version")->as_int();
      const auto rows = episode_samples(run, file);
      std::map<std::int64_t, bool> open; // group -> every sample undecided and within the checkpoint's weights
      for (const auto& [place, s] : rows) {
        auto [it, fresh] = open.emplace(std::get<0>(place), true);
        it->second = it->second && s.fate == "undecided" && s.version <= version;
      }
      for (const auto& [place, s] : rows) {
        const auto [g, e, t] = place;
        if (t == 0 && open[g] && rows.count({g, e, 1}) == 0) {
          reached = place;
          first_id = s.id;
          break;
        }
      }
      if (std::get<0>(reached) >= 0) {
        p.signal(SIGKILL);
        break;
      }
      p.signal(SIGCONT);
      p.read_some(30, out);
    }
    REQUIRE_MESSAGE(std::get<0>(reached) >= 0, "no episode was caught between its turns");
    CHECK(p.wait().exit_code == 128 + SIGKILL);
  }
  auto fin = cli({"resume", run.string(), "--set", "log.level=info"});
  INFO(fin.err);
  REQUIRE(fin.exit_code == 0);
  CHECK(fin.err.find("of episodes an earlier process left in flight") != std::string::npos);
  samples_agree(run, 0, "after the crash and the resume to the end");
  const auto rows = episode_samples(run, file);
  const auto [g, e, t] = reached;
  // The stored first turn is the same row (it was not sampled or evaluated again), and the
  // episode took its second turn in the resumed process; the group's fate is one.
  REQUIRE(rows.count(reached) == 1);
  CHECK(rows.at(reached).id == first_id);
  REQUIRE(rows.count({g, e, 1}) == 1);
  CHECK(rows.at({g, e, 1}).id > first_id);
  const auto fate = rows.at(reached).fate;
  CHECK(fate != "unfinished");
  for (const auto& [place, s] : rows)
    if (std::get<0>(place) == g)
      CHECK(s.fate == fate);
}
