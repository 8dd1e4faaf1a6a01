#include "process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>

namespace crucible::testing {

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::string& cwd, int out_pipe[2], int err_pipe[2]) {
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe2 failed");
  pid_t pid = fork();
  if (pid < 0)
    throw std::runtime_error("fork failed");
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0)
      _exit(126);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  return pid;
}

// Reads both pipes to their end and reaps `pid`.
process_result collect(pid_t pid, int out_fd, int err_fd, process_result res) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&res.out, &res.err};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
        continue;
      auto n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return res;
}

} // namespace

running_process::running_process(const std::vector<std::string>& argv) {
  int out_pipe[2];
  int err_pipe[2];
  pid_ = spawn(argv, "", out_pipe, err_pipe);
  out_ = out_pipe[0];
  err_ = err_pipe[0];
}

running_process::~running_process() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    (void) collect(pid_, out_, err_, {});
  }
}

bool running_process::read_some(int timeout_ms, std::string& out) {
  if (out_eof_)
    return false;
  // stderr is drained too, so that a chatty child never blocks on a full pipe.
  pollfd fds[2] = {{out_, POLLIN, 0}, {err_eof_ ? -1 : err_, POLLIN, 0}};
  if (poll(fds, 2, timeout_ms) <= 0)
    return false;
  char buf[4096];
  if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
    auto n = read(err_, buf, sizeof buf);
    if (n > 0)
      err_text_.append(buf, static_cast<size_t>(n));
    else
      err_eof_ = true;
  }
  if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
    return false;
  auto n = read(out_, buf, sizeof buf);
  if (n <= 0) {
    out_eof_ = true;
    return false;
  }
  out_text_.append(buf, static_cast<size_t>(n));
  out.append(buf, static_cast<size_t>(n));
  return true;
}

bool running_process::read_until(const std::string& text, int timeout_ms, std::string& out) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds{timeout_ms};
  while (out.find(text) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || out_eof_)
      return false;
    read_some(static_cast<int>(left.count()), out);
  }
  return true;
}

void running_process::signal(int sig) {
  if (pid_ > 0)
    kill(pid_, sig);
}

process_result running_process::wait() {
  process_result res;
  res.out = out_text_;
  res.err = err_text_;
  res = collect(pid_, out_, err_, std::move(res));
  pid_ = -1;
  return res;
}

process_result run_process(const std::vector<std::string>& argv, const std::string& cwd) {
  int out_pipe[2];
  int err_pipe[2];
  pid_t pid = spawn(argv, cwd, out_pipe, err_pipe);
  return collect(pid, out_pipe[0], err_pipe[0], {});
}

} // namespace crucible::testing
