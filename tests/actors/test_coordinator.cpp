// tests/actors/test_coordinator.cpp: the coordinator's run lifecycle on CAF's deterministic
// scheduler, against real status.json / metrics.jsonl files in a temp directory and a manual
// clock; and the seed variants the trainer loads for a run.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_config.hpp"
#include "actors/coordinator.hpp"
#include "actors/trainer.hpp"
#include "core/clock.hpp"
#include "core/log.hpp"
#include "storage/atomic_file.hpp"
#include "storage/event_publisher.hpp"
#include "storage/metrics_log.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
using namespace std::chrono_literals;

namespace {

using crucible::testing::temp_dir;

using crucible::testing::deterministic;

struct fixture {
  temp_dir dir;
  std::filesystem::path status_file = dir.path() / "status.json";
  std::filesystem::path metrics_file = dir.path() / "metrics.jsonl";
  std::filesystem::path events_file = dir.path() / "events.log";
  manual_clock clk;
  logger log{clk, log_level::off};
  actor_config cfg;
  caf::actor_system sys{deterministic(cfg)};
  caf::scoped_actor self{sys, true};
  caf::scheduler::test_coordinator& sched =
    dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  coordinator_actor coord;

  fixture() {
    REQUIRE(log.open_file(events_file, log_level::info).ok());
    spawn(status_file);
  }

  ~fixture() {
    if (coord) {
      self->send_exit(coord, caf::exit_reason::user_shutdown);
      sched.run();
    }
  }

  void spawn(const std::filesystem::path& status_path) {
    auto metrics = storage::metrics_log::open(metrics_file);
    REQUIRE_MESSAGE(metrics.ok(), metrics.error().to_string());
    coord = spawn_coordinator(sys, coordinator_deps{status_path, std::move(*metrics), log, clk});
    sched.run();
  }

  /// Sends a request, lets every actor run until idle, and returns the reply. A request
  /// left unanswered is a failure (rather than a blocking receive that never returns).
  template <class Atom>
  result<run_status> ask(Atom atom) {
    auto rh = self->request(coord, caf::infinite, atom);
    sched.run();
    return take(rh);
  }

  template <class Handle>
  result<run_status> take(Handle& rh) {
    if (self->mailbox().empty())
      return fail(errc::timeout, "the coordinator did not reply");
    std::optional<result<run_status>> out;
    rh.receive([&](run_status& s) { out.emplace(std::move(s)); },
               [&](caf::error& e) { out.emplace(to_error(e)); });
    REQUIRE(out.has_value());
    return std::move(*out);
  }

  run_status status_on_disk() {
    auto text = storage::read_file(status_file);
    REQUIRE_MESSAGE(text.ok(), text.error().to_string());
    auto st = run_status_from_json(*text);
    REQUIRE_MESSAGE(st.ok(), st.error().to_string());
    return *st;
  }

  std::vector<std::string> metrics_lines() {
    auto lines = storage::read_metrics(metrics_file);
    REQUIRE_MESSAGE(lines.ok(), lines.error().to_string());
    return *lines;
  }

  /// The prefix every lifecycle record starts with.
  std::string record_prefix(const char* event, const char* state) {
    return std::string{"{\"event\":\""} + event + "\",\"time\":\"" + format_iso8601(clk.now())
           + "\",\"state\":\"" + state + "\"";
  }
};

#define CHECK_STARTS_WITH(text, prefix)                                                    \
  CHECK_MESSAGE((text).rfind((prefix), 0) == 0, (text) << "\ndoes not start with\n" << (prefix))

run_status ok(result<run_status> r) {
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  return std::move(r).value();
}

} // namespace

TEST_CASE_FIXTURE(fixture, "before start nothing is written and status says starting") {
  auto st = ok(ask(caf::get_atom_v));
  CHECK(st.state == run_state::starting);
  CHECK(std::isnan(st.best_speedup));
  CHECK_FALSE(std::filesystem::exists(status_file));
  CHECK(metrics_lines().empty());
}

