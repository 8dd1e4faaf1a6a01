// core/device.hpp: a device as the project names it ("cpu", "cuda", "cuda:N"), read in one place,
// and the hardware kind a device's model name stands for ("h100"), derived in one place. Every
// layer that takes a device string (the evaluator, the policy, the command line) reads it here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace crucible {

/// The CPU, or CUDA device `index`. Value type.
struct device_id {
  enum class kind : std::uint8_t { cpu, cuda };
  kind type = kind::cpu;
  int index = 0; ///< N of cuda:N; 0 for the CPU

  bool cuda() const noexcept { return type == kind::cuda; }
  /// "cpu" or "cuda:N": the name parse_device reads back to this device.
  std::string to_string() const;

  bool operator==(const device_id&) const = default;
};

/// "cpu", "cuda" (device 0) or "cuda:N" with N of one to four digits. Anything else is an
/// invalid_arg error whose message quotes `text` and says what is wrong with it.
result<device_id> parse_device(std::string_view text);

/// N when `text` names CUDA device N ("cuda" is 0), else -1 (the CPU and anything not a device).
int cuda_index(std::string_view text);

/// What a child process's CUDA_VISIBLE_DEVICES must say for it to see this process's CUDA device
/// `index` as its only one: the index-th entry of this process's own CUDA_VISIBLE_DEVICES
/// (`visible`, null where unset; entries may be indices, UUIDs or MIG names, passed as written),
/// or `index` itself where that is unset or has no such entry. Under a CUDA MPS server the server
/// numbers the devices it sees from 0, so a client names `index` itself (not this).
std::string child_visible_device(const char* visible, int index);

/// The hardware kind of a device whose model is `model` ("NVIDIA H100 80GB HBM3" -> "h100"): "cpu"
/// for the CPU, else the model's first word after its vendor, lower-cased ("gpu" where there is
/// none). Verdicts, exemplars and the evaluator pool match on it.
std::string hardware_kind_of(std::string_view device, std::string_view model);

} // namespace crucible
