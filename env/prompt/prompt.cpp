// env/prompt/prompt.cpp: prompt-template files in, checked once; prompts out, fitted to the token budget by
// shortening and then dropping exemplars, and wrapped in the chat template (jinja/).
#include "env/prompt/prompt.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include "core/file_io.hpp"
#include "env/prompt/placeholders.hpp"
#include "env/prompt/template_file.hpp"
#include "jinja/jinja.hpp"

namespace crucible::env {

namespace fs = std::filesystem;

namespace {

// One piece of a template file: its key, field, the placeholders it may use and must use.
struct piece_spec {
  const char* key;
  std::string prompt_template::*field;
  std::vector<std::string> allowed;
  std::vector<std::string> required;
};

const std::vector<piece_spec>& piece_specs() {
  static const std::vector<piece_spec> specs = {
    {"system", &prompt_template::system, {"hardware"}, {}},
    {"user", &prompt_template::user, {"task", "exemplars", "instructions"}, {"task", "exemplars", "instructions"}},
    {"task", &prompt_template::task, {"task_name", "hardware", "reference_code", "fence"}, {"reference_code"}},
    {"exemplars_header", &prompt_template::exemplars_header, {"count", "hardware"}, {}},
    {"exemplar", &prompt_template::exemplar, {"index", "speedup", "hardware", "code", "fence"}, {"code", "speedup"}},
    {"no_exemplars", &prompt_template::no_exemplars, {"hardware"}, {}},
    {"instructions", &prompt_template::instructions, {"hardware"}, {}},
    {"truncation_marker", &prompt_template::truncation_marker, {"omitted_lines", "omitted_chars"}, {}},
  };
  return specs;
}

bool substitute(std::string_view text, const std::vector<std::pair<std::string, std::string>>& vars, std::string& out,
                std::string& problem, std::set<std::string>* used = nullptr) {
  return substitute_placeholders(text, vars, out, problem, used);
}

// Renders a checked piece; the template was validated at load, so failure is a bug.
std::string fill(const std::string& text, const std::vector<std::pair<std::string, std::string>>& vars) {
  std::string out, problem;
  [[maybe_unused]] bool ok = substitute(text, vars, out, problem);
  assert(ok);
  return out;
}

bool contains_ci(const std::string& hay, const std::string& needle) {
  auto lower = [](std::string s) {
    for (auto& c : s)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return lower(hay).find(lower(needle)) != std::string::npos;
}


// A fence longer than any backtick run in `code`, so code that itself holds ``` stays inside.
std::string fence_for(const std::string& code) {
  std::size_t longest = 0, run = 0;
  for (char c : code) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return std::string(std::max<std::size_t>(3, longest + 1), '`');
}

std::string format_speedup(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", s);
  return buf;
}

} // namespace

result<prompt_template> parse_prompt_template(std::string_view yaml_text, const std::string& origin) {
  std::vector<std::string> problems;
  prompt_template t;
  t.origin = origin;
  std::set<std::string> known = {"version", "sections"};
  for (const auto& spec : piece_specs())
    known.insert(spec.key);
  auto parsed = template_root(yaml_text, origin, "template pieces", known, problems);
  if (!parsed)
    return parsed.error();
  const YAML::Node root = *parsed;
  auto version = root["version"];
  if (!version.IsDefined() || !version.IsScalar() || version.Scalar() != "1")
    problems.push_back(where(origin, version.IsDefined() ? version : root) + ": version: expected 1");
  auto sections = root["sections"];
  if (!sections.IsDefined() || !sections.IsSequence() || sections.size() == 0) {
    problems.push_back(where(origin, sections.IsDefined() ? sections : root) +
                       ": sections: expected a non-empty list of section headings");
  } else {
    for (const auto& s : sections) {
      if (!s.IsScalar() || s.Scalar().empty())
        problems.push_back(where(origin, s) + ": sections: expected non-empty strings");
      else
        t.sections.push_back(s.Scalar());
    }
  }
  for (const auto& spec : piece_specs()) {
    auto n = root[spec.key];
    if (!n.IsDefined() || n.IsNull()) {
      problems.push_back(origin + ": " + spec.key + ": missing");
      continue;
    }
    if (!n.IsScalar() || n.Scalar().empty()) {
      problems.push_back(where(origin, n) + ": " + spec.key + ": expected a non-empty string");
      continue;
    }
    t.*spec.field = n.Scalar();
    std::vector<std::pair<std::string, std::string>> vars;
    for (const auto& a : spec.allowed)
      vars.emplace_back(a, "");
    std::string out, problem;
    std::set<std::string> used;
    if (!substitute(t.*spec.field, vars, out, problem, &used)) {
      problems.push_back(where(origin, n) + ": " + spec.key + ": " + problem);
      continue;
    }
    for (const auto& r : spec.required)
      if (used.count(r) == 0)
        problems.push_back(where(origin, n) + ": " + spec.key + ": must contain the placeholder {" + r + "}");
  }
  if (problems.empty())
    for (const auto& s : t.sections)
      if (!contains_ci(t.instructions, s))
        problems.push_back(where(origin, root["instructions"]) + ": instructions: does not mention the section \"" + s +
                           "\" listed in sections");
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems)
      msg += (msg.empty() ? "" : "\n") + p;
    return error{errc::config, std::move(msg)};
  }
  return t;
}

