// tests/gpu/test_gpu_train_dp.cpp: `crucible train` with two learner ranks on two GPUs
// (learner.devices [cuda:0, cuda:1], NCCL) in a real process, a tiny fresh model and the CPU task
// suite evaluated on the CPU: SFT updates as one learner, and with ZeRO-1 a paused and resumed run
// ends with the weights of an uninterrupted one. Skipped (passes with a message) on fewer than 2 GPUs.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/json_parse.hpp"
#include "tests/integration/process.hpp"
#include "tests/test_util/safetensors_floats.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using crucible::testing::process_result;
using crucible::testing::run_process;
using crucible::testing::temp_dir;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

process_result cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args, source_dir.string());
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// SFT only, no warm start: a deterministic run of a tiny model whose learner ranks are `devices`.
fs::path write_config(const fs::path& dir, const std::string& name, const std::string& devices, bool zero1) {
  const auto p = dir / (name + ".yaml");
  std::ofstream(p) << "run:\n  name: " << name << "\n  dir: " << dir.string() << "\n  seed: 5\n  checkpoint_every: 2\n"
                   << "  publish: \"\"\n"
                   << "log:\n  level: warn\n"
                   << "evaluator:\n  devices: [cpu]\n  warm_workers: 1\n  rounds: 5\n  max_rounds: 10\n  warmup_ms: 10\n"
                   << "  cache: " << (dir / "verdicts.db").string() << "\n"
                   << "model:\n  init: tiny\n  tokenizer_vocab: 600\n  device: cuda:0\n"
                   << "tasks:\n  include: [02_silu_bias_residual]\n  suite: " << (source_dir / "env/tasks/cpu").string()
                   << "\n  warm_start: false\n"
                   << "prompt:\n  chat_template: none\n"
                   << "rollout:\n  group_size: 2\n  max_new_tokens: 16\n"
                   << "learner:\n  lr: 0.001\n  eps: 1.0e-6\n  micro_batch_tokens: 65536\n  devices: " << devices << "\n"
                   << "  zero1: " << (zero1 ? "true" : "false") << "\n"
                   << "stages:\n  sft: {steps: 4, batch: 2}\n";
  return p;
}

std::string final_weights(const fs::path& run) {
  auto latest = slurp(run / "checkpoints" / "latest");
  while (!latest.empty() && latest.back() == '\n')
    latest.pop_back();
  return slurp(run / "checkpoints" / latest / "learner" / "model" / "model.safetensors");
}

} // namespace

TEST_CASE("crucible train with learner ranks on two GPUs over NCCL: SFT as one learner, ZeRO-1 pause and resume exact") {
  if (gpus() < 2) {
    MESSAGE("fewer than 2 GPUs: nothing to test");
    return;
  }
  temp_dir tmp;
  auto one = cli({"train", write_config(tmp.path(), "one", "[cuda:0]", false).string()});
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  auto two = cli({"train", write_config(tmp.path(), "two", "[cuda:0, cuda:1]", false).string()});
  INFO(two.err);
  REQUIRE(two.exit_code == 0);
  CHECK(two.out.find("finished at step 4") != std::string::npos);
  CHECK(slurp(tmp.path() / "two" / "events.log").find("2 data-parallel ranks (nccl) on cuda:0, cuda:1") != std::string::npos);
  const double diff = crucible::testing::max_float_diff(final_weights(tmp.path() / "one"), final_weights(tmp.path() / "two"));
  MESSAGE("max |weight difference|, two GPUs against one: ", diff);
  CHECK(diff <= 1e-4);

  // ZeRO-1 over the two GPUs: a run paused after step 2 and resumed against an uninterrupted one.
  const auto zero_cfg = write_config(tmp.path(), "whole", "[cuda:0, cuda:1]", true);
  auto whole = cli({"train", zero_cfg.string()});
  INFO(whole.err);
  REQUIRE(whole.exit_code == 0);
  auto split = cli({"train", zero_cfg.string(), "--set", "run.name=split", "--pause-after", "2"});
  INFO(split.err);
  REQUIRE(split.exit_code == 0);
  CHECK(fs::exists(tmp.path() / "split" / "checkpoints" / "step-2" / "learner" / "optimizer.zero1-1.safetensors"));
  auto resumed = cli({"resume", (tmp.path() / "split").string()});
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("finished at step 4") != std::string::npos);
  const double resume_diff = crucible::testing::max_float_diff(final_weights(tmp.path() / "whole"), final_weights(tmp.path() / "split"));
  MESSAGE("max |weight difference|, resumed against uninterrupted (ZeRO-1, two GPUs): ", resume_diff);
  CHECK(resume_diff <= 1e-6);
}
