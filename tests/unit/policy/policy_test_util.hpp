// tests/unit/policy/policy_test_util.hpp: scratch directories, the transformers reference models
// (made once per build by hf_reference.py and shared by every test process) and tensor files.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "policy/model/model.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace crucible::policy::testing {

/// A fresh directory under the system temp dir, removed with the object.
using crucible::testing::temp_dir;

/// The directory of reference models made by `hf_reference.py make`: one subdirectory per
/// variant with an HF model and reference.safetensors. Made on first use (under a file lock, in
/// the build tree, keyed by the script's hash) and reused by later test processes.
const std::filesystem::path& hf_reference_dir();

/// The variant names hf_reference.py makes.
std::vector<std::string> hf_variants();

/// Every tensor of a .safetensors file (CPU copies); the test fails if it cannot be read.
std::map<std::string, torch::Tensor> read_tensors(const std::filesystem::path& file);

/// Runs `hf_reference.py ARGS...` with the project's Python; returns exit code and output.
std::pair<int, std::string> run_reference_script(const std::vector<std::string>& args);

/// A model of `config` with init_weights(seed), its matrices multiplied by `scale` (sharper than
/// the 0.02 init, so that differences show and greedy choices are not near-ties), in eval mode.
CausalLM scaled_random_model(const model_config& config, std::uint64_t seed, double scale);

/// The small Qwen2 model of the data-parallel, weight-sync and handoff tests: 300 tokens, hidden
/// `hidden` (64), 4 heads (2 KV), 2 layers, intermediate 128, scaled_random_model at scale 1.
CausalLM small_qwen2_model(std::uint64_t seed, std::int64_t hidden = 64, bool tied = false);

/// Teacher-forced log-probs of `completion` after `prompt` at `temperature`, on the model's
/// device: what the engine's behaviour log-probs must equal.
torch::Tensor teacher_forced_log_probs(CausalLMImpl& model, const std::vector<std::int32_t>& prompt,
                                       const std::vector<std::int32_t>& completion, double temperature);

/// max |a - b| as a double (inputs converted to float32).
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);

} // namespace crucible::policy::testing
