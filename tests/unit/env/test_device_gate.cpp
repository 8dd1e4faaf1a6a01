// Unit tests for env/device_gate: timed users alone, untimed users shared (or not), a waiting
// timed user first, starting workers (and, when allowed, untimed users) beside a timing's warm-up
// but never beside its measured rounds, and the busy time as the union of all holds.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "env/eval/device_gate.hpp"

using crucible::env::device_gate;
using crucible::env::phase_hold;
using crucible::env::start_hold;
using crucible::env::timed_hold;
using crucible::env::untimed_hold;

namespace {
// Polls a condition another thread makes true (no sleeping as synchronisation: it returns as
// soon as the condition holds).
template <class F>
void await(F&& ready) {
  while (!ready())
    std::this_thread::yield();
}
} // namespace

TEST_CASE("untimed users share the device when sharing is on, and take turns when it is off") {
  device_gate shared{true};
  shared.lock_untimed();
  CHECK(shared.try_lock_untimed());
  CHECK(shared.max_untimed() == 2);
  shared.unlock_untimed();
  shared.unlock_untimed();

  device_gate alone{false};
  alone.lock_untimed();
  CHECK_FALSE(alone.try_lock_untimed());
  alone.unlock_untimed();
  CHECK(alone.try_lock_untimed());
  alone.unlock_untimed();
  CHECK(alone.max_untimed() == 1);
}

TEST_CASE("a timed user waits for the untimed users inside, and no new one enters meanwhile") {
  device_gate gate;
  gate.lock_untimed();
  std::atomic<bool> timing{false};
  std::thread timer{[&] {
    timed_hold hold{gate};
    timing = true;
  }};
  await([&] { return gate.timed_waiting() == 1; });
  CHECK_FALSE(timing.load());
  CHECK_FALSE(gate.try_lock_untimed()); // the waiting timed user goes first
  // The time it waits for the device to drain is counted, and grows while it waits.
  const auto drain0 = gate.drain_ns();
  await([&] { return gate.drain_ns() > drain0; });
  gate.unlock_untimed();
  timer.join();
  CHECK(timing.load());
  CHECK(gate.timed_waiting() == 0);
  const auto drained = gate.drain_ns();
  CHECK(drained > drain0);
  CHECK(gate.drain_ns() == drained); // no longer waiting: no longer counted
  CHECK(gate.try_lock_untimed()); // it has left: untimed users enter again
  gate.unlock_untimed();
}

TEST_CASE("untimed users wait while a timed user holds the device") {
  device_gate gate;
  gate.lock_timed();
  CHECK_FALSE(gate.try_lock_untimed());
  std::atomic<bool> entered{false};
  std::thread worker{[&] {
    untimed_hold hold{gate};
    entered = true;
  }};
  CHECK_FALSE(entered.load());
  gate.unlock_timed();
  worker.join();
  CHECK(entered.load());
}

TEST_CASE("a phase held alone has the device as measured rounds do, and held shared it is untimed work") {
  // Even where untimed work may stay beside a timing's warm-up: a phase that measures (the
  // hardware's peaks) waits for the untimed users inside, and none enters until it leaves.
  device_gate gate{true, true, true};
  gate.lock_untimed();
  std::atomic<int> step{0};
  std::thread measurer{[&] {
    phase_hold alone{gate, true};
    step = 1;
    await([&] { return step.load() == 2; });
    alone.release();
    step = 3;
  }};
  const auto wait0 = gate.measure_wait_ns();
  await([&] { return gate.measure_wait_ns() > wait0; });
  CHECK(step.load() == 0); // waiting for the untimed user inside
  CHECK_FALSE(gate.try_lock_untimed());
  CHECK_FALSE(gate.try_lock_start());
  gate.unlock_untimed();
  await([&] { return step.load() == 1; });
  CHECK_FALSE(gate.try_lock_untimed()); // nothing beside it
  step = 2;
  await([&] { return step.load() == 3; });
  measurer.join();
  CHECK(gate.try_lock_untimed()); // released: untimed users enter again
  {
    phase_hold shared{gate, false}; // beside the untimed user, as untimed work
    CHECK(gate.max_untimed() >= 2);
  }
  gate.unlock_untimed();
}

