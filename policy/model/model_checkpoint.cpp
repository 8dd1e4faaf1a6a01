// policy/model/model_checkpoint.cpp: a model to and from a Hugging Face checkpoint folder
// (config.json and safetensors; policy/model/safetensors.hpp does the format): loading weights with
// their names and shapes checked, saving, and init-model's random weights.
#include "policy/model/model.hpp"
#include "policy/model/model_detail.hpp"

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "text/tokenizer.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

namespace crucible::policy {

namespace fs = std::filesystem;
using namespace model_detail;

namespace {

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

torch::Tensor tensor_from_view(const tensor_view& v, torch::ScalarType dtype) {
  std::vector<std::int64_t> shape(v.shape.begin(), v.shape.end());
  const auto align = static_cast<std::uintptr_t>(dtype_size(v.dtype));
  if (reinterpret_cast<std::uintptr_t>(v.bytes.data()) % align == 0)
    return torch::from_blob(const_cast<std::byte*>(v.bytes.data()), shape, torch::TensorOptions().dtype(dtype));
  // The format does not promise aligned data; copy rather than hand kernels a misaligned pointer.
  auto t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), v.bytes.data(), v.bytes.size());
  return t;
}

constexpr std::pair<st_dtype, torch::ScalarType> dtype_pairs[] = {
  {st_dtype::f64, torch::kDouble}, {st_dtype::f32, torch::kFloat},  {st_dtype::f16, torch::kHalf},
  {st_dtype::bf16, torch::kBFloat16}, {st_dtype::i64, torch::kLong}, {st_dtype::i32, torch::kInt},
  {st_dtype::i16, torch::kShort},  {st_dtype::i8, torch::kChar},     {st_dtype::u8, torch::kByte},
  {st_dtype::boolean, torch::kBool},
};

torch::ScalarType torch_type_of(st_dtype d) {
  for (const auto& [s, t] : dtype_pairs)
    if (s == d)
      return t;
  return torch::kFloat;
}

std::optional<st_dtype> st_dtype_of(torch::ScalarType t) {
  for (const auto& [s, tt] : dtype_pairs)
    if (tt == t)
      return s;
  return std::nullopt;
}

std::optional<torch::ScalarType> torch_float_type(st_dtype d) {
  auto t = torch_type_of(d);
  return torch::isFloatingType(t) ? std::optional{t} : std::nullopt;
}

// CPU, contiguous copies of `tensors` and safetensors views of them (alive while `host` is).
result<std::vector<tensor_view>> host_views(std::span<const std::pair<std::string, torch::Tensor>> tensors,
                                            std::optional<torch::ScalarType> dtype, std::vector<torch::Tensor>& host) {
  std::vector<tensor_view> views;
  host.reserve(host.size() + tensors.size());
  for (const auto& [name, t] : tensors) {
    host.push_back(t.detach().to(torch::kCPU, dtype.value_or(t.scalar_type())).contiguous());
    const auto& h = host.back();
    auto st = st_dtype_of(h.scalar_type());
    if (!st)
      return fail(errc::unsupported, "tensor ", name, ": dtype ", c10::toString(h.scalar_type()),
                  " has no safetensors equivalent here");
    views.push_back(tensor_view{name, *st, std::vector<std::int64_t>(h.sizes().begin(), h.sizes().end()),
                                std::span<const std::byte>(static_cast<const std::byte*>(h.data_ptr()), h.nbytes())});
  }
  return views;
}

} // namespace

// ---- checkpoints ------------------------------------------------------------------------------

result<torch::ScalarType> parse_torch_dtype(std::string_view name) {
  if (name == "bfloat16")
    return torch::kBFloat16;
  if (name == "float32")
    return torch::kFloat;
  if (name == "float16")
    return torch::kHalf;
  return fail(errc::config, "dtype '", name, "' is not supported (bfloat16, float32, float16)");
}

const char* torch_dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kBFloat16: return "bfloat16";
    case torch::kHalf: return "float16";
    case torch::kDouble: return "float64";
    default: return "float32";
  }
}