TEST_CASE_FIXTURE(fixture, "start runs the (empty) schedule to the end") {
  auto st = ok(ask(start_atom_v));
  CHECK(st.state == run_state::finished);
  CHECK(st.stage.empty());
  CHECK(st.step == 0);

  // status.json holds the final status, speedups still null (no variant evaluated).
  auto disk = status_on_disk();
  CHECK(disk == st);
  CHECK(std::isnan(disk.best_speedup));
  CHECK(std::isnan(disk.mean_speedup));
  auto raw = storage::read_file(status_file);
  REQUIRE(raw.ok());
  CHECK(raw->find("\"best_speedup\":null") != std::string::npos);

  // metrics.jsonl: started (while running), then finished, both stamped by the clock.
  auto lines = metrics_lines();
  REQUIRE(lines.size() == 2);
  CHECK_STARTS_WITH(lines[0], record_prefix("run_started", "running"));
  CHECK_STARTS_WITH(lines[1], record_prefix("run_finished", "finished"));

  // events.log names both transitions.
  auto events = storage::read_file(events_file);
  REQUIRE(events.ok());
  auto started = events->find("run_started");
  auto finished = events->find("run_finished");
  CHECK(started != std::string::npos);
  CHECK(finished != std::string::npos);
  CHECK(started < finished);

  // The status handler reports the same snapshot.
  CHECK(ok(ask(caf::get_atom_v)) == st);
}

TEST_CASE_FIXTURE(fixture, "a second start is an error and changes nothing") {
  ok(ask(start_atom_v));
  auto before = metrics_lines();
  auto again = ask(start_atom_v);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == errc::invalid_arg);
  CHECK(again.error().message.find("already started") != std::string::npos);
  CHECK(metrics_lines() == before);
  CHECK(status_on_disk().state == run_state::finished);
}

TEST_CASE_FIXTURE(fixture, "pause stops a running run between steps and resume finishes it") {
  // Both requests are queued before the coordinator runs, so pause arrives after start but
  // before the advance step that start queues behind it: the run is running when paused.
  auto start = self->request(coord, caf::infinite, start_atom_v);
  auto pause = self->request(coord, caf::infinite, pause_atom_v);
  sched.run();
  auto paused = ok(take(pause));
  CHECK(paused.state == run_state::paused);
  // start replies with the state at which the run stopped advancing.
  CHECK(ok(take(start)).state == run_state::paused);
  CHECK(status_on_disk().state == run_state::paused);
  CHECK(ok(ask(caf::get_atom_v)).state == run_state::paused);

  auto lines = metrics_lines();
  REQUIRE(lines.size() == 2);
  CHECK_STARTS_WITH(lines[0], record_prefix("run_started", "running"));
  CHECK_STARTS_WITH(lines[1], record_prefix("run_paused", "paused"));

  // Pausing again is a no-op reply.
  CHECK(ok(ask(pause_atom_v)).state == run_state::paused);
  CHECK(metrics_lines().size() == 2);

  clk.advance(90s);
  auto resumed = ok(ask(resume_atom_v));
  CHECK(resumed.state == run_state::finished);
  CHECK(status_on_disk().state == run_state::finished);
  lines = metrics_lines();
  REQUIRE(lines.size() == 4);
  CHECK_STARTS_WITH(lines[2], record_prefix("run_resumed", "running"));
  CHECK_STARTS_WITH(lines[3], record_prefix("run_finished", "finished"));
  // The earlier records keep their earlier time.
  CHECK(lines[0].find(format_iso8601(clk.now())) == std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "pausing or resuming a finished run is a no-op reply") {
  ok(ask(start_atom_v));
  auto lines = metrics_lines();
  auto disk = storage::read_file(status_file);
  REQUIRE(disk.ok());
  clk.advance(1s);

  CHECK(ok(ask(pause_atom_v)).state == run_state::finished);
  CHECK(ok(ask(resume_atom_v)).state == run_state::finished);
  CHECK(metrics_lines() == lines);
  auto after = storage::read_file(status_file);
  REQUIRE(after.ok());
  CHECK(*after == *disk);
}

TEST_CASE_FIXTURE(fixture, "stop pauses a running run and replies before the coordinator quits") {
  auto start = self->request(coord, caf::infinite, start_atom_v);
  auto stop = self->request(coord, caf::infinite, stop_atom_v);
  sched.run();
  CHECK(ok(take(stop)).state == run_state::paused);
  CHECK(ok(take(start)).state == run_state::paused);
  CHECK(status_on_disk().state == run_state::paused);

  auto lines = metrics_lines();
  REQUIRE(lines.size() == 2);
  CHECK_STARTS_WITH(lines[0], record_prefix("run_started", "running"));
  CHECK_STARTS_WITH(lines[1], record_prefix("run_stopped", "paused"));

  // Gone: a later request fails instead of being answered.
  auto after = ask(caf::get_atom_v);
  REQUIRE_FALSE(after.ok());
  CHECK(after.error().code == errc::worker_lost);
}

TEST_CASE_FIXTURE(fixture, "stop after the run finished leaves its records alone") {
  ok(ask(start_atom_v));
  auto lines = metrics_lines();
  CHECK(ok(ask(stop_atom_v)).state == run_state::finished);
  CHECK(metrics_lines() == lines);
  CHECK(status_on_disk().state == run_state::finished);
  CHECK_FALSE(ask(caf::get_atom_v).ok());
}

TEST_CASE_FIXTURE(fixture, "a status file that cannot be written crashes the run with errc::io") {
  self->send_exit(coord, caf::exit_reason::user_shutdown);
  sched.run();
  spawn(dir.path() / "missing-dir" / "status.json");

  auto r = ask(start_atom_v);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::io);
  CHECK(ok(ask(caf::get_atom_v)).state == run_state::crashed);
  auto lines = metrics_lines();
  REQUIRE_FALSE(lines.empty());
  CHECK_STARTS_WITH(lines.back(), record_prefix("run_crashed", "crashed"));
}

