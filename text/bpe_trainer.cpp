// text/bpe_trainer.cpp: corpus text -> word counts -> merges -> tokenizer.json. The merge loop
// mirrors `tokenizers`' BpeTrainer (models/bpe/trainer.rs) step for step, so that both learn
// the same merges from the same corpus: a max-heap of (count, pair) entries that are refreshed
// lazily when popped with a stale count, and per-word merges that report the pair-count
// changes they cause.
#include "text/bpe_trainer.hpp"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/string_map.hpp"
#include "core/utf8.hpp"
#include "text/unicode.hpp"

namespace crucible::policy {

const char* const chatml_template =
  "{%- for message in messages %}"
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
  "{%- endfor %}"
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

namespace {

using pair_key = std::uint64_t;

pair_key make_pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}
std::int32_t left_of(pair_key p) { return static_cast<std::int32_t>(p >> 32); }
std::int32_t right_of(pair_key p) { return static_cast<std::int32_t>(p & 0xFFFFFFFFu); }

struct heap_entry {
  pair_key pair;
  std::uint64_t count;
  std::vector<std::uint32_t> words; // where the pair was seen (may be stale)
};

// Heap order of `tokenizers`' Merge: higher count first, then the smaller pair.
struct lower_priority {
  bool operator()(const heap_entry& x, const heap_entry& y) const {
    return x.count != y.count ? x.count < y.count : x.pair > y.pair;
  }
};

struct pair_change {
  pair_key pair;
  int delta;
};

// Word::merge: replaces every (a, b) in `word` by `merged`, left to right, and reports the
// neighbouring pairs that disappear (-1) and appear (+1).
void merge_in_word(std::vector<std::int32_t>& word, std::int32_t a, std::int32_t b, std::int32_t merged,
                   std::vector<pair_change>& changes) {
  for (std::size_t i = 0; i < word.size(); ++i) {
    if (word[i] != a || i + 1 >= word.size() || word[i + 1] != b)
      continue;
    if (i > 0) {
      changes.push_back({make_pair_key(word[i - 1], a), -1});
      changes.push_back({make_pair_key(word[i - 1], merged), 1});
    }
    word[i] = merged;
    word.erase(word.begin() + static_cast<long>(i) + 1);
    if (i + 1 < word.size()) {
      changes.push_back({make_pair_key(b, word[i + 1]), -1});
      changes.push_back({make_pair_key(merged, word[i + 1]), 1});
    }
  }
}

} // namespace

bpe_trainer::bpe_trainer(bpe_train_options options) : options_(std::move(options)) {}

result<void> bpe_trainer::validate() const {
  std::vector<std::string> seen;
  for (const auto& s : options_.special_tokens) {
    if (s.empty())
      return fail(errc::invalid_arg, "special tokens: an empty token is not allowed");
    if (decode_utf8(s, 0).len == 0 || std::find(seen.begin(), seen.end(), s) != seen.end())
      return fail(errc::invalid_arg, "special tokens: '", s, "' is repeated or not UTF-8");
    seen.push_back(s);
  }
  std::size_t minimum = seen.size() + 256;
  if (options_.vocab_size < minimum)
    return fail(errc::invalid_arg, "vocabulary size ", std::to_string(options_.vocab_size),
                " is too small: the ", std::to_string(seen.size()), " special tokens and 256 byte tokens need ",
                std::to_string(minimum));
  if (options_.vocab_size > 0x7FFFFFFF)
    return fail(errc::invalid_arg, "vocabulary size ", std::to_string(options_.vocab_size), " is too large");
  for (const auto* name : {&options_.eos_token, &options_.pad_token})
    if (!name->empty() && std::find(seen.begin(), seen.end(), *name) == seen.end())
      return fail(errc::invalid_arg, "token '", *name, "' (eos/pad) is not one of the special tokens");
  return {};
}

void bpe_trainer::count(std::string_view word) {
  // counts_ keeps first-seen order (deterministic word indices); index_ finds a word's slot.
  std::size_t h = std::hash<std::string_view>{}(word);
  if (index_.empty() || counts_.size() * 2 >= index_.size()) {
    std::vector<std::size_t> bigger(std::max<std::size_t>(1024, index_.size() * 2), SIZE_MAX);
    for (std::size_t k = 0; k < counts_.size(); ++k) {
      std::size_t s = std::hash<std::string_view>{}(counts_[k].first) & (bigger.size() - 1);
      while (bigger[s] != SIZE_MAX)
        s = (s + 1) & (bigger.size() - 1);
      bigger[s] = k;
    }
    index_ = std::move(bigger);
  }
  for (std::size_t s = h & (index_.size() - 1);; s = (s + 1) & (index_.size() - 1)) {
    if (index_[s] == SIZE_MAX) {
      index_[s] = counts_.size();
      counts_.emplace_back(std::string{word}, 1);
      return;
    }
    if (counts_[index_[s]].first == word) {
      ++counts_[index_[s]].second;
      return;
    }
  }
}

