// text/bpe_trainer.hpp: trains a byte-level BPE tokenizer on local text files and writes it
// as a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json), so the
// quickstart needs no download.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "text/pre_tokenizer.hpp"

namespace crucible::policy {

/// ChatML, as Qwen2 writes it: <|im_start|>ROLE\nCONTENT<|im_end|>\n per message.
extern const char* const chatml_template;

/// What to train. Defaults give a Qwen2-style tokenizer with ChatML special tokens.
struct bpe_train_options {
  /// Target vocabulary size, special tokens and the 256 byte tokens included. Training stops
  /// earlier when no pair is left to merge.
  std::size_t vocab_size = 0;
  /// Added as special tokens with ids 0, 1, ... in this order.
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  /// Pairs seen fewer times than this are never merged (0: every pair may be).
  std::uint64_t min_frequency = 0;
  /// Pre-tokenizer pattern; the written tokenizer.json uses the matching Hugging Face layout.
  split_pattern pattern = split_pattern::qwen2;
  /// NFC-normalize text before pre-tokenization (Qwen2 does).
  bool nfc = true;
  /// tokenizer_config.json fields: must be among `special_tokens` (or empty for none).
  std::string eos_token = "<|im_end|>";
  std::string pad_token = "<|endoftext|>";
  std::string chat_template = chatml_template;
};

/// A trained model: token spellings (byte-level alphabet) by id and merges by rank.
struct bpe_model {
  std::vector<std::string> vocab;
  std::vector<std::pair<std::int32_t, std::int32_t>> merges;
  std::size_t special_count = 0;
};

/// Counts words, then learns merges the way `tokenizers`' BpeTrainer does (with the byte-level
/// initial alphabet): ids are special tokens, then the 256 byte characters by code point, then
/// merged tokens; each step merges the most frequent pair, ties going to the smallest
/// (left id, right id); pair counts are updated incrementally from the words that changed.
/// Not thread-safe; one trainer per thread.
class bpe_trainer {
public:
  explicit bpe_trainer(bpe_train_options options);

  /// Checks the options: vocabulary size, special tokens, eos/pad names. errc::invalid_arg.
  result<void> validate() const;

  /// Counts the words of `text`, taken line by line with line endings kept (as
  /// `tokenizers`' train_from_files reads files), NFC-normalized and pre-tokenized.
  void feed(std::string_view text);

  /// Reads and feeds one file. errc::not_found / errc::io name it; errc::corrupt if it is not
  /// UTF-8 text (with the byte offset).
  result<void> feed_file(const std::filesystem::path& path);

  /// Learns the merges from everything fed so far.
  bpe_model train() const;

  std::uint64_t bytes_fed() const noexcept { return bytes_; }
  std::size_t unique_words() const noexcept { return counts_.size(); }
  const bpe_train_options& options() const noexcept { return options_; }

private:
  bpe_train_options options_;
  std::vector<std::pair<std::string, std::uint64_t>> counts_; // word bytes, count
  std::vector<std::size_t> index_;                            // open-addressing table over counts_
  std::uint64_t bytes_ = 0;

  void count(std::string_view word);
};

/// tokenizer.json for `model` in Hugging Face's format (loadable by tokenizers.Tokenizer and
/// transformers.AutoTokenizer).
std::string tokenizer_json(const bpe_model& model, const bpe_train_options& options);
/// tokenizer_config.json: eos/pad tokens, special tokens and the chat template.
std::string tokenizer_config_json(const bpe_model& model, const bpe_train_options& options);

/// Writes tokenizer.json and tokenizer_config.json into `dir` (created if missing), each
/// replaced atomically.
result<void> write_tokenizer_dir(const bpe_model& model, const bpe_train_options& options,
                                 const std::filesystem::path& dir);

} // namespace crucible::policy
