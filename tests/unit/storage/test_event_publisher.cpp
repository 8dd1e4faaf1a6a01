// storage/event_publisher: the PUB/SUB pair on loopback, port 0.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "storage/event_publisher.hpp"

using namespace crucible;
using namespace std::chrono_literals;
using storage::event_publisher;
using storage::event_subscriber;

namespace {

// ZeroMQ's slow joiner: a subscriber sees nothing published before its subscription reached
// the publisher. Publish heartbeats until one arrives (bounded by a deadline), as watch does.
bool join(event_publisher& pub, event_subscriber& sub) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    pub.publish("heartbeat", R"({"event":"heartbeat"})");
    auto got = sub.receive(20ms);
    REQUIRE(got.ok());
    if (*got)
      return true;
  }
  return false;
}

} // namespace

TEST_CASE("a subscriber receives the records published on a loopback port 0 endpoint in order") {
  auto pub = event_publisher::bind("tcp://127.0.0.1:0");
  REQUIRE(pub.ok());
  auto ep = pub->endpoint();
  CHECK(ep.rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(ep != "tcp://127.0.0.1:0");
  auto sub = event_subscriber::connect(ep);
  REQUIRE(sub.ok());
  REQUIRE(join(*pub, *sub));
  for (int i = 0; i < 5; ++i)
    CHECK(pub->publish(i % 2 ? "run_paused" : "run_started", R"({"event":"x","step":)" + std::to_string(i) + "}"));
  CHECK(pub->publish("run_finished", R"({"event":"run_finished"})"));
  int next = 0;
  for (;;) {
    auto got = sub->receive(5000ms);
    REQUIRE(got.ok());
    REQUIRE(got->has_value()); // nothing lost on an idle loopback link
    if ((*got)->topic == "heartbeat")
      continue; // the join's extra heartbeats
    if ((*got)->topic == "run_finished") {
      CHECK((*got)->json == R"({"event":"run_finished"})");
      break;
    }
    CHECK((*got)->topic == (next % 2 ? "run_paused" : "run_started"));
    CHECK((*got)->json == R"({"event":"x","step":)" + std::to_string(next) + "}");
    ++next;
  }
  CHECK(next == 5);
  CHECK(pub->dropped() == 0);
}

TEST_CASE("publishing never blocks: past the high-water mark messages are dropped and counted") {
  auto pub = event_publisher::bind("tcp://127.0.0.1:0", 4);
  REQUIRE(pub.ok());
  auto sub = event_subscriber::connect(pub->endpoint());
  REQUIRE(sub.ok());
  REQUIRE(join(*pub, *sub));
  // The subscriber reads nothing now: its queue (1000 messages by default), the kernel's
  // socket buffers and the publisher's queue of 4 fill up. 256 MiB is far more than they hold.
  const std::string big(64 * 1024, 'x');
  auto before = pub->sent() + pub->dropped();
  int refused = 0;
  for (int i = 0; i < 4096; ++i)
    refused += pub->publish("metrics", big) ? 0 : 1;
  CHECK(refused > 0);
  CHECK(pub->dropped() >= static_cast<std::uint64_t>(refused));
  CHECK(pub->sent() + pub->dropped() == before + 4096);
}

TEST_CASE("a subscriber with no publisher times out and a bad endpoint is refused naming it") {
  auto sub = event_subscriber::connect("tcp://127.0.0.1:1");
  REQUIRE(sub.ok());
  auto got = sub->receive(50ms);
  REQUIRE(got.ok());
  CHECK_FALSE(got->has_value());
  auto bad = event_publisher::bind("tcp://no-such-interface-name:0");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == errc::invalid_arg);
  CHECK(bad.error().message.find("no-such-interface-name") != std::string::npos);
  auto bad_sub = event_subscriber::connect("nonsense");
  REQUIRE_FALSE(bad_sub.ok());
  CHECK(bad_sub.error().message.find("nonsense") != std::string::npos);
}
