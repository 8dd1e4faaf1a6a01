// tools/bench/bench_learner.cpp: the learner's GPU figures. Random token batches go through real
// GRPO updates of a model of a preset's shape (Qwen2.5-0.5B's by default) in bf16; buffers of
// gradient size go through the NCCL communicator; a model's weights go from a learner GPU to an
// engine GPU. One JSON object per line on stdout.
//
//   bench_learner [--figures matmul,grpo,allreduce,scaling,sync,checkpoint] [--gpus N] [--preset 0.5b]
//                 [--vocab N] [--groups 8] [--samples 8] [--prompt 256] [--completion 768]
//                 [--micro-batch-tokens 16384] [--steps 5] [--warmup 2] [--recompute]
//                 [--checkpointing] [--lora] [--bucket-mb 25] [--sizes-mb 25,100,500,2000]
//                 [--iters 20] [--sync-bucket-mb 256] [--sync-repeats 5] [--no-overlap]
//                 [--trace FILE] [--kernels fused,libtorch] [--checkpoint-dir DIR]
//
// --preset   tiny, small, 0.5b (crucible's, tied embeddings, vocabulary --vocab, default 151936)
//            or a published model's shape: qwen2.5-coder-1.5b-instruct (tied, vocabulary 151936)
//            or qwen2.5-coder-7b-instruct (untied, 152064). A published preset keeps its own
//            vocabulary; --vocab (at most that) then only bounds the random token ids. Weights are
//            drawn on the GPU (N(0, 0.02), norms 1, biases 0).
// --checkpointing  learner.activation_checkpointing: each decoder layer keeps its input only
//            and runs again in the backward pass.
// --lora     learner.lora with the learner's defaults (rank 16, alpha 32, q/k/v/o_proj): only
//            the adapters train (the 7B on one GPU).
//
// matmul     bf16 torch::mm of 8192^3 on cuda:0: the peak the MFU is taken against.
// grpo       GRPO updates on cuda:0 of groups x samples sequences of prompt + completion tokens;
//            behaviour log-probs are the model's own (on-policy, no recompute forward unless
//            --recompute). tokens = the tokens each update trains on (prompt and completion,
//            the last one excluded: it predicts nothing); MFU = 6 x parameters x tokens / step
//            time / the measured matmul rate (parameters counted once: the tied embedding is the
//            output projection's matmul; attention's T^2 term is not counted). With --lora mfu
//            still counts 6 x all parameters, though the frozen weights' gradients are not computed
//            (the work done is nearer 4 x); trainable_parameters says how many train. Each line
//            reports the CUDA caching allocator's peaks over its updates (warm-up included):
//            peak_allocated_gb (live tensors) and peak_reserved_gb (obtained from the driver), in
//            GB (1e9 bytes).
// allreduce  float32 all-reduce of each size over all GPUs (one thread per GPU) through the
//            project's NCCL communicator: iters collectives back to back, then waited for;
//            algbw = bytes / time, busbw = algbw x 2 (n - 1) / n (nccl-tests' definitions).
//            tools/bench/allreduce_torch.py measures torch.distributed the same way.
// scaling    the grpo figure on 1 GPU (plain learner) and on N GPUs (data-parallel learners over
//            NCCL, each with the 1-GPU batch): efficiency = tokens/s per GPU on N / tokens/s on 1.
//            --scaling-gpus 2,4 runs the group at each count in turn instead; without the grpo
//            figure the first count is the base (a model whose whole optimiser state does not fit
//            one GPU: --zero1 shards AdamW's state over the ranks, as learner.zero1).
//            mfu_required counts the output projection only for the tokens that have a target
//            (the completions: a prompt token's logits are not needed, and not computed).
//            --kernels lists the training forward's implementations to time, one line each, in
//            one process on one model: fused (the output log-softmax, RMSNorm, RoPE and
//            silu * up kernels of policy/kernels/kernels.cu, the default) and libtorch (LibTorch ops).
//            --trace FILE profiles one more update (Chrome trace at FILE) and prints one JSON
//            line with the 200 operators and kernels that took longest in it.
// sync       weight sync of the whole bf16 model from cuda:0 (learner) to cuda:1 (engine):
//            median seconds over repeats, and seconds per GB (1e9 bytes).
// checkpoint after the grpo figure's updates (run for it if grpo is not asked for), in
//            --checkpoint-dir (default a fresh directory under /tmp, removed after): the model
//            alone (policy::save_model in bf16, the weights transformers' save_pretrained writes;
//            then load_model onto cuda:0) and the learner's whole checkpoint (save_checkpoint:
//            model, AdamW moments, float32 masters, manifest with SHA-256; then load_checkpoint,
//            which verifies every file first). Writes are fsynced (the project's writers do it);
//            before each read the files are evicted from the page cache (fdatasync, then
//            posix_fadvise DONTNEED), so reads come from the disk. GB = 1e9 bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "core/file_io.hpp"
#include "core/json.hpp"
#include "policy/training/checkpoint.hpp"
#include "policy/distributed/collective.hpp"
#include "policy/training/learner.hpp"
#include "policy/runtime.hpp"
#include "policy/distributed/weight_sync.hpp"

