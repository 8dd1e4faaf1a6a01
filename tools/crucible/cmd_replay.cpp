// `crucible replay ACTION RUN`: the replay store of a run directory (RUN/replay.db): its hacking
// cases, SFT pairs of verified variants, its samples and their fates, and JSONL export and import.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>

#include "core/json.hpp"
#include "storage/atomic_file.hpp"
#include "storage/replay_store.hpp"
#include "storage/run_dir.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

namespace fs = std::filesystem;

// The options each action accepts; any other given option is refused by name.
const std::set<std::string>& allowed_options(const std::string& action) {
  static const std::set<std::string> hacks{"--task", "--check", "--json", "--similar-to", "--top"};
  static const std::set<std::string> sft{"--min-speedup", "--out", "--hardware"};
  static const std::set<std::string> exp{"--out"};
  static const std::set<std::string> samples{"--out", "--fate"};
  static const std::set<std::string> none{};
  if (action == "hacks") return hacks;
  if (action == "export-sft") return sft;
  if (action == "export") return exp;
  if (action == "samples") return samples;
  return none;
}

// RUN/replay.db of an existing run directory. With `create` false the store must exist.
result<storage::replay_store> open_store(const std::string& who, const fs::path& run, bool create) {
  std::error_code ec;
  if (!fs::is_directory(run, ec))
    return fail(errc::not_found, who, ": run directory ", run.string(), " does not exist");
  const auto db = run / "replay.db";  // DESIGN §3; storage::run_directory::replay_db()
  if (!create && !fs::exists(db, ec))
    return fail(errc::not_found, who, ": ", run.string(), " has no replay store (", db.string(),
                " not found)");
  auto store = storage::replay_store::open(db);
  if (!store) return fail(store.error().code, who, ": ", store.error().message);
  return store;
}

std::string utc_time(std::int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string join(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : ",") + x;
  return out.empty() ? "-" : out;
}

int run_hacks(const std::string& who, const parsed_args& args, const fs::path& run) {
  auto top = int_option(args, "--top", 10, 1, 1000000);
  if (!top) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), top.error().message.c_str());
    return exit_usage;
  }
  if (args.has("--top") && !args.has("--similar-to")) {
    std::fprintf(stderr, "%s: --top needs --similar-to FILE\n", who.c_str());
    return exit_usage;
  }
  std::string probe;
  if (args.has("--similar-to")) {
    auto text = storage::read_file(args.get("--similar-to"));
    if (!text) {
      std::fprintf(stderr, "%s: --similar-to: %s\n", who.c_str(), text.error().message.c_str());
      return exit_usage;
    }
    probe = std::move(*text);
  }
  auto store = open_store(who, run, false);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.error().message.c_str());
    return store.error().code == errc::not_found ? exit_usage : exit_failure;
  }
  const storage::hack_filter filter{args.get("--task"), args.get("--check")};
  std::vector<storage::similar_hack> rows;
  if (args.has("--similar-to")) {
    auto ranked = store->similar_hacks(probe, static_cast<std::size_t>(*top), filter);
    if (!ranked) {
      std::fprintf(stderr, "%s: %s\n", who.c_str(), ranked.error().message.c_str());
      return exit_failure;
    }
    rows = std::move(*ranked);
  } else {
    auto listed = store->list_hacks(filter);
    if (!listed) {
      std::fprintf(stderr, "%s: %s\n", who.c_str(), listed.error().message.c_str());
      return exit_failure;
    }
    for (auto& h : *listed) rows.push_back({std::move(h), 0.0});
  }
  const bool ranked = args.has("--similar-to");
  if (args.has("--json")) {
    json_writer w;
    w.begin_array();
    for (const auto& r : rows) {
      const auto& v = r.hack.variant;
      w.begin_object()
        .field("id", v.id)
        .field("task_id", v.task_id)
        .field("task_name", v.task_name)
        .field("hardware", v.hardware)
        .field("status", v.status)
        .field("checks", r.hack.checks)
        .field("reward", v.reward)
        .field("message", v.message)
        .field("policy_version", v.policy_version)
        .field("time_ms", v.time_ms)
        .field("count", v.count)
        .field("code_hash", v.code_hash)
        .field("code", v.code);
      if (ranked) w.field("similarity", r.similarity);
      w.end_object();
    }
    w.end_array();
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  if (ranked) std::printf("%-10s ", "similarity");
  std::printf("%-8s %-28s %-10s %-10s %-19s %s\n", "id", "task", "hardware", "status", "time (UTC)",
              "checks");
  for (const auto& r : rows) {
    const auto& v = r.hack.variant;
    if (ranked) std::printf("%-10.3f ", r.similarity);
    std::printf("%-8lld %-28s %-10s %-10s %-19s %s\n", static_cast<long long>(v.id),
                v.task_id.c_str(), v.hardware.c_str(), v.status.c_str(), utc_time(v.time_ms).c_str(),
                join(r.hack.checks).c_str());
  }
  std::printf("%zu hacking case%s in %s\n", rows.size(), rows.size() == 1 ? "" : "s",
              run.c_str());
  return exit_ok;
}

