// `crucible report RUN [--out DIR]`: the run's metrics.jsonl, status.json and events.log in,
// report.html out, around the plots tools/report_plots.py draws with matplotlib through the
// workers' Python (storage/report.hpp writes the page).
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "env/eval/evaluator.hpp"
#include "storage/report.hpp"
#include "tools/crucible/child_process.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

// The plots: tools/report_plots.py RUN OUT with the workers' interpreter. What keeps them from
// being drawn is said on the page and on stderr; bad records are the run's error (exit 2 there).
result<storage::report_plots> draw_plots(const std::filesystem::path& run, const std::filesystem::path& out) {
  storage::report_plots plots;
  auto where = env::locate_harness(evaluator_options{});
  if (!where || where->python.empty()) {
    plots.missing = "No plots: no Python interpreter found (tools/setup.sh makes .venv).";
    return plots;
  }
  const auto script = checkout_tool(*where, "report_plots.py");
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