TEST_CASE_FIXTURE(fixture, "with a publisher the records and heartbeats go out live and status.json names the endpoint") {
  self->send_exit(coord, caf::exit_reason::user_shutdown);
  sched.run();
  auto pub = storage::event_publisher::bind("tcp://127.0.0.1:0");
  REQUIRE_MESSAGE(pub.ok(), pub.error().to_string());
  const auto endpoint = pub->endpoint();
  auto sub = storage::event_subscriber::connect(endpoint);
  REQUIRE(sub.ok());
  auto metrics = storage::metrics_log::open(metrics_file);
  REQUIRE(metrics.ok());
  coord = spawn_coordinator(sys, coordinator_deps{status_file, std::move(*metrics), log, clk,
                                                  std::make_unique<storage::event_publisher>(std::move(*pub)), 1000ms});
  sched.run();
  auto start = self->request(coord, caf::infinite, start_atom_v);
  auto pause = self->request(coord, caf::infinite, pause_atom_v);
  sched.run();
  CHECK(ok(take(pause)).state == run_state::paused);
  CHECK(ok(take(start)).state == run_state::paused);
  auto text = storage::read_file(status_file);
  REQUIRE(text.ok());
  CHECK(text->find("\"publish\":\"" + endpoint + "\"") != std::string::npos);
  CHECK(status_on_disk().state == run_state::paused); // the extra field leaves the status readable

  // A paused run keeps its heartbeat going: fire the timer until a heartbeat arrives. What
  // was published before the subscription reached the publisher is lost (ZeroMQ's slow
  // joiner), so of the two records so far a subscriber sees both, the last or none.
  auto before = metrics_lines();
  REQUIRE(before.size() == 2);
  std::vector<std::string> early;
  std::optional<storage::published_event> first;
  for (int i = 0; i < 1000 && !first; ++i) {
    REQUIRE(sched.trigger_timeout());
    sched.run();
    for (;;) {
      auto got = sub->receive(20ms);
      REQUIRE(got.ok());
      if (!*got)
        break;
      if ((*got)->topic == "heartbeat") {
        first = std::move(**got);
        break;
      }
      early.push_back((*got)->json);
    }
  }
  REQUIRE(first.has_value());
  CHECK((early.empty() || early == std::vector<std::string>{before[1]} || early == before));
  CHECK_STARTS_WITH(first->json, std::string{"{\"event\":\"heartbeat\",\"time\":\""} + format_iso8601(clk.now())
                                   + "\",\"state\":\"paused\"");
  CHECK(first->json.find("\"dropped_events\":0") != std::string::npos);

  CHECK(ok(ask(resume_atom_v)).state == run_state::finished);
  auto lines = metrics_lines();
  REQUIRE(lines.size() == 4);
  std::vector<storage::published_event> live;
  while (live.empty() || live.back().topic != "run_finished") {
    auto got = sub->receive(5000ms);
    REQUIRE(got.ok());
    REQUIRE(got->has_value());
    if ((*got)->topic != "heartbeat")
      live.push_back(std::move(**got));
  }
  REQUIRE(live.size() == 2);
  CHECK(live[0].topic == "run_resumed");
  CHECK(live[0].json == lines[2]); // the published record is the metrics record
  CHECK(live[1].json == lines[3]);
  // A finished run's heartbeat does not come back.
  while (sched.trigger_timeout())
    sched.run();
  CHECK_FALSE(sched.has_pending_timeout());
}

