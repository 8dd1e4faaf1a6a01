// tests/actors/test_exemplar.cpp: the exemplar actor on CAF's deterministic scheduler, with a
// real replay store in a temp directory and group sinks that stand in for learners:
// exemplars from recorded variants, reproducible selection, group assembly, the straggler
// timeout (drop and fill) on the test clock, duplicates, backpressure, and restarts.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/exemplar.hpp"
#include "core/sha256.hpp"
#include "env/task.hpp"
#include "storage/replay_store.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
using namespace std::chrono_literals;

namespace {

using crucible::testing::temp_dir;

using crucible::testing::deterministic;

using groups_seen = std::vector<rollout_group>;

// A group sink that keeps the groups it receives, and the ids of those dropped (in `dropped`).
group_sink_actor::behavior_type fake_learner(group_sink_actor::pointer, std::shared_ptr<groups_seen> got,
                                             std::shared_ptr<std::vector<group_id>> dropped) {
  return {
    [=](rollout_group& g) { got->push_back(std::move(g)); },
    [=](group_dropped& d) { dropped->push_back(d.group); },
  };
}

const task_id relu{"level1/19_ReLU"};

verdict ok_verdict(double speedup) {
  verdict v;
  v.status = verdict_status::ok;
  v.correct = true;
  v.speedup = speedup;
  v.speedup_spread = 0.02;
  v.ref_ms = 2.0;
  v.cand_ms = 2.0 / speedup;
  v.reward = speedup;
  v.message = "faster";
  v.checks_failed = {"static:note"};
  return v;
}

verdict failed_verdict(verdict_status status) {
  verdict v;
  v.status = status;
  v.reward = 0;
  v.message = to_string(status);
  return v;
}

// Distinct code per id (normalisation keeps every token, so the hashes differ).
std::string code_of(std::uint64_t id) {
  return "def f" + std::to_string(id) + "():\n    return " + std::to_string(id) + "\n";
}

scored_variant scored(std::uint64_t id, verdict v, std::string hardware = "h100", task_id task = relu,
                      std::uint64_t group = 0) {
  scored_variant x;
  x.variant = variant_id{id};
  x.group = group_id{group};
  x.task = std::move(task);
  x.code = code_of(id);
  x.verdict = std::move(v);
  x.hardware = std::move(hardware);
  x.policy_version = policy_version{4};
  x.exemplars = {variant_id{1}, variant_id{2}};
  return x;
}

group_announce announce_of(std::uint64_t group, std::vector<std::uint64_t> variants) {
  group_announce a;
  a.group = group_id{group};
  a.task = relu;
  a.prompt_token_ids = {1, 2, 3};
  for (auto id : variants) {
    a.completions.push_back(completion{"completion " + std::to_string(id),
                                       {static_cast<std::int32_t>(id), 7},
                                       {-0.5f, -0.25f},
                                       policy_version{4}});
    a.variants.push_back(variant_id{id});
  }
  return a;
}

scored_variant member(std::uint64_t group, std::uint64_t id, verdict v) {
  return scored(id, std::move(v), "h100", relu, group);
}

std::set<std::string> codes(const exemplar_set& s) {
  std::set<std::string> out;
  for (const auto& x : s.exemplars)
    out.insert(x.code);
  return out;
}

struct fixture {
  temp_dir dir;
  std::filesystem::path db = dir.path() / "replay.db";
  actor_config cfg;
  caf::actor_system sys{deterministic(cfg)};
  caf::scoped_actor self{sys, true};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<groups_seen> got = std::make_shared<groups_seen>();
  std::shared_ptr<std::vector<group_id>> dropped = std::make_shared<std::vector<group_id>>();
  group_sink_actor learner = sys.spawn(fake_learner, got, dropped);
  std::vector<exemplar_actor> spawned;

  ~fixture() {
    for (auto& a : spawned)
      self->send_exit(a, caf::exit_reason::user_shutdown);
    self->send_exit(learner, caf::exit_reason::user_shutdown);
    sched.run();
  }

