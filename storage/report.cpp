// storage/report.cpp: metrics.jsonl records -> report data, learning and pace lines -> report.html
// around the plots tools/report_plots.py drew.
#include "storage/report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "core/json_parse.hpp"
#include "storage/atomic_file.hpp"
#include "storage/metrics_log.hpp"

namespace crucible::storage {

namespace {

namespace fs = std::filesystem;

// -- records ----------------------------------------------------------------------------------

// Reads typed fields of one record; the first wrong type or missing required key is kept as
// the error and later reads return defaults.
class field_reader {
public:
  field_reader(const json_value& rec, std::string where) : rec_(rec), where_(std::move(where)) {}

  /// The integer at `key`; nullopt when absent (an error when `required`).
  std::optional<std::int64_t> integer(std::string_view key, bool required) {
    auto* v = get(key, required);
    if (v == nullptr)
      return std::nullopt;
    if (!v->is_int() || v->as_int() < 0)
      return wrong(key, "a non-negative integer", *v), std::nullopt;
    return v->as_int();
  }

  /// The number at `key`; nullopt when absent or null (absent is an error when `required`).
  std::optional<double> number(std::string_view key, bool required) {
    auto* v = get(key, required);
    if (v == nullptr || v->is_null())
      return std::nullopt;
    if (!v->is_number())
      return wrong(key, "a number or null", *v), std::nullopt;
    return v->as_double();
  }

  /// The string at `key`; nullopt when absent (an error when `required`).
  std::optional<std::string> string(std::string_view key, bool required) {
    auto* v = get(key, required);
    if (v == nullptr)
      return std::nullopt;
    if (!v->is_string())
      return wrong(key, "a string", *v), std::nullopt;
    return v->as_string();
  }

  bool failed() const noexcept { return err_.code != errc::none; }
  const crucible::error& error() const noexcept { return err_; }

private:
  const json_value* get(std::string_view key, bool required) {
    if (failed())
      return nullptr;
    auto* v = rec_.find(key);
    if (v == nullptr && required)
      err_ = fail(errc::corrupt, where_, ": key '", key, "': missing");
    return v;
  }

  void wrong(std::string_view key, std::string_view expected, const json_value& got) {
    err_ = fail(errc::corrupt, where_, ": key '", key, "': expected ", expected, ", got ",
                json_value::kind_name(got.type()));
  }

  const json_value& rec_;
  std::string where_;
  crucible::error err_;
};

std::string format_number(double v) {
  if (std::abs(v) < 1e-12)
    v = 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    default: out += ch;
    }
  }
  return out;
}

std::string json_text(const json_value& v) {
  switch (v.type()) {
  case json_value::kind::null: return "-";
  case json_value::kind::boolean: return v.as_bool() ? "true" : "false";
  case json_value::kind::integer: return std::to_string(v.as_int());
  case json_value::kind::real: return format_number(v.as_double());
  case json_value::kind::string: return v.as_string();
  default: return json_value::kind_name(v.type());
  }
}

} // namespace

