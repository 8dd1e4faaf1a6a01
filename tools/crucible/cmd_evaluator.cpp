// `crucible evaluator --join HOST:PORT`: this machine's devices join a running experiment as
// evaluators. Coordinator's membership actor -> task sources -> one evaluator per device ->
// announce -> candidates from the coordinator's pool until the coordinator goes away or a
// signal makes the node leave (docs/scaling.md).
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "actors/actor_config.hpp"
#include "actors/evaluator.hpp"
#include "actors/membership.hpp"
#include "core/device.hpp"
#include "core/config.hpp"
#include "core/log.hpp"
#include "core/sha256.hpp"
#include "core/token.hpp"
#include "env/eval/evaluator.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

using namespace std::chrono_literals;

// -- arguments ------------------------------------------------------------------------------

struct join_address {
  std::string host;
  std::uint16_t port = 0;
};

result<join_address> parse_join(const std::string& text) {
  auto colon = text.rfind(':');
  auto bad = [&] { return fail(errc::invalid_arg, "--join ", text, ": expected HOST:PORT with a port from 1 to 65535"); };
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size() || colon + 6 < text.size())
    return bad();
  auto digits = text.substr(colon + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos)
    return bad();
  auto port = std::stoul(digits);
  if (port == 0 || port > 65535)
    return bad();
  return join_address{text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

// "cpu" or CUDA device numbers "0,1" (or "cuda:0,cuda:1"): the devices as env names them.
result<std::vector<std::string>> parse_devices(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return fail(errc::invalid_arg, "--devices ", text, ": ", why,
                "; expected cpu or a comma-separated list of CUDA device numbers, e.g. 0,1");
  };
  std::vector<std::string> out;
  std::set<std::string> seen;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    auto item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    // A bare N stands for cuda:N.
    const bool bare = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
    const auto id = crucible::parse_device(bare ? "cuda:" + item : item);
    if (!id)
      return bad(item.empty() ? std::string{"an empty entry"} : "\"" + item + "\" is not a device");
    const std::string device = id->to_string();
    if (!seen.insert(device).second)
      return bad(device + " is listed twice");
    out.push_back(device);
  }
  return out;
}

// -- signals --------------------------------------------------------------------------------

// The write end of the self-pipe that the handler writes the signal number into. A signal
// handler can reach nothing else; one signal_watch exists per process.
int signal_pipe_write = -1;

extern "C" void write_signal(int sig) {
  char c = static_cast<char>(sig);
  [[maybe_unused]] auto n = ::write(signal_pipe_write, &c, 1);
}

/// SIGINT and SIGTERM, seen on a thread of its own: the first calls the action set with
/// on_stop (or is remembered until one is set), a second exits at once.
class signal_watch final {
public:
  signal_watch() {
    if (::pipe2(fds_, O_CLOEXEC) != 0)
      return;
    signal_pipe_write = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = write_signal;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    thread_ = std::thread([this] { watch(); });
  }
  ~signal_watch() {
    if (!thread_.joinable())
      return;
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    char stop = 0;
    [[maybe_unused]] auto n = ::write(fds_[1], &stop, 1);
    thread_.join();
    ::close(fds_[0]);
    ::close(fds_[1]);
    signal_pipe_write = -1;
  }
  signal_watch(const signal_watch&) = delete;
  signal_watch& operator=(const signal_watch&) = delete;

  /// True once a signal came.
  bool requested() const noexcept { return requested_; }

  /// Runs `f` on the watching thread at the first signal, or now if one came already; an empty
  /// `f` drops the action.
  void on_stop(std::function<void()> f) {
    std::lock_guard guard{mtx_};
    action_ = std::move(f);
    if (requested_ && action_)
      action_();
  }

private:
  void watch() {
    for (char c = 0; ::read(fds_[0], &c, 1) == 1 && c != 0;) {
      if (requested_.exchange(true)) {
        std::fprintf(stderr, "crucible evaluator: second signal: exiting at once\n");
        std::fflush(nullptr);
        std::_Exit(exit_failure);
      }
      std::fprintf(stderr, "crucible evaluator: %s: leaving (again to exit at once)\n", ::strsignal(c));
      std::lock_guard guard{mtx_};
      if (action_)
        action_();
    }
  }

  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  std::atomic<bool> requested_{false};
  std::mutex mtx_;
  std::function<void()> action_;
  std::thread thread_;
};

// -- the command ----------------------------------------------------------------------------

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0)
    return "localhost";
  return buf;
}

