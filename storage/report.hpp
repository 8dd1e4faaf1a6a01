// storage/report.hpp: `crucible report RUN`: a run's metrics.jsonl (and status.json, events.log)
// in, report.html out, around the plots tools/report_plots.py draws with matplotlib (the command
// runs it; docs/report.md).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "storage/pace.hpp"

namespace crucible::storage {

/// One plot that tools/report_plots.py drew: OUT/file, its title and its caption.
struct report_plot {
  std::string id, file, title, caption;
};

/// The plots of tools/report_plots.py's stdout ({"plots": [{"id", "file", "title", "caption"}]}),
/// in display order; errc::corrupt naming what is wrong with it (a file that is not a plain
/// name ending in .png included).
result<std::vector<report_plot>> parse_plot_manifest(const std::string& text);

/// What the page itself shows of the metrics records (the plots are tools/report_plots.py's).
/// Records are JSON objects told apart by their `event` key (or `kind` when there is no
/// `event`); the fields the plots read are checked here (docs/report.md says which each kind
/// needs), and kinds the report does not know are counted and otherwise ignored.
struct report_data {
  std::map<std::string, std::size_t> kinds;         ///< records seen per kind, unknown ones included
  /// Multi-turn episodes: verdict records with a `turn` (from 0), pooled per turn.
  struct turn_stats {
    std::uint64_t samples = 0, correct = 0; ///< correct: status ok, correct and a speedup
    double speedup_sum = 0;                 ///< over the correct ones
    double correct_share() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
    double mean_speedup() const;            ///< NaN without a correct sample
  };
  std::map<std::int64_t, turn_stats> by_turn;
};

/// "turn 1: 24 samples, 41.7% correct, mean speedup of correct samples 1.12x" (turns from 1).
std::string to_string(std::int64_t turn, const report_data::turn_stats& t);

/// Gathers report data from the lines of a metrics file (as read_metrics returns them).
/// errc::corrupt "SOURCE:LINE: ..." for a line that is not a JSON object, has no string
/// `event`/`kind`, or holds a field of the wrong type for its kind.
result<report_data> collect_report_data(const std::vector<std::string>& lines, const std::string& source);

/// How a sampling stage's samples changed: its first steps against its last (a third of its
/// steps each, at least one), pooled over their samples.
struct stage_progress {
  std::string stage;             ///< "rl" or "self_supervised"
  std::size_t steps = 0;         ///< distinct sampling steps of the stage (a step done twice counts once: the last record)
  std::size_t window = 0;        ///< steps in each of the two windows
  std::uint64_t first_step = 0, last_step = 0; ///< run steps of the stage's first and last update
  double first_correct = 0, last_correct = 0;  ///< share of correct samples in each window
  double first_speedup = 0, last_speedup = 0;  ///< mean speedup of the window's correct samples (NaN: none)
  std::uint64_t first_samples = 0, last_samples = 0;

  /// One task's samples in the two windows (from the stage's verdict records).
  struct task_windows {
    std::string task;
    std::uint64_t first_samples = 0, last_samples = 0;
    double first_correct = 0, last_correct = 0; ///< share of correct samples
    double first_speedup = 0, last_speedup = 0; ///< mean speedup of correct samples (NaN: none)
  };
  /// The tasks sampled in both windows, by name. Pooled figures follow the mix of tasks a window
  /// happened to draw (one task at 1.5x, another at 19x); these do not.
  std::vector<task_windows> tasks;
  /// Each task of `tasks` weighted equally: the mean of their correct shares (NaN: no task).
  double first_task_correct = 0, last_task_correct = 0;
  /// The mean of their mean speedups, over the tasks with correct samples in both windows
  /// (`speedup_tasks` of them; NaN: none).
  double first_task_speedup = 0, last_task_speedup = 0;
  std::size_t speedup_tasks = 0;
};

/// The progress of every sampling stage found in the metrics lines (train_step records with
/// `samples` and `correct_share`), in the order the stages first appear. The per-task figures come
/// from the stage's `verdict` records: a window is the first (last) `window` distinct steps its
/// verdicts carry; verdicts of a step sampled again after a resume replace the earlier ones.
std::vector<stage_progress> learning_progress(const std::vector<std::string>& lines);

/// "rl, first 5 against last 5 of 16 steps: correct samples 12.5% -> 43.8%, mean speedup of correct
/// samples 1.02x -> 1.31x (40 and 40 samples); each of the 2 tasks sampled in both weighted
/// equally: correct 10.0% -> 45.0%, mean speedup 1.01x -> 1.29x".
std::string to_string(const stage_progress& p);

/// "05_logsumexp_rows: correct 50.0% -> 75.0%, mean speedup 1.49x -> 1.55x (8 and 8 samples)".
std::string to_string(const stage_progress::task_windows& t);

/// Paths written by write_report.
/// What the plots' drawing gave: the plots, or why there are none (no interpreter with
/// matplotlib, the script's error), which the page then says.
struct report_plots {
  std::vector<report_plot> plots;
  std::string missing;
};

struct report_files {
  std::filesystem::path html;
  std::vector<std::filesystem::path> pngs; ///< one per plot, in display order
  std::vector<stage_progress> progress;    ///< learning_progress of the run's records
  std::vector<pace_segment> pace;          ///< pace_segments of the run's records
};

/// Reads the run directory `run` (it must hold config.yaml; metrics.jsonl may be absent when no
/// record was written yet) and writes `out/report.html` around `plots` (drawn into `out` before),
/// creating `out`. Errors name the file at fault: errc::not_found for a directory that is
/// not a run, errc::io for unreadable or unwritable files, errc::corrupt for bad records.
result<report_files> write_report(const std::filesystem::path& run, const std::filesystem::path& out,
                                  const report_plots& plots);

} // namespace crucible::storage
