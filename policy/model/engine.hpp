// policy/model/engine.hpp: batched sampling from the policy. Token ids of B prompts in, G
// completions per prompt out, each token with its log-probability and the policy version that
// sampled it. No torch types here: the engine actor includes this header without LibTorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "policy/model/model_config.hpp"

namespace crucible::policy {

class CausalLMImpl;
struct completion;

/// How one generate() call samples. Checked by generate() (errc::invalid_arg naming the field).
struct sampling_options {
  /// Softmax temperature; 0 means greedy (argmax, ties to the lowest id).
  double temperature = 1.0;
  /// Nucleus sampling: keep the most likely tokens whose probabilities sum to top_p; 1: off.
  double top_p = 1.0;
  /// Keep only the top_k most likely tokens; 0: off. Applied before top_p, as transformers does.
  std::int64_t top_k = 0;
  /// Most tokens generated per completion.
  std::int64_t max_new_tokens = 256;
  /// Completions per prompt (the GRPO group size G).
  std::int64_t samples_per_prompt = 1;
  /// Stop after a token that completes one of these strings in the generated text (needs a
  /// detokenizer). The completing token is kept; callers cut the text at the string.
  std::vector<std::string> stop;
  /// Stop after any of these tokens (kept as the last token).
  std::vector<std::int32_t> eos_ids;
  /// Seeds the sampler: the same prompts, options and weights give the same completions.
  std::uint64_t seed = 0;
  /// Called on the calling thread each time sampled tokens reach the host (after the first
  /// token, then every engine_options::sync_interval steps), with every completion of the call
  /// as it stands (prompt-major, as generate() returns them): for streaming. Unset: not called.
  std::function<void(std::span<const completion>)> on_progress;
};

/// Why a completion ended.
enum class finish_reason : std::uint8_t {
  eos,    ///< an eos id was sampled
  stop,   ///< a stop string was completed
  length, ///< max_new_tokens reached
};

/// "eos", "stop", "length".
const char* to_string(finish_reason r) noexcept;

/// One sampled continuation. Plain value.
struct completion {
  std::size_t prompt_index = 0;      ///< which prompt of the call
  std::size_t sample_index = 0;      ///< which of its G samples
  std::vector<std::int32_t> tokens;  ///< generated tokens, the stopping token included
  /// Per token: log-probability under the policy's temperature-scaled distribution,
  /// log softmax(logits / temperature)[token], *before* top-k/top-p truncation and
  /// renormalisation: the behaviour log-prob that GRPO's importance ratio needs, equal to what
  /// CausalLMImpl::token_log_probs computes at the same temperature. Greedy (temperature 0)
  /// reports log softmax(logits) of the argmax.
  std::vector<float> logprobs;
  finish_reason finish = finish_reason::length;
  std::string stop_string;           ///< the stop string matched, when finish == stop
  std::uint64_t policy_version = 0;  ///< the engine's version when generate() began
};

/// Turns token ids into text, for stop strings (the tokenizer's decode).
using detokenize_fn = std::function<std::string(std::span<const std::int32_t>)>;

/// The text a caller shows for `c`: its tokens detokenized, less the final token when it is an
/// eos, cut just before the first occurrence of the stop string it matched.
std::string completion_text(const completion& c, const detokenize_fn& detokenize);

/// Where and how the engine runs.
struct engine_options {
  std::string device = "cpu"; ///< "cpu" or "cuda:N" (engine::load only)
  std::string dtype;          ///< "bfloat16", "float32", "float16"; "": bfloat16 on CUDA, float32 on CPU (engine::load only)
  /// Capture each decoding step's forward in CUDA graphs, one per (batch rows, cache slots)
  /// bucket, lazily; CUDA only, ignored on the CPU. Graphs hold the cache's and weights'
  /// addresses: update weights in place (load_weights does) or call release_graphs().
  bool cuda_graphs = true;
  /// With cuda_graphs, greedy steps (temperature 0) sample inside the graph: the step's graph
  /// also picks the tokens, records them with their log-probs and feeds them to the next step, so
  /// a step is one graph launch. false: greedy sampling after each graph, as for temperature > 0
  /// (the same kernels; the reference the in-graph path is tested against).
  bool greedy_in_graph = true;
  /// Prompt tokens (padded) per prefill forward; longer prompt sets are prefilled in pieces.
  std::int64_t max_prefill_tokens = 16384;
  /// Decoding steps run the fused CUDA kernels (CausalLMImpl::forward_step with `fused`) where
  /// the model allows (CausalLMImpl::fused_decode_ready); false: LibTorch ops only, the reference
  /// the kernels are tested against. CUDA only; the CPU always runs LibTorch ops.
  bool fused_kernels = true;
  /// The fused kernels serve calls of at most this many rows (completions); larger batches run
  /// LibTorch ops. On an H100 (docs/performance-history.md, The rewritten decode attention) the
  /// fused step with the rewritten decode attention is 2.5x faster than LibTorch ops at batch 1,
  /// 2.3x at 16 and 1.7x at 64; larger batches are not measured.
  std::int64_t fused_max_rows = 64;
  /// With fused_kernels, steps of at most small_batch_max_rows rows (the kernels take up to 4) run
  /// each projection as one kernel with the work around it (CausalLMImpl::forward_step's
  /// `small_batch`); false: cuBLAS GEMMs between the fused kernels, as for larger batches. On an
  /// H100 (docs/performance-history.md, Small-batch projections) they made a batch-1 step 1.34x
  /// faster and a batch-4 step 1.18x slower than the cuBLAS projections, hence the default bound
  /// of 1.
  bool small_batch_kernels = true;
  std::int64_t small_batch_max_rows = 1;
  /// Decoding steps between copies of the sampled tokens to the host (at least 1). Between
  /// copies the device feeds each step's tokens to the next without waiting for the host; eos
  /// ids and stop strings are seen at the copies, so a finished completion may be computed up to
  /// sync_interval - 1 steps too far (those tokens are dropped). Finished rows leave the batch
  /// only at copies, so seeded sampling is reproducible for a given interval, not across intervals.
  std::int64_t sync_interval = 16;
};

/// What the last generate() did (for logs and benchmarks). Plain value.
struct engine_stats {
  std::int64_t prompt_tokens = 0;     ///< prompt tokens prefilled (once per prompt, not per sample)
  std::int64_t generated_tokens = 0;  ///< tokens in the returned completions
  std::int64_t decode_steps = 0;      ///< batched decoding forwards
  std::int64_t row_steps = 0;         ///< sum over steps of rows computed (finished rows included)
  std::int64_t compactions = 0;       ///< times finished rows were dropped from the batch
  std::int64_t graph_replays = 0;     ///< decoding steps run as CUDA graph replays
  std::int64_t graph_captures = 0;    ///< graphs captured during the call
  std::int64_t graph_sampled_steps = 0; ///< graph replays that also sampled (engine_options::greedy_in_graph)
  std::int64_t fused_steps = 0;       ///< decoding steps run with the fused kernels
  std::int64_t host_syncs = 0;        ///< copies of sampled tokens to the host (each waits for the device)
  std::int64_t cache_bytes = 0;       ///< bytes of the KV cache held for the call (rows x slots allocated)
  double prefill_seconds = 0.0;       ///< prompts in to first logits, the device synchronised
  double decode_seconds = 0.0;        ///< first sampled token to the last
};

/// Samples completions from a CausalLM. Owns a KV cache that grows to the largest call seen and
/// is reused (with its CUDA graphs) across calls. Not thread-safe: one caller at a time (the
/// engine actor); the model must not be used elsewhere during generate().
class engine final {
public:
  /// Loads the HF model directory `model_dir` onto options.device.
  static result<std::unique_ptr<engine>> load(const std::filesystem::path& model_dir, const engine_options& options);

