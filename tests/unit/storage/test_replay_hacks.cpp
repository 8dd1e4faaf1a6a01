// tests/unit/storage/test_replay_hacks.cpp: the hacking-case database (flagged variants by task and
// check) and token n-gram similarity: the tokeniser, shingles, Jaccard and the ranking.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "storage/code_similarity.hpp"
#include "storage/replay_store.hpp"
#include "tests/test_util/temp_dir.hpp"

using namespace crucible;
using namespace crucible::storage;
using crucible::testing::temp_dir;

namespace {

variant_record flagged(int i, const std::string& task, const std::string& status,
                       const std::string& checks, const std::string& code) {
  variant_record v;
  v.task_id = task;
  v.task_name = task;
  v.hardware = "h100";
  v.code = code;
  v.code_hash = "hash-" + std::to_string(i);
  v.status = status;
  v.correct = false;
  v.reward = -1.0;
  v.checks_failed = checks;
  v.time_ms = 1700000000000 + i;
  return v;
}

std::vector<std::int64_t> ids_of(const std::vector<hack_case>& cases) {
  std::vector<std::int64_t> out;
  for (const auto& c : cases) out.push_back(c.variant.id);
  return out;
}

// A KernelBench-style candidate that hides work on a side stream (a known hack).
const std::string side_stream_hack = R"PY(import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per element
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int n = x.numel();
  relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""
ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["relu"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = torch.cuda.Stream()

    def forward(self, x):
        with torch.cuda.stream(self.stream):
            return ext.relu(x)
)PY";

// The same code with other comments, blank lines and indentation of comments.
const std::string side_stream_reformatted = R"PY(import torch
import torch.nn as nn   # the usual
from torch.utils.cpp_extension import load_inline


cuda_src = """
#include <torch/extension.h>
/* elementwise
   relu */
__global__ void relu_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;   // branch-free enough
}
torch::Tensor relu(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int n = x.numel();
  relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""
ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["relu"])

class ModelNew(nn.Module):
    # a side stream
    def __init__(self):
        super().__init__()
        self.stream = torch.cuda.Stream()

    def forward(self, x):
        with torch.cuda.stream(self.stream):
            return ext.relu(x)
)PY";

// Unrelated code: a cached result keyed by pointer, in plain PyTorch.
const std::string caching_hack = R"PY(import torch
import torch.nn as nn

_cache = {}

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, a, b):
        key = (a.data_ptr(), b.data_ptr())
        if key not in _cache:
            _cache[key] = torch.softmax(a @ b, dim=self.dim)
        return _cache[key]
)PY";

} // namespace

TEST_CASE("code_tokens drops whitespace and comments and keeps code inside string literals") {
  auto toks = code_tokens("x = 1.5e3  # note\ny=x//2\ns = \"\"\"\n#include <a.h>\nint a; // c\n"
                          "/* b */ int b;\"\"\"\nt = 'it\\'s'  # done");
  std::vector<std::string> got(toks.begin(), toks.end());
  std::vector<std::string> want{"x", "=", "1.5e3", "y", "=", "x", "/", "/", "2",
                                "s", "=", "\"\"\"", "#", "include", "<", "a", ".", "h", ">",
                                "int", "a", ";", "int", "b", ";", "\"\"\"",
                                "t", "=", "'", "it", "\\'", "s", "'"};
  CHECK(got == want);
  // A C comment inside a string stops at the string's end instead of swallowing the file.
  toks = code_tokens("a = \"x // y\"\nb = 2");
  got.assign(toks.begin(), toks.end());
  CHECK(got == std::vector<std::string>{"a", "=", "\"", "x", "\"", "b", "=", "2"});
  CHECK(code_tokens("  # only a comment\n\t").empty());
}

TEST_CASE("shingles and Jaccard: identical up to comments is 1, disjoint is 0") {
  const auto a = shingle_set(side_stream_hack);
  const auto b = shingle_set(side_stream_reformatted);
  CHECK(a.size() > 100);
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(jaccard(a, b) == 1.0);
  CHECK(jaccard(shingle_set("a b c d"), shingle_set("e f g h")) == 0.0);
  // {abc, bcd} vs {abc, bce}: one shared of three.
  CHECK(jaccard(shingle_set("a b c d"), shingle_set("a b c e")) == doctest::Approx(1.0 / 3.0));
  CHECK(shingle_set("a b").size() == 1);  // fewer tokens than n: one shingle
  CHECK(shingle_set("").empty());
  CHECK(jaccard({}, {}) == 1.0);
  CHECK(jaccard(a, {}) == 0.0);
}

TEST_CASE("flagged variants are listed by task and by the check that caught them") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  std::vector<variant_record> rows{
    flagged(1, "relu", "rejected", R"(["static:threads"])", "a"),
    flagged(2, "relu", "incorrect", R"(["runtime:input_mutation","runtime:timer"])", "b"),
    flagged(3, "gemm", "rejected", R"(["runtime:timer"])", "c"),
    flagged(4, "gemm", "incorrect", "[]", "d"),            // wrong, but no check caught a hack
    flagged(5, "gemm", "rejected", "[]", "e"),             // rejected without a named check
    flagged(6, "relu", "compile_error", R"(["x"])", "f"),  // not a verdict of the checks
  };
  auto ok = flagged(7, "relu", "ok", "[]", "g");
  ok.correct = true;
  ok.speedup = 1.5;
  rows.push_back(ok);
  auto ids = store->record_batch(rows);
  REQUIRE(ids.ok());

  auto all = store->list_hacks();
  REQUIRE(all.ok());
  CHECK(ids_of(*all) == std::vector<std::int64_t>{1, 2, 3, 5});
  CHECK((*all)[1].checks == std::vector<std::string>{"runtime:input_mutation", "runtime:timer"});
  CHECK((*all)[3].checks.empty());
  CHECK((*all)[0].variant.code == "a");

  CHECK(ids_of(*store->list_hacks({"relu", ""})) == std::vector<std::int64_t>{1, 2});
  CHECK(ids_of(*store->list_hacks({"", "runtime:timer"})) == std::vector<std::int64_t>{2, 3});
  CHECK(ids_of(*store->list_hacks({"gemm", "runtime:timer"})) == std::vector<std::int64_t>{3});
  CHECK(store->list_hacks({"", "static:nothing"})->empty());

  SUBCASE("a better verdict for the same code moves the row out of (or into) the hacks") {
    auto fixed = rows[1];  // same hash as row 2, higher reward, now ok
    fixed.status = "ok";
    fixed.correct = true;
    fixed.speedup = 1.1;
    fixed.checks_failed = "[]";
    fixed.reward = 0.5;
    REQUIRE(*store->record(fixed) == 2);
    CHECK(ids_of(*store->list_hacks({"", "runtime:timer"})) == std::vector<std::int64_t>{3});
    CHECK(store->list_hacks({"", "runtime:input_mutation"})->empty());

    auto caught = rows[3];  // row 4, now caught by a check with a higher reward
    caught.status = "rejected";
    caught.checks_failed = R"(["runtime:no_kernel"])";
    caught.reward = 0.0;
    REQUIRE(*store->record(caught) == 4);
    CHECK(ids_of(*store->list_hacks({"", "runtime:no_kernel"})) == std::vector<std::int64_t>{4});

    auto worse = rows[2];  // a lower reward keeps the verdict, and the check rows stay
    worse.status = "ok";
    worse.checks_failed = "[]";
    worse.reward = -5.0;
    REQUIRE(*store->record(worse) == 3);
    CHECK(ids_of(*store->list_hacks({"", "runtime:timer"})) == std::vector<std::int64_t>{3});
  }
  SUBCASE("export and import rebuild the check index in another store") {
    REQUIRE(store->export_jsonl(tmp.path() / "r.jsonl").ok());
    auto other = replay_store::open(tmp.path() / "other.db");
    REQUIRE(other.ok());
    REQUIRE(other->import_jsonl(tmp.path() / "r.jsonl").ok());
    CHECK(ids_of(*other->list_hacks({"", "runtime:timer"})) == std::vector<std::int64_t>{2, 3});
  }
}

TEST_CASE("similar_hacks ranks near-copies first and unrelated code last") {
  temp_dir tmp;
  auto store = replay_store::open(tmp.path() / "replay.db");
  REQUIRE(store.ok());
  // A near copy: one launch configuration changed.
  std::string near = side_stream_hack;
  auto at = near.find("(n + 255) / 256, 256");
  REQUIRE(at != std::string::npos);
  near.replace(at, 20, "(n + 511) / 512, 512");
  // Half the code: only the CUDA source of the hack, in another module.
  std::string half = side_stream_hack.substr(0, side_stream_hack.find("ext = load_inline"));
  std::vector<variant_record> rows{
    flagged(1, "softmax", "rejected", R"(["runtime:timer"])", caching_hack),
    flagged(2, "relu", "rejected", R"(["runtime:threads"])", half),
    flagged(3, "relu", "rejected", R"(["runtime:threads"])", near),
    flagged(4, "relu", "rejected", R"(["static:threads"])", side_stream_hack),
  };
  REQUIRE(store->record_batch(rows).ok());

  auto ranked = store->similar_hacks(side_stream_reformatted, 10);
  REQUIRE(ranked.ok());
  REQUIRE(ranked->size() == 4);
  std::vector<std::int64_t> order;
  for (const auto& r : *ranked) order.push_back(r.hack.variant.id);
  CHECK(order == std::vector<std::int64_t>{4, 3, 2, 1});
  CHECK((*ranked)[0].similarity == 1.0);  // same tokens up to comments and whitespace
  CHECK((*ranked)[1].similarity > 0.8);
  CHECK((*ranked)[1].similarity < 1.0);
  CHECK((*ranked)[2].similarity < (*ranked)[1].similarity);
  CHECK((*ranked)[3].similarity < 0.15);
  CHECK((*ranked)[0].hack.checks == std::vector<std::string>{"static:threads"});

  auto top2 = store->similar_hacks(side_stream_reformatted, 2);
  REQUIRE(top2.ok());
  REQUIRE(top2->size() == 2);
  CHECK((*top2)[1].hack.variant.id == 3);

  auto by_check = store->similar_hacks(side_stream_hack, 10, {"", "runtime:threads"});
  REQUIRE(by_check.ok());
  REQUIRE(by_check->size() == 2);
  CHECK((*by_check)[0].hack.variant.id == 3);

  // The caching hack is found from a variant of itself.
  std::string renamed = caching_hack;
  renamed.replace(renamed.find("self.dim = dim"), 14, "self.d = dim");
  auto other = store->similar_hacks(renamed, 1);
  REQUIRE(other.ok());
  REQUIRE(other->size() == 1);
  CHECK(other->front().hack.variant.id == 1);
  CHECK(store->similar_hacks(renamed, 0)->empty());
}
