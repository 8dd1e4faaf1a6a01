// policy/model/engine.cpp: prompts (token ids) from the rollout actor in, sampled completions with
// behaviour log-probs out. Prefill once per prompt, copy its cache to the G sample rows, then
// decode all rows together, dropping finished rows as the batch empties.
#include "policy/model/engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>

#ifdef CRUCIBLE_HAVE_CUDA
#  include <ATen/cuda/CUDAContext.h>
#  include <ATen/cuda/CUDAEvent.h>
#  include <ATen/cuda/CUDAGeneratorImpl.h>
#  include <ATen/cuda/CUDAGraph.h>
#  include <c10/cuda/CUDAGuard.h>

#  include "policy/kernels/fused.hpp"
#endif

#include "policy/model/model.hpp"

namespace crucible::policy {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Smallest power of two >= n, at least `floor`, at most `cap`.
std::int64_t bucket(std::int64_t n, std::int64_t floor, std::int64_t cap) {
  std::int64_t b = floor;
  while (b < n)
    b *= 2;
  return std::min(b, cap);
}

// The sampled token of each row and its behaviour log-prob (see completion::logprobs).
struct sample_result {
  torch::Tensor tokens;   // [n] int64
  torch::Tensor logprobs; // [n] float32
};

sample_result sample(const torch::Tensor& logits, const sampling_options& o, at::Generator& gen) {
#ifdef CRUCIBLE_HAVE_CUDA
  // Greedy on the device: two kernels (fused::greedy_logprob) instead of a float copy, an argmax
  // and a log-softmax of the whole vocabulary.
  if (o.temperature == 0.0 && logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous()
      && fused::supported_dtype(logits.scalar_type()) && logits.size(0) <= 65535) {
    auto [tokens, lp] = fused::greedy_logprob(logits);
    return {tokens, lp};
  }
#endif
  auto scores = logits.to(torch::kFloat);
  if (o.temperature == 0.0) {
    auto tokens = scores.argmax(-1);
    auto lp = torch::log_softmax(scores, -1).gather(1, tokens.unsqueeze(1)).squeeze(1);
    return {tokens, lp};
  }
  scores = scores / o.temperature;
  auto policy_logp = torch::log_softmax(scores, -1);
  auto filtered = scores;
  const auto vocab = scores.size(-1);
  if (o.top_k > 0 && o.top_k < vocab) {
    auto kth = std::get<0>(scores.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
    filtered = filtered.masked_fill(filtered < kth, -std::numeric_limits<float>::infinity());
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = filtered.sort(-1, /*descending=*/true);
    auto probs = torch::softmax(sorted, -1);
    // Drop a token once the more likely ones already reach top_p; the first always stays.
    auto drop = (probs.cumsum(-1) - probs) > o.top_p;
    sorted = sorted.masked_fill(drop, -std::numeric_limits<float>::infinity());
    filtered = torch::empty_like(sorted).scatter_(-1, order, sorted);
  }
  auto tokens = torch::multinomial(torch::softmax(filtered, -1), 1, /*replacement=*/false, gen).squeeze(1);
  return {tokens, policy_logp.gather(1, tokens.unsqueeze(1)).squeeze(1)};
}

at::Generator make_generator(const torch::Device& device, std::uint64_t seed) {
#ifdef CRUCIBLE_HAVE_CUDA
  if (device.is_cuda()) {
    auto gen = at::cuda::detail::createCUDAGenerator(device.has_index() ? device.index() : 0);
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  return at::detail::createCPUGenerator(seed);
}

} // namespace

const char* to_string(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::eos: return "eos";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
  }
  return "?";
}

std::string completion_text(const completion& c, const detokenize_fn& detokenize) {
  std::span<const std::int32_t> tokens{c.tokens};
  if (c.finish == finish_reason::eos && !tokens.empty())
    tokens = tokens.first(tokens.size() - 1);
  auto text = detokenize(tokens);
  if (c.finish == finish_reason::stop && !c.stop_string.empty())
    if (auto at = text.find(c.stop_string); at != std::string::npos)
      text.resize(at);
  return text;
}

#ifdef CRUCIBLE_HAVE_CUDA
// Decoding steps captured as CUDA graphs, one per (rows, slots) bucket, over views of one cache.
// The graphs read the input tokens from `input` and leave the logits in `logits`; both live as
// long as the graph, as do the cache views' storage (the cache is never reallocated while
// graphs exist).
//
// Greedy graphs (step_greedy) also sample: their input is the shared `tokens_` buffer, which the
// step's greedy sampling overwrites with the next tokens, and they record tokens and log-probs in
// `history_` at the step `counters_[0]`, which each replay advances (fused::greedy_record). A block
// of steps is then one replay a step, with nothing else queued between them, and the next block
// can start on the device before the host has read this one (engine::generate).
class decode_graphs final {
public:
  torch::Tensor step(CausalLMImpl& model, kv_cache& cache, std::int64_t rows, std::int64_t slots,
                     const torch::Tensor& tokens, bool fused, bool small_batch, engine_stats& stats) {
    auto& g = entry_for(model, cache, rows, slots, fused, small_batch, /*greedy=*/false, stats);
    g.input.copy_(tokens, /*non_blocking=*/true);
    g.graph.replay();
    ++stats.graph_replays;
    return g.logits;
  }

