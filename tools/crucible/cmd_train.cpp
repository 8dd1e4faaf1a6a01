// `crucible train CONFIG`, `crucible resume RUN` and `crucible pause RUN`: resolve the
// configuration, create (or reopen) the run directory, spawn the run's roles and let the
// coordinator run the stage schedule. SIGINT and SIGTERM pause the run: the step under way
// finishes, the rollouts stop (run.on_pause), a checkpoint is written, and the process exits 0.
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "actors/actor_config.hpp"
#include "actors/coordinator.hpp"
#include "actors/membership.hpp"
#include "actors/run_roles.hpp"
#include "core/config.hpp"
#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "storage/atomic_file.hpp"
#include "storage/event_publisher.hpp"
#include "storage/metrics_log.hpp"
#include "storage/run_dir.hpp"
#include "tools/crucible/child_process.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

namespace fs = std::filesystem;

// SIGINT and SIGTERM, taken by a thread of their own (sigwait) and turned into a pause of the
// run. Blocked in every thread from construction on; a second signal ends the process at once.
class signal_pauser {
public:
  signal_pauser() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1); // wakes the thread when the run ends by itself
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~signal_pauser() {
    if (thread_.joinable()) {
      done_ = true;
      pthread_kill(thread_.native_handle(), SIGUSR1);
      thread_.join();
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  void start(coordinator_actor coordinator, logger& log) {
    thread_ = std::thread([this, coordinator, &log] {
      int count = 0;
      for (;;) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0 || done_)
          return;
        if (sig == SIGUSR1)
          continue;
        if (++count > 1) {
          std::fprintf(stderr, "crucible: second %s: exiting without a checkpoint\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
          std::_Exit(130);
        }
        log.info("train", sig == SIGINT ? "SIGINT" : "SIGTERM", ": pausing (a second signal exits at once)");
        caf::anon_send(coordinator, pause_atom_v);
      }
    });
  }

private:
  sigset_t set_{}, old_{};
  std::thread thread_;
  std::atomic<bool> done_{false};
};

// Where nodes join: the bound HOST:PORT, with this machine's name for a wildcard address (a
// node cannot connect to 0.0.0.0).
std::string join_address(const membership_handle& m) {
  if (m.host != "0.0.0.0" && m.host != "::" && m.host != "[::]")
    return m.endpoint();
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0')
    return m.endpoint();
  return std::string{name} + ":" + std::to_string(m.port);
}

// After a crash: the records metrics.jsonl got after the last checkpoint (of steps the resumed
// run does again, and the crash's lifecycle records) move to metrics-after-step-N-<ms>.jsonl,
// so that metrics.jsonl agrees with the counters the run resumes from. Where metrics.checkpoint
// names another checkpoint than `latest` (a crash between the two writes), nothing moves.
result<void> set_aside_after_crash(storage::run_directory& dir, logger& log) {
  const auto note_file = dir.path() / "metrics.checkpoint";
  std::error_code ec;
  if (!std::filesystem::exists(note_file, ec))
    return {};
  auto note = read_json_file(note_file);
  const auto* d = note && note->is_object() ? note->find("dir") : nullptr;
  const auto* b = note && note->is_object() ? note->find("bytes") : nullptr;
  const auto* n = note && note->is_object() ? note->find("step") : nullptr;
  if (d == nullptr || !d->is_string() || b == nullptr || !b->is_int() || b->as_int() < 0 || n == nullptr || !n->is_int())
    return fail(errc::corrupt, note_file.string(), ": expected {\"dir\",\"step\",\"bytes\"}; delete it to resume ",
                "without setting aside the records after the last checkpoint");
  auto latest = latest_checkpoint(dir.path());
  if (!latest || std::filesystem::path(d->as_string()).filename() != latest->filename()) {
    log.warn("train", note_file.string(), " names ", d->as_string(), ", not the checkpoint resumed from: metrics.jsonl is kept whole");
    return {};
  }
  const auto aside = dir.path() / ("metrics-after-step-" + std::to_string(n->as_int()) + "-"
                                   + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      std::chrono::system_clock::now().time_since_epoch()).count())
                                   + ".jsonl");
  auto moved = storage::cut_metrics(dir.metrics_file(), static_cast<std::uint64_t>(b->as_int()), aside);
  if (!moved)
    return moved.error();
  if (*moved > 0)
    log.info("train", "the crashed process's ", *moved, " bytes of records after checkpoint step ", n->as_int(),
             " moved from metrics.jsonl to ", aside.string(), " (their steps are done again)");
  return {};
}

