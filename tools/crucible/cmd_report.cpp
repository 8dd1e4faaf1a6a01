// `crucible report RUN [--out DIR]`: the run's metrics.jsonl, status.json and events.log in,
// report.html out, around the plots tools/report_plots.py draws with matplotlib through the
// workers' Python (storage/report.hpp writes the page).
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "env/evaluator.hpp"
#include "storage/report.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

// Runs argv (stdin /dev/null), its stdout and stderr read to the end; its exit status, or -1
// where it could not start or did not exit.
int run_captured(std::vector<std::string> argv, std::string& out, std::string& err) {
  int o[2], e[2];
  if (::pipe2(o, O_CLOEXEC) != 0)
    return -1;
  if (::pipe2(e, O_CLOEXEC) != 0) {
    ::close(o[0]), ::close(o[1]);
    return -1;
  }
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, o[1], 1);
  posix_spawn_file_actions_adddup2(&fa, e[1], 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(o[1]), ::close(e[1]);
  if (rc != 0) {
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

// The plots: tools/report_plots.py RUN OUT with the workers' interpreter. What keeps them from
// being drawn is said on the page and on stderr; bad records are the run's error (exit 2 there).
result<storage::report_plots> draw_plots(const std::filesystem::path& run, const std::filesystem::path& out) {
  storage::report_plots plots;
  auto where = env::locate_harness(evaluator_options{});
  if (!where || where->python.empty()) {
    plots.missing = "No plots: no Python interpreter found (tools/setup.sh makes .venv).";
    return plots;
  }
  const auto script = where->worker_py.parent_path().parent_path().parent_path() / "tools" / "report_plots.py";
  std::string so, se;
  const int rc = run_captured({where->python, "-B", script.string(), run.string(), out.string()}, so, se);
  while (!se.empty() && se.back() == '\n')
    se.pop_back();
  if (rc == 2) { // the run's records: said as the report's own reader says it
    constexpr std::string_view prefix = "report_plots: ";
    if (se.rfind(prefix, 0) == 0)
      se.erase(0, prefix.size());
    return fail(errc::corrupt, se.empty() ? std::string{"tools/report_plots.py refused the run"} : se);
  }
  if (rc != 0) {
    plots.missing = "No plots: " + where->python + " " + script.string() + " failed" +
                    (se.empty() ? std::string{} : ": " + se.substr(se.size() > 600 ? se.size() - 600 : 0)) +
                    " (tools/setup.sh installs matplotlib into .venv)";
    return plots;
  }
  auto parsed = storage::parse_plot_manifest(so);
  if (!parsed)
    return parsed.error();
  plots.plots = std::move(*parsed);
  return plots;
}

int run_report_cmd(const parsed_args& args) {
  std::filesystem::path run = args.positional[0];
  std::filesystem::path out = args.has("--out") ? std::filesystem::path{args.get("--out")} : run / "report";
  std::error_code ec;
  if (!std::filesystem::is_directory(run, ec) || !std::filesystem::exists(run / "config.yaml", ec)) {
    std::fprintf(stderr, "crucible report: %s: not a run directory (no config.yaml)\n", run.c_str());
    return exit_usage;
  }
  auto plots = draw_plots(run, out);
  if (!plots) {
    std::fprintf(stderr, "crucible report: %s\n", plots.error().message.c_str());
    return exit_usage;
  }
  if (!plots->missing.empty())
    std::fprintf(stderr, "crucible report: %s\n", plots->missing.c_str());
  auto files = storage::write_report(run, out, *plots);
  if (!files) {
    std::fprintf(stderr, "crucible report: %s\n", files.error().message.c_str());
    return files.error().code == errc::not_found || files.error().code == errc::corrupt ? exit_usage : exit_failure;
  }
  std::printf("%s\n", files->html.c_str());
  for (const auto& p : files->pngs)
    std::printf("%s\n", p.c_str());
  for (const auto& p : files->progress) {
    std::printf("learning: %s\n", storage::to_string(p).c_str());
    for (const auto& t : p.tasks)
      std::printf("learning:   %s\n", storage::to_string(t).c_str());
  }
  for (const auto& p : files->pace)
    std::printf("pace: %s\n", storage::to_string(p).c_str());
  return exit_ok;
}

} // namespace

command report_command() {
  return {{"report", "RUN [--out DIR]", "Write an HTML report with plots of a run",
           "Reads RUN/metrics.jsonl, RUN/status.json and RUN/events.log and writes DIR/report.html\n"
           "around the PNG plots tools/report_plots.py draws with matplotlib (the workers' Python):\n"
           "SFT loss, RL samples and updates by step, first third against last, per task, by turn,\n"
           "verdict statuses, best speedups, GPU busy. Prints the paths written, then the learning\n"
           "and pace lines. Record formats: docs/report.md.",
           {"RUN"},
           {{"--out", "DIR", "output directory (default RUN/report)"}}},
          run_report_cmd};
}

} // namespace crucible::cli
