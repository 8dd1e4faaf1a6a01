// text/chat_templates.hpp: chat templates (Jinja source, as tokenizer_config.json holds them)
// that crucible writes for the presets of published models. No torch types.
#pragma once

namespace crucible::policy {

/// Qwen2.5 instruct models' chat template, byte for byte (ChatML, a default system prompt,
/// tool calls); needs the tokens `<|im_start|>` and `<|im_end|>`.
extern const char* const qwen25_chat_template;

} // namespace crucible::policy
