// safetensors files and weight directories: round trips, sharding, and every kind of damage
// refused with a message that names what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "policy/model/safetensors.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using namespace crucible::policy;

namespace {

using crucible::testing::temp_dir;

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span{v});
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A file with a hand-written header and `data_bytes` zero bytes after it.
std::string raw_file(const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data_bytes, '\0');
  return out;
}

std::string open_error(const fs::path& p) {
  auto f = safetensors_file::open(p);
  REQUIRE_FALSE(f.ok());
  return f.error().message;
}

std::string checkpoint_error(const fs::path& dir) {
  auto c = safetensors_checkpoint::open(dir);
  REQUIRE_FALSE(c.ok());
  return c.error().message;
}

} // namespace

TEST_CASE("safetensors: f32, bf16 and f16 tensors round-trip with metadata") {
  temp_dir dir;
  std::vector<float> a{1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  std::vector<std::uint16_t> b{0x3f80, 0x4000, 0xc040}; // bf16 1, 2, -3
  std::vector<std::uint16_t> h{0x3c00};                 // f16 1
  std::vector<tensor_view> ts{
    {"layer.a", st_dtype::f32, {2, 3}, bytes_of(a)},
    {"layer.b", st_dtype::bf16, {3}, bytes_of(b)},
    {"scalar", st_dtype::f16, {}, bytes_of(h)},
    {"empty", st_dtype::f32, {0, 4}, {}},
  };
  auto path = dir.path() / "x.safetensors";
  REQUIRE(write_safetensors(path, ts, {{"format", "pt"}}).ok());
  auto f = safetensors_file::open(path);
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  CHECK(f->tensors().size() == 4);
  CHECK(f->metadata().at("format") == "pt");
  auto* ta = f->find("layer.a");
  REQUIRE(ta != nullptr);
  CHECK(ta->dtype == st_dtype::f32);
  CHECK(ta->shape == std::vector<std::int64_t>{2, 3});
  CHECK(std::memcmp(ta->bytes.data(), a.data(), 24) == 0);
  // Data starts 8-byte aligned so it can be viewed in place.
  CHECK(reinterpret_cast<std::uintptr_t>(ta->bytes.data()) % 8 == 0);
  CHECK(f->find("layer.b")->dtype == st_dtype::bf16);
  CHECK(f->find("scalar")->shape.empty());
  CHECK(f->find("scalar")->numel() == 1);
  CHECK(f->find("empty")->numel() == 0);
  CHECK(f->find("nope") == nullptr);
  // No temporary files are left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path()))
    ++files;
  CHECK(files == 1);
}

TEST_CASE("safetensors: the writer refuses inconsistent tensors") {
  temp_dir dir;
  std::vector<float> a{1.f, 2.f};
  std::vector<tensor_view> wrong_size{{"a", st_dtype::f32, {3}, bytes_of(a)}};
  auto r = write_safetensors(dir.path() / "x.safetensors", wrong_size);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("tensor a") != std::string::npos);
  std::vector<tensor_view> twice{{"a", st_dtype::f32, {2}, bytes_of(a)}, {"a", st_dtype::f32, {2}, bytes_of(a)}};
  r = write_safetensors(dir.path() / "x.safetensors", twice);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("twice") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() / "x.safetensors"));
}

