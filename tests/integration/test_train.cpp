// `crucible train`, `resume` and `status` in real processes on the CPU with a tiny fresh model: the
// whole loop for a few steps (warm start, SFT, contrastive RL with real verdicts), pause/resume giving
// the same weights as an uninterrupted run, learner ranks, task samplers across a pause, evaluator
// nodes joining, and input refused before a run starts. Crashes and faults: test_train_recovery.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/json_parse.hpp"
#include "core/sha256.hpp"
#include "process.hpp"
#include "tests/integration/train_util.hpp"
#include "tests/test_util/safetensors_floats.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::run_process;
using crucible::testing::running_process;
using crucible::testing::temp_dir;
using namespace crucible::testing::train;

namespace {

std::string final_weights(const fs::path& run) {
  auto latest = slurp(run / "checkpoints" / "latest");
  while (!latest.empty() && latest.back() == '\n')
    latest.pop_back();
  return slurp(run / "checkpoints" / latest / "learner" / "model" / "model.safetensors");
}

// The task samplers of a checkpoint: per task name, the attempts summed over the rollout places,
// tasks never attempted left out (samplers.json holds env::task_sampler::save texts: a header,
// the task count, then one "NAME\tATTEMPTS\tFAILURES\tBEST" line per task).
std::map<std::string, std::int64_t> sampler_attempts(const fs::path& checkpoint) {
  auto doc = crucible::parse_json(slurp(checkpoint / "samplers.json"));
  REQUIRE(doc.ok());
  REQUIRE(doc->find("format")->as_string() == "crucible-samplers-1");
  std::map<std::string, std::int64_t> out;
  for (const auto& s : doc->find("samplers")->as_array()) {
    std::istringstream in(s.find("state")->as_string());
    std::string line;
    std::getline(in, line);
    REQUIRE(line == "crucible-task-sampler 1");
    std::getline(in, line);
    const auto n = std::stoi(line);
    for (int i = 0; i < n; ++i) {
      REQUIRE(std::getline(in, line));
      std::istringstream row(line);
      std::string name;
      std::int64_t attempts = 0;
      std::getline(row, name, '\t');
      row >> attempts;
      if (attempts > 0)
        out[name] += attempts;
    }
  }
  return out;
}

// Verdict records of stage `stage` per task, those before the first `until` record only (all
// when `until` is empty).
std::map<std::string, std::int64_t> verdicts_per_task(const fs::path& run, const std::string& stage,
                                                      const std::string& until = "") {
  std::map<std::string, std::int64_t> out;
  for (const auto& r : records(run)) {
    if (!until.empty() && event_of(r) == until)
      break;
    if (event_of(r) == "verdict" && r.find("stage")->as_string() == stage)
      ++out[r.find("task")->as_string()];
  }
  return out;
}

// Per run step of stage `stage`, the tasks of its groups, sorted.
std::map<std::int64_t, std::vector<std::string>> group_tasks(const fs::path& run, const std::string& stage) {
  std::map<std::int64_t, std::map<std::int64_t, std::string>> groups;
  for (const auto& r : records(run))
    if (event_of(r) == "verdict" && r.find("stage")->as_string() == stage)
      groups[r.find("step")->as_int()][r.find("group")->as_int()] = r.find("task")->as_string();
  std::map<std::int64_t, std::vector<std::string>> out;
  for (const auto& [step, by_group] : groups) {
    for (const auto& [group, task] : by_group)
      out[step].push_back(task);
    std::sort(out[step].begin(), out[step].end());
  }
  return out;
}

// Three tasks, two rollout actors, synchronous RL steps of two groups with the `improvement`
// sampler: each step, each rollout place draws one task.
const std::vector<std::string> sampler_sets = {
  "--set", "run.mode=sync", "--set", "rollout.actors=2", "--set", "rollout.sampler=improvement", "--set",
  "tasks.include=[01_relu_scale,02_silu_bias_residual,03_softmax_rows]"};

std::vector<std::string> with_sets(std::vector<std::string> args) {
  args.insert(args.end(), sampler_sets.begin(), sampler_sets.end());
  return args;
}

} // namespace