TEST_CASE("busy time is the union of the holds, timed time only the timed holds") {
  using clock = std::chrono::steady_clock;
  device_gate gate;
  auto spin = [](std::chrono::microseconds d) {
    const auto until = clock::now() + d;
    while (clock::now() < until) {
    }
  };
  const auto t0 = clock::now();
  {
    untimed_hold a{gate};
    untimed_hold b{gate}; // overlapping holds count once
    spin(std::chrono::milliseconds{4});
    a.release();
    CHECK_FALSE(a.held());
    spin(std::chrono::milliseconds{1});
  }
  const auto idle0 = gate.busy_ns();
  spin(std::chrono::milliseconds{2}); // idle: not counted
  CHECK(gate.busy_ns() == idle0);
  {
    timed_hold t{gate};
    spin(std::chrono::milliseconds{3});
  }
  const auto wall = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
  const auto busy = gate.busy_ns();
  CHECK(busy >= 8'000'000u);
  CHECK(busy <= wall - 2'000'000u); // two overlapping 5 ms holds counted twice would exceed it
  CHECK(gate.timed_ns() >= 3'000'000u);
  CHECK(gate.timed_ns() < busy);
  CHECK(gate.drain_ns() == 0); // the timed user never waited
}

TEST_CASE("a recording gate keeps each step, in order, with its thread, none before or after") {
  device_gate gate;
  gate.lock_untimed(); // not recorded
  gate.unlock_untimed();
  gate.record(true);
  gate.lock_untimed();
  std::size_t timed_thread = 0;
  std::thread timer{[&] {
    timed_thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
    timed_hold t{gate}; // waits for the untimed user
  }};
  while (gate.timed_waiting() == 0)
    std::this_thread::yield();
  gate.unlock_untimed();
  timer.join();
  gate.record(false);
  gate.lock_untimed();
  gate.unlock_untimed();
  auto ev = gate.take_events();
  using E = device_gate::event;
  const auto me = std::hash<std::thread::id>{}(std::this_thread::get_id());
  REQUIRE(ev.size() == 5);
  CHECK(ev[0].kind == E::untimed_enter);
  CHECK(ev[0].thread == me);
  CHECK(ev[1].kind == E::timed_wait);
  CHECK(ev[1].thread == timed_thread);
  CHECK(ev[2].kind == E::untimed_leave);
  CHECK(ev[3].kind == E::timed_enter);
  CHECK(ev[4].kind == E::timed_leave);
  for (std::size_t i = 1; i < ev.size(); ++i)
    CHECK(ev[i].ns >= ev[i - 1].ns);
  CHECK(gate.take_events().empty());
}

TEST_CASE("starts beside warm-up: a timing enters beside a start, and its measured rounds wait for it") {
  device_gate gate{true, true};
  REQUIRE(gate.starts_beside_warmup());
  CHECK(gate.inside().empty());
  gate.lock_start();
  gate.lock_untimed();
  CHECK(gate.inside() == "1 worker start, 1 untimed user");
  std::atomic<int> step{0};
  std::thread timer{[&] {
    timed_hold hold{gate}; // waits for the untimed user, not for the start
    step = 1;
    await([&] { return step.load() == 10; });
    gate.begin_measure(); // waits for the start
    step = 2;
    await([&] { return step.load() == 3; });
  }};
  await([&] { return gate.timed_waiting() == 1; });
  CHECK(gate.try_lock_start()); // a waiting timing will begin with its warm-up: starts may enter
  gate.unlock_start();
  CHECK_FALSE(gate.try_lock_untimed()); // untimed users may not
  gate.unlock_untimed();
  await([&] { return step.load() == 1; });
  CHECK(gate.try_lock_start()); // beside the warm-up
  gate.unlock_start();
  CHECK_FALSE(gate.try_lock_untimed());
  step = 10;
  // The timing waits to measure: the start inside holds it back, and no new start begins.
  const auto wait0 = gate.measure_wait_ns();
  await([&] { return gate.measure_wait_ns() > wait0; });
  CHECK(step.load() == 10); // still waiting
  CHECK_FALSE(gate.try_lock_start());
  CHECK(gate.starts() == 1);
  CHECK(gate.inside() == "1 worker start"); // what the wait names before it waits
  const auto beside = gate.beside_ns();
  CHECK(beside > 0);
  gate.unlock_start();
  await([&] { return step.load() == 2; });
  CHECK_FALSE(gate.try_lock_start()); // measured rounds: none beside them
  const auto waited = gate.measure_wait_ns();
  CHECK(gate.measure_wait_ns() == waited); // no longer waiting: no longer counted
  CHECK(gate.beside_ns() >= beside);
  CHECK(gate.drain_ns() > 0); // it waited for the untimed user
  step = 3;
  timer.join();
  CHECK(gate.try_lock_start()); // the timing has left
  CHECK(gate.max_untimed() >= 2);
  gate.unlock_start();
}

