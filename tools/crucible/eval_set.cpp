// Set files in (suite folder, TSV, JSONL) -> pairs; records out and back in; the summary.
#include "tools/crucible/eval_set.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "actors/trainer.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/sha256.hpp"
#include "env/eval/timing.hpp"

namespace crucible::cli::eval_set {

namespace fs = std::filesystem;

namespace {

std::string trim(std::string s) {
  auto blank = [](unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && blank(static_cast<unsigned char>(s.back())))
    s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && blank(static_cast<unsigned char>(s[i])))
    ++i;
  return s.substr(i);
}

// The lines of `text` without their '\n' (and a trailing '\r').
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    out.push_back(std::move(line));
  }
  return out;
}

std::string file_identity(const std::string& task, const std::string& candidate) {
  return "task=" + task + "\ncandidate=" + candidate;
}

std::string jsonl_identity(std::size_t line, const std::string& level_id, const std::string& task_id) {
  return "line=" + std::to_string(line) + "\nlevel_id=" + level_id + "\ntask_id=" + task_id;
}

// A task's name for logs and the catalogue, from CUDA-L1's ids: "level1/19" (KernelBench's
// folders), or "line7" when the line names none.
std::string jsonl_task_name(const json_value* level, const json_value* task, std::size_t line) {
  auto text = [](const json_value* v) { return v->is_string() ? v->as_string() : to_json_text(*v); };
  if (level == nullptr || task == nullptr || level->is_null() || task->is_null())
    return "line" + std::to_string(line);
  return "level" + text(level) + "/" + text(task);
}

// parse_json's message for a one-line document parsed as `source` ("SOURCE:1:COLUMN: what"),
// with the column named in words: the line is the caller's to name.
std::string parse_error_text(const std::string& message, const std::string& source) {
  const auto prefix = source + ":1:";
  return message.rfind(prefix, 0) == 0 ? "column " + message.substr(prefix.size()) : message;
}

} // namespace

std::string set_pair::identity() const {
  return form == set_form::jsonl ? jsonl_identity(line, level_id, task_id) : file_identity(task_label, candidate_label);
}

// -- reading sets -----------------------------------------------------------------------------

result<pair_set> load_set_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return fail(errc::not_found, "--set-dir ", dir.string(), ": not a directory");
  const auto variants = dir / "variants";
  if (!fs::is_directory(variants, ec))
    return fail(errc::not_found, "--set-dir ", dir.string(), ": no variants folder (candidates go in ",
                (dir / "variants").string(), "/TASK/*.py, beside the task ", (dir / "TASK.py").string(), ")");
  auto tasks = env::index_tasks(dir);
  if (!tasks)
    return fail(tasks.error().code, "--set-dir ", tasks.error().message);
  task_catalog catalog;
  for (auto& t : *tasks)
    catalog[task_id{t.name}] = t;
  // The same layout, and the same reading, as a suite's seed variants (tasks.suite/variants).
  auto seeds = load_seed_variants(variants, catalog);
  if (!seeds)
    return fail(seeds.error().code, "--set-dir ", seeds.error().message);
  pair_set out;
  for (auto& s : *seeds) {
    const auto& t = catalog.at(s.task);
    set_pair p;
    p.form = set_form::dir;
    p.task_label = t.path.lexically_normal().string();
    p.candidate_label = (variants / s.task.value / (s.name + ".py")).lexically_normal().string();
    p.origin = p.candidate_label;
    p.task = t;
    p.candidate = std::move(s.code);
    out.pairs.push_back(std::move(p));
  }
  if (out.pairs.empty())
    return fail(errc::not_found, "--set-dir ", dir.string(), ": no candidates: none of its ", std::to_string(tasks->size()),
                " tasks has a folder of candidates ", (variants / "TASK").string(), "/*.py");
  // The order of the suite: level, number, name; then the candidate's file name.
  std::stable_sort(out.pairs.begin(), out.pairs.end(), [](const set_pair& a, const set_pair& b) {
    return std::tie(a.task.level, a.task.number, a.task.name, a.candidate_label)
           < std::tie(b.task.level, b.task.number, b.task.name, b.candidate_label);
  });
  for (std::size_t i = 0; i < out.pairs.size(); ++i)
    out.pairs[i].index = i + 1;
  return out;
}

