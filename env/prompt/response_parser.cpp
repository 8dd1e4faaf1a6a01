// env/prompt/response_parser.cpp: one pass over a response's lines: fenced blocks (backticks or tildes,
// CommonMark closing rules), section headings outside them, then the last Python block that
// defines ModelNew; anything unusable becomes a format_error verdict for the rollout.
#include "env/prompt/response_parser.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "env/reward.hpp"

namespace crucible::env {

const char* to_string(format_problem p) noexcept {
  switch (p) {
    case format_problem::empty: return "empty";
    case format_problem::too_long: return "too_long";
    case format_problem::no_code_block: return "no_code_block";
    case format_problem::unterminated_fence: return "unterminated_fence";
    case format_problem::no_model_new: return "no_model_new";
    case format_problem::missing_section: return "missing_section";
  }
  return "?";
}

std::string response_parse::message() const {
  return ok ? std::string{} : std::string{to_string(problem)} + ": " + detail;
}

response_parse_options parse_options_from(const prompt_config& cfg, std::vector<std::string> sections) {
  response_parse_options o;
  o.sections = std::move(sections);
  o.require_sections = cfg.require_sections;
  o.max_chars = cfg.max_response_chars > 0 ? static_cast<std::size_t>(cfg.max_response_chars) : 0;
  return o;
}

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

bool iequal_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size())
    return false;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  return true;
}

// A fence line: indentation, then 3+ backticks or tildes. For an opening fence of backticks the
// info string may hold no backtick (CommonMark), else the line is inline code, not a fence.
struct fence {
  char ch = 0;
  std::size_t len = 0;
  std::size_t indent = 0;
  std::string_view info;
};

std::optional<fence> fence_of(std::string_view line) {
  fence f;
  while (f.indent < line.size() && is_blank(line[f.indent]))
    ++f.indent;
  if (f.indent >= line.size() || (line[f.indent] != '`' && line[f.indent] != '~'))
    return std::nullopt;
  f.ch = line[f.indent];
  std::size_t i = f.indent;
  while (i < line.size() && line[i] == f.ch)
    ++i;
  f.len = i - f.indent;
  if (f.len < 3)
    return std::nullopt;
  f.info = trim(line.substr(i));
  return f;
}

bool closes(const fence& open, std::string_view line) {
  auto f = fence_of(line);
  return f && f->ch == open.ch && f->len >= open.len && f->info.empty();
}

// Does `code` define `class ModelNew` at the top level? A line-start check in a scan that skips
// comments and string literals (triple-quoted ones across lines), so a name in a docstring,
// a comment or a string does not count.
bool defines_model_new(std::string_view code) {
  enum class st { normal, single, triple } state = st::normal;
  char quote = 0;
  static constexpr std::string_view needle = "class ModelNew";
  for (std::size_t i = 0; i < code.size(); ++i) {
    char c = code[i];
    switch (state) {
      case st::normal:
        if ((i == 0 || code[i - 1] == '\n') && code.compare(i, needle.size(), needle) == 0) {
          std::size_t j = i + needle.size();
          if (j < code.size() && (code[j] == '(' || code[j] == ':' || is_blank(code[j])))
            return true;
        }
        if (c == '#') {
          auto nl = code.find('\n', i);
          if (nl == std::string_view::npos)
            return false;
          i = nl - 1;
        } else if (c == '"' || c == '\'') {
          quote = c;
          if (i + 2 < code.size() && code[i + 1] == c && code[i + 2] == c) {
            state = st::triple;
            i += 2;
          } else {
            state = st::single;
          }
        }
        break;
      case st::single:
        if (c == '\\')
          ++i;
        else if (c == quote || c == '\n')
          state = st::normal;
        break;
      case st::triple:
        if (c == '\\')
          ++i;
        else if (c == quote && i + 2 < code.size() && code[i + 1] == quote && code[i + 2] == quote) {
          state = st::normal;
          i += 2;
        }
        break;
    }
  }
  return false;
}

// If `line` is a heading of one of `names`, its index and where the section's own text starts
// on the line (after "Name:", or the line's end).
std::optional<std::pair<std::size_t, std::size_t>> heading_of(std::string_view line,
                                                              const std::vector<std::string>& names) {
  std::size_t i = 0;
  auto skip = [&](auto pred) {
    while (i < line.size() && pred(line[i]))
      ++i;
  };
  skip(is_blank);
  skip([](char c) { return c == '#'; });
  skip(is_blank);
  // A list marker: "1." / "1)" or a bullet followed by a blank.
  std::size_t j = i;
  while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j])))
    ++j;
  if (j > i && j < line.size() && (line[j] == '.' || line[j] == ')'))
    i = j + 1;
  else if (i + 1 < line.size() && (line[i] == '-' || line[i] == '*' || line[i] == '+') && is_blank(line[i + 1]))
    i += 2;
  skip([](char c) { return is_blank(c) || c == '*' || c == '_'; });
  // "**1. Performance Analysis**": a number inside the emphasis.
  j = i;
  while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j])))
    ++j;
  if (j > i && j < line.size() && (line[j] == '.' || line[j] == ')')) {
    i = j + 1;
    skip(is_blank);
  }
  auto rest_line = line.substr(i);
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (!iequal_prefix(rest_line, names[k]))
      continue;
    std::size_t p = i + names[k].size();
    std::size_t q = p;
    while (q < line.size() && (is_blank(line[q]) || line[q] == '*' || line[q] == '_' || line[q] == '#'))
      ++q;
    if (q >= line.size() || line[q] == '\r')
      return std::pair{k, line.size()};
    if (line[q] == ':') {
      ++q;
      // Emphasis closing after the colon: "**Performance Analysis:** text".
      while (q < line.size() && (line[q] == '*' || line[q] == '_'))
        ++q;
      return std::pair{k, q};
    }
  }
  return std::nullopt;
}