using namespace crucible;
using namespace crucible::policy;
using clk = std::chrono::steady_clock;

namespace {

struct bench_options {
  std::vector<std::string> figures{"matmul", "grpo", "allreduce", "scaling", "sync"};
  int gpus = 0; // 0: all visible
  std::string preset = "0.5b";
  std::int64_t vocab = 0; ///< 0: the preset's (151936 for crucible's own presets)
  int groups = 8, samples = 8;
  std::int64_t prompt = 256, completion = 768;
  std::int64_t micro_batch_tokens = 16384;
  int steps = 5, warmup = 2;
  bool recompute = false;
  bool checkpointing = false;
  std::string checkpoint_dir; ///< checkpoint figure: where to write (empty: a fresh directory under /tmp)
  bool lora = false;
  bool zero1 = false;             ///< the scaling figure's learners shard AdamW's state (learner.zero1)
  std::vector<int> scaling_gpus;  ///< the scaling figure's GPU counts (empty: all, against one GPU)
  bool overlap = true;
  double bucket_mb = 25;
  std::vector<std::int64_t> sizes_mb{25, 100, 500, 2000};
  int iters = 20;
  double sync_bucket_mb = 256;
  int sync_repeats = 5;
  std::string trace; ///< profile one more GRPO update: Chrome trace here, top rows printed
  std::vector<std::string> kernels{"fused"};
};

constexpr const char* usage_text =
    "usage: bench_learner [--figures matmul,grpo,allreduce,scaling,sync,checkpoint] [--gpus N]\n"
    "       [--preset 0.5b] [--vocab N] [--groups N] [--samples N] [--prompt N] [--completion N]\n"
    "       [--micro-batch-tokens N] [--steps N] [--warmup N] [--recompute] [--checkpointing] [--lora]\n"
    "       [--no-overlap] [--bucket-mb X] [--sizes-mb 25,100,...] [--iters N] [--sync-bucket-mb X]\n"
    "       [--sync-repeats N] [--trace FILE] [--kernels fused,libtorch] [--checkpoint-dir DIR]\n"
    "       [--zero1] [--scaling-gpus 2,4]\n"
    "presets: tiny, small, 0.5b (vocabulary --vocab, default 151936), qwen2.5-coder-1.5b-instruct,\n"
    "         qwen2.5-coder-7b-instruct (their published vocabularies)\n";

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr, "bench_learner: %s\n%s", message.c_str(), usage_text);
  std::exit(2);
}

[[noreturn]] void help() {
  std::printf("bench_learner: the learner's GPU figures, one JSON object per line: the bf16 matmul rate\n"
              "(matmul), a GRPO update's tokens/s and MFU against it (grpo), NCCL all-reduce bus bandwidth\n"
              "(allreduce), data-parallel scaling over the GPUs (scaling), and weight sync seconds per GB\n"
              "(sync). Reproduces the goals table's rows in docs/PERFORMANCE.md on the GRPO update's MFU,\n"
              "data-parallel learners and weight sync, and the gradient all-reduce\n"
              "(tools/bench/gpu_session.sh grpo, dp, allreduce). The top of tools/bench/bench_learner.cpp\n"
              "describes each figure and option. Environment: NCCL's own variables pass through\n"
              "(NCCL_COMM_BLOCKING=1 makes the communicator blocking).\n\n%s",
              usage_text);
  std::exit(0);
}

std::int64_t integer(const std::string& flag, const std::string& text, std::int64_t min) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min)
    usage(flag + ": expected an integer of at least " + std::to_string(min) + ", got '" + text + "'");
  return v;
}

double number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0))
    usage(flag + ": expected a positive number, got '" + text + "'");
  return v;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