result<prompt_template> load_prompt_template(const fs::path& file) {
  auto text = read_file(file);
  if (!text.ok())
    return text.error();
  return parse_prompt_template(*text, file.string());
}

namespace {

// A template file `key` names (`configured`; "" : configs/prompts/`fallback` of the checkout).
result<fs::path> resolve_template_file(const std::string& configured, const char* fallback, const char* key) {
  // A relative path is looked up in the working directory, then (for the checkout's own
  // templates, e.g. configs/prompts/compact.yaml) above the executable's directory.
  const fs::path rel = configured.empty() ? fs::path{"configs"} / "prompts" / fallback : fs::path{configured};
  std::error_code ec;
  if (!configured.empty() && (rel.is_absolute() || fs::exists(rel, ec))) {
    if (!fs::exists(rel, ec))
      return fail(errc::not_found, configured, ": no such template file (", key, ")");
    return rel;
  }
  std::vector<fs::path> starts = {executable_dir(), fs::current_path()};
  for (const auto& start : starts)
    for (auto dir = start; !dir.empty(); dir = dir.parent_path()) {
      if (fs::exists(dir / rel, ec))
        return dir / rel;
      if (dir == dir.root_path())
        break;
    }
  if (!configured.empty())
    return fail(errc::not_found, configured, ": no such template file (", key, "), in the working directory or above ",
                executable_dir().string());
  return fail(errc::not_found, "cannot find ", rel.string(), " above ", executable_dir().string(),
              " or the working directory (set ", key, ")");
}

} // namespace

result<fs::path> resolve_prompt_template(const std::string& configured) {
  return resolve_template_file(configured, "contrastive.yaml", "prompt.template");
}

result<fs::path> resolve_feedback_template(const std::string& configured) {
  return resolve_template_file(configured, "feedback.yaml", "prompt.feedback_template");
}

// ---------------------------------------------------------------------------------------------

struct prompt_builder::impl {
  prompt_template t;
  prompt_config cfg;
  std::optional<jinja::program> chat;
  std::map<std::string, std::string> special;
  token_counter count;

  // p.text and p.tokens from p.messages: rendered with the chat template, or (without one) the
  // messages' contents joined by blank lines.
  result<void> render_text(built_prompt& p) const {
    if (chat) {
      std::vector<jinja::chat_message> msgs;
      for (const auto& [role, content] : p.messages)
        msgs.push_back({role, content});
      auto text = jinja::render_chat(*chat, msgs, special, true);
      if (!text.ok())
        return fail(errc::invalid_arg, "chat template: ", text.error().message);
      p.text = std::move(*text);
    } else {
      p.text.clear();
      for (std::size_t i = 0; i < p.messages.size(); ++i)
        p.text += (i == 0 ? "" : "\n\n") + p.messages[i].second;
    }
    p.tokens = count(p.text);
    return {};
  }

