// tests/integration/join_host.hpp: the coordinator's side of evaluator nodes joining a running
// experiment, for tests that start `crucible evaluator --join` processes (test_join on the CPU,
// test_gpu_join on a GPU): an evaluator pool with no evaluator of its own and the membership
// actor, published on 127.0.0.1 at a free port in the test's process, with a task suite and the
// run's evaluator settings the nodes receive.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/membership.hpp"
#include "core/file_io.hpp"
#include "core/token.hpp"
#include "env/task.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace crucible::testing {

namespace join_detail {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The run's evaluator settings, which the nodes receive: few trials and rounds, no warm-up, so
// that a CPU verdict takes seconds; no recheck, whose rounds a noisy speedup on a loaded machine
// would add to the 4 (a verdict of 14 rounds failed the check of the settings so).
inline config run_config() {
  auto cfg = parse_config("evaluator:\n  trials: 2\n  rounds: 4\n  buckets: 2\n  max_rounds: 4\n  warmup_ms: 0\n"
                          "  recheck_above: 1000\n",
                          "run_config");
  REQUIRE(cfg);
  return *cfg;
}

// The coordinator's side: an evaluator pool with no evaluator of its own and the membership
// actor, published on 127.0.0.1 at a free port, in this test's process.
struct host {
  temp_dir tmp{"crucible-join"};
  actor_config cfg{[] {
    actor_config c;
    c.load<caf::io::middleman>();
    c.set("logger.file-verbosity", caf::atom("quiet"));
    return c;
  }()};
  caf::actor_system sys{cfg};
  evaluator_pool_actor pool;
  membership_handle members;
  fs::path token_file = tmp.path() / "token";

  fs::path suite;    // the task suite the run registers (its folder)
  std::string node_devices; // the nodes' --devices

  explicit host(fs::path suite_dir = fs::path{CRUCIBLE_SOURCE_DIR} / "env/tasks/cpu", std::string devices_of_nodes = "cpu",
                caf::timespan heartbeat = 500ms, caf::timespan timeout = 3s)
      : suite(std::move(suite_dir)), node_devices(std::move(devices_of_nodes)) {
    auto tasks = std::make_shared<task_catalog>();
    auto indexed = env::index_tasks(suite);
    REQUIRE(indexed);
    for (auto& t : *indexed)
      (*tasks)[task_id{t.name}] = t;
    auto token = create_token_file(token_file);
    REQUIRE(token);
    evaluator_pool_options po; // one candidate at a time a node, 16 waiting
    po.slots_per_evaluator = 1;
    po.max_pending = 16;
    pool = spawn_evaluator_pool(sys, {}, po);
    membership_options opt;
    opt.token = *token;
    opt.run = "join-test";
    opt.heartbeat = heartbeat;
    opt.timeout = timeout;
    opt.config_yaml = to_yaml(run_config());
    auto started = start_membership(sys, membership_deps{pool, tasks, nullptr}, opt);
    // The message only where it failed: GPU runs pass -s, under which doctest renders a
    // REQUIRE_MESSAGE's text on success too (error() of a success throws).
    REQUIRE_MESSAGE(started, (started ? std::string{} : started.error().to_string()));
    members = *started;
    REQUIRE(members.port != 0);
  }

  ~host() {
    stop_membership(sys, members);
    caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
  }

  std::vector<std::string> node_args(const fs::path& token) const {
    // This machine's own setting on top of the run's: one idle worker, not two.
    return {CRUCIBLE_CLI, "evaluator", "--join", members.endpoint(), "--token-file", token.string(), "--devices",
            node_devices, "--no-cache", "--verbose", "--set", "evaluator.warm_workers=1"};
  }

  std::vector<node_announce> nodes() {
    caf::scoped_actor self{sys};
    std::vector<node_announce> out;
    self->request(members.actor, 10s, caf::get_atom_v)
      .receive([&](std::vector<node_announce>& xs) { out = std::move(xs); },
               [&](caf::error& e) { FAIL(to_error(e).to_string()); });
    return out;
  }

  std::vector<device_info> devices() {
    caf::scoped_actor self{sys};
    std::vector<device_info> out;
    self->request(pool, 10s, caf::get_atom_v)
      .receive([&](std::vector<device_info>& xs) { out = std::move(xs); },
               [&](caf::error& e) { FAIL(to_error(e).to_string()); });
    return out;
  }
};

// The candidate of `file`, one of task `task`'s variants in the suite at `suite`.
inline candidate variant(const fs::path& suite, std::uint64_t id, const std::string& task, const std::string& file) {
  auto code = read_file(suite / "variants" / task / file);
  REQUIRE(code);
  return candidate{variant_id{id}, task_id{task}, *code, ""};
}

inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace join_detail

using join_detail::has;
using join_detail::host;
using join_detail::run_config;
using join_detail::variant;

} // namespace crucible::testing