bench_options parse(int argc, char** argv) {
  bench_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--recompute") {
      o.recompute = true;
      continue;
    }
    if (flag == "--no-overlap") {
      o.overlap = false;
      continue;
    }
    if (flag == "--checkpointing") {
      o.checkpointing = true;
      continue;
    }
    if (flag == "--lora") {
      o.lora = true;
      continue;
    }
    if (flag == "--zero1") {
      o.zero1 = true;
      continue;
    }
    if (flag == "--help" || flag == "-h")
      help();
    if (i + 1 >= argc)
      usage(flag + ": needs a value");
    const std::string v = argv[++i];
    if (flag == "--figures") o.figures = split(v);
    else if (flag == "--gpus") o.gpus = static_cast<int>(integer(flag, v, 1));
    else if (flag == "--scaling-gpus") {
      for (const auto& c : split(v))
        o.scaling_gpus.push_back(static_cast<int>(integer(flag, c, 2)));
    }
    else if (flag == "--preset") o.preset = v;
    else if (flag == "--vocab") o.vocab = integer(flag, v, 2);
    else if (flag == "--groups") o.groups = static_cast<int>(integer(flag, v, 1));
    else if (flag == "--samples") o.samples = static_cast<int>(integer(flag, v, 1));
    else if (flag == "--prompt") o.prompt = integer(flag, v, 1);
    else if (flag == "--completion") o.completion = integer(flag, v, 1);
    else if (flag == "--micro-batch-tokens") o.micro_batch_tokens = integer(flag, v, 1);
    else if (flag == "--steps") o.steps = static_cast<int>(integer(flag, v, 1));
    else if (flag == "--warmup") o.warmup = static_cast<int>(integer(flag, v, 0));
    else if (flag == "--bucket-mb") o.bucket_mb = number(flag, v);
    else if (flag == "--sizes-mb") {
      o.sizes_mb.clear();
      for (const auto& s : split(v))
        o.sizes_mb.push_back(integer(flag, s, 1));
    } else if (flag == "--iters") o.iters = static_cast<int>(integer(flag, v, 1));
    else if (flag == "--sync-bucket-mb") o.sync_bucket_mb = number(flag, v);
    else if (flag == "--sync-repeats") o.sync_repeats = static_cast<int>(integer(flag, v, 1));
    else if (flag == "--trace") o.trace = v;
    else if (flag == "--checkpoint-dir") o.checkpoint_dir = v;
    else if (flag == "--kernels") {
      o.kernels = split(v);
      for (const auto& k : o.kernels)
        if (k != "fused" && k != "libtorch")
          usage("--kernels: expected fused or libtorch, got '" + k + "'");
      if (o.kernels.empty())
        usage("--kernels: expected fused, libtorch or both");
    }
    else usage("unknown flag " + flag);
  }
  // The preset's shape (and a published preset's vocabulary) before any device is touched.
  auto c = preset_config(o.preset, model_family::qwen2, o.vocab > 0 ? o.vocab : 151936);
  if (!c)
    usage("--preset " + o.preset + ": " + c.error().message);
  if (o.vocab == 0)
    o.vocab = c->vocab_size;
  return o;
}

bool wants(const bench_options& o, const std::string& figure) {
  return std::find(o.figures.begin(), o.figures.end(), figure) != o.figures.end();
}

void emit(json_writer&& w) {
  std::printf("%s\n", std::move(w).take().c_str());
  std::fflush(stdout);
}

[[noreturn]] void die(const std::string& what, const crucible::error& e) {
  std::fprintf(stderr, "bench_learner: %s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

template <class F>
void run_ranks(int n, F&& f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&f, r] { f(r); });
  for (auto& t : threads)
    t.join();
}

std::string device_name(int d) {
  auto info = probe_runtime();
  return d < static_cast<int>(info.devices.size()) ? info.devices[d].name : "";
}

// bf16 matmul rate on `device` in FLOP/s: the best of several timed rounds.
double matmul_rate(int device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const std::int64_t n = 8192;
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, device);
  auto a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
  auto c = torch::mm(a, b);
  torch::cuda::synchronize(device);
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    const int reps = 20;
    start.record();
    for (int i = 0; i < reps; ++i)
      torch::mm_out(c, a, b);
    stop.record();
    stop.synchronize();
    const double s = start.elapsed_time(stop) / 1000.0 / reps;
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

// A model of the preset's shape in bf16 on `device`, its weights drawn there: transformers' init
// (N(0, 0.02) matrices and embeddings, norms 1, biases 0) from a generator of its own, so ranks on
// threads do not share one. (CausalLMImpl::init_weights draws on the CPU, minutes for a 7B.)
CausalLM make_model(const bench_options& o, int device, std::uint64_t seed) {
  auto c = preset_config(o.preset, model_family::qwen2, o.vocab);
  if (!c)
    die("--preset", c.error());
  CausalLM m(*c); // uninitialised CPU tensors: not touched before the move
  const torch::Device dev(torch::kCUDA, static_cast<c10::DeviceIndex>(device));
  m->to(dev, torch::kBFloat16);
  torch::NoGradGuard no_grad;
  auto gen = at::cuda::detail::createCUDAGenerator(static_cast<c10::DeviceIndex>(device));
  gen.set_current_seed(seed);
  for (auto& item : m->named_parameters(true)) {
    const auto& name = item.key();
    auto& p = item.value();
    const auto ends_with = [&](std::string_view tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends_with("norm.weight"))
      p.fill_(1.0);
    else if (ends_with(".bias"))
      p.zero_();
    else
      p.normal_(0.0, 0.02, gen);
  }
  return m;
}

