#include <doctest/doctest.h>

#include "core/device.hpp"

#include <string>

using namespace crucible;

TEST_CASE("a device string is read in one place: cpu, cuda, cuda:N, and nothing else") {
  auto cpu = parse_device("cpu");
  REQUIRE(cpu);
  CHECK_FALSE(cpu->cuda());
  CHECK(cpu->to_string() == "cpu");
  auto bare = parse_device("cuda");
  REQUIRE(bare);
  CHECK(bare->cuda());
  CHECK(bare->index == 0);
  CHECK(bare->to_string() == "cuda:0");
  auto third = parse_device("cuda:3");
  REQUIRE(third);
  CHECK(third->cuda());
  CHECK(third->index == 3);
  CHECK(parse_device("cuda:0")->index == 0);
  CHECK(parse_device("cuda:0007")->to_string() == "cuda:7");
  CHECK(parse_device("cuda:9999")->index == 9999);
  CHECK(cuda_index("cuda:2") == 2);
  CHECK(cuda_index("cuda") == 0);
  CHECK(cuda_index("cpu") == -1);
  CHECK(cuda_index("cuda:x") == -1);
}

TEST_CASE("a string that is not a device is an error that quotes it and says what is wrong") {
  struct bad_case {
    const char* text;
    const char* why; // what the message says beyond quoting the text; empty: only that it is no device
  };
  for (const auto& c : {bad_case{"", ""}, bad_case{"gpu", ""}, bad_case{"CPU", ""}, bad_case{"cpu:0", ""},
                        bad_case{"cuda1", ""}, bad_case{"3", ""}, bad_case{"cuda:", "no device number"},
                        bad_case{"cuda:x", "not made of the digits"}, bad_case{"cuda:-1", "not made of the digits"},
                        bad_case{"cuda:1x", "not made of the digits"}, bad_case{"cuda: 1", "not made of the digits"},
                        bad_case{"cuda:12345", "more than 4 digits"}, bad_case{"cuda:99999999999", "more than 4 digits"}}) {
    const std::string text = c.text;
    CAPTURE(text);
    const auto r = parse_device(text);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::invalid_arg);
    const auto& message = r.error().message;
    CHECK_MESSAGE(message.find("\"" + text + "\" is not a device") == 0, message);
    CHECK_MESSAGE(message.find(c.why) != std::string::npos, message);
    CHECK_MESSAGE(message.find("expected cpu, cuda or cuda:N") != std::string::npos, message);
    CHECK(cuda_index(text) == -1);
  }
}

TEST_CASE("a device's name reads back to the same device") {
  for (const auto& id : {device_id{}, device_id{device_id::kind::cuda, 0}, device_id{device_id::kind::cuda, 1},
                         device_id{device_id::kind::cuda, 42}, device_id{device_id::kind::cuda, 9999}}) {
    CAPTURE(id.to_string());
    const auto back = parse_device(id.to_string());
    REQUIRE(back);
    CHECK(*back == id);
  }
  // Every accepted spelling has one name, and that name is a fixed point.
  for (const char* text : {"cpu", "cuda", "cuda:0", "cuda:00", "cuda:5", "cuda:0123"}) {
    CAPTURE(text);
    const auto name = parse_device(text)->to_string();
    CHECK(parse_device(name)->to_string() == name);
  }
  CHECK(device_id{device_id::kind::cuda, 2} != device_id{device_id::kind::cuda, 3});
  CHECK(device_id{} != device_id{device_id::kind::cuda, 0});
}

TEST_CASE("the hardware kind is derived in one place: a run's own GPU and a joined node's of the same model share it") {
  CHECK(hardware_kind_of("cpu", "x86_64 (2 cores)") == "cpu");
  CHECK(hardware_kind_of("cuda:0", "NVIDIA H100 80GB HBM3") == "h100");
  CHECK(hardware_kind_of("cuda:3", "NVIDIA H100 80GB HBM3") == "h100");
  CHECK(hardware_kind_of("cuda:0", "NVIDIA H200") == "h200");
  CHECK(hardware_kind_of("cuda:1", "AMD Instinct MI300X") == "instinct");
  CHECK(hardware_kind_of("cuda:0", "") == "gpu");
}

TEST_CASE("a child process sees this process's cuda:N through this process's own CUDA_VISIBLE_DEVICES") {
  // Unset: the machine's numbering is this process's.
  CHECK(child_visible_device(nullptr, 0) == "0");
  CHECK(child_visible_device(nullptr, 3) == "3");
  // Set: cuda:N is its N-th entry, as written (indices, UUIDs, MIG names), spaces around it cut.
  CHECK(child_visible_device("1", 0) == "1");
  CHECK(child_visible_device("2,0", 0) == "2");
  CHECK(child_visible_device("2,0", 1) == "0");
  CHECK(child_visible_device("GPU-8e5f2c1a, GPU-77aa01bc", 1) == "GPU-77aa01bc");
  CHECK(child_visible_device("MIG-GPU-8e5f2c1a/1/0", 0) == "MIG-GPU-8e5f2c1a/1/0");
  // No such entry, or an empty one: the index itself (this process could not have opened it).
  CHECK(child_visible_device("1", 1) == "1");
  CHECK(child_visible_device("1,,3", 1) == "1");
  CHECK(child_visible_device("", 0) == "0");
}