void bpe_trainer::feed(std::string_view text) {
  bytes_ += text.size();
  std::string normalized;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t nl = text.find('\n', start);
    std::size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(start, end - start);
    start = end;
    if (options_.nfc && unicode::may_change_under_nfc(line)) {
      normalized = unicode::nfc(line);
      line = normalized;
    }
    split_pieces(options_.pattern, line, [&](std::string_view piece) { count(piece); });
  }
}

result<void> bpe_trainer::feed_file(const std::filesystem::path& path) {
  auto text = read_file(path);
  if (!text)
    return text.error();
  for (std::size_t i = 0; i < text->size();) {
    auto u = decode_utf8(*text, i);
    if (u.len == 0)
      return fail(errc::corrupt, path.string(), ": not UTF-8 text (invalid byte at offset ", std::to_string(i), ")");
    i += u.len;
  }
  feed(*text);
  return {};
}

bpe_model bpe_trainer::train() const {
  bpe_model model;
  auto& vocab = model.vocab;
  string_map<std::int32_t> ids;
  auto intern = [&](const std::string& s) {
    auto it = ids.find(s);
    if (it != ids.end())
      return it->second;
    auto id = static_cast<std::int32_t>(vocab.size());
    vocab.push_back(s);
    ids.emplace(s, id);
    return id;
  };
  for (const auto& s : options_.special_tokens)
    intern(s);
  model.special_count = vocab.size();

  // The initial alphabet: the 256 byte characters, sorted by code point.
  std::vector<std::pair<char32_t, int>> alphabet;
  for (int b = 0; b < 256; ++b)
    alphabet.emplace_back(byte_to_char(static_cast<std::uint8_t>(b)), b);
  std::sort(alphabet.begin(), alphabet.end());
  std::array<std::int32_t, 256> byte_id{};
  for (auto [c, b] : alphabet) {
    std::string s;
    append_utf8(s, c);
    byte_id[static_cast<std::size_t>(b)] = intern(s);
  }

  std::vector<std::vector<std::int32_t>> words;
  std::vector<std::int64_t> counts;
  words.reserve(counts_.size());
  counts.reserve(counts_.size());
  for (const auto& [w, c] : counts_) {
    std::vector<std::int32_t> syms;
    syms.reserve(w.size());
    for (char ch : w)
      syms.push_back(byte_id[static_cast<unsigned char>(ch)]);
    words.push_back(std::move(syms));
    counts.push_back(static_cast<std::int64_t>(c));
  }

  std::unordered_map<pair_key, std::int64_t> pair_counts;
  std::vector<heap_entry> heap;
  {
    std::unordered_map<pair_key, std::vector<std::uint32_t>> where;
    for (std::size_t i = 0; i < words.size(); ++i) {
      const auto& w = words[i];
      for (std::size_t k = 0; k + 1 < w.size(); ++k) {
        auto p = make_pair_key(w[k], w[k + 1]);
        pair_counts[p] += counts[i];
        auto& pos = where[p];
        if (pos.empty() || pos.back() != i)
          pos.push_back(static_cast<std::uint32_t>(i));
      }
    }
    heap.reserve(where.size());
    for (auto& [p, pos] : where)
      if (pair_counts[p] > 0)
        heap.push_back({p, static_cast<std::uint64_t>(pair_counts[p]), std::move(pos)});
    std::make_heap(heap.begin(), heap.end(), lower_priority{});
  }

  std::vector<pair_change> changes;
  std::vector<std::pair<pair_key, std::uint32_t>> appeared;
  while (vocab.size() < options_.vocab_size && !heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority{});
    heap_entry top = std::move(heap.back());
    heap.pop_back();
    auto current = static_cast<std::uint64_t>(std::max<std::int64_t>(0, pair_counts[top.pair]));
    if (top.count != current) {
      top.count = current;
      heap.push_back(std::move(top));
      std::push_heap(heap.begin(), heap.end(), lower_priority{});
      continue;
    }
    if (top.count < 1 || options_.min_frequency > top.count)
      break;
    const std::int32_t a = left_of(top.pair), b = right_of(top.pair);
    const std::int32_t merged = intern(vocab[static_cast<std::size_t>(a)] + vocab[static_cast<std::size_t>(b)]);
    model.merges.emplace_back(a, b);

    appeared.clear();
    for (auto wi : top.words) {
      changes.clear();
      merge_in_word(words[wi], a, b, merged, changes);
      for (const auto& c : changes) {
        pair_counts[c.pair] += c.delta * counts[wi];
        if (c.delta > 0)
          appeared.emplace_back(c.pair, wi);
      }
    }
    std::sort(appeared.begin(), appeared.end());
    for (std::size_t i = 0; i < appeared.size();) {
      std::size_t j = i;
      heap_entry e{appeared[i].first, 0, {}};
      for (; j < appeared.size() && appeared[j].first == e.pair; ++j)
        if (e.words.empty() || e.words.back() != appeared[j].second)
          e.words.push_back(appeared[j].second);
      i = j;
      std::int64_t c = pair_counts[e.pair];
      if (c > 0) {
        e.count = static_cast<std::uint64_t>(c);
        heap.push_back(std::move(e));
        std::push_heap(heap.begin(), heap.end(), lower_priority{});
      }
    }
  }
  return model;
}