TEST_CASE("starts beside warm-up off: a timing waits for starts, and they wait for the whole timing") {
  device_gate gate{true, false};
  CHECK_FALSE(gate.starts_beside_warmup());
  gate.lock_start();
  std::atomic<bool> timing{false};
  std::thread timer{[&] {
    timed_hold hold{gate};
    gate.begin_measure(); // already measuring: returns at once
    timing = true;
    await([&] { return !timing.load(); });
  }};
  await([&] { return gate.timed_waiting() == 1; });
  CHECK_FALSE(timing.load());
  CHECK_FALSE(gate.try_lock_start()); // the waiting timed user goes first
  gate.unlock_start();
  await([&] { return timing.load(); });
  CHECK_FALSE(gate.try_lock_start());
  CHECK(gate.measure_wait_ns() == 0);
  CHECK(gate.beside_ns() == 0);
  timing = false;
  timer.join();
  CHECK(gate.try_lock_start());
  gate.unlock_start();

  device_gate unshared{false, true}; // beside warm-up needs sharing
  CHECK_FALSE(unshared.starts_beside_warmup());
  unshared.lock_untimed();
  CHECK_FALSE(unshared.try_lock_start()); // one at a time, starts included
  unshared.unlock_untimed();
}

TEST_CASE("a recording gate keeps starts and the measured rounds' beginning") {
  device_gate gate{true, true};
  gate.record(true);
  gate.lock_start();
  std::thread timer{[&] {
    timed_hold t{gate};
    gate.begin_measure();
  }};
  await([&] { return gate.measure_wait_ns() > 0; });
  gate.unlock_start();
  timer.join();
  auto ev = gate.take_events();
  using E = device_gate::event;
  std::string kinds;
  for (const auto& e : ev)
    kinds += static_cast<char>(e.kind);
  CHECK(kinds == std::string{static_cast<char>(E::start_enter), static_cast<char>(E::timed_enter),
                             static_cast<char>(E::measure_wait), static_cast<char>(E::start_leave),
                             static_cast<char>(E::measure_enter), static_cast<char>(E::timed_leave)});
}

TEST_CASE("untimed work beside warm-up: a timing enters beside it, and its measured rounds wait for it") {
  device_gate gate{true, true, true};
  REQUIRE(gate.untimed_beside_warmup());
  REQUIRE(gate.warmup_shared());
  gate.lock_untimed();
  std::atomic<int> step{0};
  std::thread timer{[&] {
    timed_hold hold{gate}; // enters beside the untimed user
    step = 1;
    await([&] { return step.load() == 10; });
    gate.begin_measure(); // waits for it
    step = 2;
    await([&] { return step.load() == 3; });
  }};
  await([&] { return step.load() == 1; });
  CHECK(gate.drain_ns() == 0); // the timing did not wait
  CHECK(gate.try_lock_untimed()); // beside the warm-up, more may enter
  CHECK(gate.try_lock_start());
  gate.unlock_start();
  gate.unlock_untimed();
  std::atomic<bool> second_in{false};
  std::thread second{[&] {
    timed_hold hold{gate}; // waits for the first timing, not for untimed users
    second_in = true;
    gate.begin_measure();
  }};
  await([&] { return gate.timed_waiting() == 1; });
  CHECK(gate.try_lock_untimed()); // a timing waiting behind a warm-up does not keep untimed users out
  gate.unlock_untimed();
  step = 10;
  const auto wait0 = gate.measure_wait_ns();
  await([&] { return gate.measure_wait_ns() > wait0; });
  CHECK(step.load() == 10); // still waiting for the untimed user inside
  CHECK_FALSE(gate.try_lock_untimed()); // none begins once the measured rounds wait
  CHECK_FALSE(gate.try_lock_start());
  const auto beside = gate.untimed_beside_ns();
  CHECK(beside > 0);
  gate.unlock_untimed();
  await([&] { return step.load() == 2; });
  CHECK_FALSE(gate.try_lock_untimed()); // measured rounds: nothing beside them
  CHECK(gate.untimed_beside_ns() >= beside);
  step = 3;
  second.join(); // the second timing enters when the first leaves, and measures at once
  CHECK(second_in.load());
  timer.join();
  CHECK(gate.try_lock_untimed());
  gate.unlock_untimed();
}

