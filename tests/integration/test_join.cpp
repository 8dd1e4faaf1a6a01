// Evaluator nodes joining a running experiment, in real processes on loopback: this test hosts
// an evaluator pool and the membership actor (published on port 0), starts `crucible evaluator
// --join` processes on the CPU and sends them candidates of the CPU task suite. One node is
// killed and one frozen (SIGSTOP) mid-evaluation: their candidates are re-queued and answered
// by the third, which then leaves in an orderly way. Wrong tokens and bad arguments are refused
// with messages that say why.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/membership.hpp"
#include "core/file_io.hpp"
#include "core/token.hpp"
#include "env/task.hpp"
#include "join_host.hpp"
#include "process.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace std::chrono_literals;
using crucible::testing::run_process;
using crucible::testing::running_process;
using crucible::testing::has;
using crucible::testing::host;
using crucible::testing::temp_dir;

namespace {

const fs::path suite = fs::path{CRUCIBLE_SOURCE_DIR} / "env/tasks/cpu";

candidate variant(std::uint64_t id, const std::string& task, const std::string& file) {
  return crucible::testing::variant(suite, id, task, file);
}

// A loopback port that nothing listens on (bound, then closed again).
std::uint16_t closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

} // namespace

TEST_CASE("three evaluator nodes join, a killed and a frozen one lose no candidate, the last leaves in order") {
  host h;
  std::vector<std::unique_ptr<running_process>> node;
  std::vector<std::string> out(3);
  for (int i = 0; i < 3; ++i)
    node.push_back(std::make_unique<running_process>(h.node_args(h.token_file)));
  for (int i = 0; i < 3; ++i)
    REQUIRE_MESSAGE(node[i]->read_until("joined ", 180'000, out[i]), "node ", i, " did not join: ", out[i]);
  CHECK(has(out[0], "(run join-test) with 1 evaluators: cpu"));
  REQUIRE(h.nodes().size() == 3);
  REQUIRE(h.devices().size() == 3);

  // Four candidates, one evaluation slot per node: each node gets one, the fourth waits.
  struct expected_outcome {
    candidate cand;
    bool correct;
  };
  std::vector<expected_outcome> sent{
    {variant(1, "01_relu_scale", "fast_inplace.py"), true},
    {variant(2, "01_relu_scale", "wrong_clamp_before_shift.py"), false},
    {variant(3, "02_silu_bias_residual", "fast_addcmul.py"), true},
    {variant(4, "02_silu_bias_residual", "wrong_gate_without_bias.py"), false},
  };
  caf::scoped_actor self{h.sys};
  // A bound instead of an endless wait should a lost candidate never come back.
  std::vector<decltype(self->request(h.pool, 600s, candidate{}))> replies;
  for (const auto& s : sent)
    replies.push_back(self->request(h.pool, 600s, s.cand));

  // Node 0 is killed and node 1 frozen once each is evaluating ("cpu: PHASE (worker PID)").
  REQUIRE_MESSAGE(node[0]->read_until("(worker ", 180'000, out[0]), out[0]);
  node[0]->signal(SIGKILL);
  REQUIRE_MESSAGE(node[1]->read_until("(worker ", 180'000, out[1]), out[1]);
  node[1]->signal(SIGSTOP);

  // Every candidate is answered, the lost ones by node 2.
  for (size_t i = 0; i < sent.size(); ++i) {
    replies[i].receive(
      [&](verdict& v) {
        INFO("variant ", sent[i].cand.variant.value, ": ", v.message);
        CHECK(v.correct == sent[i].correct);
        CHECK(v.status == (sent[i].correct ? verdict_status::ok : verdict_status::incorrect));
        if (v.status == verdict_status::ok)
          CHECK(v.rounds == 4); // measured with the run's settings, not the defaults (30 rounds)
      },
      [&](caf::error& e) { FAIL("variant ", sent[i].cand.variant.value, ": ", to_error(e).to_string()); });
  }
  // Only node 2 is left: node 0 by its closed connection, node 1 by its missing heartbeats.
  auto left = h.nodes();
  REQUIRE(left.size() == 1);
  CHECK(has(left[0].host, ":" + std::to_string(node[2]->pid())));
  CHECK(h.devices().size() == 1);
  CHECK(node[0]->wait().exit_code == 128 + SIGKILL);

  // The frozen node, thawed, learns that it was removed and exits with a message.
  node[1]->signal(SIGCONT);
  auto thawed = node[1]->wait();
  CHECK(thawed.exit_code == 1);
  CHECK_MESSAGE((has(thawed.err, "removed this node") || has(thawed.err, "answered no heartbeat")), thawed.err);

  // SIGTERM: node 2 leaves in an orderly way and exits 0.
  node[2]->signal(SIGTERM);
  auto last = node[2]->wait();
  INFO(last.err);
  CHECK(last.exit_code == 0);
  CHECK(has(last.out, "left " + h.members.endpoint()));
  CHECK(h.nodes().empty());
  CHECK(h.devices().empty());
}

TEST_CASE("a wrong token, a token file others can read, bad devices and an unreachable coordinator are refused") {
  host h;
  temp_dir tmp;
  auto wrong = tmp.path() / "wrong";
  REQUIRE(create_token_file(wrong));
  auto refused = run_process(h.node_args(wrong));
  CHECK(refused.exit_code == 1);
  CHECK_MESSAGE(has(refused.err, "refused the token in " + wrong.string()), refused.err);
  CHECK(h.nodes().empty());
  CHECK(h.devices().empty());

  auto shared = tmp.path() / "shared";
  std::ofstream{shared} << "secret\n";
  fs::permissions(shared, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  auto readable = run_process(h.node_args(shared));
  CHECK(readable.exit_code == 2);
  CHECK_MESSAGE(has(readable.err, "chmod 600 " + shared.string()), readable.err);

  auto missing = run_process(h.node_args(tmp.path() / "missing"));
  CHECK(missing.exit_code == 2);
  CHECK_MESSAGE(has(missing.err, "no such token file"), missing.err);

  auto args = h.node_args(h.token_file);
  args[7] = "0,x";
  auto bad_devices = run_process(args);
  CHECK(bad_devices.exit_code == 2);
  CHECK_MESSAGE(has(bad_devices.err, "--devices 0,x: \"x\" is not a device"), bad_devices.err);

  args = h.node_args(h.token_file);
  args[3] = "127.0.0.1:" + std::to_string(closed_port());
  auto unreachable = run_process(args);
  CHECK(unreachable.exit_code == 1);
  CHECK_MESSAGE(has(unreachable.err, "cannot reach the coordinator at " + args[3]), unreachable.err);
}

TEST_CASE("a node exits 0 when the coordinator goes away") {
  host h;
  running_process node(h.node_args(h.token_file));
  std::string out;
  REQUIRE_MESSAGE(node.read_until("joined ", 180'000, out), out);
  REQUIRE(h.nodes().size() == 1);
  stop_membership(h.sys, h.members);
  auto r = node.wait();
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK_MESSAGE(has(r.out, "the coordinator went away"), r.out);
}
