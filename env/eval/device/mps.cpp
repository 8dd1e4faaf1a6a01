// env/eval/device/mps.cpp: the evaluator's private CUDA MPS control daemon (env/eval/device/mps.hpp).
#include "env/eval/device/mps.hpp"
#include "core/device.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#include "env/eval/device/device_agent.hpp"

extern char** environ;

namespace crucible::env {

namespace fs = std::filesystem;

namespace {

// The control program on PATH, or where the driver's packages put it.
std::string find_program() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss{path};
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty())
        dirs.push_back(d);
  }
  dirs.insert(dirs.end(), {"/usr/bin", "/usr/local/bin", "/usr/local/cuda/bin"});
  for (const auto& d : dirs) {
    const auto p = fs::path{d} / "nvidia-cuda-mps-control";
    if (::access(p.c_str(), X_OK) == 0)
      return p.string();
  }
  return {};
}

// This process's environment with `extra` added.
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e)
    envs.emplace_back(*e);
  envs.insert(envs.end(), extra.begin(), extra.end());
  return envs;
}

// Runs `program` with `args` and the environment `env` added to this process's; `input` written to
// its standard input (closed after), its standard output kept in `out` where given. Waits up to
// `timeout_s`, then kills it. Its exit status, or -1.
int run_with(const std::string& program, const std::vector<std::string>& args, const std::vector<std::string>& env,
             const std::string& input, double timeout_s, std::string* out = nullptr) {
  int in[2], from[2] = {-1, -1};
  if (::pipe2(in, O_CLOEXEC) != 0)
    return -1;
  if (out != nullptr && (::pipe2(from, O_CLOEXEC) != 0 || ::fcntl(from[0], F_SETFL, O_NONBLOCK) != 0)) {
    ::close(in[0]);
    ::close(in[1]);
    return -1;
  }
  auto envs = environment_with(env);
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : envs)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  auto close_all = [&] {
    for (int fd : {in[0], in[1], from[0], from[1]})
      if (fd >= 0)
        ::close(fd);
  };
  const pid_t pid = ::fork();
  if (pid < 0) {
    close_all();
    return -1;
  }
  if (pid == 0) {
    ::dup2(in[0], 0);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(from[1] >= 0 ? from[1] : null, 1);
      ::dup2(null, 2);
    }
    ::execve(program.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  if (!input.empty()) {
    // A program that exits before reading its input must not end this process (SIGPIPE).
    sigset_t pipe_signal, before;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_signal, &before);
    const bool broke = ::write(in[1], input.data(), input.size()) < 0 && errno == EPIPE;
    if (broke) {
      const timespec none{0, 0};
      (void) ::sigtimedwait(&pipe_signal, nullptr, &none); // the pending signal taken
    }
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  }
  ::close(in[1]);
  if (from[1] >= 0)
    ::close(from[1]);
  auto drain = [&] {
    char buf[4096];
    ssize_t n = 0;
    while (from[0] >= 0 && (n = ::read(from[0], buf, sizeof buf)) > 0)
      out->append(buf, static_cast<std::size_t>(n));
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    drain();
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      drain();
      if (from[0] >= 0)
        ::close(from[0]);
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    if ((r < 0 && errno != EINTR) || std::chrono::steady_clock::now() >= deadline) {
      if (r >= 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
      if (from[0] >= 0)
        ::close(from[0]);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The numbers of a control command's answer (one server or client PID a line).
std::vector<pid_t> pids_in(const std::string& text) {
  std::vector<pid_t> out;
  std::stringstream ss{text};
  long v = 0;
  while (ss >> v)
    if (v > 0)
      out.push_back(static_cast<pid_t>(v));
  return out;
}

// A process's state letter and parent, from /proc/PID/stat; false where it is gone.
bool proc_stat(pid_t pid, char& state, pid_t& parent) {
  std::ifstream stat{"/proc/" + std::to_string(pid) + "/stat"};
  std::string line;
  if (!std::getline(stat, line))
    return false;
  const auto close = line.rfind(')'); // the command name may hold spaces and parentheses
  if (close == std::string::npos)
    return false;
  std::stringstream rest{line.substr(close + 2)};
  long ppid = 0;
  rest >> state >> ppid;
  parent = static_cast<pid_t>(ppid);
  return static_cast<bool>(rest);
}

// Whether `pid` is this process or below it (its parent chain reaches this process).
bool below_this_process(pid_t pid) {
  const pid_t self = ::getpid();
  char state = 0;
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {
    if (pid == self)
      return true;
    if (!proc_stat(pid, state, pid))
      return false;
  }
  return false;
}

// The daemon of this process: its directory, its PID, the program.
struct daemon_state {
  std::mutex m;
  bool tried = false;
  result<void> outcome{};
  fs::path dir;
  std::string program;
  pid_t pid = -1;
  std::string clients_pipe; // the pipe directory the agents and workers connect to (this daemon's or the user's)
  std::uint64_t restarts = 0; // times check_cuda_mps started the daemon again
};

daemon_state& state() {
  static daemon_state s;
  return s;
}

// Tells the daemon whose pipe directory is `pipe` to quit (it ends its servers once their clients
// have gone), waiting a few seconds.
void quit_daemon(const std::string& program, const fs::path& pipe) {
  (void) run_with(program, {}, {"CUDA_MPS_PIPE_DIRECTORY=" + pipe.string()}, "quit\n", 10.0);
}

// This process's daemon told to quit and waited for (`wait_s`), killed after that.
void stop_daemon(daemon_state& s, const std::string& program, double wait_s) {
  if (s.pid <= 0)
    return;
  quit_daemon(program, s.dir / "pipe");
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (::waitpid(s.pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (::waitpid(s.pid, &status, WNOHANG) == 0) {
    ::kill(s.pid, SIGKILL);
    ::waitpid(s.pid, &status, 0);
  }
  s.pid = -1;
}

void stop_at_exit() {
  auto& s = state();
  if (s.pid <= 0)
    return;
  end_device_agents(); // the daemon's clients first: it quits once they have gone
  stop_daemon(s, s.program, 2.0);
  std::error_code ec;
  fs::remove_all(s.dir, ec);
}

// Daemons that evaluators killed earlier left running (a foreground daemon dies with its parent;
// one of a daemonised run does not), told to quit; their directories removed.
void reclaim(const std::string& program, const fs::path& tmp) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("crucible-mps-", 0) != 0)
      continue;
    const auto pid = std::atol(name.c_str() + std::strlen("crucible-mps-"));
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM))
      continue;
    quit_daemon(program, e.path() / "pipe");
    std::error_code rm;
    fs::remove_all(e.path(), rm);
  }
}