  /// Buffers for greedy graphs of up to `rows` rows and blocks of up to `interval` steps, in two
  /// halves so that one block's history can be copied out while the next block records (the
  /// graphs captured over smaller buffers are dropped).
  void reserve_greedy(const torch::Device& device, std::int64_t rows, std::int64_t interval) {
    if (tokens_.defined() && tokens_.size(0) >= rows && half_ >= interval)
      return;
    clear();
    auto on = torch::TensorOptions().device(device);
    half_ = interval;
    tokens_ = torch::zeros({rows}, on.dtype(torch::kLong));
    history_ = torch::zeros({rows, 2 * half_, 2}, on.dtype(torch::kDouble));
    host_ = torch::empty({rows, 2 * half_, 2}, torch::TensorOptions().dtype(torch::kDouble).pinned_memory(true));
    counters_ = torch::zeros({2}, on.dtype(torch::kInt));
  }

  /// The next greedy step is recorded as step 0 of `half` (0 or 1), at history step half x interval.
  void begin_half(int half) { counters_.narrow(0, 0, 1).fill_(half * half_); }
  std::int64_t half_offset(int half) const { return half * half_; }

  /// The next greedy step reads `tokens` (int64 [rows] on the host).
  void set_tokens(const torch::Tensor& tokens) { tokens_.narrow(0, 0, tokens.size(0)).copy_(tokens); }

  /// One decoding step with its greedy sampling (reserve_greedy and begin_half first).
  void step_greedy(CausalLMImpl& model, kv_cache& cache, std::int64_t rows, std::int64_t slots, bool fused,
                   bool small_batch, engine_stats& stats) {
    auto& g = entry_for(model, cache, rows, slots, fused, small_batch, /*greedy=*/true, stats);
    g.graph.replay();
    ++stats.graph_replays;
    ++stats.graph_sampled_steps;
  }

  /// Queues a copy of the first `rows` rows' history to the host (wait_history waits for it).
  void copy_history(std::int64_t rows) {
    host_.narrow(0, 0, rows).copy_(history_.narrow(0, 0, rows), /*non_blocking=*/true);
    copied_.record(at::cuda::getCurrentCUDAStream());
  }

  /// The history copy_history queued: [rows (of that call), 2 x interval, token or log-prob].
  at::TensorAccessor<double, 3> wait_history() {
    copied_.synchronize();
    return host_.accessor<double, 3>();
  }

  /// Drops every graph and the memory pool they shared: a pool whose graphs are all gone is
  /// freed by the allocator, and capturing into its stale id again trips an internal assert.
  void clear() {
    graphs_.clear();
    pool_.reset();
  }

private:
  struct entry {
    at::cuda::CUDAGraph graph;
    torch::Tensor input;  // [rows, 1] int64
    torch::Tensor logits; // [rows, vocab]
  };

  entry& entry_for(CausalLMImpl& model, kv_cache& cache, std::int64_t rows, std::int64_t slots, bool fused,
                   bool small_batch, bool greedy, engine_stats& stats) {
    auto& g = graphs_[{rows, slots, greedy}];
    if (!g) {
      g = std::make_unique<entry>();
      capture(model, cache, rows, slots, fused, small_batch, greedy, *g);
      ++stats.graph_captures;
    }
    return *g;
  }

