// `crucible eval`: one candidate against one task on one device, as a table or as JSON; with
// --set-dir or --pairs, a set of pairs on several devices (tools/crucible/cmd_eval_set.cpp).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/config.hpp"
#include "core/file_io.hpp"
#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "tools/crucible/commands.hpp"
#include "tools/crucible/eval_set.hpp"

namespace crucible::cli {

namespace {

void print_table(const env::task& t, const std::string& cand_path, const env::verdict& v) {
  auto num = [](double x, const char* fmt) {
    if (std::isnan(x))
      return std::string{"-"};
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, x);
    return std::string{buf};
  };
  std::string checks;
  for (const auto& c : v.checks_failed)
    checks += (checks.empty() ? "" : ", ") + c;
  std::printf("task        %s (%s)\n", t.name.c_str(), t.path.c_str());
  std::printf("candidate   %s\n", cand_path.c_str());
  std::printf("hardware    %s\n", v.hardware.c_str());
  std::printf("status      %s\n", env::to_string(v.status));
  std::printf("speedup     %s   band ±%s   %u rounds, baseline %s\n", num(v.speedup, "%.2fx").c_str(),
              num(100 * v.speedup_spread, "%.1f%%").c_str(), v.rounds, v.baseline.c_str());
  std::printf("time        reference %s   candidate %s\n", num(v.ref_ms, "%.4f ms").c_str(),
              num(v.cand_ms, "%.4f ms").c_str());
  std::printf("reward      %.4g\n", v.reward);
  std::printf("checks      %s\n", checks.empty() ? "-" : checks.c_str());
  std::printf("message     %s\n", v.message.empty() ? "-" : v.message.c_str());
  if (!v.judged.empty())
    std::printf("judged      %s (the reference and the candidate in two workers)\n", v.judged.c_str());
  if (v.work.counted()) {
    std::string flops;
    for (const auto& [dtype, n] : v.work.flops)
      flops += (flops.empty() ? "" : ", ") + num(n / 1e9, "%.3g GFLOP ") + dtype;
    std::printf("work        %s; %s read, %s written (the reference's call)\n",
                flops.empty() ? "no counted FLOPs" : flops.c_str(), num(v.work.bytes_read / 1e6, "%.3g MB").c_str(),
                num(v.work.bytes_written / 1e6, "%.3g MB").c_str());
  }
  if (v.bound.known())
    std::printf("limit       %s a call on this hardware (bytes %s, FLOPs %s); fraction of it: candidate %s%s, reference %s\n",
                num(v.bound.ms, "%.4g ms").c_str(), num(v.bound.bytes_ms, "%.4g ms").c_str(),
                num(v.bound.flops_ms, "%.4g ms").c_str(), num(v.fraction(), "%.3f").c_str(),
                v.beat_flops() ? " (of the bytes part: faster than the reference's FLOPs allow, it did fewer)" : "",
                num(v.ref_fraction(), "%.3f").c_str());
  std::printf("wall        %.2f s%s\n", v.wall_s, v.cache_hit ? "   (cached verdict)" : "");
}

int run_eval(const parsed_args& args) {
  const bool set_mode = args.has("--set-dir") || args.has("--pairs");
  if (!set_mode) {
    for (const char* required : {"--task", "--candidate"})
      if (!args.has(required)) {
        std::fprintf(stderr, "crucible eval: missing %s (or --set-dir DIR / --pairs FILE for a set); see 'crucible eval --help'\n",
                     required);
        return exit_usage;
      }
    for (const char* set_only : {"--out", "--format"})
      if (args.has(set_only)) {
        std::fprintf(stderr, "crucible eval: %s is for a set of pairs (--set-dir or --pairs)\n", set_only);
        return exit_usage;
      }
    if (args.all("--device").size() > 1) {
      std::fprintf(stderr, "crucible eval: one pair is evaluated on one --device; several are for a set (--set-dir, --pairs)\n");
      return exit_usage;
    }
  }
  auto loaded = config_option(args);
  if (!loaded) {
    std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
    return exit_usage;
  }
  const config cfg = *loaded;
  if (set_mode)
    return eval_set::run(args, cfg);
  auto device = device_option(args, "--device", cfg.evaluator.devices.front());
  auto repeat = int_option(args, "--repeat", 1, 1, 1'000'000);
  auto seed = int_option(args, "--seed", 0, 0, INT64_MAX);
  if (const auto* bad = first_error(device, repeat, seed)) {
    std::fprintf(stderr, "crucible eval: %s\n", bad->message.c_str());
    return exit_usage;
  }
  auto task = env::load_task(args.get("--task"));
  if (!task) {
    std::fprintf(stderr, "crucible eval: --task %s\n", task.error().message.c_str());
    return exit_usage;
  }
  auto src = read_source_file(args.get("--candidate"));
  if (!src) {
    std::fprintf(stderr, "crucible eval: --candidate %s\n", src.error().message.c_str());
    return exit_usage;
  }

  system_clock clk;
  logger log{clk, args.has("--verbose") ? log_level::debug : log_level::warn};
  auto opt = cfg.evaluator;
  // A single evaluation needs no spare worker; repeated ones keep the configured pool
  // (evaluator.warm_workers, at least one) so that each finds a started worker.
  opt.warm_workers = *repeat > 1 ? std::max<std::int64_t>(opt.warm_workers, 1) : 0;
  auto made = env::make_device_evaluators(opt, cfg.reward, {*device}, log,
                                          args.has("--no-cache") ? env::verdict_cache_use::none
                                                                 : env::verdict_cache_use::configured);
  if (!made) {
    std::fprintf(stderr, "crucible eval: %s\n", made.error().message.c_str());
    return exit_failure;
  }
  auto* ev = &made->front();
  std::vector<double> speedups;
  for (std::int64_t i = 0; i < *repeat; ++i) {
    env::eval_request req{*task, *src, *seed == 0 ? 0 : static_cast<std::uint64_t>(*seed + i),
                          !args.has("--no-cache") && *repeat == 1};
    auto v = (*ev)->evaluate(req);
    if (v.has_speedup())
      speedups.push_back(v.speedup);
    if (args.has("--json")) {
      std::printf("%s\n", env::to_json(v).c_str());
    } else {
      if (*repeat > 1)
        std::printf("-- evaluation %lld of %lld\n", static_cast<long long>(i + 1), static_cast<long long>(*repeat));
      print_table(*task, args.get("--candidate"), v);
    }
    std::fflush(stdout);
  }
  if (*repeat > 1 && !args.has("--json") && speedups.size() > 1) {
    auto [mn, mx] = std::minmax_element(speedups.begin(), speedups.end());
    std::printf("-- %zu speedups from %.2fx to %.2fx: max/min - 1 = %.1f%%\n", speedups.size(), *mn, *mx,
                100 * (*mx / *mn - 1));
  }
  return exit_ok;
}

} // namespace