TEST_CASE("the whole loop on the CPU: warm start, SFT and contrastive RL with real verdicts, then a report") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "loop", "  sft: {steps: 2, batch: 2}\n  rl: {steps: 2, groups: 1}\n"));
  auto r = cli({"train", cfg.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("finished at step 4") != std::string::npos);
  // The workers' profiler start-up says nothing on the terminal (libkineto's "gpuGetDeviceCount
  // failed" on machines without a GPU).
  CHECK(r.err.find("gpuGetDeviceCount") == std::string::npos);
  const auto run = tmp.path() / "loop";
  auto all = records(run);
  std::map<std::string, int> count;
  std::set<std::string> statuses;
  std::vector<std::string> stages;
  for (const auto& x : all) {
    ++count[event_of(x)];
    if (event_of(x) == "verdict")
      statuses.insert(x.find("status")->as_string());
    if (event_of(x) == "train_step")
      stages.push_back(x.find("stage")->as_string());
  }
  // Warm start: the three seed variants of the task (two correct, one wrong) were evaluated.
  CHECK(count["verdict"] >= 3 + 4);
  CHECK(statuses.count("ok") == 1);
  CHECK(statuses.count("incorrect") == 1);
  CHECK(stages == std::vector<std::string>{"sft", "sft", "rl", "rl"});
  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3, 4});
  CHECK(count["run_started"] == 1);
  CHECK(count["run_finished"] == 1);
  CHECK(count["checkpoint"] == 2); // steps 2 and 4
  // Each checkpoint holds the rollouts' task samplers (the one at step 2 asked the running
  // rollout actors); they saw every RL verdict recorded, and maybe more (groups dropped at the
  // end of the stage).
  REQUIRE(fs::exists(run / "checkpoints" / "step-2" / "samplers.json"));
  std::int64_t attempts = 0, rl_verdicts = 0;
  for (const auto& [task, n] : sampler_attempts(run / "checkpoints" / "step-4"))
    attempts += n;
  for (const auto& [task, n] : verdicts_per_task(run, "rl"))
    rl_verdicts += n;
  CHECK(rl_verdicts > 0);
  CHECK(attempts >= rl_verdicts);
  // Every step's time: the trainer's parts (learner update, weight publication, waiting for
  // groups, building SFT examples) lie within its own span, which lies within the coordinator's round trip.
  CHECK(count["step_timing"] == 4);
  std::map<std::int64_t, double> trip;
  for (const auto& x : all)
    if (event_of(x) == "step_timing")
      trip[x.find("step")->as_int()] = x.find("round_trip_seconds")->as_double();
  for (const auto& x : all)
    if (event_of(x) == "train_step") {
      const auto step = x.find("step")->as_int();
      const double span = x.find("step_seconds")->as_double();
      const double parts = x.find("seconds")->as_double() + x.find("publish_seconds")->as_double()
                           + x.find("wait_seconds")->as_double() + x.find("prep_seconds")->as_double();
      INFO("step ", step);
      CHECK(x.find("seconds")->as_double() > 0);
      CHECK(parts <= span + 1e-6);
      REQUIRE(trip.count(step) == 1);
      CHECK(span <= trip[step] + 1e-6);
      if (x.find("stage")->as_string() == "sft") {
        CHECK(x.find("prep_seconds")->as_double() > 0);
      } else {
        CHECK(x.find("wait_seconds")->as_double() > 0);
        // How stale the step's samples were when it took them: within stages.rl.max_staleness (2),
        // which drops older groups first, and the mean within the most.
        REQUIRE(x.find("staleness_max") != nullptr);
        REQUIRE(x.find("staleness_mean") != nullptr);
        CHECK(x.find("staleness_max")->as_int() <= 2);
        CHECK(x.find("staleness_mean")->as_double() >= 0);
        CHECK(x.find("staleness_mean")->as_double() <= x.find("staleness_max")->as_double() + 1e-9);
      }
    }
  auto st = cli({"status", run.string(), "--json"});
  REQUIRE(st.exit_code == 0);
  auto status = crucible::parse_json(st.out);
  REQUIRE(status.ok());
  CHECK(status->find("state")->as_string() == "finished");
  CHECK(status->find("step")->as_int() == 4);
  CHECK(status->find("policy_version")->as_int() == 4);
  const auto* best_status = status->find("best_speedup"); // checked against the store's samples below
  REQUIRE(best_status != nullptr);
  // The replay store holds every scored variant, and the report draws the run.
  auto rep = cli({"report", run.string()});
  CHECK(rep.exit_code == 0);
  auto html = slurp(run / "report" / "report.html");
  CHECK(html.find("No data yet: no train_step records with a mean_reward") == std::string::npos);
  // The replay store keeps what the policy saw and wrote: every RL sample (a group's member)
  // with its whole completion, which holds the code cut from it, and the id of a stored prompt
  // that names the task; seed variants have neither.
  const auto exported = tmp.path() / "replay.jsonl";
  auto ex = cli({"replay", "export", run.string(), "--out", exported.string()});
  INFO(ex.err);
  REQUIRE(ex.exit_code == 0);
  std::map<std::string, std::string> prompts;
  std::vector<crucible::json_value> samples, seeds;
  {
    std::istringstream in(slurp(exported));
    for (std::string line; std::getline(in, line);) {
      auto j = crucible::parse_json(line);
      REQUIRE(j.ok());
      if (const auto* kind = j->find("kind"); kind && kind->as_string() == "prompt")
        prompts[j->find("prompt_id")->as_string()] = j->find("text")->as_string();
      else if (j->find("group_id")->as_int() != 0)
        samples.push_back(*j);
      else
        seeds.push_back(*j);
    }
  }
  REQUIRE_FALSE(samples.empty());
  CHECK_FALSE(prompts.empty());
  for (const auto& x : samples) {
    const auto& completion = x.find("completion")->as_string();
    const auto& id = x.find("prompt_id")->as_string();
    INFO("variant ", x.find("id")->as_int());
    CHECK_FALSE(completion.empty());
    CHECK(completion.find(x.find("code")->as_string()) != std::string::npos);
    REQUIRE(prompts.count(id) == 1);
    CHECK(id == "sha256:" + crucible::sha256_hex(prompts[id]));
    CHECK(prompts[id].find(x.find("task_id")->as_string()) != std::string::npos);
  }
  for (const auto& x : seeds) {
    CHECK(x.find("completion")->as_string().empty());
    CHECK(x.find("prompt_id")->as_string().empty());
  }
  // The run's best speedup is its policy's samples' best (null where none was correct and timed),
  // never a seed variant's.
  double best = std::numeric_limits<double>::quiet_NaN();
  for (const auto& x : samples)
    if (x.find("status")->as_string() == "ok" && x.find("correct")->as_bool() && x.find("speedup")->is_number())
      best = std::isnan(best) ? x.find("speedup")->as_double() : std::max(best, x.find("speedup")->as_double());
  if (std::isnan(best))
    CHECK(best_status->is_null());
  else
    CHECK(best_status->as_double() == doctest::Approx(best));
  CHECK_FALSE(seeds.empty());
  // The store, the status and the metrics agree on every sample: each one recorded (a row's
  // count) was trained on (a `verdict` record, `variants`), dropped for staleness, or discarded
  // when its stage ended.
  std::int64_t stored = 0;
  for (const auto& x : samples)
    stored += x.find("count")->as_int();
  for (const auto& x : seeds)
    stored += x.find("count")->as_int();
  const auto counted = status->find("variants")->as_int() + status->find("dropped_stale")->as_int()
                       + status->find("discarded")->as_int() + status->find("unfinished")->as_int();
  CHECK(stored == counted);
  CHECK(count["verdict"] == status->find("variants")->as_int());
  // Sample by sample: each policy sample has a row of its own, and its fate.
  std::int64_t seed_count = 0;
  for (const auto& x : seeds)
    seed_count += x.find("count")->as_int();
  auto fates = samples_agree(run, seed_count, "the whole loop");
  std::int64_t policy_samples = 0;
  for (const auto& x : samples)
    policy_samples += x.find("count")->as_int();
  CHECK(fates.find("samples")->find("total")->as_int() == policy_samples);
  CHECK(fates.find("samples")->find("trained")->as_int() >= 2); // two RL steps of a group each
  // A finished run cannot be resumed.
  auto again = cli({"resume", run.string()});
  CHECK(again.exit_code == 2);
  CHECK(again.err.find("has finished") != std::string::npos);

  // A checkpoint's model folder is a Hugging Face folder as it is: the tokenizer beside the
  // weights (listed in the manifest), `crucible generate` opens it, and transformers continues a
  // prompt with the same greedy tokens. (With model.handoff `memory`, the default, no version is
  // written to RUN/policy/.)
  const auto ckpt_model = run / "checkpoints" / "step-4" / "learner" / "model";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "crucible_prompt.json"})
    CHECK_MESSAGE(fs::exists(ckpt_model / f), (ckpt_model / f).string());
  // How the run wrote its prompts (serve-policy follows it): this run's prompt.chat_template.
  CHECK(slurp(ckpt_model / "crucible_prompt.json").find("\"chat_template\": \"") != std::string::npos);
  CHECK_FALSE(fs::exists(run / "policy"));
  const auto manifest = slurp(run / "checkpoints" / "step-4" / "learner" / "manifest.json");
  CHECK(manifest.find("\"model/tokenizer.json\"") != std::string::npos);
  const std::string prompt = "def forward(self, x):";
  auto gen = cli({"generate", "--model", ckpt_model.string(), "--prompt", prompt, "--temperature", "0",
                  "--max-new-tokens", "8", "--json"});
  INFO(gen.err);
  REQUIRE(gen.exit_code == 0);
  auto ours = crucible::parse_json(gen.out);
  REQUIRE(ours.ok());
  auto hf = run_process({CRUCIBLE_PYTHON, (source_dir / "tests" / "integration" / "hf_generate.py").string(),
                         ckpt_model.string(), prompt, "8"});
  INFO(hf.err);
  REQUIRE(hf.exit_code == 0);
  auto theirs = crucible::parse_json(hf.out);
  REQUIRE(theirs.ok());
  auto ids = [](const crucible::json_value& a) {
    std::vector<std::int64_t> out;
    for (const auto& x : a.as_array())
      out.push_back(x.as_int());
    return out;
  };
  const auto& completion = ours->find("completions")->as_array().at(0);
  CHECK(ids(*theirs->find("prompt_token_ids")) == ids(*ours->find("prompt_token_ids")));
  CHECK(ids(*theirs->find("token_ids")) == ids(*completion.find("token_ids")));
}

