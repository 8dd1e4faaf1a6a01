// A GPU node joining a running experiment (docs/architecture.md, "Adding a kind of device"): this
// test hosts the evaluator pool and the membership actor (tests/integration/join_host.hpp), starts
// `crucible evaluator --join ... --devices cuda:0` on the GPU suite, and checks that the node's
// device reaches the pool under the hardware kind core's hardware_kind_of derives from its model,
// the one function every layer uses, and that a candidate sent there is judged on that device.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <csignal>
#include <filesystem>
#include <string>

#include <caf/scoped_actor.hpp>

#include "core/device.hpp"
#include "tests/integration/join_host.hpp"
#include "tests/integration/process.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace std::chrono_literals;
using crucible::testing::has;
using crucible::testing::host;
using crucible::testing::running_process;

TEST_CASE("a GPU node joins: its device reaches the pool under hardware_kind_of's kind, and judges there") {
  const fs::path suite = fs::path{CRUCIBLE_SOURCE_DIR} / "env/tasks/gpu";
  host h{suite, "cuda:0"};
  running_process node(h.node_args(h.token_file));
  std::string out;
  REQUIRE_MESSAGE(node.read_until("joined ", 300'000, out), "the node did not join: ", out);

  // The device as the pool holds it: the model the node's workers report, and the kind derived
  // from it by the one function (core/device.hpp), not a name of the node's own.
  const auto devices = h.devices();
  REQUIRE(devices.size() == 1);
  const auto& d = devices.front();
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  INFO("the pool's device: ", d.name, " (", d.hardware, "); this process's cuda:0: ", prop.name);
  CHECK(d.name == std::string{prop.name});
  CHECK(d.hardware == hardware_kind_of("cuda:0", d.name));
  CHECK(d.hardware != "gpu"); // a model the function names (h100, h200, ...), not its fallback
  CHECK(has(out, d.name));

  // A correct variant and a wrong one of a task of the GPU suite, judged on the node's device.
  caf::scoped_actor self{h.sys};
  const std::string task = "level2/04_layernorm_manual_fp32";
  struct sent {
    candidate cand;
    bool correct;
  };
  const sent pairs[] = {{crucible::testing::variant(suite, 1, task, "fast_functional.py"), true},
                        {crucible::testing::variant(suite, 2, task, "wrong_uncentred_variance.py"), false}};
  for (const auto& p : pairs) {
    self->request(h.pool, 600s, p.cand)
      .receive(
        [&](verdict& v) {
          INFO("variant ", p.cand.variant.value, ": ", v.message);
          CHECK(v.correct == p.correct);
          CHECK(v.status == (p.correct ? verdict_status::ok : verdict_status::incorrect));
          CHECK(v.hardware == d.name); // judged there, and said so
          if (v.status == verdict_status::ok)
            CHECK(v.rounds == 4); // the run's settings, not the node's defaults
        },
        [&](caf::error& e) { FAIL("variant ", p.cand.variant.value, ": ", to_error(e).to_string()); });
  }

  // SIGTERM: the node leaves in an orderly way.
  node.signal(SIGTERM);
  auto last = node.wait();
  INFO(last.err);
  CHECK(last.exit_code == 0);
  CHECK(h.devices().empty());
}