TEST_CASE("safetensors: truncated and damaged files are refused whole, naming the fault") {
  temp_dir dir;
  std::vector<float> a(16, 1.f), b(8, 2.f);
  std::vector<tensor_view> ts{{"w.a", st_dtype::f32, {4, 4}, bytes_of(a)}, {"w.b", st_dtype::f32, {8}, bytes_of(b)}};
  auto good = dir.path() / "good.safetensors";
  REQUIRE(write_safetensors(good, ts).ok());
  const std::string bytes = slurp(good);
  auto bad = dir.path() / "bad.safetensors";

  SUBCASE("truncated in the data") {
    spit(bad, bytes.substr(0, bytes.size() - 5));
    auto msg = open_error(bad);
    CHECK(msg.find("w.b") != std::string::npos);
    CHECK(msg.find("truncated") != std::string::npos);
  }
  SUBCASE("truncated in the header") {
    spit(bad, bytes.substr(0, 20));
    CHECK(open_error(bad).find("runs past the end") != std::string::npos);
  }
  SUBCASE("shorter than the length field") {
    spit(bad, bytes.substr(0, 5));
    CHECK(open_error(bad).find("too short") != std::string::npos);
  }
  SUBCASE("bytes appended") {
    spit(bad, bytes + "xxxx");
    CHECK(open_error(bad).find("appended") != std::string::npos);
  }
  SUBCASE("absurd header length") {
    std::string b2 = bytes;
    std::uint64_t huge = 1ull << 40;
    std::memcpy(b2.data(), &huge, 8);
    spit(bad, b2);
    CHECK(open_error(bad).find("header length") != std::string::npos);
  }
  SUBCASE("header is not JSON") {
    std::string b2 = bytes;
    b2[8 + 5] = '\x01';
    b2[8 + 6] = ']';
    spit(bad, b2);
    CHECK(open_error(bad).find("JSON") != std::string::npos);
  }
  SUBCASE("empty file") {
    spit(bad, "");
    CHECK(open_error(bad).find("too short") != std::string::npos);
  }
  SUBCASE("missing file") {
    auto f = safetensors_file::open(dir.path() / "none.safetensors");
    REQUIRE_FALSE(f.ok());
    CHECK(f.error().code == errc::not_found);
  }
}

TEST_CASE("safetensors: headers that lie about dtypes, shapes and offsets are refused") {
  temp_dir dir;
  auto p = dir.path() / "h.safetensors";
  auto check = [&](const std::string& header, std::size_t data, const char* expect) {
    spit(p, raw_file(header, data));
    auto msg = open_error(p);
    CHECK_MESSAGE(msg.find(expect) != std::string::npos, msg);
  };
  check(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "needs 8");
  check(R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2, "Q4");
  check(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "non-negative");
  check(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "ordered pair");
  check(R"({"t":{"dtype":"F32","shape":[1]}})", 4, "data_offsets");
  check(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4, "dtype");
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
        "overlaps");
  check(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "gap");
  check(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
        "twice");
  check(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4, "overflows");
  check(R"([1,2])", 0, "'{'");
  check(R"({"__metadata__":{"k":1},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, "__metadata__.k");
}

