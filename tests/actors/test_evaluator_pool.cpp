// tests/actors/test_evaluator_pool.cpp: the evaluator pool on CAF's deterministic scheduler,
// against fake evaluators that implement evaluator_actor and answer when the test says so:
// balancing, backpressure, lost evaluators and the cross-device recheck of large speedups.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/evaluator.hpp"

using namespace crucible;

namespace {

// A fake evaluator: the evaluator interface, plus a test-only verb with which the test tells
// it to answer one of the candidates it holds.
using fake_evaluator_actor = evaluator_actor::extend<
  // Answers the held candidate `variant` with an ok verdict of `speedup`.
  caf::reacts_to<caf::put_atom, std::uint64_t, double>,
  // Answers the held candidate `variant` with this verdict.
  caf::reacts_to<caf::put_atom, std::uint64_t, verdict>>;

struct held {
  candidate cand;
  caf::typed_response_promise<verdict> rp;
};

struct fake_state {
  std::vector<held> inbox;
  static inline const char* name = "fake_evaluator";
};

// What the test can see of a fake: the variants it holds, in arrival order.
using seen = std::vector<std::uint64_t>;

// An ok verdict of `speedup`, as an evaluator of `hardware` reports it.
verdict ok_verdict(double speedup, const std::string& hardware) {
  verdict v;
  v.status = verdict_status::ok;
  v.correct = true;
  v.speedup = speedup;
  v.speedup_spread = 0.01;
  v.reward = speedup;
  v.hardware = hardware;
  v.message = "faster";
  return v;
}

fake_evaluator_actor::behavior_type fake(fake_evaluator_actor::stateful_pointer<fake_state> self, device_info info,
                                         std::shared_ptr<seen> got, std::shared_ptr<seen> rechecks) {
  auto answer = [=](std::uint64_t variant, const verdict& v) {
    auto& box = self->state.inbox;
    for (auto it = box.begin(); it != box.end(); ++it)
      if (it->cand.variant.value == variant) {
        it->rp.deliver(v);
        box.erase(it);
        return;
      }
  };
  return {
    [=](candidate& c) -> caf::result<verdict> {
      auto rp = self->make_response_promise<verdict>();
      got->push_back(c.variant.value);
      if (c.recheck)
        rechecks->push_back(c.variant.value);
      self->state.inbox.push_back({c, rp});
      return rp;
    },
    [=](caf::get_atom) { return info; },
    [=](caf::put_atom, std::uint64_t variant, double speedup) { answer(variant, ok_verdict(speedup, info.hardware)); },
    [=](caf::put_atom, std::uint64_t variant, const verdict& v) { answer(variant, v); },
  };
}

// A client that submits candidates to the pool and records every outcome.
struct outcome {
  std::uint64_t variant;
  bool ok;
  double speedup;
  errc code;
  verdict v; // the whole verdict, when ok
};

caf::behavior client(caf::event_based_actor* self, evaluator_pool_actor pool, std::shared_ptr<std::vector<outcome>> out) {
  return {
    [=](candidate& c) {
      auto id = c.variant.value;
      self->request(pool, caf::infinite, std::move(c))
        .then([=](const verdict& v) { out->push_back({id, true, v.speedup, errc::none, v}); },
              [=](const caf::error& e) { out->push_back({id, false, 0, to_error(e).code, {}}); });
    },
  };
}

candidate cand(std::uint64_t id, std::string hw = "") {
  return candidate{variant_id{id}, task_id{"t"}, "class ModelNew: pass", std::move(hw)};
}

struct fixture {
  actor_config cfg;
  caf::actor_system sys{[this]() -> actor_config& {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    return cfg;
  }()};
  caf::scoped_actor self{sys, true};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::vector<std::shared_ptr<seen>> got;
  std::vector<std::shared_ptr<seen>> rechecks; // the candidates of got[i] that were rechecks
  std::vector<fake_evaluator_actor> fakes;
  evaluator_pool_actor pool;
  std::shared_ptr<std::vector<outcome>> results = std::make_shared<std::vector<outcome>>();
  caf::actor submitter;

  // Spawns fake number fakes.size() with a device of `hardware`; returns its index.
  // With same_index, every fake says it is device 0 (two nodes' "cpu" devices).
  bool same_index = false;

  size_t spawn_fake(const std::string& hardware) {
    auto i = fakes.size();
    got.push_back(std::make_shared<seen>());
    rechecks.push_back(std::make_shared<seen>());
    device_info info{static_cast<std::uint32_t>(same_index ? 0 : i), hardware + " device", hardware, 1ull << 30};
    fakes.push_back(sys.spawn(fake, info, got.back(), rechecks.back()));
    return i;
  }