std::int64_t parameter_count(CausalLMImpl& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters())
    n += p.numel();
  return n;
}

// groups x samples random sequences with the model's own log-probs as behaviour (on-policy).
grpo_batch make_batch(const bench_options& o, CausalLMImpl& model, std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> tok(1, o.vocab - 1);
  std::uniform_real_distribution<double> reward(0.0, 1.0);
  const auto device = model.output_weight().device();
  grpo_batch batch;
  const std::int64_t len = o.prompt + o.completion;
  for (int g = 0; g < o.groups; ++g) {
    grpo_group group;
    for (std::int64_t t = 0; t < o.prompt; ++t)
      group.prompt.push_back(static_cast<std::int32_t>(tok(rng)));
    auto ids = torch::empty({o.samples, len}, torch::kLong);
    auto targets = torch::full({o.samples, len - 1}, -1, torch::kLong);
    for (int s = 0; s < o.samples; ++s) {
      grpo_sample sample;
      for (std::int64_t t = 0; t < o.completion; ++t)
        sample.completion.push_back(static_cast<std::int32_t>(tok(rng)));
      for (std::int64_t t = 0; t < o.prompt; ++t)
        ids[s][t] = group.prompt[t];
      for (std::int64_t t = 0; t < o.completion; ++t) {
        ids[s][o.prompt + t] = sample.completion[t];
        targets[s][o.prompt - 1 + t] = sample.completion[t];
      }
      sample.reward = reward(rng);
      group.samples.push_back(std::move(sample));
    }
    token_batch in;
    in.input_ids = ids.narrow(1, 0, len - 1).contiguous().to(device);
    in.attention_mask = torch::ones_like(in.input_ids);
    auto lp = model.token_log_probs(in, targets.to(device)).narrow(1, o.prompt - 1, o.completion).cpu();
    for (int s = 0; s < o.samples; ++s) {
      auto row = lp[s].contiguous();
      group.samples[s].behaviour_log_probs.assign(row.data_ptr<float>(), row.data_ptr<float>() + o.completion);
    }
    batch.groups.push_back(std::move(group));
  }
  return batch;
}

learner_options learner_opts(const bench_options& o) {
  learner_options lo;
  lo.dtype = "bfloat16";
  lo.lr = 1e-6;
  lo.micro_batch_tokens = o.micro_batch_tokens;
  lo.old_log_probs = o.recompute ? old_log_probs_source::recompute : old_log_probs_source::behaviour;
  lo.bucket_mb = o.bucket_mb;
  lo.overlap = o.overlap;
  lo.activation_checkpointing = o.checkpointing;
  lo.lora = o.lora; // rank, alpha and targets: learner_options' defaults
  return lo;
}

// Tokens one update of `o`'s batch trains on.
std::int64_t trained_tokens(const bench_options& o) {
  return static_cast<std::int64_t>(o.groups) * o.samples * (o.prompt + o.completion - 1);
}

struct timed_steps {
  double seconds_per_step = 0;
  double loss = 0;
  crucible::error error;
};

// warmup + steps updates on `l`; the device synchronised around the timed ones.
timed_steps run_steps(const bench_options& o, learner& l, const grpo_batch& batch, int device) {
  timed_steps out;
  for (int i = 0; i < o.warmup; ++i)
    if (auto m = l.grpo_step(batch); !m) {
      out.error = m.error();
      return out;
    }
  torch::cuda::synchronize(device);
  const auto start = clk::now();
  for (int i = 0; i < o.steps; ++i) {
    auto m = l.grpo_step(batch);
    if (!m) {
      out.error = m.error();
      return out;
    }
    out.loss = m->loss;
  }
  torch::cuda::synchronize(device);
  out.seconds_per_step = std::chrono::duration<double>(clk::now() - start).count() / o.steps;
  return out;
}

