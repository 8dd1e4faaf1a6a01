// `crucible tasks import DIR`: index a KernelBench-style directory without changing it.
#include <chrono>
#include <cstdio>
#include <regex>

#include <unistd.h>

#include "core/config.hpp"
#include "core/json.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "env/eval/compare.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "storage/atomic_file.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int run_tasks(const parsed_args& args) {
  if (args.positional[0] != "import") {
    std::fprintf(stderr, "crucible tasks: unknown action '%s' (expected import)\n", args.positional[0].c_str());
    return exit_usage;
  }
  const auto& dir = args.positional[1];
  std::vector<std::string> skipped;
  auto tasks = env::index_tasks(dir, &skipped);
  if (!tasks) {
    std::fprintf(stderr, "crucible tasks import: %s\n", tasks.error().message.c_str());
    return exit_usage;
  }
  // Every task's reference is run once in a sandboxed worker, as a verdict runs it before its
  // candidate: a task that does not run is refused here by name and line, not found out by
  // every verdict of a training run.
  std::vector<std::pair<std::string, std::string>> broken; // name, what is wrong
  // Tasks whose outputs sit within the tolerance (name, the check's words for each output):
  // imported all the same, their outputs judged relative to their own scale (docs/evaluator.md,
  // Correctness), and named here so that whoever imports them can see a task that asks for
  // almost nothing (robust-kbench leaves such tasks out of its set).
  std::vector<std::pair<std::string, std::string>> within;
  if (!args.has("--no-check")) {
    config cfg;
    auto device = device_option(args, "--device", "cpu");
    if (!device) {
      std::fprintf(stderr, "crucible tasks import: %s\n", device.error().message.c_str());
      return exit_usage;
    }
    system_clock clk;
    logger log{clk, log_level::warn};
    auto opt = cfg.evaluator;
    opt.warm_workers = 1;
    auto made = env::make_device_evaluators(opt, cfg.reward, {*device}, log, env::verdict_cache_use::none);
    if (!made) {
      std::fprintf(stderr, "crucible tasks import: %s\n", made.error().message.c_str());
      return exit_failure;
    }
    auto* ev = &made->front();
    std::vector<env::task> runs; // the tasks whose reference ran
    std::size_t i = 0;
    // On a terminal, one line: count, seconds a task and time left, and the task being checked.
    const bool terminal = ::isatty(2) != 0;
    const auto started = std::chrono::steady_clock::now();
    for (const auto& t : *tasks) {
      if (terminal) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        std::fprintf(stderr, "\r%s; checking %s\x1b[K",
                     progress_text("tasks", i, tasks->size(), elapsed, progress_unit::items).c_str(), t.name.c_str());
      }
      ++i;
      auto v = (*ev)->check_task(t);
      if (v.status == env::verdict_status::ok) {
        runs.push_back(t);
        // The check's verdict carries a line opened by within_tolerance_phrase where the rule applies.
        if (auto outputs = env::within_tolerance_of(v.message); !outputs.empty())
          within.emplace_back(t.name, std::move(outputs));
      } else {
        // The worker runs the source as task.py in its scratch directory: name the real file.
        static const std::regex scratch_file{R"(File "[^"]*task\.py")"};
        auto what = std::regex_replace(v.message, scratch_file, "File \"" + t.path.string() + "\"");
        broken.emplace_back(t.name, std::string{env::to_string(v.status)} + ": " + what);
      }
    }
    if (terminal)
      std::fprintf(stderr, "\r\x1b[K");
    if (!broken.empty() && !args.has("--skip-broken")) {
      for (const auto& [name, what] : broken)
        std::fprintf(stderr, "crucible tasks import: task %s does not run: %s\n", name.c_str(), what.c_str());
      std::fprintf(stderr, "crucible tasks import: %zu of %zu tasks in %s do not run; fix them, or leave them out with "
                           "--skip-broken\n", broken.size(), tasks->size(), dir.c_str());
      return exit_failure;
    }
    *tasks = std::move(runs);
  }
  json_writer w;
  w.begin_object().field("root", dir).key("tasks").begin_array();
  for (const auto& t : *tasks)
    w.begin_object()
      .field("name", t.name)
      .field("path", t.path.string())
      .field("level", t.level)
      .field("number", t.number)
      .field("sha256", t.sha256)
      .end_object();
  w.end_array().field("skipped", skipped).key("broken").begin_array();
  for (const auto& [name, what] : broken)
    w.begin_object().field("name", name).field("error", what).end_object();
  w.end_array().key("within_tolerance").begin_array();
  for (const auto& [name, what] : within)
    w.begin_object().field("name", name).field("outputs", what).end_object();
  w.end_array().end_object();
  if (args.has("--out")) {
    if (auto r = storage::write_file_atomic(args.get("--out"), w.str() + "\n"); !r) {
      std::fprintf(stderr, "crucible tasks import: %s\n", r.error().message.c_str());
      return exit_failure;
    }
  }
  if (args.has("--json")) {
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  std::printf("%-5s %-6s %-12s %s\n", "level", "number", "sha256", "name");
  for (const auto& t : *tasks)
    std::printf("%-5d %-6d %-12s %s\n", t.level, t.number, t.sha256.substr(0, 12).c_str(), t.name.c_str());
  std::printf("%zu tasks in %s\n", tasks->size(), dir.c_str());
  for (const auto& s : skipped)
    std::printf("skipped %s\n", s.c_str());
  for (const auto& [name, what] : broken)
    std::printf("left out %s (does not run): %s\n", name.c_str(), what.c_str());
  for (const auto& [name, what] : within)
    std::printf("outputs within the tolerance in %s (judged relative to the outputs): %s\n", name.c_str(), what.c_str());
  if (args.has("--out"))
    std::printf("index written to %s\n", args.get("--out").c_str());
  return exit_ok;
}

} // namespace

command tasks_command() {
  return {{"tasks", "import DIR [--out INDEX.json] [--json] [--device D] [--skip-broken] [--no-check]",
           "Index a KernelBench-style task directory",
           "Finds every task file below DIR (level folders, numbered files such as\n"
           "level1/19_ReLU.py), checks that each defines Model, get_inputs and get_init_inputs,\n"
           "runs each task's reference once in a sandboxed worker (built, called on its inputs,\n"
           "called again: it must run and give the same outputs), and lists them with their source\n"
           "hashes. A task that does not run is named with its error (file and line) and the\n"
           "import fails (exit 1), unless --skip-broken leaves it out and lists it. A task whose\n"
           "outputs sit within the absolute tolerance (tiny outputs: a normalisation, a softmax over\n"
           "many elements) is imported and listed under within_tolerance: its outputs are judged\n"
           "relative to their own scale. DIR is only read.",
           {"ACTION (import)", "DIR"},
           {{"--out", "INDEX.json", "also write the index as JSON to this file"},
            {"--json", "", "print the index as JSON"},
            {"--device", "D", "where the references run: cpu (default) or cuda:N"},
            {"--skip-broken", "", "leave out tasks that do not run (listed under broken) instead of failing"},
            {"--no-check", "", "index only: do not run the references"}}},
          run_tasks};
}

} // namespace crucible::cli
