// tools/bench/bench_decode.cpp: decode throughput of the policy engine on random prompts, the KV
// cache's memory against its analytic size, and the batch's distance from the bandwidth bound.
// One JSON object per line on stdout (setup, bandwidth, then one per batch size).
//
//   bench_decode --model DIR [--device cuda:0] [--batches 1,16,64] [--prompt 512] [--new 512]
//                [--no-graphs] [--fused on|off|both] [--sync-interval 16] [--dtype bfloat16]
//                [--seed 0] [--warmup 1] [--repeats 1] [--rounds 1] [--copy-bytes 1073741824] [--trace PREFIX]
//                [--layers-timeline]
//                [--fused-max-rows N] [--kernels small,small_rounds,small_split,small_late,small_launch_late,small_gate_up_warps,small_attention_whole,small_merge2,small_merge_w16,small_serial_staging,small_sample_after,small_head_gemm,fused,libtorch]
//
// --fused both (the default) measures each batch size twice on the same weights: with the fused
// decoding kernels (engine_options::fused_kernels) and with LibTorch ops only; each decode record
// says which ("fused": true or false, "kernels": its variant). --kernels names the variants
// instead: "small" (the fused kernels with the small-batch projections at up to 4 rows; the
// engine's default runs them at 1 row), "small_rounds" (the same, with a long k's weights loaded
// in two rounds: decode_options::small_gemm_one_round off), "small_split" (the same as small with
// the attention always split and combined: decode_options::wide_attention off), "small_late"
// (the same as small with every read after the wait: decode_options::early_reads off),
// "small_launch_late" (the same as small with each kernel launching the next after its wait, not as
// it begins: decode_options::early_launch off), "small_gate_up_warps" (the same as small with
// the one-row gate/up projection a unit a warp: decode_options::small_gemm_half_warps off),
// "small_attention_whole" (the same as small with the one-row attention in one wide block a query
// head over the whole row and the o projection apart, not in splits that the o projection merges:
// decode_options::attention_merge off), "small_merge2" (the same as small with that merge of
// at most two splits: decode_options::merge_splits 2), "small_merge_w16" (the same
// as small with sixteen warps to each block of that split attention, not eight:
// decode_options::merge_warps 16), "small_serial_staging" (the
// same as small with the o and down projections loading and storing their inputs one at a time:
// decode_options::small_gemm_batched_staging off), "small_sample_after" (the same as small with the
// greedy sampling after each step's CUDA graph, not in it: engine_options::greedy_in_graph off),
// "small_head_gemm" (the same as small with a one-row greedy step's output matrix a GEMM and its
// sampling two kernels, not one kernel that samples without writing the logits:
// decode_options::greedy_head off),
// "fused" (the fused kernels with cuBLAS projections, engine_options::small_batch_kernels off) and "libtorch". The fused kernels serve calls of at most --fused-max-rows
// rows (engine_options::fused_max_rows, its default when absent); "fused_steps" counts the steps
// that ran them.
// Each batch size B gets B random prompts of exactly --prompt tokens (ids uniform over the
// vocabulary, fixed seed) and generates exactly --new tokens per row: greedy, no eos and no stop
// strings. A warm-up call with the same shapes captures the CUDA graphs; the timed call reports
// the engine's prefill and decode times. Decode tokens/s counts B x (new - 1) tokens, the ones
// that needed a decoding forward (the first comes from the prefill), over the decode time.
// --rounds N measures every variant N times, pass r starting at variant r, and reports each
// variant's median pass ("ms_per_step_passes" lists them all): the variant measured first in a
// process ran 1.5-3% faster on an H100 (docs/performance-history.md, "A wide attention kernel
// and early reads"), so one pass favours it.
// --layers-timeline makes one more batch-1 call per small variant with its blocks stamping the
// device clock: the five kernels of a layer (policy::time_decode_kernels), one JSON line each.
// Each variant is a kernels::decode_options set on the model (CausalLMImpl::set_decode_options),
// whose CUDA graphs are captured again under it.
//
// Bandwidth bound: a decoding step must read every weight once (the embedding table only as the
// tied output matrix) and each row's keys and values, on average (prompt + new/2) positions;
// at the measured device copy bandwidth that bounds tokens/s at B x bandwidth / bytes per step.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "policy/model/engine.hpp"
#include "policy/model/model.hpp"
#include "policy/runtime.hpp"
#include "tools/bench/bench_timers.hpp"

