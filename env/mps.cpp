// env/mps.cpp: the evaluator's private CUDA MPS control daemon (env/mps.hpp).
#include "env/mps.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

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

// Whether the CUDA driver has started in this process (cuInit called): a process connects to an
// MPS server when the driver starts, so the pipe directory set later would not reach it. The
// driver's library may be loaded long before (torch links it), so it is asked, not looked for: a
// call before cuInit answers CUDA_ERROR_NOT_INITIALIZED (3). Nothing is loaded or started here.
bool cuda_started() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr)
    return false;
  using device_count_fn = int (*)(int*);
  auto* count = reinterpret_cast<device_count_fn>(::dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  const bool started = count == nullptr || count(&n) != 3;
  ::dlclose(lib);
  return started;
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
// its standard input (closed after). Waits up to `timeout_s`, then kills it. Its exit status, or -1.
int run_with(const std::string& program, const std::vector<std::string>& args, const std::vector<std::string>& env,
             const std::string& input, double timeout_s) {
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0)
    return -1;
  auto envs = environment_with(env);
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : envs)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(in[0]);
    ::close(in[1]);
    return -1;
  }
  if (pid == 0) {
    ::dup2(in[0], 0);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execve(program.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  if (!input.empty())
    (void) !::write(in[1], input.data(), input.size());
  ::close(in[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0 && errno != EINTR)
      return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The daemon of this process: its directory, its PID, the program.
struct daemon_state {
  std::mutex m;
  bool tried = false;
  result<void> outcome{};
  fs::path dir;
  std::string program;
  pid_t pid = -1;
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

void stop_at_exit() {
  auto& s = state();
  if (s.pid <= 0)
    return;
  quit_daemon(s.program, s.dir / "pipe");
  int status = 0;
  for (int i = 0; i < 200 && ::waitpid(s.pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (::waitpid(s.pid, &status, WNOHANG) == 0) {
    ::kill(s.pid, SIGKILL);
    ::waitpid(s.pid, &status, 0);
  }
  s.pid = -1;
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
  const pid_t pid = ::fork();
  if (pid < 0)
    return fail(errc::io, "evaluator.cuda_mps: fork: ", std::strerror(errno));
  if (pid == 0) {
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
  }
  s.pid = pid;
  std::atexit(stop_at_exit);
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
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", pipe.c_str(), 1);
  log.info("evaluator", "CUDA MPS: a control daemon of this process's own (", s.program, ", pid ", pid, ", pipe ", pipe,
           "); the evaluator and its workers are its clients");
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
    d.why_not = "CUDA_MPS_PIPE_DIRECTORY is set (" + f.external_pipe + "): the evaluator and its workers are that daemon's clients";
    return d;
  }
  if (f.root)
    d.why_not = "this process runs as root, its workers as nobody, and MPS serves one user at a time (run crucible "
                "as a user: its workers keep that user)";
  else if (f.program.empty())
    d.why_not = "nvidia-cuda-mps-control was not found (PATH, /usr/bin, /usr/local/cuda/bin)";
  else if (f.cuda_started)
    d.why_not = "CUDA had already started in this process, which would not be a client of a daemon started now";
  d.start = d.why_not.empty();
  d.refuse = !d.start && mode == cuda_mps_mode::on;
  return d;
}

result<void> prepare_cuda_mps(const evaluator_options& opt, const std::vector<std::string>& devices, logger& log) {
  auto& s = state();
  std::lock_guard lock{s.m};
  if (s.tried)
    return s.outcome;
  mps_facts f;
  for (const auto& d : devices)
    f.cuda_device = f.cuda_device || d.rfind("cuda", 0) == 0;
  if (opt.cuda_mps == cuda_mps_mode::off || !f.cuda_device)
    return {}; // nothing decided: a later call with CUDA devices may still start it
  s.tried = true;
  f.root = ::geteuid() == 0;
  if (const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY"))
    f.external_pipe = pipe;
  f.program = find_program();
  f.cuda_started = cuda_started();
  const auto d = decide_cuda_mps(opt.cuda_mps, f);
  if (d.refuse)
    return s.outcome = fail(errc::unsupported, "evaluator.cuda_mps is on, but ", d.why_not);
  if (!d.start) {
    if (!f.external_pipe.empty())
      log.info("evaluator", "CUDA MPS: ", d.why_not);
    else
      log.info("evaluator", "CUDA MPS not used: ", d.why_not, " (evaluator.cuda_mps: auto)");
    return s.outcome = result<void>{};
  }
  s.program = f.program;
  s.outcome = start(s, log);
  if (!s.outcome && opt.cuda_mps == cuda_mps_mode::auto_) {
    log.warn("evaluator", "CUDA MPS not used: ", s.outcome.error().message, " (evaluator.cuda_mps: auto)");
    s.outcome = result<void>{};
  }
  return s.outcome;
}

std::string cuda_mps_pipe() {
  auto& s = state();
  std::lock_guard lock{s.m};
  return s.pid > 0 ? (s.dir / "pipe").string() : std::string{};
}

} // namespace crucible::env
