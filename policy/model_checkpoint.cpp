// policy/model_checkpoint.cpp: a model to and from a Hugging Face checkpoint folder
// (config.json and safetensors; policy/safetensors.hpp does the format): loading weights with
// their names and shapes checked, saving, and init-model's random weights.
#include "policy/model.hpp"
#include "policy/model_detail.hpp"

#include "core/file_io.hpp"

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
result<std::vector<tensor_view>> host_views(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
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
  std::vector<torch::Tensor> host;
  auto views = host_views(model.export_tensors(), options.dtype, host);
  if (!views)
    return views.error();
  if (auto r = write_checkpoint_weights(dir, *views, options.shards); !r)
    return r.error();
  if (!options.tokenizer_from.empty()) {
    if (!fs::exists(options.tokenizer_from / "tokenizer.json", ec))
      return fail(errc::not_found, options.tokenizer_from.string(), ": no tokenizer.json to copy beside the weights");
    if (auto r = copy_model_side_files(options.tokenizer_from, dir); !r)
      return r.error();
  }
  return write_file_atomic(dir / "config.json", to_config_json(model.config(), torch_dtype_name(options.dtype)));
}

result<model_config> init_model(const init_model_options& options) {
  auto config = preset_config(options.preset, options.family, options.vocab_size);
  if (!config)
    return config.error();
  config->bos_token_id = options.bos_token_id;
  config->eos_token_ids = options.eos_token_ids;
  config->pad_token_id = options.pad_token_id;
  if (auto v = config->validate(); !v)
    return v.error();
  auto dtype = parse_torch_dtype(options.dtype);
  if (!dtype)
    return dtype.error();
  CausalLM model(*config);
  model->init_weights(options.seed);
  save_options save;
  save.dtype = *dtype;
  if (auto r = save_model(*model, options.dir, save); !r)
    return r.error();
  return config;
}

} // namespace crucible::policy