result<report_data> collect_report_data(const std::vector<std::string>& lines, const std::string& source) {
  report_data d;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    auto where = source + ":" + std::to_string(i + 1);
    auto rec = parse_json(lines[i], source);
    if (!rec) {
      // parse_json counts lines within the record ("SOURCE:1:COL: what"); name the file's line.
      auto msg = rec.error().message;
      auto own = source + ":1:";
      if (msg.rfind(own, 0) == 0)
        msg = where + ":" + msg.substr(own.size());
      return crucible::error{rec.error().code, std::move(msg)};
    }
    if (!rec->is_object())
      return fail(errc::corrupt, where, ": expected a JSON object, got ", json_value::kind_name(rec->type()));
    const json_value* k = rec->find("event");
    const char* key = "event";
    if (k == nullptr) {
      k = rec->find("kind");
      key = "kind";
    }
    if (k == nullptr)
      return fail(errc::corrupt, where, ": record has no 'event' or 'kind' key");
    if (!k->is_string())
      return fail(errc::corrupt, where, ": key '", key, "': expected a string, got ", json_value::kind_name(k->type()));
    const std::string& kind = k->as_string();
    ++d.kinds[kind];

    // The fields the plots read are checked here, so that a bad record is named by its line.
    field_reader f{*rec, where};
    auto speedups = [&] {
      f.number("best_speedup", false);
      f.number("mean_speedup", false);
    };
    if (kind == "train_step") {
      f.integer("step", true);
      f.number("mean_reward", false); // SFT steps have none
      f.number("correct_share", false);
      f.number("loss", false);
      speedups();
    } else if (kind.rfind("run_", 0) == 0) {
      f.integer("step", true);
      speedups();
    } else if (kind == "verdict") {
      f.string("task", true);
      auto status = f.string("status", true);
      auto speedup = f.number("speedup", false);
      f.string("hardware", false);
      auto turn = f.integer("turn", false);
      if (!f.failed() && turn) {
        auto& t = d.by_turn[*turn];
        ++t.samples;
        const auto* c = rec->find("correct");
        if (*status == "ok" && c != nullptr && c->is_bool() && c->as_bool() && speedup) {
          ++t.correct;
          t.speedup_sum += *speedup;
        }
      }
    }
    if (f.failed())
      return f.error();
  }
  return d;
}

double report_data::turn_stats::mean_speedup() const {
  return correct ? speedup_sum / static_cast<double>(correct) : std::numeric_limits<double>::quiet_NaN();
}

std::string to_string(std::int64_t turn, const report_data::turn_stats& t) {
  std::ostringstream os;
  os << std::fixed << "turn " << turn + 1 << ": " << t.samples << " samples, " << std::setprecision(1)
     << 100.0 * t.correct_share() << "% correct, mean speedup of correct samples ";
  if (t.correct)
    os << std::setprecision(2) << t.mean_speedup() << "x";
  else
    os << "-";
  return os.str();
}

namespace {

// A sampling stage's verdicts by step, each step's from the last process that sampled it.
struct step_verdicts {
  struct sample {
    std::string task;
    bool correct = false;
    double speedup = 0;
  };
  std::uint64_t segment = 0;
  std::vector<sample> samples;
};
using stage_verdicts = std::map<std::uint64_t, step_verdicts>;

// The per-task windows of `p` from its stage's verdicts (the first and last p.window steps).
void per_task(stage_progress& p, const stage_verdicts& steps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  p.first_task_correct = p.last_task_correct = p.first_task_speedup = p.last_task_speedup = nan;
  if (steps.empty())
    return;
  const auto w = std::min(p.window, steps.size());
  struct tally {
    std::uint64_t n = 0, correct = 0;
    double speedup_sum = 0;
  };
  std::map<std::string, std::array<tally, 2>> by_task;
  std::size_t i = 0;
  for (const auto& [step, sv] : steps) {
    const bool first = i < w, last = i >= steps.size() - w;
    ++i;
    for (const auto& s : sv.samples)
      for (int k = 0; k < 2; ++k) {
        if (!(k == 0 ? first : last))
          continue;
        auto& t = by_task[s.task][static_cast<std::size_t>(k)];
        ++t.n;
        if (s.correct) {
          ++t.correct;
          t.speedup_sum += s.speedup;
        }
      }
  }
  double c0 = 0, c1 = 0, s0 = 0, s1 = 0;
  for (const auto& [task, t] : by_task) {
    if (t[0].n == 0 || t[1].n == 0)
      continue; // sampled in one window only: no comparison
    stage_progress::task_windows tw;
    tw.task = task;
    tw.first_samples = t[0].n;
    tw.last_samples = t[1].n;
    tw.first_correct = static_cast<double>(t[0].correct) / static_cast<double>(t[0].n);
    tw.last_correct = static_cast<double>(t[1].correct) / static_cast<double>(t[1].n);
    tw.first_speedup = t[0].correct ? t[0].speedup_sum / static_cast<double>(t[0].correct) : nan;
    tw.last_speedup = t[1].correct ? t[1].speedup_sum / static_cast<double>(t[1].correct) : nan;
    c0 += tw.first_correct;
    c1 += tw.last_correct;
    if (t[0].correct && t[1].correct) {
      s0 += tw.first_speedup;
      s1 += tw.last_speedup;
      ++p.speedup_tasks;
    }
    p.tasks.push_back(std::move(tw));
  }
  if (!p.tasks.empty()) {
    p.first_task_correct = c0 / static_cast<double>(p.tasks.size());
    p.last_task_correct = c1 / static_cast<double>(p.tasks.size());
  }
  if (p.speedup_tasks > 0) {
    p.first_task_speedup = s0 / static_cast<double>(p.speedup_tasks);
    p.last_task_speedup = s1 / static_cast<double>(p.speedup_tasks);
  }
}

} // namespace