result<pair_set> load_pairs_tsv(const fs::path& file) {
  auto text = read_file(file);
  if (!text)
    return fail(text.error().code, "--pairs ", text.error().message);
  const auto base = file.parent_path();
  auto resolve = [&](const std::string& p) {
    fs::path path{p};
    return (path.is_absolute() ? path : base / path).lexically_normal();
  };
  pair_set out;
  std::map<std::string, std::size_t> seen; // identity -> line
  const auto lines = split_lines(*text);
  for (std::size_t n = 1; n <= lines.size(); ++n) {
    const auto& line = lines[n - 1];
    if (trim(line).empty() || trim(line)[0] == '#')
      continue;
    const auto where = file.string() + ":" + std::to_string(n) + ": ";
    std::vector<std::string> fields;
    for (std::size_t start = 0;;) {
      auto tab = line.find('\t', start);
      fields.push_back(trim(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start)));
      if (tab == std::string::npos)
        break;
      start = tab + 1;
    }
    if (fields.size() != 2 || fields[0].empty() || fields[1].empty())
      return fail(errc::invalid_arg, where, "expected TASK<TAB>CANDIDATE (two paths separated by a tab), got ",
                  fields.size() == 1 ? std::string{"one field"} : std::to_string(fields.size()) + " fields",
                  fields.size() == 2 ? " with an empty path" : "");
    set_pair p;
    p.form = set_form::tsv;
    p.line = n;
    p.origin = file.string() + ":" + std::to_string(n);
    const auto task_path = resolve(fields[0]);
    const auto cand_path = resolve(fields[1]);
    p.task_label = task_path.string();
    p.candidate_label = cand_path.string();
    if (auto [it, fresh] = seen.emplace(p.identity(), n); !fresh) {
      out.warnings.push_back(where + "the same pair as line " + std::to_string(it->second) + ": evaluated once");
      continue;
    }
    if (auto t = env::load_task(task_path); !t)
      p.problem = "task: " + t.error().message;
    else
      p.task = std::move(*t);
    if (p.problem.empty()) {
      if (auto c = read_source_file(cand_path); !c)
        p.problem = "candidate: " + c.error().message;
      else
        p.candidate = std::move(*c);
    }
    p.index = out.pairs.size() + 1;
    out.pairs.push_back(std::move(p));
  }
  if (out.pairs.empty())
    return fail(errc::invalid_arg, "--pairs ", file.string(), ": no pairs (expected TASK<TAB>CANDIDATE lines)");
  return out;
}

result<pair_set> load_pairs_jsonl(const fs::path& file) {
  auto text = read_file(file);
  if (!text)
    return fail(text.error().code, "--pairs ", text.error().message);
  pair_set out;
  const auto lines = split_lines(*text);
  for (std::size_t n = 1; n <= lines.size(); ++n) {
    if (trim(lines[n - 1]).empty())
      continue;
    const auto where = file.string() + ":" + std::to_string(n) + ": ";
    auto doc = parse_json(lines[n - 1], "line");
    if (!doc) {
      return fail(errc::invalid_arg, where, "not JSON (", parse_error_text(doc.error().message, "line"),
                  "); expected one JSON object a line");
    }
    if (!doc->is_object())
      return fail(errc::invalid_arg, where, "a JSON ", json_value::kind_name(doc->type()),
                  ", expected an object with ref_code and custom_code");
    for (const char* key : {"ref_code", "custom_code"}) {
      const auto* v = doc->find(key);
      if (v == nullptr)
        return fail(errc::invalid_arg, where, "no ", key,
                    " (a CUDA-L1 line has level_id, task_id, ref_code and custom_code)");
      // A null custom_code is a kernel the release has none for (CUDA-L1 has such lines): an
      // error record, as an empty one is; anything else but a string is a malformed line.
      const bool null_candidate = std::string_view{key} == "custom_code" && v->is_null();
      if (!v->is_string() && !null_candidate)
        return fail(errc::invalid_arg, where, key, " is a JSON ", json_value::kind_name(v->type()), ", expected a string");
    }
    const auto* level = doc->find("level_id");
    const auto* task = doc->find("task_id");
    set_pair p;
    p.form = set_form::jsonl;
    p.line = n;
    p.origin = file.string() + ":" + std::to_string(n);
    p.level_id = level == nullptr ? "null" : to_json_text(*level);
    p.task_id = task == nullptr ? "null" : to_json_text(*task);
    p.task_label = jsonl_task_name(level, task, n);
    p.candidate_label = file.string() + ":" + std::to_string(n);
    json_writer input;
    input.begin_object();
    for (const auto& m : doc->as_object())
      if (m.key != "ref_code" && m.key != "custom_code" && m.key != "level_id" && m.key != "task_id") {
        input.key(m.key);
        write_json(input, m.value);
      }
    input.end_object();
    p.input_json = std::move(input).take();
    const auto& ref = doc->find("ref_code")->as_string();
    const auto* custom_value = doc->find("custom_code");
    const std::string custom = custom_value->is_null() ? std::string{} : custom_value->as_string();
    if (auto missing = env::missing_task_parts(ref); !missing.empty()) {
      p.problem = "ref_code is not a KernelBench task: missing " + missing;
    } else if (trim(custom).empty() || trim(custom) == "None") {
      // CUDA-L1's releases write a missing kernel as null or as the text "None".
      p.problem = "custom_code is empty, null or \"None\": no candidate to evaluate";
    } else {
      // The sources stay in memory: the evaluator sends them to its workers as they are.
      p.task.name = p.task_label;
      p.task.path = p.candidate_label;
      p.task.source = ref;
      p.task.sha256 = sha256_hex(ref);
      if (level != nullptr && level->is_int())
        p.task.level = static_cast<int>(level->as_int());
      if (task != nullptr && task->is_int())
        p.task.number = static_cast<int>(task->as_int());
      p.candidate = custom;
    }
    p.index = out.pairs.size() + 1;
    out.pairs.push_back(std::move(p));
  }
  if (out.pairs.empty())
    return fail(errc::invalid_arg, "--pairs ", file.string(), ": no pairs (expected one JSON object a line)");
  return out;
}

