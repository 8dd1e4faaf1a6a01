#include "policy_test_util.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "../../integration/process.hpp"
#include "core/sha256.hpp"
#include "policy/model/model.hpp"
#include "policy/model/safetensors.hpp"

namespace fs = std::filesystem;

namespace crucible::policy::testing {

namespace {

const fs::path script_path = fs::path{CRUCIBLE_SOURCE_DIR} / "tests/unit/policy/hf_reference.py";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

} // namespace

std::pair<int, std::string> run_reference_script(const std::vector<std::string>& args) {
  std::vector<std::string> argv{CRUCIBLE_PYTHON, script_path.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = crucible::testing::run_process(argv);
  return {r.exit_code, r.out + r.err};
}

const fs::path& hf_reference_dir() {
  static const fs::path dir = [] {
    const std::string key = sha256_hex(slurp(script_path)).substr(0, 16);
    const fs::path root = fs::path{CRUCIBLE_BINARY_DIR} / "tests" / "hf_reference";
    fs::create_directories(root);
    const fs::path done = root / (key + ".done");
    const fs::path out = root / key;
    // ctest runs test processes in parallel: one makes the models, the others wait on the lock.
    int fd = ::open((root / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    if (!fs::exists(done)) {
      fs::remove_all(out);
      auto [code, output] = run_reference_script({"make", out.string()});
      if (code != 0) {
        ::close(fd);
        FAIL("hf_reference.py make failed (" << code << "):\n" << output);
      }
      std::ofstream(done) << "ok\n";
    }
    ::close(fd);
    return out;
  }();
  return dir;
}

std::vector<std::string> hf_variants() {
  return {"llama_bias_linear", "llama_dynamic", "llama_llama3", "qwen2_tied", "qwen2_yarn"};
}

std::map<std::string, torch::Tensor> read_tensors(const fs::path& file) {
  auto f = safetensors_file::open(file);
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.error().message));
  std::map<std::string, torch::Tensor> out;
  for (const auto& t : f->tensors())
    out[t.name] = to_tensor(t);
  return out;
}

CausalLM scaled_random_model(const model_config& config, std::uint64_t seed, double scale) {
  CausalLM m(config);
  m->init_weights(seed);
  torch::NoGradGuard g;
  for (auto& p : m->parameters())
    if (p.dim() == 2)
      p.mul_(scale);
  m->eval();
  return m;
}

CausalLM small_qwen2_model(std::uint64_t seed, std::int64_t hidden, bool tied) {
  auto c = preset_config("tiny", model_family::qwen2, 300);
  REQUIRE(c.ok());
  c->hidden_size = hidden, c->num_heads = 4, c->num_kv_heads = 2, c->head_dim = hidden / 4, c->num_layers = 2;
  c->intermediate_size = 128;
  c->tie_word_embeddings = tied;
  return scaled_random_model(*c, seed, 1.0);
}

torch::Tensor teacher_forced_log_probs(CausalLMImpl& model, const std::vector<std::int32_t>& prompt,
                                       const std::vector<std::int32_t>& completion, double temperature) {
  std::vector<std::int64_t> seq(prompt.begin(), prompt.end());
  seq.insert(seq.end(), completion.begin(), completion.end());
  auto ids = torch::tensor(seq, torch::kLong).to(model.output_weight().device());
  const auto n = ids.size(0);
  token_batch b;
  b.input_ids = ids.narrow(0, 0, n - 1).unsqueeze(0);
  torch::NoGradGuard g;
  auto lp = model.token_log_probs(b, ids.narrow(0, 1, n - 1).unsqueeze(0), temperature)[0];
  return lp.narrow(0, static_cast<std::int64_t>(prompt.size()) - 1, static_cast<std::int64_t>(completion.size()));
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kCPU, torch::kFloat) - b.to(torch::kCPU, torch::kFloat)).abs().max().item<double>();
}

} // namespace crucible::policy::testing