TEST_CASE("safetensors: sharded checkpoints are written with an index and read back") {
  temp_dir dir;
  std::vector<std::vector<float>> data;
  std::vector<tensor_view> ts;
  data.reserve(5);
  for (int i = 0; i < 5; ++i)
    data.push_back(std::vector<float>(100, static_cast<float>(i)));
  for (int i = 0; i < 5; ++i)
    ts.push_back({"t" + std::to_string(i), st_dtype::f32, {10, 10}, bytes_of(data[i])});

  // A single file first; a sharded save afterwards must replace it.
  auto single = write_checkpoint_weights(dir.path(), ts);
  REQUIRE(single.ok());
  CHECK(single->size() == 1);
  CHECK(fs::exists(dir.path() / "model.safetensors"));

  shard_options opts;
  opts.max_shard_bytes = 900; // two 400-byte tensors per shard
  auto written = write_checkpoint_weights(dir.path(), ts, opts);
  REQUIRE_MESSAGE(written.ok(), written.error().message);
  CHECK(written->size() == 4); // 3 shards + index
  CHECK(fs::exists(dir.path() / "model-00001-of-00003.safetensors"));
  CHECK(fs::exists(dir.path() / "model-00003-of-00003.safetensors"));
  CHECK(fs::exists(dir.path() / "model.safetensors.index.json"));
  CHECK_FALSE(fs::exists(dir.path() / "model.safetensors"));
  CHECK(slurp(dir.path() / "model.safetensors.index.json").find("\"total_size\":2000") != std::string::npos);

  auto ck = safetensors_checkpoint::open(dir.path());
  REQUIRE_MESSAGE(ck.ok(), ck.error().message);
  CHECK(ck->files().size() == 3);
  CHECK(ck->names().size() == 5);
  for (int i = 0; i < 5; ++i) {
    auto t = ck->get("t" + std::to_string(i));
    REQUIRE(t.ok());
    CHECK(std::memcmp((*t)->bytes.data(), data[i].data(), 400) == 0);
  }
  auto missing = ck->get("t9");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("missing tensor t9") != std::string::npos);

  SUBCASE("an index naming a tensor its shard lacks refuses the directory") {
    auto idx = slurp(dir.path() / "model.safetensors.index.json");
    auto pos = idx.find("\"t4\"");
    REQUIRE(pos != std::string::npos);
    idx.replace(pos, 4, "\"t7\"");
    spit(dir.path() / "model.safetensors.index.json", idx);
    CHECK(checkpoint_error(dir.path()).find("t7") != std::string::npos);
  }
  SUBCASE("a missing shard refuses the directory") {
    fs::remove(dir.path() / "model-00002-of-00003.safetensors");
    CHECK(checkpoint_error(dir.path()).find("model-00002-of-00003.safetensors") != std::string::npos);
  }
  SUBCASE("a truncated shard refuses the directory") {
    auto s = slurp(dir.path() / "model-00003-of-00003.safetensors");
    spit(dir.path() / "model-00003-of-00003.safetensors", s.substr(0, s.size() - 1));
    CHECK(checkpoint_error(dir.path()).find("truncated") != std::string::npos);
  }
  SUBCASE("a shard path outside the directory is refused") {
    auto idx = slurp(dir.path() / "model.safetensors.index.json");
    auto pos = idx.find("model-00001-of-00003.safetensors");
    idx.replace(pos, 0, "../");
    spit(dir.path() / "model.safetensors.index.json", idx);
    CHECK(checkpoint_error(dir.path()).find("not a file in the directory") != std::string::npos);
  }
  SUBCASE("saving a single file again removes the shards and the index") {
    REQUIRE(write_checkpoint_weights(dir.path(), ts).ok());
    CHECK(fs::exists(dir.path() / "model.safetensors"));
    CHECK_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
    CHECK_FALSE(fs::exists(dir.path() / "model-00001-of-00003.safetensors"));
  }
}

TEST_CASE("safetensors: a directory without weights is not_found") {
  temp_dir dir;
  CHECK(safetensors_checkpoint::open(dir.path()).error().code == errc::not_found);
  CHECK(checkpoint_error(dir.path()).find("model.safetensors") != std::string::npos);
}

TEST_CASE("safetensors: an index and its shards must agree on every tensor") {
  temp_dir dir;
  std::vector<float> a(4, 1.0f), b(4, 2.0f), c(4, 3.0f);
  auto view = [](const char* name, const std::vector<float>& v) {
    return tensor_view{name, st_dtype::f32, {4}, bytes_of(v)};
  };
  // Shard 1 holds a and b, shard 2 holds c; `index` is the weight_map's body.
  auto write = [&](std::vector<tensor_view> one, std::vector<tensor_view> two, const std::string& index) {
    REQUIRE(write_safetensors(dir.path() / "model-00001-of-00002.safetensors", one).ok());
    REQUIRE(write_safetensors(dir.path() / "model-00002-of-00002.safetensors", two).ok());
    spit(dir.path() / "model.safetensors.index.json",
         R"({"metadata": {"total_size": 48}, "weight_map": {)" + index + "}}");
  };
  const std::string good = R"("a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                                "c": "model-00002-of-00002.safetensors")";
  write({view("a", a), view("b", b)}, {view("c", c)}, good);
  auto ok = safetensors_checkpoint::open(dir.path());
  REQUIRE_MESSAGE(ok.ok(), ok.error().message);
  CHECK(ok->names() == std::vector<std::string>{"a", "b", "c"});

  SUBCASE("a tensor in a shard that the index does not name") {
    write({view("a", a), view("b", b)}, {view("c", c), view("stray", c)}, good);
    auto e = checkpoint_error(dir.path());
    CHECK_MESSAGE(e.find("model.safetensors.index.json: shard model-00002-of-00002.safetensors holds tensor stray, "
                         "which weight_map does not name") != std::string::npos, e);
  }
  SUBCASE("a tensor in another shard than the index says") {
    write({view("a", a)}, {view("b", b), view("c", c)}, good);
    auto e = checkpoint_error(dir.path());
    CHECK_MESSAGE(e.find("tensor b is in shard model-00002-of-00002.safetensors but weight_map puts it in "
                         "model-00001-of-00002.safetensors") != std::string::npos, e);
  }
  SUBCASE("a tensor in two shards") {
    write({view("a", a), view("b", b)}, {view("c", c), view("a", a)}, good);
    auto e = checkpoint_error(dir.path());
    CHECK_MESSAGE(e.find("tensor a is in more than one shard (again in model-00002-of-00002.safetensors)") !=
                    std::string::npos, e);
  }
  SUBCASE("a tensor named twice in weight_map") {
    write({view("a", a), view("b", b)}, {view("c", c)}, good + R"(, "a": "model-00002-of-00002.safetensors")");
    auto e = checkpoint_error(dir.path());
    CHECK_MESSAGE(e.find("weight_map names tensor a twice") != std::string::npos, e);
  }
  SUBCASE("a tensor the index names that no shard holds") {
    write({view("a", a), view("b", b)}, {view("c", c)}, good + R"(, "d": "model-00002-of-00002.safetensors")");
    auto e = checkpoint_error(dir.path());
    CHECK_MESSAGE(e.find("tensor d is mapped to model-00002-of-00002.safetensors but that shard lacks it") !=
                    std::string::npos, e);
  }
  SUBCASE("a missing shard is named with the index") {
    fs::remove(dir.path() / "model-00002-of-00002.safetensors");
    auto c2 = safetensors_checkpoint::open(dir.path());
    REQUIRE_FALSE(c2.ok());
    CHECK(c2.error().code == errc::corrupt);
    CHECK_MESSAGE(c2.error().message.find("model.safetensors.index.json: shard model-00002-of-00002.safetensors is "
                                          "missing (weight_map puts c there)") != std::string::npos,
                  c2.error().message);
  }
}