// -- records ----------------------------------------------------------------------------------

namespace {

// The record's leading fields: the pair's identity; the object is left open.
void identity_fields(json_writer& w, const set_pair& p) {
  w.begin_object().field("pair", static_cast<std::uint64_t>(p.index));
  w.field("task", p.task_label).field("candidate", p.candidate_label);
  if (p.line != 0)
    w.field("line", static_cast<std::uint64_t>(p.line));
  if (p.form == set_form::jsonl)
    w.key("level_id").raw(p.level_id).key("task_id").raw(p.task_id);
}

// Closes the record `w` holds open after `body` (more fields, without braces) and the input.
std::string close_record(json_writer&& w, const set_pair& p, const std::string& body) {
  std::string out = std::move(w).take();
  out += "," + body;
  if (!p.input_json.empty())
    out += ",\"input\":" + p.input_json;
  out += "}";
  return out;
}

} // namespace

std::string record_json(const set_pair& p, const env::verdict& v, const std::vector<std::string>& devices) {
  json_writer w;
  identity_fields(w, p);
  if (devices.empty())
    w.key("device").null();
  else
    w.field("device", devices.front());
  if (devices.size() > 1)
    w.field("recheck_device", devices[1]);
  // Every field `crucible eval --json` prints, as it prints them.
  auto verdict = env::to_json(v);
  return close_record(std::move(w), p, verdict.substr(1, verdict.size() - 2));
}

std::string error_record_json(const set_pair& p) {
  json_writer w;
  identity_fields(w, p);
  w.key("device").null();
  json_writer body;
  body.begin_object()
    .field("status", "error")
    .field("correct", false)
    .key("speedup")
    .null()
    .field("checks_failed", std::vector<std::string>{})
    .field("message", p.problem)
    .end_object();
  auto text = std::move(body).take();
  return close_record(std::move(w), p, text.substr(1, text.size() - 2));
}

