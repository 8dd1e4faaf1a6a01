// tests/actors/test_membership.cpp: the membership actor and the node agent on CAF's
// deterministic scheduler, with the real evaluator pool and fake evaluators that hold their
// candidates until the test answers them: tokens, admission into the pool, heartbeats and their
// timeout, disconnects and orderly leaves, each re-queueing the node's candidates.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/membership.hpp"
#include "deterministic.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
using namespace std::chrono_literals;

namespace {

// -- a fake evaluator: holds candidates, answers when told ------------------------------------

using fake_evaluator_actor = evaluator_actor::extend<
  // Answers the held candidate `variant` with an ok verdict of `speedup`.
  caf::reacts_to<caf::put_atom, std::uint64_t, double>>;

struct fake_state {
  std::vector<std::pair<candidate, caf::typed_response_promise<verdict>>> held;
  static inline const char* name = "fake_evaluator";
};

using seen = std::vector<std::uint64_t>;

fake_evaluator_actor::behavior_type fake_evaluator(fake_evaluator_actor::stateful_pointer<fake_state> self,
                                                   device_info info, std::shared_ptr<seen> got) {
  return {
    [=](candidate& c) -> caf::result<verdict> {
      got->push_back(c.variant.value);
      auto rp = self->make_response_promise<verdict>();
      self->state.held.emplace_back(c, rp);
      return rp;
    },
    [=](caf::get_atom) { return info; },
    [=](caf::put_atom, std::uint64_t variant, double speedup) {
      auto& held = self->state.held;
      for (auto it = held.begin(); it != held.end(); ++it)
        if (it->first.variant.value == variant) {
          verdict v;
          v.status = verdict_status::ok;
          v.correct = true;
          v.speedup = speedup;
          v.reward = speedup;
          v.hardware = info.name;
          it->second.deliver(v);
          held.erase(it);
          return;
        }
    },
  };
}

// -- a fake membership actor that welcomes and then never answers a heartbeat -----------------

struct mute_state {
  std::vector<caf::typed_response_promise<void>> unanswered;
  static inline const char* name = "mute_membership";
};

membership_actor::behavior_type mute_membership(membership_actor::stateful_pointer<mute_state> self) {
  return {
    [=](const tasks_request&) { return run_setup{}; },
    [=](const node_announce&) { return node_welcome{node_id{"n#1"}, "run", 1000, 3000}; },
    [=](heartbeat_atom, const node_id&) -> caf::result<void> {
      auto rp = self->make_response_promise<void>();
      self->state.unanswered.push_back(rp);
      return rp;
    },
    [=](caf::leave_atom, const node_id&) -> caf::result<void> { return caf::unit; },
    [=](caf::get_atom) { return std::vector<node_announce>{}; },
  };
}

// -- fixture ------------------------------------------------------------------------------------

constexpr const char* token = "0123456789abcdef";

struct fixture {
  actor_config cfg;
  caf::actor_system sys{testing::deterministic(cfg)};
  caf::scoped_actor self{sys, true};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<task_catalog> tasks = std::make_shared<task_catalog>();
  evaluator_pool_actor pool;
  membership_actor members;
  std::vector<fake_evaluator_actor> fakes;
  std::vector<std::shared_ptr<seen>> got;
  std::vector<caf::actor> others; // agents and the like, told to exit at the end

  fixture() {
    env::task t;
    t.name = "01_relu_scale";
    t.source = "class Model(nn.Module): ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n";
    t.number = 1;
    (*tasks)[task_id{t.name}] = t;
    pool = spawn_evaluator_pool(sys, {}, evaluator_pool_options{1, 8});
    membership_options opt;
    opt.token = token;
    opt.run = "quickstart";
    opt.config_yaml = "evaluator:\n  trials: 2\n";
    opt.heartbeat = 1s;
    opt.timeout = 3s;
    members = spawn_membership(sys, membership_deps{pool, tasks, nullptr}, opt);
    sched.run();
  }

  ~fixture() {
    for (auto& a : others)
      self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& f : fakes)
      self->send_exit(f, caf::exit_reason::user_shutdown);
    self->send_exit(members, caf::exit_reason::user_shutdown);
    self->send_exit(pool, caf::exit_reason::user_shutdown);
    sched.run();
  }