result<void> load_weights(CausalLMImpl& model, const safetensors_checkpoint& checkpoint, bool check_finite) {
  const std::string dir = checkpoint.dir().string();
  struct assignment {
    torch::Tensor param;
    const tensor_view* view;
    torch::ScalarType dtype;
  };
  std::vector<assignment> plan;
  std::set<std::string> used;
  // Check everything before copying anything, so a bad checkpoint leaves the model as it was.
  for (auto& item : model.named_parameters(true)) {
    const auto& name = item.key();
    if (is_lora_name(name))
      continue;
    const tensor_view* v = checkpoint.find(name);
    if (v == nullptr)
      return fail(errc::not_found, dir, ": missing tensor ", name, " (config.json implies it)");
    auto& p = item.value();
    if (!std::equal(v->shape.begin(), v->shape.end(), p.sizes().begin(), p.sizes().end()))
      return fail(errc::corrupt, dir, ": tensor ", name, " has shape ", shape_text(v->shape),
                  " but config.json implies ", shape_text(p.sizes()));
    auto dtype = torch_float_type(v->dtype);
    if (!dtype)
      return fail(errc::corrupt, dir, ": tensor ", name, " has dtype ", to_string(v->dtype),
                  ", not a floating-point type");
    if (check_finite && !torch::isfinite(tensor_from_view(*v, *dtype)).all().item<bool>())
      return fail(errc::corrupt, dir, ": tensor ", name, " holds NaN or infinite values");
    plan.push_back({p, v, *dtype});
    used.insert(name);
  }
  for (const auto& name : checkpoint.names()) {
    if (used.count(name) != 0)
      continue;
    // Tied models may still carry a copy of the output matrix; old checkpoints their RoPE tables.
    if (name == "lm_head.weight" && model.config().tie_word_embeddings)
      continue;
    if (name.size() > 20 && name.compare(name.size() - 20, 20, ".rotary_emb.inv_freq") == 0)
      continue;
    return fail(errc::corrupt, dir, ": unexpected tensor ", name, " (does config.json describe these weights?)");
  }
  torch::NoGradGuard no_grad;
  for (auto& a : plan)
    a.param.copy_(tensor_from_view(*a.view, a.dtype));
  return {};
}

result<CausalLM> load_model(const fs::path& dir, const load_options& options) {
  auto config = read_model_config(dir);
  if (!config)
    return config.error();
  auto checkpoint = safetensors_checkpoint::open(dir);
  if (!checkpoint)
    return checkpoint.error();
  const auto dtype = options.dtype.value_or(options.device.is_cuda() ? torch::kBFloat16 : torch::kFloat);
  CausalLM model(*config);
  model->to(options.device, dtype);
  if (auto r = load_weights(*model, *checkpoint, options.check_finite); !r)
    return r.error();
  return model;
}

torch::Tensor to_tensor(const tensor_view& view) { return tensor_from_view(view, torch_type_of(view.dtype)).clone(); }

result<void> save_tensors(const fs::path& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<torch::Tensor> host;
  auto views = host_views(tensors, std::nullopt, host);
  if (!views)
    return views.error();
  return write_safetensors(path, *views);
}


result<void> save_model(CausalLMImpl& model, const fs::path& dir, const save_options& options) {
  if (!torch::isFloatingType(options.dtype) || !st_dtype_of(options.dtype))
    return fail(errc::invalid_arg, "save_model: dtype ", c10::toString(options.dtype), " is not a float type");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return fail(errc::io, "cannot create ", dir.string(), ": ", ec.message());
  // Names, dtypes and shapes first; each file's tensors are copied to the host only as it is
  // written, so a model on a GPU needs one shard's bytes of host memory, not the whole model's.
  const auto tensors = model.export_tensors();
  const st_dtype st = *st_dtype_of(options.dtype);
  std::vector<tensor_view> layout;
  layout.reserve(tensors.size());
  for (const auto& [name, t] : tensors)
    layout.push_back(tensor_view{name, st, std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()), {}});
  std::vector<torch::Tensor> host;
  auto shard = [&](std::size_t first, std::span<const tensor_view> part) {
    host.clear();
    return host_views(std::span{tensors}.subspan(first, part.size()), options.dtype, host);
  };
  if (auto r = write_checkpoint_weights(dir, layout, shard, options.shards); !r)
    return r.error();
  if (!options.tokenizer_from.empty()) {
    if (!fs::exists(options.tokenizer_from / "tokenizer.json", ec))
      return fail(errc::not_found, options.tokenizer_from.string(), ": no tokenizer.json to copy beside the weights");
    if (auto r = copy_model_side_files(options.tokenizer_from, dir); !r)
      return r.error();
  }
  return write_file_atomic(dir / "config.json", to_config_json(model.config(), torch_dtype_name(options.dtype)));
}