int run_export_sft(const std::string& who, const parsed_args& args, const fs::path& run) {
  if (!args.has("--min-speedup") || !args.has("--out")) {
    std::fprintf(stderr, "%s: %s is required\n", who.c_str(),
                 args.has("--out") ? "--min-speedup X" : "--out FILE.jsonl");
    return exit_usage;
  }
  auto min_speedup = real_option(args, "--min-speedup", 1.0, 0.0, 1e12);
  if (!min_speedup) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), min_speedup.error().message.c_str());
    return exit_usage;
  }
  auto store = open_store(who, run, false);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.error().message.c_str());
    return store.error().code == errc::not_found ? exit_usage : exit_failure;
  }
  storage::sft_options opts;
  opts.min_speedup = *min_speedup;
  opts.hardware = args.get("--hardware");
  const auto out = args.get("--out");
  auto stats = store->export_sft_jsonl(out, opts);
  if (!stats) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), stats.error().message.c_str());
    return exit_failure;
  }
  std::fprintf(stderr, "%s: skipped %lld verified variant%s without a stored prompt or completion\n",
               who.c_str(), static_cast<long long>(stats->skipped), stats->skipped == 1 ? "" : "s");
  std::printf("wrote %lld SFT pair%s (speedup >= %g%s) to %s\n",
              static_cast<long long>(stats->written), stats->written == 1 ? "" : "s", opts.min_speedup,
              opts.hardware.empty() ? "" : (", hardware " + opts.hardware).c_str(), out.c_str());
  return exit_ok;
}

// `samples`: every policy sample (or those of one fate) as JSON lines with its variant's task
// and verdict, and the counts by fate on stdout.
int run_samples(const std::string& who, const parsed_args& args, storage::replay_store& store) {
  if (!args.has("--out")) {
    std::fprintf(stderr, "%s: --out FILE is required\n", who.c_str());
    return exit_usage;
  }
  const auto fate = args.get("--fate");
  if (!fate.empty() && fate != "undecided" && !storage::sample_fate::known(fate)) {
    std::string known;
    for (auto f : storage::sample_fate::all)
      known += std::string(f) + ", ";
    std::fprintf(stderr, "%s: --fate %s is not a fate (%sundecided)\n", who.c_str(), fate.c_str(), known.c_str());
    return exit_usage;
  }
  auto rows = store.samples();
  auto counts = store.count_samples();
  if (!rows || !counts) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), (!rows ? rows.error() : counts.error()).message.c_str());
    return exit_failure;
  }
  std::string out;
  std::int64_t written = 0;
  for (const auto& x : *rows) {
    const auto& f = x.fate.empty() ? std::string("undecided") : x.fate;
    if (!fate.empty() && f != fate)
      continue;
    auto v = store.find(x.variant_id);
    if (!v) {
      std::fprintf(stderr, "%s: sample %lld: %s\n", who.c_str(), static_cast<long long>(x.id), v.error().message.c_str());
      return exit_failure;
    }
    json_writer w;
    w.begin_object()
      .field("id", x.id)
      .field("variant_id", x.variant_id)
      .field("task", v->task_id)
      .field("hardware", v->hardware)
      .field("group_id", x.group_id)
      .field("policy_version", x.policy_version)
      .field("fate", f)
      .field("fate_step", x.fate_step)
      .field("status", v->status)
      .field("correct", v->correct);
    w.key("speedup");
    v->speedup ? w.value(*v->speedup) : w.null();
    w.field("reward", v->reward)
      .field("prompt_id", x.prompt_id)
      .field("completion", x.completion)
      .field("time_ms", x.time_ms);
    if (x.episode && x.turn) // a turn of a multi-turn episode
      w.field("episode", static_cast<std::uint64_t>(*x.episode)).field("turn", static_cast<std::uint64_t>(*x.turn));
    w.end_object();
    out += std::move(w).take();
    out += '\n';
    ++written;
  }
  const auto path = args.get("--out");
  if (auto r = storage::write_file_atomic(path, out); !r) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), r.error().message.c_str());
    return exit_failure;
  }
  std::printf("%s\nwrote %lld sample%s%s to %s\n", counts->text().c_str(), static_cast<long long>(written),
              written == 1 ? "" : "s", fate.empty() ? "" : (" (" + fate + ")").c_str(), path.c_str());
  return exit_ok;
}

