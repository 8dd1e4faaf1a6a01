#include "env/prompt/feedback.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "core/file_io.hpp"
#include "env/prompt/placeholders.hpp"
#include "env/prompt/prompt.hpp"
#include "env/prompt/template_file.hpp"

namespace crucible::env {

namespace {

const std::vector<std::string>& placeholders() {
  static const std::vector<std::string> names = {"status", "error",   "checks",   "speedup", "band",     "ref_ms",
                                                 "cand_ms", "hardware", "turn",    "turns_left", "profile", "own_share"};
  return names;
}

struct piece {
  const char* key;
  std::string feedback_template::*field;
};

const std::vector<piece>& pieces() {
  static const std::vector<piece> p = {
    {"ok", &feedback_template::ok},
    {"slower", &feedback_template::slower},
    {"incorrect", &feedback_template::incorrect},
    {"compile_error", &feedback_template::compile_error},
    {"runtime_error", &feedback_template::runtime_error},
    {"timeout", &feedback_template::timeout},
    {"rejected", &feedback_template::rejected},
    {"format_error", &feedback_template::format_error},
  };
  return p;
}

std::string number(const char* format, double x) {
  if (std::isnan(x))
    return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

} // namespace

result<feedback_template> parse_feedback_template(std::string_view yaml_text, const std::string& origin) {
  std::vector<std::string> problems;
  feedback_template t;
  t.origin = origin;
  std::set<std::string> known = {"version", "max_error_chars"};
  for (const auto& p : pieces())
    known.insert(p.key);
  auto parsed = template_root(yaml_text, origin, "feedback pieces", known, problems);
  if (!parsed)
    return parsed.error();
  const YAML::Node root = *parsed;
  auto version = root["version"];
  if (!version.IsDefined() || !version.IsScalar() || version.Scalar() != "1")
    problems.push_back(origin + ": version: expected 1");
  if (auto m = root["max_error_chars"]; m.IsDefined()) {
    try {
      const auto n = m.as<long long>();
      if (n < 80)
        problems.push_back(where(origin, m) + ": max_error_chars: expected an integer ≥ 80");
      else
        t.max_error_chars = static_cast<std::size_t>(n);
    } catch (const YAML::Exception&) {
      problems.push_back(where(origin, m) + ": max_error_chars: expected an integer ≥ 80");
    }
  }
  std::vector<std::pair<std::string, std::string>> vars;
  for (const auto& name : placeholders())
    vars.emplace_back(name, "");
  for (const auto& p : pieces()) {
    auto n = root[p.key];
    if (!n.IsDefined() || n.IsNull()) {
      problems.push_back(origin + ": " + p.key + ": missing");
      continue;
    }
    if (!n.IsScalar() || n.Scalar().empty()) {
      problems.push_back(where(origin, n) + ": " + p.key + ": expected a non-empty string");
      continue;
    }
    t.*p.field = n.Scalar();
    std::string out, problem;
    if (!substitute_placeholders(t.*p.field, vars, out, problem))
      problems.push_back(where(origin, n) + ": " + p.key + ": " + problem);
  }
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems)
      msg += (msg.empty() ? "" : "\n") + p;
    return fail(errc::config, msg);
  }
  return t;
}

result<feedback_template> load_feedback_template(const std::filesystem::path& file) {
  auto text = read_file(file);
  if (!text)
    return text.error();
  return parse_feedback_template(*text, file.string());
}

result<feedback_template> load_configured_feedback_template(const std::string& configured) {
  auto file = resolve_feedback_template(configured);
  if (!file)
    return file.error();
  return load_feedback_template(*file);
}

std::string cut_middle(const std::string& text, std::size_t max_chars) {
  if (text.size() <= max_chars)
    return text;
  auto boundary = [&](std::size_t i) { // back to a UTF-8 character's first byte
    while (i > 0 && i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80)
      --i;
    return i;
  };
  const std::string marker_probe = "\n[... 000000000 characters left out ...]\n";
  const std::size_t room = max_chars > marker_probe.size() ? max_chars - marker_probe.size() : 0;
  const std::size_t head = boundary(room / 3);
  const std::size_t tail_from = boundary(text.size() - (room - head));
  const std::string marker = "\n[... " + std::to_string(tail_from - head) + " characters left out ...]\n";
  return text.substr(0, head) + marker + text.substr(tail_from);
}

std::string profile_lines(const verdict& v) {
  if (v.profile.empty())
    return "(no profile)";
  std::string out;
  for (const auto& k : v.profile) {
    char share[16];
    std::snprintf(share, sizeof share, "%5.1f%%", k.share * 100.0);
    out += (out.empty() ? "" : "\n") + std::string{"  "} + share + "  " + k.name;
  }
  return out;
}

std::string render_feedback(const feedback_template& t, const verdict& v, std::size_t turn, std::size_t turns_left) {
  std::string checks;
  for (const auto& c : v.checks_failed)
    checks += (checks.empty() ? "" : ", ") + c;
  const std::vector<std::pair<std::string, std::string>> vars = {
    {"status", to_string(v.status)},
    {"error", cut_middle(v.message, t.max_error_chars)},
    {"checks", checks.empty() ? "-" : checks},
    {"speedup", number("%.2f", v.speedup)},
    {"band", number("%.1f", v.speedup_spread * 100.0)},
    {"ref_ms", number("%.3f", v.ref_ms)},
    {"cand_ms", number("%.3f", v.cand_ms)},
    {"hardware", v.hardware.empty() ? "-" : v.hardware},
    {"turn", std::to_string(turn)},
    {"turns_left", std::to_string(turns_left)},
    {"profile", profile_lines(v)},
    {"own_share", std::isnan(v.own_share) ? std::string{"-"} : number("%.0f", v.own_share * 100.0)},
  };
  const std::string* piece = &t.runtime_error;
  switch (v.status) {
    case verdict_status::ok: piece = v.has_speedup() && v.speedup > 1.0 ? &t.ok : &t.slower; break;
    case verdict_status::incorrect: piece = &t.incorrect; break;
    case verdict_status::compile_error: piece = &t.compile_error; break;
    case verdict_status::runtime_error: piece = &t.runtime_error; break;
    case verdict_status::timeout: piece = &t.timeout; break;
    case verdict_status::rejected: piece = &t.rejected; break;
    case verdict_status::format_error: piece = &t.format_error; break;
  }
  std::string out, problem;
  substitute_placeholders(*piece, vars, out, problem); // checked when the template was read
  return out;
}

} // namespace crucible::env
