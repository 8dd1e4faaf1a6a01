// tools/crucible/eval_set.hpp: `crucible eval` over a set of (task, candidate) pairs. Set files
// in (a suite folder with variants, a TSV list, CUDA-L1's JSONL) -> pairs -> per-pair records
// (one JSON line each, appended to --out and read back to resume) -> the summary over them.
// The reading and summarising here touch no device; cmd_eval_set.cpp runs the pairs.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"
#include "tools/crucible/args.hpp"

namespace crucible {
struct config;
}

namespace crucible::cli::eval_set {

/// How a set was given.
enum class set_form : std::uint8_t {
  dir,   ///< --set-dir DIR: DIR/variants/TASK/*.py against DIR/TASK.py
  tsv,   ///< --pairs FILE.tsv: TASK<TAB>CANDIDATE lines
  jsonl, ///< --pairs FILE.jsonl: CUDA-L1 lines (level_id, task_id, ref_code, custom_code)
};

/// One pair of a set. Plain value.
struct set_pair {
  std::size_t index = 0;       ///< 1-based position in the set ("pair" in its record)
  set_form form = set_form::dir;
  std::string task_label;      ///< "task" in its record: the task file, or for JSONL a name
  std::string candidate_label; ///< "candidate" in its record: the file, or for JSONL FILE:LINE
  std::size_t line = 0;        ///< line of the TSV or JSONL file; 0 for a set folder
  std::string origin;          ///< where the pair was read, for messages: FILE:LINE, or the candidate file
  std::string level_id = "null"; ///< JSONL: level_id as JSON text ("null" when absent)
  std::string task_id = "null";  ///< JSONL: task_id as JSON text ("null" when absent)
  std::string input_json;      ///< JSONL: the line's other fields as one JSON object; "" otherwise
  env::task task;              ///< the task (source in memory); unset when `problem` is set
  std::string candidate;       ///< the candidate's source; unset when `problem` is set
  /// Non-empty when the pair's own files are bad (a file missing, unreadable, not a task, no
  /// code): the pair is not evaluated but recorded as an error record saying this.
  std::string problem;