  void capture(CausalLMImpl& model, kv_cache& cache, std::int64_t rows, std::int64_t slots, bool fused,
               bool small_batch, bool greedy, entry& g) {
    auto view = cache.view(rows, slots);
    g.input = greedy ? tokens_.narrow(0, 0, rows).view({rows, 1}) : torch::zeros({rows, 1}, cache.lengths.options());
    if (!pool_)
      pool_ = at::cuda::graph_pool_handle();
    auto saved = view.lengths.clone();
    auto side = at::cuda::getStreamFromPool();
    // Captures are rare (one per bucket); waiting for the engine's stream is the simple way to
    // order the side stream after the work queued so far, and the later work after the capture.
    // (Not the whole device: the learner's update may be running on it.)
    at::cuda::getCurrentCUDAStream().synchronize();
    {
      c10::cuda::CUDAStreamGuard guard(side);
      // A warm-up run initialises lazily created state (cuBLAS handles, the RoPE table) outside
      // the capture. It writes one slot per row at that row's length, the slot the real step
      // overwrites next, and advances the lengths, which we put back. (Greedy sampling has no
      // such state, and running it here would move the block's step.)
      model.forward_step(g.input, view, {}, fused, small_batch);
      view.lengths.copy_(saved);
      side.synchronize();
      // Thread-local capture: the learner's and the evaluator's CUDA calls on other threads of
      // the process (allocations, copies, synchronisations) neither break the capture nor are
      // refused while it runs.
      g.graph.capture_begin(*pool_, cudaStreamCaptureModeThreadLocal);
      if (greedy)
        model.forward_step_greedy(g.input, view, {tokens_.narrow(0, 0, rows), history_.narrow(0, 0, rows), counters_},
                                  fused, small_batch);
      else
        g.logits = model.forward_step(g.input, view, {}, fused, small_batch);
      g.graph.capture_end();
    }
    side.synchronize();
  }

  std::map<std::tuple<std::int64_t, std::int64_t, bool>, std::unique_ptr<entry>> graphs_;
  std::optional<at::cuda::MempoolId_t> pool_;
  torch::Tensor tokens_;   // [rows] int64: greedy graphs' input, overwritten by their sampling
  torch::Tensor history_;  // [rows, 2 x half_, token or log-prob] float64
  torch::Tensor host_;     // history_'s copy in pinned host memory
  torch::Tensor counters_; // int32 [step, rows finished]
  std::int64_t half_ = 0;
  at::cuda::CUDAEvent copied_;
};
#endif

struct engine::state {
  CausalLM model{nullptr};
  torch::Device device{torch::kCPU};
  bool graphs_enabled = false;
  bool greedy_in_graph = true;
  bool fused = false;
  std::int64_t fused_max_rows = 64;
  bool small_batch = true;
  std::int64_t small_batch_max_rows = 1;
  std::int64_t max_prefill_tokens = 16384;
  std::int64_t sync_interval = 16;
  kv_cache cache;
  std::atomic<std::uint64_t> version{0};
  engine_stats stats;
#ifdef CRUCIBLE_HAVE_CUDA
  decode_graphs graphs;
  // CUDA: the engine's own stream (high priority). generate() runs on it, not on the device's
  // default stream, which the learner's thread uses: on one GPU the update overlaps the decoding
  // instead of queueing behind it (or the decoding behind the update).
  std::optional<c10::cuda::CUDAStream> stream;
#endif

  // The cache has at least `rows` rows and `slots` slots (regrown, dropping graphs, if not).
  void reserve(std::int64_t rows, std::int64_t slots) {
    if (!cache.keys.empty() && cache.rows() >= rows && cache.slots() >= slots) {
      cache.lengths.zero_();
      return;
    }
    release();
    // Round slots up to a multiple of 256 so that slightly longer calls do not reallocate (and
    // recapture) each time, without the up-to-2x memory of rounding to a power of two.
    auto grown_rows = std::max(rows, cache.keys.empty() ? 0 : cache.rows());
    auto grown_slots = std::max((slots + 255) / 256 * 256, cache.keys.empty() ? 0 : cache.slots());
    cache = model->make_cache(grown_rows, grown_slots);
  }