namespace {

// Runs `cfg` to its end as "whole" and again as "split", paused after step 2: the two runs the
// exact-resume tests compare once the caller has resumed "split".
void run_whole_and_split(const fs::path& cfg) {
  auto whole = cli({"train", cfg.string()});
  INFO(whole.err);
  REQUIRE(whole.exit_code == 0);
  auto split = cli({"train", cfg.string(), "--set", "run.name=split", "--pause-after", "2"});
  INFO(split.err);
  REQUIRE(split.exit_code == 0);
  CHECK(split.out.find("paused at step 2") != std::string::npos);
}

} // namespace

TEST_CASE("pause and resume give the weights of an uninterrupted run, each step once") {
  temp_dir tmp;
  const std::string stages = "  sft: {steps: 4, batch: 2}\n";
  auto whole_cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "whole", stages)));
  run_whole_and_split(whole_cfg);
  const auto run = tmp.path() / "split";
  auto st = cli({"status", run.string(), "--json"});
  CHECK(st.out.find("\"state\":\"paused\"") != std::string::npos);
  auto resumed = cli({"resume", run.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);

  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3, 4});
  std::map<std::string, int> count;
  for (const auto& x : records(run))
    ++count[event_of(x)];
  CHECK(count["run_paused"] == 1);
  CHECK(count["run_resumed"] == 1);
  const auto a = final_weights(tmp.path() / "whole");
  const auto b = final_weights(run);
  REQUIRE(!a.empty());
  CHECK(a == b);
}

// The path of configs/gpu-1.5b.yaml and gpu-7b-lora.yaml at tiny shapes: bf16 weights with
// float32 master weights, LoRA, activation checkpointing, the engine in bf16 sharing the frozen
// base through the in-memory handoff.
std::string real_size_path(std::string t, const std::string& handoff) {
  const std::string model = "model:\n  init: tiny\n  tokenizer_vocab: 600\n";
  t.insert(t.find(model) + model.size(), "  engine_dtype: bfloat16\n  handoff: " + handoff + "\n");
  const std::string learner = "learner:\n";
  t.insert(t.find(learner) + learner.size(),
           "  dtype: bfloat16\n  activation_checkpointing: true\n  lora: true\n  lora_rank: 4\n");
  return t;
}