// TensorBoard event files as the run goes (log.tensorboard): tools/metrics_tensorboard.py, with
// the workers' interpreter, rewrites RUN/tensorboard from metrics.jsonl and follows it until this
// process has ended, then reads it once more. It runs in a process group of its own, so a Ctrl-C
// here (a pause) does not stop it before the pause's records; its output goes to
// RUN/tensorboard.log. With log.wandb it also keeps an offline W&B run in RUN/wandb. Never fails
// the run: what is missing is said once.
void start_tensorboard_writer(const config& cfg, const storage::run_directory& dir, logger& log) {
  if (!cfg.log.tensorboard)
    return;
  auto where = env::locate_harness(cfg.evaluator);
  if (!where || where->python.empty()) {
    log.warn("train", "log.tensorboard: no Python interpreter found (",
             where ? std::string{"none on PATH"} : where.error().message, "); no TensorBoard event files");
    return;
  }
  const auto script = checkout_tool(*where, "metrics_tensorboard.py");
  std::error_code ec;
  if (!std::filesystem::exists(script, ec)) {
    log.warn("train", "log.tensorboard: ", script.string(), " is missing; no TensorBoard event files");
    return;
  }
  // tensorboard importable? (A second or less: the writer's module only, not TensorBoard's server.)
  std::string probe_out, probe_err;
  if (run_captured({where->python, "-c", "import tensorboard.summary.writer.event_file_writer"}, probe_out, probe_err) != 0) {
    log.warn("train", "log.tensorboard: ", where->python, " cannot import tensorboard (tools/setup.sh installs it); ",
             "no TensorBoard event files");
    return;
  }
  const auto out_path = dir.path() / "tensorboard.log";
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) {
    log.warn("train", "log.tensorboard: cannot open ", out_path.string(), ": ", std::strerror(errno));
    return;
  }
  std::vector<std::string> argv{where->python, "-B", script.string(), dir.path().string(), "--follow",
                                std::to_string(::getpid())};
  // log.wandb: the same writer also keeps an offline W&B run, if wandb imports.
  bool wandb = false;
  if (cfg.log.wandb) {
    if (run_captured({where->python, "-c", "import wandb"}, probe_out, probe_err) != 0)
      log.warn("train", "log.wandb: ", where->python, " cannot import wandb (tools/setup.sh installs it); ",
               "no W&B run");
    else
      wandb = true;
  }
  if (wandb)
    argv.push_back("--wandb");
  const pid_t pid = spawn_child(argv, out, out, true);
  ::close(out);
  if (pid < 0) {
    log.warn("train", "log.tensorboard: cannot start ", script.string());
    return;
  }
  log.info("train", "TensorBoard event files in ", (dir.path() / "tensorboard").string(), " (tensorboard --logdir ",
           (dir.path() / "tensorboard").string(), "; the writer's output in ", out_path.string(), ")");
  if (wandb)
    log.info("train", "an offline W&B run in ", (dir.path() / "wandb").string(), " (upload: wandb sync ",
             (dir.path() / "wandb" / "latest-run").string(), ")");
}

