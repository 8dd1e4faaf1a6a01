// Starting, talking to and killing sandboxed workers. Everything the child needs between fork
// and exec is prepared before fork(): the evaluator is multithreaded, so the child may only
// make async-signal-safe calls.
#include "env/eval/sandbox.hpp"
#include "env/eval/device_kind.hpp"
#include "core/device.hpp"
#include "env/eval/device/mps.hpp"
#include "env/eval/wire.hpp"
#include "env/eval/worker_messages.hpp"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include <sys/stat.h>

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

// CUDA_VISIBLE_DEVICES of a worker for `device`, nothing for a kind that names none: the device
// this process calls cuda:N. Under CUDA MPS that is N (the server, started with this process's
// environment, numbers what it sees from 0); otherwise the N-th entry of this process's own
// CUDA_VISIBLE_DEVICES where that is set (cuda:0 of a process run with CUDA_VISIBLE_DEVICES=1 is
// the machine's device 1, which a worker told "0" would not be).
std::string visible_devices(const std::string& device) {
  if (!kind_of(device).visible_device)
    return {};
  const int n = cuda_index(device);
  return cuda_mps_pipe().empty() ? child_visible_device(std::getenv("CUDA_VISIBLE_DEVICES"), n) : std::to_string(n);
}

} // namespace

namespace {

// A private scratch directory under spec.scratch_root, with a short path: ipc:// endpoints are
// Unix socket paths (at most 107 bytes).
result<std::filesystem::path> make_scratch(const worker_spec& spec, const char* prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(spec.scratch_root, ec);
  std::string tmpl = (spec.scratch_root / (prefix + std::to_string(::getpid()) + "-"
                                           + std::to_string(scratch_counter++) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return fail(errc::io, "cannot create a scratch directory under ", spec.scratch_root.string(), ": ",
                std::strerror(errno));
  return fs::path{tmpl};
}

// The pid in a scratch directory's name ("w" or "z", the pid of the process that made it, "-",
// a counter, "-", six characters); 0 when the name is not one.
pid_t scratch_owner(const std::string& name) {
  if (name.size() < 2 || (name[0] != 'w' && name[0] != 'z'))
    return 0;
  std::size_t i = 1;
  long long pid = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && pid < (1ll << 31))
    pid = pid * 10 + (name[i++] - '0');
  if (i == 1 || i >= name.size() || name[i] != '-')
    return 0;
  const auto dash = name.find('-', i + 1);
  if (dash == std::string::npos || name.size() - dash - 1 != 6)
    return 0;
  for (auto j = i + 1; j < dash; ++j)
    if (name[j] < '0' || name[j] > '9')
      return 0;
  return static_cast<pid_t>(pid);
}

} // namespace

scratch_reclaim reclaim_scratch(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  scratch_reclaim out;
  std::error_code ec;
  for (fs::directory_iterator it{root, ec}, end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    const pid_t pid = scratch_owner(name);
    if (pid <= 0 || !it->is_directory(ec) || it->is_symlink(ec))
      continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH)
      continue; // its maker lives (or is another user's): not ours to remove
    std::uint64_t bytes = 0;
    std::error_code walk;
    for (fs::recursive_directory_iterator f{it->path(), fs::directory_options::skip_permission_denied, walk}, fend;
         !walk && f != fend; f.increment(walk)) {
      std::error_code e;
      if (f->is_regular_file(e) && !f->is_symlink(e))
        bytes += f->file_size(e);
    }
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (rm) {
      ++out.failed;
      continue;
    }
    ++out.removed;
    out.bytes += bytes;
  }
  return out;
}