  void start(std::vector<std::string> hardware, evaluator_pool_options opt) {
    std::vector<evaluator_actor> handles;
    for (const auto& hw : hardware)
      handles.push_back(fakes[spawn_fake(hw)]);
    pool = spawn_evaluator_pool(sys, handles, opt);
    submitter = sys.spawn(client, pool, results);
    sched.run();
  }

  // Tells the running pool to take (add_atom) or drop (delete_atom) the fakes `which`.
  template <class Atom>
  void change(Atom verb, std::vector<size_t> which) {
    std::vector<caf::actor> handles;
    for (auto i : which)
      handles.push_back(caf::actor_cast<caf::actor>(fakes[i]));
    self->send(pool, verb, std::move(handles));
    sched.run();
  }

  ~fixture() {
    for (auto& f : fakes)
      self->send_exit(f, caf::exit_reason::user_shutdown);
    self->send_exit(pool, caf::exit_reason::user_shutdown);
    self->send_exit(submitter, caf::exit_reason::user_shutdown);
    sched.run();
  }

  void submit(candidate c) {
    self->send(submitter, std::move(c));
    sched.run();
  }

  void answer(size_t fake_index, std::uint64_t variant, double speedup) {
    self->send(fakes[fake_index], caf::put_atom_v, variant, speedup);
    sched.run();
  }

  void answer(size_t fake_index, std::uint64_t variant, const verdict& v) {
    self->send(fakes[fake_index], caf::put_atom_v, variant, v);
    sched.run();
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "candidates go to the evaluator with the shortest queue and wait when all are full") {
  start({"A", "A"}, {2, 8});
  for (std::uint64_t i = 1; i <= 4; ++i)
    submit(cand(i));
  CHECK(*got[0] == seen{1, 3});
  CHECK(*got[1] == seen{2, 4});
  submit(cand(5)); // every slot taken: waits in the pool
  CHECK(got[0]->size() + got[1]->size() == 4);
  answer(1, 2, 1.5);
  CHECK(*got[1] == seen{2, 4, 5}); // the freed slot took candidate 5
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).variant == 2);
  CHECK(results->at(0).ok);
  CHECK(results->at(0).speedup == 1.5);
}

TEST_CASE_FIXTURE(fixture, "a candidate that names a hardware kind goes only to evaluators of that kind") {
  start({"L40", "H100"}, {2, 8});
  submit(cand(1, "H100"));
  CHECK(got[0]->empty());
  CHECK(*got[1] == seen{1});
  submit(cand(2, "MI300"));
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).variant == 2);
  CHECK_FALSE(results->at(0).ok);
  CHECK(results->at(0).code == errc::not_found);
}

TEST_CASE_FIXTURE(fixture, "a full pool pushes back with errc::busy instead of queueing without bound") {
  start({"A"}, {1, 1});
  submit(cand(1)); // sent
  submit(cand(2)); // waits
  submit(cand(3)); // refused
  CHECK(*got[0] == seen{1});
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).variant == 3);
  CHECK(results->at(0).code == errc::busy);
  answer(0, 1, 1.2);
  CHECK(*got[0] == seen{1, 2}); // the waiting one moves up
}

TEST_CASE_FIXTURE(fixture, "the candidates of an evaluator that dies are sent to another: nothing is lost") {
  start({"A", "A"}, {1, 8});
  submit(cand(1));
  submit(cand(2));
  REQUIRE(*got[0] == seen{1});
  REQUIRE(*got[1] == seen{2});
  self->send_exit(fakes[0], caf::exit_reason::kill);
  sched.run();
  answer(1, 2, 1.1); // frees the survivor's slot for the lost candidate
  CHECK(*got[1] == seen{2, 1});
  answer(1, 1, 2.0);
  REQUIRE(results->size() == 2);
  CHECK(results->at(0).variant == 2);
  CHECK(results->at(1).variant == 1);
  CHECK(results->at(1).ok);
  CHECK(results->at(1).speedup == 2.0);
}

TEST_CASE_FIXTURE(fixture, "an empty pool holds candidates until evaluators are added to it") {
  start({}, {2, 8});
  submit(cand(1));
  submit(cand(2, "B"));
  CHECK(results->empty()); // waiting, not refused: nodes join later
  auto a = spawn_fake("A");
  change(caf::add_atom_v, {a});
  CHECK(*got[a] == seen{1});
  // Now that the pool holds evaluators, a kind none of them has is refused, the waiting one too.
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).variant == 2);
  CHECK(results->at(0).code == errc::not_found);
  submit(cand(3, "B"));
  REQUIRE(results->size() == 2);
  CHECK(results->at(1).code == errc::not_found);
  auto b = spawn_fake("B");
  change(caf::add_atom_v, {b, a}); // a is in the pool already: ignored
  submit(cand(4, "B"));
  CHECK(*got[b] == seen{4});
  CHECK(*got[a] == seen{1});
  answer(a, 1, 1.3);
  REQUIRE(results->size() == 3);
  CHECK(results->at(2).variant == 1);
  CHECK(results->at(2).speedup == 1.3);
}