// Runs the coordinator over the run's roles until the run finishes, pauses or crashes.
// `new_config`, when not empty, replaces the run's config.yaml once the roles are up (resume
// --set), so that a resume refused on its way (e.g. a task pool that no longer fits the
// checkpoint) leaves the run's configuration as it was.
int drive(const config& cfg, storage::run_directory& dir, bool resume, std::uint64_t pause_after, logger& log,
          const system_clock& clk, const std::string& new_config = {}) {
  auto metrics = storage::metrics_log::open(dir.metrics_file());
  if (!metrics) {
    std::fprintf(stderr, "crucible: %s\n", metrics.error().message.c_str());
    return exit_failure;
  }
  std::unique_ptr<storage::event_publisher> publisher;
  if (!cfg.run.publish.empty()) {
    auto pub = storage::event_publisher::bind(cfg.run.publish);
    if (!pub) {
      std::fprintf(stderr, "crucible: %s\n", pub.error().message.c_str());
      return exit_usage;
    }
    publisher = std::make_unique<storage::event_publisher>(std::move(*pub));
    log.info("train", "publishing events on ", publisher->endpoint());
  }
  start_tensorboard_writer(cfg, dir, log);
  signal_pauser signals; // before any thread exists, so every thread inherits the mask

  actor_config acfg;
  if (cfg.actors.threads > 0)
    acfg.set("scheduler.max-threads", static_cast<std::size_t>(cfg.actors.threads));
  const bool membership = !cfg.membership.listen.empty();
  if (membership)
    acfg.load<caf::io::middleman>();
  caf::actor_system sys{acfg};
  auto roles = spawn_run_roles(sys, cfg, dir.path(), resume, clk, log);
  if (!roles) {
    std::fprintf(stderr, "crucible: %s\n", roles.error().message.c_str());
    return roles.error().code == errc::config || roles.error().code == errc::not_found ? exit_usage : exit_failure;
  }
  auto shut_down = [&] {
    for (const auto& a : roles->actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  if (!new_config.empty()) {
    if (auto r = storage::write_file_atomic(dir.config_file(), new_config); !r) {
      std::fprintf(stderr, "crucible: %s\n", r.error().message.c_str());
      shut_down();
      return exit_failure;
    }
  }
  // Evaluator nodes join here (crucible evaluator --join HOST:PORT, docs/scaling.md).
  std::optional<membership_handle> members;
  if (membership) {
    auto mopt = membership_options::from(cfg, dir.path());
    if (!mopt) {
      std::fprintf(stderr, "crucible: %s\n", mopt.error().message.c_str());
      shut_down();
      return exit_usage;
    }
    auto h = start_membership(sys, membership_deps{roles->pool, roles->catalog, &log}, std::move(*mopt));
    if (!h) {
      std::fprintf(stderr, "crucible: %s\n", h.error().message.c_str());
      shut_down();
      return exit_failure;
    }
    members = *h;
    log.info("train", "evaluator nodes join at ", join_address(*members), " (crucible evaluator --join ",
             join_address(*members), " --token-file ...)");
  }
  log.info("train", roles->tasks, " tasks, ", roles->seeds, " seed variants, mode ", to_string(cfg.run.mode));
  coordinator_deps deps{dir.status_file(), std::move(*metrics), log, clk, std::move(publisher),
                        std::chrono::milliseconds{static_cast<long long>(std::ceil(cfg.run.heartbeat_s * 1000.0))}};
  deps.trainer = roles->trainer;
  deps.initial = roles->initial;
  deps.resumed = resume;
  deps.checkpoint_every = static_cast<std::uint64_t>(cfg.run.checkpoint_every);
  deps.pause_after = pause_after;
  deps.pause_grace = std::chrono::milliseconds{static_cast<long long>(std::ceil(cfg.run.pause_grace_s * 1000.0))};
  deps.pid = static_cast<std::int64_t>(::getpid());
  if (members)
    deps.join = join_address(*members);
  auto coordinator = spawn_coordinator(sys, std::move(deps));
  signals.start(coordinator, log);
  caf::scoped_actor self{sys};
  int rc = exit_ok;
  run_status final_status;
  auto on_error = [&](const caf::error& err) {
    std::fprintf(stderr, "crucible: %s\n", to_error(err).to_string().c_str());
    rc = exit_failure;
  };
  self->request(coordinator, caf::infinite, start_atom_v).receive([&](const run_status& st) { final_status = st; }, on_error);
  self->request(coordinator, caf::infinite, stop_atom_v)
    .receive([&](const run_status& st) { final_status = st; }, [&](const caf::error& err) {
      if (rc == exit_ok)
        on_error(err);
    });
  if (members)
    stop_membership(sys, *members);
  shut_down();
  log.end_progress();
  if (final_status.state == run_state::crashed)
    rc = exit_failure;
  std::printf("run %s: %s at step %llu (%s), policy v%llu, %llu variants, best speedup %s, mean %s\n",
              dir.path().c_str(), to_string(final_status.state), static_cast<unsigned long long>(final_status.step),
              final_status.stage.empty() ? "schedule complete" : final_status.stage.c_str(),
              static_cast<unsigned long long>(final_status.policy_version.value),
              static_cast<unsigned long long>(final_status.variants), speedup_text(final_status.best_speedup).c_str(),
              speedup_text(final_status.mean_speedup).c_str());
  if (final_status.state == run_state::paused)
    std::printf("resume with: crucible resume %s\n", dir.path().c_str());
  return rc;
}

result<std::uint64_t> pause_after_of(const parsed_args& args) {
  if (!args.has("--pause-after"))
    return std::uint64_t{0};
  auto n = int_option(args, "--pause-after", 0, 1, INT64_MAX);
  if (!n)
    return n.error();
  return static_cast<std::uint64_t>(*n);
}

int run_train(const parsed_args& args) {
  const auto& file = args.positional[0];
  auto cfg = load_config(file, args.all("--set"));
  if (!cfg) {
    std::fprintf(stderr, "%s\n", cfg.error().message.c_str());
    return exit_usage;
  }
  // The checkout's own suite and seeds (env/tasks/cpu) whatever the working directory.
  cfg->tasks.suite = shipped_path(cfg->tasks.suite);
  cfg->tasks.seeds = shipped_path(cfg->tasks.seeds);
  auto pause_after = pause_after_of(args);
  if (!pause_after) {
    std::fprintf(stderr, "crucible train: %s\n", pause_after.error().message.c_str());
    return exit_usage;
  }
  // The task suite and the model directory are checked before the run directory is made: a
  // wrong path leaves nothing behind, and the same run name can be used once it is fixed.
  if (auto r = check_run_inputs(*cfg); !r) {
    std::fprintf(stderr, "crucible train: %s\n", r.error().message.c_str());
    return r.error().code == errc::config || r.error().code == errc::not_found ? exit_usage : exit_failure;
  }
  system_clock clk;
  logger log{clk, cfg->log.level};
  auto dir = storage::run_directory::create(cfg->run.dir, cfg->run.name);
  if (!dir) {
    auto code = dir.error().code;
    if (code == errc::invalid_arg)
      std::fprintf(stderr,
                   "crucible train: %s\n  choose another name with --set run.name=NAME, or continue it with crucible resume\n",
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
  log.info("train", "run ", dir->path().string(), " from ", file);
  return drive(*cfg, *dir, false, *pause_after, log, clk);
}

int run_resume(const parsed_args& args) {
  const fs::path path = args.positional[0];
  auto dir = storage::run_directory::open(path);
  if (!dir) {
    std::fprintf(stderr, "crucible resume: %s\n", dir.error().message.c_str());
    return dir.error().code == errc::busy || dir.error().code == errc::not_found || dir.error().code == errc::invalid_arg
             ? exit_usage
             : exit_failure;
  }
  auto cfg = load_config(dir->config_file(), args.all("--set"));
  if (!cfg) {
    std::fprintf(stderr, "%s\n", cfg.error().message.c_str());
    return exit_usage;
  }
  cfg->tasks.suite = shipped_path(cfg->tasks.suite);
  cfg->tasks.seeds = shipped_path(cfg->tasks.seeds);
  auto pause_after = pause_after_of(args);
  if (!pause_after) {
    std::fprintf(stderr, "crucible resume: %s\n", pause_after.error().message.c_str());
    return exit_usage;
  }
  // A finished run has nothing left to do.
  bool crashed = false; // its last process stopped without pausing (it holds no lock: we do)
  if (auto text = storage::read_file(dir->status_file()); text) {
    if (auto st = run_status_from_json(*text); st && st->state == run_state::finished) {
      std::fprintf(stderr, "crucible resume: %s has finished; nothing to resume\n", path.c_str());
      return exit_usage;
    } else if (st) {
      crashed = st->state != run_state::paused;
    }
  }
  system_clock clk;
  logger log{clk, cfg->log.level};
  if (auto r = log.open_file(dir->events_log(), cfg->log.file_level); !r) {
    std::fprintf(stderr, "crucible resume: %s\n", r.error().message.c_str());
    return exit_failure;
  }
  if (crashed)
    if (auto r = set_aside_after_crash(*dir, log); !r) {
      std::fprintf(stderr, "crucible resume: %s\n", r.error().message.c_str());
      return exit_failure;
    }
  // The overrides become part of the run's configuration once the run is up again.
  std::string new_config;
  if (!args.all("--set").empty())
    new_config = "# resolved by crucible resume (with --set overrides)\n" + to_yaml(*cfg);
  log.info("train", "resuming run ", dir->path().string());
  return drive(*cfg, *dir, true, *pause_after, log, clk, new_config);
}

int run_pause(const parsed_args& args) {
  const fs::path dir = args.positional[0];
  std::error_code ec;
  if (!fs::exists(dir / "config.yaml", ec)) {
    std::fprintf(stderr, "crucible pause: %s is not a run directory (no config.yaml)\n", dir.c_str());
    return exit_usage;
  }
  auto doc = read_json_file(dir / "status.json");
  if (!doc || !doc->is_object()) {
    std::fprintf(stderr, "crucible pause: %s: no readable status.json\n", dir.c_str());
    return exit_failure;
  }
  const auto* pid_value = doc->find("pid");
  const auto* state = doc->find("state");
  if (!storage::run_directory_locked(dir) || pid_value == nullptr || !pid_value->is_int()) {
    std::fprintf(stderr, "crucible pause: %s: no process is running this run (state %s)\n", dir.c_str(),
                 state != nullptr && state->is_string() ? state->as_string().c_str() : "unknown");
    return exit_usage;
  }
  const auto pid = static_cast<pid_t>(pid_value->as_int());
  if (::kill(pid, SIGTERM) != 0) {
    std::fprintf(stderr, "crucible pause: cannot signal process %d: %s\n", static_cast<int>(pid), std::strerror(errno));
    return exit_failure;
  }
  auto timeout = args.has("--timeout") ? std::stod(args.get("--timeout")) : 600.0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  // The run's process exits once its checkpoint is written and the lock goes with it.
  while (storage::run_directory_locked(dir)) {
    if (std::chrono::steady_clock::now() > deadline) {
      // Why: the state it reached and the last thing it logged (a step it waits for, past
      // run.pause_grace_s only when that step is in its update or its evaluations).
      std::string state_text = "unknown", last;
      if (auto now = read_json_file(dir / "status.json"); now && now->is_object())
        if (const auto* s = now->find("state"); s != nullptr && s->is_string())
          state_text = s->as_string();
      if (auto log = storage::read_file(dir / "events.log")) {
        auto end = log->find_last_not_of("\n");
        if (end != std::string::npos) {
          auto begin = log->rfind('\n', end);
          last = log->substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
        }
      }
      std::fprintf(stderr,
                   "crucible pause: %s still running after %.0f s (state %s; it pauses once the step under way ends, "
                   "or after run.pause_grace_s if that step only waits for groups); its last log line: %s\n",
                   dir.c_str(), timeout, state_text.c_str(), last.empty() ? "(none)" : last.c_str());
      return exit_failure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto text = storage::read_file(dir / "status.json");
  auto st = text ? run_status_from_json(*text) : result<run_status>{text.error()};
  if (!st) {
    std::fprintf(stderr, "crucible pause: %s\n", st.error().message.c_str());
    return exit_failure;
  }
  std::printf("run %s: %s at step %llu\n", dir.c_str(), to_string(st->state), static_cast<unsigned long long>(st->step));
  return st->state == run_state::paused ? exit_ok : exit_failure;
}

} // namespace

command train_command() {
  return {{"train", "CONFIG [--set KEY=VALUE]... [--pause-after N]", "Start a training run from a configuration file",
           "Checks CONFIG (and the overrides), creates the run directory run.dir/run.name with the\n"
           "resolved config.yaml, events.log, metrics.jsonl and status.json, and runs the stage\n"
           "schedule (docs/training.md). SIGINT or SIGTERM (or crucible pause) pauses the run: the\n"
           "step under way finishes, a checkpoint is written and the process exits 0; crucible resume\n"
           "continues it. A configuration error names the file, line and key and creates nothing.",
           {"CONFIG"},
           {{"--set", "KEY=VALUE", "override a configuration key, e.g. --set run.seed=7", true},
            {"--pause-after", "N", "pause once N learner steps are done"}}},
          run_train};
}

command resume_command() {
  return {{"resume", "RUN [--set KEY=VALUE]... [--pause-after N]", "Continue a paused or interrupted run",
           "Reopens RUN, restores the learner, the schedule position, the counters and the rollouts'\n"
           "task samplers from its latest checkpoint (RUN/checkpoints/latest) and runs the rest of the\n"
           "schedule. After kill -9 the run continues from its last checkpoint; variants stored since\n"
           "then stay in the store. A task pool that no longer fits the saved samplers is refused\n"
           "(docs/training.md); --set overrides are written to config.yaml once the run is up.",
           {"RUN"},
           {{"--set", "KEY=VALUE", "override a configuration key for the rest of the run", true},
            {"--pause-after", "N", "pause once the run has done N learner steps"}}},
          run_resume};
}

command pause_command() {
  return {{"pause", "RUN [--timeout S]", "Pause a running run and wait for its checkpoint",
           "Sends SIGTERM to the process running RUN (its pid is in status.json) and waits until it\n"
           "has written its checkpoint and exited; prints the final status. Exit 0 when paused.",
           {"RUN"},
           {{"--timeout", "S", "seconds to wait (default 600)"}}},
          run_pause};
}

} // namespace crucible::cli
