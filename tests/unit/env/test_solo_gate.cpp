// Unit tests for env/solo_gate: evaluations beside each other, one alone once those inside have
// left, and none entering beside while one waits to be alone.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "env/eval/solo_gate.hpp"

using crucible::env::solo_gate;
using crucible::env::solo_hold;

namespace {
template <class F>
void await(F&& ready) { // returns as soon as another thread made `ready` true (no sleeping)
  while (!ready())
    std::this_thread::yield();
}
} // namespace

TEST_CASE("users beside each other share the gate, one alone enters only when nobody is inside") {
  solo_gate g;
  CHECK(g.try_enter(false));
  CHECK(g.try_enter(false));
  CHECK_FALSE(g.try_enter(true));
  g.leave(false);
  CHECK_FALSE(g.try_enter(true));
  g.leave(false);
  CHECK(g.try_enter(true));
  CHECK(g.alone_inside());
  CHECK_FALSE(g.try_enter(false));
  CHECK_FALSE(g.try_enter(true));
  g.leave(true);
  CHECK_FALSE(g.alone_inside());
  CHECK(g.try_enter(false));
  g.leave(false);
}

TEST_CASE("a user waiting to be alone keeps new users out, enters when those inside leave, and lets them in after") {
  solo_gate g;
  g.enter(false); // an evaluation running
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  std::thread alone([&] {
    solo_hold h{g, true};
    inside = true;
    await([&] { return release.load(); });
  });
  await([&] { return g.waiting_alone() == 1; });
  CHECK_FALSE(g.try_enter(false)); // no new evaluation beside while one waits to be alone
  CHECK_FALSE(inside.load());
  g.leave(false);
  await([&] { return inside.load(); });
  CHECK(g.alone_inside());
  CHECK_FALSE(g.try_enter(false));
  release = true;
  alone.join();
  CHECK(g.try_enter(false));
  g.leave(false);
}