TEST_CASE_FIXTURE(fixture, "the candidates of evaluators removed from the pool are sent to another and their late verdicts ignored") {
  start({"A", "A"}, {1, 8});
  submit(cand(1));
  submit(cand(2));
  REQUIRE(*got[0] == seen{1});
  REQUIRE(*got[1] == seen{2});
  change(caf::delete_atom_v, {0});
  answer(0, 1, 9.0); // the removed evaluator answers after all: nobody listens
  CHECK(results->empty());
  answer(1, 2, 1.1);
  CHECK(*got[1] == seen{2, 1});
  answer(1, 1, 2.0);
  REQUIRE(results->size() == 2);
  CHECK(results->at(1).variant == 1);
  CHECK(results->at(1).speedup == 2.0);
  submit(cand(3));
  CHECK(*got[0] == seen{1}); // no longer in the pool
  CHECK(*got[1] == seen{2, 1, 3});
}

TEST_CASE_FIXTURE(fixture, "when the last evaluator dies its candidates wait for the next one to join") {
  start({"A"}, {1, 8});
  submit(cand(1));
  REQUIRE(*got[0] == seen{1});
  self->send_exit(fakes[0], caf::exit_reason::kill);
  sched.run();
  CHECK(results->empty());
  auto b = spawn_fake("A");
  change(caf::add_atom_v, {b});
  CHECK(*got[b] == seen{1});
  answer(b, 1, 1.5);
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).ok);
}

TEST_CASE_FIXTURE(fixture, "the pool lists its devices and hardware kinds") {
  start({"A", "B"}, {2, 8});
  auto h = self->request(pool, caf::infinite, caf::get_atom_v);
  sched.run();
  std::vector<device_info> devices;
  h.receive([&](std::vector<device_info>& d) { devices = d; }, [&](caf::error& e) { FAIL(to_error(e).to_string()); });
  REQUIRE(devices.size() == 2);
  CHECK(devices[0].hardware == "A");
  CHECK(devices[1].hardware == "B");
}

// -- the cross-device recheck of large speedups --------------------------------------------

namespace {

// Recheck above 3x, 10% tolerance, failed verdicts rewarded -1.
evaluator_pool_options recheck_opt() {
  evaluator_pool_options opt;
  opt.recheck.above = 3.0;
  opt.recheck.tolerance = 0.10;
  opt.recheck.reward.failed = -1;
  return opt;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("pool options take the recheck settings and the reward options from the config") {
  config cfg;
  cfg.evaluator.recheck_above = 5;
  cfg.evaluator.recheck_tolerance = 0.2;
  cfg.reward.failed = -3;
  auto opt = evaluator_pool_options::from(cfg);
  CHECK(opt.recheck.above == 5);
  CHECK(opt.recheck.tolerance == 0.2);
  CHECK(opt.recheck.reward.failed == -3);
  CHECK(opt.slots_per_evaluator == evaluator_pool_options{}.slots_per_evaluator);
}

TEST_CASE_FIXTURE(fixture, "a speedup below the threshold is not rechecked") {
  start({"A", "A"}, recheck_opt());
  submit(cand(1));
  answer(0, 1, 2.9);
  CHECK(got[1]->empty());
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).speedup == 2.9);
}

TEST_CASE_FIXTURE(fixture, "a large speedup confirmed on a second device of the kind stands with the lower speedup") {
  start({"A", "A"}, recheck_opt());
  submit(cand(1));
  REQUIRE(*got[0] == seen{1});
  answer(0, 1, 4.0);
  CHECK(results->empty()); // not yet: the second device measures it first
  CHECK(*got[1] == seen{1});
  CHECK(*rechecks[1] == seen{1});
  answer(1, 1, 3.7); // within 10% of 3.7
  REQUIRE(results->size() == 1);
  const auto& v = results->at(0).v;
  CHECK(v.status == verdict_status::ok);
  CHECK(v.speedup == 3.7);
  CHECK(v.reward == 3.7);
  CHECK_MESSAGE(contains(v.message, "4.000x on device 0 (A device)"), v.message);
  CHECK_MESSAGE(contains(v.message, "3.700x on device 1 (A device)"), v.message);
  CHECK(*got[0] == seen{1}); // a recheck (3.7 > 3) is not itself rechecked
  CHECK(rechecks[0]->empty());
}