struct block {
  std::string language;
  std::string content;
};

} // namespace

response_parse parse_response(std::string_view text, const response_parse_options& opt) {
  response_parse r;
  auto problem = [&](format_problem p, std::string detail) {
    r.ok = false;
    r.problem = p;
    r.detail = std::move(detail);
    return r;
  };
  if (opt.max_chars > 0 && text.size() > opt.max_chars)
    return problem(format_problem::too_long, "the response has " + std::to_string(text.size()) +
                                                 " bytes, more than prompt.max_response_chars = " + std::to_string(opt.max_chars));
  if (trim(text).empty())
    return problem(format_problem::empty, "the response is empty");

  std::vector<block> blocks;
  std::optional<fence> open;
  std::size_t open_line = 0;
  block cur;
  // Headings: (section index, byte offset where its text starts, offset of the heading line).
  struct mark {
    std::size_t section;
    std::size_t text_begin;
    std::size_t line_begin;
  };
  std::vector<mark> marks;
  std::vector<bool> seen(opt.sections.size(), false);
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    auto nl = text.find('\n', pos);
    std::size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    ++line_no;
    if (open) {
      if (closes(*open, line)) {
        blocks.push_back(std::move(cur));
        cur = {};
        open.reset();
      } else {
        std::size_t k = 0;
        while (k < open->indent && k < line.size() && line[k] == ' ')
          ++k;
        cur.content.append(line.substr(k));
        cur.content += '\n';
      }
    } else if (auto f = fence_of(line); f && !(f->ch == '`' && f->info.find('`') != std::string_view::npos)) {
      open = f;
      open_line = line_no;
      auto word = f->info.substr(0, std::min(f->info.size(), f->info.find_first_of(" \t{")));
      cur.language.assign(word);
      std::transform(cur.language.begin(), cur.language.end(), cur.language.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    } else if (auto h = heading_of(line, opt.sections); h && !seen[h->first]) {
      seen[h->first] = true;
      marks.push_back({h->first, pos + h->second, pos});
    }
    if (nl == std::string_view::npos)
      break;
    pos = nl + 1;
  }
  if (open)
    return problem(format_problem::unterminated_fence,
                   "the code fence opened on line " + std::to_string(open_line) + " is never closed");
  bool any_python = false;
  const block* chosen = nullptr;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const auto& l = it->language;
    if (!(l.empty() || l == "python" || l == "py" || l == "python3"))
      continue;
    any_python = true;
    if (defines_model_new(it->content)) {
      chosen = &*it;
      break;
    }
  }
  if (!any_python)
    return problem(format_problem::no_code_block, "the response has no fenced Python code block");
  if (chosen == nullptr)
    return problem(format_problem::no_model_new, "no code block defines class ModelNew at the top level");
  if (opt.require_sections) {
    std::string missing;
    for (std::size_t k = 0; k < opt.sections.size(); ++k)
      if (!seen[k])
        missing += (missing.empty() ? "\"" : ", \"") + opt.sections[k] + "\"";
    if (!missing.empty())
      return problem(format_problem::missing_section, "the response lacks the section(s) " + missing);
  }
  r.ok = true;
  r.response.code = chosen->content;
  r.response.language = chosen->language;
  for (std::size_t k = 0; k < opt.sections.size(); ++k) {
    auto m = std::find_if(marks.begin(), marks.end(), [&](const mark& x) { return x.section == k; });
    if (m == marks.end())
      continue;
    std::size_t stop = text.size();
    for (const auto& other : marks)
      if (other.line_begin > m->line_begin)
        stop = std::min(stop, other.line_begin);
    std::string body{trim(text.substr(m->text_begin, stop - std::min(stop, m->text_begin)))};
    body.erase(std::remove(body.begin(), body.end(), '\r'), body.end());
    r.response.sections.emplace_back(opt.sections[k], std::move(body));
  }
  return r;
}

verdict format_error_verdict(const response_parse& parse, const reward_options& reward, std::string hardware) {
  verdict v;
  v.status = verdict_status::format_error;
  v.correct = false;
  v.checks_failed = {std::string{"format:"} + to_string(parse.problem)};
  v.message = parse.message();
  v.hardware = std::move(hardware);
  v.reward = compute_reward(v, reward);
  return v;
}

} // namespace crucible::env
