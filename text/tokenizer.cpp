// text/tokenizer.cpp: encodes text the way `tokenizers` does: added tokens split out first,
// NFC on the rest, pre-tokenizer pieces, BPE merges by rank on each piece's bytes (through a
// word cache), post-processor template; and decodes ids back to text.
#include "text/tokenizer.hpp"

#include <algorithm>
#include <functional>

#include "core/utf8.hpp"
#include "text/tokenizer_impl.hpp"
#include "text/unicode.hpp"

namespace crucible::policy {

namespace {

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

// \w as the Rust regex crate defines it, which `tokenizers` uses for single_word tokens.
bool is_word_char(char32_t cp) { return (unicode::flags(cp) & unicode::word) != 0; }

} // namespace

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

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
    if (auto id = byte_ids.find(word); id >= 0) {
      out.push_back(id);
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
  const detail::pre_step& s = pre_steps[step];
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
void tokenizer::impl::split_added(std::string_view text, const detail::token_trie& trie, Emit&& emit) const {
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
    const detail::added_token& a = added[static_cast<std::size_t>(m.token)];
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
    return t.has(id, impl::id_model | impl::id_added) && !(skip_special && t.has(id, impl::id_special));
  };
  std::string out;
  if (!t.byte_level_decoder) {
    // No decoder: `tokenizers` joins the token spellings with spaces.
    bool first = true;
    for (auto id : ids)
      if (usable(id)) {
        if (!first)
          out += ' ';
        out += *token_of(id);
        first = false;
      }
    return out;
  }
  std::string raw;
  for (auto id : ids) {
    if (!usable(id))
      continue;
    if (t.has(id, impl::id_added))
      raw += t.added_bytes.at(id);
    else
      raw += t.model_bytes[static_cast<std::size_t>(id)];
  }
  return utf8_lossy(raw);
}

std::optional<std::int32_t> tokenizer::id_of(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end())
    return it->second;
  if (auto id = impl_->model_ids.find(token); id >= 0)
    return id;
  return std::nullopt;
}

std::optional<std::string_view> tokenizer::token_of(std::int32_t id) const {
  if (impl_->has(id, impl::id_added))
    return std::string_view{impl_->added_text.at(id)};
  if (impl_->has(id, impl::id_model))
    return std::string_view{impl_->model_token[static_cast<std::size_t>(id)]};
  return std::nullopt;
}

bool tokenizer::is_special(std::int32_t id) const { return impl_->has(id, impl::id_special); }

std::size_t tokenizer::vocab_size() const { return impl_->flags.size(); }
std::optional<std::int32_t> tokenizer::bos_id() const { return impl_->bos; }
std::optional<std::int32_t> tokenizer::eos_id() const { return impl_->eos; }
std::optional<std::int32_t> tokenizer::pad_id() const { return impl_->pad; }
const std::string& tokenizer::chat_template() const { return impl_->chat_template; }

std::map<std::string, std::string> tokenizer::special_tokens_map() const {
  std::map<std::string, std::string> out;
  for (auto [name, id] : {std::pair{"bos_token", impl_->bos}, {"eos_token", impl_->eos}, {"pad_token", impl_->pad}})
    if (id)
      if (auto t = token_of(*id))
        out.emplace(name, std::string{*t});
  return out;
}

std::string tokenizer::describe() const {
  const impl& t = *impl_;
  std::string pattern = "ByteLevel";
  for (const auto& s : t.pre_steps)
    if (s.use_regex) {
      pattern = pattern_name(s.pattern);
      break;
    }
  std::size_t tokens = 0;
  for (auto f : t.flags)
    tokens += (f & (impl::id_model | impl::id_added)) != 0;
  return "byte-level BPE, " + pattern + " pattern, " + (t.nfc ? "NFC" : "no normalizer") + ", " +
         std::to_string(tokens) + " tokens (" + std::to_string(t.added.size()) + " added), " +
         std::to_string(t.merges.size()) + " merges";
}

} // namespace crucible::policy