// One more update under the profiler: where a step's time goes, by operator and by kernel.
void profile_step(const bench_options& o, learner& l, const grpo_batch& batch) {
  crucible::error failed;
  auto rows = profile(
    [&] {
      if (auto m = l.grpo_step(batch); !m)
        failed = m.error();
      torch::cuda::synchronize(0);
    },
    /*cuda=*/true, o.trace);
  if (failed.code != errc::none)
    die("profiled grpo step", failed);
  if (!rows)
    die("profile", rows.error());
  double device_ms = 0;
  for (const auto& r : *rows)
    if (r.device == "cuda")
      device_ms += r.total_ms;
  json_writer p;
  p.begin_object().field("figure", "grpo_profile").field("trace", o.trace).field("device_ms", device_ms).key("top").begin_array();
  for (std::size_t i = 0; i < rows->size() && i < 200; ++i) {
    const auto& r = (*rows)[i];
    p.begin_object().field("name", r.name.substr(0, 140)).field("device", r.device).field("total_ms", r.total_ms)
      .field("count", r.count).end_object();
  }
  p.end_array().end_object();
  emit(std::move(p));
}

struct single_gpu {
  double tokens_per_s = 0;
  std::int64_t parameters = 0;
};

// Drops `dir`'s files from the page cache (written back first), so the next read comes from disk.
void evict(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file())
      continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0)
      continue;
    (void) ::fdatasync(fd);
    (void) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The learner's state a checkpoint holds (weights, float32 masters, AdamW moments), as handles
// on the live tensors (a float32 learner's masters are its weights).
std::vector<torch::Tensor> learner_state(learner& l) {
  std::vector<torch::Tensor> state;
  for (const auto& p : l.parameters())
    state.push_back(p.param);
  for (const auto& m : l.optimizer().masters())
    state.push_back(m);
  for (const auto& [name, t] : l.optimizer().moments())
    state.push_back(t);
  return state;
}

// One integer per tensor of the learner's state (weights, AdamW moments, float32 masters), from
// its bits weighted by position: equal before a save and after the load only if the restore is
// exact (up to a collision of the sums).
std::vector<std::int64_t> state_fingerprint(learner& l) {
  std::vector<std::int64_t> out;
  torch::NoGradGuard no_grad;
  for (const auto& t : learner_state(l)) {
    const auto flat = t.detach().contiguous().view(-1);
    const auto bits = flat.element_size() == 2 ? flat.view(torch::kInt16) : flat.view(torch::kInt32);
    const auto weight = torch::arange(bits.numel(), bits.options().dtype(torch::kLong)).remainder_(7919).add_(1);
    out.push_back(bits.to(torch::kLong).mul_(weight).sum().item<std::int64_t>());
  }
  return out;
}

void checkpoint_figure(const bench_options& o, learner& l) {
  namespace fs = std::filesystem;
  const fs::path root = o.checkpoint_dir.empty()
                          ? fs::temp_directory_path() / ("bench_learner_checkpoint-" + std::to_string(::getpid()))
                          : fs::path(o.checkpoint_dir);
  std::error_code ec;
  fs::remove_all(root / "model", ec);
  fs::remove_all(root / "learner", ec);
  fs::create_directories(root, ec);
  auto seconds = [](auto&& f) {
    torch::cuda::synchronize();
    const auto t0 = clk::now();
    f();
    torch::cuda::synchronize();
    return std::chrono::duration<double>(clk::now() - t0).count();
  };
  auto line = [&](const char* what, const fs::path& dir, double write_s, double read_s, const char* how) {
    const double bytes = static_cast<double>(directory_bytes(dir));
    json_writer w;
    w.begin_object()
      .field("figure", "checkpoint")
      .field("device", device_name(0))
      .field("preset", o.preset)
      .field("lora", o.lora)
      .field("what", what)
      .field("bytes", bytes)
      .field("write_s", write_s)
      .field("write_gb_per_s", bytes / write_s / 1e9)
      .field("read_s", read_s)
      .field("read_gb_per_s", bytes / read_s / 1e9)
      .field("how", how)
      .end_object();
    emit(std::move(w));
  };
  save_options so;
  so.dtype = torch::kBFloat16;
  const double model_write = seconds([&] {
    if (auto r = save_model(l.model(), root / "model", so); !r)
      die("save_model", r.error());
  });
  evict(root / "model");
  load_options lo;
  lo.device = torch::Device(torch::kCUDA, 0);
  lo.dtype = torch::kBFloat16;
  const double model_read = seconds([&] {
    auto m = load_model(root / "model", lo);
    if (!m)
      die("load_model", m.error());
  });
  line("model", root / "model", model_write, model_read,
       "save_model (bf16 safetensors shards, fsynced); load_model onto cuda:0 from a cold page cache");
  const auto before = state_fingerprint(l);
  const double ckpt_write = seconds([&] {
    if (auto r = save_checkpoint(l, root / "learner"); !r)
      die("save_checkpoint", r.error());
  });
  evict(root / "learner");
  // What the load restores must come from the files: the state is scrambled first.
  {
    torch::NoGradGuard no_grad;
    for (auto& t : learner_state(l))
      t.add_(1);
  }
  const double ckpt_read = seconds([&] {
    if (auto r = load_checkpoint(l, root / "learner"); !r)
      die("load_checkpoint", r.error());
  });
  const bool exact = state_fingerprint(l) == before;
  line("learner checkpoint", root / "learner", ckpt_write, ckpt_read,
       exact ? "save_checkpoint (model, moments, masters, SHA-256 manifest, fsynced); load_checkpoint (verify, then "
               "restore) from a cold page cache; the restored weights, moments and masters equal the saved ones "
               "(fingerprints of their bits)"
             : "RESTORE NOT EXACT: the restored state's fingerprints differ from the saved state's");
  if (o.checkpoint_dir.empty())
    fs::remove_all(root, ec);
}

