// `crucible status RUN`: what a run is doing (or did), from its status.json and lock.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "actors/messages.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "storage/atomic_file.hpp"
#include "storage/replay_store.hpp"
#include "storage/run_dir.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int run_status_cmd(const parsed_args& args) {
  std::filesystem::path dir = args.positional[0];
  auto config = dir / "config.yaml";
  std::error_code ec;
  if (!std::filesystem::exists(config, ec)) {
    std::fprintf(stderr, "crucible status: %s is not a run directory (no config.yaml)\n", dir.c_str());
    return exit_usage;
  }
  auto text = storage::read_file(dir / "status.json");
  if (!text) {
    std::fprintf(stderr, "crucible status: %s: %s\n", dir.c_str(), text.error().message.c_str());
    return exit_failure;
  }
  auto st = run_status_from_json(*text);
  if (!st) {
    std::fprintf(stderr, "crucible status: %s: %s\n", (dir / "status.json").c_str(), st.error().message.c_str());
    return exit_failure;
  }
  // A run that says it is running but whose process no longer holds the lock has crashed.
  if ((st->state == run_state::running || st->state == run_state::starting || st->state == run_state::pausing)
      && !storage::run_directory_locked(dir))
    st->state = run_state::crashed;
  // Where evaluator nodes join, while the run's process takes them.
  std::string join;
  if (st->state == run_state::running || st->state == run_state::pausing)
    if (auto doc = parse_json(*text); doc.ok() && doc->is_object())
      if (const auto* j = doc->find("join"); j != nullptr && j->is_string())
        join = j->as_string();
  // The replay store's samples by fate, where it exists (status creates nothing).
  std::optional<storage::sample_counts> samples;
  std::string samples_error;
  if (std::filesystem::exists(dir / "replay.db", ec)) {
    auto store = storage::replay_store::open(dir / "replay.db");
    auto counts = store ? store->count_samples() : result<storage::sample_counts>{store.error()};
    if (counts)
      samples = *counts;
    else
      samples_error = counts.error().message;
  }
  if (args.has("--json")) {
    json_writer w;
    w.begin_object();
    write_fields(w, *st);
    if (!join.empty())
      w.field("join", join);
    if (samples) {
      w.key("samples").begin_object().field("total", samples->total).field("undecided", samples->pending);
      for (auto fate : storage::sample_fate::all)
        w.field(std::string(fate), samples->of(fate));
      w.end_object();
    }
    w.end_object();
    std::printf("%s\n", std::move(w).take().c_str());
    return exit_ok;
  }
  std::printf("run            %s\n", dir.c_str());
  std::printf("state          %s\n", to_string(st->state));
  std::printf("stage          %s\n", st->stage.empty() ? "-" : st->stage.c_str());
  std::printf("step           %llu\n", static_cast<unsigned long long>(st->step));
  std::printf("policy         v%llu\n", static_cast<unsigned long long>(st->policy_version.value));
  std::printf("variants       %llu\n", static_cast<unsigned long long>(st->variants));
  std::printf("best speedup   %s\n", speedup_text(st->best_speedup).c_str());
  std::printf("mean speedup   %s\n", speedup_text(st->mean_speedup).c_str());
  std::printf("dropped stale  %llu samples\n", static_cast<unsigned long long>(st->dropped_stale));
  std::printf("discarded      %llu samples (arrived after their stage's last update)\n",
              static_cast<unsigned long long>(st->discarded));
  std::printf("unfinished     %llu samples (their group never reached training)\n",
              static_cast<unsigned long long>(st->unfinished));
  if (samples)
    std::printf("replay store   %s\n", samples->text().c_str());
  else if (!samples_error.empty())
    std::printf("replay store   unreadable: %s\n", samples_error.c_str());
  if (!st->skipped_tasks.empty()) {
    std::string names;
    for (const auto& t : st->skipped_tasks)
      names += (names.empty() ? "" : ", ") + t;
    std::printf("skipped tasks  %zu (their reference cannot run; tasks.skip_broken): %s\n", st->skipped_tasks.size(),
                names.c_str());
  }
  // How busy each GPU of the trainer's process has been: evaluations and the policy's own work
  // (generation, updates), as shares of the time since the process began using it.
  for (const auto& d : st->devices) {
    auto share = [&](double s) { return d.seconds > 0 ? 100.0 * s / d.seconds : 0.0; };
    // What runs on it, where the record says (the engine and learner flags; older records have none).
    std::string roles;
    if (d.engine || d.learner) {
      const std::pair<bool, const char*> all[] = {{d.engine, "engine"}, {d.learner, "learner"}, {d.evaluator, "evaluator"}};
      for (const auto& [on, name] : all)
        if (on)
          roles += (roles.empty() ? " (" : ", ") + std::string{name};
      roles += ")";
    } else if (!d.evaluator) {
      roles = " (no evaluator on it)";
    }
    std::printf("gpu %-10s evaluation %5.1f%%, policy %5.1f%% of %.0f s%s\n", d.device.c_str(), share(d.evaluation_s),
                share(d.policy_s), d.seconds, roles.c_str());
  }
  if (!join.empty())
    std::printf("nodes join at  %s\n", join.c_str());
  return exit_ok;
}

} // namespace

command status_command() {
  return {{"status", "RUN [--json]", "Show a run's state, stage, step, policy version and speedups",
           "Reads RUN/status.json. A run whose status says running but whose process is gone is\n"
           "reported as crashed. While a run that takes evaluator nodes runs, its HOST:PORT for\n"
           "crucible evaluator --join is shown (\"join\" with --json).",
           {"RUN"},
           {{"--json", "", "print one JSON object"}}},
          run_status_cmd};
}

} // namespace crucible::cli