namespace {

// Merges as `tokenizers` serializes them: a pair learned twice keeps only its last rank.
std::vector<std::pair<std::int32_t, std::int32_t>> unique_merges(const bpe_model& model) {
  std::unordered_map<pair_key, std::size_t> last;
  for (std::size_t r = 0; r < model.merges.size(); ++r)
    last[make_pair_key(model.merges[r].first, model.merges[r].second)] = r;
  std::vector<std::pair<std::int32_t, std::int32_t>> out;
  out.reserve(last.size());
  for (std::size_t r = 0; r < model.merges.size(); ++r)
    if (last[make_pair_key(model.merges[r].first, model.merges[r].second)] == r)
      out.push_back(model.merges[r]);
  return out;
}

void append_byte_level(std::string& out, bool use_regex, bool trim_offsets) {
  out += "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": ";
  out += trim_offsets ? "true" : "false";
  out += ", \"use_regex\": ";
  out += use_regex ? "true" : "false";
  out += "}";
}

} // namespace

std::string tokenizer_json(const bpe_model& model, const bpe_train_options& options) {
  std::string out;
  out.reserve(model.vocab.size() * 40);
  out += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
  for (std::size_t i = 0; i < model.special_count; ++i) {
    out += i ? ",\n    " : "\n    ";
    out += "{\"id\": " + std::to_string(i) + ", \"content\": ";
    append_json_string(out, model.vocab[i]);
    out += ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}";
  }
  out += "\n  ],\n  \"normalizer\": ";
  out += options.nfc ? "{\"type\": \"NFC\"}" : "null";
  out += ",\n  \"pre_tokenizer\": ";
  if (options.pattern == split_pattern::gpt2) {
    append_byte_level(out, true, true);
  } else {
    out += "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": ";
    append_json_string(out, pattern_regex(options.pattern));
    out += "}, \"behavior\": \"Isolated\", \"invert\": false}, ";
    append_byte_level(out, false, false);
    out += "]}";
  }
  out += ",\n  \"post_processor\": ";
  append_byte_level(out, false, false);
  out += ",\n  \"decoder\": ";
  append_byte_level(out, false, false);
  out += ",\n  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
         "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
         "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
         "    \"vocab\": {";
  for (std::size_t i = 0; i < model.vocab.size(); ++i) {
    out += i ? ",\n      " : "\n      ";
    append_json_string(out, model.vocab[i]);
    out += ": " + std::to_string(i);
  }
  out += "\n    },\n    \"merges\": [";
  auto merges = unique_merges(model);
  for (std::size_t r = 0; r < merges.size(); ++r) {
    out += r ? ",\n      [" : "\n      [";
    append_json_string(out, model.vocab[static_cast<std::size_t>(merges[r].first)]);
    out += ", ";
    append_json_string(out, model.vocab[static_cast<std::size_t>(merges[r].second)]);
    out += "]";
  }
  out += "\n    ]\n  }\n}\n";
  return out;
}

std::string tokenizer_config_json(const bpe_model& model, const bpe_train_options& options) {
  json_writer w;
  w.begin_object();
  w.field("tokenizer_class", "PreTrainedTokenizerFast");
  w.field("model_max_length", std::int64_t{131072});
  w.key("bos_token").null();
  if (options.eos_token.empty())
    w.key("eos_token").null();
  else
    w.field("eos_token", options.eos_token);
  if (options.pad_token.empty())
    w.key("pad_token").null();
  else
    w.field("pad_token", options.pad_token);
  w.key("unk_token").null();
  w.field("clean_up_tokenization_spaces", false);
  w.field("split_special_tokens", false);
  w.key("added_tokens_decoder").begin_object();
  for (std::size_t i = 0; i < model.special_count; ++i) {
    w.key(std::to_string(i)).begin_object();
    w.field("content", model.vocab[i]);
    w.field("lstrip", false).field("normalized", false).field("rstrip", false);
    w.field("single_word", false).field("special", true);
    w.end_object();
  }
  w.end_object();
  w.key("additional_special_tokens").begin_array();
  for (std::size_t i = 0; i < model.special_count; ++i)
    if (model.vocab[i] != options.eos_token && model.vocab[i] != options.pad_token)
      w.value(model.vocab[i]);
  w.end_array();
  w.field("chat_template", options.chat_template);
  w.end_object();
  return std::move(w).take() + "\n";
}

result<void> write_tokenizer_dir(const bpe_model& model, const bpe_train_options& options,
                                 const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return fail(errc::io, "cannot create directory ", dir.string(), ": ", ec.message());
  if (auto r = write_file_atomic(dir / "tokenizer.json", tokenizer_json(model, options)); !r)
    return r;
  return write_file_atomic(dir / "tokenizer_config.json", tokenizer_config_json(model, options));
}

} // namespace crucible::policy