result<std::pair<std::string, outcome>> parse_record(const std::string& line) {
  auto doc = parse_json(line, "record");
  if (!doc)
    return fail(errc::corrupt, "not JSON: ", parse_error_text(doc.error().message, "record"));
  if (!doc->is_object())
    return fail(errc::corrupt, "not a JSON object");
  auto string_of = [&](const char* key) -> const std::string* {
    const auto* v = doc->find(key);
    return v != nullptr && v->is_string() ? &v->as_string() : nullptr;
  };
  std::string identity;
  if (const auto* level = doc->find("level_id")) {
    const auto* line_no = doc->find("line");
    const auto* task = doc->find("task_id");
    if (line_no == nullptr || !line_no->is_int() || line_no->as_int() < 1 || task == nullptr)
      return fail(errc::corrupt, "a JSONL pair's record without line and task_id");
    identity = jsonl_identity(static_cast<std::size_t>(line_no->as_int()), to_json_text(*level), to_json_text(*task));
  } else {
    const auto* task = string_of("task");
    const auto* cand = string_of("candidate");
    if (task == nullptr || cand == nullptr)
      return fail(errc::corrupt, "no task and candidate");
    identity = file_identity(*task, *cand);
  }
  outcome o;
  const auto* status = string_of("status");
  if (status == nullptr)
    return fail(errc::corrupt, "no status");
  o.status = *status;
  if (o.status != "error" && !env::parse_verdict_status(o.status))
    return fail(errc::corrupt, "status \"", o.status, "\" is not a verdict status");
  if (const auto* c = doc->find("correct"); c != nullptr && c->is_bool())
    o.correct = c->as_bool();
  if (const auto* s = doc->find("speedup"); s != nullptr && s->is_number())
    o.speedup = s->as_double();
  if (const auto* f = doc->find("fraction"); f != nullptr && f->is_number())
    o.fraction = f->as_double();
  if (const auto* checks = doc->find("checks_failed"); checks != nullptr && checks->is_array())
    for (const auto& c : checks->as_array())
      if (c.is_string())
        o.checks_failed.push_back(c.as_string());
  if (const auto* d = string_of("device"))
    o.device = *d;
  return std::pair{std::move(identity), std::move(o)};
}

result<out_file> read_out_file(const fs::path& path) {
  out_file out;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return out;
  auto text = read_file(path);
  if (!text)
    return fail(text.error().code, "--out ", text.error().message);
  // Lines with their offsets; the last may lack its '\n'.
  struct span {
    std::size_t offset, length;
  };
  std::vector<span> lines;
  for (std::size_t start = 0; start < text->size();) {
    auto nl = text->find('\n', start);
    auto end = nl == std::string::npos ? text->size() : nl;
    lines.push_back({start, end - start});
    start = nl == std::string::npos ? text->size() : nl + 1;
  }
  std::size_t last = lines.size();
  while (last > 0 && trim(text->substr(lines[last - 1].offset, lines[last - 1].length)).empty())
    --last;
  out.keep_bytes = text->size();
  for (std::size_t i = 0; i < last; ++i) {
    auto line = text->substr(lines[i].offset, lines[i].length);
    if (trim(line).empty())
      continue;
    auto rec = parse_record(line);
    if (rec) {
      out.records[rec->first] = std::move(rec->second);
      continue;
    }
    const auto where = path.string() + ":" + std::to_string(i + 1) + ": ";
    if (i + 1 == last) {
      // Only the last line can be cut short by a writer that was killed: it is written again.
      out.keep_bytes = lines[i].offset;
      out.warnings.push_back(where + "dropped an incomplete record (" + rec.error().message
                             + "); the run that wrote it was interrupted, its pair is evaluated again");
      return out;
    }
    return fail(errc::corrupt, where, "not a record of crucible eval (", rec.error().message,
                "); remove the line or choose another --out");
  }
  out.needs_newline = !text->empty() && text->back() != '\n';
  return out;
}

// -- summary ----------------------------------------------------------------------------------

double fast_p(const std::vector<outcome>& recorded, std::size_t pairs, double p) {
  if (pairs == 0)
    return 0;
  auto n = std::count_if(recorded.begin(), recorded.end(),
                         [&](const outcome& o) { return o.correct && !std::isnan(o.speedup) && o.speedup > p; });
  return static_cast<double>(n) / static_cast<double>(pairs);
}

summary summarize(const std::vector<outcome>& recorded, std::size_t pairs, double win_threshold) {
  summary s;
  s.pairs = pairs;
  s.recorded = recorded.size();
  s.win_threshold = win_threshold;
  std::vector<double> speedups, fractions;
  for (const auto& o : recorded) {
    ++s.by_status[o.status];
    std::vector<std::string> checks = o.checks_failed;
    std::sort(checks.begin(), checks.end());
    checks.erase(std::unique(checks.begin(), checks.end()), checks.end());
    for (const auto& c : checks)
      ++s.by_check[c];
    if (!o.device.empty())
      ++s.by_device[o.device];
    s.correct += o.correct ? 1 : 0;
    if (o.status == "ok" && !std::isnan(o.speedup) && o.speedup > 0) {
      ++s.ok;
      speedups.push_back(o.speedup);
      if (o.speedup > win_threshold)
        ++s.credited;
      if (std::isfinite(o.fraction)) {
        fractions.push_back(o.fraction);
        s.above_limit += o.fraction > 1.0 ? 1 : 0;
      }
    }
  }
  if (!speedups.empty()) {
    double log_sum = 0;
    for (double x : speedups)
      log_sum += std::log(x);
    s.geomean_speedup = std::exp(log_sum / static_cast<double>(speedups.size()));
    s.median_speedup = env::median(speedups);
  }
  s.with_bound = fractions.size();
  if (!fractions.empty())
    s.median_fraction = env::median(fractions);
  s.fast_1 = fast_p(recorded, pairs, 1.0);
  s.fast_1_2 = fast_p(recorded, pairs, 1.2);
  return s;
}