single_gpu grpo_figure(const bench_options& o, double peak) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(0));
  auto model = make_model(o, 0, 1);
  const auto params = parameter_count(*model);
  const auto head_params = model->output_weight().numel();
  auto batch = make_batch(o, *model, 2);
  auto l = learner::create(model, CausalLM{nullptr}, learner_opts(o), 3);
  if (!l)
    die("learner", l.error());
  std::int64_t trainable = 0;
  for (const auto& p : (*l)->parameters())
    trainable += p.param.numel();
  const auto tokens = trained_tokens(o);
  const auto head_tokens = static_cast<std::int64_t>(o.groups) * o.samples * o.completion;
  const double required_flops = 6.0 * static_cast<double>(params - head_params) * static_cast<double>(tokens)
                                + 6.0 * static_cast<double>(head_params) * static_cast<double>(head_tokens);
  double tps = 0, single_tps = 0; // the scaling figure's base: the fused kernels', as the learners run
  for (const auto& kernels : o.kernels) {
    model->set_fused_training(kernels == "fused");
    reset_peak_memory("cuda:0");
    auto t = run_steps(o, **l, batch, 0);
    if (t.error.code != errc::none)
      die("grpo step", t.error);
    tps = static_cast<double>(tokens) / t.seconds_per_step;
    const auto mem = memory_stats("cuda:0");
    json_writer w;
    w.begin_object()
      .field("figure", "grpo_update")
      .field("device", device_name(0))
      .field("preset", o.preset)
      .field("vocab", model->config().vocab_size)
      .field("parameters", params)
      .field("trainable_parameters", trainable)
      .field("dtype", "bfloat16")
      .field("kernels", kernels)
      .field("checkpointing", o.checkpointing)
      .field("lora", o.lora)
      .field("sequences", static_cast<std::int64_t>(o.groups) * o.samples)
      .field("prompt", o.prompt)
      .field("completion", o.completion)
      .field("micro_batch_tokens", o.micro_batch_tokens)
      .field("recompute_old", o.recompute)
      .field("tokens_per_step", tokens)
      .field("step_s", t.seconds_per_step)
      .field("tokens_per_s", tps)
      .field("model_tflops", 6.0 * params * tps / 1e12)
      .field("matmul_tflops", peak / 1e12)
      .field("mfu", 6.0 * params * tps / peak)
      .field("mfu_required", required_flops / t.seconds_per_step / peak)
      .field("peak_allocated_gib", mem ? static_cast<double>(mem->peak_allocated) / (1ull << 30) : 0.0)
      .field("peak_allocated_gb", mem ? static_cast<double>(mem->peak_allocated) / 1e9 : 0.0)
      .field("peak_reserved_gb", mem ? static_cast<double>(mem->peak_reserved) / 1e9 : 0.0)
      .end_object();
    emit(std::move(w));
    if (kernels == "fused" || single_tps == 0)
      single_tps = tps;
  }
  model->set_fused_training(true);
  if (!o.trace.empty())
    profile_step(o, **l, batch);
  if (wants(o, "checkpoint"))
    checkpoint_figure(o, **l);
  return {single_tps, params};
}

std::vector<std::shared_ptr<communicator>> nccl_group(int n) {
  auto id = nccl_id::generate();
  if (!id)
    die("nccl id", id.error());
  std::vector<result<std::shared_ptr<communicator>>> made(n, crucible::error{errc::cancelled, "not run"});
  // The ranks are threads of this process and launch together, as in `crucible train`.
  auto together = launch_rendezvous::create(n, std::chrono::minutes(10));
  run_ranks(n, [&](int r) { made[r] = make_nccl_communicator(*id, r, n, r, std::chrono::minutes(10), together); });
  std::vector<std::shared_ptr<communicator>> out;
  for (auto& m : made) {
    if (!m)
      die("NCCL communicator", m.error());
    out.push_back(*m);
  }
  return out;
}