namespace {

// The environment of a worker, rebuilt from scratch; HOME and TMPDIR are its scratch directory.
std::vector<std::string> sandbox_env(const worker_spec& spec, const std::filesystem::path& scratch) {
  namespace fs = std::filesystem;
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
  envs.push_back("HOME=" + scratch.string());
  envs.push_back("TMPDIR=" + scratch.string());
  envs.push_back("LANG=C.UTF-8");
  envs.push_back("PYTHONDONTWRITEBYTECODE=1");
  envs.push_back("PYTHONUNBUFFERED=1");
  auto threads = std::to_string(spec.cpu_threads);
  envs.push_back("OMP_NUM_THREADS=" + threads);
  envs.push_back("MKL_NUM_THREADS=" + threads);
  envs.push_back("CRUCIBLE_CPU_THREADS=" + threads);
  envs.push_back("CUDA_VISIBLE_DEVICES=" + visible_devices(spec.device));
  // Builds stay in the worker's own scratch (a private tmpfs): no worker writes a compiled
  // extension or Triton kernel that another candidate will load (docs/evaluator.md, Isolation).
  envs.push_back("TORCH_EXTENSIONS_DIR=" + (scratch / "torch-extensions").string());
  envs.push_back("TRITON_CACHE_DIR=" + (scratch / "triton").string());
  envs.push_back("CRUCIBLE_SCRATCH_MB=" + std::to_string(spec.scratch_mb));
  if (!spec.extensions_dir.empty())
    envs.push_back("CRUCIBLE_EXTENSIONS=" + spec.extensions_dir.string());
  envs.push_back("CUDA_MODULE_LOADING=LAZY");
  if (spec.cuda_max_connections > 0) // fewer hardware queues: a cheaper context (docs/evaluator.md)
    envs.push_back("CUDA_DEVICE_MAX_CONNECTIONS=" + std::to_string(spec.cuda_max_connections));
  // Large host buffers reuse freed memory instead of being mapped (and zeroed) fresh on every
  // call, so eager references are not timed on page faults that a candidate which allocates
  // less avoids.
  envs.push_back("MALLOC_MMAP_THRESHOLD_=1073741824");
  envs.push_back("MALLOC_TRIM_THRESHOLD_=1073741824");
  if (spec.huge_pages) // torch's CPU allocator madvises its allocations of 2 MiB or more (evaluator.huge_pages)
    envs.push_back("THP_MEM_ALLOC_ENABLE=1");
  if (spec.own_device_only) // no other GPU's device file once the context exists (evaluator.cuda_own_device_only)
    envs.push_back("CRUCIBLE_OWN_DEVICE_ONLY=1");
  if (fs::exists("/usr/local/cuda"))
    envs.push_back("CUDA_HOME=/usr/local/cuda");
  pass("LD_LIBRARY_PATH"); // where the GPU machines keep their driver libraries
  // The MPS daemon the evaluator's device agents are clients of (env/eval/device/mps.hpp): the worker is too.
  if (const auto pipe = cuda_mps_pipe(); !pipe.empty())
    envs.push_back("CUDA_MPS_PIPE_DIRECTORY=" + pipe);
  pass("CUDA_HOME");
  pass("CC");
  pass("CXX");
  return envs;
}

// Forks and executes `args`: own session, rlimits, `scratch` as the working directory, the
// environment `envs`, and `stdin_fd` as standard input (-1: /dev/null). Returns once the
// program runs. The program confines itself (env/eval/harness/confine.py) before any candidate code.
result<pid_t> spawn(const worker_spec& spec, const std::filesystem::path& scratch, std::vector<std::string> args,
                      std::vector<std::string> envs, int stdin_fd) {
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : envs)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  const auto scratch_text = scratch.string();
  const rlim_t as_limit = kind_of(spec.device).address_space_limit && spec.memory_limit_mb > 0
                            ? static_cast<rlim_t>(spec.memory_limit_mb) << 20
                            : RLIM_INFINITY;
  const rlim_t fsize_limit = static_cast<rlim_t>(std::max<std::uint64_t>(spec.scratch_mb, 64)) << 20;

  // The child reports over this pipe "E<errno>" if exec fails. A successful exec closes it
  // (O_CLOEXEC): EOF means the program runs.
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
    // No file larger than the scratch itself (evaluator.scratch_mb): where the private tmpfs is
    // not in force the scratch is a folder on disk, and a candidate printing in a loop filled
    // its log up to the former 8 GiB limit. Python ignores SIGXFSZ: the write fails with EFBIG
    // ("File too large") in the candidate's own call.
    struct rlimit fsize{fsize_limit, fsize_limit};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    if (::chdir(scratch_text.c_str()) != 0)
      ::_exit(126);
    int in = stdin_fd >= 0 ? stdin_fd : ::open("/dev/null", O_RDONLY);
    if (in >= 0 && in != 0) {
      ::dup2(in, 0); // the copy on 0 does not close on exec
      ::close(in);
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
  auto epos = reported.find('E');
  if (epos != std::string::npos) {
    int err = std::atoi(reported.c_str() + epos + 1);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return fail(errc::not_found, "cannot execute ", args.front(), ": ", std::strerror(err));
  }
  return pid;
}

std::vector<std::string> harness_args(const worker_spec& spec, const std::filesystem::path& scratch) {
  std::vector<std::string> args{spec.python, "-I", "-B", spec.harness.string(), "--device",
                                kind_of(spec.device).name, "--scratch", scratch.string()};
  if (kind_of(spec.device).harness_kernels && !spec.kernels.empty()) {
    args.emplace_back("--kernels");
    args.push_back(spec.kernels.string());
  }
  return args;
}

} // namespace

