// text/tokenizer_impl.hpp: the tables behind policy::tokenizer, shared by its loader
// (tokenizer_load.cpp) and its encoder (tokenizer.cpp). Internal to text/.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/string_map.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/tokenizer.hpp"

namespace crucible::policy::detail {

/// Merge table: (left id, right id) -> (rank, merged id), open addressing on a 64-bit key.
class merge_map final {
public:
  struct value {
    std::uint32_t rank;
    std::int32_t id;
  };

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < n * 2)
      cap <<= 1;
    keys_.assign(cap, empty);
    values_.assign(cap, {});
    mask_ = cap - 1;
  }

  /// A later entry for the same pair replaces the earlier one, as in `tokenizers`.
  void insert(std::int32_t a, std::int32_t b, value v) {
    std::uint64_t k = key(a, b);
    for (std::size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == empty || keys_[i] == k) {
        size_ += keys_[i] == empty ? 1 : 0;
        keys_[i] = k;
        values_[i] = v;
        return;
      }
    }
  }

  const value* find(std::int32_t a, std::int32_t b) const noexcept {
    if (keys_.empty())
      return nullptr;
    std::uint64_t k = key(a, b);
    for (std::size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k)
        return &values_[i];
      if (keys_[i] == empty)
        return nullptr;
    }
  }

  std::size_t size() const noexcept { return size_; }

private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};
  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  std::size_t slot(std::uint64_t k) const noexcept {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }

  std::vector<std::uint64_t> keys_;
  std::vector<value> values_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

/// Word cache shared by concurrent encode calls: shards with reader/writer locks. Like
/// `tokenizers`, it stops admitting words when full instead of evicting.
class word_cache final {
public:
  static constexpr std::size_t max_word_bytes = 256;
  static constexpr std::size_t capacity = 1 << 16; // words; a few MB of memory

  /// Appends the cached ids of `word` to `out`; false if it is not cached.
  bool get(std::string_view word, std::vector<std::int32_t>& out) const {
    const auto& s = shards_[shard_of(word)];
    std::shared_lock lock{s.mutex};
    auto it = s.map.find(word);
    if (it == s.map.end())
      return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  /// Caches the ids of `word` (short words only, while there is room).
  void put(std::string_view word, std::span<const std::int32_t> ids) const {
    if (word.size() > max_word_bytes || full_.load(std::memory_order_relaxed))
      return;
    auto& s = shards_[shard_of(word)];
    std::unique_lock lock{s.mutex};
    if (s.map.size() >= capacity / shard_count) {
      full_.store(true, std::memory_order_relaxed);
      return;
    }
    s.map.emplace(std::string{word}, std::vector<std::int32_t>(ids.begin(), ids.end()));
  }

private:
  static constexpr std::size_t shard_count = 64;
  static std::size_t shard_of(std::string_view w) { return string_hash{}(w) % shard_count; }
  struct shard {
    mutable std::shared_mutex mutex;
    string_map<std::vector<std::int32_t>> map;
  };
  mutable std::array<shard, shard_count> shards_;
  mutable std::atomic<bool> full_{false};
};

/// Added-token matcher: a byte trie scanned leftmost-longest, as `tokenizers`' Aho-Corasick
/// automaton with MatchKind::LeftmostLongest finds them.
class token_trie final {
public:
  void add(std::string_view text, std::int32_t token) {
    if (nodes_.empty())
      nodes_.emplace_back();
    std::size_t n = 0;
    for (unsigned char b : text) {
      auto& kids = nodes_[n].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == b; });
      if (it != kids.end()) {
        n = it->second;
        continue;
      }
      kids.emplace_back(b, static_cast<std::uint32_t>(nodes_.size()));
      first_bytes_[b] = true;
      nodes_.emplace_back();
      n = nodes_.size() - 1;
    }
    if (nodes_[n].token < 0)
      nodes_[n].token = token;
  }

  bool empty() const noexcept { return nodes_.size() <= 1; }

  /// The leftmost match at or after `from`: (start, end, token index), or start == npos.
  struct match {
    std::size_t start = std::string_view::npos, end = 0;
    std::int32_t token = -1;
  };
  match find(std::string_view s, std::size_t from) const {
    for (std::size_t i = from; i < s.size(); ++i) {
      if (!first_bytes_[static_cast<unsigned char>(s[i])])
        continue;
      match m;
      std::size_t n = 0;
      for (std::size_t j = i; j < s.size(); ++j) {
        const auto& kids = nodes_[n].kids;
        auto b = static_cast<unsigned char>(s[j]);
        auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == b; });
        if (it == kids.end())
          break;
        n = it->second;
        if (nodes_[n].token >= 0) {
          m.start = i;
          m.end = j + 1;
          m.token = nodes_[n].token;
        }
      }
      if (m.token >= 0)
        return m;
    }
    return {};
  }