result<std::vector<report_plot>> parse_plot_manifest(const std::string& text) {
  auto doc = parse_json(text, "tools/report_plots.py's output");
  if (!doc)
    return doc.error();
  const auto* list = doc->is_object() ? doc->find("plots") : nullptr;
  if (list == nullptr || !list->is_array())
    return fail(errc::corrupt, "tools/report_plots.py's output: expected {\"plots\": [...]}");
  std::vector<report_plot> out;
  for (const auto& p : list->as_array()) {
    report_plot plot;
    for (auto [key, field] : {std::pair{"id", &plot.id}, std::pair{"file", &plot.file}, std::pair{"title", &plot.title},
                              std::pair{"caption", &plot.caption}}) {
      const auto* v = p.is_object() ? p.find(key) : nullptr;
      if (v == nullptr || !v->is_string())
        return fail(errc::corrupt, "tools/report_plots.py's output: plot ", std::to_string(out.size() + 1),
                    ": expected a string '", key, "'");
      *field = v->as_string();
    }
    // A plain file name in the output folder, nothing else.
    const bool plain = !plot.file.empty() && plot.file.find('/') == std::string::npos && plot.file[0] != '.' &&
                       plot.file.size() > 4 && plot.file.compare(plot.file.size() - 4, 4, ".png") == 0;
    if (!plain)
      return fail(errc::corrupt, "tools/report_plots.py's output: plot '", plot.id, "': file '", plot.file,
                  "' is not a .png name in the report's folder");
    out.push_back(std::move(plot));
  }
  return out;
}