  // The code of one exemplar cut to `cap` bytes (at a UTF-8 boundary, at a line end when that keeps
  // at least half), followed by the truncation marker.
  std::string cut(const std::string& code, std::size_t cap, exemplar_placement& place) const {
    if (code.size() <= cap) {
      place.shown_bytes = code.size();
      return code;
    }
    std::size_t end = cap;
    while (end > 0 && (static_cast<unsigned char>(code[end]) & 0xC0) == 0x80)
      --end;
    auto nl = code.rfind('\n', end);
    if (nl != std::string::npos && nl >= cap / 2)
      end = nl;
    std::string rest = code.substr(end);
    if (!rest.empty() && rest.front() == '\n')
      rest.erase(0, 1);
    std::size_t lines = static_cast<std::size_t>(std::count(rest.begin(), rest.end(), '\n'));
    if (!rest.empty() && rest.back() != '\n')
      ++lines;
    place.shortened = true;
    place.shown_bytes = end;
    return code.substr(0, end) +
           fill(t.truncation_marker, {{"omitted_lines", std::to_string(lines)},
                                      {"omitted_chars", std::to_string(code.size() - end)}});
  }

  // The prompt with the exemplars `kept` (indices into req.exemplars), each code cut to `cap`.
  result<built_prompt> render(const prompt_request& req, const std::vector<std::size_t>& kept, std::size_t cap) const {
    built_prompt p;
    p.exemplars.resize(req.exemplars.size());
    std::vector<std::size_t> shown = kept;
    std::stable_sort(shown.begin(), shown.end(), [&](std::size_t a, std::size_t b) {
      return req.exemplars[a].speedup < req.exemplars[b].speedup;
    });
    std::string block;
    if (shown.empty()) {
      block = fill(t.no_exemplars, {{"hardware", req.hardware}});
    } else {
      block = fill(t.exemplars_header, {{"count", std::to_string(shown.size())}, {"hardware", req.hardware}});
      for (std::size_t i = 0; i < shown.size(); ++i) {
        const auto& x = req.exemplars[shown[i]];
        auto& place = p.exemplars[shown[i]];
        place.kept = true;
        std::string code = cut(x.code, cap, place);
        block += "\n\n" + fill(t.exemplar, {{"index", std::to_string(i + 1)},
                                            {"speedup", format_speedup(x.speedup)},
                                            {"hardware", x.hardware},
                                            {"code", code},
                                            {"fence", fence_for(code)}});
      }
    }
    std::string task = fill(t.task, {{"task_name", req.task_name},
                                     {"hardware", req.hardware},
                                     {"reference_code", req.reference_code},
                                     {"fence", fence_for(req.reference_code)}});
    std::string instructions = fill(t.instructions, {{"hardware", req.hardware}});
    p.system = fill(t.system, {{"hardware", req.hardware}});
    p.user = fill(t.user, {{"task", task}, {"exemplars", block}, {"instructions", instructions}});
    p.messages = {{"system", p.system}, {"user", p.user}};
    if (auto r = render_text(p); !r.ok())
      return r.error();
    return p;
  }
};

result<built_prompt> prompt_builder::continue_episode(const built_prompt& first, std::span<const episode_turn> turns) const {
  const auto& im = *impl_;
  const std::size_t budget = static_cast<std::size_t>(im.cfg.max_tokens);
  // What each earlier turn shows: 2 its answer and feedback, 1 its feedback only, 0 neither.
  std::vector<int> shown(turns.size(), 2);
  auto render = [&]() -> result<built_prompt> {
    built_prompt p = first;
    p.messages = {{"system", first.system}, {"user", first.user}};
    for (std::size_t k = 0; k < turns.size(); ++k) {
      const std::string answer =
        shown[k] == 2 ? turns[k].answer
                      : "[the answer of turn " + std::to_string(k + 1) + " is left out: " +
                          std::to_string(turns[k].answer.size()) + " characters]";
      const std::string feedback = shown[k] >= 1 ? turns[k].feedback : "[its feedback is left out]";
      p.messages.push_back({"assistant", answer});
      p.messages.push_back({"user", feedback});
    }
    if (auto r = im.render_text(p); !r.ok())
      return r.error();
    return p;
  };
  auto p = render();
  if (!p.ok())
    return p.error();
  // Oldest first: answers (never the latest turn's), then feedback (never the latest).
  for (int level : {2, 1})
    for (std::size_t k = 0; k + 1 < turns.size() && p->tokens > budget; ++k)
      if (shown[k] == level) {
        shown[k] = level - 1;
        p = render();
        if (!p.ok())
          return p.error();
      }
  if (p->tokens > budget)
    return fail(errc::invalid_arg, "prompt for turn ", std::to_string(turns.size() + 1), ": ", std::to_string(p->tokens),
                " tokens with the earlier turns shortened, over the budget prompt.max_tokens = ", std::to_string(budget));
  return p;
}

