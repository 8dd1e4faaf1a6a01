// The sampling engine: greedy generations equal transformers' token for token; sampled
// log-probs equal a teacher-forced forward; eos, stop strings, lengths, seeds, versions.
#include <doctest/doctest.h>

#include <numeric>

#include <torch/torch.h>

#include "policy/model/engine.hpp"
#include "policy/model/model.hpp"
#include "policy_test_util.hpp"

using namespace crucible;
using namespace crucible::policy;
using namespace crucible::policy::testing;

namespace {

std::vector<std::int32_t> to_ids(const torch::Tensor& t) {
  auto l = t.to(torch::kLong).contiguous();
  return {l.data_ptr<std::int64_t>(), l.data_ptr<std::int64_t>() + l.numel()};
}

std::unique_ptr<engine> load_engine(const std::string& variant) {
  auto e = engine::load(hf_reference_dir() / variant, {});
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return std::move(*e);
}

struct reference_prompts {
  std::vector<std::vector<std::int32_t>> prompts, greedy;
};

reference_prompts reference(const std::string& variant) {
  auto ref = read_tensors(hf_reference_dir() / variant / "reference.safetensors");
  reference_prompts r;
  for (int i = 0; ref.count("prompt_" + std::to_string(i)); ++i) {
    r.prompts.push_back(to_ids(ref.at("prompt_" + std::to_string(i))));
    r.greedy.push_back(to_ids(ref.at("greedy_" + std::to_string(i))));
  }
  REQUIRE(r.prompts.size() == 3);
  return r;
}

// One character per token, so stop strings can be built from token ids.
std::string detok(std::span<const std::int32_t> ids) {
  std::string s;
  for (auto id : ids)
    s += static_cast<char>('a' + id % 26);
  return s;
}

// The engine's completions equal transformers' greedy continuations of the reference prompts.
void check_greedy(const result<std::vector<completion>>& out, const reference_prompts& ref) {
  REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().message));
  REQUIRE(out->size() == ref.greedy.size());
  for (std::size_t i = 0; i < ref.greedy.size(); ++i)
    CHECK((*out)[i].tokens == ref.greedy[i]);
}

} // namespace

TEST_CASE("greedy generation equals transformers token for token (64 tokens, prompts of different lengths in one batch)") {
  torch::manual_seed(1234);
  std::size_t matched = 0, total = 0;
  for (const auto& variant : hf_variants()) {
    CAPTURE(variant);
    auto e = load_engine(variant);
    auto ref = reference(variant);
    sampling_options o;
    o.temperature = 0.0;
    o.max_new_tokens = 64;
    auto out = e->generate(ref.prompts, o);
    REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().message));
    REQUIRE(out->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      const auto& got = (*out)[i].tokens;
      REQUIRE(got.size() == 64);
      std::size_t same = 0;
      while (same < 64 && got[same] == ref.greedy[i][same])
        ++same;
      matched += same;
      total += 64;
      CHECK_MESSAGE(same == 64, variant << " prompt " << i << ": first difference at token " << same);
      CHECK((*out)[i].finish == finish_reason::length);
    }
  }
  MESSAGE("greedy tokens matching transformers: " << matched << " / " << total);
}

TEST_CASE("sampled log-probs equal a teacher-forced forward at the sampling temperature") {
  torch::manual_seed(1234);
  for (std::string variant : {"qwen2_tied", "llama_llama3"}) {
    CAPTURE(variant);
    auto e = load_engine(variant);
    auto ref = reference(variant);
    sampling_options o;
    o.temperature = 0.8;
    o.top_p = 0.9;
    o.top_k = 40;
    o.max_new_tokens = 24;
    o.samples_per_prompt = 3;
    o.seed = 11;
    auto out = e->generate(ref.prompts, o);
    REQUIRE(out.ok());
    REQUIRE(out->size() == 9);
    double worst = 0.0;
    for (const auto& c : *out) {
      REQUIRE(c.logprobs.size() == c.tokens.size());
      auto expect = teacher_forced_log_probs(e->model(), ref.prompts[c.prompt_index], c.tokens, o.temperature);
      auto got = torch::tensor(c.logprobs);
      worst = std::max(worst, max_abs_diff(got, expect));
      CHECK((got <= 0).all().item<bool>());
    }
    MESSAGE(variant << ": max |engine log-prob - teacher-forced| = " << worst);
    CHECK(worst <= 1e-4);
    // Prompt-major order, G samples each, and the samples of a group differ.
    CHECK((*out)[4].prompt_index == 1);
    CHECK((*out)[4].sample_index == 1);
    CHECK((*out)[3].tokens != (*out)[4].tokens);
  }
}

