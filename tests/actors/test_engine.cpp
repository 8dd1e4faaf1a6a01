// tests/actors/test_engine.cpp: the engine actor on CAF's deterministic scheduler over a real
// policy::engine and tokenizer on the CPU (tests/actors/scripted_policy.hpp: a model whose
// next-token distribution the test chooses): completions, behaviour log-probs and versions,
// batching of waiting requests, the bounded queue, per-request errors, weight updates.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/engine.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/actors/scripted_policy.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
using crucible::testing::deterministic;
using crucible::testing::response_id;
using crucible::testing::scripted_log_prob;
using crucible::testing::scripted_response;
using crucible::testing::temp_dir;

namespace {

const std::vector<std::string>& responses() {
  static const std::vector<std::string> r{scripted_response("class ModelNew:\n    pass  # a\n"),
                                          scripted_response("class ModelNew:\n    pass  # b\n"),
                                          "No code from me."};
  return r;
}

// The scripted distributions: always A, always B, or A:B:C = 0.5:0.3:0.2.
const std::map<std::int32_t, double> only_a{{response_id(0), 30.0}};
const std::map<std::int32_t, double> only_b{{response_id(1), 30.0}};
const std::map<std::int32_t, double> mixed{{response_id(0), 30.0 + std::log(0.5)},
                                           {response_id(1), 30.0 + std::log(0.3)},
                                           {response_id(2), 30.0 + std::log(0.2)}};

struct fixture {
  temp_dir dir;
  std::shared_ptr<const policy::tokenizer> tok = crucible::testing::scripted_tokenizer(responses());
  std::int64_t vocab = static_cast<std::int64_t>(tok->vocab_size());
  actor_config cfg;
  caf::actor_system sys{deterministic(cfg)};
  caf::scoped_actor self{sys, true};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::vector<engine_actor> spawned;

  ~fixture() {
    for (auto& a : spawned)
      self->send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  std::filesystem::path model(const std::string& name, const std::map<std::int32_t, double>& logits,
                              std::int64_t model_vocab = 0) {
    auto path = dir.path() / name;
    crucible::testing::write_scripted_model(path, model_vocab > 0 ? model_vocab : vocab, logits);
    return path;
  }

  engine_actor_options options() {
    engine_actor_options o;
    o.detached = false;
    return o;
  }

  engine_actor spawn(const std::filesystem::path& model_dir, engine_actor_options opt, weight_receiver receive = {}) {
    auto e = policy::engine::load(model_dir, {});
    REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
    auto a = spawn_engine_actor(sys, engine_deps{std::shared_ptr<policy::engine>(std::move(*e)), tok, std::move(receive)},
                                std::move(opt));
    REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().to_string()));
    spawned.push_back(*a);
    sched.run();
    return *a;
  }

  // Sends requests without running the scheduler: they all wait in the engine's mailbox.
  template <class Msg>
  auto post(const engine_actor& a, Msg msg) {
    return self->request(a, caf::infinite, std::move(msg));
  }

  // The reply to a request posted earlier, after everything has run.
  template <class Out, class Handle>
  result<Out> reply(Handle& rh) {
    std::optional<result<Out>> out;
    REQUIRE_FALSE(self->mailbox().empty());
    rh.receive([&](Out& x) { out.emplace(std::move(x)); }, [&](caf::error& e) { out.emplace(to_error(e)); });
    REQUIRE(out.has_value());
    return std::move(*out);
  }

  template <class Out, class Msg>
  result<Out> ask(const engine_actor& a, Msg msg) {
    auto rh = post(a, std::move(msg));
    sched.run();
    return reply<Out>(rh);
  }

  engine_status status(const engine_actor& a) {
    auto s = ask<engine_status>(a, caf::get_atom_v);
    REQUIRE(s.ok());
    return *s;
  }
};