namespace {

// A scripted trainer: each advance gets the next report of `script` (step n: one train_step
// record); with `hold`, the reply waits for a collect_atom. Counts stops and saves.
struct fake_trainer_state {
  static inline const char* name = "fake.trainer";
  std::vector<stage_report> script;
  std::size_t next = 0;
  bool hold = false;
  std::vector<caf::typed_response_promise<stage_report>> held;
  std::shared_ptr<std::vector<std::string>> calls;
};

trainer_impl_actor::behavior_type fake_trainer(trainer_impl_actor::stateful_pointer<fake_trainer_state> self,
                                               std::vector<stage_report> script, bool hold,
                                               std::shared_ptr<std::vector<std::string>> calls) {
  self->state.script = std::move(script);
  self->state.hold = hold;
  self->state.calls = calls;
  return {
    [self](advance_atom) -> caf::result<stage_report> {
      auto& st = self->state;
      st.calls->push_back("advance");
      auto rep = st.script.at(std::min(st.next, st.script.size() - 1));
      ++st.next;
      if (!st.hold)
        return rep;
      auto rp = self->make_response_promise<stage_report>();
      st.held.push_back(rp);
      return rp;
    },
    [self](stop_atom) -> stage_report {
      self->state.calls->push_back("stop");
      auto rep = self->state.script.at(std::min(self->state.next, self->state.script.size()) - 1);
      rep.records.clear();
      return rep;
    },
    [self](save_atom) -> std::string {
      self->state.calls->push_back("save");
      return "ck";
    },
    [self](drain_atom) -> std::string {
      // As the trainer does for a step that only waits for groups: it ends without training,
      // its reply the last completed step's report.
      auto& st = self->state;
      st.calls->push_back("drain");
      if (st.held.empty())
        return "no step under way";
      --st.next;
      auto rep = st.next > 0 ? st.script.at(st.next - 1) : stage_report{};
      rep.records.clear();
      auto held = std::move(st.held);
      st.held.clear();
      for (auto& rp : held)
        rp.deliver(rep);
      return "ended without training";
    },
    [](rollout_group&) {},
    [](group_dropped&) {},
    [self](collect_atom) {
      auto& st = self->state;
      auto held = std::move(st.held);
      st.held.clear();
      for (auto& rp : held)
        rp.deliver(st.script.at(st.next - 1));
    },
    [](stall_atom, std::uint64_t, std::uint64_t) {}, // the real trainer's silence check
  };
}

stage_report step_report(std::uint64_t step, bool done) {
  stage_report r;
  r.stage = done ? "" : "sft";
  r.stage_step = step;
  r.step = step;
  r.done = done;
  r.policy_version = policy_version{step};
  if (!done)
    r.records = {"{\"event\":\"train_step\",\"step\":" + std::to_string(step) + "}"};
  return r;
}

struct trainer_fixture : fixture {
  std::shared_ptr<std::vector<std::string>> calls = std::make_shared<std::vector<std::string>>();
  trainer_impl_actor trainer;

  void respawn(bool hold, std::uint64_t checkpoint_every, std::string join = "") {
    self->send_exit(coord, caf::exit_reason::user_shutdown);
    sched.run();
    std::filesystem::remove(metrics_file);
    trainer = sys.spawn(fake_trainer, std::vector<stage_report>{step_report(1, false), step_report(2, false),
                                                                step_report(3, false), step_report(3, true)},
                        hold, calls);
    auto metrics = storage::metrics_log::open(metrics_file);
    REQUIRE(metrics.ok());
    coordinator_deps deps{status_file, std::move(*metrics), log, clk};
    deps.trainer = caf::actor_cast<trainer_actor>(trainer);
    deps.checkpoint_every = checkpoint_every;
    deps.join = std::move(join);
    coord = spawn_coordinator(sys, std::move(deps));
    sched.run();
  }
  ~trainer_fixture() {
    self->send_exit(trainer, caf::exit_reason::user_shutdown);
    sched.run();
  }
};

std::vector<std::string> events(const std::vector<std::string>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) {
    auto b = l.find("\"event\":\"") + 9;
    out.push_back(l.substr(b, l.find('"', b) - b));
  }
  return out;
}

} // namespace