TEST_CASE("sampling is seeded, top_k = 1 is greedy, the policy version is stamped") {
  torch::manual_seed(1234);
  auto e = load_engine("qwen2_yarn");
  auto ref = reference("qwen2_yarn");
  sampling_options o;
  o.temperature = 1.0;
  o.max_new_tokens = 16;
  o.samples_per_prompt = 2;
  o.seed = 5;
  e->set_policy_version(42);
  auto a = e->generate(ref.prompts, o);
  auto b = e->generate(ref.prompts, o);
  o.seed = 6;
  auto c = e->generate(ref.prompts, o);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  bool all_same = true, any_diff = false;
  for (std::size_t i = 0; i < a->size(); ++i) {
    all_same = all_same && (*a)[i].tokens == (*b)[i].tokens && (*a)[i].logprobs == (*b)[i].logprobs;
    any_diff = any_diff || (*a)[i].tokens != (*c)[i].tokens;
    CHECK((*a)[i].policy_version == 42);
  }
  CHECK(all_same);
  CHECK(any_diff);

  o.top_k = 1;
  o.samples_per_prompt = 1;
  o.max_new_tokens = 64;
  o.temperature = 0.5;
  check_greedy(e->generate(ref.prompts, o), ref);
}

TEST_CASE("eos ids and stop strings end completions early, the others go on unchanged") {
  torch::manual_seed(1234);
  auto e = load_engine("llama_llama3");
  auto ref = reference("llama_llama3");
  sampling_options o;
  o.temperature = 0.0;
  o.max_new_tokens = 64;

  SUBCASE("eos") {
    // An id that prompt 0's greedy continuation produces at position 10.
    const auto eos = ref.greedy[0][10];
    o.eos_ids = {eos};
    auto out = e->generate(ref.prompts, o);
    REQUIRE(out.ok());
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      const auto& g = ref.greedy[i];
      auto first = std::find(g.begin(), g.end(), eos);
      const auto expect = std::vector<std::int32_t>(g.begin(), first == g.end() ? g.end() : first + 1);
      CHECK((*out)[i].tokens == expect);
      CHECK((*out)[i].finish == (first == g.end() ? finish_reason::length : finish_reason::eos));
    }
    CHECK((*out)[0].tokens.size() <= 11);
    CHECK(e->last_stats().compactions >= 1);
  }
  SUBCASE("stop strings") {
    // Three characters that prompt 1's greedy continuation spells at tokens 20..22.
    const auto stop = detok(std::span(ref.greedy[1]).subspan(20, 3));
    o.stop = {"this never appears: far too long for the window", stop};
    auto out = e->generate(ref.prompts, o, detok);
    REQUIRE(out.ok());
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      const auto text = detok(ref.greedy[i]);
      auto pos = text.find(stop);
      const auto expect_len = pos == std::string::npos ? 64 : pos + stop.size();
      CHECK((*out)[i].tokens.size() == expect_len);
      CHECK(std::equal((*out)[i].tokens.begin(), (*out)[i].tokens.end(), ref.greedy[i].begin()));
      if (pos != std::string::npos) {
        CHECK((*out)[i].finish == finish_reason::stop);
        CHECK((*out)[i].stop_string == stop);
      }
    }
    CHECK((*out)[1].tokens.size() <= 23);
  }
  SUBCASE("max_new_tokens") {
    o.max_new_tokens = 1;
    auto out = e->generate(ref.prompts, o);
    REQUIRE(out.ok());
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK((*out)[i].tokens == std::vector<std::int32_t>{ref.greedy[i][0]});
      CHECK((*out)[i].finish == finish_reason::length);
    }
  }
  SUBCASE("prefill in pieces gives the same completions") {
    engine_options eo;
    eo.max_prefill_tokens = 4;
    auto small = engine::load(hf_reference_dir() / "llama_llama3", eo);
    REQUIRE(small.ok());
    check_greedy((*small)->generate(ref.prompts, o), ref);
  }
}