// The completions of a run's first sampled group, as `crucible replay samples` lists them.
std::vector<std::string> first_group_completions(const fs::path& run) {
  const auto out = run.parent_path() / (run.filename().string() + "-samples.jsonl");
  auto r = cli({"replay", "samples", run.string(), "--out", out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::map<std::int64_t, std::vector<std::string>> by_group;
  std::istringstream in(slurp(out));
  std::string line;
  while (std::getline(in, line)) {
    auto v = crucible::parse_json(line);
    REQUIRE_MESSAGE(v.ok(), line);
    by_group[v->find("group_id")->as_int()].push_back(v->find("completion")->as_string());
  }
  REQUIRE_FALSE(by_group.empty());
  auto first = by_group.begin()->second;
  std::sort(first.begin(), first.end());
  return first;
}

TEST_CASE("the real-size path at tiny shapes (LoRA, activation checkpointing, bf16, the in-memory handoff): exact pause and resume, the disk handoff's samples") {
  temp_dir tmp;
  const std::string sft = "  sft: {steps: 4, batch: 2}\n";
  auto whole_cfg = write_config(tmp.path(), real_size_path(without_warm_start(test_config(tmp.path(), "whole", sft)), "memory"));
  run_whole_and_split(whole_cfg);
  auto resumed = cli({"resume", (tmp.path() / "split").string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);
  const auto a = final_weights(tmp.path() / "whole");
  REQUIRE(!a.empty());
  CHECK(a == final_weights(tmp.path() / "split"));
  // The checkpoint records say what they wrote and how long it took; the resume, what it read.
  bool checkpoint_seen = false;
  for (const auto& r : records(tmp.path() / "split"))
    if (event_of(r) == "checkpoint") {
      checkpoint_seen = true;
      CHECK(r.find("bytes")->as_int() > 0);
      CHECK(r.find("seconds")->as_double() > 0);
    }
  CHECK(checkpoint_seen);
  CHECK(slurp(tmp.path() / "split" / "events.log").find("learner restored from") != std::string::npos);

  // After SFT the engine samples the first RL group with the weights the learner handed over:
  // the same completions whether they went through memory or through RUN/policy/vN.
  const std::string rl = "  sft: {steps: 2, batch: 2}\n  rl: {steps: 1, groups: 1}\n";
  std::vector<std::vector<std::string>> firsts;
  for (const std::string handoff : {"memory", "disk"}) {
    auto cfg = write_config(tmp.path(), real_size_path(without_warm_start(test_config(tmp.path(), handoff, rl)), handoff));
    auto run = cli({"train", cfg.string()});
    INFO(run.err);
    REQUIRE(run.exit_code == 0);
    CHECK(fs::exists(tmp.path() / handoff / "policy") == (handoff == "disk"));
    firsts.push_back(first_group_completions(tmp.path() / handoff));
  }
  CHECK(firsts[0] == firsts[1]);
}

// learner.devices: `ranks` learner ranks as threads of the run on the CPU (inproc), with ZeRO-1 if
// asked, and AdamW's epsilon raised so that the order in which the ranks' gradients are summed
// changes the updates by rounding only (as in test_data_parallel.cpp).
std::string with_ranks(std::string t, int ranks, bool zero1 = false) {
  const std::string learner = "learner:\n";
  std::string devices = "  devices: [cpu";
  for (int r = 1; r < ranks; ++r)
    devices += ", cpu";
  devices += "]\n";
  t.insert(t.find(learner) + learner.size(), devices + "  eps: 1.0e-6\n" + (zero1 ? "  zero1: true\n" : ""));
  return t;
}

// The largest difference between two runs' final weights (every tensor of one is in the other).
double max_weight_diff(const fs::path& a, const fs::path& b) {
  return crucible::testing::max_float_diff(final_weights(a), final_weights(b));
}

TEST_CASE("two learner ranks on the CPU (learner.devices [cpu, cpu]) update as one learner, and a run with them and two engines goes through SFT and contrastive RL") {
  temp_dir tmp;
  // SFT alone is deterministic: each rank takes one example of two, and their summed gradient is
  // the whole batch's, so the weights are one learner's up to the order of the sums.
  const std::string sft = "  sft: {steps: 2, batch: 2}\n";
  auto one_cfg = write_config(tmp.path(), with_ranks(without_warm_start(test_config(tmp.path(), "one", sft)), 1));
  auto one = cli({"train", one_cfg.string()});
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  auto two_cfg = write_config(tmp.path(), with_ranks(without_warm_start(test_config(tmp.path(), "two", sft)), 2));
  auto two = cli({"train", two_cfg.string()});
  INFO(two.err);
  REQUIRE(two.exit_code == 0);
  CHECK(two.out.find("finished at step 2") != std::string::npos);
  CHECK(slurp(tmp.path() / "two" / "events.log").find("learner: 2 data-parallel ranks (inproc) on cpu, cpu")
        != std::string::npos);
  const double diff = max_weight_diff(tmp.path() / "one", tmp.path() / "two");
  MESSAGE("max |weight difference|, two ranks against one: ", diff);
  CHECK(diff <= 1e-5);
  std::vector<double> losses[2];
  for (int k = 0; k < 2; ++k)
    for (const auto& r : records(tmp.path() / (k == 0 ? "one" : "two")))
      if (event_of(r) == "train_step")
        losses[k].push_back(r.find("loss")->as_double());
  REQUIRE(losses[0].size() == 2);
  REQUIRE(losses[1].size() == 2);
  for (std::size_t i = 0; i < 2; ++i)
    CHECK(losses[1][i] == doctest::Approx(losses[0][i]).epsilon(1e-4));

  // The whole loop with two ranks and two engines (engine.devices [cpu, cpu], a rollout actor
  // each): warm start, SFT, RL steps of two groups with real verdicts. Synchronous: rank 0 hands
  // both engines each version before the next step samples, so every RL step trains on samples
  // of the learner's version (staleness 0); an engine left without a version refuses it and
  // samples at its old one.
  auto loop_text = with_ranks(test_config(tmp.path(), "loop2", "  sft: {steps: 1, batch: 2}\n  rl: {steps: 2, groups: 2}\n"), 2);
  loop_text.insert(loop_text.find("rollout:\n") + 9, "  actors: 2\n");
  loop_text.insert(loop_text.find("run:\n") + 5, "  mode: sync\n");
  loop_text += "engine:\n  devices: [cpu, cpu]\n";
  auto loop_cfg = write_config(tmp.path(), loop_text);
  auto loop = cli({"train", loop_cfg.string()});
  INFO(loop.err);
  REQUIRE(loop.exit_code == 0);
  CHECK(loop.out.find("finished at step 3") != std::string::npos);
  const auto events = slurp(tmp.path() / "loop2" / "events.log");
  std::size_t engines = 0;
  for (auto at = events.find("engine on cpu: "); at != std::string::npos; at = events.find("engine on cpu: ", at + 1))
    ++engines;
  CHECK(engines == 2);
  CHECK((loop.out + loop.err).find("refused weights") == std::string::npos);
  std::vector<std::string> stages;
  for (const auto& r : records(tmp.path() / "loop2"))
    if (event_of(r) == "train_step") {
      stages.push_back(r.find("stage")->as_string());
      if (stages.back() == "rl")
        CHECK(r.find("staleness_max")->as_int() == 0);
      CHECK(std::isfinite(r.find("loss")->as_double()));
      CHECK(std::isfinite(r.find("grad_norm")->as_double()));
    }
  CHECK(stages == std::vector<std::string>{"sft", "rl", "rl"});
  CHECK(train_steps(tmp.path() / "loop2") == std::vector<std::int64_t>{1, 2, 3});
}

TEST_CASE("two learner ranks with ZeRO-1: pause and resume give the weights of an uninterrupted run") {
  temp_dir tmp;
  const std::string stages = "  sft: {steps: 4, batch: 2}\n";
  auto whole_cfg = write_config(tmp.path(), with_ranks(without_warm_start(test_config(tmp.path(), "whole", stages)), 2, true));
  run_whole_and_split(whole_cfg);
  const auto run = tmp.path() / "split";
  // Each rank wrote its optimiser shard into the checkpoint.
  const auto learner = run / "checkpoints" / "step-2" / "learner";
  CHECK(fs::exists(learner / "optimizer.zero1-0.safetensors"));
  CHECK(fs::exists(learner / "optimizer.zero1-1.safetensors"));
  auto resumed = cli({"resume", run.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);
  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3, 4});
  CHECK(slurp(run / "events.log").find("on 2 ranks") != std::string::npos);
  const auto a = final_weights(tmp.path() / "whole");
  REQUIRE(!a.empty());
  CHECK(a == final_weights(run));
}

TEST_CASE("learner.devices that cannot be placed are refused naming the key, and nothing is run") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "bad", "  sft: {steps: 1, batch: 2}\n"));
  const std::vector<std::pair<std::string, std::string>> cases = {
    {"learner.devices=[cpu, cuda:0]", "learner.devices: mixes cpu and cuda devices"},
    {"learner.devices=[cuda:0, cuda:0]", "learner.devices: names cuda:0 twice"},
    {"learner.devices=[cuda:0]", "learner.devices: the first entry (cuda:0) must be model.device (cpu)"},
    {"learner.devices=[cpu, cpu, cpu]", "stages.sft.batch: must be at least the number of learner ranks (3"},
  };
  for (const auto& [set, message] : cases) {
    INFO(set);
    auto r = cli({"train", cfg.string(), "--set", set});
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.err.find(message) != std::string::npos, r.err);
    CHECK_FALSE(fs::exists(tmp.path() / "bad"));
  }
}

