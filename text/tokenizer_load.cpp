// text/tokenizer_load.cpp: tokenizer.json and tokenizer_config.json into the tables of
// tokenizer::impl, checking every key it reads and refusing what it cannot reproduce exactly.
#include <algorithm>
#include <tuple>

#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "text/tokenizer_impl.hpp"
#include "text/unicode.hpp"

namespace crucible::policy {

namespace detail {

const std::string* spelling_index::build(const std::vector<std::string>& keys, const std::vector<std::uint8_t>& use,
                                         std::uint8_t bit) {
  keys_ = &keys;
  std::size_t n = 0;
  for (auto u : use)
    n += (u & bit) != 0;
  std::size_t cap = 16;
  while (cap < n * 2)
    cap <<= 1;
  slots_.assign(cap, -1);
  tags_.assign(cap, 0);
  mask_ = cap - 1;
  for (std::size_t id = 0; id < keys.size(); ++id) {
    if ((use[id] & bit) == 0)
      continue;
    const auto& key = keys[id];
    auto h = std::hash<std::string_view>{}(key);
    auto tag = static_cast<std::uint32_t>(h >> 32);
    for (std::size_t s = h & mask_;; s = (s + 1) & mask_) {
      if (slots_[s] < 0) {
        slots_[s] = static_cast<std::int32_t>(id);
        tags_[s] = tag;
        break;
      }
      if (tags_[s] == tag && keys[static_cast<std::size_t>(slots_[s])] == key)
        return &key;
    }
  }
  return nullptr;
}

std::int32_t spelling_index::find(std::string_view s) const noexcept {
  if (slots_.empty())
    return -1;
  auto h = std::hash<std::string_view>{}(s);
  auto tag = static_cast<std::uint32_t>(h >> 32);
  for (std::size_t k = h & mask_;; k = (k + 1) & mask_) {
    std::int32_t id = slots_[k];
    if (id < 0)
      return -1;
    if (tags_[k] == tag && (*keys_)[static_cast<std::size_t>(id)] == s)
      return id;
  }
}

} // namespace detail

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

  // Calls f(item, item_key) for each element of the array `name` of a Sequence component.
  template <class F>
  result<void> each_of(const json_value& seq, const char* name, const std::string& key, F&& f) {
    const auto* list = seq.find(name);
    if (list == nullptr || !list->is_array())
      return corrupt(key + "." + name, "missing or not an array");
    for (std::size_t i = 0; i < list->as_array().size(); ++i)
      if (auto r = f(list->as_array()[i], key + "." + name + "[" + std::to_string(i) + "]"); !r)
        return r;
    return {};
  }

  result<bool> flag(const json_value& obj, std::string_view name, const std::string& key, bool fallback) const {
    const auto* v = obj.find(name);
    if (v == nullptr || v->is_null())
      return fallback;
    if (!v->is_bool())
      return corrupt(key + "." + std::string{name}, "expected true or false");
    return v->as_bool();
  }

  void grow(std::int32_t id) {
    auto n = static_cast<std::size_t>(id) + 1;
    if (t_.flags.size() < n) {
      t_.model_token.resize(n);
      t_.model_bytes.resize(n);
      t_.flags.resize(n, 0);
    }
  }

  // The ByteLevel decoder maps a token's characters back to bytes when all of them are in the
  // alphabet, and otherwise takes the token's own UTF-8.
  static std::string decoder_bytes(const std::string& spelling) {
    auto raw = token_to_bytes(spelling);
    return raw ? std::move(*raw) : spelling;
  }

  static bool valid_id(const json_value& v) { return v.is_int() && v.as_int() >= 0 && v.as_int() <= 0x7FFFFFFF; }

