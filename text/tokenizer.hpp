// text/tokenizer.hpp: byte-level BPE tokenizer read from a Hugging Face tokenizer.json. Text in,
// token ids out (and back), identical to the `tokenizers` library for the supported families.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace crucible::policy {

/// A byte-level BPE tokenizer as described by a Hugging Face `tokenizer.json`.
///
/// Supported (everything else is refused at load with an error that quotes it):
///  - model: BPE with merges as "a b" strings or ["a", "b"] pairs, `ignore_merges`,
///    optional `unk_token`/`fuse_unk`; no dropout, byte fallback or subword affixes;
///  - normalizer: none or NFC (alone or in a Sequence);
///  - pre-tokenizer: ByteLevel (GPT-2 pattern, `add_prefix_space`), or a Sequence of Split with
///    the Qwen2 or Llama 3 (cl100k) pattern and ByteLevel(use_regex=false);
///  - added tokens (special or not, normalized or not, lstrip/rstrip/single_word), matched in
///    the text before pre-tokenization, leftmost-longest, as `tokenizers` does;
///  - post-processor: none, ByteLevel, TemplateProcessing (its `single` template), or a
///    Sequence of these; decoder: ByteLevel or none (tokens joined by spaces).
/// `truncation` and `padding` are ignored: encode never truncates or pads.
///
/// Thread-safety: after construction every member is const and safe to call concurrently
/// from many threads; encode shares a word cache guarded by sharded reader/writer locks.
/// Move-only.
class tokenizer final {
public:
  /// Loads `path`: a directory holding tokenizer.json (and tokenizer_config.json, when present,
  /// for bos/eos/pad tokens and the chat template), or a tokenizer.json file itself.
  /// errc::not_found without tokenizer.json; errc::corrupt for bad JSON or a missing or
  /// inconsistent key (named in the message); errc::unsupported for a model, normalizer,
  /// pattern, pre-tokenizer, post-processor or decoder outside the list above (quoted).
  static result<tokenizer> load(const std::filesystem::path& path);

  /// Builds a tokenizer from the text of a tokenizer.json and, optionally, of a
  /// tokenizer_config.json (empty: none). `source` names the files in error messages.
  static result<tokenizer> from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                                     std::string_view source = "tokenizer.json");

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  /// Token ids of UTF-8 `text`, as `tokenizers`' `encode(text, add_special_tokens=add_special)`
  /// returns them. Added and special tokens written in the text become their ids. With
  /// `add_special`, the post-processor's template adds its tokens (e.g. Llama 3's BOS; Qwen2
  /// adds none). Bytes that are not valid UTF-8 are encoded as their byte tokens.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = true) const;

  /// Text of `ids`, as `tokenizers`' `decode(ids, skip_special_tokens=skip_special)`: ids
  /// outside the vocabulary are skipped, and bytes that do not form valid UTF-8 become U+FFFD.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  /// The id of `token`, spelled as in tokenizer.json (added tokens first, then the vocabulary:
  /// "<|im_end|>", "Ġthe").
  std::optional<std::int32_t> id_of(std::string_view token) const;
  /// The token spelled as in tokenizer.json, or nullopt for an id with no token.
  std::optional<std::string_view> token_of(std::int32_t id) const;
  /// Whether `id` is a special added token (skipped by decode with skip_special).
  bool is_special(std::int32_t id) const;

  /// One more than the largest id: the number of rows an embedding table needs. Equals the
  /// number of tokens when ids are dense, as they are for trained and published tokenizers.
  std::size_t vocab_size() const;

  /// Tokens named by tokenizer_config.json (bos_token, eos_token, pad_token), if any.
  std::optional<std::int32_t> bos_id() const;
  std::optional<std::int32_t> eos_id() const;
  std::optional<std::int32_t> pad_id() const;

  /// tokenizer_config.json's `chat_template` (Jinja source, not rendered here), or "".
  const std::string& chat_template() const;

  /// The special tokens a chat template sees, as transformers' special_tokens_map gives them:
  /// "bos_token", "eos_token" and "pad_token" spelled as in tokenizer.json, for those the
  /// tokenizer defines (env::chat_format::special_tokens).
  std::map<std::string, std::string> special_tokens_map() const;

  /// A one-line description: pattern, normalizer, vocabulary and merge counts.
  std::string describe() const;

  struct impl;

private:
  explicit tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace crucible::policy