TEST_CASE("a run paused during contrastive RL resumes sampling with the restored policy") {
  temp_dir tmp;
  // Synchronous steps keep every group they sample, so the versions the samples carry show which
  // policy the engine served (asynchronous ones would drop mislabelled samples as stale).
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "rlpause", "  sft: {steps: 1, batch: 2}\n  rl: {steps: 3, groups: 1}\n"));
  const auto run = tmp.path() / "rlpause";
  auto first = cli({"train", cfg.string(), "--set", "run.mode=sync", "--set", "learner.reset_moments=true",
                    "--pause-after", "2"});
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(first.out.find("paused at step 2") != std::string::npos);
  auto resumed = cli({"resume", run.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);
  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3, 4});
  // After the resume every sample came from the restored policy (version 2) or a later one.
  bool after = false;
  int sampled_after = 0;
  for (const auto& x : records(run)) {
    if (event_of(x) == "run_resumed")
      after = true;
    if (after && event_of(x) == "verdict" && x.find("stage")->as_string() == "rl") {
      CHECK(x.find("policy_version")->as_int() >= 2);
      ++sampled_after;
    }
  }
  CHECK(sampled_after >= 4);
  // RL began with fresh optimiser moments after SFT's one update; the resume (mid-RL) kept them.
  auto manifest = crucible::parse_json(slurp(run / "checkpoints" / "step-2" / "learner" / "manifest.json"));
  REQUIRE(manifest.ok());
  CHECK(manifest->find("moments_since")->as_int() == 1);
  auto last = crucible::parse_json(slurp(run / "checkpoints" / "step-4" / "learner" / "manifest.json"));
  REQUIRE(last.ok());
  CHECK(last->find("moments_since")->as_int() == 1);
}