  // An announce of one CPU device served by a new fake evaluator (fakes.back()).
  node_announce announce(const std::string& host, const std::string& with_token = token) {
    got.push_back(std::make_shared<seen>());
    device_info info{0, "cpu: " + host, "cpu", 0};
    fakes.push_back(sys.spawn(fake_evaluator, info, got.back()));
    return node_announce{with_token, host, node_role::evaluator, {info}, {caf::actor_cast<caf::actor>(fakes.back())}};
  }

  // Spawns a node agent for `a` and asks it to join; the welcome or the error.
  std::pair<node_agent_actor, caf::expected<node_welcome>> join(node_announce a) {
    auto agent = spawn_node_agent(sys, members, std::move(a), 10s);
    others.push_back(caf::actor_cast<caf::actor>(agent));
    auto h = self->request(agent, caf::infinite, caf::join_atom_v);
    sched.run();
    caf::expected<node_welcome> out{caf::error{}};
    h.receive([&](node_welcome& w) { out = std::move(w); }, [&](caf::error& e) { out = std::move(e); });
    return {agent, std::move(out)};
  }

  std::vector<node_announce> nodes() {
    auto h = self->request(members, caf::infinite, caf::get_atom_v);
    sched.run();
    std::vector<node_announce> out;
    h.receive([&](std::vector<node_announce>& xs) { out = std::move(xs); },
              [&](caf::error& e) { FAIL(to_error(e).to_string()); });
    return out;
  }

  std::vector<device_info> pool_devices() {
    auto h = self->request(pool, caf::infinite, caf::get_atom_v);
    sched.run();
    std::vector<device_info> out;
    h.receive([&](std::vector<device_info>& xs) { out = std::move(xs); },
              [&](caf::error& e) { FAIL(to_error(e).to_string()); });
    return out;
  }

  // Sends candidate `id` to the pool from a fresh client that collects the verdict in `out`.
  void submit(std::uint64_t id, std::shared_ptr<std::vector<verdict>> out) {
    auto client = sys.spawn([=](caf::event_based_actor* c) {
      c->request(pool, caf::infinite, candidate{variant_id{id}, task_id{"01_relu_scale"}, "class ModelNew: pass", ""})
        .then([=](const verdict& v) { out->push_back(v); }, [=](const caf::error& e) { FAIL(to_error(e).to_string()); });
    });
    sched.run();
  }

  void answer(size_t fake, std::uint64_t variant, double speedup) {
    self->send(fakes[fake], caf::put_atom_v, variant, speedup);
    sched.run();
  }

  // Lets `d` of simulated time pass, one heartbeat at a time.
  void wait(caf::timespan d) {
    for (caf::timespan t{0}; t < d; t += 500ms) {
      sched.advance_time(500ms);
      sched.run();
    }
  }