  void release() {
#ifdef CRUCIBLE_HAVE_CUDA
    graphs.clear();
#endif
    cache = kv_cache{};
  }

  // One decoding forward over cache rows [0, rows) with `used` slots in use in the longest row.
  torch::Tensor decode(const torch::Tensor& tokens, std::int64_t rows, std::int64_t used) {
    const bool small = small_batch && rows <= small_batch_max_rows;
#ifdef CRUCIBLE_HAVE_CUDA
    if (graphs_enabled) {
      // Bucketed shapes so that a few graphs serve every step; the last bucket is the cache.
      auto slots = bucket(used + 1, 256, cache.slots());
      return graphs.step(*model, cache, rows, slots, tokens, fused, small, stats);
    }
#endif
    auto view = cache.view(rows, used + 1);
    return model->forward_step(tokens, view, {}, fused, small);
  }

#ifdef CRUCIBLE_HAVE_CUDA
  // decode() with greedy sampling in the graph (decode_graphs::step_greedy).
  void decode_greedy(std::int64_t rows, std::int64_t used) {
    const bool small = small_batch && rows <= small_batch_max_rows;
    auto slots = bucket(used + 1, 256, cache.slots());
    graphs.step_greedy(*model, cache, rows, slots, fused, small, stats);
  }
#endif
};

result<std::unique_ptr<engine>> engine::load(const std::filesystem::path& model_dir, const engine_options& options) {
  torch::Device device{torch::kCPU};
  try {
    device = torch::Device(options.device);
  } catch (const c10::Error&) {
    return fail(errc::config, "engine.devices: '", options.device, "' is not a device (cpu, cuda:N)");
  }
  if (device.is_cuda() && !torch::cuda::is_available())
    return fail(errc::device, "engine.devices: ", options.device, " requested but no CUDA device is available");
  load_options lo;
  lo.device = device;
  if (!options.dtype.empty()) {
    auto dt = parse_torch_dtype(options.dtype);
    if (!dt)
      return fail(errc::config, "engine.dtype: ", dt.error().message);
    lo.dtype = *dt;
  }
  auto model = load_model(model_dir, lo);
  if (!model)
    return model.error();
  return std::make_unique<engine>(model->ptr(), options);
}

engine::engine(std::shared_ptr<CausalLMImpl> model, const engine_options& options) : s_(std::make_unique<state>()) {
  s_->model = CausalLM(std::move(model));
  s_->model->eval();
  s_->device = s_->model->model->embed_tokens->weight.device();
  s_->graphs_enabled = options.cuda_graphs && s_->device.is_cuda();
  s_->greedy_in_graph = options.greedy_in_graph;
  s_->max_prefill_tokens = std::max<std::int64_t>(1, options.max_prefill_tokens);
  s_->fused = options.fused_kernels && s_->device.is_cuda();
  s_->fused_max_rows = options.fused_max_rows;
  s_->small_batch = options.small_batch_kernels;
  s_->small_batch_max_rows = options.small_batch_max_rows;
  s_->sync_interval = std::max<std::int64_t>(1, options.sync_interval);
#ifdef CRUCIBLE_HAVE_CUDA
  if (s_->device.is_cuda()) {
    // The weights were copied to the device on this thread's stream: complete before the
    // engine's stream reads them.
    c10::cuda::getCurrentCUDAStream(s_->device.index()).synchronize();
    s_->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, s_->device.index());
  }
#endif
}

engine::~engine() = default;

void engine::set_policy_version(std::uint64_t version) noexcept { s_->version.store(version); }
std::uint64_t engine::policy_version() const noexcept { return s_->version.load(); }
const model_config& engine::config() const noexcept { return s_->model->config(); }
CausalLMImpl& engine::model() noexcept { return *s_->model; }
std::shared_ptr<CausalLMImpl> engine::shared_model() const noexcept { return s_->model.ptr(); }
void engine::release_graphs() { s_->release(); }
const engine_stats& engine::last_stats() const noexcept { return s_->stats; }

