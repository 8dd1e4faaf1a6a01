// `crucible train CONFIG`: resolve the configuration, create the run directory, start the actor
// system and let the coordinator run the run's lifecycle.
#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <cmath>
#include <cstdio>
#include <memory>

#include "actors/actor_config.hpp"
#include "actors/coordinator.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "storage/atomic_file.hpp"
#include "storage/event_publisher.hpp"
#include "storage/metrics_log.hpp"
#include "storage/run_dir.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int run_train(const parsed_args& args) {
  const auto& file = args.positional[0];
  auto cfg = load_config(file, args.all("--set"));
  if (!cfg) {
    std::fprintf(stderr, "%s\n", cfg.error().message.c_str());
    return exit_usage;
  }
  system_clock clk;
  logger log{clk, cfg->log.level};
  auto dir = storage::run_directory::create(cfg->run.dir, cfg->run.name);
  if (!dir) {
    auto code = dir.error().code;
    if (code == errc::invalid_arg)
      std::fprintf(stderr,
                   "crucible train: %s\n  choose another name with --set run.name=NAME\n",
                   dir.error().message.c_str());
    else
      std::fprintf(stderr, "crucible train: %s\n", dir.error().message.c_str());
    return code == errc::invalid_arg || code == errc::busy ? exit_usage : exit_failure;
  }
  if (auto r = storage::write_file_atomic(dir->config_file(),
                                          "# resolved from " + file + " by crucible train\n" + to_yaml(*cfg));
      !r) {
    std::fprintf(stderr, "crucible train: %s\n", r.error().message.c_str());
    return exit_failure;
  }
  if (auto r = log.open_file(dir->events_log(), cfg->log.file_level); !r) {
    std::fprintf(stderr, "crucible train: %s\n", r.error().message.c_str());
    return exit_failure;
  }
  auto metrics = storage::metrics_log::open(dir->metrics_file());
  if (!metrics) {
    std::fprintf(stderr, "crucible train: %s\n", metrics.error().message.c_str());
    return exit_failure;
  }
  log.info("train", "run ", dir->path().string(), " from ", file);
  std::unique_ptr<storage::event_publisher> publisher;
  if (!cfg->run.publish.empty()) {
    auto pub = storage::event_publisher::bind(cfg->run.publish);
    if (!pub) {
      std::fprintf(stderr, "crucible train: %s\n", pub.error().message.c_str());
      return exit_usage;
    }
    publisher = std::make_unique<storage::event_publisher>(std::move(*pub));
    log.info("train", "publishing events on ", publisher->endpoint());
  }

  actor_config acfg;
  if (cfg->actors.threads > 0)
    acfg.set("scheduler.max-threads", static_cast<std::size_t>(cfg->actors.threads));
  caf::actor_system sys{acfg};
  auto coordinator = spawn_coordinator(sys, coordinator_deps{dir->status_file(), std::move(*metrics), log, clk, std::move(publisher),
                                                          std::chrono::milliseconds{static_cast<long long>(
                                                            std::ceil(cfg->run.heartbeat_s * 1000.0))}});
  caf::scoped_actor self{sys};
  int rc = exit_ok;
  run_status final_status;
  self->request(coordinator, caf::infinite, start_atom::value)
    .receive([&](const run_status& st) { final_status = st; },
             [&](const caf::error& err) {
               std::fprintf(stderr, "crucible train: %s\n", to_error(err).to_string().c_str());
               rc = exit_failure;
             });
  self->request(coordinator, caf::infinite, stop_atom::value)
    .receive([&](const run_status& st) { final_status = st; },
             [&](const caf::error& err) {
               std::fprintf(stderr, "crucible train: %s\n", to_error(err).to_string().c_str());
               rc = exit_failure;
             });
  if (rc == exit_ok)
    std::printf("run %s: %s at step %llu (%s)\n", dir->path().c_str(), to_string(final_status.state),
                static_cast<unsigned long long>(final_status.step),
                final_status.stage.empty() ? "no stage is configured" : final_status.stage.c_str());
  return rc;
}

} // namespace

command train_command() {
  return {{"train", "CONFIG [--set KEY=VALUE]...", "Start a training run from a configuration file",
           "Checks CONFIG (and the overrides), creates the run directory run.dir/run.name with the\n"
           "resolved config.yaml, events.log, metrics.jsonl and status.json, and runs the loop.\n"
           "A configuration error names the file, line and key and creates nothing.",
           {"CONFIG"},
           {{"--set", "KEY=VALUE", "override a configuration key, e.g. --set run.seed=7", true}}},
          run_train};
}

} // namespace crucible::cli