result<void> worker::bind(zmq::context_t& ctx, const worker_spec& spec, std::string& endpoint) {
  auto scratch = make_scratch(spec, "w");
  if (!scratch)
    return scratch.error();
  scratch_ = std::move(*scratch);
  endpoint = "ipc://" + (scratch_ / "worker.sock").string();
  if (endpoint.size() > 100)
    return fail(errc::invalid_arg, "scratch path too long for an ipc endpoint: ", endpoint);
  try {
    sock_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
    sock_->set(zmq::sockopt::linger, 0);
    sock_->bind(endpoint);
  } catch (const zmq::error_t& e) {
    return fail(errc::io, "cannot bind ", endpoint, ": ", e.what());
  }
  // A worker started by root confines itself as nobody, who must be able to connect: the
  // socket is open to all, the directory it lies in (mode 700) to us alone, and the worker
  // reaches the socket through a bind mount (env/eval/harness/confine.py).
  ::chmod((scratch_ / "worker.sock").c_str(), 0666);
  return {};
}

result<std::unique_ptr<worker>> worker::start(zmq::context_t& ctx, const worker_spec& spec) {
  std::unique_ptr<worker> w{new worker()};
  std::string endpoint;
  if (auto bound = w->bind(ctx, spec, endpoint); !bound)
    return bound.error();
  auto args = harness_args(spec, w->scratch_);
  args.push_back("--endpoint");
  args.push_back(endpoint);
  auto child = spawn(spec, w->scratch_, std::move(args), sandbox_env(spec, w->scratch_), -1);
  if (!child)
    return child.error();
  w->pid_ = *child;
  w->pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, w->pid_, 0));
  return w;
}

result<std::unique_ptr<worker>> worker::fork_from(zygote& z, zmq::context_t& ctx, const worker_spec& spec) {
  std::unique_ptr<worker> w{new worker()};
  std::string endpoint;
  if (auto bound = w->bind(ctx, spec, endpoint); !bound)
    return bound.error();
  auto pid = z.fork(worker_msg::fork(endpoint, w->scratch_.string(), sandbox_env(spec, w->scratch_)));
  if (!pid)
    return pid.error();
  w->pid_ = *pid;
  w->zygote_ = z.shared_from_this();
  // Forked workers are the zygote's children: their end is seen on a pidfd (which works for any
  // process), their exit status comes from the zygote.
  w->pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, w->pid_, 0));
  if (w->pidfd_ < 0)
    return fail(errc::unsupported, "pidfd_open: ", std::strerror(errno), " (a forked worker cannot be watched)");
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

namespace {
// poll() for POLLIN on `fd` (a pidfd: readable once its process has ended), again after a
// signal: until `until` (steady clock; a past one: no wait), or for ever without one. poll's result.
int poll_readable(int fd, std::optional<std::chrono::steady_clock::time_point> until) {
  for (;;) {
    int timeout = -1;
    if (until) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*until - std::chrono::steady_clock::now());
      timeout = static_cast<int>(std::max<long long>(0, left.count()));
    }
    struct pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, timeout);
    if (r >= 0 || errno != EINTR)
      return r;
  }
}
} // namespace

bool worker::reap(bool block) {
  if (exited_ || pid_ <= 0)
    return true;
  if (zygote_) {
    // Not our child: the pidfd says when it has ended, the zygote reaps it and tells how.
    const auto until = block ? std::nullopt : std::optional{std::chrono::steady_clock::time_point{}};
    if (poll_readable(pidfd_, until) == 0)
      return false;
    exited_ = true;
    if (auto st = zygote_->reap(pid_)) {
      exit_code_ = st->code;
      exit_signal_ = st->signal;
    } else {
      exit_signal_ = SIGKILL; // the zygote is gone, and with it (PR_SET_PDEATHSIG) its workers
    }
    return true;
  }
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

bool worker::ended(std::chrono::steady_clock::time_point until) {
  if (reap(false))
    return true;
  if (pidfd_ >= 0)
    (void) poll_readable(pidfd_, until);
  return reap(false);
}

void worker::kill() {
  if (pid_ <= 0 || exited_)
    return;
  killed_by_us_ = true;
  // The sandbox's keeper has one child, PID 1 of the worker's PID namespace: killed, it takes
  // every process of that namespace with it, whatever process group they moved to.
  std::vector<int> children; // pidfds: the keeper's reaping does not wait for its children's ends
  if (std::FILE* f = std::fopen(("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children").c_str(), "r")) {
    long child = 0;
    while (std::fscanf(f, "%ld", &child) == 1) {
      if (int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(child), 0)); fd >= 0)
        children.push_back(fd);
      ::kill(static_cast<pid_t>(child), SIGKILL);
    }
    std::fclose(f);
  }
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  if (group_)
    group_->kill(); // every process it ever started, wherever it went
  reap(true);
  // Until the namespace's PID 1 has ended, and with it every process of the namespace (its end
  // waits for theirs), the worker's device memory is not the driver's again: an H100 worker of
  // 70 GB outlived its keeper's reaping, and the evaluation retried alone after it ran out of
  // memory. Ten seconds at most: a process stuck in the driver must not stop the evaluator.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int fd : children) {
    (void) poll_readable(fd, until);
    ::close(fd);
  }
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

