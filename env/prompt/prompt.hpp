// env/prompt/prompt.hpp: the contrastive prompt (CUDA-L1): a task, its reference code and earlier scored
// implementations in; the text the policy is sampled on out, within a token budget, wrapped in
// the model's chat template when it has one. The text pieces come from a prompt-template YAML file
// (configs/prompts/contrastive.yaml; format in docs/prompts.md).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"

namespace crucible::env {

/// The text pieces of a prompt, as read and checked from a template file. Plain value.
struct prompt_template {
  std::string origin;                 ///< the file, for messages
  std::vector<std::string> sections;  ///< headings the response must carry, in order
  std::string system;                 ///< system message; {hardware}
  std::string user;                   ///< layout of the user message; {task}, {exemplars}, {instructions}
  std::string task;                   ///< {task_name}, {hardware}, {reference_code}, {fence}
  std::string exemplars_header;       ///< before the exemplars; {count}, {hardware}
  std::string exemplar;               ///< one exemplar; {index}, {speedup}, {hardware}, {code}, {fence}
  std::string no_exemplars;           ///< in place of the exemplars when there are none; {hardware}
  std::string instructions;           ///< sections, requirements, restrictions; {hardware}
  std::string truncation_marker;      ///< ends a shortened exemplar; {omitted_lines}, {omitted_chars}
};

/// Decodes a template file's text. errc::config naming `origin`, the line and the key: a missing
/// or empty piece, an unknown key or placeholder, a required placeholder absent (`{code}` in
/// `exemplar`, ...), an unbalanced brace, a section heading that `instructions` does not mention.
result<prompt_template> parse_prompt_template(std::string_view yaml_text, const std::string& origin);

/// Reads and decodes a template file; errc::not_found / errc::io name it.
result<prompt_template> load_prompt_template(const std::filesystem::path& file);

/// The template file `prompt.template` names (default configs/prompts/contrastive.yaml): an
/// absolute path as it is; a relative one in the working directory, else in the checkout, found
/// by walking up from the executable's directory and then from the working directory.
/// errc::not_found names where it looked.
result<std::filesystem::path> resolve_prompt_template(const std::string& configured);

/// The feedback template `prompt.feedback_template` names (default configs/prompts/feedback.yaml;
/// env/prompt/feedback.hpp), looked up as resolve_prompt_template looks.
result<std::filesystem::path> resolve_feedback_template(const std::string& configured);

/// One earlier implementation shown to the policy.
struct exemplar_code {
  std::string code;     ///< Python source of a ModelNew
  double speedup = 1.0; ///< measured speedup over the reference
  std::string hardware; ///< device model it was measured on
};

/// What a prompt is built from.
struct prompt_request {
  std::string task_name;                ///< e.g. "level1/19_ReLU"
  std::string reference_code;           ///< the task file's source
  std::string hardware;                 ///< the device model the new candidate will be timed on
  std::vector<exemplar_code> exemplars; ///< any order; shown by increasing speedup
};

/// What became of one requested exemplar.
struct exemplar_placement {
  bool kept = false;           ///< shown in the prompt
  bool shortened = false;      ///< shown with its tail cut (see truncation_marker)
  std::size_t shown_bytes = 0; ///< bytes of its code shown (before the marker); 0 when dropped
};

/// A rendered prompt.
struct built_prompt {
  std::string text;    ///< what the policy is sampled on (chat template applied, when used)
  std::string system;  ///< the system message
  std::string user;    ///< the user message
  std::size_t tokens = 0; ///< the token counter's size of `text`
  std::vector<exemplar_placement> exemplars; ///< one per requested exemplar, in request order
  /// The chat the text renders, as role and content: system and user, then (continue_episode)
  /// each earlier turn's answer and feedback as they are shown (shortened ones as their note).
  std::vector<std::pair<std::string, std::string>> messages;
};

/// One earlier turn of a multi-turn episode, as the next turn's prompt shows it.
struct episode_turn {
  std::string answer;   ///< the policy's whole response
  std::string feedback; ///< the verdict on it, as the next user message (render_feedback)
};

/// Counts the tokens of a text: the policy tokenizer's encode size (with the special tokens
/// written in the text counted as one each), or any deterministic stand-in in tests.
using token_counter = std::function<std::size_t(std::string_view)>;

/// How the two messages become one text.
struct chat_format {
  /// Jinja source of the model's chat template (tokenizer_config.json `chat_template`, as
  /// policy::tokenizer::chat_template() returns it); "" : none, plain text.
  std::string chat_template;
  /// The tokenizer's special tokens by role, as transformers passes them to the template
  /// ("bos_token" → "<|begin_of_text|>", "eos_token", ...); only those the tokenizer defines.
  std::map<std::string, std::string> special_tokens;
};

/// Builds prompts for one run. Immutable after create(); build() is const and may be called from
/// several threads at once if the token counter may.
class prompt_builder final {
public:
  /// `cfg` supplies the budget and the chat-template mode (with `chat_template: none`, or no
  /// template in `chat`, the text is the system message, a blank line and the user message).
  /// errc::config for budget knobs out of range; the chat template's parse error (errc::invalid_arg
  /// or errc::unsupported, naming line and column) when it cannot be rendered.
  static result<prompt_builder> create(prompt_template tmpl, const prompt_config& cfg, const chat_format& chat,
                                       token_counter count);

  /// Renders the prompt for `req` within `prompt.max_tokens`: exemplars are first cut to
  /// `max_exemplar_chars` (when set); if the prompt is still too long, all shown exemplars are
  /// cut to the longest common length that fits (never below `min_exemplar_chars`, each cut
  /// ending in the truncation marker); if even that does not fit, the exemplar with the lowest
  /// speedup is dropped and the rest restored, and so on. errc::invalid_arg naming the budget and
  /// the size when even the prompt without exemplars exceeds it, or when the chat template fails.
  result<built_prompt> build(const prompt_request& req) const;

  /// The prompt of a multi-turn episode's next turn: `first` (what build() gave for its first
  /// turn), then per earlier turn the policy's answer (an assistant message) and the feedback on it
  /// (a user message, env/prompt/feedback.hpp), rendered as one chat with the generation prompt, within
  /// prompt.max_tokens. Older turns are shortened first: the oldest answer is replaced by a line
  /// saying it was left out, then the next, never the latest; then the oldest feedback, and so on.
  /// `tokens` and `text` are the result's; `exemplars` are first's. errc::invalid_arg naming the
  /// budget when even the first prompt and the latest turn do not fit, or when the chat template fails.
  result<built_prompt> continue_episode(const built_prompt& first, std::span<const episode_turn> turns) const;

  const prompt_template& templ() const noexcept;

  prompt_builder(prompt_builder&&) noexcept;
  prompt_builder& operator=(prompt_builder&&) noexcept;
  ~prompt_builder();

  struct impl;

private:
  explicit prompt_builder(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace crucible::env
