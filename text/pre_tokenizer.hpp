// text/pre_tokenizer.hpp: the pieces of byte-level BPE that the tokenizer and the trainer share:
// the known split patterns as hand-written matchers, and GPT-2's byte <-> character alphabet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace crucible::policy {

/// The pre-tokenizer regexes of the supported model families. Each is matched by hand (no
/// regex engine), with leftmost-first alternation and backtracking as Oniguruma does.
enum class split_pattern : std::uint8_t {
  gpt2,   ///< GPT-2's ByteLevel regex: 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  qwen2,  ///< Qwen2/Qwen2.5: (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
  llama3, ///< Llama 3 (tiktoken cl100k): as qwen2 but \p{N}{1,3}
};

/// The regex source of `p`, exactly as tokenizer.json spells it (after JSON unescaping).
std::string_view pattern_regex(split_pattern p) noexcept;
/// The pattern whose regex source is `regex`, or nullopt for any other text.
std::optional<split_pattern> pattern_from_regex(std::string_view regex) noexcept;
/// "gpt2", "qwen2" or "llama3".
const char* pattern_name(split_pattern p) noexcept;

/// End (byte offset) of the piece of `text` that pattern `p` matches at `start`
/// (`start < text.size()`); always greater than `start`. Invalid UTF-8 bytes are taken one at a
/// time and classed with punctuation ([^\s\p{L}\p{N}]).
std::size_t piece_end(split_pattern p, std::string_view text, std::size_t start) noexcept;

/// Calls `emit(piece)` for each consecutive piece of `text` under `p`; the pieces cover it.
template <class Emit>
void split_pieces(split_pattern p, std::string_view text, Emit&& emit) {
  for (std::size_t i = 0; i < text.size();) {
    std::size_t e = piece_end(p, text, i);
    emit(text.substr(i, e - i));
    i = e;
  }
}

/// GPT-2's byte-level alphabet: the printable character that stands for byte `b`.
char32_t byte_to_char(std::uint8_t b) noexcept;
/// The byte that character `c` stands for, or -1 when `c` is not in the alphabet.
int char_to_byte(char32_t c) noexcept;
/// `raw` bytes spelled in the byte-level alphabet (how tokenizer.json writes vocabulary).
std::string bytes_to_token(std::string_view raw);
/// The bytes a token spelled in the byte-level alphabet stands for, or nullopt if some
/// character is outside the alphabet (or the text is not valid UTF-8).
std::optional<std::string> token_to_bytes(std::string_view token);

} // namespace crucible::policy
