// env/prompt/feedback.hpp: the feedback of a multi-turn episode (docs/training.md, "Multi-turn episodes"):
// the verdict on the policy's last answer as the text of the next user message, from a template
// file (configs/prompts/feedback.yaml; format in docs/prompts.md), the evaluator's message cut to
// a budget.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "env/verdict.hpp"

namespace crucible::env {

/// The pieces of a feedback template, one a status. Plain value.
struct feedback_template {
  std::string origin; ///< the file, for messages
  std::size_t max_error_chars = 1200;
  std::string ok, slower, incorrect, compile_error, runtime_error, timeout, rejected, format_error;
};

/// Decodes a template file's text. errc::config naming `origin` and the key: a missing or empty
/// piece, an unknown key or placeholder, an unbalanced brace, a version other than 1.
result<feedback_template> parse_feedback_template(std::string_view yaml_text, const std::string& origin);

/// Reads and decodes a template file; errc::not_found / errc::io name it.
result<feedback_template> load_feedback_template(const std::filesystem::path& file);

/// The template `prompt.feedback_template` names (`configured`; env::resolve_feedback_template),
/// read and decoded.
result<feedback_template> load_configured_feedback_template(const std::string& configured);

/// `text` cut to `max_chars` bytes (never inside a UTF-8 character): its head and its tail (where
/// a traceback ends in the exception), joined by a line that says how much was left out.
std::string cut_middle(const std::string& text, std::size_t max_chars);

/// The candidate's profile (verdict::profile) as lines "  42.0%  NAME", largest first;
/// "(no profile)" where the verdict has none.
std::string profile_lines(const verdict& v);

/// The feedback on `v`, the verdict of turn `turn` (from 1) with `turns_left` turns to come.
std::string render_feedback(const feedback_template& t, const verdict& v, std::size_t turn, std::size_t turns_left);

} // namespace crucible::env