namespace fs = std::filesystem;
using namespace crucible;

namespace {

struct bench_options {
  fs::path model;
  std::string device = "cuda:0";
  std::vector<std::int64_t> batches{1, 16, 64};
  std::int64_t prompt = 512;
  std::int64_t new_tokens = 512;
  bool graphs = true;
  std::vector<std::string> kernels{"small", "libtorch"}; ///< variants to measure: small, fused, libtorch
  std::int64_t sync_interval = 16;
  std::string dtype; // "": bfloat16 on CUDA, float32 on the CPU (the engine's default)
  std::uint64_t seed = 0;
  int warmup = 1;
  int repeats = 1;
  int rounds = 1; ///< passes over the variants, each starting one variant later; the median pass counts
  std::uint64_t copy_bytes = std::uint64_t{1} << 30;
  std::string trace; ///< profile one more call per batch: Chrome trace at TRACE-bB.json, top rows printed
  /// At batch 1, one more call per small variant with the five kernels of a layer timing their blocks.
  bool layers_timeline = false;
  std::int64_t fused_max_rows = policy::engine_options{}.fused_max_rows;
};

constexpr const char* usage_text =
    "usage: bench_decode --model DIR [--device cuda:0] [--batches 1,16,64] [--prompt 512]\n"
    "       [--new 512] [--no-graphs] [--fused on|off|both] [--sync-interval N] [--dtype T] [--seed S]\n"
    "       [--warmup N] [--repeats N] [--rounds N] [--copy-bytes N] [--trace PREFIX] [--fused-max-rows N]\n"
    "       [--layers-timeline]\n"
    "       [--kernels small,small_rounds,small_split,small_late,small_launch_late,small_gate_up_warps,\n"
    "                  small_attention_whole,small_merge2,small_merge_w16,small_serial_staging,small_sample_after,\n"
    "                  small_head_gemm,fused,libtorch]\n";

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr, "bench_decode: %s\n%s", message.c_str(), usage_text);
  std::exit(2);
}

[[noreturn]] void help() {
  std::printf("bench_decode: decode throughput of the policy engine on random prompts, the KV cache's\n"
              "memory against its analytic size, and the share of the bandwidth bound (the weights and the\n"
              "average KV cache read once a step at the copy bandwidth measured on the device); one JSON\n"
              "object per line. Reproduces the decode throughput row of the goals table in\n"
              "docs/PERFORMANCE.md through tools/bench/decode_compare.py, which runs it beside\n"
              "transformers (tools/bench/gpu_session.sh decode). The top of tools/bench/bench_decode.cpp\n"
              "describes each option and variant. No environment variables.\n\n%s",
              usage_text);
  std::exit(0);
}

std::int64_t integer(const std::string& flag, const std::string& text, std::int64_t min) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min)
    usage(flag + ": expected an integer of at least " + std::to_string(min) + ", got '" + text + "'");
  return v;
}

std::int64_t positive(const std::string& flag, const std::string& text) { return integer(flag, text, 1); }