void allreduce_figure(const bench_options& o, int n) {
  auto comms = nccl_group(n);
  for (auto mb : o.sizes_mb) {
    const std::int64_t bytes = mb << 20;
    std::vector<double> seconds(n, 0);
    std::vector<std::string> errors(n);
    run_ranks(n, [&](int r) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
      auto& c = *comms[r];
      auto buf = torch::ones({bytes / 4}, torch::TensorOptions().dtype(torch::kFloat).device(c.device()));
      auto round = [&](int k) -> result<void> {
        std::vector<work> ws;
        for (int i = 0; i < k; ++i) {
          auto w = c.all_reduce(buf, reduce_op::sum);
          if (!w)
            return w.error();
          ws.push_back(*w);
        }
        for (auto& w : ws)
          if (auto x = w.wait(); !x)
            return x;
        torch::cuda::synchronize(r);
        return {};
      };
      if (auto x = round(3); !x) { // warm-up: connections, buffers
        errors[r] = x.error().message;
        return;
      }
      if (auto x = c.barrier(); !x) {
        errors[r] = x.error().message;
        return;
      }
      const auto start = clk::now();
      if (auto x = round(o.iters); !x) {
        errors[r] = x.error().message;
        return;
      }
      seconds[r] = std::chrono::duration<double>(clk::now() - start).count() / o.iters;
    });
    for (const auto& e : errors)
      if (!e.empty())
        die("all-reduce", crucible::error{errc::device, e});
    const double s = *std::max_element(seconds.begin(), seconds.end());
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    json_writer w;
    w.begin_object()
      .field("figure", "allreduce")
      .field("backend", "crucible-nccl")
      .field("gpus", n)
      .field("device", device_name(0))
      .field("dtype", "float32")
      .field("bytes", bytes)
      .field("time_us", s * 1e6)
      .field("algbw_gbps", algbw)
      .field("busbw_gbps", algbw * 2.0 * (n - 1) / n)
      .end_object();
    emit(std::move(w));
  }
}

// Tokens/s of the data-parallel group of n GPUs, and its line; its efficiency is taken against
// `base_tps` tokens/s a GPU, measured on `base_gpus` GPUs (0: this group is the base).
double scaling_figure(const bench_options& o, int n, double base_tps, int base_gpus, double peak) {
  auto comms = nccl_group(n);
  for (int r = 0; r < n; ++r)
    reset_peak_memory("cuda:" + std::to_string(r));
  std::int64_t params0 = 0;
  std::vector<timed_steps> times(n);
  std::vector<std::string> errors(n);
  std::vector<reduction_stats> stats(n);
  run_ranks(n, [&](int r) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
    // Rank 0's weights reach the others by the learners' first broadcast; LoRA's frozen base is
    // not broadcast and must be the same everywhere: one seed (the same draws on GPUs of one kind).
    auto model = make_model(o, r, o.lora ? 1 : 1 + r);
    if (r == 0)
      params0 = parameter_count(*model);
    auto batch = make_batch(o, *model, 2 + r);
    auto lo = learner_opts(o);
    lo.zero1 = o.zero1;
    auto l = learner::create(model, CausalLM{nullptr}, lo, 3);
    if (!l) {
      errors[r] = l.error().message;
      return;
    }
    if (auto j = (*l)->join_data_parallel(comms[r]); !j) {
      errors[r] = j.error().message;
      return;
    }
    times[r] = run_steps(o, **l, batch, r);
    if (times[r].error.code != errc::none)
      errors[r] = times[r].error.message;
    stats[r] = (*l)->data_parallel_state()->last_stats();
  });
  for (const auto& e : errors)
    if (!e.empty())
      die("data-parallel step", crucible::error{errc::device, e});
  double s = 0;
  for (const auto& t : times)
    s = std::max(s, t.seconds_per_step);
  const double tps = static_cast<double>(trained_tokens(o)) * n / s;
  const auto mem0 = memory_stats("cuda:0");
  if (base_gpus == 0)
    base_tps = tps / n, base_gpus = n;
  json_writer w;
  w.begin_object()
    .field("figure", "dp_scaling")
    .field("gpus", n)
    .field("device", device_name(0))
    .field("preset", o.preset)
    .field("tokens_per_step_per_gpu", trained_tokens(o))
    .field("bucket_mb", o.bucket_mb)
    .field("overlap", o.overlap)
    .field("buckets", stats[0].buckets)
    .field("buckets_issued_during_backward", stats[0].issued_during_backward)
    .field("reduction_wait_s", stats[0].wait_seconds)
    .field("step_s", s)
    .field("tokens_per_s", tps)
    .field("tokens_per_s_per_gpu", tps / n)
    .field("zero1", o.zero1)
    .field("checkpointing", o.checkpointing)
    .field("base_gpus", base_gpus)
    .field("base_tokens_per_s_per_gpu", base_tps)
    .field("efficiency", tps / n / base_tps)
    .field("mfu", 6.0 * static_cast<double>(params0) * (tps / n) / peak)
    .field("peak_allocated_gb_rank0", mem0 ? static_cast<double>(mem0->peak_allocated) / 1e9 : 0.0)
    .end_object();
  emit(std::move(w));
  return tps;
}