TEST_CASE_FIXTURE(fixture, "a large speedup that a second device of the kind does not confirm is rejected") {
  start({"A", "A"}, recheck_opt());
  submit(cand(1));
  answer(0, 1, 4.5);
  answer(1, 1, 3.0);
  REQUIRE(results->size() == 1);
  const auto& v = results->at(0).v;
  CHECK(v.status == verdict_status::rejected);
  CHECK_FALSE(v.has_speedup());
  CHECK(v.reward == -1);
  CHECK(v.checks_failed == std::vector<std::string>{"runtime:recheck"});
  CHECK_MESSAGE(contains(v.message, "4.500x on device 0 (A device)"), v.message);
  CHECK_MESSAGE(contains(v.message, "3.000x on device 1 (A device)"), v.message);
}

TEST_CASE_FIXTURE(fixture, "a disagreement between two devices of one name and index names them apart") {
  same_index = true; // two evaluators' "device 0 (cpu)", as two CPU nodes' are
  start({"A", "A"}, recheck_opt());
  submit(cand(1));
  answer(0, 1, 4.5);
  answer(1, 1, 3.0);
  REQUIRE(results->size() == 1);
  const auto& v = results->at(0).v;
  CHECK(v.status == verdict_status::rejected);
  CHECK_MESSAGE(contains(v.message, "4.500x on device 0 (A device), pool member 1"), v.message);
  CHECK_MESSAGE(contains(v.message, "3.000x on device 0 (A device), pool member 2"), v.message);
}

TEST_CASE_FIXTURE(fixture, "a recheck that fails on the second device gives the second verdict") {
  start({"A", "A"}, recheck_opt());
  submit(cand(1));
  answer(0, 1, 4.5);
  verdict wrong;
  wrong.status = verdict_status::incorrect;
  wrong.message = "output 0 differs: max abs error 3.1";
  wrong.reward = -1;
  answer(1, 1, wrong);
  REQUIRE(results->size() == 1);
  const auto& v = results->at(0).v;
  CHECK(v.status == verdict_status::incorrect);
  CHECK(v.reward == -1);
  CHECK_MESSAGE(contains(v.message, "output 0 differs"), v.message);
  CHECK_MESSAGE(contains(v.message, "4.500x on device 0"), v.message);
}

TEST_CASE_FIXTURE(fixture, "the recheck goes to a device of the same kind, never to one of another kind") {
  start({"A", "B", "A"}, recheck_opt());
  submit(cand(1, "A")); // device 0
  submit(cand(2, "A")); // device 2: both A devices now hold one candidate, B none
  REQUIRE(*got[0] == seen{1});
  REQUIRE(*got[2] == seen{2});
  answer(0, 1, 6.0);
  CHECK(got[1]->empty());
  CHECK(*got[2] == seen{2, 1});
  CHECK(*rechecks[2] == seen{1});
  answer(2, 1, 6.1);
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).v.status == verdict_status::ok);
  CHECK(results->at(0).speedup == 6.0);
}

TEST_CASE_FIXTURE(fixture, "with only one device of the kind a large speedup is delivered as measured") {
  start({"A", "B"}, recheck_opt());
  submit(cand(1, "A"));
  answer(0, 1, 6.0);
  CHECK(got[1]->empty());
  REQUIRE(results->size() == 1);
  CHECK(results->at(0).v.status == verdict_status::ok);
  CHECK(results->at(0).speedup == 6.0);
  CHECK(results->at(0).v.message == "faster");
}

TEST_CASE_FIXTURE(fixture, "when the second evaluator dies during the recheck the first verdict stands") {
  start({"A", "A"}, recheck_opt());
  submit(cand(1));
  answer(0, 1, 5.0);
  REQUIRE(*rechecks[1] == seen{1});
  self->send_exit(fakes[1], caf::exit_reason::kill);
  sched.run();
  REQUIRE(results->size() == 1);
  const auto& v = results->at(0).v;
  CHECK(v.status == verdict_status::ok);
  CHECK(v.speedup == 5.0);
  CHECK_MESSAGE(contains(v.message, "recheck on a second device was lost"), v.message);
  CHECK(*got[0] == seen{1}); // not measured again on the first device
}

TEST_CASE_FIXTURE(fixture, "a recheck waits for a free slot on the second device, ahead of new candidates") {
  auto opt = recheck_opt();
  opt.slots_per_evaluator = 1;
  start({"A", "A"}, opt);
  submit(cand(1)); // device 0
  submit(cand(2)); // device 1
  submit(cand(3)); // waits
  answer(0, 1, 4.0); // device 0 free: candidate 3 goes there; the recheck of 1 waits for device 1
  CHECK(*got[0] == seen{1, 3});
  submit(cand(4));   // waits behind the recheck
  answer(1, 2, 1.5); // device 1 free: the recheck of 1 goes there, not candidate 4
  CHECK(*got[1] == seen{2, 1});
  CHECK(*rechecks[1] == seen{1});
  answer(1, 1, 4.1);
  REQUIRE(results->size() == 2);
  CHECK(results->at(1).variant == 1);
  CHECK(results->at(1).speedup == 4.0);
}