std::string log_tail(const fs::path& log) {
  std::ifstream f{log / "control.log"};
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line))
    lines.push_back(line);
  std::string out;
  for (std::size_t i = lines.size() > 5 ? lines.size() - 5 : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out.empty() ? "its log is empty" : "its log: " + out;
}

result<void> start(daemon_state& s, logger& log) {
  const auto tmp = fs::temp_directory_path();
  reclaim(s.program, tmp);
  s.dir = tmp / ("crucible-mps-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(s.dir, ec);
  fs::create_directories(s.dir / "pipe", ec);
  if (!ec)
    fs::create_directories(s.dir / "log", ec);
  if (ec)
    return fail(errc::io, "evaluator.cuda_mps: cannot make ", s.dir.string(), ": ", ec.message());
  // The server the daemon starts for the clients runs as their user, and writes its pipes and log
  // into these directories.
  const auto who = mps_client_identity();
  if (who.uid != static_cast<uid_t>(-1))
    for (const char* sub : {"pipe", "log"})
      if (::chown((s.dir / sub).c_str(), who.uid, who.gid) != 0)
        return fail(errc::io, "evaluator.cuda_mps: cannot give ", (s.dir / sub).string(), " to the workers' user: ", std::strerror(errno));
  const std::string pipe = (s.dir / "pipe").string();
  const std::string logs = (s.dir / "log").string();
  auto envs = environment_with({"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_LOG_DIRECTORY=" + logs});
  std::vector<char*> envp;
  for (auto& e : envs)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string prog = s.program, flag = "-f";
  char* argv[] = {prog.data(), flag.data(), nullptr};
  const pid_t parent = ::getpid();
  // Forked on a thread that lasts as long as this process (the parent-death signal is the forking
  // thread's: the daemon may be started again from a verdict's thread).
  pid_t pid = -1;
  int fork_errno = 0;
  run_on_lasting_thread([&] {
    pid = ::fork();
    fork_errno = errno;
    if (pid != 0)
      return;
    // Dies with the evaluator; its own session, so a terminal's signals reach it through us only.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
      ::_exit(1);
    ::setsid();
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execve(argv[0], argv, envp.data());
    ::_exit(127);
  });
  if (pid < 0)
    return fail(errc::io, "evaluator.cuda_mps: fork: ", std::strerror(fork_errno));
  s.pid = pid;
  static const bool once = (std::atexit(stop_at_exit), true);
  (void) once;
  // Ready once its control socket exists (and it still runs).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      s.pid = -1;
      return fail(errc::io, "evaluator.cuda_mps: " + s.program + " -f exited (status " + std::to_string(status)
                              + ") before it was ready; " + log_tail(s.dir / "log"));
    }
    std::error_code none;
    if (fs::exists(s.dir / "pipe" / "control", none))
      break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      s.pid = -1;
      return fail(errc::timeout, "evaluator.cuda_mps: " + s.program + " made no control socket in " + pipe
                                   + " within 10 s; " + log_tail(s.dir / "log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  s.clients_pipe = pipe;
  log.info("evaluator", "CUDA MPS: a control daemon of this process's own (", s.program, ", pid ", pid, ", pipe ", pipe,
           "); the device agents and the workers are its clients");
  return {};
}

} // namespace

mps_decision decide_cuda_mps(cuda_mps_mode mode, const mps_facts& f) {
  mps_decision d;
  if (mode == cuda_mps_mode::off || !f.cuda_device) {
    d.quiet = true;
    d.why_not = mode == cuda_mps_mode::off ? "evaluator.cuda_mps is off" : "no CUDA device";
    return d;
  }
  if (!f.external_pipe.empty()) {
    d.why_not = "CUDA_MPS_PIPE_DIRECTORY is set (" + f.external_pipe + "): the device agents and the workers are that daemon's clients";
    return d;
  }
  if (f.program.empty())
    d.why_not = "nvidia-cuda-mps-control was not found (PATH, /usr/bin, /usr/local/cuda/bin)";
  d.start = d.why_not.empty();
  d.refuse = !d.start && mode == cuda_mps_mode::on;
  return d;
}

mps_identity mps_client_identity() {
  if (::geteuid() != 0)
    return {};
  if (const passwd* pw = ::getpwnam("nobody"))
    return {pw->pw_uid, pw->pw_gid};
  return {65534, 65534};
}

namespace {

// After a fault under MPS, before the device agent starts again: every client of the servers of
// the daemon at `pipe` that is below this process (the workers of its devices; the agent has
// ended) killed, and waited for until it has gone and the faulted server with it, since the
// server takes no new client until all of its clients have exited. Clients of other processes
// are left alone.
void clear_clients(const std::string& program, const std::string& pipe) {
  if (program.empty() || pipe.empty())
    return;
  const std::vector<std::string> env{"CUDA_MPS_PIPE_DIRECTORY=" + pipe};
  std::string servers;
  (void) run_with(program, {}, env, "get_server_list\n", 10.0, &servers);
  std::vector<pid_t> killed;
  for (const pid_t server : pids_in(servers)) {
    std::string clients;
    (void) run_with(program, {}, env, "get_client_list " + std::to_string(server) + "\n", 10.0, &clients);
    for (const pid_t c : pids_in(clients))
      if (c != ::getpid() && below_this_process(c) && ::kill(c, SIGKILL) == 0)
        killed.push_back(c);
  }
  auto gone = [](pid_t pid) {
    char state = 0;
    pid_t parent = 0;
    return !proc_stat(pid, state, parent) || state == 'Z'; // a zombie holds no client
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto all_gone = [&] {
    for (const pid_t c : killed)
      if (!gone(c))
        return false;
    return true;
  };
  while (!all_gone() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // The faulted servers end once their clients have: the next client gets a new one.
  const auto before = pids_in(servers);
  while (std::chrono::steady_clock::now() < deadline) {
    std::string now;
    (void) run_with(program, {}, env, "get_server_list\n", 10.0, &now);
    bool left = false;
    for (const pid_t p : pids_in(now))
      left = left || std::find(before.begin(), before.end(), p) != before.end();
    if (!left)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// A device agent (env/eval/device/device_agent.hpp) for every CUDA device of `devices`, each a client of the
// daemon whose pipe directory is `pipe`, as the workers' user.
result<void> start_agents(const std::vector<std::string>& devices, const std::string& pipe, logger& log) {
  auto program = find_device_agent();
  if (!program)
    return program.error();
  device_agent_spec spec;
  spec.program = *program;
  // Without this process's CUDA_VISIBLE_DEVICES: the server applied it already and numbers the
  // devices it sees from 0 (cuda:0 of a process run with CUDA_VISIBLE_DEVICES=1 is the server's
  // device 0, and an agent still told "1" found no device).
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v{*e};
    if (v.rfind("CUDA_MPS_PIPE_DIRECTORY=", 0) != 0 && v.rfind("CUDA_MPS_LOG_DIRECTORY=", 0) != 0
        && v.rfind("CUDA_VISIBLE_DEVICES=", 0) != 0)
      spec.environment.emplace_back(v);
  }
  spec.environment.push_back("CUDA_MPS_PIPE_DIRECTORY=" + pipe);
  const auto who = mps_client_identity();
  spec.uid = who.uid;
  spec.gid = who.gid;
  // The daemon's pipe stays where it is when check_cuda_mps starts the daemon again.
  set_device_agent_restart_hook([program = find_program(), pipe](int) { clear_clients(program, pipe); });
  for (const auto& d : devices) {
    const int index = cuda_index(d);
    if (index < 0 || device_agent_running(index))
      continue;
    if (auto r = start_device_agent(index, spec); !r)
      return r.error();
    log.info("evaluator", d, ": the evaluator's device work runs in its device agent (pid ", device_agent_pid(index), ")");
  }
  return {};
}

} // namespace

result<void> prepare_cuda_mps(const evaluator_options& opt, const std::vector<std::string>& devices, logger& log) {
  // Across the boundary without MPS the device switches between the processes' contexts inside
  // every timed sample: speedups come out lower (CUDA-L1's level1/12: 8.87x against 48.3x in one
  // process, docs/PERFORMANCE.md), which a user must hear of.
  const char* cost = "; verdicts across the boundary then switch the device between processes inside every timed "
                     "sample, which lowers their speedups (docs/evaluator.md, CUDA MPS)";
  const bool any_cuda = std::any_of(devices.begin(), devices.end(), [](const std::string& d) { return cuda_index(d) >= 0; });
  if (opt.cuda_mps == cuda_mps_mode::off && any_cuda)
    log.warn("evaluator", "CUDA MPS not used: evaluator.cuda_mps is off", cost);
  auto& s = state();
  std::lock_guard lock{s.m};
  if (opt.cuda_mps == cuda_mps_mode::off || !any_cuda) {
    // Nothing to decide, whatever an earlier evaluator of this process asked for and got (its
    // refusal is its own); a later call with CUDA devices may still start the daemon. Where one
    // runs, this process's workers stay its clients (sandbox.cpp): said, not hidden.
    if (any_cuda && s.outcome && !s.clients_pipe.empty())
      log.info("evaluator", "evaluator.cuda_mps is off, but this process already uses CUDA MPS (pipe ", s.clients_pipe,
               "): its workers stay clients of that daemon");
    return {};
  }
  if (s.tried) {
    // Devices added later (a second evaluator of this process) get their agents too.
    if (s.outcome && !s.clients_pipe.empty())
      return start_agents(devices, s.clients_pipe, log);
    return s.outcome;
  }
  mps_facts f;
  f.cuda_device = any_cuda;
  s.tried = true;
  if (const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY"))
    f.external_pipe = pipe;
  f.program = find_program();
  const auto d = decide_cuda_mps(opt.cuda_mps, f);
  if (d.refuse)
    return s.outcome = fail(errc::unsupported, "evaluator.cuda_mps is on, but ", d.why_not);
  if (!d.start && f.external_pipe.empty()) {
    log.warn("evaluator", "CUDA MPS not used: ", d.why_not, " (evaluator.cuda_mps: auto)", cost);
    return s.outcome = result<void>{};
  }
  if (d.start) {
    s.program = f.program;
    s.outcome = start(s, log);
  } else {
    log.info("evaluator", "CUDA MPS: ", d.why_not);
    s.clients_pipe = f.external_pipe;
    s.outcome = result<void>{};
  }
  if (s.outcome)
    if (auto agents = start_agents(devices, s.clients_pipe, log); !agents)
      s.outcome = fail(agents.error().code, "evaluator.cuda_mps: ", agents.error().message);
  if (!s.outcome && opt.cuda_mps == cuda_mps_mode::auto_) {
    // Without its agents the evaluator would be no client of the daemon: the workers are not either.
    log.warn("evaluator", "CUDA MPS not used: ", s.outcome.error().message, " (evaluator.cuda_mps: auto)", cost);
    s.clients_pipe.clear();
    s.outcome = result<void>{};
  }
  return s.outcome;
}

std::string cuda_mps_control_program() { return find_program(); }

std::string cuda_mps_pipe() {
  auto& s = state();
  std::lock_guard lock{s.m};
  return s.clients_pipe;
}

namespace {

// The control daemon's answer to one command, its first number; NaN where it gave none.
double ask_number(const std::string& program, const std::string& pipe, const std::string& command) {
  std::string out;
  if (run_with(program, {}, {"CUDA_MPS_PIPE_DIRECTORY=" + pipe}, command + "\n", 10.0, &out) != 0)
    return std::nan("");
  std::stringstream ss{out};
  double v = 0;
  return ss >> v ? v : std::nan("");
}

// What is not as this process left it, empty where all is: the daemon running, and the share of
// the device its servers give each client (100 unless set, which nothing of crucible's does).
std::string what_changed(daemon_state& s, const std::string& program, const std::string& pipe) {
  if (s.pid > 0) {
    int status = 0;
    if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
      s.pid = -1;
      return "the MPS control daemon exited";
    }
  }
  const double all = ask_number(program, pipe, "get_default_active_thread_percentage");
  if (std::isnan(all))
    return "the MPS control daemon does not answer";
  if (std::fabs(all - 100.0) > 1e-6)
    return "the MPS default active thread percentage is " + std::to_string(all);
  std::string servers;
  (void) run_with(program, {}, {"CUDA_MPS_PIPE_DIRECTORY=" + pipe}, "get_server_list\n", 10.0, &servers);
  for (const pid_t server : pids_in(servers)) {
    const double one = ask_number(program, pipe, "get_active_thread_percentage " + std::to_string(server));
    if (!std::isnan(one) && std::fabs(one - 100.0) > 1e-6)
      return "the MPS server " + std::to_string(server) + "'s active thread percentage is " + std::to_string(one);
  }
  return {};
}

} // namespace

std::uint64_t cuda_mps_restarts() {
  auto& s = state();
  std::lock_guard lock{s.m};
  return s.restarts;
}

std::string check_cuda_mps(logger& log) {
  auto& s = state();
  std::lock_guard lock{s.m};
  if (s.clients_pipe.empty())
    return {};
  const std::string program = s.program.empty() ? find_program() : s.program;
  if (program.empty())
    return {};
  auto changed = what_changed(s, program, s.clients_pipe);
  if (changed.empty())
    return {};
  if (s.dir.empty() || s.clients_pipe != (s.dir / "pipe").string()) {
    // The user's own daemon: its settings are the user's, and nothing here is told to a candidate.
    static std::once_flag said;
    std::call_once(said, [&] { log.warn("evaluator", "CUDA MPS: ", changed, " (the user's own daemon, ", s.clients_pipe, "; left as it is)"); });
    return {};
  }
  // This process's daemon: its clients ended, it told to quit, and a new one started in its place.
  log.warn("evaluator", "CUDA MPS: ", changed, "; starting the control daemon again");
  clear_clients(program, s.clients_pipe);
  end_device_agents(); // where the daemon no longer answered, its client list was not there to end them
  stop_daemon(s, program, 5.0);
  ++s.restarts;
  if (auto r = start(s, log); !r) {
    log.error("evaluator", "CUDA MPS: the control daemon did not start again: ", r.error().message);
    s.clients_pipe.clear(); // workers started from now on are no clients; the agents end with their next fault
  }
  return changed;
}

} // namespace crucible::env