generation_request request(std::uint64_t group, std::uint32_t samples, double temperature = 1.0) {
  generation_request r;
  r.group = group_id{group};
  r.task = task_id{"cpu/01_relu_scale"};
  r.prompt = "<|im_start|>user\nTask: make it fast " + std::to_string(group) + "<|im_end|>\n<|im_start|>assistant\n";
  r.samples = samples;
  r.params.temperature = temperature;
  r.params.max_new_tokens = 1;
  r.params.seed = 1000 + group;
  return r;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "completions carry the sampled text, behaviour log-probs, the prompt's tokens and the version") {
  auto a = spawn(model("mixed", mixed), options());
  auto out = ask<generation_result>(a, request(7, 16));
  REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().to_string()));
  CHECK(out->group == group_id{7});
  CHECK(out->task == task_id{"cpu/01_relu_scale"});
  // A chat-rendered prompt is encoded without template tokens (add_special_tokens false).
  CHECK(out->prompt_token_ids == tok->encode(request(7, 16).prompt, false));
  REQUIRE(out->completions.size() == 16);
  std::map<std::int32_t, int> seen;
  for (const auto& c : out->completions) {
    REQUIRE(c.token_ids.size() == 1);
    REQUIRE(c.logprobs.size() == 1);
    const auto t = c.token_ids[0];
    REQUIRE(mixed.count(t) == 1);
    ++seen[t];
    CHECK(c.text == responses()[static_cast<std::size_t>(t - response_id(0))]);
    CHECK(c.logprobs[0] == doctest::Approx(scripted_log_prob(vocab, mixed, t)).epsilon(1e-4));
    CHECK(c.policy_version == policy_version{0});
  }
  CHECK(seen.size() >= 2); // sampled, not greedy

  // Token ids given: sampled on as they are, the text is not encoded.
  auto ids = request(8, 2);
  ids.prompt = "ignored";
  ids.prompt_token_ids = {5, 6, 7};
  auto out2 = ask<generation_result>(a, ids);
  REQUIRE(out2.ok());
  CHECK(out2->prompt_token_ids == std::vector<std::int32_t>{5, 6, 7});
  CHECK(out2->completions.size() == 2);

  auto s = status(a);
  CHECK(s.requests == 2);
  CHECK(s.samples == 18);
  CHECK(s.batches == 2);
  CHECK(s.queued == 0);
}

TEST_CASE_FIXTURE(fixture, "waiting requests with equal settings share an engine call within the batch bounds") {
  auto opt = options();
  opt.max_batch_prompts = 3;
  opt.max_batch_samples = 64;
  auto a = spawn(model("mixed", mixed), opt);
  // 1 is sampled at once; 2, 4, 5 then share a call (3 differs in temperature); then 6 and 3.
  std::vector<generation_request> reqs{request(1, 4), request(2, 4), request(3, 4, 0.0), request(4, 4),
                                       request(5, 4), request(6, 4)};
  std::vector<decltype(post(a, reqs[0]))> handles;
  for (const auto& r : reqs)
    handles.push_back(post(a, r));
  sched.run();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto out = reply<generation_result>(handles[i]);
    REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().to_string()));
    CHECK(out->group == reqs[i].group);
    CHECK(out->completions.size() == 4);
    if (reqs[i].params.temperature == 0.0)
      for (const auto& c : out->completions)
        CHECK(c.token_ids[0] == response_id(0)); // greedy: the most likely
  }
  auto s = status(a);
  CHECK(s.batches == 4); // {1}, {2, 4, 5}, {3, 6}? no: 3 differs from 6, so {6}, {3} follow
  CHECK(s.requests == 6);
  CHECK(s.samples == 24);

  // The sample bound: 3 requests of G = 4 under max_batch_samples = 8 go 1 + 2 per call.
  auto opt2 = options();
  opt2.max_batch_samples = 8;
  auto b = spawn(model("mixed2", mixed), opt2);
  std::vector<decltype(post(b, reqs[0]))> hs;
  for (std::uint64_t g = 1; g <= 5; ++g)
    hs.push_back(post(b, request(g, 4)));
  sched.run();
  for (auto& h : hs)
    CHECK(reply<generation_result>(h).ok());
  CHECK(status(b).batches == 3); // {1}, {2, 3}, {4, 5}
}

TEST_CASE_FIXTURE(fixture, "a full queue refuses requests with errc::busy") {
  auto opt = options();
  opt.max_queued = 2;
  auto a = spawn(model("mixed", mixed), opt);
  std::vector<decltype(post(a, request(1, 1)))> handles;
  for (std::uint64_t g = 1; g <= 6; ++g)
    handles.push_back(post(a, request(g, 2)));
  sched.run();
  // 1 went to the runner at once, 2 and 3 waited, 4 to 6 found the queue full.
  std::vector<errc> codes;
  for (auto& h : handles) {
    auto out = reply<generation_result>(h);
    codes.push_back(out.ok() ? errc::none : out.error().code);
  }
  CHECK(codes == std::vector<errc>{errc::none, errc::none, errc::none, errc::busy, errc::busy, errc::busy});
  auto s = status(a);
  CHECK(s.refused == 3);
  CHECK(s.requests == 3);
  CHECK(s.queued == 0);
  // Room again once the queue has drained.
  CHECK(ask<generation_result>(a, request(9, 1)).ok());
}