int run_evaluator(const parsed_args& args) {
  for (const char* required : {"--join", "--token-file", "--devices"})
    if (!args.has(required)) {
      std::fprintf(stderr, "crucible evaluator: missing %s; see 'crucible evaluator --help'\n", required);
      return exit_usage;
    }
  auto where = parse_join(args.get("--join"));
  auto devices = parse_devices(args.get("--devices"));
  auto wait_s = real_option(args, "--wait", 0, 0, 86400);
  if (const auto* bad = first_error(where, devices, wait_s)) {
    std::fprintf(stderr, "crucible evaluator: %s\n", bad->message.c_str());
    return exit_usage;
  }
  auto token = read_token_file(args.get("--token-file"));
  if (!token) {
    std::fprintf(stderr, "crucible evaluator: --token-file %s\n", token.error().message.c_str());
    return exit_usage;
  }
  // With --config, that file's settings; otherwise the run's, which arrive with the tasks. The
  // overrides are checked now either way, so that a bad one fails before any connection.
  auto loaded = config_option(args);
  if (!loaded) {
    std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
    return exit_usage;
  }
  config cfg = *loaded;
  const auto endpoint = args.get("--join");
  system_clock clk;
  logger log{clk, args.has("--verbose") ? log_level::debug : log_level::warn};
  signal_watch signals;

  actor_config acfg;
  acfg.load<caf::io::middleman>();
  acfg.set("logger.file-verbosity", caf::atom("quiet"));
  if (cfg.actors.threads > 0)
    acfg.set("scheduler.max-threads", static_cast<std::size_t>(cfg.actors.threads));
  caf::actor_system sys{acfg};

  // 1. Reach the coordinator's membership actor, trying again for --wait seconds.
  auto deadline = std::chrono::steady_clock::now()
                  + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(*wait_s));
  caf::expected<membership_actor> membership{caf::error{}};
  for (;;) {
    membership = sys.middleman().remote_actor<membership_actor>(where->host, where->port);
    if (membership || signals.requested() || std::chrono::steady_clock::now() >= deadline)
      break;
    // A coordinator still starting (as under Slurm, where every node starts at once) is tried
    // again each second.
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(1s, deadline - std::chrono::steady_clock::now()));
  }
  if (signals.requested())
    return exit_ok;
  if (!membership) {
    std::fprintf(stderr, "crucible evaluator: cannot reach the coordinator at %s: %s\n", endpoint.c_str(),
                 sys.render(membership.error()).c_str());
    return exit_failure;
  }

  // 2. The run's tasks; a wrong token stops here, before any device starts.
  caf::scoped_actor self{sys};
  run_setup setup;
  crucible::error failed;
  self->request(*membership, std::chrono::seconds{60}, tasks_request{*token})
    .receive([&](run_setup& x) { setup = std::move(x); }, [&](caf::error& e) { failed = to_error(e); });
  if (failed.code == errc::refused) {
    std::fprintf(stderr, "crucible evaluator: the coordinator at %s refused the token in %s (%s)\n", endpoint.c_str(),
                 args.get("--token-file").c_str(), failed.message.c_str());
    return exit_failure;
  }
  if (failed.code != errc::none) {
    std::fprintf(stderr, "crucible evaluator: %s: %s\n", endpoint.c_str(), failed.to_string().c_str());
    return exit_failure;
  }
  if (!args.has("--config")) {
    auto run_cfg = parse_config(setup.config, "the configuration of the run at " + endpoint, args.all("--set"));
    if (!run_cfg) {
      std::fprintf(stderr, "crucible evaluator: %s\n", run_cfg.error().message.c_str());
      return exit_failure;
    }
    cfg = *run_cfg;
  }
  auto tasks = std::make_shared<task_catalog>();
  for (auto& s : setup.tasks) {
    env::task t;
    t.name = s.task.value;
    t.path = s.task.value + ".py"; // from the coordinator: no file on this node
    t.sha256 = sha256_hex(s.source);
    t.source = std::move(s.source);
    t.level = s.level;
    t.number = s.number;
    (*tasks)[s.task] = std::move(t);
  }

  // 3. One evaluator per device; its verdicts are the run's rewards.
  auto made = env::make_device_evaluators(cfg.evaluator, cfg.reward, *devices, log,
                                          args.has("--no-cache") ? env::verdict_cache_use::none
                                                                 : env::verdict_cache_use::configured);
  if (!made) {
    std::fprintf(stderr, "crucible evaluator: %s\n", made.error().message.c_str());
    return exit_failure;
  }
  node_announce announce{*token, host_name() + ":" + std::to_string(::getpid()), node_role::evaluator, {}, {}};
  std::vector<evaluator_actor> evaluators;
  auto stop_evaluators = [&] {
    for (auto& e : evaluators)
      caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  };
  for (std::size_t i = 0; i < devices->size(); ++i) {
    const auto& device = (*devices)[i];
    auto& dev = (*made)[i];
    if (args.has("--verbose"))
      dev->set_phase_observer([device](const char* phase, pid_t worker) {
        std::printf("%s: %s (worker %d)\n", device.c_str(), phase, static_cast<int>(worker));
        std::fflush(stdout);
      });
    auto info = device_info_of(*dev, device_index(device));
    std::shared_ptr<env::device_evaluator> shared{std::move(dev)};
    evaluators.push_back(spawn_evaluator(sys, evaluator_deps{shared, tasks, info, cfg.evaluator.concurrency}));
    announce.devices.push_back(info);
    announce.actors.push_back(caf::actor_cast<caf::actor>(evaluators.back()));
  }
  if (signals.requested()) {
    stop_evaluators();
    return exit_ok;
  }

  // 4. Announce; serve until the agent quits (a signal makes it leave).
  auto agent = spawn_node_agent(sys, *membership, announce, std::chrono::seconds{60});
  self->monitor(agent);
  node_welcome welcome;
  self->request(agent, caf::infinite, caf::join_atom_v)
    .receive([&](node_welcome& w) { welcome = std::move(w); }, [&](caf::error& e) { failed = to_error(e); });
  if (failed.code != errc::none) {
    std::fprintf(stderr, "crucible evaluator: the coordinator at %s did not admit this node: %s\n", endpoint.c_str(),
                 failed.to_string().c_str());
    stop_evaluators();
    return exit_failure;
  }
  std::string names;
  for (const auto& d : announce.devices)
    names += (names.empty() ? "" : ", ") + d.name;
  std::printf("joined %s as %s (run %s) with %zu evaluators: %s\n", endpoint.c_str(), welcome.node.value.c_str(),
              welcome.run.c_str(), evaluators.size(), names.c_str());
  std::fflush(stdout);
  signals.on_stop([agent] { caf::anon_send(agent, caf::leave_atom_v); });

  caf::error reason;
  self->receive([&](caf::down_msg& down) { reason = down.reason; });
  signals.on_stop({});
  int rc = exit_ok;
  if (!reason) {
    std::printf("left %s\n", endpoint.c_str());
  } else if (auto err = to_error(reason); err.code == errc::worker_lost) {
    std::printf("%s: exiting\n", err.message.c_str());
  } else {
    std::fprintf(stderr, "crucible evaluator: %s\n", err.to_string().c_str());
    rc = exit_failure;
  }
  std::fflush(nullptr);
  stop_evaluators();
  // The coordinator has re-queued whatever this node still evaluates: waiting for it is of no
  // use. Evaluations end only when they do, so a shutdown that takes longer than a moment ends
  // the process outright; the workers die with it (PR_SET_PDEATHSIG).
  std::thread([rc] {
    std::this_thread::sleep_for(3s);
    std::fflush(nullptr);
    std::_Exit(rc);
  }).detach();
  return rc;
}

} // namespace