TEST_CASE_FIXTURE(trainer_fixture, "a trainer's steps are recorded, checkpointed every two steps and at the end") {
  respawn(false, 2);
  auto done = ok(ask(start_atom_v));
  CHECK(done.state == run_state::finished);
  CHECK(done.step == 3);
  CHECK(done.policy_version == policy_version{3});
  CHECK(events(metrics_lines())
        == std::vector<std::string>{"run_started", "train_step", "step_timing", "train_step", "step_timing", "checkpoint",
                                    "train_step", "step_timing", "checkpoint", "run_finished"});
  // Each step that trained gets the coordinator's round trip of its request.
  for (const auto& l : metrics_lines())
    if (l.find("\"event\":\"step_timing\"") != std::string::npos) {
      CHECK(l.find("\"round_trip_seconds\":") != std::string::npos);
      CHECK(l.find("\"step\":") != std::string::npos);
    }
  CHECK(*calls == std::vector<std::string>{"advance", "advance", "save", "advance", "advance", "save"});
  CHECK(status_on_disk().step == 3);
}

TEST_CASE_FIXTURE(trainer_fixture, "status.json follows each step while the run goes on") {
  respawn(true, 0);
  auto start = self->request(coord, caf::infinite, start_atom_v);
  sched.run();
  CHECK(status_on_disk().step == 0);
  self->send(trainer, collect_atom_v); // step 1 ends; step 2 is under way
  sched.run();
  auto disk = status_on_disk();
  CHECK(disk.state == run_state::running);
  CHECK(disk.stage == "sft");
  CHECK(disk.step == 1);
  CHECK(disk.policy_version == policy_version{1});
  self->send(trainer, collect_atom_v);
  sched.run();
  CHECK(status_on_disk().step == 2);
  for (int i = 0; i < 4; ++i) {
    self->send(trainer, collect_atom_v);
    sched.run();
  }
  CHECK(ok(take(start)).state == run_state::finished);
  CHECK(status_on_disk().state == run_state::finished);
}

TEST_CASE_FIXTURE(trainer_fixture, "a pause whose step does not end within run.pause_grace_s asks the trainer to end it, and pauses") {
  respawn(true, 0);
  auto start = self->request(coord, caf::infinite, start_atom_v);
  sched.run();
  self->send(trainer, collect_atom_v); // step 1 ends; step 2 is under way and never ends by itself
  sched.run();
  auto pausing = ok(ask(pause_atom_v));
  CHECK(pausing.state == run_state::pausing);
  CHECK(std::count(calls->begin(), calls->end(), "drain") == 0); // the grace first
  for (int i = 0; i < 10 && std::count(calls->begin(), calls->end(), "drain") == 0; ++i) {
    sched.trigger_timeout();
    sched.run();
  }
  CHECK(std::count(calls->begin(), calls->end(), "drain") == 1);
  auto paused = ok(take(start));
  CHECK(paused.state == run_state::paused);
  CHECK(paused.step == 1); // the ended step did not count
  CHECK(status_on_disk().state == run_state::paused);
  CHECK(calls->back() == "save");
}

TEST_CASE_FIXTURE(trainer_fixture, "a pause waits for the step under way, stops the rollouts and checkpoints") {
  respawn(true, 0);
  auto start = self->request(coord, caf::infinite, start_atom_v);
  sched.run();
  CHECK(*calls == std::vector<std::string>{"advance"}); // the step is under way, its reply held
  auto pausing = ok(ask(pause_atom_v));
  CHECK(pausing.state == run_state::pausing);
  CHECK(status_on_disk().state == run_state::pausing);
  CHECK(*calls == std::vector<std::string>{"advance"}); // nothing else happens during the step
  self->send(trainer, collect_atom_v);                  // the step ends
  sched.run();
  CHECK(ok(take(start)).state == run_state::paused);
  CHECK(*calls == std::vector<std::string>{"advance", "stop", "save"});
  CHECK(events(metrics_lines())
        == std::vector<std::string>{"run_started", "run_pausing", "train_step", "step_timing", "checkpoint", "run_paused"});
  CHECK(status_on_disk().state == run_state::paused);
  CHECK(status_on_disk().step == 1);
  // Resume runs the rest of the schedule.
  auto resume = self->request(coord, caf::infinite, resume_atom_v);
  for (int i = 0; i < 6; ++i) {
    sched.run();
    self->send(trainer, collect_atom_v);
  }
  sched.run();
  CHECK(ok(take(resume)).state == run_state::finished);
}