TEST_CASE_FIXTURE(fixture, "cancel drops the sender's waiting requests, not the call under way nor another sender's") {
  auto opt = options();
  opt.max_batch_prompts = 1; // one request a call: the others wait
  auto a = spawn(model("mixed", mixed), opt);
  caf::scoped_actor other{sys, true};
  std::vector<decltype(post(a, request(1, 1)))> mine;
  for (std::uint64_t g = 1; g <= 3; ++g)
    mine.push_back(post(a, request(g, 2)));
  auto theirs = other->request(a, caf::infinite, request(7, 2));
  for (std::uint64_t g = 4; g <= 5; ++g)
    mine.push_back(post(a, request(g, 2)));
  self->send(a, cancel_atom_v);
  sched.run();
  // 1 was under way when the cancel came; 2, 3, 4 and 5 waited and are dropped; 7 is served.
  std::vector<errc> codes;
  for (auto& h : mine) {
    auto out = reply<generation_result>(h);
    codes.push_back(out.ok() ? errc::none : out.error().code);
    if (!out.ok())
      CHECK_MESSAGE(out.error().message.find("cancelled by its sender before it ran") != std::string::npos, out.error().message);
  }
  CHECK(codes == std::vector<errc>{errc::none, errc::cancelled, errc::cancelled, errc::cancelled, errc::cancelled});
  std::optional<bool> served;
  theirs.receive([&](generation_result& r) { served = r.completions.size() == 2; },
                 [&](caf::error&) { served = false; });
  CHECK(served == std::optional<bool>{true});
  auto s = status(a);
  CHECK(s.cancelled == 4);
  CHECK(s.requests == 2);
  CHECK(s.batches == 2);
  // A cancel with nothing waiting changes nothing; later requests are served.
  self->send(a, cancel_atom_v);
  sched.run();
  CHECK(ask<generation_result>(a, request(9, 1)).ok());
  CHECK(status(a).cancelled == 4);
}

TEST_CASE_FIXTURE(fixture, "a bad request fails alone and the rest of its batch is served") {
  auto opt = options();
  opt.max_prompt_tokens = 200;
  auto a = spawn(model("mixed", mixed), opt);
  auto empty = request(2, 2);
  empty.prompt.clear();
  auto outside = request(3, 2);
  outside.prompt_token_ids = {1, 2, static_cast<std::int32_t>(vocab)};
  auto too_long = request(4, 2);
  too_long.prompt = std::string(5000, 'x');
  auto no_samples = request(5, 0);
  std::vector<generation_request> reqs{request(1, 2), empty, outside, too_long, no_samples, request(6, 2)};
  std::vector<decltype(post(a, reqs[0]))> handles;
  for (const auto& r : reqs)
    handles.push_back(post(a, r));
  sched.run();
  std::vector<std::string> errors;
  for (auto& h : handles) {
    auto out = reply<generation_result>(h);
    if (out.ok()) {
      CHECK(out->completions.size() == 2);
      errors.push_back("");
    } else {
      CHECK(out.error().code == errc::invalid_arg);
      errors.push_back(out.error().message);
    }
  }
  CHECK(errors[0].empty());
  CHECK(errors[1].find("g2: the prompt is empty") != std::string::npos);
  CHECK(errors[2].find("outside the vocabulary") != std::string::npos);
  CHECK(errors[3].find("engine.max_prompt_tokens (200)") != std::string::npos);
  CHECK(errors[4].find("samples must be at least 1") != std::string::npos);
  CHECK(errors[5].empty());
  auto s = status(a);
  CHECK(s.failed == 4);
  CHECK(s.requests == 2);

  // Settings the engine refuses fail every request of the call that shares them.
  auto bad = request(7, 2);
  bad.params.top_p = 0.0;
  auto out = ask<generation_result>(a, bad);
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().message.find("top_p") != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "a weight update serves a model directory's weights under its version, before waiting requests") {
  auto a = spawn(model("a", only_a), options());
  auto b_dir = model("b", only_b);
  CHECK(status(a).policy_version == policy_version{0});

  // 1 is sampled at once with A's weights; the update waits for the engine and goes ahead of 2.
  auto h1 = post(a, request(1, 2));
  auto hu = post(a, weight_update{b_dir.string(), policy_version{3}});
  auto h2 = post(a, request(2, 2));
  sched.run();
  auto r1 = reply<generation_result>(h1);
  auto ru = reply<policy_version>(hu);
  auto r2 = reply<generation_result>(h2);
  REQUIRE(r1.ok());
  REQUIRE_MESSAGE(ru.ok(), (ru.ok() ? "" : ru.error().to_string()));
  REQUIRE(r2.ok());
  CHECK(*ru == policy_version{3});
  for (const auto& c : r1->completions) {
    CHECK(c.token_ids[0] == response_id(0));
    CHECK(c.policy_version == policy_version{0});
  }
  for (const auto& c : r2->completions) {
    CHECK(c.token_ids[0] == response_id(1));
    CHECK(c.policy_version == policy_version{3});
  }
  auto s = status(a);
  CHECK(s.policy_version == policy_version{3});
  CHECK(s.weight_updates == 1);

  // Refused, and nothing changes: an older version, another vocabulary, no model.
  auto older = ask<policy_version>(a, weight_update{model("a2", only_a).string(), policy_version{2}});
  REQUIRE_FALSE(older.ok());
  CHECK(older.error().code == errc::invalid_arg);
  auto other = ask<policy_version>(a, weight_update{model("wide", only_a, vocab + 64).string(), policy_version{4}});
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().message.find("vocabulary") != std::string::npos);
  auto missing = ask<policy_version>(a, weight_update{(dir.path() / "nowhere").string(), policy_version{4}});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == errc::not_found);
  CHECK(status(a).policy_version == policy_version{3});
  auto after = ask<generation_result>(a, request(3, 1));
  REQUIRE(after.ok());
  CHECK(after->completions[0].token_ids[0] == response_id(1));
}