std::vector<stage_progress> learning_progress(const std::vector<std::string>& lines) {
  struct step_rec {
    std::uint64_t samples = 0;
    double correct = 0;      // correct samples
    double speedup_sum = 0;  // over correct samples
  };
  std::vector<std::string> order;
  std::map<std::string, std::map<std::uint64_t, step_rec>> by_stage; // a step redone after a crash: the last record
  std::map<std::string, stage_verdicts> verdicts;
  std::uint64_t segment = 0; // a new process: run_started or run_resumed
  for (const auto& line : lines) {
    auto rec = parse_json(line);
    if (!rec || !rec->is_object())
      continue;
    const auto* ev = rec->find("event");
    const auto* stage = rec->find("stage");
    const auto* step = rec->find("step");
    if (ev != nullptr && ev->is_string() && (ev->as_string() == "run_started" || ev->as_string() == "run_resumed"))
      ++segment;
    if (ev != nullptr && ev->is_string() && ev->as_string() == "verdict" && stage != nullptr && stage->is_string()
        && step != nullptr && step->is_int()) {
      const auto* task = rec->find("task");
      const auto* correct = rec->find("correct");
      if (task == nullptr || !task->is_string() || correct == nullptr || !correct->is_bool())
        continue;
      auto& at = verdicts[stage->as_string()][static_cast<std::uint64_t>(step->as_int())];
      if (at.segment != segment) { // the step sampled again after a resume: its later verdicts count
        at.segment = segment;
        at.samples.clear();
      }
      double speedup = std::numeric_limits<double>::quiet_NaN();
      if (const auto* sp = rec->find("speedup"); sp != nullptr && sp->is_number())
        speedup = sp->as_double();
      at.samples.push_back({task->as_string(), correct->as_bool() && !std::isnan(speedup), speedup});
      continue;
    }
    const auto* samples = rec->find("samples");
    const auto* share = rec->find("correct_share");
    if (ev == nullptr || !ev->is_string() || ev->as_string() != "train_step" || stage == nullptr || !stage->is_string()
        || step == nullptr || !step->is_int() || samples == nullptr || !samples->is_int() || share == nullptr
        || !share->is_number())
      continue;
    step_rec r;
    r.samples = static_cast<std::uint64_t>(samples->as_int());
    r.correct = share->as_double() * static_cast<double>(r.samples);
    if (const auto* m = rec->find("mean_speedup"); m != nullptr && m->is_number())
      r.speedup_sum = m->as_double() * r.correct;
    if (by_stage.count(stage->as_string()) == 0)
      order.push_back(stage->as_string());
    by_stage[stage->as_string()][static_cast<std::uint64_t>(step->as_int())] = r;
  }
  std::vector<stage_progress> out;
  for (const auto& name : order) {
    const auto& steps = by_stage[name];
    std::vector<std::pair<std::uint64_t, step_rec>> v(steps.begin(), steps.end());
    stage_progress p;
    p.stage = name;
    p.steps = v.size();
    p.window = std::max<std::size_t>(1, v.size() / 3);
    p.first_step = v.front().first;
    p.last_step = v.back().first;
    auto pool = [&](std::size_t from, std::size_t to, double& correct, double& speedup, std::uint64_t& samples) {
      double c = 0, sum = 0;
      std::uint64_t n = 0;
      for (std::size_t i = from; i < to; ++i) {
        n += v[i].second.samples;
        c += v[i].second.correct;
        sum += v[i].second.speedup_sum;
      }
      samples = n;
      correct = n ? c / static_cast<double>(n) : 0.0;
      speedup = c > 0.5 ? sum / c : std::numeric_limits<double>::quiet_NaN();
    };
    pool(0, p.window, p.first_correct, p.first_speedup, p.first_samples);
    pool(v.size() - p.window, v.size(), p.last_correct, p.last_speedup, p.last_samples);
    per_task(p, verdicts[name]);
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

// "1.50x", or "-" for NaN (no correct sample).
std::string speedup_text(double v) {
  if (std::isnan(v))
    return std::string{"-"};
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", v);
  return std::string{b};
}

} // namespace

std::string to_string(const stage_progress& p) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s, first %zu against last %zu of %zu steps: correct samples %.1f%% -> %.1f%%, mean speedup of "
                "correct samples %s -> %s (%llu and %llu samples)",
                p.stage.c_str(), p.window, p.window, p.steps, 100.0 * p.first_correct, 100.0 * p.last_correct,
                speedup_text(p.first_speedup).c_str(), speedup_text(p.last_speedup).c_str(), static_cast<unsigned long long>(p.first_samples),
                static_cast<unsigned long long>(p.last_samples));
  std::string out = buf;
  if (!p.tasks.empty()) {
    std::snprintf(buf, sizeof buf,
                  "; each of the %zu tasks sampled in both weighted equally: correct %.1f%% -> %.1f%%, mean speedup %s -> %s",
                  p.tasks.size(), 100.0 * p.first_task_correct, 100.0 * p.last_task_correct,
                  speedup_text(p.first_task_speedup).c_str(), speedup_text(p.last_task_speedup).c_str());
    out += buf;
  }
  return out;
}