result<std::vector<completion>> engine::generate(std::span<const std::vector<std::int32_t>> prompts,
                                                 const sampling_options& o, const detokenize_fn& detokenize) {
  auto& s = *s_;
  const auto vocab = s.model->config().vocab_size;
  auto bad = [](const char* field, const std::string& what) { return fail(errc::invalid_arg, "sampling.", field, ": ", what); };
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    return bad("temperature", "must be >= 0");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    return bad("top_p", "must be in (0, 1]");
  if (o.top_k < 0)
    return bad("top_k", "must be >= 0");
  if (o.max_new_tokens < 1)
    return bad("max_new_tokens", "must be >= 1");
  if (o.samples_per_prompt < 1)
    return bad("samples_per_prompt", "must be >= 1");
  for (const auto& stop : o.stop)
    if (stop.empty())
      return bad("stop", "empty stop string");
  if (!o.stop.empty() && !detokenize)
    return bad("stop", "stop strings need a detokenizer");
  for (auto id : o.eos_ids)
    if (id < 0 || id >= vocab)
      return bad("eos_ids", std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      return fail(errc::invalid_arg, "prompt ", std::to_string(i), " is empty");
    for (auto id : prompts[i])
      if (id < 0 || id >= vocab)
        return fail(errc::invalid_arg, "prompt ", std::to_string(i), " holds token ", std::to_string(id),
                    ", outside the vocabulary of ", std::to_string(vocab));
  }
  s.stats = engine_stats{};
  const std::int64_t n_prompts = static_cast<std::int64_t>(prompts.size());
  const std::int64_t group = o.samples_per_prompt;
  const std::int64_t n = n_prompts * group;
  std::vector<completion> out(static_cast<std::size_t>(n));
  const auto version = s.version.load();
  for (std::int64_t c = 0; c < n; ++c) {
    out[c].prompt_index = static_cast<std::size_t>(c / group);
    out[c].sample_index = static_cast<std::size_t>(c % group);
    out[c].policy_version = version;
    out[c].tokens.reserve(static_cast<std::size_t>(std::min<std::int64_t>(o.max_new_tokens, 4096)));
  }
  if (n == 0)
    return out;

  torch::NoGradGuard no_grad;
#ifdef CRUCIBLE_HAVE_CUDA
  // On the engine's stream; the call returns with that stream idle, so that another thread may
  // replace weights (policy::weight_handoff::install) or read the cache between calls.
  struct drain {
    std::optional<c10::cuda::CUDAStream> stream;
    ~drain() {
      if (stream)
        (void) cudaStreamSynchronize(stream->stream());
    }
  } drained;
  std::optional<c10::cuda::CUDAStreamGuard> on_stream;
  if (s.stream) {
    on_stream.emplace(*s.stream);
    drained.stream = *s.stream;
  }
#endif
  std::int64_t longest = 0;
  for (const auto& p : prompts)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(p.size()));
  s.reserve(n, longest + o.max_new_tokens);
  for (std::size_t l = 0; l < s.cache.keys.size(); ++l)
    s.stats.cache_bytes += static_cast<std::int64_t>(s.cache.keys[l].nbytes() + s.cache.values[l].nbytes());
  auto gen = make_generator(s.device, o.seed);
  auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(s.device);

  // ---- prefill: each prompt once, its keys and values copied to its G rows -------------------
  auto t0 = clock_type::now();
  torch::Tensor first_logits; // [n, vocab]
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(n)); // per cache row, on the host
  for (std::int64_t b0 = 0; b0 < n_prompts;) {
    // As many prompts as fit the token budget (padded to the longest among them), at least one.
    std::int64_t b1 = b0, width = 0;
    while (b1 < n_prompts) {
      auto w = std::max<std::int64_t>(width, static_cast<std::int64_t>(prompts[b1].size()));
      if (b1 > b0 && w * (b1 + 1 - b0) > s.max_prefill_tokens)
        break;
      width = w;
      ++b1;
    }
    const auto mb = b1 - b0;
    auto ids = torch::zeros({mb, width}, torch::kLong);
    auto counts = torch::empty({mb}, torch::kLong);
    for (std::int64_t i = 0; i < mb; ++i) {
      const auto& p = prompts[b0 + i];
      auto row = ids[i].narrow(0, 0, static_cast<std::int64_t>(p.size()));
      row.copy_(torch::tensor(std::vector<std::int64_t>(p.begin(), p.end()), torch::kLong));
      counts[i] = static_cast<std::int64_t>(p.size());
      s.stats.prompt_tokens += static_cast<std::int64_t>(p.size());
      for (std::int64_t g = 0; g < group; ++g)
        lengths[(b0 + i) * group + g] = static_cast<std::int64_t>(p.size());
    }
    auto scratch = s.model->make_cache(mb, width);
    auto logits = s.model->prefill(ids.to(s.device), scratch, counts.to(s.device));
    auto src = torch::arange(mb, long_opts).repeat_interleave(group);
    auto dst = torch::arange(b0 * group, b1 * group, long_opts);
    for (std::size_t l = 0; l < scratch.keys.size(); ++l) {
      s.cache.keys[l].narrow(2, 0, width).index_copy_(0, dst, scratch.keys[l].index_select(0, src));
      s.cache.values[l].narrow(2, 0, width).index_copy_(0, dst, scratch.values[l].index_select(0, src));
    }
    s.cache.lengths.index_copy_(0, dst, scratch.lengths.index_select(0, src));
    auto rows = logits.index_select(0, src).to(torch::kFloat);
    first_logits = first_logits.defined() ? torch::cat({first_logits, rows}) : rows;
    b0 = b1;
  }