result<void> worker::send(const std::string& json, const std::vector<std::vector<std::byte>>& frames) {
  try {
    auto sent = sock_->send(zmq::buffer(json), frames.empty() ? zmq::send_flags::dontwait : zmq::send_flags::sndmore);
    for (size_t i = 0; sent && i < frames.size(); ++i)
      sent = sock_->send(zmq::buffer(frames[i].data(), frames[i].size()),
                         i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::dontwait);
    if (!sent)
      return fail(errc::io, "worker ", std::to_string(pid_), " is not accepting messages");
  } catch (const zmq::error_t& e) {
    return fail(errc::io, "send to worker ", std::to_string(pid_), ": ", e.what());
  }
  return {};
}

pid_t worker::inner_pid() {
  if (inner_ > 0)
    return inner_;
  if (std::FILE* f = std::fopen(("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children").c_str(), "r")) {
    long child = 0;
    if (std::fscanf(f, "%ld", &child) == 1)
      inner_ = static_cast<pid_t>(child);
    std::fclose(f);
  }
  return inner_ > 0 ? inner_ : pid_;
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

// ---------------------------------------------------------------------------------------------

namespace {

// Reads from fd until `buf` holds a newline or the deadline passes; false on EOF, error or deadline.
bool read_line(int fd, std::string& buf, std::chrono::steady_clock::time_point deadline, std::string& line) {
  for (;;) {
    if (auto nl = buf.find('\n'); nl != std::string::npos) {
      line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0)
      return false;
    struct pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    char chunk[4096];
    auto n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    buf.append(chunk, static_cast<size_t>(n));
  }
}

} // namespace

result<std::shared_ptr<zygote>> zygote::start(const worker_spec& spec, std::chrono::steady_clock::duration timeout) {
  std::shared_ptr<zygote> z{new zygote()};
  auto scratch = make_scratch(spec, "z");
  if (!scratch)
    return scratch.error();
  z->scratch_ = std::move(*scratch);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return fail(errc::io, "socketpair: ", std::strerror(errno));
  auto args = harness_args(spec, z->scratch_);
  args.push_back("--zygote");
  auto child = spawn(spec, z->scratch_, std::move(args), sandbox_env(spec, z->scratch_), sv[1]);
  ::close(sv[1]);
  if (!child) {
    ::close(sv[0]);
    return child.error();
  }
  z->pid_ = *child;
  z->ctl_ = sv[0];
  std::string line;
  if (!read_line(z->ctl_, z->pending_, std::chrono::steady_clock::now() + timeout, line))
    return fail(errc::timeout, "the worker zygote (", spec.python, " ", spec.harness.string(),
                " --zygote) did not report ready (is torch installed for ", spec.python, "?)");
  try {
    if (wire::parse(line)["type"].as<std::string>() != "ready")
      return fail(errc::protocol, "the worker zygote sent ", line.substr(0, 200), " instead of ready");
  } catch (const wire::error& e) {
    return fail(errc::protocol, "the worker zygote's ready message is malformed: ", e.what());
  }
  return z;
}

zygote::~zygote() {
  if (ctl_ >= 0)
    ::close(ctl_); // the zygote exits when its stdin closes; the kill makes sure
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  std::error_code ec;
  if (!scratch_.empty())
    std::filesystem::remove_all(scratch_, ec);
}

bool zygote::alive() {
  std::lock_guard guard{mtx_};
  if (!broken_ && pid_ > 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1; // reaped: nothing to kill any more
      broken_ = true;
    }
  }
  return !broken_;
}