command evaluator_command() {
  return {{"evaluator", "--join HOST:PORT --token-file FILE --devices 0,1|cpu [options]",
           "Add this machine's devices to a running experiment as evaluators",
           "Connects to the coordinator's membership endpoint (membership.listen of the run), presents\n"
           "the run's token, receives the task sources, starts one evaluator per device (sandboxed\n"
           "workers, as crucible eval) and announces them; the run's evaluator pool then sends\n"
           "candidates here. A heartbeat goes to the coordinator every membership.heartbeat_s.\n"
           "Serves until the coordinator goes away (exit 0) or SIGINT/SIGTERM, on which the node\n"
           "leaves in an orderly way (its candidates in flight are re-queued) and exits 0. Exit 1\n"
           "when the coordinator cannot be reached, refuses the token or removes the node; 2 for\n"
           "bad arguments, configuration or token file. The evaluator and reward settings are the\n"
           "run's (its evaluator.* and reward.* keys arrive with the tasks), with --set overrides for\n"
           "what differs on this machine (evaluator.python, cache, concurrency, ...); --config uses\n"
           "that file's settings instead of the run's.",
           {},
           {{"--join", "HOST:PORT", "the run's membership endpoint"},
            {"--token-file", "FILE", "file holding the run's token (first line; not readable by others)"},
            {"--devices", "LIST", "cpu, or CUDA device numbers separated by commas (0,1)"},
            {"--wait", "SECONDS", "keep trying to reach the coordinator this long (default 0: once)"},
            {"--config", "CONFIG", "take evaluator and reward settings from this file instead of the run"},
            {"--set", "KEY=VALUE", "override a configuration key, e.g. --set evaluator.concurrency=2", true},
            {"--no-cache", "", "neither read nor write the verdict cache"},
            {"--verbose", "", "log progress to stderr and each evaluation phase to stdout"}}},
          run_evaluator};
}

} // namespace crucible::cli