#ifdef CRUCIBLE_HAVE_CUDA
  // Kernels run asynchronously: wait for the prefill so that its time is not counted as decoding
  // (the first sampling step would wait for it anyway).
  if (s.device.is_cuda())
    c10::cuda::getCurrentCUDAStream(s.device.index()).synchronize();
#endif
  s.stats.prefill_seconds = seconds_since(t0);

  // ---- decode -----------------------------------------------------------------------------------
  t0 = clock_type::now();
  std::int64_t max_stop = 0;
  for (const auto& stop : o.stop)
    max_stop = std::max<std::int64_t>(max_stop, static_cast<std::int64_t>(stop.size()));
  // Tokens decode to at least one byte each (special tokens aside, hence the margin), so a window
  // this long holds any stop string that the newest token completes.
  const std::int64_t window = max_stop + 8;
  std::vector<std::int64_t> owner(static_cast<std::size_t>(n)); // cache row -> completion (-1: none)
  for (std::int64_t r = 0; r < n; ++r)
    owner[r] = r;
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  std::vector<std::int64_t> last(static_cast<std::size_t>(n), 0); // per cache row: token to feed next
  std::int64_t active = n, rows = n;

  // Appends a sampled token of cache row `row` to its completion and decides whether that
  // completion is finished.
  auto accept = [&](std::int64_t row, std::int32_t token, float logprob) {
    auto& c = out[owner[row]];
    c.tokens.push_back(token);
    c.logprobs.push_back(logprob);
    bool finished = false;
    if (std::find(o.eos_ids.begin(), o.eos_ids.end(), token) != o.eos_ids.end()) {
      c.finish = finish_reason::eos;
      finished = true;
    } else if (!o.stop.empty()) {
      const auto k = std::min<std::int64_t>(window, static_cast<std::int64_t>(c.tokens.size()));
      const std::string tail = detokenize(std::span<const std::int32_t>(c.tokens).last(static_cast<std::size_t>(k)));
      for (const auto& stop : o.stop)
        if (tail.find(stop) != std::string::npos) {
          c.finish = finish_reason::stop;
          c.stop_string = stop;
          finished = true;
          break;
        }
    }
    if (!finished && static_cast<std::int64_t>(c.tokens.size()) >= o.max_new_tokens) {
      c.finish = finish_reason::length;
      finished = true;
    }
    if (finished) {
      done[owner[row]] = true;
      --active;
    }
  };

  {
    auto picked = sample(first_logits, o, gen);
    auto tokens = picked.tokens.to(torch::kCPU);
    auto logprobs = picked.logprobs.to(torch::kCPU);
    ++s.stats.host_syncs;
    auto tok = tokens.accessor<std::int64_t, 1>();
    auto lp = logprobs.accessor<float, 1>();
    for (std::int64_t r = 0; r < n; ++r) {
      last[r] = tok[r];
      accept(r, static_cast<std::int32_t>(tok[r]), lp[r]);
    }
    first_logits = torch::Tensor{};
    if (o.on_progress)
      o.on_progress(out);
  }

  // Each block of steps feeds every step's sampled tokens to the next on the device and keeps
  // them, with their log-probs, in `history` ([row, step, token or log-prob]; doubles hold both
  // exactly), copied to the host once at the end of the block. Every row is sampled, finished
  // or not, so the sampler sees the same shapes whenever the host looks.
  const bool fused_now = s.fused && n <= s.fused_max_rows && s.model->fused_decode_ready();
  const std::int64_t interval = std::min(s.sync_interval, o.max_new_tokens); // no block is longer
  // Greedy steps in CUDA graphs sample inside the graph (decode_graphs::step_greedy): their
  // history is the graphs' own buffer.
  bool greedy_graphs = false;