namespace {

// Copies a tokenizer's files from `source` (a directory, or a tokenizer.json file) into `dir`.
result<void> copy_tokenizer(const fs::path& source, const fs::path& dir) {
  std::error_code ec;
  const bool is_file = fs::is_regular_file(source, ec);
  fs::path from = is_file ? source.parent_path() : source;
  if (from.empty())
    from = ".";
  if (fs::equivalent(from, dir, ec))
    return {}; // the tokenizer already lives in the output directory
  return copy_model_side_files(from, dir, is_file ? source : fs::path{});
}

struct chat_token_ids {
  std::int64_t end_of_text = 0;
  std::int64_t end_of_turn = 0;
};

// The ids of the published model's special tokens in the tokenizer at `source`; an error names
// each missing one: without them the chat template would be encoded as plain text.
result<chat_token_ids> published_token_ids(const published_model& m, const fs::path& source) {
  auto tok = tokenizer::load(source);
  if (!tok)
    return tok.error();
  auto id = [&](std::string_view token) -> result<std::int64_t> {
    if (auto i = tok->id_of(token))
      return std::int64_t{*i};
    return fail(errc::config, source.string(), ": preset ", m.preset, " (the chat format of ", m.repository,
                ") needs the token ", token, ", which this tokenizer lacks");
  };
  auto end_of_text = id(m.end_of_text);
  if (!end_of_text)
    return end_of_text.error();
  auto end_of_turn = id(m.end_of_turn);
  if (!end_of_turn)
    return end_of_turn.error();
  if (auto r = id(m.turn_start); !r)
    return r.error();
  return chat_token_ids{*end_of_text, *end_of_turn};
}

// The published model's chat format in `dir`: tokenizer_config.json keeps the copied tokenizer's
// settings but takes the published chat template and special tokens (chat_template.jinja, which
// transformers would read first, is removed), and generation_config.json its ids.
result<void> write_published_chat_files(const fs::path& dir, const published_model& m, const chat_token_ids& ids) {
  const fs::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  json_object config;
  if (fs::exists(config_path, ec)) {
    auto doc = read_json_file(config_path);
    if (!doc)
      return doc.error();
    if (!doc->is_object())
      return fail(errc::corrupt, config_path.string(), ": not a JSON object");
    config = doc->as_object();
  } else {
    config.push_back({"tokenizer_class", json_value{"PreTrainedTokenizerFast"}});
  }
  const std::pair<const char*, json_value> published_keys[] = {
    {"bos_token", json_value{}},
    {"eos_token", json_value{std::string{m.end_of_turn}}},
    {"pad_token", json_value{std::string{m.end_of_text}}},
    {"chat_template", json_value{std::string{m.chat_template}}},
  };
  for (const auto& [key, value] : published_keys) {
    auto it = std::find_if(config.begin(), config.end(), [&](const json_member& x) { return x.key == key; });
    if (it != config.end())
      it->value = value;
    else
      config.push_back({key, value});
  }
  if (auto r = write_file_atomic(config_path, to_json_text(json_value{std::move(config)}) + "\n"); !r)
    return r;
  fs::remove(dir / "chat_template.jinja", ec);

  json_writer gen;
  gen.begin_object()
    .field("bos_token_id", ids.end_of_text)
    .field("pad_token_id", ids.end_of_text)
    .key("eos_token_id").begin_array().value(ids.end_of_turn).value(ids.end_of_text).end_array()
    .end_object();
  return write_file_atomic(dir / "generation_config.json", std::move(gen).take() + "\n");
}

} // namespace

result<model_config> init_model(const init_model_options& options) {
  const published_model* published = find_published_model(options.preset);
  model_config config;
  if (options.config) {
    config = *options.config;
  } else {
    auto preset = preset_config(options.preset, options.family, options.vocab_size);
    if (!preset)
      return preset.error();
    config = std::move(*preset);
  }
  config.bos_token_id = options.bos_token_id;
  config.eos_token_ids = options.eos_token_ids;
  config.pad_token_id = options.pad_token_id;
  std::optional<chat_token_ids> ids;
  if (published != nullptr) {
    // As the published config.json: bos and eos (the end of a turn) set, pad only in
    // generation_config.json.
    auto found = published_token_ids(*published, options.tokenizer.empty() ? options.dir : options.tokenizer);
    if (!found)
      return found.error();
    ids = *found;
    config.bos_token_id = ids->end_of_text;
    config.eos_token_ids = {ids->end_of_turn};
    config.pad_token_id.reset();
  }
  if (auto v = config.validate(); !v)
    return v.error();
  auto dtype = parse_torch_dtype(options.dtype);
  if (!dtype)
    return dtype.error();
  CausalLM model(config);
  // Drawn into parameters of the saved dtype: the same rounding as drawing in float32 and
  // converting when saving, without a float32 copy of the model beside the saved one.
  model->to(*dtype);
  model->init_weights(options.seed);
  save_options save;
  save.dtype = *dtype;
  save.shards = options.shards;
  if (auto r = save_model(*model, options.dir, save); !r)
    return r.error();
  if (!options.tokenizer.empty())
    if (auto r = copy_tokenizer(options.tokenizer, options.dir); !r)
      return r.error();
  if (published != nullptr)
    if (auto r = write_published_chat_files(options.dir, *published, *ids); !r)
      return r.error();
  return config;
}

} // namespace crucible::policy