TEST_CASE("the task samplers of a run paused during contrastive RL go on where they stopped") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "whole", "  sft: {steps: 0}\n  rl: {steps: 4, groups: 2}\n")));
  auto whole = cli(with_sets({"train", cfg.string()}));
  INFO(whole.err);
  REQUIRE(whole.exit_code == 0);
  auto first = cli(with_sets({"train", cfg.string(), "--set", "run.name=split", "--pause-after", "2"}));
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  const auto split = tmp.path() / "split";
  // The pause's checkpoint holds what the samplers saw: every verdict before the pause.
  const auto before = verdicts_per_task(split, "rl", "run_paused");
  CHECK(before.size() >= 1);
  CHECK(sampler_attempts(latest_dir(split)) == before);
  auto resumed = cli({"resume", split.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);
  CHECK(resumed.err.find("start fresh") == std::string::npos);
  CHECK(train_steps(split) == std::vector<std::int64_t>{1, 2, 3, 4});
  // After the resume the samplers went on counting from what they had seen...
  CHECK(sampler_attempts(latest_dir(split)) == verdicts_per_task(split, "rl"));
  // ... and drew what the uninterrupted run drew: the same tasks at every step, and in the end
  // the same records and generators. (Draws of `improvement` depend on speedups, which vary
  // between runs; this tiny model's 16 tokens never hold a correct kernel, so none is ok.)
  for (const auto& x : records(split))
    if (event_of(x) == "verdict")
      REQUIRE(x.find("status")->as_string() != "ok");
  CHECK(group_tasks(split, "rl") == group_tasks(tmp.path() / "whole", "rl"));
  CHECK(group_tasks(split, "rl").size() == 4);
  CHECK(slurp(latest_dir(split) / "samplers.json") == slurp(latest_dir(tmp.path() / "whole") / "samplers.json"));
}

TEST_CASE("a resume whose task pool no longer fits the saved samplers is refused, and one without them starts them fresh") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "pool", "  sft: {steps: 0}\n  rl: {steps: 2, groups: 2}\n")));
  auto first = cli(with_sets({"train", cfg.string(), "--pause-after", "1"}));
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  const auto run = tmp.path() / "pool";
  const auto samplers = latest_dir(run) / "samplers.json";
  REQUIRE(fs::exists(samplers));
  const auto config_before = slurp(run / "config.yaml");
  auto refused = cli({"resume", run.string(), "--set", "tasks.include=[01_relu_scale,02_silu_bias_residual]"});
  CHECK(refused.exit_code == 2);
  INFO(refused.err);
  CHECK(refused.err.find(samplers.string() + ": the task sampler of rollout place 0 was saved over 3 tasks") != std::string::npos);
  CHECK(refused.err.find("no longer in the pool: 03_softmax_rows") != std::string::npos);
  CHECK(refused.err.find("delete " + samplers.string()) != std::string::npos);
  // Nothing changed: the run's configuration keeps its tasks, the run stays paused.
  CHECK(slurp(run / "config.yaml") == config_before);
  CHECK(cli({"status", run.string(), "--json"}).out.find("\"state\":\"paused\"") != std::string::npos);
  // Without samplers.json (as in a checkpoint of an older crucible) the run resumes with fresh
  // samplers over the new pool, and says so.
  fs::remove(samplers);
  auto fresh = cli({"resume", run.string(), "--set", "tasks.include=[01_relu_scale,02_silu_bias_residual]"});
  INFO(fresh.err);
  REQUIRE(fresh.exit_code == 0);
  CHECK(fresh.err.find("has no samplers.json") != std::string::npos);
  CHECK(fresh.err.find("the task samplers start fresh") != std::string::npos);
  CHECK(fresh.out.find("finished at step 2") != std::string::npos);
  // The samplers of the new pool: two tasks each.
  auto doc = crucible::parse_json(slurp(latest_dir(run) / "samplers.json"));
  REQUIRE(doc.ok());
  REQUIRE_FALSE(doc->find("samplers")->as_array().empty());
  for (const auto& x : doc->find("samplers")->as_array()) {
    const auto& state = x.find("state")->as_string();
    CHECK(state.rfind("crucible-task-sampler 1\n2\n", 0) == 0);
    CHECK(state.find("03_softmax_rows") == std::string::npos);
  }
}