#ifdef CRUCIBLE_HAVE_CUDA
  greedy_graphs = s.graphs_enabled && s.greedy_in_graph && o.temperature == 0.0
                  && fused::supported_dtype(s.model->model->embed_tokens->weight.scalar_type()) && n <= 65535;
  if (greedy_graphs)
    s.graphs.reserve_greedy(s.device, s.cache.rows(), interval);
#endif
  // The rows a smaller batch keeps once enough are finished: with graphs, when a smaller batch
  // bucket fits (the rest of the bucket is filled with finished rows, computed and ignored);
  // without, when a quarter of the rows are finished. Returns `rows` for none.
  auto compaction_target = [&] {
    if (s.graphs_enabled)
      return bucket(active, 1, rows);
    return active <= rows - std::max<std::int64_t>(1, rows / 4) ? active : rows;
  };
  auto compact = [&](std::int64_t target) {
    std::vector<std::int64_t> keep;
    keep.reserve(static_cast<std::size_t>(target));
    for (std::int64_t r = 0; r < rows && static_cast<std::int64_t>(keep.size()) < active; ++r)
      if (!done[owner[r]])
        keep.push_back(r);
    for (std::int64_t r = 0; r < rows && static_cast<std::int64_t>(keep.size()) < target; ++r)
      if (done[owner[r]])
        keep.push_back(r);
    std::int64_t used = 0;
    for (auto r : keep)
      used = std::max(used, lengths[r]);
    s.cache.compact(torch::tensor(keep, torch::kLong), used);
    std::vector<std::int64_t> owner2, lengths2, last2;
    for (auto r : keep) {
      owner2.push_back(owner[r]);
      lengths2.push_back(lengths[r]);
      last2.push_back(last[r]);
    }
    owner = std::move(owner2);
    lengths = std::move(lengths2);
    last = std::move(last2);
    rows = target;
    ++s.stats.compactions;
  };
  // No completion reaches max_new_tokens inside a block: the shortest remaining one ends it.
  auto block_steps = [&] {
    std::int64_t steps = interval;
    for (std::int64_t r = 0; r < rows; ++r)
      if (!done[owner[r]])
        steps = std::min(steps, o.max_new_tokens - static_cast<std::int64_t>(out[owner[r]].tokens.size()));
    return steps;
  };
  auto count_step = [&] {
    ++s.stats.decode_steps;
    s.stats.row_steps += rows;
    if (fused_now)
      ++s.stats.fused_steps;
  };
  // The first `rows` entries of a per-row vector, as the int64 tensor the device takes.
  auto batch_tensor = [&](const std::vector<std::int64_t>& v) {
    return torch::tensor(std::vector<std::int64_t>(v.begin(), v.begin() + rows), torch::kLong);
  };
  // A block's `steps` tokens and log-probs, h[row][at + j], into the completions.
  auto take_block = [&](const at::TensorAccessor<double, 3>& h, std::int64_t at, std::int64_t steps) {
    for (std::int64_t r = 0; r < rows; ++r) {
      last[r] = static_cast<std::int64_t>(h[r][at + steps - 1][0]);
      // Tokens after a completion's end were computed but are not part of it.
      for (std::int64_t j = 0; j < steps && !done[owner[r]]; ++j)
        accept(r, static_cast<std::int32_t>(h[r][at + j][0]), static_cast<float>(h[r][at + j][1]));
    }
  };
  auto slots_used = [&] {
    std::int64_t used = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      used = std::max(used, lengths[r]);
    return used;
  };

