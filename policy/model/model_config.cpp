// policy/model/model_config.cpp: config.json of Llama/Qwen2 models in and out; presets for
// init_model.
#include "policy/model/model_config.hpp"

#include <cmath>
#include <iterator>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "text/chat_templates.hpp"
#include "policy/model/json_input.hpp"
#include "policy/model/safetensors.hpp"

namespace crucible::policy {

namespace {

// Reads typed keys of one JSON object, each error naming "origin: prefix.key".
class object_reader {
public:
  object_reader(const json_value& node, std::string origin, std::string prefix)
      : node_(node), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const {
    const auto* v = node_.find(key);
    return v != nullptr && !v->is_null();
  }

  crucible::error bad(const char* key, std::string_view what) const {
    return fail(errc::config, origin_, ": ", prefix_, key, ": ", what);
  }

  result<std::int64_t> required_int(const char* key) const {
    if (!has(key))
      return bad(key, "missing");
    return int_at(key);
  }

  result<std::int64_t> int_or(const char* key, std::int64_t fallback) const {
    return has(key) ? int_at(key) : result<std::int64_t>{fallback};
  }

  result<double> double_or(const char* key, double fallback) const {
    if (!has(key))
      return fallback;
    auto v = json_double(node_.find(key));
    if (!v || !std::isfinite(*v))
      return bad(key, "expected a number, got '" + json_input::text_of(node_.find(key)) + "'");
    return *v;
  }

  result<std::optional<double>> optional_double(const char* key) const {
    if (!has(key))
      return std::optional<double>{};
    auto v = double_or(key, 0.0);
    if (!v)
      return v.error();
    return std::optional<double>{*v};
  }

  result<bool> bool_or(const char* key, bool fallback) const {
    if (!has(key))
      return fallback;
    auto v = json_bool(node_.find(key));
    if (!v)
      return bad(key, "expected true or false, got '" + json_input::text_of(node_.find(key)) + "'");
    return *v;
  }

  result<std::string> string_or(const char* key, std::string fallback) const {
    if (!has(key))
      return fallback;
    auto v = json_string(node_.find(key));
    if (!v)
      return bad(key, "expected a string");
    return *v;
  }

  result<std::optional<std::int64_t>> optional_int(const char* key) const {
    if (!has(key))
      return std::optional<std::int64_t>{};
    auto v = int_at(key);
    if (!v)
      return v.error();
    return std::optional<std::int64_t>{*v};
  }

  result<std::vector<std::int64_t>> int_or_list(const char* key) const {
    std::vector<std::int64_t> out;
    if (!has(key))
      return out;
    const auto* v = node_.find(key);
    if (v->is_array()) {
      for (const auto& e : v->as_array()) {
        auto i = json_int(&e);
        if (!i)
          return bad(key, "expected integers");
        out.push_back(*i);
      }
      return out;
    }
    auto i = int_at(key);
    if (!i)
      return i.error();
    out.push_back(*i);
    return out;
  }

private:
  result<std::int64_t> int_at(const char* key) const {
    auto v = json_int(node_.find(key));
    if (!v)
      return bad(key, "expected an integer, got '" + json_input::text_of(node_.find(key)) + "'");
    return *v;
  }

