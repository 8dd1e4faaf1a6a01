// env/prompt/response_parser.hpp: a policy response in, its answer sections and final code block out; a
// response without usable code becomes a `format_error` verdict that never reaches an evaluator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "env/verdict.hpp"

namespace crucible::env {

/// Why a response is unusable. Names (to_string) appear in verdict messages and checks_failed.
enum class format_problem : std::uint8_t {
  empty,              ///< nothing but whitespace
  too_long,           ///< longer than the configured maximum
  no_code_block,      ///< no fenced Python code block
  unterminated_fence, ///< a code fence opened and never closed
  no_model_new,       ///< no code block defines `class ModelNew` at the top level
  missing_section,    ///< a required section heading is absent
};

/// "empty", "too_long", "no_code_block", "unterminated_fence", "no_model_new", "missing_section".
const char* to_string(format_problem p) noexcept;

/// Parser settings; from_config() fills them from `prompt:` and the template's sections.
struct response_parse_options {
  std::vector<std::string> sections = {"Performance Analysis", "Algorithm Design", "Code Implementation"};
  bool require_sections = true;
  std::size_t max_chars = 200000; ///< bytes
};

/// The settings for `cfg` with the section headings a prompt template asks for.
response_parse_options parse_options_from(const prompt_config& cfg, std::vector<std::string> sections);

/// A usable response.
struct parsed_response {
  std::string code;     ///< the chosen code block's content (LF line ends, fence indentation removed)
  std::string language; ///< its info string's first word ("python", "py", or "")
  /// (heading, text) of each section found, in the order of the options' list; text is what lies
  /// between the heading and the next recognised heading (trimmed), code blocks included.
  std::vector<std::pair<std::string, std::string>> sections;
};

/// The outcome of parsing: a usable response, or the problem and a sentence about it.
struct response_parse {
  bool ok = false;
  parsed_response response;     ///< when ok
  format_problem problem{};     ///< when !ok
  std::string detail;           ///< when !ok: what is wrong, for people

  /// "no_model_new: no code block defines class ModelNew at the top level"
  std::string message() const;
};

/// Parses a response in one pass over its lines (linear time; CRLF read as LF).
///
/// Code blocks: CommonMark-style fences of three or more backticks or tildes (indentation allowed,
/// as inside list items), closed by a fence of the same character at least as long; a longer
/// fence can therefore hold ``` lines. The code is the *last* block whose info string is empty,
/// `python`, `py` or `python3` and that defines `class ModelNew` at the top level (line start,
/// outside strings: a `class ModelNew` in a comment, a string or a docstring does not count).
/// Blocks in other languages (cuda, cpp, bash) are ignored.
///
/// Sections: a line outside code blocks is a heading when, stripped of Markdown decoration
/// (`#`s, a list number `1.`/`1)`, `-`/`*` bullets, `**`/`__`/`*`/`_` emphasis, a trailing `:`),
/// it equals a section name case-insensitively, or starts with the name followed by `:`
/// ("**Performance Analysis:** the kernel ..."). The first heading of each name counts.
response_parse parse_response(std::string_view text, const response_parse_options& opt);

/// The verdict of an unusable response: status format_error, not correct, reward
/// `reward.format_error`, checks_failed ["format:<problem>"], the message from message().
/// `hardware` names the device the candidate would have run on (may be empty).
verdict format_error_verdict(const response_parse& parse, const reward_options& reward, std::string hardware = "");

} // namespace crucible::env