private:
  struct node {
    std::vector<std::pair<unsigned char, std::uint32_t>> kids;
    std::int32_t token = -1;
  };
  std::vector<node> nodes_;
  std::array<bool, 256> first_bytes_{};
};

/// One entry of tokenizer.json's added_tokens.
struct added_token {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

/// One step of the pre-tokenizer: a Split with a known pattern, or ByteLevel (which may add a
/// prefix space and split with the GPT-2 pattern).
struct pre_step {
  bool byte_level = false;
  split_pattern pattern = split_pattern::gpt2;
  bool use_regex = false;
  bool add_prefix_space = false;
};

/// Finds an id by its spelling without a second copy of the strings: open addressing over ids,
/// the strings staying in the vector (indexed by id) that the index was built over. That vector
/// must not change afterwards.
class spelling_index final {
public:
  /// Indexes every id with use[id] != 0; returns the first spelling that two ids share, or
  /// nullptr when all are distinct.
  const std::string* build(const std::vector<std::string>& keys, const std::vector<std::uint8_t>& use,
                           std::uint8_t bit);
  /// The id spelled `s`, or -1.
  std::int32_t find(std::string_view s) const noexcept;

private:
  const std::vector<std::string>* keys_ = nullptr;
  std::vector<std::int32_t> slots_;
  std::vector<std::uint32_t> tags_;
  std::size_t mask_ = 0;
};

} // namespace crucible::policy::detail

namespace crucible::policy {

// The loaded tokenizer.json, in the order `tokenizers` applies it: about 25 members because each
// stage of its pipeline (the vocabulary and added tokens, the BPE model, the normalizer, the
// pre-tokenizer, the added-token split, the post-processor, the decoder, tokenizer_config.json's
// special tokens and template) keeps its own tables, each read by the one function of that stage
// below. Grouping them into structs per stage would only add a name to every lookup on the
// encode path.
struct tokenizer::impl {
  /// Per id: the model vocabulary's spelling and what the ByteLevel decoder makes of it;
  /// added tokens override both (added_text, added_bytes), as `tokenizers` prefers them.
  std::vector<std::string> model_token;
  std::vector<std::string> model_bytes;
  std::vector<std::uint8_t> flags; // id_* bits
  std::unordered_map<std::int32_t, std::string> added_text;
  std::unordered_map<std::int32_t, std::string> added_bytes;
  string_map<std::int32_t> added_ids;   // added-token content -> id
  detail::spelling_index model_ids;     // model spelling -> id
  detail::spelling_index byte_ids;      // model tokens in the byte alphabet, by their bytes
  std::array<std::int32_t, 256> single_byte{};
  detail::merge_map merges;
  bool ignore_merges = false;
  std::int32_t unk_id = -1;
  bool fuse_unk = false;

  bool nfc = false;
  std::vector<detail::pre_step> pre_steps;
  std::vector<detail::added_token> added;
  detail::token_trie raw_trie;        // added tokens matched on the original text
  detail::token_trie normalized_trie; // added tokens matched after normalization
  std::vector<std::int32_t> prefix, suffix; // post-processor template around the sequence
  bool byte_level_decoder = false;

  std::optional<std::int32_t> bos, eos, pad;
  std::string chat_template;
  detail::word_cache cache;

  static constexpr std::uint8_t id_model = 1;    // has a model vocabulary entry
  static constexpr std::uint8_t id_bytes = 2;    // ... spelled in the byte alphabet
  static constexpr std::uint8_t id_added = 4;    // is an added token
  static constexpr std::uint8_t id_special = 8;  // is (spelled like) a special added token

  bool has(std::int32_t id, std::uint8_t bit) const noexcept {
    auto k = static_cast<std::size_t>(id);
    return id >= 0 && k < flags.size() && (flags[k] & bit) != 0;
  }

  void bpe(std::string_view word, std::vector<std::int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<std::int32_t>& out) const;
  void pre_tokenize(std::string_view text, std::size_t step, std::vector<std::int32_t>& out) const;
  template <class Emit>
  void split_added(std::string_view text, const detail::token_trie& trie, Emit&& emit) const;
};

} // namespace crucible::policy
