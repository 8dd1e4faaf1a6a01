// `crucible report RUN [--out DIR]`: the run's metrics.jsonl, status.json and events.log in,
// report.html with inline SVG plots and PNG copies out (storage/report.hpp does the work).
#include <cstdio>

#include "storage/report.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int run_report_cmd(const parsed_args& args) {
  std::filesystem::path run = args.positional[0];
  std::filesystem::path out = args.has("--out") ? std::filesystem::path{args.get("--out")} : run / "report";
  auto files = storage::write_report(run, out);
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
  return {{"report", "RUN [--out DIR]", "Write an HTML report with plots (and PNG copies) of a run",
           "Reads RUN/metrics.jsonl, RUN/status.json and RUN/events.log and writes DIR/report.html\n"
           "(self-contained, inline SVG) and one PNG per plot with data: reward and speedup over\n"
           "steps, best speedup per task, verdict status breakdown, best speedup per hardware.\n"
           "A plot without records yet is replaced by a line saying so. Prints the paths written.\n"
           "Record formats: docs/report.md.",
           {"RUN"},
           {{"--out", "DIR", "output directory (default RUN/report)"}}},
          run_report_cmd};
}

} // namespace crucible::cli
