// `crucible info`: what this build and this machine offer (versions, CUDA devices, the layers
// of the workers' sandbox).
#include <cstdio>

#include "core/config.hpp"
#include "core/json.hpp"
#include "env/eval/evaluator.hpp"
#include "env/eval/sandbox.hpp"
#include "policy/runtime.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

// The layers a worker's sandbox gets on this machine: a probe confines a fresh process as a
// worker (env/eval/harness/confine.py) and reports them.
result<env::isolation_report> sandbox_layers() {
  auto where = env::locate_harness(evaluator_options{});
  if (!where)
    return where.error();
  return env::probe_isolation(where->python, where->worker_py);
}

int run_info(const parsed_args& args) {
  auto info = policy::probe_runtime();
  auto iso = sandbox_layers();
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
    w.end_array().key("isolation").begin_object();
    if (iso) {
      w.key("layers").begin_array();
      for (const auto& l : iso->layers)
        w.value(l);
      w.end_array().key("missing").begin_object();
      for (const auto& [layer, why] : iso->missing)
        w.field(layer.c_str(), why);
      w.end_object().field("landlock_abi", iso->landlock_abi);
    } else {
      w.field("error", iso.error().message);
    }
    w.end_object().end_object();
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
  if (!iso) {
    std::printf("Worker sandbox: cannot probe: %s\n", iso.error().message.c_str());
    return exit_ok;
  }
  std::printf("Worker sandbox (docs/evaluator.md, Isolation), Landlock ABI %d:\n", iso->landlock_abi);
  for (const auto& l : iso->layers)
    std::printf("  in force  %s\n", l.c_str());
  for (const auto& [layer, why] : iso->missing)
    std::printf("  MISSING   %s: %s\n", layer.c_str(), why.c_str());
  std::printf(iso->missing.empty() ? "evaluator.isolation strict: workers start\n"
                                   : "evaluator.isolation strict: the evaluator refuses to start here (best-effort "
                                     "starts, with a warning in the log and in every verdict)\n");
  return exit_ok;
}

} // namespace

command info_command() {
  return {{"info", "[--json]", "Show this build's versions, the devices it can use and the workers' sandbox layers", "", {},
           {{"--json", "", "print one JSON object"}}},
          run_info};
}

} // namespace crucible::cli