  result<std::int32_t> read_id(const json_value& v, const std::string& key) const {
    if (!valid_id(v))
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
    for (const auto& m : vocab->as_object()) {
      if (!valid_id(m.value))
        return corrupt("model.vocab." + m.key, "expected a token id (a non-negative integer)");
      auto id = static_cast<std::int32_t>(m.value.as_int());
      grow(id);
      auto k = static_cast<std::size_t>(id);
      t_.model_token[k] = m.key;
      t_.flags[k] |= tokenizer::impl::id_model;
      if (auto raw = token_to_bytes(m.key)) {
        if (raw->size() == 1)
          t_.single_byte[static_cast<unsigned char>((*raw)[0])] = id;
        t_.model_bytes[k] = std::move(*raw);
        t_.flags[k] |= tokenizer::impl::id_bytes;
      } else {
        t_.model_bytes[k] = m.key;
      }
    }
    if (const auto* twice = t_.model_ids.build(t_.model_token, t_.flags, tokenizer::impl::id_model))
      return corrupt("model.vocab", quoted(*twice) + " appears twice");
    t_.byte_ids.build(t_.model_bytes, t_.flags, tokenizer::impl::id_bytes);

    if (const auto* unk = model->find("unk_token"); unk != nullptr && !unk->is_null()) {
      if (!unk->is_string())
        return corrupt("model.unk_token", "expected a string or null");
      t_.unk_id = t_.model_ids.find(unk->as_string());
      if (t_.unk_id < 0)
        return corrupt("model.unk_token", quoted(unk->as_string()) + " is not in model.vocab");
    }

    const auto& list = merges->as_array();
    t_.merges.reserve(list.size());
    std::string merged;
    for (std::size_t rank = 0; rank < list.size(); ++rank) {
      const auto& m = list[rank];
      auto key = [rank] { return "model.merges[" + std::to_string(rank) + "]"; };
      std::string_view a, b;
      if (m.is_string()) {
        const auto& s = m.as_string();
        auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          return corrupt(key(), quoted(s) + " is not two tokens separated by one space");
        a = std::string_view{s}.substr(0, sp);
        b = std::string_view{s}.substr(sp + 1);
      } else if (m.is_array() && m.as_array().size() == 2 && m.as_array()[0].is_string() &&
                 m.as_array()[1].is_string()) {
        a = m.as_array()[0].as_string();
        b = m.as_array()[1].as_string();
      } else {
        return corrupt(key(), "expected \"a b\" or [\"a\", \"b\"]");
      }
      std::int32_t ia = t_.model_ids.find(a);
      if (ia < 0)
        return corrupt(key(), quoted(a) + " is not in model.vocab");
      std::int32_t ib = t_.model_ids.find(b);
      if (ib < 0)
        return corrupt(key(), quoted(b) + " is not in model.vocab");
      merged.assign(a).append(b);
      std::int32_t im = t_.model_ids.find(merged);
      if (im < 0)
        return corrupt(key(), "the merged token " + quoted(merged) + " is not in model.vocab");
      t_.merges.insert(ia, ib, {static_cast<std::uint32_t>(rank), im});
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
      detail::added_token a;
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
      grow(a.id);
      t_.flags[static_cast<std::size_t>(a.id)] |= tokenizer::impl::id_added;
      t_.added_text[a.id] = a.content;
      t_.added_bytes[a.id] = decoder_bytes(a.content);
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
    if (*type == "Sequence")
      return each_of(*n, "normalizers", "normalizer", [&](const json_value& item, const std::string& key) -> result<void> {
        auto t = type_of(item, key);
        if (!t)
          return t.error();
        if (*t != "NFC")
          return unsupported(key + ".type", quoted(*t) + " is not supported (supported: NFC)");
        t_.nfc = true;
        return {};
      });
    return unsupported("normalizer.type", quoted(*type) + " is not supported (supported: NFC, or none)");
  }

  result<void> load_pre_step(const json_value& v, const std::string& key) {
    auto type = type_of(v, key);
    if (!type)
      return type.error();
    if (*type == "Sequence")
      return each_of(v, "pretokenizers", key, [&](const json_value& item, const std::string& k) { return load_pre_step(item, k); });
    detail::pre_step step;
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
    bool byte_level = std::any_of(t_.pre_steps.begin(), t_.pre_steps.end(), [](const detail::pre_step& s) { return s.byte_level; });
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
    if (*type == "Sequence")
      return each_of(*p, "processors", key, [&](const json_value& item, const std::string& k) { return load_post_processor(&item, k); });
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
      p->flags[static_cast<std::size_t>(a.id)] |= impl::id_special;
      if (auto id = p->model_ids.find(a.content); id >= 0)
        p->flags[static_cast<std::size_t>(id)] |= impl::id_special;
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

} // namespace crucible::policy
