// Starting, talking to and killing sandboxed workers. Everything the child needs between fork
// and exec is prepared before fork(): the evaluator is multithreaded, so the child may only
// make async-signal-safe calls.
#include "env/sandbox.hpp"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace crucible::env {

namespace {

std::atomic<std::uint64_t> scratch_counter{0};

// Writes all of `s` to fd; async-signal-safe.
void write_all(int fd, const char* s, size_t n) {
  while (n > 0) {
    auto w = ::write(fd, s, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR)
        continue;
      return;
    }
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void write_file(const char* path, const char* text) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    write_all(fd, text, std::strlen(text));
    ::close(fd);
  }
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGXCPU: return "SIGXCPU";
    default: return "signal";
  }
}

std::string cuda_index(const std::string& device) {
  return device.rfind("cuda:", 0) == 0 ? device.substr(5) : "";
}

} // namespace

result<std::unique_ptr<worker>> worker::start(zmq::context_t& ctx, const worker_spec& spec) {
  namespace fs = std::filesystem;
  std::unique_ptr<worker> w{new worker()};
  // A short scratch path: ipc:// endpoints are Unix socket paths (at most 107 bytes).
  std::error_code ec;
  fs::create_directories(spec.scratch_root, ec);
  std::string tmpl = (spec.scratch_root / ("w" + std::to_string(::getpid()) + "-"
                                           + std::to_string(scratch_counter++) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return fail(errc::io, "cannot create a scratch directory under ", spec.scratch_root.string(), ": ",
                std::strerror(errno));
  w->scratch_ = tmpl;
  auto endpoint = "ipc://" + (w->scratch_ / "worker.sock").string();
  if (endpoint.size() > 100)
    return fail(errc::invalid_arg, "scratch path too long for an ipc endpoint: ", endpoint);
  try {
    w->sock_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
    w->sock_->set(zmq::sockopt::linger, 0);
    w->sock_->bind(endpoint);
  } catch (const zmq::error_t& e) {
    return fail(errc::io, "cannot bind ", endpoint, ": ", e.what());
  }

  // Everything for the child, prepared now.
  std::vector<std::string> args = {spec.python, "-I", "-B", spec.harness.string(), "--endpoint", endpoint,
                                   "--device", spec.device == "cpu" ? "cpu" : "cuda",
                                   "--scratch", w->scratch_.string()};
  std::vector<std::string> envs;
  auto pass = [&](const char* name) {
    if (const char* v = std::getenv(name))
      envs.push_back(std::string{name} + "=" + v);
  };
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  if (fs::exists("/usr/local/cuda/bin"))
    path = "/usr/local/cuda/bin:" + path;
  auto python_dir = fs::path(spec.python).parent_path();
  if (!python_dir.empty())
    path = python_dir.string() + ":" + path;
  envs.push_back("PATH=" + path);
  envs.push_back("HOME=" + w->scratch_.string());
  envs.push_back("TMPDIR=" + w->scratch_.string());
  envs.push_back("LANG=C.UTF-8");
  envs.push_back("PYTHONDONTWRITEBYTECODE=1");
  envs.push_back("PYTHONUNBUFFERED=1");
  auto threads = std::to_string(spec.cpu_threads);
  envs.push_back("OMP_NUM_THREADS=" + threads);
  envs.push_back("MKL_NUM_THREADS=" + threads);
  envs.push_back("CRUCIBLE_CPU_THREADS=" + threads);
  envs.push_back("CUDA_VISIBLE_DEVICES=" + cuda_index(spec.device));
  envs.push_back("TORCH_EXTENSIONS_DIR=" + (spec.extensions_dir / "torch").string());
  envs.push_back("TRITON_CACHE_DIR=" + (spec.extensions_dir / "triton").string());
  envs.push_back("CUDA_MODULE_LOADING=LAZY");
  // Large host buffers reuse freed memory instead of being mapped (and zeroed) fresh on every
  // call, so eager references are not timed on page faults that a candidate which allocates
  // less avoids.
  envs.push_back("MALLOC_MMAP_THRESHOLD_=1073741824");
  envs.push_back("MALLOC_TRIM_THRESHOLD_=1073741824");
  if (fs::exists("/usr/local/cuda"))
    envs.push_back("CUDA_HOME=/usr/local/cuda");
  pass("LD_LIBRARY_PATH"); // where the GPU machines keep their driver libraries
  pass("CUDA_HOME");
  pass("CC");
  pass("CXX");
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : envs)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const bool as_root = ::geteuid() == 0;
  auto uid_map = std::to_string(::geteuid()) + " " + std::to_string(::geteuid()) + " 1";
  auto gid_map = std::to_string(::getegid()) + " " + std::to_string(::getegid()) + " 1";
  const auto scratch = w->scratch_.string();
  const rlim_t as_limit = spec.device == "cpu" && spec.memory_limit_mb > 0
                            ? static_cast<rlim_t>(spec.memory_limit_mb) << 20
                            : RLIM_INFINITY;

  // The child reports over this pipe: 'N' once in its own network namespace, then "E<errno>"
  // if exec fails. A successful exec closes it (O_CLOEXEC): EOF means the harness runs.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0)
    return fail(errc::io, "pipe2: ", std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(report[0]);
    ::close(report[1]);
    return fail(errc::io, "fork: ", std::strerror(errno));
  }
  if (pid == 0) {
    ::close(report[0]);
    ::setsid(); // own session and process group: kill(-pid) reaches every descendant
    ::prctl(PR_SET_PDEATHSIG, SIGKILL); // the worker never outlives its evaluator
    struct rlimit core{0, 0};
    ::setrlimit(RLIMIT_CORE, &core);
    struct rlimit as{as_limit, as_limit};
    ::setrlimit(RLIMIT_AS, &as);
    struct rlimit files{4096, 4096};
    ::setrlimit(RLIMIT_NOFILE, &files);
    struct rlimit fsize{rlim_t{8} << 30, rlim_t{8} << 30};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    // No network: a fresh network namespace has only a down loopback. ipc:// still works.
    bool isolated = false;
    if (as_root) {
      isolated = ::unshare(CLONE_NEWNET) == 0;
    } else if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0) {
      write_file("/proc/self/setgroups", "deny");
      write_file("/proc/self/uid_map", uid_map.c_str());
      write_file("/proc/self/gid_map", gid_map.c_str());
      isolated = true;
    }
    if (isolated)
      write_all(report[1], "N", 1);
    if (::chdir(scratch.c_str()) != 0)
      ::_exit(126);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::close(devnull);
    }
    // Close every inherited descriptor but stdio and the report pipe (which closes on exec).
    for (int fd = 3; fd < 4096; ++fd)
      if (fd != report[1])
        ::close(fd);
    ::execve(argv[0], argv.data(), envp.data());
    char msg[16] = "E";
    int e = errno;
    int i = 1;
    char digits[8];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + e % 10);
      e /= 10;
    } while (e > 0 && n < 7);
    while (n > 0)
      msg[i++] = digits[--n];
    write_all(report[1], msg, static_cast<size_t>(i));
    ::_exit(127);
  }
  ::close(report[1]);
  w->pid_ = pid;
  std::string reported;
  char buf[32];
  for (;;) {
    auto n = ::read(report[0], buf, sizeof buf);
    if (n > 0) {
      reported.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    break;
  }
  ::close(report[0]);
  w->net_isolated_ = !reported.empty() && reported[0] == 'N';
  auto epos = reported.find('E');
  if (epos != std::string::npos) {
    int err = std::atoi(reported.c_str() + epos + 1);
    w->reap(true);
    return fail(errc::not_found, "cannot execute ", spec.python, ": ", std::strerror(err));
  }
  w->pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  return w;
}