  /// The key a record is matched by when a run resumes: (task, candidate) for files, (line,
  /// level_id, task_id) for JSONL.
  std::string identity() const;
};

/// A set read from the command line's source. `warnings` (file:line: what) are printed but
/// do not stop the run; pairs with a problem are not among them (they are told when recorded).
struct pair_set {
  std::vector<set_pair> pairs;
  std::vector<std::string> warnings;
};

/// Every candidate DIR/variants/<task name>/*.py paired with the task DIR/<task name>.py (task
/// names as env::index_tasks gives them, level folders included: variants/level1/19_ReLU/x.py
/// goes with level1/19_ReLU.py), as the seed variants of a suite are laid out. errc::not_found
/// when DIR or DIR/variants is missing or no candidate is found; errc::io for an unreadable file.
result<pair_set> load_set_dir(const std::filesystem::path& dir);

/// One pair per line `TASK<TAB>CANDIDATE` (relative paths relative to the file's folder; blank
/// lines and lines starting with '#' skipped; a pair listed twice is evaluated once, with a
/// warning). A file that is missing or unreadable is a problem of that pair. errc::invalid_arg
/// naming FILE:LINE for a line that is not two non-empty tab-separated fields.
result<pair_set> load_pairs_tsv(const std::filesystem::path& file);

/// One JSON object per line with string fields `ref_code` (a KernelBench task) and `custom_code`
/// (the candidate), as CUDA-L1 publishes its kernels; `level_id` and `task_id` name the pair,
/// every other field is echoed into its record under "input". errc::invalid_arg naming FILE:LINE
/// for a line that is not a JSON object or lacks either code field. An empty custom_code or a
/// ref_code that is not a task is a problem of that pair.
result<pair_set> load_pairs_jsonl(const std::filesystem::path& file);

/// What the summary takes from one record. Plain value.
struct outcome {
  std::string status;                     ///< a verdict status, or "error" for an error record
  bool correct = false;
  double speedup = NAN;                   ///< NaN when the record has none
  double fraction = NAN;                  ///< the candidate's fraction of its hardware's limit; NaN when none
  std::vector<std::string> checks_failed;
  std::string device;                     ///< "" when the pair was not evaluated
};

/// The record of an evaluated pair: its identity, the device(s) that measured it (the first,
/// and the second of a cross-device recheck as "recheck_device"), every field of
/// env::to_json(v), and for JSONL the echoed "input".
std::string record_json(const set_pair& p, const env::verdict& v, const std::vector<std::string>& devices);

/// The record of a pair that was not evaluated because its files are bad: status "error",
/// correct false, speedup null, the problem as "message".
std::string error_record_json(const set_pair& p);

/// The identity (as set_pair::identity) and outcome of a record line; errc::corrupt saying
/// what is missing when it is not one.
result<std::pair<std::string, outcome>> parse_record(const std::string& line);

/// The records found in an --out file, for resuming.
struct out_file {
  std::map<std::string, outcome> records; ///< by identity; the last record of an identity wins
  std::uint64_t keep_bytes = 0;           ///< the file's length without a dropped last line
  bool needs_newline = false;             ///< the kept last line lacks its '\n'
  std::vector<std::string> warnings;
};

/// Reads `path` (a missing file holds no records). A last line that is not a whole record (the
/// writer was killed in mid-line) is dropped with a warning (keep_bytes says where the file
/// must be cut); errc::corrupt naming PATH:LINE for any other line that is not a record.
result<out_file> read_out_file(const std::filesystem::path& path);

/// The numbers of a set's summary.
struct summary {
  std::size_t pairs = 0;     ///< pairs of the set (the denominator of fast_p)
  std::size_t recorded = 0;  ///< of those, with a record (verdict or error)
  std::size_t resumed = 0;   ///< records that were in --out before this run
  std::size_t evaluated = 0; ///< records written by this run (error records included)
  std::size_t correct = 0;
  std::size_t ok = 0;
  std::size_t credited = 0;  ///< ok with a speedup above the win threshold
  double win_threshold = 1.01;
  std::map<std::string, std::size_t> by_status;
  std::map<std::string, std::size_t> by_check; ///< records naming each check in checks_failed
  std::map<std::string, std::size_t> by_device;
  double geomean_speedup = NAN; ///< over the ok records
  double median_speedup = NAN;  ///< over the ok records
  double fast_1 = 0;            ///< fast_p at p = 1.0: correct with speedup > 1.0, over all pairs
  double fast_1_2 = 0;          ///< fast_p at p = 1.2
  double median_fraction = NAN; ///< over the ok records with a bound (evaluator.limits)
  std::size_t with_bound = 0;   ///< ok records with a bound
  std::size_t above_limit = 0;  ///< of those, faster than their bound (a fraction above 1.0)
  double wall_s = 0;
};

/// KernelBench's fast_p: the share of all `pairs` that are correct with a speedup above `p`.
double fast_p(const std::vector<outcome>& recorded, std::size_t pairs, double p);

/// The summary of `recorded` (one outcome per recorded pair of the set) for a set of `pairs`.
/// "Credited" is the evaluator's own rule for a win: status ok and speedup > `win_threshold`
/// (evaluator.win_threshold).
summary summarize(const std::vector<outcome>& recorded, std::size_t pairs, double win_threshold);

/// The summary as one JSON object (keys as in docs/eval-sets.md).
std::string summary_json(const summary& s, const std::string& out_path);

/// The summary as a table for people.
std::string summary_table(const summary& s, const std::string& out_path);

/// `crucible eval --set-dir/--pairs`: reads the set and --out, evaluates the pairs not yet
/// recorded on every device given (one evaluator per device behind the evaluator pool), appends
/// a record per pair, prints progress on stderr and the summary on stdout. `cfg` holds the
/// configuration and --set overrides already applied.
int run(const parsed_args& args, const config& cfg);

} // namespace crucible::cli::eval_set