void sync_figure(const bench_options& o) {
  auto comms = nccl_group(2);
  std::vector<std::vector<double>> seconds(2);
  std::vector<std::string> errors(2);
  std::int64_t bytes = 0, buckets = 0;
  run_ranks(2, [&](int r) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r));
    auto model = make_model(o, r, 10 + r);
    weight_sync_options so;
    so.bucket_bytes = static_cast<std::int64_t>(o.sync_bucket_mb * (1 << 20));
    auto ws = weight_sync::create(comms[r], sync_tensors(*model, false), so);
    if (!ws) {
      errors[r] = ws.error().message;
      return;
    }
    for (int i = 0; i < o.sync_repeats + 1; ++i) { // the first is a warm-up
      auto s = r == 0 ? (*ws)->send(static_cast<std::uint64_t>(i)) : (*ws)->receive();
      if (!s) {
        errors[r] = s.error().message;
        return;
      }
      if (i > 0)
        seconds[r].push_back(s->seconds);
      if (r == 1) {
        bytes = s->bytes;
        buckets = s->buckets;
      }
    }
  });
  for (const auto& e : errors)
    if (!e.empty())
      die("weight sync", crucible::error{errc::device, e});
  auto& s = seconds[1];
  std::sort(s.begin(), s.end());
  const double median = s[s.size() / 2];
  json_writer w;
  w.begin_object()
    .field("figure", "weight_sync")
    .field("device", device_name(0))
    .field("preset", o.preset)
    .field("bytes", bytes)
    .field("buckets", buckets)
    .field("sync_bucket_mb", o.sync_bucket_mb)
    .field("seconds", median)
    .field("s_per_gb", median / (static_cast<double>(bytes) / 1e9))
    .field("gbps", static_cast<double>(bytes) / median / 1e9)
    .end_object();
  emit(std::move(w));
}

} // namespace

int main(int argc, char** argv) {
  const auto o = parse(argc, argv);
  // NVLink multicast (NVLS) stays off unless the caller asks for it: on shared hosts a program
  // using it can take the GPUs out of service (allreduce_torch.py does the same).
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int visible = static_cast<int>(torch::cuda::device_count());
  if (visible == 0) {
    std::fprintf(stderr, "bench_learner: no CUDA device\n");
    return 1;
  }
  const int n = o.gpus > 0 ? std::min(o.gpus, visible) : visible;
  double peak = 0;
  single_gpu single;
  if (wants(o, "matmul") || wants(o, "grpo") || wants(o, "scaling") || wants(o, "checkpoint")) {
    peak = matmul_rate(0);
    json_writer w;
    w.begin_object().field("figure", "matmul_bf16").field("device", device_name(0)).field("m_n_k", 8192).field(
      "tflops", peak / 1e12);
    emit(std::move(w.end_object()));
  }
  if (wants(o, "grpo") || wants(o, "checkpoint") || (wants(o, "scaling") && o.scaling_gpus.empty()))
    single = grpo_figure(o, peak);
  if (wants(o, "allreduce"))
    allreduce_figure(o, n);
  if (wants(o, "scaling")) {
    if (o.scaling_gpus.empty()) {
      if (n < 2)
        std::fprintf(stderr, "bench_learner: scaling needs two GPUs or more; skipped\n");
      else
        scaling_figure(o, n, single.tokens_per_s, 1, peak);
    } else {
      // Each count in turn; the base is one GPU's grpo figure when it ran, else the first count.
      double base_tps = single.tokens_per_s;
      int base_gpus = base_tps > 0 ? 1 : 0;
      for (int k : o.scaling_gpus) {
        if (k > visible) {
          std::fprintf(stderr, "bench_learner: scaling over %d GPUs: only %d visible; skipped\n", k, visible);
          continue;
        }
        const double tps = scaling_figure(o, k, base_tps, base_gpus, peak);
        if (base_gpus == 0)
          base_tps = tps / k, base_gpus = k;
      }
    }
  }
  if (wants(o, "sync")) {
    if (visible < 2)
      std::fprintf(stderr, "bench_learner: sync needs two GPUs; skipped\n");
    else
      sync_figure(o);
  }
  return 0;
}