result<std::string> zygote::request(const std::string& line) {
  std::lock_guard guard{mtx_};
  if (broken_)
    return fail(errc::worker_lost, "the worker zygote is gone");
  std::string out = line + "\n";
  for (size_t off = 0; off < out.size();) {
    auto n = ::send(ctl_, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      broken_ = true;
      return fail(errc::worker_lost, "the worker zygote (pid ", std::to_string(pid_), ") stopped listening: ",
                  std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  // A fork of a process with torch loaded takes tens of milliseconds; a minute means it is stuck.
  std::string reply;
  if (!read_line(ctl_, pending_, std::chrono::steady_clock::now() + std::chrono::seconds{60}, reply)) {
    broken_ = true;
    return fail(errc::worker_lost, "the worker zygote (pid ", std::to_string(pid_), ") did not answer");
  }
  return reply;
}

result<pid_t> zygote::fork(const std::string& req) {
  auto reply = request(req);
  if (!reply)
    return reply.error();
  try {
    auto n = wire::parse(*reply);
    if (n["type"].as<std::string>() != "forked")
      return fail(errc::refused, "the zygote (pid ", std::to_string(pid_), ") did not fork a worker: ",
                  n["message"].as<std::string>("no reason given"));
    return n["pid"].as<pid_t>();
  } catch (const wire::error& e) {
    return fail(errc::protocol, "the zygote's reply is malformed: ", e.what());
  }
}

result<zygote::exit_status> zygote::reap(pid_t pid) {
  auto reply = request(worker_msg::reap(static_cast<long long>(pid)));
  if (!reply)
    return reply.error();
  try {
    auto n = wire::parse(*reply);
    if (n["type"].as<std::string>() != "reaped" || n["pid"].as<pid_t>() != pid)
      return fail(errc::protocol, "the worker zygote answered ", reply->substr(0, 200), " to a reap request");
    return exit_status{n["code"].as<int>(), n["signal"].as<int>()};
  } catch (const wire::error& e) {
    return fail(errc::protocol, "the worker zygote's reply is malformed: ", e.what());
  }
}

std::string isolation_report::missing_text() const {
  std::string out;
  for (const auto& [layer, why] : missing) {
    if (!out.empty())
      out += "; ";
    out += layer + " (" + why + ")";
  }
  return out;
}

isolation_report parse_isolation(const std::string& json_object) {
  try {
    return parse_isolation(wire::parse(json_object));
  } catch (const wire::error& e) {
    return isolation_report{{}, {{"sandbox", std::string{"the report is malformed: "} + e.what()}}, 0};
  }
}

isolation_report parse_isolation(const wire::node& n) {
  isolation_report r;
  try {
    if (n["layers"].is_list())
      for (const auto& l : n["layers"])
        r.layers.push_back(l.as<std::string>());
    if (n["missing"].is_object())
      for (const auto& [layer, why] : n["missing"].fields())
        r.missing.emplace_back(layer, why.as<std::string>());
    r.landlock_abi = n["landlock_abi"].as<int>(0);
  } catch (const wire::error& e) {
    r.layers.clear();
    r.missing = {{"sandbox", std::string{"the report is malformed: "} + e.what()}};
    return r;
  }
  if (r.layers.empty() && r.missing.empty())
    r.missing.emplace_back("sandbox", "the worker reported no isolation (an older harness?)");
  return r;
}

result<isolation_report> probe_isolation(const std::string& python, const std::filesystem::path& worker_py) {
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s)
      q += c == '\'' ? std::string{"'\\''"} : std::string(1, c);
    return q + "'";
  };
  const auto confine = worker_py.parent_path() / "confine.py";
  const auto cmd = quote(python) + " -I -B " + quote(confine.string()) + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    return fail(errc::io, "cannot run ", python, ": ", std::strerror(errno));
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p))
    out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0 || out.empty() || out[0] != '{')
    return fail(errc::not_found, "the isolation probe (", python, " ", confine.string(), ") failed: ", out.substr(0, 400));
  auto report = parse_isolation(out);
  add_evaluator_layers(report);
  return report;
}

void add_evaluator_layers(isolation_report& report) {
  // Without its control group the clock charges the CPU time a walk of the worker's processes
  // finds and stops them by signals, which a candidate can step around (docs/evaluator.md, Trust
  // boundary: "The clock").
  if (auto why = control_group::unavailable_reason(); !why.empty())
    report.missing.emplace_back("control-group", why);
  else
    report.layers.emplace_back("control-group");
}

} // namespace crucible::env
