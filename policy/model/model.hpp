// policy/model/model.hpp: the Llama/Qwen2 decoder in LibTorch (RMSNorm, RoPE, grouped-query
// attention, SwiGLU, optional LoRA), loaded from and saved to Hugging Face directories. Training
// forward over padded or packed batches; decoding forward over a preallocated KV cache.
//
// Modules follow LibTorch's `FooImpl` + `TORCH_MODULE(Foo)` convention (the macro requires the
// CamelCase `Impl` suffix); everything else is snake_case. Parameter names are transformers'
// ("model.layers.0.self_attn.q_proj.weight"), so named_parameters() is the checkpoint's index.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/error.hpp"
#include "policy/model/model_config.hpp"
#include "policy/model/safetensors.hpp"
#include "policy/kernels/decode_options.hpp"

namespace crucible::policy {

/// Root-mean-square layer norm, computed in float32 and cast back, as transformers does.
/// Whether a module's forward uses the fused training kernels (policy/kernels/kernels.cu, with
/// their own gradients) for its elementwise work: on CUDA, while autograd records (the learner's
/// forward); inference (the engine, recomputed log-probs under NoGradGuard) keeps LibTorch's ops.
/// The two round at the same points; they differ in the order of float32 sums only.
/// CausalLMImpl::set_fused_training sets it for every module of a model.
struct fused_training_flag {
  bool fused_training = true;
  /// fused_training, a CUDA build, `x` on CUDA in float32/float16/bfloat16, and grad mode on.
  bool use_fused(const torch::Tensor& x) const;
};

class RMSNormImpl : public torch::nn::Module, public fused_training_flag {
public:
  RMSNormImpl(std::int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

/// LoRA adapters: which projections get one, of what rank and scale.
struct lora_options {
  std::int64_t rank = 16;
  double alpha = 32.0;   ///< scale = alpha / rank (alpha / sqrt(rank) with rslora)
  bool rslora = false;
  /// Any of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
  std::vector<std::string> targets{"q_proj", "k_proj", "v_proj", "o_proj"};
  std::uint64_t seed = 0; ///< A ~ kaiming-uniform from this seed (as PEFT); B = 0
};

/// A linear projection y = x W^T (+ b) with an optional LoRA adapter (+ scale * x A^T B^T).
/// Parameters: "weight", "bias", and with an adapter "lora_A.weight" [r, in] and
/// "lora_B.weight" [out, r] (PEFT's names).
class ProjectionImpl : public torch::nn::Module {
public:
  ProjectionImpl(std::int64_t in, std::int64_t out, bool bias);
  torch::Tensor forward(const torch::Tensor& x);

  /// Adds an adapter (A from `gen`, B zero) in the weight's dtype and device.
  void add_lora(std::int64_t rank, double scale, at::Generator& gen);
  /// Folds the adapter into `weight` and removes it.
  void merge_lora();
  bool has_lora() const noexcept { return lora_a_.defined(); }
  /// weight + scale * B A (the weight itself without an adapter), for export.
  torch::Tensor merged_weight() const;

  torch::Tensor weight, bias;

private:
  torch::Tensor lora_a_, lora_b_; ///< the "weight" of submodules lora_A and lora_B
  double lora_scale_ = 0.0;
};
TORCH_MODULE(Projection);

/// Grouped-query self-attention with rotary embeddings.
class AttentionImpl : public torch::nn::Module, public fused_training_flag {
public:
  explicit AttentionImpl(const model_config& c);
  /// x [B, T, hidden]; cos/sin [B, T, head_dim]; mask bool [B, 1, T, T] (true: attend) or
  /// undefined for plain causal attention.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask);
  /// The same, appending this step's keys and values to `k_cache`/`v_cache` [B, kv_heads, S,
  /// head_dim] at slots `slots` [B, T] and attending over the whole cache under `mask` [B, 1, T, S].
  /// Without a mask (a prefill of an empty cache) they go to slots [0, T) and attention is causal
  /// over this step's tokens.
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                               const torch::Tensor& mask, torch::Tensor& k_cache, torch::Tensor& v_cache,
                               const torch::Tensor& slots);

  /// Keeps the weights of q_proj, k_proj and v_proj (and their biases) back to back in one
  /// storage, each parameter a view of it, so that a decoding step can run the three as one GEMM
  /// (CausalLMImpl::forward_step with `fused`). Done on construction and after every move (the
  /// to() overrides); in-place updates (load_weights, optimisers) keep it. A no-op when already so.
  void join_projections();
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

private:
  std::int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

/// SwiGLU feed-forward: down(silu(gate(x)) * up(x)).
class MLPImpl : public torch::nn::Module, public fused_training_flag {
public:
  explicit MLPImpl(const model_config& c);
  torch::Tensor forward(const torch::Tensor& x);
  /// Keeps gate_proj's and up_proj's weights (and biases) back to back in one storage, gate
  /// first; see AttentionImpl::join_projections.
  void join_projections();
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

/// One pre-norm transformer block.
class DecoderLayerImpl : public torch::nn::Module {
public:
  explicit DecoderLayerImpl(const model_config& c);
  /// See AttentionImpl::forward.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask);
  /// See AttentionImpl::forward_cached.
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                               const torch::Tensor& mask, torch::Tensor& k_cache, torch::Tensor& v_cache,
                               const torch::Tensor& slots);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

/// A token embedding table, "weight" [vocab, hidden]. (torch::nn::Embedding would draw its
/// initial values from the global generator; this one starts uninitialised.)
class TokenEmbeddingImpl : public torch::nn::Module {
public:
  TokenEmbeddingImpl(std::int64_t vocab, std::int64_t dim);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;
};
TORCH_MODULE(TokenEmbedding);

/// Embeddings, blocks and the final norm (transformers' `model.` prefix).
class DecoderImpl : public torch::nn::Module {
public:
  explicit DecoderImpl(const model_config& c);
  TokenEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  std::vector<DecoderLayer> blocks; ///< the entries of `layers`, typed
};
TORCH_MODULE(Decoder);

/// A batch for the training forward. Only input_ids is required. Every row computes what it
/// would alone, including dynamic RoPE, which scales by each row's own longest position
/// (transformers uses the batch's; alone the two agree).
struct token_batch {
  torch::Tensor input_ids;      ///< [B, T] int64
  /// [B, T], 1 for tokens and 0 for padding (left or right). Padding attends to nothing real and
  /// real tokens never attend to it; positions count real tokens only, so a padded prompt gets
  /// the logits it has alone.
  torch::Tensor attention_mask;
  /// [B, T] packing: several sequences per row, each a contiguous run of one id. Tokens attend
  /// only within their run (block-diagonal causal mask) and positions restart at each run.
  torch::Tensor sequence_ids;
  /// [B, T] explicit positions; derived from the two above when undefined.
  torch::Tensor position_ids;
};

/// Preallocated keys and values of every layer, with a length per row so rows of different
/// lengths share one batch. Slots [0, lengths[r]) of row r hold its tokens. Value type whose
/// copies share storage; not thread-safe.
struct kv_cache {
  std::vector<torch::Tensor> keys, values; ///< per layer [rows, kv_heads, slots, head_dim]
  torch::Tensor lengths;                   ///< [rows] int64, on the cache's device

  std::int64_t rows() const { return lengths.size(0); }
  std::int64_t slots() const { return keys.empty() ? 0 : keys.front().size(2); }
  /// Rows [0, rows) and slots [0, slots) as views of the same storage (for the shrinking
  /// batches of decoding and for CUDA graphs, which need fixed addresses).
  kv_cache view(std::int64_t rows, std::int64_t slots) const;
  /// Moves rows `index` [n] (int64, any order) to rows [0, n), copying slots [0, used_slots).
  void compact(const torch::Tensor& index, std::int64_t used_slots);
};

/// A causal language model: Decoder plus the output projection (tied to the embeddings or not).
/// Thread-safety: as any torch::nn::Module (none); callers serialise use.
class CausalLMImpl : public torch::nn::Module {
public:
  /// Builds the architecture with uninitialised parameters (load or init_weights next).
  explicit CausalLMImpl(model_config config);

  const model_config& config() const noexcept { return config_; }

  /// Normal(0, 0.02) for matrices and embeddings, 1 for norms, 0 for biases (transformers' init),
  /// from a generator seeded with `seed`.
  void init_weights(std::uint64_t seed);

  /// Final hidden states [B, T, hidden] (after the last norm).
  torch::Tensor hidden_states(const token_batch& batch);
  /// Logits [B, T, vocab] in the parameters' dtype.
  torch::Tensor forward(const token_batch& batch);
  /// log p(targets[b, t] | tokens up to t) under softmax(logits / temperature), float32 [B, T];
  /// 0 where targets < 0. Logits are made and differentiated chunk by chunk, never all at
  /// once (the learner's memory is bounded by `chunk_tokens` x vocab).
  torch::Tensor token_log_probs(const token_batch& batch, const torch::Tensor& targets, double temperature = 1.0,
                                std::int64_t chunk_tokens = 1024);
  /// Whether the training forward on CUDA uses the fused kernels (true, the default): the output
  /// log-softmax of token_log_probs and, while autograd records, every module's RMSNorm, RoPE and
  /// silu(gate) * up (fused_training_flag); false: LibTorch ops throughout (for comparison:
  /// tools/bench/bench_learner --kernels).
  void set_fused_training(bool on);
  bool fused_training() const noexcept { return fused_training_; }
  /// Activation checkpointing of the training forward (off by default). While grad mode is on,
  /// hidden_states keeps of each decoder layer only its input (the RoPE tables and the mask are
  /// shared by all layers) instead of every intermediate activation, and the backward pass runs
  /// the layer's forward once more to differentiate it: activation memory of one layer's input per
  /// layer plus one layer's intermediates, for one more forward of each layer. The forward runs
  /// the same kernels as that recomputation (fused training kernels included), so gradients equal
  /// those without checkpointing up to the order of float32 sums. Parameters' .grad and their
  /// post-accumulate hooks (data-parallel bucketing) behave as without: each trainable parameter's
  /// gradient is accumulated once per backward pass; frozen ones (LoRA's base) get none. Inference
  /// (no grad mode) is unaffected.
  void set_activation_checkpointing(bool on) noexcept { activation_checkpointing_ = on; }
  bool activation_checkpointing() const noexcept { return activation_checkpointing_; }
  /// Projects hidden states [..., hidden] to logits [..., vocab].
  torch::Tensor logits_from_hidden(const torch::Tensor& hidden);
  /// The output matrix [vocab, hidden] (the embedding matrix when tied).
  torch::Tensor output_weight();

  /// A zeroed cache for `rows` sequences of up to `slots` tokens, in the model's dtype and device.
  kv_cache make_cache(std::int64_t rows, std::int64_t slots);
  /// Decoding forward: appends input_ids [R, T] to each row of `cache` (positions continue from
  /// cache.lengths) and returns the logits [R, vocab] of each row's last new token. With
  /// `new_tokens` [R] int64, row r takes only its first new_tokens[r] >= 1 tokens (right padding,
  /// for prompts of different lengths); otherwise all T. Advances cache.lengths.
  /// Requires lengths[r] + T <= cache.slots(). Makes no host synchronisation and no shape
  /// decisions from tensor values, so it can be captured in a CUDA graph.
  ///
  /// With `fused`, a step of one token per row (T = 1, no new_tokens) runs the fused CUDA kernels
  /// of policy/kernels/kernels.cu (residual add + RMSNorm, RoPE with the cache write, split-K
  /// decode attention, SiLU * mul; q/k/v and gate/up as one GEMM each) when fused_decode_ready(),
  /// and the LibTorch ops otherwise. Inference only (no autograd). The two agree to rounding: see
  /// docs/model.md (Fused decoding kernels) for where they can differ. With `small_batch` too, a
  /// step of at most 4 rows runs each projection as one kernel with the norm, bias, RoPE and cache
  /// write, SiLU * mul or residual add around it (fused::small_batch_supported; docs/model.md,
  /// Small-batch projections).
  torch::Tensor forward_step(const torch::Tensor& input_ids, kv_cache& cache, const torch::Tensor& new_tokens = {},
                             bool fused = false, bool small_batch = true);
  /// Where forward_step_greedy leaves its greedy sampling (fused::greedy_record's buffers).
  struct greedy_sink {
    torch::Tensor next;     ///< int64 [R]: the sampled tokens
    torch::Tensor history;  ///< float64 [R, capacity, 2]: tokens and log-probs by step
    torch::Tensor counters; ///< int32 [2]: the step recorded next, then a count kept at 0
  };
  /// forward_step(input_ids, cache, {}, fused, small_batch) of one token per row with greedy
  /// sampling of its logits recorded in `sink` as fused::greedy_record records it. A one-row fused
  /// step with the small-batch kernels ends instead in fused::greedy_head (the final norm, the
  /// output matrix and the sampling in one kernel, no logits written) where
  /// fused::greedy_head_ready allows. CUDA only; capturable in a CUDA graph.
  void forward_step_greedy(const torch::Tensor& input_ids, kv_cache& cache, const greedy_sink& sink, bool fused,
                           bool small_batch = true);
  /// Whether forward_step(..., fused = true) can run the fused kernels: a CUDA build, parameters
  /// on a CUDA device in float32, float16 or bfloat16, no LoRA adapters, projections joined (see
  /// AttentionImpl::join_projections; setting parameter data by hand can undo it) and an attention
  /// shape the kernel takes (head_dim even and at most 256).
  bool fused_decode_ready() const;
  /// The fused decoding step's kernel variants (kernels::decode_options; every default is the
  /// fastest measured), passed down to each of its kernels. A step captured in a CUDA graph keeps
  /// the variants it was captured with (engine::release_graphs before a change is seen there).
  void set_decode_options(const kernels::decode_options& o) { decode_options_ = o; }
  const kernels::decode_options& decode_options() const noexcept { return decode_options_; }
  /// forward_step into an empty cache (all lengths 0): the same result, computed as plain causal
  /// attention over the prompts (flash kernels on CUDA) instead of attention over the cache.
  torch::Tensor prefill(const torch::Tensor& input_ids, kv_cache& cache, const torch::Tensor& new_tokens = {});

  /// Adds LoRA adapters to the target projections of every layer and freezes all other
  /// parameters. errc::config naming an unknown target; errc::invalid_arg if already added.
  result<void> add_lora(const lora_options& options);
  /// Folds every adapter into its base weight and removes the adapters.
  void merge_lora();
  bool has_lora() const;
  /// Parameters with requires_grad (the adapters after add_lora, else everything).
  std::vector<torch::Tensor> trainable_parameters();
  /// Parameters by their checkpoint name, LoRA adapters excluded; merged weights when
  /// adapters exist (so an export is an ordinary model). Tied models have no lm_head.weight.
  std::vector<std::pair<std::string, torch::Tensor>> export_tensors();

  Decoder model{nullptr};
  Projection lm_head{nullptr}; ///< null when tied

private:
  torch::Tensor step(const torch::Tensor& input_ids, kv_cache& cache, const torch::Tensor& new_tokens, bool empty);
  /// forward_step of one token per row through the fused kernels; undefined when not
  /// fused_decode_ready() (nothing changed then).
  /// With `sink` at one row (small_batch), ends in fused::greedy_head where it runs, setting
  /// *sampled (and returning an undefined tensor).
  torch::Tensor fused_step(const torch::Tensor& input_ids, kv_cache& cache, bool small_batch,
                           const greedy_sink* sink = nullptr, bool* sampled = nullptr);
  /// cos, sin [B, T, head_dim] for integer positions [B, T], in `dtype`. `seq_len` [B] (the
  /// length each row has reached) matters only to dynamic RoPE.
  std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& positions, const torch::Tensor& seq_len,
                                               torch::ScalarType dtype);
  /// [head_dim / 2], or [B, head_dim / 2] for dynamic RoPE.
  torch::Tensor inv_freq(const torch::Tensor& positions, const torch::Tensor& seq_len);

  model_config config_;
  torch::Tensor inv_freq_; ///< float32, on the last device used (standard/linear/llama3/yarn)
  double attention_scaling_ = 1.0;
  bool fused_training_ = true;
  bool activation_checkpointing_ = false;
  kernels::decode_options decode_options_;
};
TORCH_MODULE(CausalLM);

/// log p(targets[n]) under softmax((hidden[n] @ weight^T) / temperature) for hidden [N, H], weight
/// [V, H], targets [N] (entries < 0 give 0 and are not computed). float32 [N]. Differentiable in
/// hidden and weight; forward and backward go `chunk` rows at a time and store no [N, V] tensor.
/// `fused`: on CUDA (float32, float16 or bfloat16 hidden and weight of one dtype), the log-softmax
/// and its gradient are kernels of policy/kernels/kernels.cu over logits in that dtype and the
/// weight gradient sums in float32 from operands in it; elsewhere it is ignored.
torch::Tensor chunked_target_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& targets, double temperature, std::int64_t chunk,
                                       bool fused = true);

/// A CPU tensor holding a copy of `view` in its own dtype (f64/f32/f16/bf16/i64/i32/i16/i8/u8/bool).
torch::Tensor to_tensor(const tensor_view& view);
/// Writes named tensors (any device, contiguous or not, any of those dtypes) as one
/// .safetensors file, atomically.
result<void> save_tensors(const std::filesystem::path& path,
                          const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

/// How load_model places the model.
struct load_options {
  torch::Device device = torch::kCPU;
  /// Parameter dtype; default bfloat16 on CUDA, float32 on CPU.
  std::optional<torch::ScalarType> dtype;
  /// Refuse weights holding NaN or infinity (bit rot that the format cannot detect otherwise).
  bool check_finite = true;
};

/// "bfloat16" -> kBFloat16, "float32" -> kFloat, "float16" -> kHalf; errc::config otherwise.
result<torch::ScalarType> parse_torch_dtype(std::string_view name);
/// The inverse of parse_torch_dtype.
const char* torch_dtype_name(torch::ScalarType t);

/// Loads an HF directory (config.json and model.safetensors or shards). Errors name the
/// missing tensor, the bad shape, the unexpected tensor or the bad config key; no model is
/// returned unless every weight loaded.
result<CausalLM> load_model(const std::filesystem::path& dir, const load_options& options = {});

/// Copies the weights of `checkpoint` into `model` in place (parameter addresses unchanged, so
/// captured CUDA graphs stay valid). Every name and shape is checked before anything is
/// copied: on error the model is unchanged.
result<void> load_weights(CausalLMImpl& model, const safetensors_checkpoint& checkpoint, bool check_finite = true);

/// How save_model writes.
struct save_options {
  torch::ScalarType dtype = torch::kBFloat16; ///< tensors are converted to this
  shard_options shards;
  /// A model directory whose tokenizer and generation files (model_side_files: tokenizer.json,
  /// tokenizer_config.json, ...; those present) are copied beside the weights, so that the folder
  /// opens in transformers and in `crucible generate` with its tokenizer; empty: none copied.
  std::filesystem::path tokenizer_from;
};

/// Writes config.json and the weights (merged with any LoRA adapters) as transformers does, so
/// transformers and crucible both load the directory, and copies options.tokenizer_from's
/// tokenizer files beside them (errc::not_found if it holds no tokenizer.json). Creates `dir`
/// if needed.
result<void> save_model(CausalLMImpl& model, const std::filesystem::path& dir, const save_options& options = {});

} // namespace crucible::policy