TEST_CASE("a task file changed on disk after a pause: the resumed run goes on with the source it kept and names the file") {
  temp_dir tmp;
  // The run's own copy of the CPU suite, so that a task file can change.
  const auto suite = tmp.path() / "suite";
  fs::copy(source_dir / "env/tasks/cpu", suite, fs::copy_options::recursive);
  std::string text = without_warm_start(test_config(tmp.path(), "kept", "  sft: {steps: 0}\n  rl: {steps: 2, groups: 2}\n"));
  const auto from = (source_dir / "env/tasks/cpu").string();
  text.replace(text.find("suite: " + from), 7 + from.size(), "suite: " + suite.string());
  auto cfg = write_config(tmp.path(), text);
  auto first = cli(with_sets({"train", cfg.string(), "--pause-after", "1"}));
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  const auto run = tmp.path() / "kept";
  const auto task_file = suite / "02_silu_bias_residual.py";
  const auto original = slurp(task_file);
  const auto kept = run / "tasks" / (crucible::sha256_hex(original) + ".py");
  REQUIRE(fs::exists(run / "tasks" / "tasks.json"));
  REQUIRE(fs::exists(kept));
  CHECK(slurp(kept) == original);
  // What a candidate that rewrote the task file would have left: the reference runs 20 times.
  std::ofstream(task_file, std::ios::app) << "\n_forward = Model.forward\nModel.forward = lambda self, *a: [_forward(self, *a) for _ in range(20)][-1]\n";
  auto resumed = cli({"resume", run.string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.err.find("task file " + task_file.string() + " changed since the run first used it") != std::string::npos);
  CHECK(slurp(kept) == original);
}

TEST_CASE("a run that takes evaluator nodes says where they join while it runs, and a node joins there") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), without_warm_start(test_config(tmp.path(), "nodes", "  sft: {steps: 1000, batch: 2}\n")));
  const auto run = tmp.path() / "nodes";
  running_process p({CRUCIBLE_CLI, "train", cfg.string(), "--set", "membership.listen=127.0.0.1:0"});
  // status.json is written when the run starts, with the bound port.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  std::string out;
  while ((!fs::exists(run / "status.json") || slurp(run / "status.json").find("\"join\"") == std::string::npos)
         && std::chrono::steady_clock::now() < deadline)
    p.read_some(100, out);
  auto st = cli({"status", run.string(), "--json"});
  REQUIRE(st.exit_code == 0);
  auto status = crucible::parse_json(st.out);
  REQUIRE(status.ok());
  CHECK(status->find("state")->as_string() == "running");
  const auto* join = status->find("join");
  REQUIRE(join != nullptr);
  const auto endpoint = join->as_string();
  CHECK(endpoint.rfind("127.0.0.1:", 0) == 0);
  CHECK(endpoint != "127.0.0.1:0");
  CHECK(slurp(run / "events.log").find("evaluator nodes join at " + endpoint) != std::string::npos);
  CHECK(cli({"status", run.string()}).out.find("nodes join at  " + endpoint) != std::string::npos);
  {
    // A node joins there with the run's token.
    running_process node({CRUCIBLE_CLI, "evaluator", "--join", endpoint, "--token-file", (run / "membership.token").string(),
                          "--devices", "cpu", "--no-cache", "--set", "evaluator.warm_workers=1"});
    std::string said;
    CHECK_MESSAGE(node.read_until("joined " + endpoint, 180'000, said), said);
    // Paused, the run takes no node: status.json no longer names the port.
    auto pause = cli({"pause", run.string(), "--timeout", "300"});
    INFO(pause.out << pause.err);
    CHECK(pause.exit_code == 0);
    auto r = node.wait();
    INFO("node: " << said << r.out << r.err);
    CHECK(r.exit_code == 0); // the coordinator went away
  }
  auto done = p.wait();
  // When this fails, the run's own account: its output and its event log.
  INFO("run: " << out << done.out << done.err << "\nevents.log:\n" << slurp(run / "events.log"));
  CHECK(done.exit_code == 0);
  CHECK(slurp(run / "status.json").find("join") == std::string::npos);
  auto paused = cli({"status", run.string(), "--json"});
  CHECK(paused.out.find("\"state\":\"paused\"") != std::string::npos);
  CHECK(paused.out.find("join") == std::string::npos);
}

TEST_CASE("with two turns, SFT teaches second turns too: the slower seed, the feedback on its verdict, then the faster") {
  temp_dir tmp;
  // Two correct seed variants of 13_sort_range of clearly different speed (about 10x and 50x, so
  // that a loaded machine still measures them apart: a variant not clearly faster is reported at
  // 1x); the warm start measures both, each prompt shows both (exemplar.n 2), and every second
  // example of a step is the second turn of an episode.
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "turnsft", "  sft: {steps: 2, batch: 4}\n"));
  auto out = cli({"train", cfg.string(), "--set", "rollout.turns=2", "--set", "exemplar.n=2", "--set",
                  "tasks.include=[13_sort_range]", "--set", "tasks.seed_exclude=[cpp_*,fast_aminmax.py,fast_max_min.py]",
                  "--set", "log.file_level=debug"});
  INFO(out.err);
  REQUIRE(out.exit_code == 0);
  const auto log = slurp(tmp.path() / "turnsft" / "events.log");
  INFO(log);
  CHECK(log.find("sft step 1: 2 of 4 examples are the second turn of an episode") != std::string::npos);
  CHECK(log.find("sft step 2: 2 of 4 examples are the second turn of an episode") != std::string::npos);
}

TEST_CASE("bad training input is refused with the key at fault and nothing is run") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "bad", "  sft: {steps: 1, batch: 2}\n"));
  auto r = cli({"train", cfg.string(), "--set", "tasks.include=[no_such_task]"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("tasks.include: 'no_such_task'") != std::string::npos);
  auto r2 = cli({"resume", (tmp.path() / "nothing").string()});
  CHECK(r2.exit_code == 2);
  auto r3 = cli({"pause", (tmp.path() / "nothing").string()});
  CHECK(r3.exit_code == 2);
}