#ifdef CRUCIBLE_HAVE_CUDA
  if (greedy_graphs) {
    // Steps that sample inside their graphs. Blocks alternate between the two halves of the
    // graphs' history. Once a block's steps and the copy of its history are queued, the next
    // block's first step is queued too, before the host waits for the copy, so that the device
    // is not idle while the host reads the block. That step is wasted where every row finishes in
    // the block, and dropped where the batch is then compacted: the compacted batch runs it again
    // (over the same cache slot), so that every step's rounding is that of the batch the host
    // chose, as when sampling after the graphs.
    int half = 0;
    bool ahead = false; // the current half's first step is already queued
    bool upload = true; // the graphs' input is not the last step's output (first block, compaction)
    auto queue_step = [&] {
      s.decode_greedy(rows, slots_used());
      count_step();
      for (std::int64_t r = 0; r < rows; ++r)
        ++lengths[r];
    };
    while (active > 0) {
      if (auto target = compaction_target(); target < rows) {
        const bool dropped = ahead;
        if (dropped)
          for (std::int64_t r = 0; r < rows; ++r)
            --lengths[r];
        ahead = false;
        compact(target);
        if (dropped) // the cache's lengths without the dropped step
          s.cache.lengths.narrow(0, 0, rows).copy_(batch_tensor(lengths));
        upload = true;
      }
      const std::int64_t steps = block_steps(), begin = ahead ? 1 : 0;
      if (!ahead) {
        s.graphs.begin_half(half);
        if (upload)
          s.graphs.set_tokens(batch_tensor(last));
        upload = false;
      }
      for (std::int64_t j = begin; j < steps; ++j)
        queue_step();
      s.graphs.copy_history(rows);
      ++s.stats.host_syncs;
      ahead = false;
      for (std::int64_t r = 0; r < rows && !ahead; ++r)
        ahead = !done[owner[r]] && static_cast<std::int64_t>(out[owner[r]].tokens.size()) + steps < o.max_new_tokens;
      if (ahead) {
        s.graphs.begin_half(1 - half);
        queue_step();
      }
      take_block(s.graphs.wait_history(), s.graphs.half_offset(half), steps);
      half = 1 - half;
      if (o.on_progress)
        o.on_progress(out);
    }
  }
#endif

  // Each block of steps feeds every step's sampled tokens to the next on the device and keeps
  // them, with their log-probs, in `history` ([row, step, token or log-prob]; doubles hold both
  // exactly), copied to the host once at the end of the block. Every row is sampled, finished
  // or not, so the sampler sees the same shapes whenever the host looks.
  torch::Tensor history;
  if (!greedy_graphs)
    history = torch::empty({n, interval, 2}, torch::TensorOptions().dtype(torch::kDouble).device(s.device));
  while (!greedy_graphs && active > 0) {
    if (auto target = compaction_target(); target < rows)
      compact(target);
    const std::int64_t steps = block_steps();
    auto tokens = batch_tensor(last).to(s.device);
    auto block = history.narrow(0, 0, rows);
    for (std::int64_t j = 0; j < steps; ++j) {
      auto logits = s.decode(tokens.view({rows, 1}), rows, slots_used());
      count_step();
      for (std::int64_t r = 0; r < rows; ++r)
        ++lengths[r];
      auto picked = sample(logits, o, gen);
      auto slot = block.select(1, j); // [rows, 2]
      slot.select(1, 0).copy_(picked.tokens);
      slot.select(1, 1).copy_(picked.logprobs);
      tokens = picked.tokens;
    }
    auto host = block.narrow(1, 0, steps).to(torch::kCPU); // waits for the block's steps
    ++s.stats.host_syncs;
    take_block(host.accessor<double, 3>(), 0, steps);
    if (o.on_progress)
      o.on_progress(out);
  }
  s.stats.decode_seconds = seconds_since(t0);
  for (const auto& c : out)
    s.stats.generated_tokens += static_cast<std::int64_t>(c.tokens.size());
  return out;
}

} // namespace crucible::policy