command eval_command() {
  return {{"eval", "--task TASK.py --candidate CANDIDATE.py [options]\n       crucible eval --set-dir DIR | --pairs FILE.tsv|FILE.jsonl [--out RECORDS.jsonl] [options]",
           "Evaluate candidates against tasks: correctness, speedup, reward",
           "Runs the candidate in a sandboxed worker: correctness trials on fresh inputs, anti-hacking\n"
           "checks, then paired timing against the reference. Prints a table, or with --json one\n"
           "JSON object per evaluation (status, correct, speedup, speedup_spread, ref_ms, cand_ms,\n"
           "reward, checks_failed, message, hardware, cache_hit). Exit code 0 whenever a verdict\n"
           "was produced, 2 for bad arguments or files, 1 when no worker could run.\n"
           "\n"
           "A set of pairs (docs/eval-sets.md), evaluated on every --device at once (default: the\n"
           "devices of evaluator.devices) through the evaluator pool, evaluator.concurrency each:\n"
           "  --set-dir DIR        every DIR/variants/TASK/*.py against DIR/TASK.py, the layout of a\n"
           "                       suite's seed variants (level folders too: variants/level1/X/*.py\n"
           "                       against DIR/level1/X.py)\n"
           "  --pairs FILE.tsv     one TASK<TAB>CANDIDATE line per pair, paths relative to the file's\n"
           "                       folder; blank lines and '#' lines skipped\n"
           "  --pairs FILE.jsonl   CUDA-L1's layout: one JSON object a line with level_id, task_id,\n"
           "                       ref_code (the task's source) and custom_code (the candidate's);\n"
           "                       other fields are echoed into the record under \"input\"\n"
           "A progress line goes to stderr; --out appends one JSON record per pair as it finishes (the\n"
           "verdict's fields, the pair and its device); run the same command again to resume: pairs\n"
           "already in --out are skipped, an incomplete last line is dropped. A pair whose files are\n"
           "bad gets a record with status \"error\". At the end a summary: pairs, credited (ok and\n"
           "faster than evaluator.win_threshold), statuses, checks failed, geometric mean and median\n"
           "speedup of the ok verdicts, fast_1.0 and fast_1.2 (KernelBench's fast_p over all pairs);\n"
           "with --json as one JSON object. Exit 0 when every pair has a record, 1 when some got none\n"
           "(run again to retry them), 2 for bad arguments or a malformed set file.",
           {},
           {{"--task", "TASK.py", "task in KernelBench format (class Model, get_inputs, get_init_inputs)"},
            {"--candidate", "FILE.py", "candidate defining class ModelNew"},
            {"--set-dir", "DIR", "evaluate a set: DIR/variants/TASK/*.py against DIR/TASK.py"},
            {"--pairs", "FILE", "evaluate a set listed in a TSV (.tsv, .txt) or JSONL (.jsonl, .json) file"},
            {"--format", "tsv|jsonl", "the format of --pairs when its extension does not say"},
            {"--out", "FILE.jsonl", "a set's per-pair records, appended as they finish; resumes from it"},
            {"--device", "DEVICE", "cpu or cuda:N (default: the first of evaluator.devices); a set takes "
                                   "several: cuda:0,cuda:1 or the flag again", true},
            {"--json", "", "print JSON instead of a table (for a set: the summary object)"},
            {"--repeat", "N", "evaluate N times without the cache, to show stability"},
            {"--seed", "S", "seed of the first evaluation's inputs (default: random)"},
            {"--config", "CONFIG", "take evaluator and reward settings from a configuration file"},
            {"--set", "KEY=VALUE", "override a configuration key, e.g. --set evaluator.rounds=60", true},
            {"--no-cache", "", "neither read nor write the verdict cache"},
            {"--verbose", "", "log the evaluator's progress to stderr"}}},
          run_eval};
}

} // namespace crucible::cli