TEST_CASE("a task whose reference cannot run stops the run before its first step, by name and line, or with tasks.skip_broken is left out and listed") {
  temp_dir tmp;
  const auto suite = tmp.path() / "suite";
  fs::create_directories(suite);
  fs::copy_file(source_dir / "env/tasks/cpu/02_silu_bias_residual.py", suite / "02_silu_bias_residual.py");
  // A task file that looks like a task (class Model, get_inputs, get_init_inputs) and does not parse.
  std::ofstream(suite / "03_broken.py") << "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                                           "    def forward(self, x):\n        return torch.relu(x\n\n\n"
                                           "def get_inputs():\n    return [torch.randn(8)]\n\n\n"
                                           "def get_init_inputs():\n    return []\n";
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "broken", "  sft: {steps: 1, batch: 2}\n"));
  auto r = cli({"train", cfg.string(), "--set", "tasks.suite=" + suite.string(), "--set",
                "tasks.include=[02_silu_bias_residual,03_broken]"});
  INFO(r.err);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("1 of 2 tasks cannot run their reference") != std::string::npos);
  CHECK(r.err.find("03_broken (" + (suite / "03_broken.py").string() + ")") != std::string::npos);
  CHECK(r.err.find("line 7") != std::string::npos);
  CHECK(train_steps(tmp.path() / "broken").empty());
  // With the check off the run starts (and the broken task's samples would score runtime_error).
  auto off = cli({"train", cfg.string(), "--set", "tasks.suite=" + suite.string(), "--set",
                  "tasks.include=[02_silu_bias_residual,03_broken]", "--set", "tasks.check_references=false",
                  "--set", "run.name=unchecked", "--set", "tasks.warm_start=false", "--set",
                  "tasks.seeds=" + (source_dir / "env/tasks/cpu/variants").string()});
  INFO(off.err);
  CHECK(off.exit_code == 0);
  CHECK(train_steps(tmp.path() / "unchecked") == std::vector<std::int64_t>{1});
  // tasks.skip_broken: the run leaves the broken task out, names it in the log and in status, and
  // samples only the other (one SFT and two contrastive RL steps).
  auto skip = cli({"train", cfg.string(), "--set", "tasks.suite=" + suite.string(), "--set",
                   "tasks.include=[02_silu_bias_residual,03_broken]", "--set", "tasks.skip_broken=true", "--set",
                   "run.name=skipping", "--set", "tasks.seeds=" + (source_dir / "env/tasks/cpu/variants").string(),
                   "--set", "stages.rl.steps=2", "--set", "stages.rl.groups=1"});
  const auto run = tmp.path() / "skipping";
  INFO(skip.err << "\nevents.log:\n" << slurp(run / "events.log"));
  REQUIRE(skip.exit_code == 0);
  CHECK(train_steps(run) == std::vector<std::int64_t>{1, 2, 3});
  const auto events = slurp(run / "events.log");
  CHECK(events.find("skipping 1 of 2 tasks whose reference cannot run") != std::string::npos);
  CHECK(events.find("03_broken (" + (suite / "03_broken.py").string() + ")") != std::string::npos);
  auto st = crucible::parse_json(cli({"status", run.string(), "--json"}).out);
  REQUIRE(st.ok());
  const auto* listed = st->find("skipped_tasks");
  REQUIRE(listed != nullptr);
  REQUIRE(listed->is_array());
  REQUIRE(listed->as_array().size() == 1);
  CHECK(listed->as_array()[0].as_string() == "03_broken");
  CHECK(cli({"status", run.string()}).out.find("skipped tasks  1") != std::string::npos);
  int sampled = 0;
  for (const auto& x : records(run))
    if (event_of(x) == "verdict") {
      CHECK(x.find("task")->as_string() == "02_silu_bias_residual");
      ++sampled;
    }
  CHECK(sampled > 0);
}

TEST_CASE("a wrong task suite or model directory is refused before the run directory is made") {
  temp_dir tmp;
  auto cfg = write_config(tmp.path(), test_config(tmp.path(), "r", "  sft: {steps: 1, batch: 2}\n"));
  const auto run = tmp.path() / "r";
  auto train = [&](const std::string& set) {
    return cli({"train", cfg.string(), "--set", "tasks.include=[]", "--set", set});
  };
  // A suite without a task.
  fs::create_directories(tmp.path() / "empty_suite" / "level1");
  auto r = train("tasks.suite=" + (tmp.path() / "empty_suite").string());
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("tasks.suite: " + (tmp.path() / "empty_suite").string() + " holds no KernelBench-format task")
        != std::string::npos);
  CHECK_FALSE(fs::exists(run));
  // A model directory without config.json, then one whose config.json asks for what crucible
  // does not implement, then one without a tokenizer, then one without weights.
  const auto model = tmp.path() / "model";
  fs::create_directories(model);
  r = train("model.dir=" + model.string());
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("model.dir: " + model.string() + " has no config.json") != std::string::npos);
  CHECK_FALSE(fs::exists(run));
  const std::string config_json =
    "{\"model_type\":\"qwen2\",\"vocab_size\":300,\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
    "\"max_position_embeddings\":512,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,"
    "\"tie_word_embeddings\":true,\"hidden_act\":\"silu\",";
  std::ofstream(model / "config.json") << config_json << "\"use_sliding_window\":true,\"sliding_window\":256}";
  r = train("model.dir=" + model.string());
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("model.dir: " + (model / "config.json").string() + ": use_sliding_window") != std::string::npos);
  CHECK_FALSE(fs::exists(run));
  std::ofstream(model / "config.json") << config_json << "\"use_sliding_window\":false}";
  r = train("model.dir=" + model.string());
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("model.dir: " + (model / "tokenizer.json").string()) != std::string::npos);
  CHECK_FALSE(fs::exists(run));
  auto tok = cli({"tokenizer", "train", "--corpus", (source_dir / "env/tasks/cpu/01_relu_scale.py").string(), "--vocab",
                  "300", "--out", model.string()});
  REQUIRE(tok.exit_code == 0);
  r = train("model.dir=" + model.string());
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("model.dir: " + model.string() + ": holds neither model.safetensors") != std::string::npos);
  CHECK_FALSE(fs::exists(run));
}