bench_options parse(int argc, char** argv) {
  bench_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h")
      help();
    if (flag == "--no-graphs") {
      o.graphs = false;
      continue;
    }
    if (flag == "--layers-timeline") {
      o.layers_timeline = true;
      continue;
    }
    if (i + 1 >= argc)
      usage(flag + ": needs a value");
    const std::string v = argv[++i];
    if (flag == "--model") o.model = v;
    else if (flag == "--device") o.device = v;
    else if (flag == "--prompt") o.prompt = positive(flag, v);
    else if (flag == "--new") o.new_tokens = positive(flag, v);
    else if (flag == "--dtype") o.dtype = v;
    else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(integer(flag, v, 0));
    else if (flag == "--warmup") o.warmup = static_cast<int>(integer(flag, v, 0));
    else if (flag == "--repeats") o.repeats = static_cast<int>(positive(flag, v));
    else if (flag == "--rounds") o.rounds = static_cast<int>(positive(flag, v));
    else if (flag == "--trace") o.trace = v;
    else if (flag == "--sync-interval") o.sync_interval = positive(flag, v);
    else if (flag == "--fused-max-rows") o.fused_max_rows = integer(flag, v, 0);
    else if (flag == "--fused") {
      if (v == "on") o.kernels = {"small"};
      else if (v == "off") o.kernels = {"libtorch"};
      else if (v == "both") o.kernels = {"small", "libtorch"};
      else usage("--fused: expected on, off or both, got '" + v + "'");
    }
    else if (flag == "--copy-bytes") o.copy_bytes = static_cast<std::uint64_t>(positive(flag, v));
    else if (flag == "--batches") {
      o.batches.clear();
      std::stringstream ss{v};
      for (std::string item; std::getline(ss, item, ',');)
        o.batches.push_back(positive(flag, item));
      if (o.batches.empty())
        usage("--batches: expected sizes separated by commas");
    } else if (flag == "--kernels") {
      o.kernels.clear();
      std::stringstream ss{v};
      for (std::string item; std::getline(ss, item, ',');) {
        static const char* const known[] = {"small",           "small_rounds",        "small_split",
                                            "small_late",      "small_launch_late",   "small_gate_up_warps",
                                            "small_attention_whole", "small_merge2", "small_merge_w16", "small_serial_staging",
                                            "small_sample_after",    "small_head_gemm",
                                            "fused",           "libtorch"};
        if (std::find(std::begin(known), std::end(known), item) == std::end(known)) {
          std::string names;
          for (const char* k : known)
            names += (names.empty() ? "" : ", ") + std::string(k);
          usage("--kernels: expected one of " + names + ", got '" + item + "'");
        }
        o.kernels.push_back(item);
      }
      if (o.kernels.empty())
        usage("--kernels: expected variants separated by commas");
    } else {
      usage("unknown option " + flag);
    }
  }
  if (o.model.empty())
    usage("--model DIR is required");
  return o;
}

std::int64_t element_bytes(const std::string& dtype) { return dtype == "float32" ? 4 : 2; }

// Optional byte counts: null where the device keeps no allocator statistics (the CPU).
void field_or_null(json_writer& w, std::string_view key, std::optional<std::int64_t> v) {
  w.key(key);
  if (v)
    w.value(*v);
  else
    w.null();
}