TEST_CASE("untimed work beside warm-up without starts beside it: starts wait for the whole timing") {
  device_gate gate{true, false, true};
  CHECK(gate.warmup_shared());
  CHECK_FALSE(gate.starts_beside_warmup());
  std::atomic<bool> in{false};
  std::atomic<bool> leave{false};
  std::thread timer{[&] {
    timed_hold hold{gate};
    in = true;
    await([&] { return leave.load(); });
  }};
  await([&] { return in.load(); });
  CHECK(gate.try_lock_untimed()); // warm-up: untimed work may enter
  gate.unlock_untimed();
  CHECK_FALSE(gate.try_lock_start()); // a start may not
  leave = true;
  timer.join();
  CHECK(gate.try_lock_start());
  gate.unlock_start();

  device_gate unshared{false, true, true}; // beside warm-up needs sharing
  CHECK_FALSE(unshared.warmup_shared());
  CHECK_FALSE(unshared.untimed_beside_warmup());
}

TEST_CASE("host work goes before waiting timings, shares a warm-up, and never runs beside measured rounds") {
  // Warm-up shared (untimed work beside it): the policy's generation may run beside a timing's
  // warm-up; its measured rounds wait for the generation to end, and the next one waits for them.
  device_gate gate{true, false, true};
  gate.lock_host();
  gate.lock_timed(); // the warm-up, beside the host work
  std::atomic<bool> measuring{false};
  std::thread timer{[&] {
    gate.begin_measure();
    measuring = true;
  }};
  await([&] { return gate.measure_wait_ns() > 0; });
  CHECK_FALSE(measuring.load());
  std::atomic<bool> second{false};
  std::thread host{[&] {
    crucible::env::host_hold hold{&gate};
    second = true;
  }};
  await([&] { return gate.host_waiting() == 1; }); // measured rounds wait to begin: it waits
  gate.unlock_host();
  timer.join();
  CHECK(measuring.load());
  CHECK_FALSE(second.load()); // the measured rounds hold the device
  gate.unlock_timed();
  host.join();
  CHECK(second.load());
  CHECK(gate.host_wait_ns() > 0);
  CHECK(gate.host_ns() > 0);

  // No company beside warm-up: a timing waits for host work inside, and host work enters while a
  // timing waits for untimed work (it goes before waiting timings).
  device_gate plain;
  plain.lock_untimed();
  std::atomic<bool> timed{false};
  std::thread t2{[&] {
    timed_hold hold{plain};
    timed = true;
  }};
  await([&] { return plain.timed_waiting() == 1; });
  std::atomic<bool> entered{false};
  std::thread h2{[&] {
    plain.lock_host();
    entered = true;
  }};
  await([&] { return entered.load(); });
  plain.unlock_untimed();
  // The timing still waits: host work is inside.
  CHECK(plain.timed_waiting() == 1);
  CHECK_FALSE(timed.load());
  h2.join();
  plain.unlock_host();
  t2.join();
  CHECK(timed.load());
  // Host work is not the evaluations' busy time.
  device_gate idle;
  idle.lock_host();
  idle.unlock_host();
  CHECK(idle.busy_ns() == 0);
  CHECK(idle.host_ns() > 0);
}

TEST_CASE("one gate a CUDA device in a process: the evaluator's, which host work on that device takes") {
  using crucible::env::device_uses;
  using crucible::env::existing_gate;
  using crucible::env::gate_for_host_work;
  using crucible::env::shared_gate;
  CHECK(existing_gate("cuda:7") == nullptr);
  // Host work first (the policy generates before its evaluator starts): a gate that counts it.
  auto host = gate_for_host_work("cuda:7");
  REQUIRE(host != nullptr);
  CHECK_FALSE(host->untimed_beside_warmup());
  {
    crucible::env::host_hold hold{host.get()};
  }
  // The evaluator takes that gate over with its rules; a second evaluator's rules do not change it.
  auto a = shared_gate("cuda:7", true, false, true);
  CHECK(a == host);
  CHECK(a->untimed_beside_warmup());
  auto b = shared_gate("cuda:7", false, false, false);
  CHECK(b == a);
  CHECK(b->untimed_beside_warmup());
  CHECK(shared_gate("cuda:6", true, false, true) != a);
  CHECK(gate_for_host_work("cuda:7") == a);
  CHECK(existing_gate("cuda:7") == a);
  CHECK(gate_for_host_work("cpu") == nullptr); // host work on the CPU takes no gate
  // What each gate has seen, for the share of time each GPU is busy.
  bool seen = false;
  for (const auto& u : device_uses())
    if (u.device == "cuda:7") {
      seen = true;
      CHECK(u.evaluator);
      CHECK(u.policy_s > 0);
      CHECK(u.evaluation_s == 0);
      CHECK(u.seconds >= u.policy_s);
    }
  CHECK(seen);
}
