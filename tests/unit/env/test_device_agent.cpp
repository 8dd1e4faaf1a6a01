// env/device_agent: the frames and descriptors the evaluator and its device agent exchange, and
// what starting an agent says where it cannot open the device (this machine kind has no GPU). The
// agent's work on a device is test_gpu_evaluator's.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "env/eval/device/device_agent.hpp"
#include "env/eval/device/device_agent_wire.hpp"

using namespace crucible;
using namespace crucible::env;
namespace w = crucible::env::agent_wire;

TEST_CASE("device agent frames: fields read back in order, a short frame is marked broken, never read past") {
  w::out f;
  f.put(w::op::subspan);
  f.put<std::uint64_t>(42);
  f.text("ipc-handle");
  f.put(2.5);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  REQUIRE(w::send_frame(sv[0], f));
  std::string got;
  REQUIRE(w::recv_frame(sv[1], got));
  w::in r{got};
  CHECK(r.get<w::op>() == w::op::subspan);
  CHECK(r.get<std::uint64_t>() == 42);
  CHECK(r.text() == "ipc-handle");
  CHECK(r.get<double>() == 2.5);
  CHECK(r.done());
  CHECK_FALSE(r.broken());
  // One byte short: the last field reads as zero and the frame is broken.
  w::in cut{got.substr(0, got.size() - 1)};
  (void) cut.get<w::op>();
  (void) cut.get<std::uint64_t>();
  (void) cut.text();
  CHECK(cut.get<double>() == 0.0);
  CHECK(cut.broken());
  // A text longer than what is left: broken, nothing past the end read.
  w::out liar;
  liar.put<std::uint64_t>(1000);
  w::in l{liar.data() + "abc"};
  CHECK(l.text().empty());
  CHECK(l.broken());
  // A length prefix past the limit ends the stream.
  const std::uint64_t huge = w::max_frame + 1;
  REQUIRE(::send(sv[0], &huge, sizeof huge, 0) == static_cast<ssize_t>(sizeof huge));
  CHECK_FALSE(w::recv_frame(sv[1], got));
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_CASE("device agent connections: a descriptor sent over the control socket arrives and carries frames") {
  int control[2], conn[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, control) == 0);
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, conn) == 0);
  REQUIRE(w::send_fd(control[0], conn[1]));
  ::close(conn[1]);
  const int got = w::recv_fd(control[1]);
  REQUIRE(got >= 0);
  w::out f;
  f.text("over the passed connection");
  REQUIRE(w::send_frame(conn[0], f));
  std::string frame;
  REQUIRE(w::recv_frame(got, frame));
  CHECK(w::in{frame}.text() == "over the passed connection");
  // The control socket closed: no descriptor, -1.
  ::close(control[0]);
  CHECK(w::recv_fd(control[1]) == -1);
  ::close(got);
  ::close(conn[0]);
  ::close(control[1]);
}

TEST_CASE("a device agent that cannot open its device is refused with the agent's own reason, and the device stays this process's") {
  auto program = find_device_agent();
  if (!program) {
    // A build without CUDA has no agent: the error says where it looked.
    CHECK(program.error().message.find("crucible-device") != std::string::npos);
    return;
  }
  device_agent_spec spec;
  spec.program = *program;
  spec.environment = {"PATH=/usr/bin:/bin", "CUDA_VISIBLE_DEVICES="}; // no device visible, GPU machine or not
  // Devices no other test of this binary gives an agent (test_mps may start one for cuda:0 where
  // the control program exists).
  auto r = start_device_agent(6, spec);
  REQUIRE_FALSE(r.ok());
  INFO(r.error().message);
  CHECK(r.error().message.find("the device agent of cuda:6") == 0);
  CHECK(r.error().message.find("cannot open CUDA device 6") != std::string::npos);
  CHECK_FALSE(device_agent_running(6));
  CHECK(device_agent_pid(6) == 0);
  // A program that is not there: named.
  spec.program = "/nonexistent/crucible-device";
  auto missing = start_device_agent(7, spec);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("could not be run (/nonexistent/crucible-device)") != std::string::npos);
  CHECK_FALSE(device_agent_running(7));
}
