// env/eval/device/device_bytes_host.cpp: device_bytes in a build without CUDA. Outputs always travel as host
// bytes there; these functions only say why the device path is missing.
#include "env/eval/device/device_bytes.hpp"

namespace crucible::env {

namespace {
crucible::error no_cuda() {
  return fail(errc::unsupported, "this build of crucible has no CUDA support (configured with CRUCIBLE_CUDA=OFF or without a toolkit)");
}
} // namespace

bool device_bytes_available() noexcept { return false; }

result<std::shared_ptr<device_bytes>> map_exported(int, std::string_view, std::uint64_t, std::uint64_t, std::uint64_t) {
  return no_cuda();
}
result<std::shared_ptr<device_bytes>> map_allocation(int, std::string_view) { return no_cuda(); }
result<std::shared_ptr<device_bytes>> subspan(std::shared_ptr<device_bytes>, std::uint64_t, std::uint64_t, std::uint64_t) {
  return no_cuda();
}
result<std::shared_ptr<device_bytes>> allocate_owned(int, std::uint64_t) { return no_cuda(); }
result<void> upload(const device_bytes&, const std::byte*, std::uint64_t) { return no_cuda(); }
result<void> copy_all(const std::vector<device_copy>&) { return no_cuda(); }
result<void> fill_all(const std::vector<const device_bytes*>&, unsigned char) { return no_cuda(); }
result<double> fastest_fill_ms(int, std::uint64_t) { return no_cuda(); }
result<void> flush_device_cache(int, std::uint64_t) { return no_cuda(); }
result<std::unique_ptr<device_clock>> make_device_clock(int, clock_close) { return no_cuda(); }
result<std::shared_ptr<device_bytes>> copy_to_owned(const device_bytes&) { return no_cuda(); }
result<std::vector<std::shared_ptr<device_bytes>>> copy_all_to_owned(const std::vector<const device_bytes*>&) {
  return no_cuda();
}
result<std::vector<std::byte>> download(const device_bytes&) { return no_cuda(); }
result<device_difference> device_compare(const device_bytes&, const device_bytes&, dtype, std::uint64_t,
                                         const tolerance&, double) {
  return no_cuda();
}
result<device_difference> device_scale(const device_bytes&, dtype, std::uint64_t, double) { return no_cuda(); }
result<std::vector<device_difference>> device_compare_all(const std::vector<device_comparison>&) { return no_cuda(); }
result<void> keep_freed_memory(int, std::uint64_t) { return no_cuda(); }
result<void> release_freed_memory(int) { return no_cuda(); }
result<std::string> device_name(int) { return no_cuda(); }
device_bytes_times device_bytes_time() noexcept { return {}; }

} // namespace crucible::env
