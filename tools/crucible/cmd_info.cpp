// `crucible info`: what this build and this machine offer (versions, CUDA devices).
#include <cstdio>

#include "core/json.hpp"
#include "policy/runtime.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int run_info(const parsed_args& args) {
  auto info = policy::probe_runtime();
  if (args.has("--json")) {
    json_writer w;
    w.begin_object()
      .field("crucible", CRUCIBLE_VERSION)
      .field("torch", info.torch_version)
      .field("cuda_built", info.cuda_built)
      .field("cuda_runtime", info.cuda_runtime)
      .field("cpu_threads", info.cpu_threads)
      .key("devices")
      .begin_array();
    for (const auto& d : info.devices)
      w.begin_object()
        .field("index", d.index)
        .field("name", d.name)
        .field("memory_bytes", d.memory_bytes)
        .field("compute_capability", std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor))
        .end_object();
    w.end_array().end_object();
    std::printf("%s\n", w.str().c_str());
    return exit_ok;
  }
  std::printf("crucible %s\nLibTorch %s (%d CPU threads)\n", CRUCIBLE_VERSION,
              info.torch_version.c_str(), info.cpu_threads);
  if (!info.cuda_built)
    std::printf("CUDA: not built in\n");
  else
    std::printf("CUDA runtime %s, %zu device(s)\n", info.cuda_runtime.c_str(), info.devices.size());
  for (const auto& d : info.devices)
    std::printf("  cuda:%d  %s  %.1f GiB  sm_%d%d\n", d.index, d.name.c_str(),
                static_cast<double>(d.memory_bytes) / (1ull << 30), d.compute_major, d.compute_minor);
  return exit_ok;
}

} // namespace

command info_command() {
  return {{"info", "[--json]", "Show this build's versions and the devices it can use", "", {},
           {{"--json", "", "print one JSON object"}}},
          run_info};
}

} // namespace crucible::cli