  /// Samples from `model` where its parameters live (options.device/dtype are not used). The
  /// model is shared: a learner in the same process may update its weights between calls.
  engine(std::shared_ptr<CausalLMImpl> model, const engine_options& options);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Samples options.samples_per_prompt completions for each prompt; returns them prompt-major
  /// (prompt 0's samples, then prompt 1's, ...). Prompts may differ in length. errc::invalid_arg
  /// for empty prompts, ids outside the vocabulary, bad options, or stop strings without a
  /// detokenizer.
  result<std::vector<completion>> generate(std::span<const std::vector<std::int32_t>> prompts,
                                           const sampling_options& options, const detokenize_fn& detokenize = {});

  /// The version stamped on completions from the next generate() on (e.g. after new weights).
  void set_policy_version(std::uint64_t version) noexcept;
  std::uint64_t policy_version() const noexcept;

  const model_config& config() const noexcept;
  /// The model sampled from (for in-place weight updates between calls).
  CausalLMImpl& model() noexcept;
  /// The same model, shared: another engine (other options) can sample from the same weights.
  std::shared_ptr<CausalLMImpl> shared_model() const noexcept;
  /// Drops the KV cache and the captured graphs (after replacing parameter tensors, or to free
  /// memory); the next call rebuilds them.
  void release_graphs();
  /// Counters of the last generate() call.
  const engine_stats& last_stats() const noexcept;

private:
  struct state;
  std::unique_ptr<state> s_;
};

} // namespace crucible::policy