  // The exit reason of `agent` once it quits, or none while it lives.
  caf::error exit_reason_of(const caf::actor_addr& agent) {
    caf::error reason;
    bool down = false;
    self->receive([&](caf::down_msg& d) {
                    CHECK(d.source == agent);
                    reason = d.reason;
                    down = true;
                  },
                  caf::after(std::chrono::seconds(0)) >> [] {});
    REQUIRE_MESSAGE(down, "the agent is still running");
    return reason;
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "a wrong token is refused, and nothing is added") {
  auto h = self->request(members, caf::infinite, tasks_request{"guess"});
  sched.run();
  h.receive([&](run_setup&) { FAIL("tasks sent for a wrong token"); },
            [&](caf::error& e) { CHECK(to_error(e).code == errc::refused); });
  auto [agent, welcome] = join(announce("intruder:1", "guess"));
  REQUIRE_FALSE(welcome);
  CHECK(to_error(welcome.error()).code == errc::refused);
  CHECK_MESSAGE(to_error(welcome.error()).message.find("wrong token") != std::string::npos, to_error(welcome.error()).message);
  CHECK(nodes().empty());
  CHECK(pool_devices().empty());
  // Without a token at all, too.
  auto [agent2, welcome2] = join(announce("intruder:2", ""));
  CHECK_FALSE(welcome2);
  CHECK(nodes().empty());
}

TEST_CASE_FIXTURE(fixture, "a node with the token gets the task sources and its evaluators join the pool") {
  auto h = self->request(members, caf::infinite, tasks_request{token});
  sched.run();
  run_setup setup;
  h.receive([&](run_setup& x) { setup = std::move(x); }, [&](caf::error& e) { FAIL(to_error(e).to_string()); });
  CHECK(setup.config == "evaluator:\n  trials: 2\n");
  const auto& sources = setup.tasks;
  REQUIRE(sources.size() == 1);
  CHECK(sources[0].task == task_id{"01_relu_scale"});
  CHECK(sources[0].source == tasks->begin()->second.source);
  CHECK(sources[0].number == 1);

  auto [agent, welcome] = join(announce("node-a:100"));
  REQUIRE(welcome);
  CHECK(welcome->node == node_id{"node-a:100#1"});
  CHECK(welcome->run == "quickstart");
  CHECK(welcome->heartbeat_ms == 1000);
  CHECK(welcome->timeout_ms == 3000);
  auto listed = nodes();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].host == "node-a:100");
  CHECK(listed[0].token.empty()); // the secret is not handed to whoever asks
  CHECK(listed[0].actors.empty());
  CHECK(listed[0].devices.size() == 1);
  auto devices = pool_devices();
  REQUIRE(devices.size() == 1);
  CHECK(devices[0].name == "cpu: node-a:100");

  auto verdicts = std::make_shared<std::vector<verdict>>();
  submit(1, verdicts);
  CHECK(*got[0] == seen{1});
  answer(0, 1, 1.25);
  REQUIRE(verdicts->size() == 1);
  CHECK(verdicts->at(0).speedup == 1.25);
}

TEST_CASE_FIXTURE(fixture, "a node whose heartbeats stop is removed after the timeout and its candidates are re-queued") {
  // Node A: the test itself announces it and then sends no heartbeat. Node B: a real agent.
  auto h = self->request(members, caf::infinite, announce("silent:1"));
  sched.run();
  h.receive([&](node_welcome&) {}, [&](caf::error& e) { FAIL(to_error(e).to_string()); });
  auto [agent, welcome] = join(announce("alive:2"));
  REQUIRE(welcome);
  auto verdicts = std::make_shared<std::vector<verdict>>();
  submit(1, verdicts);
  submit(2, verdicts);
  REQUIRE(*got[0] == seen{1});
  REQUIRE(*got[1] == seen{2});
  wait(3s); // not yet: silent for 3 s, not longer
  CHECK(nodes().size() == 2);
  wait(2s);
  auto listed = nodes();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].host == "alive:2"); // its heartbeats kept it
  answer(1, 2, 1.1);                  // frees B's slot: the silent node's candidate moves there
  CHECK(*got[1] == seen{2, 1});
  answer(1, 1, 1.2);
  REQUIRE(verdicts->size() == 2);
  answer(0, 1, 9.9); // the silent node answers at last: ignored
  CHECK(verdicts->size() == 2);
  CHECK(verdicts->at(1).speedup == 1.2);
}

TEST_CASE_FIXTURE(fixture, "a node whose agent goes away is removed at once") {
  auto [agent, welcome] = join(announce("node-a:1"));
  auto [agent2, welcome2] = join(announce("node-b:2"));
  REQUIRE(welcome);
  REQUIRE(welcome2);
  auto verdicts = std::make_shared<std::vector<verdict>>();
  submit(1, verdicts);
  REQUIRE(*got[0] == seen{1});
  self->send_exit(agent, caf::exit_reason::kill); // as a lost connection kills the agent's proxy
  sched.run();
  auto listed = nodes();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].host == "node-b:2");
  CHECK(*got[1] == seen{1});
  answer(1, 1, 1.5);
  REQUIRE(verdicts->size() == 1);
}