worker::~worker() {
  kill();
  sock_.reset();
  if (pidfd_ >= 0)
    ::close(pidfd_);
  std::error_code ec;
  if (!scratch_.empty())
    std::filesystem::remove_all(scratch_, ec);
}

bool worker::reap(bool block) {
  if (exited_ || pid_ <= 0)
    return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    exited_ = true;
    if (WIFEXITED(status))
      exit_code_ = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
      exit_signal_ = WTERMSIG(status);
    return true;
  }
  if (r < 0) { // not our child any more (already reaped elsewhere): treat as gone
    exited_ = true;
    return true;
  }
  return false;
}

void worker::kill() {
  if (pid_ <= 0 || exited_)
    return;
  killed_by_us_ = true;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  reap(true);
}

result<void> worker::send(const std::string& json) {
  try {
    auto sent = sock_->send(zmq::buffer(json), zmq::send_flags::dontwait);
    if (!sent)
      return fail(errc::io, "worker ", std::to_string(pid_), " is not accepting messages");
  } catch (const zmq::error_t& e) {
    return fail(errc::io, "send to worker ", std::to_string(pid_), ": ", e.what());
  }
  return {};
}

receive_outcome worker::receive(std::chrono::steady_clock::time_point deadline, worker_message& out) {
  using namespace std::chrono;
  for (;;) {
    std::vector<zmq::message_t> parts;
    try {
      auto got = zmq::recv_multipart(*sock_, std::back_inserter(parts), zmq::recv_flags::dontwait);
      if (got && !parts.empty()) {
        out.json = parts[0].to_string();
        out.frames.clear();
        for (size_t i = 1; i < parts.size(); ++i) {
          auto p = static_cast<const std::byte*>(parts[i].data());
          out.frames.emplace_back(p, p + parts[i].size());
        }
        return receive_outcome::message;
      }
    } catch (const zmq::error_t&) {
      kill();
      return receive_outcome::died;
    }
    if (reap(false)) {
      // Its last messages may still be in flight between the socket and this queue.
      if (!drained_) {
        drained_ = true;
        zmq::pollitem_t item{static_cast<void*>(*sock_), 0, ZMQ_POLLIN, 0};
        try {
          if (zmq::poll(&item, 1, std::chrono::milliseconds{500}) > 0)
            continue;
        } catch (const zmq::error_t&) {
        }
      }
      return receive_outcome::died;
    }
    auto now = steady_clock::now();
    if (now >= deadline)
      return receive_outcome::deadline;
    // Wake on a message, on the process exiting (pidfd), or at the deadline; the slice bounds
    // the wait where pidfd is unavailable.
    auto left = duration_cast<milliseconds>(deadline - now).count() + 1;
    long slice = pidfd_ >= 0 ? static_cast<long>(left) : std::min<long>(static_cast<long>(left), 100);
    zmq::pollitem_t items[2] = {{static_cast<void*>(*sock_), 0, ZMQ_POLLIN, 0},
                                {nullptr, pidfd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, pidfd_ >= 0 ? 2 : 1, std::chrono::milliseconds{slice});
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) {
        kill();
        return receive_outcome::died;
      }
    }
  }
}

std::string worker::exit_description() const {
  if (!exited_)
    return "still running";
  if (exit_signal_ != 0) {
    std::string s = "killed by signal " + std::to_string(exit_signal_) + " (" + signal_name(exit_signal_) + ")";
    if (exit_signal_ == SIGKILL && !killed_by_us_)
      s += ", possibly by the kernel's out-of-memory killer";
    return s;
  }
  return "exited with code " + std::to_string(exit_code_);
}

} // namespace crucible::env