TEST_CASE_FIXTURE(trainer_fixture, "status.json says where nodes join while the run runs or pauses, and not once it is paused or finished") {
  respawn(true, 0, "127.0.0.1:7460");
  auto joins = [&] {
    auto text = storage::read_file(status_file);
    REQUIRE(text.ok());
    return text->find("\"join\":\"127.0.0.1:7460\"") != std::string::npos;
  };
  auto start = self->request(coord, caf::infinite, start_atom_v);
  sched.run();
  CHECK(status_on_disk().state == run_state::running);
  CHECK(joins());
  self->send(trainer, collect_atom_v); // step 1 ends: status.json is rewritten with the step
  sched.run();
  CHECK(status_on_disk().step == 1);
  CHECK(joins());
  CHECK(ok(ask(pause_atom_v)).state == run_state::pausing);
  CHECK(joins()); // the step under way still runs, nodes still help
  self->send(trainer, collect_atom_v);
  sched.run();
  CHECK(ok(take(start)).state == run_state::paused);
  CHECK(status_on_disk().state == run_state::paused);
  CHECK_FALSE(joins());
  auto resume = self->request(coord, caf::infinite, resume_atom_v);
  sched.run();
  CHECK(status_on_disk().state == run_state::running);
  CHECK(joins());
  for (int i = 0; i < 6; ++i) {
    self->send(trainer, collect_atom_v);
    sched.run();
  }
  CHECK(ok(take(resume)).state == run_state::finished);
  CHECK(status_on_disk().state == run_state::finished);
  CHECK_FALSE(joins());
}

TEST_CASE_FIXTURE(trainer_fixture, "a run that takes no nodes writes no join") {
  respawn(true, 0);
  auto start = self->request(coord, caf::infinite, start_atom_v);
  sched.run();
  CHECK(status_on_disk().state == run_state::running);
  auto text = storage::read_file(status_file);
  REQUIRE(text.ok());
  CHECK(text->find("join") == std::string::npos);
}

TEST_CASE("seed variants: tasks.seed_exclude leaves matching files out, and a pattern with a '/' is refused") {
  temp_dir dir{"crucible-seeds"};
  const auto folder = dir.path() / "13_sort_range";
  std::filesystem::create_directories(folder);
  for (const char* name : {"cpp_minmax.py", "fast_amax_amin.py", "fast_aminmax.py", "wrong_second_largest.py", "notes.txt"})
    REQUIRE(storage::write_file_atomic(folder / name, "\"\"\"Summary of " + std::string{name} + ".\"\"\"\n").ok());
  task_catalog tasks;
  tasks[task_id{"13_sort_range"}] = env::task{};
  tasks[task_id{"05_logsumexp_rows"}] = env::task{}; // no folder: no seeds

  auto names = [](const std::vector<seed_variant>& seeds) {
    std::vector<std::string> out;
    for (const auto& s : seeds)
      out.push_back(s.name);
    return out;
  };
  auto all = load_seed_variants(dir.path(), tasks);
  REQUIRE(all.ok());
  CHECK(names(*all) == std::vector<std::string>{"cpp_minmax", "fast_amax_amin", "fast_aminmax", "wrong_second_largest"});
  CHECK(all->at(3).wrong);
  CHECK(all->at(1).summary == "Summary of fast_amax_amin.py.");

  auto some = load_seed_variants(dir.path(), tasks, {"cpp_*", "fast_amin?ax.py"});
  REQUIRE(some.ok());
  CHECK(names(*some) == std::vector<std::string>{"fast_amax_amin", "wrong_second_largest"});

  auto bad = load_seed_variants(dir.path(), tasks, {"13_sort_range/cpp_*"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == errc::config);
  CHECK(bad.error().message.find("tasks.seed_exclude: '13_sort_range/cpp_*'") != std::string::npos);
}