TEST_CASE("safetensors: shards whose bytes are made one file at a time") {
  temp_dir dir;
  // Five 400-byte tensors described without bytes; each file's bytes exist only while it is written.
  std::vector<tensor_view> layout;
  for (int i = 0; i < 5; ++i)
    layout.push_back({"t" + std::to_string(i), st_dtype::f32, {10, 10}, {}});
  std::vector<float> buffer;
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  shard_bytes make = [&](std::size_t first, std::span<const tensor_view> part) -> result<std::vector<tensor_view>> {
    calls.emplace_back(first, part.size());
    buffer.assign(100 * part.size(), 0.0f);
    std::vector<tensor_view> out;
    for (std::size_t i = 0; i < part.size(); ++i) {
      std::fill_n(buffer.begin() + static_cast<std::ptrdiff_t>(100 * i), 100, static_cast<float>(first + i));
      out.push_back({part[i].name, part[i].dtype, part[i].shape,
                     std::as_bytes(std::span{buffer}.subspan(100 * i, 100))});
    }
    return out;
  };
  shard_options opts;
  opts.max_shard_bytes = 900;
  auto written = write_checkpoint_weights(dir.path(), layout, make, opts);
  REQUIRE_MESSAGE(written.ok(), written.error().message);
  CHECK(calls == std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}, {2, 2}, {4, 1}});
  auto ck = safetensors_checkpoint::open(dir.path());
  REQUIRE_MESSAGE(ck.ok(), ck.error().message);
  for (int i = 0; i < 5; ++i) {
    auto t = ck->get("t" + std::to_string(i));
    REQUIRE(t.ok());
    float first = 0;
    std::memcpy(&first, (*t)->bytes.data(), 4);
    CHECK(first == static_cast<float>(i));
  }
  // Bytes that do not match the layout are refused, naming the tensor.
  shard_bytes wrong = [&](std::size_t, std::span<const tensor_view>) -> result<std::vector<tensor_view>> {
    buffer.assign(100, 0.0f);
    return std::vector<tensor_view>{{"other", st_dtype::f32, {10, 10}, bytes_of(buffer)}};
  };
  auto bad = write_checkpoint_weights(dir.path(), std::span{layout}.first(1), wrong);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("tensor other supplied where t0 (F32) was planned") != std::string::npos);
}