TEST_CASE("the engine refuses bad requests, naming the field") {
  torch::manual_seed(1234);
  auto e = load_engine("qwen2_tied");
  std::vector<std::vector<std::int32_t>> prompts{{1, 2, 3}};
  auto error_of = [&](sampling_options o, std::vector<std::vector<std::int32_t>> p, detokenize_fn d = {}) {
    auto r = e->generate(p, o, d);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == errc::invalid_arg);
    return r.error().message;
  };
  sampling_options o;
  CHECK(error_of(o, {{1, 2}, {}}).find("prompt 1 is empty") != std::string::npos);
  CHECK(error_of(o, {{1, 300}}).find("token 300") != std::string::npos);
  o.top_p = 0.0;
  CHECK(error_of(o, prompts).find("top_p") != std::string::npos);
  o = {};
  o.temperature = -1;
  CHECK(error_of(o, prompts).find("temperature") != std::string::npos);
  o = {};
  o.stop = {"x"};
  CHECK(error_of(o, prompts).find("detokenizer") != std::string::npos);
  o = {};
  o.eos_ids = {1000};
  CHECK(error_of(o, prompts).find("eos_ids") != std::string::npos);
  auto empty = e->generate(std::vector<std::vector<std::int32_t>>{}, sampling_options{});
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("the number of steps between host copies changes no greedy completion, only the copies") {
  torch::manual_seed(1234);
  auto ref = reference("llama_llama3");
  sampling_options o;
  o.temperature = 0.0;
  o.max_new_tokens = 40;
  o.eos_ids = {ref.greedy[0][10]};                          // ends prompt 0 at token 10
  o.stop = {detok(std::span(ref.greedy[1]).subspan(20, 3))}; // ends prompt 1 by token 22
  o.samples_per_prompt = 2;
  std::vector<completion> first;
  std::int64_t syncs_every_step = 0;
  for (std::int64_t interval : {1, 3, 16, 1000}) {
    CAPTURE(interval);
    engine_options eo;
    eo.sync_interval = interval;
    auto e = engine::load(hf_reference_dir() / "llama_llama3", eo);
    REQUIRE(e.ok());
    auto out = (*e)->generate(ref.prompts, o, detok);
    REQUIRE(out.ok());
    const auto& st = (*e)->last_stats();
    if (interval == 1) {
      first = *out;
      syncs_every_step = st.host_syncs;
      CHECK(st.host_syncs == 1 + st.decode_steps); // the prefill's token, then one per step
      CHECK((*out)[0].finish == finish_reason::eos);
      CHECK((*out)[0].tokens.size() == 11);
      CHECK((*out)[2].finish == finish_reason::stop);
      continue;
    }
    REQUIRE(out->size() == first.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
      CAPTURE(i);
      CHECK((*out)[i].tokens == first[i].tokens);
      REQUIRE((*out)[i].logprobs.size() == first[i].logprobs.size());
      for (std::size_t j = 0; j < first[i].logprobs.size(); ++j) // batch shapes differ: rounding only
        CHECK(std::abs((*out)[i].logprobs[j] - first[i].logprobs[j]) <= 1e-5);
      CHECK((*out)[i].finish == first[i].finish);
      CHECK((*out)[i].stop_string == first[i].stop_string);
    }
    CHECK(st.host_syncs < syncs_every_step);
    // Blocks end at the shortest remaining length: no step past max_new_tokens.
    CHECK(st.decode_steps <= o.max_new_tokens - 1);
  }
}