int run(const bench_options& o) {
  const bool cuda = o.device != "cpu";
  const std::string dtype = !o.dtype.empty() ? o.dtype : cuda ? "bfloat16" : "float32";

  policy::engine_options eo;
  eo.device = o.device;
  eo.dtype = dtype;
  eo.cuda_graphs = o.graphs;
  eo.sync_interval = o.sync_interval;
  auto set_kernels = [](policy::engine_options& e, const std::string& k) {
    e.fused_kernels = k != "libtorch";
    e.small_batch_kernels = k.rfind("small", 0) == 0;
    e.small_batch_max_rows = 4; // "small": every call the kernels take (the engine's default stops at 1 row)
    e.greedy_in_graph = k != "small_sample_after";
  };
  set_kernels(eo, o.kernels.front());
  eo.fused_max_rows = o.fused_max_rows;
  auto loaded = policy::engine::load(o.model, eo);
  if (!loaded) {
    std::fprintf(stderr, "bench_decode: %s\n", loaded.error().message.c_str());
    return 1;
  }
  // One engine per variant, all sampling from the same weights.
  std::vector<std::unique_ptr<policy::engine>> engines;
  engines.push_back(std::move(*loaded));
  for (std::size_t i = 1; i < o.kernels.size(); ++i) {
    auto other = eo;
    set_kernels(other, o.kernels[i]);
    engines.push_back(std::make_unique<policy::engine>(engines.front()->shared_model(), other));
  }
  const auto& cfg = engines.front()->config();
  const std::int64_t elem = element_bytes(dtype);
  // Weights read per step: all parameters, but an untied embedding table only by the rows looked up.
  const std::int64_t weight_bytes =
    (cfg.parameter_count() - (cfg.tie_word_embeddings ? 0 : cfg.vocab_size * cfg.hidden_size)) * elem;
  const std::int64_t kv_token_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem;

  auto rt = policy::probe_runtime();
  std::string device_name = "cpu";
  if (cuda) {
    const int index = std::atoi(o.device.c_str() + 5);
    for (const auto& d : rt.devices)
      if (d.index == index)
        device_name = d.name;
  }
  {
    json_writer w;
    w.begin_object()
      .field("kind", "setup")
      .field("model", o.model.string())
      .field("device", o.device)
      .field("device_name", device_name)
      .field("torch", rt.torch_version)
      .field("dtype", dtype)
      .field("cuda_graphs", o.graphs && cuda)
      .field("sync_interval", o.sync_interval)
      .field("family", policy::to_string(cfg.family))
      .field("parameters", cfg.parameter_count())
      .field("vocab_size", cfg.vocab_size)
      .field("layers", cfg.num_layers)
      .field("kv_heads", cfg.num_kv_heads)
      .field("head_dim", cfg.head_dim)
      .field("weight_bytes_per_step", weight_bytes)
      .field("kv_bytes_per_token", kv_token_bytes)
      .end_object();
    std::printf("%s\n", w.str().c_str());
    std::fflush(stdout);
  }

  auto bandwidth = bench::copy_bandwidth(o.device, o.copy_bytes);
  if (!bandwidth) {
    std::fprintf(stderr, "bench_decode: %s\n", bandwidth.error().message.c_str());
    return 1;
  }
  {
    json_writer w;
    w.begin_object()
      .field("kind", "bandwidth")
      .field("copy_bytes", o.copy_bytes)
      .field("bytes_per_s", *bandwidth)
      .field("gb_per_s", *bandwidth / 1e9)
      .end_object();
    std::printf("%s\n", w.str().c_str());
    std::fflush(stdout);
  }

  policy::sampling_options so;
  so.temperature = 0.0; // greedy: the same mode as the transformers side of decode_compare.py
  so.max_new_tokens = o.new_tokens;
  so.seed = o.seed;     // no eos ids and no stop strings: every row generates exactly new_tokens
  std::mt19937_64 rng{o.seed};
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(cfg.vocab_size - 1));
  for (auto batch : o.batches) {
    std::vector<std::vector<std::int32_t>> prompts(static_cast<std::size_t>(batch));
    for (auto& p : prompts) {
      p.resize(static_cast<std::size_t>(o.prompt));
      for (auto& id : p)
        id = token(rng);
    }
    // One measurement: the best of `repeats` calls after `warmup`, with the allocator's peak.
    struct measured {
      policy::engine_stats stats;
      std::optional<std::int64_t> peak;
    };
    // A fresh cache per batch size and variant, so that a peak is this one's own; graphs captured
    // again under this variant's kernels.
    auto select = [&](std::size_t variant) {
      for (auto& e : engines)
        e->release_graphs();
      const auto& k = o.kernels[variant];
      policy::kernels::decode_options d;
      d.small_gemm_one_round = k != "small_rounds";
      d.wide_attention = k != "small_split";
      d.early_reads = k != "small_late";
      d.early_launch = k != "small_launch_late";
      d.small_gemm_half_warps = k != "small_gate_up_warps";
      d.attention_merge = k != "small_attention_whole";
      d.merge_splits = k == "small_merge2" ? 2 : 8;
      d.merge_warps = k == "small_merge_w16" ? 16 : 8;
      d.small_gemm_batched_staging = k != "small_serial_staging";
      d.greedy_head = k != "small_head_gemm";
      engines[variant]->model().set_decode_options(d); // the engines share one model
    };
    auto measure = [&](std::size_t variant) -> std::optional<measured> {
      auto& engine = engines[variant];
      select(variant);
      policy::reset_peak_memory(o.device);
      const auto before = policy::memory_stats(o.device);
      measured m;
      double best_decode = 0.0;
      for (int run = 0; run < o.warmup + o.repeats; ++run) {
        auto out = engine->generate(prompts, so);
        if (!out) {
          std::fprintf(stderr, "bench_decode: batch %lld: %s\n", static_cast<long long>(batch), out.error().message.c_str());
          return std::nullopt;
        }
        const auto& st = engine->last_stats();
        if (st.generated_tokens != batch * o.new_tokens) {
          std::fprintf(stderr, "bench_decode: batch %lld generated %lld tokens, expected %lld\n",
                       static_cast<long long>(batch), static_cast<long long>(st.generated_tokens),
                       static_cast<long long>(batch * o.new_tokens));
          return std::nullopt;
        }
        if (run >= o.warmup && (best_decode == 0.0 || st.decode_seconds < best_decode)) {
          m.stats = st;
          best_decode = st.decode_seconds;
        }
      }
      const auto after = policy::memory_stats(o.device);
      if (before && after)
        m.peak = static_cast<std::int64_t>(after->peak_allocated) - static_cast<std::int64_t>(before->allocated);
      return m;
    };
    // `rounds` passes over the variants, pass r starting at variant r (mod their count), so that no
    // variant always runs first (the first in a process measured 1.5-3% faster on an H100).
    std::vector<std::vector<measured>> passes(engines.size());
    for (int round = 0; round < o.rounds; ++round)
      for (std::size_t j = 0; j < engines.size(); ++j) {
        const std::size_t variant = (j + static_cast<std::size_t>(round)) % engines.size();
        auto m = measure(variant);
        if (!m)
          return 1;
        passes[variant].push_back(std::move(*m));
      }
    for (std::size_t variant = 0; variant < engines.size(); ++variant) {
      auto& engine = engines[variant];
      const bool fused = o.kernels[variant] != "libtorch";
      // The pass with the median decode time (the lower middle one of an even count).
      auto sorted = passes[variant];
      std::sort(sorted.begin(), sorted.end(),
                [](const measured& a, const measured& b) { return a.stats.decode_seconds < b.stats.decode_seconds; });
      const auto& shown = sorted[(sorted.size() - 1) / 2].stats;
      const auto& peak = passes[variant].front().peak;
      auto ms_per_step = [](const policy::engine_stats& st) {
        return st.decode_steps > 0 ? 1e3 * st.decode_seconds / static_cast<double>(st.decode_steps) : 0.0;
      };

      const double decode_tokens = static_cast<double>(batch * (o.new_tokens - 1));
      const double decode_tps = shown.decode_seconds > 0 ? decode_tokens / shown.decode_seconds : 0.0;
      const double total_s = shown.prefill_seconds + shown.decode_seconds;
      const double avg_context = static_cast<double>(o.prompt) + static_cast<double>(o.new_tokens) / 2.0;
      const double step_bytes =
        static_cast<double>(weight_bytes) + static_cast<double>(batch) * avg_context * static_cast<double>(kv_token_bytes);
      const double bound_tps = static_cast<double>(batch) * *bandwidth / step_bytes;
      const std::int64_t analytic = kv_token_bytes * (o.prompt + o.new_tokens) * batch;

      json_writer w;
      w.begin_object()
        .field("kind", "decode")
        .field("batch", batch)
        .field("fused", fused)
        .field("kernels", o.kernels[variant])
        .field("prompt", o.prompt)
        .field("new", o.new_tokens)
        .field("prefill_s", shown.prefill_seconds)
        .field("decode_s", shown.decode_seconds)
        .field("decode_tokens_per_s", decode_tps)
        .field("total_tokens_per_s", total_s > 0 ? static_cast<double>(batch * o.new_tokens) / total_s : 0.0)
        .field("prefill_tokens_per_s",
               shown.prefill_seconds > 0 ? static_cast<double>(shown.prompt_tokens) / shown.prefill_seconds : 0.0)
        .field("decode_steps", shown.decode_steps)
        .field("ms_per_step", ms_per_step(shown))
        .field("fused_steps", shown.fused_steps)
        .field("host_syncs", shown.host_syncs)
        .field("graph_replays", shown.graph_replays)
        .field("compactions", shown.compactions)
        .field("step_bytes", step_bytes)
        .field("bound_tokens_per_s", bound_tps)
        .field("bandwidth_fraction", bound_tps > 0 ? decode_tps / bound_tps : 0.0)
        .field("kv_cache_bytes", shown.cache_bytes)
        .field("kv_analytic_bytes", analytic)
        .field("rounds", o.rounds);
      w.key("ms_per_step_passes").begin_array();
      for (const auto& m : passes[variant])
        w.value(ms_per_step(m.stats));
      w.end_array();
      field_or_null(w, "peak_bytes", peak);
      w.end_object();
      std::printf("%s\n", w.str().c_str());
      std::fflush(stdout);
      if (o.layers_timeline && batch == 1 && fused && o.kernels[variant] != "fused") {
        // One more call with the five kernels of a layer timing their blocks (the last step).
        select(variant);
        auto kernels = policy::time_decode_kernels(engine->model(), [&] { (void) engine->generate(prompts, so); },
                                                   cfg.num_layers);
        json_writer t;
        t.begin_object().field("kind", "kernels_timeline").field("batch", batch).field("kernels", o.kernels[variant]);
        if (kernels) {
          t.field("ms_per_step", ms_per_step(engine->last_stats())); // this call's, graphs captured in it
          t.key("layer").begin_array();
          for (const auto& k : *kernels)
            t.begin_object().field("kernel", k.kernel).field("blocks", k.blocks).field("first_start_us", k.first_start_us)
              .field("last_start_us", k.last_start_us).field("first_wait_us", k.first_wait_us)
              .field("last_wait_us", k.last_wait_us).field("end_us", k.end_us).field("after_wait_us", k.after_wait_us)
              .field("slowest_after_wait_us", k.slowest_after_wait_us).field("to_midpoint_us", k.to_midpoint_us)
              .field("from_midpoint_us", k.from_midpoint_us).field("late_blocks", k.late_blocks).end_object();
          t.end_array();
        } else {
          t.field("error", kernels.error().message);
        }
        t.end_object();
        std::printf("%s\n", t.str().c_str());
        std::fflush(stdout);
      }
      if (!o.trace.empty()) {
        // One more call under the profiler, after one that captures this variant's graphs again:
        // where a decoding step's time goes.
        select(variant);
        if (auto warm = engine->generate(prompts, so); !warm) {
          std::fprintf(stderr, "bench_decode: batch %lld: %s\n", static_cast<long long>(batch), warm.error().message.c_str());
          return 1;
        }
        const auto path = o.trace + "-b" + std::to_string(batch) + "-" + o.kernels[variant] + ".json";
        auto rows = policy::profile([&] { (void) engine->generate(prompts, so); }, cuda, path);
        if (!rows) {
          std::fprintf(stderr, "bench_decode: %s\n", rows.error().message.c_str());
          return 1;
        }
        // Device events (kernels, copies, sets) over the call, per decoding step: prefill and
        // sampling included, so an upper bound on a step's kernels.
        std::int64_t device_events = 0;
        for (const auto& r : *rows)
          if (r.device == "cuda")
            device_events += r.count;
        const auto steps = engine->last_stats().decode_steps;
        json_writer p;
        p.begin_object().field("kind", "profile").field("batch", batch).field("fused", fused)
          .field("kernels", o.kernels[variant]).field("trace", path)
          .field("device_events", device_events).field("decode_steps", steps)
          .field("device_events_per_step", steps > 0 ? static_cast<double>(device_events) / static_cast<double>(steps) : 0.0)
          .key("top").begin_array();
        for (std::size_t i = 0; i < rows->size() && i < 25; ++i) {
          const auto& r = (*rows)[i];
          p.begin_object().field("name", r.name.substr(0, 120)).field("device", r.device).field("total_ms", r.total_ms)
            .field("count", r.count).end_object();
        }
        p.end_array().end_object();
        std::printf("%s\n", p.str().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) { // LibTorch failures: out of memory, a device error
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
}
