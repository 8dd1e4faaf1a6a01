// The commands' child processes (tools/crucible/child_process.hpp).
#include "tools/crucible/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace crucible::cli {

pid_t spawn_child(std::vector<std::string> argv, int out_fd, int err_fd, bool own_group) {
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  for (auto [fd, target] : {std::pair{out_fd, 1}, std::pair{err_fd, 2}}) {
    if (fd >= 0)
      posix_spawn_file_actions_adddup2(&fa, fd, target);
    else
      posix_spawn_file_actions_addopen(&fa, target, "/dev/null", O_WRONLY, 0);
  }
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (own_group) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attr, 0);
  }
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ) != 0)
    pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return pid;
}

int run_captured(std::vector<std::string> argv, std::string& out, std::string& err) {
  int o[2], e[2];
  if (::pipe2(o, O_CLOEXEC) != 0)
    return -1;
  if (::pipe2(e, O_CLOEXEC) != 0) {
    ::close(o[0]), ::close(o[1]);
    return -1;
  }
  const pid_t pid = spawn_child(std::move(argv), o[1], e[1], false);
  ::close(o[1]), ::close(e[1]);
  if (pid < 0) {
    ::close(o[0]), ::close(e[0]);
    return -1;
  }
  pollfd fds[2] = {{o[0], POLLIN, 0}, {e[0], POLLIN, 0}};
  std::string* bufs[2] = {&out, &err};
  int open = 2;
  char chunk[8192];
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
        continue;
      const ssize_t n = ::read(fds[i].fd, chunk, sizeof chunk);
      if (n > 0) {
        bufs[i]->append(chunk, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}

std::filesystem::path checkout_tool(const env::harness_location& where, std::string_view name) {
  // worker.py lies in env/eval/harness/ of the checkout.
  return where.worker_py.parent_path().parent_path().parent_path().parent_path() / "tools" / name;
}

} // namespace crucible::cli