std::string to_string(const stage_progress::task_windows& t) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: correct %.1f%% -> %.1f%%, mean speedup %s -> %s (%llu and %llu samples)",
                t.task.c_str(), 100.0 * t.first_correct, 100.0 * t.last_correct, speedup_text(t.first_speedup).c_str(),
                speedup_text(t.last_speedup).c_str(), static_cast<unsigned long long>(t.first_samples),
                static_cast<unsigned long long>(t.last_samples));
  return buf;
}

result<report_files> write_report(const fs::path& run, const fs::path& out, const report_plots& plots) {
  std::error_code ec;
  if (!fs::is_directory(run, ec) || !fs::exists(run / "config.yaml", ec))
    return fail(errc::not_found, run.string(), ": not a run directory (no config.yaml)");

  std::vector<std::string> lines;
  auto metrics = run / "metrics.jsonl";
  if (fs::exists(metrics, ec)) {
    auto read = read_metrics(metrics);
    if (!read)
      return read.error();
    lines = std::move(*read);
  }
  auto data = collect_report_data(lines, metrics.string());
  if (!data)
    return data.error();

  std::optional<json_value> status;
  auto status_path = run / "status.json";
  if (fs::exists(status_path, ec)) {
    auto st = read_json_file(status_path);
    if (!st)
      return st.error();
    if (!st->is_object())
      return fail(errc::corrupt, status_path.string(), ": expected a JSON object");
    status = std::move(*st);
  }
  std::vector<std::string> events;
  auto events_path = run / "events.log";
  if (fs::exists(events_path, ec)) {
    auto text = read_file(events_path);
    if (!text)
      return text.error();
    std::size_t begin = 0;
    for (auto nl = text->find('\n'); nl != std::string::npos; nl = text->find('\n', begin)) {
      events.emplace_back(*text, begin, nl - begin);
      begin = nl + 1;
    }
    if (events.size() > 20)
      events.erase(events.begin(), events.end() - 20);
  }

  fs::create_directories(out, ec);
  if (ec)
    return fail(errc::io, out.string(), ": cannot create directory: ", ec.message());

  auto name = run.lexically_normal().filename().string();
  if (name.empty())
    name = run.lexically_normal().parent_path().filename().string();
  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>crucible report: " +
          xml_escape(name) + "</title>\n<style>\n"
          "body{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}\n"
          "img{max-width:100%;height:auto}figure{margin:1.5em 0}figcaption{font-size:90%;color:#444}\n"
          "table{border-collapse:collapse}td{padding:2px 12px 2px 0}\n"
          ".no-data{color:#777;font-style:italic}pre{background:#f6f6f6;padding:8px;overflow-x:auto}\n"
          "</style>\n</head>\n<body>\n<h1>Run " +
          xml_escape(name) + "</h1>\n";
  if (status) {
    html += "<h2>Status</h2>\n<table id=\"status\">\n";
    for (const auto& m : status->as_object())
      if (m.key != "devices")
        html += "<tr><td>" + xml_escape(m.key) + "</td><td>" + xml_escape(json_text(m.value)) + "</td></tr>\n";
    html += "</table>\n";
    // The share of time each GPU of the trainer's process was held by evaluations and by the
    // policy's own work (generation, updates); status.json's `devices` (docs/report.md).
    if (const auto* devices = status->find("devices"); devices != nullptr && devices->is_array()) {
      html += "<h2>GPU busy</h2>\n<table id=\"gpus\">\n<tr><td>GPU</td><td>evaluations</td><td>policy</td>"
              "<td>seconds</td></tr>\n";
      for (const auto& d : devices->as_array()) {
        const auto* name = d.is_object() ? d.find("device") : nullptr;
        const auto* secs = d.is_object() ? d.find("seconds") : nullptr;
        if (name == nullptr || !name->is_string() || secs == nullptr || !secs->is_number())
          continue;
        auto share = [&](const char* key) {
          const auto* v = d.find(key);
          const double s = secs->as_double();
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.1f%%", v != nullptr && v->is_number() && s > 0 ? 100.0 * v->as_double() / s : 0.0);
          return std::string{buf};
        };
        char total[32];
        std::snprintf(total, sizeof total, "%.0f", secs->as_double());
        // What runs on it, where the record says (the engine and learner flags; older records have none).
        auto flag = [&](const char* key) {
          const auto* f = d.find(key);
          return f != nullptr && f->is_bool() && f->as_bool();
        };
        std::string roles;
        if (flag("engine") || flag("learner")) {
          for (const char* role : {"engine", "learner", "evaluator"})
            if (flag(role))
              roles += (roles.empty() ? " (" : ", ") + std::string{role};
          roles += ")";
        }
        html += "<tr><td>" + xml_escape(name->as_string() + roles) +
                "</td><td>" + share("evaluation_s") + "</td><td>" + share("policy_s") + "</td><td>" + total +
                "</td></tr>\n";
      }
      html += "</table>\n";
    }
  } else {
    html += "<p class=\"no-data\">No status.json yet.</p>\n";
  }
  std::size_t total = 0;
  std::string kinds;
  for (const auto& [k, n] : data->kinds) {
    total += n;
    kinds += (kinds.empty() ? "" : ", ") + xml_escape(k) + " " + std::to_string(n);
  }
  html += "<p>" + std::to_string(total) + " metrics records" + (kinds.empty() ? "" : ": " + kinds) + ".</p>\n";

  report_files files;
  files.progress = learning_progress(lines);
  if (!files.progress.empty()) {
    html += "<h2>Learning</h2>\n<ul id=\"progress\">\n";
    for (const auto& p : files.progress) {
      html += "<li>" + xml_escape(to_string(p));
      if (!p.tasks.empty()) {
        html += "\n<ul>\n";
        for (const auto& t : p.tasks)
          html += "<li>" + xml_escape(to_string(t)) + "</li>\n";
        html += "</ul>\n";
      }
      html += "</li>\n";
    }
    html += "</ul>\n";
  }
  // The pace plan: how long RL steps waited for verdicts, and the evaluator GPUs that would keep
  // the learner from waiting (storage/pace.hpp).
  files.pace = pace_segments(lines);
  if (!files.pace.empty()) {
    html += "<h2>Pace</h2>\n<ul id=\"pace\">\n";
    for (const auto& p : files.pace)
      html += "<li>" + xml_escape(to_string(p)) + "</li>\n";
    html += "</ul>\n";
  }
  if (!data->by_turn.empty()) { // multi-turn episodes: every verdict of the run by its turn
    html += "<h2>By turn</h2>\n<ul id=\"turns\">\n";
    for (const auto& [turn, t] : data->by_turn)
      html += "<li>" + xml_escape(to_string(turn, t)) + "</li>\n";
    html += "</ul>\n";
  }
  files.html = out / "report.html";
  // The plots tools/report_plots.py drew into `out` (docs/report.md), each with its caption.
  if (plots.plots.empty()) {
    html += "<h2>Plots</h2>\n<p class=\"no-data\">" +
            xml_escape(plots.missing.empty() ? std::string{"No records to plot yet."} : plots.missing) + "</p>\n";
  }
  for (const auto& p : plots.plots) {
    html += "<figure id=\"" + xml_escape(p.id) + "\">\n<img src=\"" + xml_escape(p.file) + "\" alt=\"" +
            xml_escape(p.title) + "\">\n<figcaption>" + xml_escape(p.caption) + "</figcaption>\n</figure>\n";
    files.pngs.push_back(out / p.file);
  }
  html += "<h2>Recent events</h2>\n";
  if (events.empty()) {
    html += "<p class=\"no-data\">No events.log yet.</p>\n";
  } else {
    html += "<pre>";
    for (const auto& e : events)
      html += xml_escape(e) + "\n";
    html += "</pre>\n";
  }
  html += "</body>\n</html>\n";
  if (auto w = write_file_atomic(files.html, html); !w)
    return w.error();
  return files;
}

} // namespace crucible::storage
