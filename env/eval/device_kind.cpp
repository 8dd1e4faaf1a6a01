// The device kinds' table (env/eval/device_kind.hpp).
#include "env/eval/device_kind.hpp"

#include "core/device.hpp"

namespace crucible::env {

namespace {

constexpr device_kind cpu_kind{
  .name = "cpu",
  .samples_on_device = false,
  .outputs_on_device = false,
  .process_wide_gate = false,
  .address_space_limit = true,
  .harness_kernels = false,
  .visible_device = false,
  .out_of_memory_alone = false,
  .flush_bytes = 64ull << 20, // twice the last-level cache of the machines measured
};

constexpr device_kind cuda_kind{
  .name = "cuda",
  .samples_on_device = true,
  .outputs_on_device = true,
  .process_wide_gate = true,
  .address_space_limit = false,
  .harness_kernels = true,
  .visible_device = true,
  .out_of_memory_alone = true,
  .flush_bytes = 256ull << 20, // over twice an H100's or H200's L2 (50 and 60 MB)
};

} // namespace

const device_kind& kind_of(std::string_view device) noexcept {
  return cuda_index(device) >= 0 ? cuda_kind : cpu_kind;
}

} // namespace crucible::env