  const json_value& node_; // outlives the reader
  std::string origin_;
  std::string prefix_;
};

#define CRUCIBLE_TRY_ASSIGN(dst, expr) \
  do {                                 \
    auto r_ = (expr);                  \
    if (!r_)                           \
      return r_.error();               \
    dst = std::move(*r_);              \
  } while (false)

result<rope_options> parse_rope(const json_value& doc, const std::string& origin, std::int64_t max_pos) {
  object_reader top{doc, origin, ""};
  rope_options rope;
  double top_theta = 10000.0;
  CRUCIBLE_TRY_ASSIGN(top_theta, top.double_or("rope_theta", 10000.0));
  if (top.has("partial_rotary_factor")) {
    double prf = 1.0;
    CRUCIBLE_TRY_ASSIGN(prf, top.double_or("partial_rotary_factor", 1.0));
    if (prf != 1.0)
      return top.bad("partial_rotary_factor", "partial rotary embeddings are not supported");
  }
  // transformers 5 takes a non-null "rope_scaling" (the older key) over "rope_parameters".
  const char* key = nullptr;
  for (const char* k : {"rope_scaling", "rope_parameters"})
    if (!key && top.has(k))
      key = k;
  rope.theta = top_theta;
  if (key == nullptr)
    return rope;
  const json_value& p = *doc.find(key); // top.has(key)
  if (!p.is_object())
    return top.bad(key, "expected an object");
  object_reader r{p, origin, std::string{key} + "."};
  CRUCIBLE_TRY_ASSIGN(rope.theta, r.double_or("rope_theta", top_theta));
  std::string type;
  CRUCIBLE_TRY_ASSIGN(type, r.string_or("type", "default"));
  CRUCIBLE_TRY_ASSIGN(type, r.string_or("rope_type", type));
  if (r.has("partial_rotary_factor")) {
    double prf = 1.0;
    CRUCIBLE_TRY_ASSIGN(prf, r.double_or("partial_rotary_factor", 1.0));
    if (prf != 1.0)
      return r.bad("partial_rotary_factor", "partial rotary embeddings are not supported");
  }
  if (type == "default")
    return rope;
  const char* type_key = r.has("rope_type") ? "rope_type" : "type";
  if (type == "linear")
    rope.type = rope_type::linear;
  else if (type == "dynamic")
    rope.type = rope_type::dynamic;
  else if (type == "llama3")
    rope.type = rope_type::llama3;
  else if (type == "yarn")
    rope.type = rope_type::yarn;
  else
    return r.bad(type_key, "rope type '" + type + "' is not supported (default, linear, dynamic, llama3, yarn)");
  if (!r.has("factor"))
    return r.bad("factor", "missing (required by rope type " + type + ")");
  CRUCIBLE_TRY_ASSIGN(rope.factor, r.double_or("factor", 1.0));
  if (rope.type == rope_type::llama3) {
    for (const char* k : {"low_freq_factor", "high_freq_factor"})
      if (!r.has(k))
        return r.bad(k, "missing (required by rope type llama3)");
    CRUCIBLE_TRY_ASSIGN(rope.low_freq_factor, r.double_or("low_freq_factor", 1.0));
    CRUCIBLE_TRY_ASSIGN(rope.high_freq_factor, r.double_or("high_freq_factor", 4.0));
  }
  if (rope.type == rope_type::llama3 || rope.type == rope_type::yarn) {
    // As transformers: a top-level original_max_position_embeddings wins, then the rope's own,
    // then max_position_embeddings.
    std::int64_t omp = max_pos;
    CRUCIBLE_TRY_ASSIGN(omp, r.int_or("original_max_position_embeddings", max_pos));
    CRUCIBLE_TRY_ASSIGN(omp, top.int_or("original_max_position_embeddings", omp));
    rope.original_max_position_embeddings = omp;
  }
  if (rope.type == rope_type::yarn) {
    CRUCIBLE_TRY_ASSIGN(rope.attention_factor, r.optional_double("attention_factor"));
    CRUCIBLE_TRY_ASSIGN(rope.mscale, r.optional_double("mscale"));
    CRUCIBLE_TRY_ASSIGN(rope.mscale_all_dim, r.optional_double("mscale_all_dim"));
    // transformers uses `get(...) or default`: 0 and null both mean the default.
    CRUCIBLE_TRY_ASSIGN(rope.beta_fast, r.double_or("beta_fast", 32.0));
    CRUCIBLE_TRY_ASSIGN(rope.beta_slow, r.double_or("beta_slow", 1.0));
    if (rope.beta_fast == 0.0)
      rope.beta_fast = 32.0;
    if (rope.beta_slow == 0.0)
      rope.beta_slow = 1.0;
    CRUCIBLE_TRY_ASSIGN(rope.truncate, r.bool_or("truncate", true));
  }
  return rope;
}

void write_rope_fields(json_writer& w, const rope_options& rope, bool with_theta) {
  w.field("rope_type", to_string(rope.type));
  if (with_theta)
    w.field("rope_theta", rope.theta);
  if (rope.type == rope_type::standard)
    return;
  w.field("factor", rope.factor);
  if (rope.type == rope_type::llama3) {
    w.field("low_freq_factor", rope.low_freq_factor);
    w.field("high_freq_factor", rope.high_freq_factor);
  }
  if (rope.type == rope_type::llama3 || rope.type == rope_type::yarn)
    w.field("original_max_position_embeddings", rope.original_max_position_embeddings);
  if (rope.type == rope_type::yarn) {
    if (rope.attention_factor)
      w.field("attention_factor", *rope.attention_factor);
    if (rope.mscale)
      w.field("mscale", *rope.mscale);
    if (rope.mscale_all_dim)
      w.field("mscale_all_dim", *rope.mscale_all_dim);
    w.field("beta_fast", rope.beta_fast);
    w.field("beta_slow", rope.beta_slow);
    w.field("truncate", rope.truncate);
  }
}

} // namespace

const char* to_string(model_family f) noexcept {
  switch (f) {
    case model_family::llama: return "llama";
    case model_family::qwen2: return "qwen2";
  }
  return "?";
}

result<model_family> parse_model_family(std::string_view name) {
  if (name == "llama")
    return model_family::llama;
  if (name == "qwen2")
    return model_family::qwen2;
  return fail(errc::unsupported, "model family '", name, "' is not supported (llama, qwen2)");
}

const char* to_string(rope_type t) noexcept {
  switch (t) {
    case rope_type::standard: return "default";
    case rope_type::linear: return "linear";
    case rope_type::dynamic: return "dynamic";
    case rope_type::llama3: return "llama3";
    case rope_type::yarn: return "yarn";
  }
  return "?";
}

result<void> model_config::validate() const {
  auto bad = [](const char* key, std::string what) { return fail(errc::config, "config.json: ", key, ": ", what); };
  const std::pair<const char*, std::int64_t> positive[] = {
    {"vocab_size", vocab_size},         {"hidden_size", hidden_size},
    {"intermediate_size", intermediate_size}, {"num_hidden_layers", num_layers},
    {"num_attention_heads", num_heads}, {"num_key_value_heads", num_kv_heads},
    {"head_dim", head_dim},             {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& [key, v] : positive)
    if (v <= 0)
      return bad(key, "must be positive, got " + std::to_string(v));
  if (num_heads % num_kv_heads != 0)
    return bad("num_key_value_heads", std::to_string(num_kv_heads) + " does not divide num_attention_heads " +
                                          std::to_string(num_heads));
  if (head_dim % 2 != 0)
    return bad("head_dim", "must be even for rotary embeddings, got " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0.0))
    return bad("rms_norm_eps", "must be positive");
  if (!(rope.theta > 0.0))
    return bad("rope_theta", "must be positive");
  if (rope.type != rope_type::standard && !(rope.factor > 0.0))
    return bad("rope_parameters.factor", "must be positive");
  if (rope.type == rope_type::llama3 || rope.type == rope_type::yarn) {
    if (rope.original_max_position_embeddings <= 0)
      return bad("rope_parameters.original_max_position_embeddings", "must be positive");
  }
  if (rope.type == rope_type::llama3 && !(rope.high_freq_factor > rope.low_freq_factor))
    return bad("rope_parameters.high_freq_factor", "must exceed low_freq_factor");
  for (auto id : eos_token_ids)
    if (id < 0 || id >= vocab_size)
      return bad("eos_token_id", std::to_string(id) + " is outside the vocabulary");
  return {};
}

std::int64_t model_config::parameter_count() const {
  const std::int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  std::int64_t layer = hidden_size * q + 2 * hidden_size * kv + q * hidden_size // q, k, v, o
                       + 3 * hidden_size * intermediate_size                     // gate, up, down
                       + 2 * hidden_size;                                        // two norms
  if (qkv_bias)
    layer += q + 2 * kv;
  if (o_bias)
    layer += hidden_size;
  if (mlp_bias)
    layer += 2 * intermediate_size + hidden_size;
  std::int64_t total = num_layers * layer + hidden_size + vocab_size * hidden_size;
  if (!tie_word_embeddings)
    total += vocab_size * hidden_size;
  return total;
}

result<model_config> parse_model_config(std::string_view json, std::string_view origin_view) {
  const std::string origin{origin_view};
  auto doc = json_input::parse(json, origin);
  if (!doc)
    return doc.error();
  if (!doc->is_object())
    return fail(errc::config, origin, ": not a JSON object");
  if (auto dup = json_input::duplicate_key(*doc))
    return fail(errc::config, origin, ": ", *dup, ": given twice");
  object_reader r{*doc, origin, ""};
  model_config c;
  std::string type;
  CRUCIBLE_TRY_ASSIGN(type, r.string_or("model_type", ""));
  if (type.empty())
    return r.bad("model_type", "missing");
  auto family = parse_model_family(type);
  if (!family)
    return r.bad("model_type", family.error().message);
  c.family = *family;
  CRUCIBLE_TRY_ASSIGN(c.vocab_size, r.required_int("vocab_size"));
  CRUCIBLE_TRY_ASSIGN(c.hidden_size, r.required_int("hidden_size"));
  CRUCIBLE_TRY_ASSIGN(c.intermediate_size, r.required_int("intermediate_size"));
  CRUCIBLE_TRY_ASSIGN(c.num_layers, r.required_int("num_hidden_layers"));
  CRUCIBLE_TRY_ASSIGN(c.num_heads, r.required_int("num_attention_heads"));
  if (c.num_heads <= 0)
    return r.bad("num_attention_heads", "must be positive");
  CRUCIBLE_TRY_ASSIGN(c.num_kv_heads, r.int_or("num_key_value_heads", c.num_heads));
  if (!r.has("head_dim") && c.hidden_size % c.num_heads != 0)
    return r.bad("num_attention_heads", std::to_string(c.num_heads) + " does not divide hidden_size " +
                                            std::to_string(c.hidden_size) + " (and no head_dim is given)");
  CRUCIBLE_TRY_ASSIGN(c.head_dim, r.int_or("head_dim", c.hidden_size / c.num_heads));
  CRUCIBLE_TRY_ASSIGN(c.max_position_embeddings,
                      r.int_or("max_position_embeddings", c.family == model_family::llama ? 2048 : 32768));
  CRUCIBLE_TRY_ASSIGN(c.rms_norm_eps, r.double_or("rms_norm_eps", 1e-6));
  std::string act;
  CRUCIBLE_TRY_ASSIGN(act, r.string_or("hidden_act", "silu"));
  if (act != "silu")
    return r.bad("hidden_act", "activation '" + act + "' is not supported (silu)");
  CRUCIBLE_TRY_ASSIGN(c.tie_word_embeddings, r.bool_or("tie_word_embeddings", false));
  if (c.family == model_family::qwen2) {
    c.qkv_bias = true;
    bool sliding = false;
    CRUCIBLE_TRY_ASSIGN(sliding, r.bool_or("use_sliding_window", false));
    if (sliding)
      return r.bad("use_sliding_window", "sliding-window attention is not supported");
  } else {
    bool attention_bias = false;
    CRUCIBLE_TRY_ASSIGN(attention_bias, r.bool_or("attention_bias", false));
    c.qkv_bias = c.o_bias = attention_bias;
    CRUCIBLE_TRY_ASSIGN(c.mlp_bias, r.bool_or("mlp_bias", false));
  }
  CRUCIBLE_TRY_ASSIGN(c.rope, parse_rope(*doc, origin, c.max_position_embeddings));
  CRUCIBLE_TRY_ASSIGN(c.bos_token_id, r.optional_int("bos_token_id"));
  CRUCIBLE_TRY_ASSIGN(c.pad_token_id, r.optional_int("pad_token_id"));
  CRUCIBLE_TRY_ASSIGN(c.eos_token_ids, r.int_or_list("eos_token_id"));
  CRUCIBLE_TRY_ASSIGN(c.dtype, r.string_or("torch_dtype", ""));
  CRUCIBLE_TRY_ASSIGN(c.dtype, r.string_or("dtype", c.dtype));
  if (auto v = c.validate(); !v) {
    // validate() names the key as "config.json"; name the real file instead.
    auto msg = v.error().message;
    const std::string generic = "config.json: ";
    if (msg.rfind(generic, 0) == 0)
      msg = origin + ": " + msg.substr(generic.size());
    return crucible::error{v.error().code, msg};
  }
  return c;
}

result<model_config> read_model_config(const std::filesystem::path& path) {
  std::error_code ec;
  auto file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  auto text = read_file(file);
  if (!text)
    return text.error();
  return parse_model_config(*text, file.string());
}

std::string to_config_json(const model_config& c, std::string_view dtype) {
  json_writer w;
  w.begin_object();
  w.key("architectures").begin_array()
      .value(c.family == model_family::qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM")
      .end_array();
  w.field("model_type", to_string(c.family));
  w.field("vocab_size", c.vocab_size);
  w.field("hidden_size", c.hidden_size);
  w.field("intermediate_size", c.intermediate_size);
  w.field("num_hidden_layers", c.num_layers);
  w.field("num_attention_heads", c.num_heads);
  w.field("num_key_value_heads", c.num_kv_heads);
  w.field("head_dim", c.head_dim);
  w.field("hidden_act", "silu");
  w.field("max_position_embeddings", c.max_position_embeddings);
  w.field("rms_norm_eps", c.rms_norm_eps);
  w.field("tie_word_embeddings", c.tie_word_embeddings);
  if (c.family == model_family::llama) {
    // Llama has one switch for all four attention projections; qkv_bias without o_bias (or the
    // reverse) cannot be expressed and is never produced by parse_model_config.
    w.field("attention_bias", c.qkv_bias);
    w.field("mlp_bias", c.mlp_bias);
  } else {
    w.field("use_sliding_window", false);
  }
  w.field("rope_theta", c.rope.theta);
  w.key("rope_parameters").begin_object();
  write_rope_fields(w, c.rope, true);
  w.end_object();
  w.key("rope_scaling");
  if (c.rope.type == rope_type::standard) {
    w.null();
  } else {
    w.begin_object();
    write_rope_fields(w, c.rope, false);
    w.end_object();
  }
  for (const auto& [key, id] : {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"pad_token_id", c.pad_token_id}}) {
    w.key(key);
    if (id)
      w.value(*id);
    else
      w.null();
  }
  w.key("eos_token_id");
  if (c.eos_token_ids.empty()) {
    w.null();
  } else if (c.eos_token_ids.size() == 1) {
    w.value(c.eos_token_ids.front());
  } else {
    w.begin_array();
    for (auto id : c.eos_token_ids)
      w.value(id);
    w.end_array();
  }
  w.field("dtype", dtype);
  w.field("torch_dtype", dtype);
  w.field("use_cache", true);
  w.end_object();
  return std::move(w).take() + "\n";
}

namespace {

// The config.json values of the published models the presets copy (transformers' names in the
// comments). Sources, read when the presets were written:
// - Qwen/Qwen2.5-Coder-1.5B-Instruct: its model card ("28 layers, 12 Q and 2 KV heads, tied word
//   embeddings, 1.54B parameters, 1.31B non-embedding") and config.json as republished by
//   derivatives of it and of Qwen/Qwen2.5-Coder-1.5B (hidden_size 1536, intermediate_size 8960,
//   num_hidden_layers 28, num_attention_heads 12, num_key_value_heads 2, rope_theta 1000000.0,
//   rms_norm_eps 1e-06, max_position_embeddings 32768, vocab_size 151936,
//   tie_word_embeddings true), the same shapes as Qwen/Qwen2.5-1.5B-Instruct's config.json.
// - Qwen/Qwen2.5-Coder-7B-Instruct: config.json of the official snapshot c03e6d35 as saved by a
//   fine-tune of it (hidden_size 3584, intermediate_size 18944, num_hidden_layers 28,
//   num_attention_heads 28, num_key_value_heads 4, rope_theta 1000000.0, rms_norm_eps 1e-06,
//   max_position_embeddings 32768, vocab_size 152064, tie_word_embeddings false), its model card
//   (7.61B parameters, 6.53B non-embedding) and Qwen/Qwen2.5-7B-Instruct's config.json, same shapes.
// Both are qwen2 (q/k/v biases), silu, no sliding window. The 7B's vocabulary is 152064, not the
// 151936 of the smaller models: its embedding table is padded further.
// Entry i is the shape of published[i] (below): one row per published model, the same order.
struct published_shape {
  std::int64_t hidden, intermediate, layers, heads, kv_heads, max_positions, vocab;
  double rope_theta, rms_norm_eps;
  bool tied;
};

constexpr published_shape published_shapes[] = {
  {1536, 8960, 28, 12, 2, 32768, 151936, 1000000.0, 1e-6, true},
  {3584, 18944, 28, 28, 4, 32768, 152064, 1000000.0, 1e-6, false},
};

const published_model published[] = {
  {"qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct", qwen25_chat_template, "<|endoftext|>",
   "<|im_end|>", "<|im_start|>"},
  {"qwen2.5-coder-7b-instruct", "Qwen/Qwen2.5-Coder-7B-Instruct", qwen25_chat_template, "<|endoftext|>",
   "<|im_end|>", "<|im_start|>"},
};
static_assert(std::size(published_shapes) == std::size(published), "one shape per published model");

std::string preset_names() {
  std::string out = "tiny, small, 0.5b";
  for (const auto& p : published)
    out += ", " + std::string{p.preset};
  return out;
}

} // namespace

std::span<const published_model> published_models() { return published; }

const published_model* find_published_model(std::string_view preset) {
  for (const auto& p : published)
    if (p.preset == preset)
      return &p;
  return nullptr;
}

result<model_config> preset_config(std::string_view preset, model_family family, std::int64_t vocab_size) {
  model_config c;
  c.family = family;
  c.vocab_size = vocab_size;
  c.tie_word_embeddings = true;
  c.qkv_bias = family == model_family::qwen2;
  c.rms_norm_eps = 1e-6;
  const published_model* model = find_published_model(preset);
  const published_shape* shape = model != nullptr ? &published_shapes[model - published] : nullptr;
  if (shape != nullptr) {
    if (family != model_family::qwen2)
      return fail(errc::config, "model preset '", preset, "' is a qwen2 model, not ", to_string(family));
    if (vocab_size > shape->vocab)
      return fail(errc::config, "vocab_size: preset ", preset, " has the published vocabulary of ",
                  std::to_string(shape->vocab), " rows, fewer than the ", std::to_string(vocab_size), " asked for");
    c.hidden_size = shape->hidden, c.intermediate_size = shape->intermediate, c.num_layers = shape->layers;
    c.num_heads = shape->heads, c.num_kv_heads = shape->kv_heads, c.max_position_embeddings = shape->max_positions;
    c.vocab_size = shape->vocab;
    c.rope.theta = shape->rope_theta;
    c.rms_norm_eps = shape->rms_norm_eps;
    c.tie_word_embeddings = shape->tied;
  } else if (preset == "tiny") {
    c.hidden_size = 128, c.num_layers = 4, c.num_heads = 4, c.num_kv_heads = 2, c.intermediate_size = 384;
    c.max_position_embeddings = 4096;
    c.rope.theta = 10000.0;
  } else if (preset == "small") {
    c.hidden_size = 512, c.num_layers = 8, c.num_heads = 8, c.num_kv_heads = 2, c.intermediate_size = 1408;
    c.max_position_embeddings = 8192;
    c.rope.theta = 100000.0;
  } else if (preset == "0.5b") {
    c.hidden_size = 896, c.num_layers = 24, c.num_heads = 14, c.num_kv_heads = 2, c.intermediate_size = 4864;
    c.max_position_embeddings = 32768;
    c.rope.theta = 1000000.0;
  } else {
    return fail(errc::config, "model preset '", preset, "' is unknown (", preset_names(), ")");
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (vocab_size <= 0)
    return fail(errc::config, "vocab_size: must be positive for preset ", preset, ", got ", std::to_string(vocab_size));
  if (auto v = c.validate(); !v)
    return v.error();
  return c;
}

result<void> copy_model_side_files(const std::filesystem::path& from, const std::filesystem::path& to,
                                   const std::filesystem::path& tokenizer_json) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : model_side_files) {
    const fs::path src = !tokenizer_json.empty() && std::string_view{name} == "tokenizer.json" ? tokenizer_json : from / name;
    if (!fs::exists(src, ec))
      continue;
    auto text = read_file(src);
    if (!text)
      return text.error();
    if (auto r = write_file_atomic(to / name, *text); !r)
      return r.error();
  }
  return {};
}

} // namespace crucible::policy