  exemplar_actor_options options(std::uint64_t seed = 7) {
    exemplar_actor_options opt;
    opt.store = db;
    opt.seed = seed;
    opt.straggler_timeout_s = 30;
    opt.detached = false;
    return opt;
  }

  exemplar_actor spawn(exemplar_actor_options opt, std::vector<group_sink_actor> learners = {}) {
    if (learners.empty())
      learners.push_back(learner);
    auto a = spawn_exemplar_actor(sys, std::move(opt), std::move(learners));
    REQUIRE_MESSAGE(a.ok(), a.error().to_string());
    spawned.push_back(*a);
    sched.run();
    return *a;
  }

  void stop(const exemplar_actor& a) {
    self->send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  // Sends a request, runs every actor until idle and returns the reply; no reply is a failure
  // (rather than a blocking receive that never returns).
  template <class Out, class Msg>
  result<Out> ask(const exemplar_actor& a, Msg msg) {
    auto rh = self->request(a, caf::infinite, std::move(msg));
    sched.run();
    if (self->mailbox().empty())
      return fail(errc::timeout, "the exemplar actor did not reply");
    std::optional<result<Out>> out;
    rh.receive([&](Out& x) { out.emplace(std::move(x)); }, [&](caf::error& e) { out.emplace(to_error(e)); });
    REQUIRE(out.has_value());
    return std::move(*out);
  }

  exemplar_set exemplars(const exemplar_actor& a, std::uint32_t count, std::string hardware = "h100",
                         task_id task = relu) {
    auto r = ask<exemplar_set>(a, exemplar_request{task, hardware, count});
    REQUIRE_MESSAGE(r.ok(), r.error().to_string());
    CHECK(r->task == task);
    CHECK(r->hardware == hardware);
    return std::move(*r);
  }

  exemplar_stats stats(const exemplar_actor& a) {
    auto r = ask<exemplar_stats>(a, caf::get_atom_v);
    REQUIRE_MESSAGE(r.ok(), r.error().to_string());
    return *r;
  }

  // The announce's reply: errc::none when accepted.
  errc announce(const exemplar_actor& a, group_announce g) {
    auto rh = self->request(a, caf::infinite, std::move(g));
    sched.run();
    if (self->mailbox().empty())
      return errc::timeout;
    std::optional<errc> out;
    rh.receive([&]() { out = errc::none; }, [&](caf::error& e) { out = to_error(e).code; });
    REQUIRE(out.has_value());
    return *out;
  }

  void tell(const exemplar_actor& a, scored_variant x) {
    self->send(a, std::move(x));
    sched.run();
  }

  // Advances the test clock by `d`; delayed messages that fall due are delivered and handled.
  void advance(caf::timespan d) {
    sched.advance_time(d);
    sched.run();
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "a request on an empty store gets an empty set") {
  auto a = spawn(options());
  CHECK(exemplars(a, 3).exemplars.empty());
  CHECK(exemplars(a, 0).exemplars.empty()); // 0: the configured default count
  CHECK(stats(a) == exemplar_stats{});
  CHECK(std::filesystem::exists(db));
}

TEST_CASE_FIXTURE(fixture, "recorded variants become exemplars, only successful ones of the same task and hardware") {
  auto a = spawn(options());
  // Successful on h100 for relu, one per score bucket (bucket width 0.5): three buckets.
  tell(a, scored(1, ok_verdict(1.2)));
  tell(a, scored(2, ok_verdict(2.0)));
  tell(a, scored(3, ok_verdict(3.1)));
  // Not exemplars: failed, correct-but-not-ok, other hardware, other task, NaN reward.
  tell(a, scored(4, failed_verdict(verdict_status::incorrect)));
  tell(a, scored(5, failed_verdict(verdict_status::compile_error)));
  auto rejected = ok_verdict(9.0);
  rejected.status = verdict_status::rejected;
  tell(a, scored(6, rejected));
  tell(a, scored(7, ok_verdict(5.0), "l40"));
  tell(a, scored(8, ok_verdict(6.0), "h100", task_id{"level1/1_Matmul"}));
  auto nan_reward = ok_verdict(1.5);
  nan_reward.reward = NAN;
  tell(a, scored(9, nan_reward));
  CHECK(stats(a).recorded == 9);
  CHECK(stats(a).unknown == 0); // group 0: no group, nothing to count

  auto all = exemplars(a, 10);
  CHECK(codes(all) == std::set<std::string>{code_of(1), code_of(2), code_of(3)});
  auto two = exemplars(a, 2);
  CHECK(two.exemplars.size() == 2);
  CHECK(exemplars(a, 0).exemplars.size() == 2); // the default count, selection.n
  CHECK(codes(exemplars(a, 5, "l40")) == std::set<std::string>{code_of(7)});
  CHECK(exemplars(a, 5, "a100").exemplars.empty());
  CHECK(codes(exemplars(a, 5, "h100", task_id{"level1/1_Matmul"})) == std::set<std::string>{code_of(8)});

  // An exemplar carries what was recorded; its variant id is the store's row id.
  auto open = storage::replay_store::open(db);
  REQUIRE(open.ok());
  for (const auto& x : all.exemplars) {
    auto row = open->find(static_cast<std::int64_t>(x.variant.value));
    REQUIRE_MESSAGE(row.ok(), row.error().to_string());
    CHECK(row->code == x.code);
    CHECK(row->code_hash == sha256_hex(env::normalize_source(x.code)));
    CHECK(row->group_id == 0);
    CHECK(row->exemplar_ids == "[1,2]");
    CHECK(x.task == relu);
    CHECK(x.hardware == "h100");
    CHECK(x.policy_version == policy_version{4});
    CHECK(x.exemplars == std::vector<variant_id>{variant_id{1}, variant_id{2}});
    CHECK(x.verdict.status == verdict_status::ok);
    CHECK(x.verdict.correct);
    CHECK(x.verdict.checks_failed == std::vector<std::string>{"static:note"});
    CHECK(x.verdict.message == "faster");
    CHECK(x.verdict.speedup_spread == 0.02);
    CHECK(x.verdict.reward == x.verdict.speedup);
    CHECK(x.verdict.cand_ms == doctest::Approx(2.0 / x.verdict.speedup));
  }
}

TEST_CASE_FIXTURE(fixture, "the same code up to normalisation is stored once") {
  auto a = spawn(options());
  auto x = scored(1, ok_verdict(1.5));
  tell(a, x);
  x.variant = variant_id{2};
  x.code = "def f1():   \r\n    return 1\r\n\r\n"; // CRLF and trailing blanks
  x.verdict = ok_verdict(2.5);
  tell(a, x);
  CHECK(stats(a).recorded == 2);
  REQUIRE(env::normalize_source(x.code) == env::normalize_source(code_of(1)));
  auto open = storage::replay_store::open(db);
  REQUIRE(open.ok());
  CHECK(*open->count() == 1);
  CHECK(open->find(1)->count == 2);
  auto set = exemplars(a, 5);
  REQUIRE(set.exemplars.size() == 1);
  CHECK(set.exemplars[0].verdict.speedup == 2.5); // the better verdict is kept
}

TEST_CASE_FIXTURE(fixture, "with seeds_only the exemplars are the seed variants, never the policy's samples") {
  // Seed variants come in as group 0 (the warm start); samples carry their group.
  auto writer = spawn(options());
  tell(writer, scored(1, ok_verdict(1.2)));
  tell(writer, scored(2, ok_verdict(2.0)));
  REQUIRE(announce(writer, announce_of(9, {3, 4})) == errc::none);
  tell(writer, member(9, 3, ok_verdict(3.1)));
  tell(writer, member(9, 4, ok_verdict(4.5)));
  CHECK(codes(exemplars(writer, 10)) == std::set<std::string>{code_of(1), code_of(2), code_of(3), code_of(4)});
  stop(writer);

  auto opt = options();
  opt.seeds_only = true;
  auto a = spawn(opt);
  CHECK(codes(exemplars(a, 10)) == std::set<std::string>{code_of(1), code_of(2)});
  // A sample that reproduces a seed's code with an equal verdict (a verdict-cache hit) leaves it a seed.
  REQUIRE(announce(a, announce_of(10, {1})) == errc::none);
  tell(a, member(10, 1, ok_verdict(1.2)));
  CHECK(codes(exemplars(a, 10)) == std::set<std::string>{code_of(1), code_of(2)});
  // A task with no seed variant gets the reference-only prompt, even with successful samples.
  CHECK(exemplars(a, 10, "h100", task_id{"level1/1_Matmul"}).exemplars.empty());
  tell(a, scored(11, ok_verdict(6.0), "h100", task_id{"level1/1_Matmul"}, 12));
  CHECK(exemplars(a, 10, "h100", task_id{"level1/1_Matmul"}).exemplars.empty());
}

TEST_CASE_FIXTURE(fixture, "exemplar selection is reproducible with the same seed") {
  {
    auto writer = spawn(options());
    for (std::uint64_t i = 1; i <= 12; ++i)
      tell(writer, scored(i, ok_verdict(1.0 + 0.5 * static_cast<double>(i))));
    stop(writer);
  }
  auto draws = [&](std::uint64_t seed, storage::selection_method method) {
    auto opt = options(seed);
    opt.selection.method = method;
    auto a = spawn(opt);
    std::vector<std::vector<std::uint64_t>> out;
    for (int i = 0; i < 6; ++i) {
      std::vector<std::uint64_t> ids;
      for (const auto& x : exemplars(a, 3).exemplars)
        ids.push_back(x.variant.value);
      // Island selection draws within one island, which may hold fewer than 3.
      CHECK(!ids.empty());
      if (method != storage::selection_method::island)
        CHECK(ids.size() == 3);
      out.push_back(ids);
    }
    stop(a);
    return out;
  };
  for (auto method : {storage::selection_method::contrastive, storage::selection_method::random,
                      storage::selection_method::island}) {
    CAPTURE(static_cast<int>(method));
    auto first = draws(7, method);
    CHECK(draws(7, method) == first);
    CHECK(draws(8, method) != first);
  }
}

TEST_CASE_FIXTURE(fixture, "a complete group reaches the learner with verdicts in completion order") {
  auto a = spawn(options());
  REQUIRE(announce(a, announce_of(5, {11, 12, 13})) == errc::none);
  CHECK(stats(a).open_groups == 1);
  // Verdicts come back in any order.
  tell(a, member(5, 13, failed_verdict(verdict_status::compile_error)));
  tell(a, member(5, 11, ok_verdict(1.5)));
  CHECK(got->empty());
  tell(a, member(5, 12, ok_verdict(2.5)));
  REQUIRE(got->size() == 1);
  const auto& g = got->at(0);
  auto expected = announce_of(5, {11, 12, 13});
  CHECK(g.group == group_id{5});
  CHECK(g.task == relu);
  CHECK(g.prompt_token_ids == expected.prompt_token_ids);
  CHECK(g.completions == expected.completions);
  REQUIRE(g.verdicts.size() == 3);
  CHECK(g.verdicts[0] == ok_verdict(1.5));
  CHECK(g.verdicts[1] == ok_verdict(2.5));
  CHECK(g.verdicts[2] == failed_verdict(verdict_status::compile_error));
  auto s = stats(a);
  CHECK(s.groups_completed == 1);
  CHECK(s.recorded == 3);
  CHECK(s.open_groups == 0);

  // Its straggler timeout passes without effect.
  advance(60s);
  CHECK(got->size() == 1);
  s = stats(a);
  CHECK(s.groups_dropped == 0);
  CHECK(s.groups_filled == 0);

  // The recorded members carry the group id.
  auto open = storage::replay_store::open(db);
  REQUIRE(open.ok());
  auto set = exemplars(a, 5);
  REQUIRE(set.exemplars.size() == 2);
  for (const auto& x : set.exemplars)
    CHECK(x.group == group_id{5});
}

TEST_CASE_FIXTURE(fixture, "complete groups go to the learners in turn") {
  auto got2 = std::make_shared<groups_seen>();
  group_sink_actor second = sys.spawn(fake_learner, got2, dropped);
  auto a = spawn(options(), {learner, second});
  for (std::uint64_t g = 1; g <= 3; ++g) {
    REQUIRE(announce(a, announce_of(g, {10 * g})) == errc::none);
    tell(a, member(g, 10 * g, ok_verdict(1.5)));
  }
  REQUIRE(got->size() == 2);
  REQUIRE(got2->size() == 1);
  CHECK(got->at(0).group == group_id{1});
  CHECK(got2->at(0).group == group_id{2});
  CHECK(got->at(1).group == group_id{3});
  self->send_exit(second, caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(fixture, "a straggler group is dropped after the timeout") {
  auto opt = options();
  opt.on_straggler = straggler_policy::drop;
  auto a = spawn(opt);
  REQUIRE(announce(a, announce_of(5, {11, 12, 13})) == errc::none);
  tell(a, member(5, 11, ok_verdict(1.5)));
  tell(a, member(5, 12, ok_verdict(2.5)));
  advance(29s);
  CHECK(stats(a).open_groups == 1);
  CHECK(stats(a).groups_dropped == 0);
  advance(2s);
  auto s = stats(a);
  CHECK(s.open_groups == 0);
  CHECK(s.groups_dropped == 1);
  CHECK(got->empty());
  // Its sink is told the group will never come (the trainer admits another in its place).
  REQUIRE(dropped->size() == 1);
  CHECK(dropped->front() == group_id{5});
  // The straggler arrives late: recorded (a real measurement), counted, no group.
  tell(a, member(5, 13, ok_verdict(3.5)));
  s = stats(a);
  CHECK(s.unknown == 1);
  CHECK(s.recorded == 3);
  CHECK(got->empty());
}

TEST_CASE_FIXTURE(fixture, "a straggler group is filled after the timeout") {
  auto opt = options();
  opt.on_straggler = straggler_policy::fill;
  opt.fill_reward = -0.5;
  auto a = spawn(opt);
  REQUIRE(announce(a, announce_of(5, {11, 12, 13})) == errc::none);
  tell(a, member(5, 11, ok_verdict(1.5)));
  tell(a, member(5, 13, ok_verdict(2.5)));
  advance(29s);
  CHECK(got->empty());
  advance(2s);
  REQUIRE(got->size() == 1);
  const auto& g = got->at(0);
  REQUIRE(g.verdicts.size() == 3);
  CHECK(g.verdicts[0] == ok_verdict(1.5));
  CHECK(g.verdicts[2] == ok_verdict(2.5));
  CHECK(g.verdicts[1].status == verdict_status::timeout);
  CHECK_FALSE(g.verdicts[1].correct);
  CHECK_FALSE(g.verdicts[1].has_speedup());
  CHECK(g.verdicts[1].reward == -0.5);
  CHECK(g.verdicts[1].message.find("straggler timeout of 30 s") != std::string::npos);
  CHECK(g.completions == announce_of(5, {11, 12, 13}).completions);
  CHECK(dropped->empty()); // a filled group is no dropped one
  auto s = stats(a);
  CHECK(s.groups_filled == 1);
  CHECK(s.groups_completed == 0);
  CHECK(s.recorded == 2); // a filled verdict is not a measurement: not recorded
  tell(a, member(5, 12, ok_verdict(3.0)));
  CHECK(got->size() == 1);
  CHECK(stats(a).unknown == 1);
}

TEST_CASE_FIXTURE(fixture, "each group has its own timeout and a re-announced id gets a fresh one") {
  auto opt = options();
  opt.on_straggler = straggler_policy::drop;
  auto a = spawn(opt);
  REQUIRE(announce(a, announce_of(1, {11})) == errc::none); // its timer: t = 30 s
  tell(a, member(1, 11, ok_verdict(1.5)));                  // complete at once
  REQUIRE(got->size() == 1);
  advance(10s);
  REQUIRE(announce(a, announce_of(2, {21, 22})) == errc::none); // t = 40 s
  REQUIRE(announce(a, announce_of(1, {12, 13})) == errc::none); // id 1 again: t = 40 s
  advance(21s); // t = 31 s: the first announce's timer passes; the new group 1 stays open
  CHECK(stats(a).groups_dropped == 0);
  CHECK(stats(a).open_groups == 2);
  tell(a, member(2, 21, ok_verdict(1.5)));
  advance(10s); // t = 41 s: both new groups are past their timeout
  auto s = stats(a);
  CHECK(s.groups_dropped == 2);
  CHECK(s.open_groups == 0);
  CHECK(got->size() == 1);
}

TEST_CASE_FIXTURE(fixture, "duplicate and unknown verdicts are counted and ignored") {
  auto a = spawn(options());
  REQUIRE(announce(a, announce_of(5, {11, 12})) == errc::none);
  tell(a, member(5, 11, ok_verdict(1.5)));
  tell(a, member(5, 11, ok_verdict(9.0))); // duplicate: the first verdict stands
  tell(a, member(5, 99, ok_verdict(1.7))); // not a member of group 5
  tell(a, member(6, 12, ok_verdict(1.8))); // group 6 was never announced
  auto s = stats(a);
  CHECK(s.duplicates == 1);
  CHECK(s.unknown == 2);
  CHECK(s.recorded == 3); // the duplicate is not recorded again
  CHECK(got->empty());
  tell(a, member(5, 12, ok_verdict(2.5)));
  REQUIRE(got->size() == 1);
  CHECK(got->at(0).verdicts[0] == ok_verdict(1.5));
  CHECK(got->at(0).verdicts[1] == ok_verdict(2.5));
  tell(a, member(5, 12, ok_verdict(2.5))); // after completion: the group is no longer open
  CHECK(stats(a).unknown == 3);
  CHECK(got->size() == 1);
  auto open = storage::replay_store::open(db);
  REQUIRE(open.ok());
  auto row = open->find(1);
  REQUIRE(row.ok());
  CHECK(row->count == 1);
  CHECK(*row->speedup == 1.5);
}

TEST_CASE_FIXTURE(fixture, "announces beyond the open-group bound get errc::busy") {
  auto opt = options();
  opt.max_open_groups = 2;
  auto a = spawn(opt);
  CHECK(announce(a, announce_of(1, {11})) == errc::none);
  CHECK(announce(a, announce_of(2, {21})) == errc::none);
  CHECK(announce(a, announce_of(3, {31})) == errc::busy);
  CHECK(stats(a).groups_refused == 1);
  CHECK(stats(a).open_groups == 2);
  // Verdicts of the refused group are recorded but join nothing.
  tell(a, member(3, 31, ok_verdict(1.5)));
  CHECK(stats(a).unknown == 1);
  // A completed group frees its place.
  tell(a, member(1, 11, ok_verdict(1.5)));
  CHECK(got->size() == 1);
  CHECK(announce(a, announce_of(3, {31})) == errc::none);
  CHECK(stats(a).open_groups == 2);
}

TEST_CASE_FIXTURE(fixture, "malformed announces are refused with errc::invalid_arg") {
  auto a = spawn(options());
  CHECK(announce(a, announce_of(0, {11})) == errc::invalid_arg);
  CHECK(announce(a, announce_of(1, {})) == errc::invalid_arg);
  auto mismatched = announce_of(1, {11, 12});
  mismatched.variants.pop_back();
  CHECK(announce(a, mismatched) == errc::invalid_arg);
  CHECK(announce(a, announce_of(1, {11, 11})) == errc::invalid_arg);
  CHECK(announce(a, announce_of(1, {11})) == errc::none);
  CHECK(announce(a, announce_of(1, {12})) == errc::invalid_arg); // already open
  auto s = stats(a);
  CHECK(s.open_groups == 1);
  CHECK(s.groups_refused == 0);
}

TEST_CASE_FIXTURE(fixture, "a variant without a hardware kind is counted as a record error") {
  auto a = spawn(options());
  REQUIRE(announce(a, announce_of(5, {11})) == errc::none);
  auto x = member(5, 11, ok_verdict(1.5));
  x.hardware.clear();
  tell(a, x);
  auto s = stats(a);
  CHECK(s.record_errors == 1);
  CHECK(s.recorded == 0);
  CHECK(got->size() == 1); // the group still goes on: the learner needs the verdict
}

TEST_CASE_FIXTURE(fixture, "the store persists across an actor restart") {
  auto first = spawn(options());
  tell(first, scored(1, ok_verdict(1.5)));
  tell(first, scored(2, ok_verdict(2.5)));
  stop(first);
  auto second = spawn(options());
  CHECK(codes(exemplars(second, 5)) == std::set<std::string>{code_of(1), code_of(2)});
  CHECK(stats(second).recorded == 0); // counters are per actor; the rows are the store's
}

TEST_CASE("exemplar actor options come from the exemplar and reward config sections") {
  auto cfg = parse_config("run:\n  seed: 77\nreward:\n  failed: -0.5\nexemplar:\n  method: island\n  n: 3\n"
                          "  tau: 0.25\n  islands: 5\n  straggler_timeout_s: 42\n  straggler_policy: fill\n  seeds_only: true\n",
                          "x.yaml");
  REQUIRE(cfg.ok());
  auto o = exemplar_actor_options::from(*cfg, "/tmp/run/replay.db");
  CHECK(o.store == std::filesystem::path("/tmp/run/replay.db"));
  CHECK(o.selection.method == storage::selection_method::island);
  CHECK(o.selection.n == 3);
  CHECK(o.selection.tau == 0.25);
  CHECK(o.selection.islands == 5);
  CHECK(o.straggler_timeout_s == 42);
  CHECK(o.on_straggler == straggler_policy::fill);
  CHECK(o.fill_reward == -0.5);
  CHECK(o.seed == 77);
  CHECK(o.seeds_only);
  CHECK(!exemplar_actor_options::from(config{}, "/tmp/run/replay.db").seeds_only);
  CHECK(o.validate().ok());
}

TEST_CASE("exemplar actor options name the bad key") {
  exemplar_actor_options opt;
  opt.store = "/tmp/x/replay.db";
  REQUIRE(opt.validate().ok());
  auto bad = [&](auto change, const char* key) {
    auto o = opt;
    change(o);
    auto r = o.validate();
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::config);
    CHECK_MESSAGE(r.error().message.find(key) != std::string::npos, r.error().message);
  };
  bad([](auto& o) { o.store.clear(); }, "exemplar.store");
  bad([](auto& o) { o.straggler_timeout_s = 0; }, "exemplar.straggler_timeout_s");
  bad([](auto& o) { o.straggler_timeout_s = NAN; }, "exemplar.straggler_timeout_s");
  bad([](auto& o) { o.straggler_timeout_s = 1e9; }, "exemplar.straggler_timeout_s");
  bad([](auto& o) { o.fill_reward = INFINITY; }, "exemplar.fill_reward");
  bad([](auto& o) { o.max_open_groups = 0; }, "exemplar.max_open_groups");
  bad([](auto& o) { o.selection.tau = 0; }, "exemplar.tau");
}

TEST_CASE_FIXTURE(fixture, "spawning fails on bad options, no learner or an unusable store path") {
  auto opt = options();
  opt.max_open_groups = 0;
  auto r = spawn_exemplar_actor(sys, opt, {learner});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::config);

  r = spawn_exemplar_actor(sys, options(), {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::invalid_arg);

  auto nowhere = options();
  nowhere.store = dir.path() / "missing" / "replay.db";
  r = spawn_exemplar_actor(sys, nowhere, {learner});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == errc::io);
  CHECK_MESSAGE(r.error().message.find("missing") != std::string::npos, r.error().message);
}

TEST_CASE_FIXTURE(fixture, "a policy sample is stored with its whole completion and its prompt, kept once per text") {
  auto a = spawn(options());
  const std::string prompt = "<|im_start|>user\nWrite ModelNew for level1/19_ReLU\n<|im_end|>\n";
  auto x = member(5, 11, ok_verdict(1.5));
  x.prompt = prompt;
  x.completion = "## Analysis\nfuse it\n```python\n" + x.code + "```\n";
  auto y = member(5, 12, failed_verdict(verdict_status::incorrect));
  y.prompt = prompt;
  y.completion = "```python\n" + y.code + "```\n";
  auto seed = scored(13, ok_verdict(1.1)); // a seed variant: no prompt, no completion
  REQUIRE(announce(a, announce_of(5, {11, 12})) == errc::none);
  tell(a, x);
  tell(a, y);
  tell(a, seed);
  CHECK(stats(a).recorded == 3);
  CHECK(stats(a).record_errors == 0);
  auto open = storage::replay_store::open(db);
  REQUIRE(open.ok());
  std::set<std::string> prompt_ids;
  for (const auto& [want, id] : {std::pair{&x, 1}, std::pair{&y, 2}}) {
    auto row = open->find(id);
    REQUIRE_MESSAGE(row.ok(), row.error().to_string());
    CHECK(row->code == want->code);
    CHECK(row->completion == want->completion);
    CHECK(row->prompt_id == "sha256:" + sha256_hex(prompt));
    prompt_ids.insert(row->prompt_id);
    auto p = open->find_prompt(row->prompt_id);
    REQUIRE_MESSAGE(p.ok(), p.error().to_string());
    CHECK(p->text == prompt);
  }
  CHECK(prompt_ids.size() == 1); // the group's members share one stored prompt
  auto s = open->find(3);
  REQUIRE(s.ok());
  CHECK(s->completion.empty());
  CHECK(s->prompt_id.empty());
  // Exemplar sets carry the code and verdict, not the texts.
  for (const auto& e : exemplars(a, 5).exemplars) {
    CHECK(e.prompt.empty());
    CHECK(e.completion.empty());
  }
}

TEST_CASE_FIXTURE(fixture, "each sample gets its fate: the trainer's, straggler, orphan, or unfinished when settled") {
  auto opt = options();
  opt.on_straggler = straggler_policy::drop;
  auto a = spawn(opt);
  REQUIRE(announce(a, announce_of(5, {11, 12})) == errc::none);
  tell(a, member(5, 11, ok_verdict(1.5)));
  tell(a, member(5, 12, ok_verdict(2.5)));
  REQUIRE(got->size() == 1); // complete: on its way to the trainer, undecided until it decides
  REQUIRE(announce(a, announce_of(6, {21, 22})) == errc::none);
  tell(a, member(6, 21, ok_verdict(1.1)));
  advance(31s);                            // group 6 dropped at the straggler timeout
  tell(a, member(6, 22, ok_verdict(1.2))); // its late member: an orphan
  REQUIRE(announce(a, announce_of(7, {31, 32})) == errc::none);
  tell(a, member(7, 31, ok_verdict(1.3))); // in flight when the rollouts stop
  self->send(a, sample_fates{{group_id{5}}, std::string(storage::sample_fate::trained), 1, 1});
  sched.run();
  auto rh = self->request(a, caf::infinite, settle_atom_v, std::int64_t{-1});
  sched.run();
  std::int64_t settled = -1;
  rh.receive([&](std::int64_t n) { settled = n; }, [&](caf::error& e) { FAIL(to_string(e)); });
  CHECK(settled == 1);
  CHECK(stats(a).open_groups == 0);        // forgotten: group 7 will not come
  tell(a, member(7, 32, ok_verdict(1.4))); // so its last member is an orphan too
  auto store = storage::replay_store::open(db);
  REQUIRE(store.ok());
  auto c = store->count_samples();
  REQUIRE(c.ok());
  CHECK(c->total == 6);
  CHECK(c->trained == 2);
  CHECK(c->straggler == 1);
  CHECK(c->orphan == 2);
  CHECK(c->unfinished == 1);
  CHECK(c->pending == 0);
  auto five = store->samples(5);
  REQUIRE(five->size() == 2);
  CHECK((*five)[0].fate_step == 1);
  CHECK((*five)[0].fate_seq == std::optional<std::int64_t>(1));
}
