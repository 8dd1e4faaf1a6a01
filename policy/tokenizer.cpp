// policy/tokenizer.cpp: reads tokenizer.json into flat tables, then encodes text the way
// `tokenizers` does: added tokens split out first, NFC on the rest, pre-tokenizer pieces, BPE
// merges by rank on each piece's bytes (through a word cache), post-processor template.
#include "policy/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "core/string_map.hpp"
#include "core/utf8.hpp"
#include "policy/pre_tokenizer.hpp"
#include "policy/unicode.hpp"

namespace crucible::policy {

namespace {

// Merge table: (left id, right id) -> (rank, merged id), open addressing on a 64-bit key.
class merge_map {
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

  // A later entry for the same pair replaces the earlier one, as in `tokenizers`.
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

// Word cache shared by concurrent encode calls: shards with reader/writer locks. Like
// `tokenizers`, it stops admitting words when full instead of evicting.
class word_cache {
public:
  static constexpr std::size_t max_word_bytes = 256;
  static constexpr std::size_t capacity = 1 << 18;

  bool get(std::string_view word, std::vector<std::int32_t>& out) const {
    const auto& s = shards_[shard_of(word)];
    std::shared_lock lock{s.mutex};
    auto it = s.map.find(word);
    if (it == s.map.end())
      return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

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

// Added-token matcher: a byte trie scanned leftmost-longest, as `tokenizers`' Aho-Corasick
// automaton with MatchKind::LeftmostLongest finds them.
class token_trie {
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

  // The leftmost match at or after `from`: (start, end, token index), or start == npos.
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

struct added_token {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One step of the pre-tokenizer: a Split with a known pattern, or ByteLevel (which may add a
// prefix space and split with the GPT-2 pattern).
struct pre_step {
  bool byte_level = false;
  split_pattern pattern = split_pattern::gpt2;
  bool use_regex = false;
  bool add_prefix_space = false;
};

// Decodes bytes to UTF-8 text, replacing each maximal ill-formed subsequence with U+FFFD, as
// Rust's String::from_utf8_lossy (and Python's errors="replace") do.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    auto u = decode_utf8(s, i);
    if (u.len != 0) {
      out.append(s.substr(i, u.len));
      i += u.len;
      continue;
    }
    // Length of the maximal prefix of a well-formed sequence starting at i (at least 1).
    unsigned lo = 0x80, hi = 0xBF;
    std::size_t need = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 == 0xE0) { need = 2; lo = 0xA0; }
    else if (b0 >= 0xE1 && b0 <= 0xEC) need = 2;
    else if (b0 == 0xED) { need = 2; hi = 0x9F; }
    else if (b0 >= 0xEE && b0 <= 0xEF) need = 2;
    else if (b0 == 0xF0) { need = 3; lo = 0x90; }
    else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
    else if (b0 == 0xF4) { need = 3; hi = 0x8F; }
    std::size_t j = i + 1;
    for (std::size_t k = 0; k < need && j < s.size(); ++k) {
      auto c = static_cast<unsigned char>(s[j]);
      if (c < (k == 0 ? lo : 0x80) || c > (k == 0 ? hi : 0xBF))
        break;
      ++j;
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

bool is_word_char(char32_t cp) {
  return cp == '_' || (unicode::flags(cp) & (unicode::letter | unicode::number)) != 0;
}

} // namespace

struct tokenizer::impl {
  // Vocabulary, by id. `token` is the spelling in tokenizer.json; `bytes` what the decoder
  // makes of it. Ids without a token have present == false.
  std::vector<std::string> token;
  std::vector<std::string> bytes;
  std::vector<std::uint8_t> present;
  std::vector<std::uint8_t> special;
  string_map<std::int32_t> added_ids; // added-token content -> id
  string_map<std::int32_t> model_ids; // model vocabulary spelling -> id
  string_map<std::int32_t> byte_ids;  // model tokens in the byte alphabet, by their bytes
  std::array<std::int32_t, 256> single_byte{};
  merge_map merges;
  bool ignore_merges = false;
  std::int32_t unk_id = -1;
  bool fuse_unk = false;

  bool nfc = false;
  std::vector<pre_step> pre_steps;
  std::vector<added_token> added;
  token_trie raw_trie;        // added tokens matched on the original text
  token_trie normalized_trie; // added tokens matched after normalization
  std::vector<std::int32_t> prefix, suffix; // post-processor template around the sequence
  bool byte_level_decoder = false;

  std::optional<std::int32_t> bos, eos, pad;
  std::string chat_template;
  word_cache cache;

  void bpe(std::string_view word, std::vector<std::int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<std::int32_t>& out) const;
  void pre_tokenize(std::string_view text, std::size_t step, std::vector<std::int32_t>& out) const;
  template <class Emit>
  void split_added(std::string_view text, const token_trie& trie, Emit&& emit) const;
};

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

class loader {
public:
  loader(tokenizer::impl& t, std::string source) : t_(t), source_(std::move(source)) {}

  result<void> load(const json_value& root) {
    if (!root.is_object())
      return corrupt("", "expected a JSON object at the top level");
    if (auto r = load_model(root); !r)
      return r;
    if (auto r = load_added(root); !r)
      return r;
    if (auto r = load_normalizer(root.find("normalizer")); !r)
      return r;
    if (auto r = load_pre_tokenizer(root.find("pre_tokenizer")); !r)
      return r;
    if (auto r = load_post_processor(root.find("post_processor"), "post_processor"); !r)
      return r;
    return load_decoder(root.find("decoder"), "decoder");
  }

private:
  crucible::error corrupt(std::string_view key, std::string_view what) const {
    return fail(errc::corrupt, source_, ": ", key, key.empty() ? "" : ": ", what);
  }
  crucible::error unsupported(std::string_view key, std::string_view what) const {
    return fail(errc::unsupported, source_, ": ", key, ": ", what);
  }

  static std::string quoted(std::string_view s) {
    std::string out = "'";
    out.append(s.substr(0, 200));
    if (s.size() > 200)
      out += "...";
    return out + "'";
  }

  // The "type" of a component object, or an error naming `key`.
  result<std::string> type_of(const json_value& v, const std::string& key) const {
    if (!v.is_object())
      return corrupt(key, "expected an object");
    const auto* t = v.find("type");
    if (t == nullptr || !t->is_string())
      return corrupt(key + ".type", "missing or not a string");
    return t->as_string();
  }

  result<bool> flag(const json_value& obj, std::string_view name, const std::string& key, bool fallback) const {
    const auto* v = obj.find(name);
    if (v == nullptr || v->is_null())
      return fallback;
    if (!v->is_bool())
      return corrupt(key + "." + std::string{name}, "expected true or false");
    return v->as_bool();
  }

  void set_token(std::int32_t id, const std::string& spelling) {
    auto n = static_cast<std::size_t>(id) + 1;
    if (t_.token.size() < n) {
      t_.token.resize(n);
      t_.bytes.resize(n);
      t_.present.resize(n, 0);
      t_.special.resize(n, 0);
    }
    t_.token[static_cast<std::size_t>(id)] = spelling;
    // The ByteLevel decoder maps a token's characters back to bytes when all of them are in
    // the alphabet, and otherwise takes the token's own UTF-8.
    auto raw = token_to_bytes(spelling);
    t_.bytes[static_cast<std::size_t>(id)] = raw ? std::move(*raw) : spelling;
    t_.present[static_cast<std::size_t>(id)] = 1;
  }

  result<std::int32_t> read_id(const json_value& v, const std::string& key) const {
    if (!v.is_int() || v.as_int() < 0 || v.as_int() > 0x7FFFFFFF)
      return corrupt(key, "expected a token id (a non-negative integer)");
    return static_cast<std::int32_t>(v.as_int());
  }

  result<void> load_model(const json_value& root) {
    const auto* model = root.find("model");
    if (model == nullptr || !model->is_object())
      return corrupt("model", model == nullptr ? "missing" : "expected an object");
    if (const auto* type = model->find("type"); type != nullptr) {
      if (!type->is_string())
        return corrupt("model.type", "expected a string");
      if (type->as_string() != "BPE")
        return unsupported("model.type", quoted(type->as_string()) + " is not supported (only byte-level BPE)");
    }
    const auto* vocab = model->find("vocab");
    if (vocab == nullptr || !vocab->is_object())
      return corrupt("model.vocab", vocab == nullptr ? "missing" : "expected an object of token: id");
    const auto* merges = model->find("merges");
    if (merges == nullptr || !merges->is_array())
      return corrupt("model.merges", merges == nullptr ? "missing" : "expected an array");
    if (const auto* d = model->find("dropout"); d != nullptr && !d->is_null() && !(d->is_number() && d->as_double() == 0.0))
      return unsupported("model.dropout", "BPE dropout is not supported");
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto* a = model->find(affix);
      if (a != nullptr && !a->is_null() && !(a->is_string() && a->as_string().empty()))
        return unsupported(std::string{"model."} + affix, quoted(a->is_string() ? a->as_string() : "?") + " is not supported");
    }
    auto byte_fallback = flag(*model, "byte_fallback", "model", false);
    if (!byte_fallback)
      return byte_fallback.error();
    if (*byte_fallback)
      return unsupported("model.byte_fallback", "true is not supported (byte-level BPE needs no byte fallback)");
    auto ignore = flag(*model, "ignore_merges", "model", false);
    if (!ignore)
      return ignore.error();
    t_.ignore_merges = *ignore;
    auto fuse = flag(*model, "fuse_unk", "model", false);
    if (!fuse)
      return fuse.error();
    t_.fuse_unk = *fuse;

    t_.single_byte.fill(-1);
    t_.model_ids.reserve(vocab->as_object().size());
    t_.byte_ids.reserve(vocab->as_object().size());
    for (const auto& m : vocab->as_object()) {
      auto id = read_id(m.value, "model.vocab." + m.key);
      if (!id)
        return id.error();
      t_.model_ids[m.key] = *id;
      set_token(*id, m.key);
      if (auto raw = token_to_bytes(m.key)) {
        if (raw->size() == 1)
          t_.single_byte[static_cast<unsigned char>((*raw)[0])] = *id;
        t_.byte_ids[*raw] = *id;
      }
    }

    if (const auto* unk = model->find("unk_token"); unk != nullptr && !unk->is_null()) {
      if (!unk->is_string())
        return corrupt("model.unk_token", "expected a string or null");
      auto it = t_.model_ids.find(unk->as_string());
      if (it == t_.model_ids.end())
        return corrupt("model.unk_token", quoted(unk->as_string()) + " is not in model.vocab");
      t_.unk_id = it->second;
    }

    const auto& list = merges->as_array();
    t_.merges.reserve(list.size());
    std::string merged;
    for (std::size_t rank = 0; rank < list.size(); ++rank) {
      const auto& m = list[rank];
      const std::string key = "model.merges[" + std::to_string(rank) + "]";
      std::string_view a, b;
      if (m.is_string()) {
        const auto& s = m.as_string();
        auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return corrupt(key, quoted(s) + " is not two tokens separated by one space");
        a = std::string_view{s}.substr(0, sp);
        b = std::string_view{s}.substr(sp + 1);
      } else if (m.is_array() && m.as_array().size() == 2 && m.as_array()[0].is_string() &&
                 m.as_array()[1].is_string()) {
        a = m.as_array()[0].as_string();
        b = m.as_array()[1].as_string();
      } else {
        return corrupt(key, "expected \"a b\" or [\"a\", \"b\"]");
      }
      auto ia = t_.model_ids.find(a);
      if (ia == t_.model_ids.end())
        return corrupt(key, quoted(a) + " is not in model.vocab");
      auto ib = t_.model_ids.find(b);
      if (ib == t_.model_ids.end())
        return corrupt(key, quoted(b) + " is not in model.vocab");
      merged.assign(a).append(b);
      auto im = t_.model_ids.find(merged);
      if (im == t_.model_ids.end())
        return corrupt(key, "the merged token " + quoted(merged) + " is not in model.vocab");
      t_.merges.insert(ia->second, ib->second, {static_cast<std::uint32_t>(rank), im->second});
    }
    return {};
  }

  result<void> load_added(const json_value& root) {
    const auto* list = root.find("added_tokens");
    if (list == nullptr || list->is_null())
      return {};
    if (!list->is_array())
      return corrupt("added_tokens", "expected an array");
    for (std::size_t i = 0; i < list->as_array().size(); ++i) {
      const auto& v = list->as_array()[i];
      const std::string key = "added_tokens[" + std::to_string(i) + "]";
      if (!v.is_object())
        return corrupt(key, "expected an object");
      added_token a;
      const auto* content = v.find("content");
      if (content == nullptr || !content->is_string() || content->as_string().empty())
        return corrupt(key + ".content", "missing or not a non-empty string");
      a.content = content->as_string();
      const auto* id = v.find("id");
      if (id == nullptr)
        return corrupt(key + ".id", "missing");
      auto rid = read_id(*id, key + ".id");
      if (!rid)
        return rid.error();
      a.id = *rid;
      for (auto [name, field, fallback] : {std::tuple{"special", &a.special, false}, {"normalized", &a.normalized, true},
                                           {"lstrip", &a.lstrip, false}, {"rstrip", &a.rstrip, false},
                                           {"single_word", &a.single_word, false}}) {
        auto f = flag(v, name, key, fallback);
        if (!f)
          return f.error();
        *field = *f;
      }
      set_token(a.id, a.content);
      t_.added_ids[a.content] = a.id;
      t_.added.push_back(std::move(a));
    }
    return {};
  }

  result<void> load_normalizer(const json_value* n) {
    if (n == nullptr || n->is_null())
      return {};
    auto type = type_of(*n, "normalizer");
    if (!type)
      return type.error();
    if (*type == "NFC") {
      t_.nfc = true;
      return {};
    }
    if (*type == "Sequence") {
      const auto* list = n->find("normalizers");
      if (list == nullptr || !list->is_array())
        return corrupt("normalizer.normalizers", "missing or not an array");
      for (std::size_t i = 0; i < list->as_array().size(); ++i) {
        const auto& item = list->as_array()[i];
        const std::string key = "normalizer.normalizers[" + std::to_string(i) + "]";
        auto t = type_of(item, key);
        if (!t)
          return t.error();
        if (*t != "NFC")
          return unsupported(key + ".type", quoted(*t) + " is not supported (supported: NFC)");
        t_.nfc = true;
      }
      return {};
    }
    return unsupported("normalizer.type", quoted(*type) + " is not supported (supported: NFC, or none)");
  }

  result<void> load_pre_step(const json_value& v, const std::string& key) {
    auto type = type_of(v, key);
    if (!type)
      return type.error();
    if (*type == "Sequence") {
      const auto* list = v.find("pretokenizers");
      if (list == nullptr || !list->is_array())
        return corrupt(key + ".pretokenizers", "missing or not an array");
      for (std::size_t i = 0; i < list->as_array().size(); ++i)
        if (auto r = load_pre_step(list->as_array()[i], key + ".pretokenizers[" + std::to_string(i) + "]"); !r)
          return r;
      return {};
    }
    pre_step step;
    if (*type == "ByteLevel") {
      step.byte_level = true;
      auto prefix = flag(v, "add_prefix_space", key, true);
      auto regex = flag(v, "use_regex", key, true);
      if (!prefix)
        return prefix.error();
      if (!regex)
        return regex.error();
      step.add_prefix_space = *prefix;
      step.use_regex = *regex;
      step.pattern = split_pattern::gpt2;
      t_.pre_steps.push_back(step);
      return {};
    }
    if (*type == "Split") {
      const auto* pattern = v.find("pattern");
      const json_value* regex = pattern != nullptr ? pattern->find("Regex") : nullptr;
      if (regex == nullptr || !regex->is_string()) {
        const json_value* str = pattern != nullptr ? pattern->find("String") : nullptr;
        if (str != nullptr && str->is_string())
          return unsupported(key + ".pattern", "String pattern " + quoted(str->as_string()) + " is not supported");
        return corrupt(key + ".pattern", "expected {\"Regex\": \"...\"}");
      }
      auto known = pattern_from_regex(regex->as_string());
      if (!known)
        return unsupported(key + ".pattern.Regex", quoted(regex->as_string()) +
                                                       " is not a supported pattern (GPT-2, Qwen2, Llama 3)");
      const auto* behavior = v.find("behavior");
      if (behavior == nullptr || !behavior->is_string() || behavior->as_string() != "Isolated")
        return unsupported(key + ".behavior", (behavior != nullptr && behavior->is_string() ? quoted(behavior->as_string()) : std::string{"missing"}) +
                                                  " is not supported (only Isolated)");
      auto invert = flag(v, "invert", key, false);
      if (!invert)
        return invert.error();
      if (*invert)
        return unsupported(key + ".invert", "true is not supported");
      step.pattern = *known;
      step.use_regex = true;
      t_.pre_steps.push_back(step);
      return {};
    }
    return unsupported(key + ".type", quoted(*type) + " is not supported (supported: ByteLevel, Split, Sequence)");
  }

  result<void> load_pre_tokenizer(const json_value* p) {
    if (p == nullptr || p->is_null())
      return unsupported("pre_tokenizer", "null is not supported: byte-level BPE needs a ByteLevel pre-tokenizer");
    if (auto r = load_pre_step(*p, "pre_tokenizer"); !r)
      return r;
    bool byte_level = std::any_of(t_.pre_steps.begin(), t_.pre_steps.end(), [](const pre_step& s) { return s.byte_level; });
    if (!byte_level)
      return unsupported("pre_tokenizer", "has no ByteLevel step; only byte-level BPE is supported");
    return {};
  }

  result<void> load_post_processor(const json_value* p, const std::string& key) {
    if (p == nullptr || p->is_null())
      return {};
    auto type = type_of(*p, key);
    if (!type)
      return type.error();
    if (*type == "ByteLevel")
      return {}; // only trims offsets
    if (*type == "Sequence") {
      const auto* list = p->find("processors");
      if (list == nullptr || !list->is_array())
        return corrupt(key + ".processors", "missing or not an array");
      for (std::size_t i = 0; i < list->as_array().size(); ++i)
        if (auto r = load_post_processor(&list->as_array()[i], key + ".processors[" + std::to_string(i) + "]"); !r)
          return r;
      return {};
    }
    if (*type == "TemplateProcessing")
      return load_template(*p, key);
    return unsupported(key + ".type", quoted(*type) + " is not supported (supported: ByteLevel, TemplateProcessing, Sequence)");
  }

  result<void> load_template(const json_value& p, const std::string& key) {
    if (!t_.prefix.empty() || !t_.suffix.empty())
      return unsupported(key, "a second TemplateProcessing is not supported");
    const auto* single = p.find("single");
    if (single == nullptr || !single->is_array())
      return corrupt(key + ".single", "missing or not an array");
    const auto* specials = p.find("special_tokens");
    bool seen_sequence = false;
    for (std::size_t i = 0; i < single->as_array().size(); ++i) {
      const auto& piece = single->as_array()[i];
      const std::string pkey = key + ".single[" + std::to_string(i) + "]";
      if (const auto* seq = piece.find("Sequence"); seq != nullptr) {
        const auto* id = seq->find("id");
        if (id == nullptr || !id->is_string() || id->as_string() != "A")
          return unsupported(pkey + ".Sequence.id", "only sequence A is supported");
        if (seen_sequence)
          return unsupported(pkey, "sequence A twice is not supported");
        seen_sequence = true;
        continue;
      }
      const auto* sp = piece.find("SpecialToken");
      const auto* name = sp != nullptr ? sp->find("id") : nullptr;
      if (name == nullptr || !name->is_string())
        return corrupt(pkey, "expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
      const auto* entry = specials != nullptr ? specials->find(name->as_string()) : nullptr;
      const auto* ids = entry != nullptr ? entry->find("ids") : nullptr;
      if (ids == nullptr || !ids->is_array())
        return corrupt(key + ".special_tokens", quoted(name->as_string()) + " is missing or has no ids");
      for (std::size_t k = 0; k < ids->as_array().size(); ++k) {
        auto id = read_id(ids->as_array()[k], key + ".special_tokens." + name->as_string() + ".ids[" + std::to_string(k) + "]");
        if (!id)
          return id.error();
        (seen_sequence ? t_.suffix : t_.prefix).push_back(*id);
      }
    }
    if (!seen_sequence)
      return corrupt(key + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
    return {};
  }

  result<void> load_decoder(const json_value* d, const std::string& key) {
    if (d == nullptr || d->is_null())
      return {};
    auto type = type_of(*d, key);
    if (!type)
      return type.error();
    if (*type == "ByteLevel") {
      t_.byte_level_decoder = true;
      return {};
    }
    if (*type == "Sequence") {
      const auto* list = d->find("decoders");
      if (list == nullptr || !list->is_array() || list->as_array().size() != 1)
        return unsupported(key + ".decoders", "only a Sequence of one ByteLevel decoder is supported");
      return load_decoder(&list->as_array()[0], key + ".decoders[0]");
    }
    return unsupported(key + ".type", quoted(*type) + " is not supported (supported: ByteLevel, or none)");
  }

  tokenizer::impl& t_;
  std::string source_;
};

// bos_token / eos_token / pad_token of tokenizer_config.json: a string, an AddedToken object
// with "content", or null.
result<std::optional<std::int32_t>> config_token(const tokenizer& tok, const json_value& config,
                                                 std::string_view name, std::string_view source) {
  const auto* v = config.find(name);
  if (v == nullptr || v->is_null())
    return std::optional<std::int32_t>{};
  const json_value* text = v->is_object() ? v->find("content") : v;
  if (text == nullptr || !text->is_string())
    return fail(errc::corrupt, source, ": ", name, ": expected a token string, {\"content\": ...} or null");
  auto id = tok.id_of(text->as_string());
  if (!id)
    return fail(errc::corrupt, source, ": ", name, ": '", text->as_string(), "' is not a token of the tokenizer");
  return std::optional<std::int32_t>{*id};
}

} // namespace

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

result<tokenizer> tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                                       std::string_view source) {
  auto root = parse_json(tokenizer_json, source);
  if (!root)
    return root.error();
  auto p = std::make_unique<impl>();
  if (auto r = loader{*p, std::string{source}}.load(*root); !r)
    return r.error();

  for (const auto& a : p->added) {
    // `tokenizers` skips special tokens by their spelling, so a vocabulary entry spelled like
    // a special token is special too.
    if (a.special) {
      p->special[static_cast<std::size_t>(a.id)] = 1;
      if (auto it = p->model_ids.find(a.content); it != p->model_ids.end())
        p->special[static_cast<std::size_t>(it->second)] = 1;
    }
    auto index = static_cast<std::int32_t>(&a - p->added.data());
    if (!a.normalized) {
      p->raw_trie.add(a.content, index);
    } else {
      // Normalized tokens are matched against normalized text, so normalize them too.
      p->normalized_trie.add(p->nfc ? unicode::nfc(a.content) : a.content, index);
    }
  }
  tokenizer tok{std::move(p)};

  if (!config_json.empty()) {
    std::string config_source = std::string{source} + " (tokenizer_config.json)";
    auto config = parse_json(config_json, config_source);
    if (!config)
      return config.error();
    if (!config->is_object())
      return fail(errc::corrupt, config_source, ": expected a JSON object at the top level");
    auto& impl = *tok.impl_;
    for (auto [name, slot] : {std::pair{"bos_token", &impl.bos}, {"eos_token", &impl.eos}, {"pad_token", &impl.pad}}) {
      auto id = config_token(tok, *config, name, config_source);
      if (!id)
        return id.error();
      *slot = *id;
    }
    if (const auto* tmpl = config->find("chat_template"); tmpl != nullptr && !tmpl->is_null()) {
      if (tmpl->is_string()) {
        impl.chat_template = tmpl->as_string();
      } else if (tmpl->is_array()) {
        // Several named templates: keep the one named "default".
        for (const auto& t : tmpl->as_array()) {
          const auto* n = t.find("name");
          const auto* body = t.find("template");
          if (n != nullptr && n->is_string() && n->as_string() == "default" && body != nullptr && body->is_string())
            impl.chat_template = body->as_string();
        }
      } else {
        return fail(errc::corrupt, config_source, ": chat_template: expected a string");
      }
    }
  }
  return tok;
}

result<tokenizer> tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path json_path = path;
  std::string config_text;
  if (fs::is_directory(path, ec)) {
    json_path = path / "tokenizer.json";
    fs::path config_path = path / "tokenizer_config.json";
    if (fs::exists(config_path, ec)) {
      auto config = read_file(config_path);
      if (!config)
        return config.error();
      config_text = std::move(*config);
      if (config_text.empty())
        return fail(errc::corrupt, config_path.string(), ": empty file");
    }
  }
  auto text = read_file(json_path);
  if (!text)
    return text.error();
  return from_json(*text, config_text, json_path.string());
}

// ---------------------------------------------------------------------------------------------
// Encoding

// BPE of one word's bytes: initial symbols are the byte tokens; the lowest-ranked adjacent pair
// is merged until none is left (leftmost first among equal ranks), which is the order in which
// `tokenizers`' priority queue applies them.
void tokenizer::impl::merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
  struct symbol {
    std::int32_t id;
    std::int32_t prev, next;
    bool alive;
  };
  std::vector<symbol> sym;
  sym.reserve(word.size());
  // Bytes without a token: replaced by unk (fused when asked) or dropped, as `tokenizers` does.
  bool pending_unk = false;
  for (char c : word) {
    std::int32_t id = single_byte[static_cast<unsigned char>(c)];
    if (id < 0) {
      if (unk_id >= 0) {
        if (pending_unk && fuse_unk)
          continue;
        sym.push_back({unk_id, 0, 0, true});
        pending_unk = true;
      }
      continue;
    }
    pending_unk = false;
    sym.push_back({id, 0, 0, true});
  }
  const auto n = static_cast<std::int32_t>(sym.size());
  for (std::int32_t i = 0; i < n; ++i) {
    sym[static_cast<std::size_t>(i)].prev = i - 1;
    sym[static_cast<std::size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }

  if (n <= 48) {
    // Short words: rescan for the best pair, cheaper than a heap.
    for (;;) {
      std::uint32_t best_rank = UINT32_MAX;
      std::int32_t best = -1, best_id = -1;
      for (std::int32_t i = 0; i != -1 && i < n; i = sym[static_cast<std::size_t>(i)].next) {
        std::int32_t j = sym[static_cast<std::size_t>(i)].next;
        if (j < 0)
          break;
        if (const auto* m = merges.find(sym[static_cast<std::size_t>(i)].id, sym[static_cast<std::size_t>(j)].id);
            m != nullptr && m->rank < best_rank) {
          best_rank = m->rank;
          best = i;
          best_id = m->id;
        }
      }
      if (best < 0)
        break;
      auto& a = sym[static_cast<std::size_t>(best)];
      auto& b = sym[static_cast<std::size_t>(a.next)];
      a.id = best_id;
      b.alive = false;
      a.next = b.next;
      if (b.next >= 0)
        sym[static_cast<std::size_t>(b.next)].prev = best;
    }
  } else {
    struct entry {
      std::uint32_t rank;
      std::int32_t pos;
      std::int32_t id;
      bool operator>(const entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<entry> heap;
    auto push = [&](std::int32_t i) {
      std::int32_t j = sym[static_cast<std::size_t>(i)].next;
      if (j < 0)
        return;
      if (const auto* m = merges.find(sym[static_cast<std::size_t>(i)].id, sym[static_cast<std::size_t>(j)].id)) {
        heap.push_back({m->rank, i, m->id});
        std::push_heap(heap.begin(), heap.end(), std::greater<>{});
      }
    };
    for (std::int32_t i = 0; i + 1 < n; ++i)
      push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      entry top = heap.back();
      heap.pop_back();
      auto& a = sym[static_cast<std::size_t>(top.pos)];
      if (!a.alive || a.next < 0)
        continue;
      auto& b = sym[static_cast<std::size_t>(a.next)];
      const auto* m = merges.find(a.id, b.id);
      if (m == nullptr || m->id != top.id)
        continue; // stale: one side changed since this entry was queued
      a.id = top.id;
      b.alive = false;
      a.next = b.next;
      if (b.next >= 0)
        sym[static_cast<std::size_t>(b.next)].prev = top.pos;
      if (a.prev >= 0)
        push(a.prev);
      push(top.pos);
    }
  }
  for (std::int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[static_cast<std::size_t>(i)].next)
    out.push_back(sym[static_cast<std::size_t>(i)].id);
}

void tokenizer::impl::bpe(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges) {
    if (auto it = byte_ids.find(word); it != byte_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1 && single_byte[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(single_byte[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (cache.get(word, out))
    return;
  std::size_t from = out.size();
  merge_word(word, out);
  cache.put(word, std::span<const std::int32_t>{out.data() + from, out.size() - from});
}

void tokenizer::impl::pre_tokenize(std::string_view text, std::size_t step, std::vector<std::int32_t>& out) const {
  if (text.empty())
    return;
  if (step == pre_steps.size()) {
    bpe(text, out);
    return;
  }
  const pre_step& s = pre_steps[step];
  if (s.byte_level && s.add_prefix_space && text.front() != ' ') {
    std::string prefixed = " ";
    prefixed.append(text);
    if (s.use_regex)
      split_pieces(s.pattern, prefixed, [&](std::string_view piece) { pre_tokenize(piece, step + 1, out); });
    else
      pre_tokenize(prefixed, step + 1, out);
    return;
  }
  if (s.use_regex)
    split_pieces(s.pattern, text, [&](std::string_view piece) { pre_tokenize(piece, step + 1, out); });
  else
    pre_tokenize(text, step + 1, out);
}

// Splits `text` around the added tokens of `trie`, as AddedVocabulary::find_matches does:
// emit(piece, -1) for text, emit(content, id) for a token.
template <class Emit>
void tokenizer::impl::split_added(std::string_view text, const token_trie& trie, Emit&& emit) const {
  if (trie.empty()) {
    emit(text, -1);
    return;
  }
  std::size_t done = 0;   // text before this offset has been emitted
  std::size_t search = 0; // where to look for the next match
  while (search < text.size()) {
    auto m = trie.find(text, search);
    if (m.token < 0)
      break;
    const added_token& a = added[static_cast<std::size_t>(m.token)];
    search = m.end;
    std::size_t start = m.start, stop = m.end;
    if (a.single_word) {
      // `tokenizers` checks \w at either side of the match.
      bool left_ok = true, right_ok = true;
      if (start > 0) {
        std::size_t k = start - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80)
          --k;
        auto u = decode_utf8(text, k);
        left_ok = !(u.len != 0 && is_word_char(u.cp));
      }
      if (stop < text.size()) {
        auto u = decode_utf8(text, stop);
        right_ok = !(u.len != 0 && is_word_char(u.cp));
      }
      if (!left_ok || !right_ok)
        continue;
    }
    auto is_space_at = [&](std::size_t k) {
      auto u = decode_utf8(text, k);
      return u.len != 0 && (unicode::flags(u.cp) & unicode::space) != 0 ? static_cast<int>(u.len) : 0;
    };
    if (a.lstrip) {
      std::size_t k = start;
      while (k > done) {
        std::size_t p = k - 1;
        while (p > done && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80)
          --p;
        int len = is_space_at(p);
        if (len == 0 || p + static_cast<std::size_t>(len) != k)
          break;
        k = p;
      }
      start = k;
    }
    if (a.rstrip) {
      while (stop < text.size()) {
        int len = is_space_at(stop);
        if (len == 0)
          break;
        stop += static_cast<std::size_t>(len);
      }
      search = std::max(search, stop);
    }
    if (done < start)
      emit(text.substr(done, start - done), -1);
    emit(text.substr(start, stop - start), a.id);
    done = stop;
  }
  if (done < text.size())
    emit(text.substr(done), -1);
}

void tokenizer::impl::encode_text(std::string_view text, std::vector<std::int32_t>& out) const {
  split_added(text, raw_trie, [&](std::string_view piece, std::int32_t id) {
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    std::string normalized;
    if (nfc && unicode::may_change_under_nfc(piece)) {
      normalized = unicode::nfc(piece);
      piece = normalized;
    }
    split_added(piece, normalized_trie, [&](std::string_view sub, std::int32_t sub_id) {
      if (sub_id >= 0)
        out.push_back(sub_id);
      else
        pre_tokenize(sub, 0, out);
    });
  });
}

std::vector<std::int32_t> tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special)
    out.insert(out.end(), impl_->prefix.begin(), impl_->prefix.end());
  impl_->encode_text(text, out);
  if (add_special)
    out.insert(out.end(), impl_->suffix.begin(), impl_->suffix.end());
  return out;
}

std::string tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  const impl& t = *impl_;
  auto usable = [&](std::int32_t id) {
    auto k = static_cast<std::size_t>(id);
    return id >= 0 && k < t.present.size() && t.present[k] && !(skip_special && t.special[k]);
  };
  std::string out;
  if (!t.byte_level_decoder) {
    // No decoder: `tokenizers` joins the token spellings with spaces.
    bool first = true;
    for (auto id : ids)
      if (usable(id)) {
        if (!first)
          out += ' ';
        out += t.token[static_cast<std::size_t>(id)];
        first = false;
      }
    return out;
  }
  std::string raw;
  for (auto id : ids)
    if (usable(id))
      raw += t.bytes[static_cast<std::size_t>(id)];
  return utf8_lossy(raw);
}

std::optional<std::int32_t> tokenizer::id_of(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end())
    return it->second;
  if (auto it = impl_->model_ids.find(token); it != impl_->model_ids.end())
    return it->second;
  return std::nullopt;
}

std::optional<std::string_view> tokenizer::token_of(std::int32_t id) const {
  auto k = static_cast<std::size_t>(id);
  if (id < 0 || k >= impl_->present.size() || !impl_->present[k])
    return std::nullopt;
  return std::string_view{impl_->token[k]};
}

bool tokenizer::is_special(std::int32_t id) const {
  auto k = static_cast<std::size_t>(id);
  return id >= 0 && k < impl_->special.size() && impl_->special[k];
}

std::size_t tokenizer::vocab_size() const { return impl_->token.size(); }
std::optional<std::int32_t> tokenizer::bos_id() const { return impl_->bos; }
std::optional<std::int32_t> tokenizer::eos_id() const { return impl_->eos; }
std::optional<std::int32_t> tokenizer::pad_id() const { return impl_->pad; }
const std::string& tokenizer::chat_template() const { return impl_->chat_template; }

std::string tokenizer::describe() const {
  const impl& t = *impl_;
  std::string pattern = "ByteLevel";
  for (const auto& s : t.pre_steps)
    if (s.use_regex) {
      pattern = pattern_name(s.pattern);
      break;
    }
  std::size_t tokens = 0;
  for (auto p : t.present)
    tokens += p;
  return "byte-level BPE, " + pattern + " pattern, " + (t.nfc ? "NFC" : "no normalizer") + ", " +
         std::to_string(tokens) + " tokens (" + std::to_string(t.added.size()) + " added), " +
         std::to_string(t.merges.size()) + " merges";
}

} // namespace crucible::policy
