// The evaluator on a CUDA device: the comparison kernel against the host comparison on the same
// values, and whole verdicts with outputs kept on the device (CUDA IPC from the worker) and
// copied to the host, which must agree.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "core/log.hpp"
#include "env/compare.hpp"
#include "env/device_bytes.hpp"
#include "env/evaluator.hpp"
#include "env/task.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::env;

namespace {

const fs::path source_dir{CRUCIBLE_SOURCE_DIR};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Device bytes backed by a CUDA tensor of this process.
class tensor_bytes final : public device_bytes {
public:
  explicit tensor_bytes(torch::Tensor t) : t_{t.contiguous()} {}
  const void* data() const noexcept override { return t_.data_ptr(); }
  std::uint64_t size() const noexcept override { return static_cast<std::uint64_t>(t_.nbytes()); }
  int device() const noexcept override { return t_.device().index(); }

private:
  torch::Tensor t_;
};

tensor_blob host_blob(const torch::Tensor& t, dtype type) {
  auto c = t.contiguous().cpu();
  tensor_blob b;
  b.type = type;
  b.shape.assign(c.sizes().begin(), c.sizes().end());
  auto p = static_cast<const std::byte*>(c.data_ptr());
  b.bytes.assign(p, p + c.nbytes());
  return b;
}

tensor_blob device_blob(const torch::Tensor& t, dtype type) {
  tensor_blob b;
  b.type = type;
  b.shape.assign(t.sizes().begin(), t.sizes().end());
  b.device = std::make_shared<tensor_bytes>(t);
  return b;
}

// Compares want/got on the host and on the device; both must say the same.
void same_verdict(const torch::Tensor& want, const torch::Tensor& got, dtype type) {
  tolerances tol;
  auto host = compare_outputs({host_blob(want, type)}, {host_blob(got, type)}, tol);
  auto dev = compare_outputs({device_blob(want.cuda(), type)}, {device_blob(got.cuda(), type)}, tol);
  auto mixed = compare_outputs({device_blob(want.cuda(), type)}, {host_blob(got, type)}, tol);
  INFO("host: " << host.message << " | device: " << dev.message);
  CHECK(host.ok == dev.ok);
  CHECK(host.mismatches == dev.mismatches);
  CHECK(host.max_abs_diff == dev.max_abs_diff);
  CHECK(host.message == dev.message);
  CHECK(mixed.message == host.message);
}

} // namespace

TEST_CASE("the device comparison kernel agrees with the host comparison, element for element") {
  REQUIRE(device_bytes_available());
  torch::manual_seed(7);
  const std::int64_t n = 1 << 20;
  auto want = torch::randn({n}, torch::kFloat32);
  SUBCASE("equal") { same_verdict(want, want.clone(), dtype::f32); }
  SUBCASE("within tolerance") { same_verdict(want, want + 5e-5, dtype::f32); }
  SUBCASE("mismatches, NaN and infinities") {
    auto got = want.clone();
    got.index_put_({torch::arange(1000, n, 7919)}, 3.0);
    want.index_put_({17}, std::numeric_limits<float>::quiet_NaN());
    got.index_put_({17}, std::numeric_limits<float>::quiet_NaN());
    want.index_put_({23}, std::numeric_limits<float>::infinity());
    got.index_put_({23}, -std::numeric_limits<float>::infinity());
    got.index_put_({29}, std::numeric_limits<float>::quiet_NaN());
    same_verdict(want, got, dtype::f32);
  }
  SUBCASE("float16, bfloat16, float64, int32, bool") {
    auto noisy = want + 0.02 * torch::randn({n});
    same_verdict(want.to(torch::kHalf), noisy.to(torch::kHalf), dtype::f16);
    same_verdict(want.to(torch::kBFloat16), noisy.to(torch::kBFloat16), dtype::bf16);
    same_verdict(want.to(torch::kDouble), noisy.to(torch::kDouble), dtype::f64);
    same_verdict((want * 100).to(torch::kInt32), (noisy * 100).to(torch::kInt32), dtype::i32);
    same_verdict(want > 0, noisy > 0, dtype::boolean);
  }
}

TEST_CASE("a hostile device handle is refused with a message, and the process goes on") {
  REQUIRE(device_bytes_available());
  auto bad = map_exported(0, std::string(128, '0'), 0, 16, 4);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("does not open") != std::string::npos);
  auto short_handle = map_exported(0, "abcd", 0, 16, 4);
  REQUIRE_FALSE(short_handle.ok());
  // The device still works after the refusals.
  auto t = torch::ones({4}, torch::kCUDA);
  CHECK(t.sum().item<float>() == 4.0f);
}

TEST_CASE("CPU-suite tasks on CUDA: verdicts with outputs on the device match those with host bytes") {
  system_clock clk;
  logger log{clk, log_level::warn};
  auto root = source_dir / "env" / "tasks" / "cpu";
  for (bool on_device : {true, false}) {
    evaluator_options opt;
    opt.devices = {"cuda:0"};
    opt.outputs_on_device = on_device;
    opt.rounds = 10;
    opt.max_rounds = 10;
    opt.warmup_ms = 20;
    // (No REQUIRE_MESSAGE(x.ok(), x.error()...): with -s doctest renders the message on success too.)
    auto where = locate_harness(opt);
    if (!where)
      FAIL(where.error().message);
    auto ev = device_evaluator::create(opt, reward_options{}, *where, "cuda:0", log, nullptr);
    if (!ev)
      FAIL(ev.error().message);
    for (const char* stem : {"01_relu_scale", "04_layernorm_manual", "09_diag_matmul"}) {
      auto t = load_task(root / (std::string{stem} + ".py"));
      if (!t)
        FAIL(t.error().message);
      for (const auto& e : fs::directory_iterator(root / "variants" / stem)) {
        // cpp_* variants are CPU extensions: they take CPU tensors only.
        if (e.path().extension() != ".py" || e.path().filename().string().rfind("cpp_", 0) == 0)
          continue;
        auto v = (*ev)->evaluate(eval_request{*t, slurp(e.path()), 0, false});
        auto name = e.path().filename().string();
        INFO((on_device ? "device: " : "host: ") << stem << "/" << name << ": " << to_string(v.status) << " "
                                                 << v.message);
        MESSAGE((on_device ? "device: " : "host: ") << stem << "/" << name << ": " << to_string(v.status) << " "
                                                    << v.speedup << "x wall " << v.wall_s << " s");
        if (name.rfind("wrong_", 0) == 0) {
          CHECK(v.status == verdict_status::incorrect);
          CHECK(v.message.find("elements outside") != std::string::npos);
        } else {
          CHECK(v.status == verdict_status::ok);
        }
      }
    }
    auto recycled = load_task(root / "01_relu_scale.py");
    REQUIRE(recycled.ok());
    auto v = (*ev)->evaluate(eval_request{*recycled, slurp(source_dir / "tests" / "candidates" / "hack_recycled_memory.py"), 0, false});
    INFO("recycled memory: " << to_string(v.status) << " " << v.message);
    CHECK(v.status != verdict_status::ok);
  }
}