prompt_builder::prompt_builder(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
prompt_builder::prompt_builder(prompt_builder&&) noexcept = default;
prompt_builder& prompt_builder::operator=(prompt_builder&&) noexcept = default;
prompt_builder::~prompt_builder() = default;

const prompt_template& prompt_builder::templ() const noexcept { return impl_->t; }

result<prompt_builder> prompt_builder::create(prompt_template tmpl, const prompt_config& cfg, const chat_format& chat,
                                              token_counter count) {
  if (cfg.max_tokens <= 0)
    return fail(errc::config, "prompt.max_tokens: expected a positive integer, got ", std::to_string(cfg.max_tokens));
  if (cfg.min_exemplar_chars <= 0)
    return fail(errc::config, "prompt.min_exemplar_chars: expected a positive integer, got ",
                std::to_string(cfg.min_exemplar_chars));
  if (cfg.max_exemplar_chars < 0)
    return fail(errc::config, "prompt.max_exemplar_chars: expected an integer ≥ 0, got ",
                std::to_string(cfg.max_exemplar_chars));
  if (!count)
    return fail(errc::invalid_arg, "prompt_builder: no token counter");
  auto p = std::make_unique<impl>();
  p->t = std::move(tmpl);
  p->cfg = cfg;
  p->count = std::move(count);
  if (cfg.chat_template == chat_template_mode::automatic && !chat.chat_template.empty()) {
    auto prog = jinja::program::parse(chat.chat_template, "chat_template");
    if (!prog.ok())
      return prog.error();
    p->chat.emplace(std::move(*prog));
    p->special = chat.special_tokens;
  }
  return prompt_builder{std::move(p)};
}

result<built_prompt> prompt_builder::build(const prompt_request& req) const {
  const auto budget = static_cast<std::size_t>(impl_->cfg.max_tokens);
  const std::size_t first_cap = impl_->cfg.max_exemplar_chars > 0 ? static_cast<std::size_t>(impl_->cfg.max_exemplar_chars)
                                                                  : std::numeric_limits<std::size_t>::max();
  const auto min_cap = static_cast<std::size_t>(impl_->cfg.min_exemplar_chars);
  // Drop order: the lowest speedup goes first (ties: the later request entry).
  std::vector<std::size_t> by_speedup(req.exemplars.size());
  std::iota(by_speedup.begin(), by_speedup.end(), 0);
  std::stable_sort(by_speedup.begin(), by_speedup.end(), [&](std::size_t a, std::size_t b) {
    return req.exemplars[a].speedup > req.exemplars[b].speedup;
  });
  std::size_t reference_only_tokens = 0;
  for (std::size_t k = req.exemplars.size() + 1; k-- > 0;) {
    std::vector<std::size_t> kept(by_speedup.begin(), by_speedup.begin() + static_cast<std::ptrdiff_t>(k));
    auto full = impl_->render(req, kept, first_cap);
    if (!full.ok())
      return full.error();
    if (full->tokens <= budget)
      return full;
    if (k == 0) {
      reference_only_tokens = full->tokens;
      break;
    }
    // Shorten every shown exemplar to a common cap: the longest cap that fits, found by
    // bisection (the token count grows with the cap).
    std::size_t longest = 0;
    for (auto i : kept)
      longest = std::max(longest, std::min(req.exemplars[i].code.size(), first_cap));
    if (longest <= min_cap)
      continue;
    auto at_min = impl_->render(req, kept, min_cap);
    if (!at_min.ok())
      return at_min.error();
    if (at_min->tokens > budget)
      continue;
    std::size_t lo = min_cap, hi = longest - 1; // lo fits
    built_prompt best = std::move(*at_min);
    while (lo < hi) {
      std::size_t mid = lo + (hi - lo + 1) / 2;
      auto p = impl_->render(req, kept, mid);
      if (!p.ok())
        return p.error();
      if (p->tokens <= budget) {
        lo = mid;
        best = std::move(*p);
      } else {
        hi = mid - 1;
      }
    }
    return best;
  }
  return fail(errc::invalid_arg, "prompt for ", req.task_name, ": even without exemplars it is ",
              std::to_string(reference_only_tokens), " tokens, over the budget prompt.max_tokens = ",
              std::to_string(budget));
}

} // namespace crucible::env