TEST_CASE_FIXTURE(fixture, "announced weights go through the weight receiver, and are unsupported without one") {
  auto plain = spawn(model("a", only_a), options());
  auto none = ask<policy_version>(plain, weights_published{policy_version{1}, 1, 100});
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code == errc::unsupported);

  // The receiver runs between engine calls with the engine itself; here it only records what it
  // was given and fails for version 5.
  auto calls = std::make_shared<std::vector<std::uint64_t>>();
  weight_receiver receive = [calls](policy::engine& e, const weights_published& w) -> result<void> {
    calls->push_back(w.policy_version.value);
    CHECK(e.policy_version() < w.policy_version.value);
    if (w.policy_version.value == 5)
      return fail(errc::device, "broadcast interrupted");
    return {};
  };
  auto a = spawn(model("a2", only_a), options(), receive);
  auto v2 = ask<policy_version>(a, weights_published{policy_version{2}, 4, 1000});
  REQUIRE(v2.ok());
  CHECK(*v2 == policy_version{2});
  auto v5 = ask<policy_version>(a, weights_published{policy_version{5}, 4, 1000});
  REQUIRE_FALSE(v5.ok());
  CHECK(v5.error().message == "broadcast interrupted");
  CHECK(*calls == std::vector<std::uint64_t>{2, 5});
  auto out = ask<generation_result>(a, request(1, 1));
  REQUIRE(out.ok());
  CHECK(out->completions[0].policy_version == policy_version{2});
  CHECK(status(a).weight_updates == 1);
}

TEST_CASE_FIXTURE(fixture, "spawning refuses bad options, a missing engine and a tokenizer larger than the model") {
  auto opt = options();
  opt.max_queued = 0;
  auto e = policy::engine::load(model("a", only_a), {});
  REQUIRE(e.ok());
  std::shared_ptr<policy::engine> shared(std::move(*e));
  auto r = spawn_engine_actor(sys, engine_deps{shared, tok, {}}, opt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("engine.max_queued") != std::string::npos);
  CHECK(spawn_engine_actor(sys, engine_deps{nullptr, tok, {}}, options()).error().code == errc::invalid_arg);
  auto small = policy::engine::load(model("small", {{3, 1.0}}, 300), {});
  REQUIRE(small.ok());
  auto r2 = spawn_engine_actor(sys, engine_deps{std::shared_ptr<policy::engine>(std::move(*small)), tok, {}}, options());
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.error().message.find("tokenizer") != std::string::npos);
}
