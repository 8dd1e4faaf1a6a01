// `crucible tasks import DIR`: index a KernelBench-style directory without changing it.
#include <cstdio>

#include "core/json.hpp"
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
  w.end_array().field("skipped", skipped).end_object();
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
  if (args.has("--out"))
    std::printf("index written to %s\n", args.get("--out").c_str());
  return exit_ok;
}

} // namespace

command tasks_command() {
  return {{"tasks", "import DIR [--out INDEX.json] [--json]", "Index a KernelBench-style task directory",
           "Finds every task file below DIR (level folders, numbered files such as\n"
           "level1/19_ReLU.py), checks that each defines Model, get_inputs and get_init_inputs,\n"
           "and lists them with their source hashes. DIR is only read.",
           {"ACTION (import)", "DIR"},
           {{"--out", "INDEX.json", "also write the index as JSON to this file"},
            {"--json", "", "print the index as JSON"}}},
          run_tasks};
}

} // namespace crucible::cli