std::string summary_json(const summary& s, const std::string& out_path) {
  json_writer w;
  auto counts = [&](const char* key, const std::map<std::string, std::size_t>& m) {
    w.key(key).begin_object();
    for (const auto& [k, n] : m)
      w.field(k, static_cast<std::uint64_t>(n));
    w.end_object();
  };
  w.begin_object()
    .field("pairs", static_cast<std::uint64_t>(s.pairs))
    .field("recorded", static_cast<std::uint64_t>(s.recorded))
    .field("not_recorded", static_cast<std::uint64_t>(s.pairs - s.recorded))
    .field("resumed", static_cast<std::uint64_t>(s.resumed))
    .field("evaluated", static_cast<std::uint64_t>(s.evaluated))
    .field("correct", static_cast<std::uint64_t>(s.correct))
    .field("ok", static_cast<std::uint64_t>(s.ok))
    .field("credited", static_cast<std::uint64_t>(s.credited))
    .field("win_threshold", s.win_threshold);
  counts("by_status", s.by_status);
  counts("checks_failed", s.by_check);
  counts("devices", s.by_device);
  w.field("geomean_speedup", s.geomean_speedup).field("median_speedup", s.median_speedup);
  w.key("fast_p").begin_object().field("1.0", s.fast_1).field("1.2", s.fast_1_2).end_object();
  w.key("limit").begin_object().field("with_bound", static_cast<std::uint64_t>(s.with_bound))
    .field("median_fraction", s.median_fraction).field("above", static_cast<std::uint64_t>(s.above_limit)).end_object();
  if (out_path.empty())
    w.key("out").null();
  else
    w.field("out", out_path);
  w.field("wall_s", s.wall_s).end_object();
  return std::move(w).take();
}

std::string summary_table(const summary& s, const std::string& out_path) {
  auto counts = [](const std::map<std::string, std::size_t>& m) {
    std::string out;
    for (const auto& [k, n] : m)
      out += (out.empty() ? "" : ", ") + k + " " + std::to_string(n);
    return out.empty() ? std::string{"-"} : out;
  };
  auto share = [&](double f) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f (%.0f of %zu)", f, f * static_cast<double>(s.pairs), s.pairs);
    return std::string{buf};
  };
  std::string out;
  char buf[512];
  const auto missing = s.pairs - s.recorded;
  std::snprintf(buf, sizeof buf, "pairs          %zu (%zu recorded now, %zu resumed from --out", s.pairs, s.evaluated,
                s.resumed);
  out += buf;
  out += missing > 0 ? ", " + std::to_string(missing) + " without a record)\n" : std::string{")\n"};
  std::snprintf(buf, sizeof buf, "credited       %zu (status ok and speedup above %gx)\n", s.credited, s.win_threshold);
  out += buf;
  out += "status         " + counts(s.by_status) + "\n";
  out += "checks failed  " + counts(s.by_check) + "\n";
  if (s.ok > 0) {
    std::snprintf(buf, sizeof buf, "speedup        geomean %s, median %s over %zu ok verdicts\n",
                  speedup_text(s.geomean_speedup).c_str(), speedup_text(s.median_speedup).c_str(), s.ok);
    out += buf;
  } else {
    out += "speedup        - (no ok verdict)\n";
  }
  if (s.with_bound > 0) {
    std::snprintf(buf, sizeof buf, "of the limit   median %.3f over %zu ok verdicts with a bound; %zu above 1.0\n", s.median_fraction,
                  s.with_bound, s.above_limit);
    out += buf;
  }
  out += "fast_1.0       " + share(s.fast_1) + "\n";
  out += "fast_1.2       " + share(s.fast_1_2) + "\n";
  out += "devices        " + counts(s.by_device) + "\n";
  if (!out_path.empty())
    out += "records        " + out_path + "\n";
  std::snprintf(buf, sizeof buf, "wall           %.1f s\n", s.wall_s);
  out += buf;
  return out;
}

} // namespace crucible::cli::eval_set