int run_replay(const parsed_args& args) {
  const auto& action = args.positional[0];
  const std::string who = "crucible replay " + action;
  if (action != "hacks" && action != "export-sft" && action != "export" && action != "import" && action != "samples") {
    std::fprintf(stderr,
                 "crucible replay: unknown action '%s' (expected hacks, export-sft, samples, export or import)\n",
                 action.c_str());
    return exit_usage;
  }
  const auto& allowed = allowed_options(action);
  for (const auto& [name, values] : args.values)
    if (!allowed.count(name)) {
      std::fprintf(stderr, "%s: option %s does not apply to this action; see 'crucible replay --help'\n",
                   who.c_str(), name.c_str());
      return exit_usage;
    }
  const bool wants_file = action == "import";
  if (args.positional.size() != (wants_file ? 3u : 2u)) {
    if (wants_file)
      std::fprintf(stderr, "%s: missing FILE; usage: crucible replay import RUN FILE\n", who.c_str());
    else
      std::fprintf(stderr, "%s: unexpected argument '%s'\n", who.c_str(), args.positional[2].c_str());
    return exit_usage;
  }
  const fs::path run = args.positional[1];
  if (action == "hacks") return run_hacks(who, args, run);
  if (action == "export-sft") return run_export_sft(who, args, run);

  auto store = open_store(who, run, action == "import");
  if (!store) {
    std::fprintf(stderr, "%s\n", store.error().message.c_str());
    return store.error().code == errc::not_found ? exit_usage : exit_failure;
  }
  if (action == "samples")
    return run_samples(who, args, *store);
  if (action == "export") {
    if (!args.has("--out")) {
      std::fprintf(stderr, "%s: --out FILE is required\n", who.c_str());
      return exit_usage;
    }
    const auto out = args.get("--out");
    if (auto r = store->export_jsonl(out); !r) {
      std::fprintf(stderr, "%s: %s\n", who.c_str(), r.error().message.c_str());
      return exit_failure;
    }
    std::printf("exported %lld variants of %s to %s\n", static_cast<long long>(store->count().value()),
                run.c_str(), out.c_str());
    return exit_ok;
  }
  const auto& file = args.positional[2];
  auto n = store->import_jsonl(file);
  if (!n) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), n.error().message.c_str());
    return n.error().code == errc::corrupt || n.error().code == errc::not_found ? exit_usage : exit_failure;
  }
  std::printf("imported %lld lines from %s into %s\n", static_cast<long long>(*n), file.c_str(),
              store->path().c_str());
  return exit_ok;
}

} // namespace

command replay_command() {
  return {{"replay",
           "ACTION RUN [FILE] [options]",
           "Inspect and move a run's replay store: hacking cases, SFT pairs, samples, JSONL export/import",
           "Actions on RUN/replay.db (RUN is a run directory, runs/NAME):\n"
           "  hacks RUN [--task T] [--check C] [--json] [--similar-to FILE [--top K]]\n"
           "      list the variants the evaluator flagged (status rejected, or incorrect with a\n"
           "      failed check) with the checks that caught them; with --similar-to, the K cases\n"
           "      whose code is most like FILE (token 3-gram Jaccard), most similar first\n"
           "  export-sft RUN --min-speedup X --out FILE.jsonl [--hardware H]\n"
           "      write {prompt, completion, task, speedup, hardware, variant_id} per verified\n"
           "      variant (ok, correct, speedup >= X); variants without a stored prompt or\n"
           "      completion are skipped and counted on stderr; FILE is replaced atomically\n"
           "  samples RUN --out FILE.jsonl [--fate F]\n"
           "      every policy sample (of fate F: trained, paused, stale, discarded, unfinished,\n"
           "      orphan, straggler, searched or undecided) with its completion, prompt id, fate and its\n"
           "      variant's task and verdict, one JSON object per line; the counts by fate\n"
           "  export RUN --out FILE.jsonl    every prompt and variant as JSON lines\n"
           "  import RUN FILE.jsonl          merge such a file (all or nothing; creates replay.db)",
           {"ACTION (hacks, export-sft, samples, export, import)", "RUN"},
           {{"--task", "T", "hacks: only this task id"},
            {"--check", "C", "hacks: only cases this check caught, e.g. runtime:timer"},
            {"--json", "", "hacks: print one JSON array"},
            {"--similar-to", "FILE", "hacks: rank the cases by similarity to this candidate"},
            {"--top", "K", "hacks: with --similar-to, how many to show (default 10)"},
            {"--min-speedup", "X", "export-sft: lowest speedup written (required)"},
            {"--out", "FILE", "export-sft, samples, export: the file to write (required)"},
            {"--fate", "F", "samples: only the samples of this fate"},
            {"--hardware", "H", "export-sft: only this hardware kind"}},
           {"FILE (import)"}},
          run_replay};
}

} // namespace crucible::cli