TEST_CASE_FIXTURE(fixture, "an orderly leave re-queues the node's candidates and the agent quits normally") {
  auto [agent, welcome] = join(announce("node-a:1"));
  auto [agent2, welcome2] = join(announce("node-b:2"));
  auto verdicts = std::make_shared<std::vector<verdict>>();
  submit(1, verdicts);
  REQUIRE(*got[0] == seen{1});
  self->monitor(agent);
  self->send(agent, caf::leave_atom_v);
  sched.run();
  CHECK(exit_reason_of(agent.address()) == caf::exit_reason::normal);
  REQUIRE(nodes().size() == 1);
  CHECK(*got[1] == seen{1});
  CHECK(pool_devices().size() == 1);
}

TEST_CASE_FIXTURE(fixture, "only a node's own agent can send its heartbeats or make it leave") {
  auto [agent, welcome] = join(announce("node-a:1"));
  REQUIRE(welcome);
  auto h = self->request(members, caf::infinite, caf::leave_atom_v, welcome->node);
  sched.run();
  h.receive([] { FAIL("a stranger made the node leave"); }, [&](caf::error& e) { CHECK(to_error(e).code == errc::not_found); });
  auto hb = self->request(members, caf::infinite, heartbeat_atom_v, welcome->node);
  sched.run();
  hb.receive([] { FAIL("a stranger's heartbeat was taken"); }, [&](caf::error& e) { CHECK(to_error(e).code == errc::not_found); });
  CHECK(nodes().size() == 1);
}

TEST_CASE_FIXTURE(fixture, "an agent quits with worker_lost when the coordinator goes away") {
  auto [agent, welcome] = join(announce("node-a:1"));
  REQUIRE(welcome);
  self->monitor(agent);
  CHECK(pool_devices().size() == 1);
  self->send_exit(members, caf::exit_reason::user_shutdown); // as stop_membership does
  sched.run();
  auto reason = exit_reason_of(agent.address());
  CHECK(to_error(reason).code == errc::worker_lost);
  CHECK(pool_devices().empty()); // the membership actor took its nodes out of the pool as it went
}

TEST_CASE_FIXTURE(fixture, "an agent quits with errc::timeout when its heartbeats go unanswered") {
  auto mute = sys.spawn(mute_membership);
  others.push_back(caf::actor_cast<caf::actor>(mute));
  auto agent = spawn_node_agent(sys, mute, announce("node-a:1"), 10s);
  others.push_back(caf::actor_cast<caf::actor>(agent));
  self->monitor(agent);
  auto h = self->request(agent, caf::infinite, caf::join_atom_v);
  sched.run();
  h.receive([](node_welcome&) {}, [&](caf::error& e) { FAIL(to_error(e).to_string()); });
  wait(3500ms); // the first heartbeat went out after 1 s: not yet 3 s without an answer
  self->receive([](caf::down_msg&) { FAIL("the agent quit before the timeout"); }, caf::after(std::chrono::seconds(0)) >> [] {});
  wait(1s);
  CHECK(to_error(exit_reason_of(agent.address())).code == errc::timeout);
}

TEST_CASE("membership options come from the membership section, the token from its file or the run directory") {
  crucible::testing::temp_dir tmp;
  const auto& dir = tmp.path();
  config cfg;
  cfg.run.name = "r1";
  cfg.membership.heartbeat_s = 0.5;
  cfg.membership.timeout_s = 4;
  auto opt = membership_options::from(cfg, dir);
  REQUIRE_MESSAGE(opt, opt.error().to_string());
  CHECK(opt->listen == "127.0.0.1:0");
  CHECK(opt->run == "r1");
  CHECK(opt->heartbeat == caf::timespan{500ms});
  CHECK(opt->timeout == caf::timespan{4s});
  CHECK(opt->token.size() == 64);
  CHECK(opt->config_yaml == to_yaml(cfg));
  const auto owner_only = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  CHECK((std::filesystem::status(dir / "membership.token").permissions() & std::filesystem::perms::all) == owner_only);
  auto again = membership_options::from(cfg, dir); // a resumed run keeps its token
  REQUIRE(again);
  CHECK(again->token == opt->token);

  cfg.membership.token_file = (dir / "missing").string();
  auto missing = membership_options::from(cfg, dir);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::not_found);
  CHECK(missing.error().message.find("membership.token_file") != std::string::npos);
  cfg.membership.listen = "";
  CHECK(membership_options::from(cfg, dir).error().code == errc::config);
}
