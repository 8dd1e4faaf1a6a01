// env/task.hpp: KernelBench-format tasks: reading one file, indexing a directory of them.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace crucible::env {

/// One task file: `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()`. Plain value.
struct task {
  std::string name;            ///< path below the suite root without ".py", e.g. "level1/19_ReLU"
  std::filesystem::path path;  ///< the file
  std::string source;
  std::string sha256;          ///< of the source, the verdict cache's task key
  int level = 0;               ///< from a "levelN" folder, 0 if none
  int number = 0;              ///< from a leading "N_" in the file name, 0 if none
};

/// Reads and checks one task file; errc::invalid_arg names the file and what it lacks.
/// `name` defaults to the file's stem.
result<task> load_task(const std::filesystem::path& file, std::string name = "");

/// Checks that `source` looks like a KernelBench task (top-level Model class, get_inputs,
/// get_init_inputs); returns what is missing, or "" when it is complete.
std::string missing_task_parts(const std::string& source);

/// Indexes a KernelBench-style directory (level folders, numbered files) without changing
/// it: every `*.py` below `root` that defines a task, ordered by level, number and name.
/// Files that are not tasks are skipped and listed in `skipped` (path: reason).
result<std::vector<task>> index_tasks(const std::filesystem::path& root,
                                      std::vector<std::string>* skipped = nullptr);

/// Source normalisation for cache keys: CRLF to LF, trailing whitespace and blank lines
/// removed. Never changes meaning (comments are kept: '#' lines may be C++ in a string).
std::string normalize_source(const std::string& source);

} // namespace crucible::env
