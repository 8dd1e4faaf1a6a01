// env/eval/device/device_agent.hpp: the evaluator's device work in a process of its own, the device agent
// (crucible-device, env/eval/device/device_agent_main.cpp), one a CUDA device. Where one runs for a device,
// env/eval/device/device_bytes.hpp's functions for that device, and on the objects they return, run in the
// agent and the evaluator's process never starts CUDA for it: under an MPS server
// (evaluator.cuda_mps) the agent and the workers are its clients and the evaluator is none, so
// the agent takes the workers' user where the evaluator runs as root (MPS serves one user at a
// time), and a fault of a client, which MPS reports to every client of the device, ends the
// agent's and the workers' contexts but not the evaluator, which starts the agent again.
// Internal to env/.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "env/eval/device/device_bytes.hpp"

namespace crucible::env {

/// How an agent is started.
struct device_agent_spec {
  std::string program;                  ///< crucible-device's path (find_device_agent)
  std::vector<std::string> environment; ///< its whole environment
  uid_t uid = static_cast<uid_t>(-1);   ///< the identity it takes before CUDA starts (-1: this process's)
  gid_t gid = static_cast<gid_t>(-1);
};

/// CRUCIBLE_DEVICE_AGENT from the environment where set, else crucible-device beside this
/// process's executable, else the build's (as configured); an error names where it looked.
result<std::string> find_device_agent();

/// Starts the agent of CUDA device `device` and routes that device's functions of
/// env/eval/device/device_bytes.hpp to it from now on, for the rest of this process (an agent that ends is
/// started again on the next call). Waits until it has opened the device. Errors: the program
/// missing or failing to start, the device not opening (the agent's message).
result<void> start_device_agent(int device, const device_agent_spec& spec);

/// Whether `device`'s functions run in an agent.
bool device_agent_running(int device);

/// The agent's process id for `device`, 0 where none runs (tests, fault handling).
pid_t device_agent_pid(int device);

/// Whether `device`'s agent still works, one round trip: false where it has ended, or where its
/// device context no longer takes work (a fault; the agent then ends). True where no agent runs.
bool device_agent_alive(int device);

/// Starts `device`'s agent again where it has ended or no longer takes work (its restart hook
/// first): after a fault, before new workers start. Nothing where it works or none runs.
result<void> restart_device_agent(int device);

/// Ends every agent (this process stops, or the MPS daemon they are clients of does); each is
/// started again on its next call.
void end_device_agents();

/// Runs `job` on a thread that lives as long as this process, and waits for it: a process forked
/// there with a parent-death signal dies with this process, not with the calling thread.
void run_on_lasting_thread(const std::function<void()>& job);

/// How many agents `device` has had: a verdict that saw it grow ran beside a fault.
std::uint64_t device_agent_generation(int device);

/// Runs before an agent that ended is started again, with its device: under MPS the server of a
/// faulted client takes no new client until every client of it has exited (prepare_cuda_mps sets
/// one that ends this process's workers on the device).
void set_device_agent_restart_hook(std::function<void(int device)> hook);

namespace agent {

class link;

/// The agent that serves `device`, or nullptr where its functions run in this process.
link* route(int device) noexcept;
/// The agent that holds `b`, or nullptr where it is this process's memory.
link* route(const device_bytes& b) noexcept;

// The functions of env/eval/device/device_bytes.hpp, run in the agent `l` (same arguments, same results).
result<std::shared_ptr<device_bytes>> map_exported(link& l, int device, std::string_view handle_hex, std::uint64_t offset,
                                                   std::uint64_t bytes, std::uint64_t align);
result<std::shared_ptr<device_bytes>> map_allocation(link& l, int device, std::string_view handle_hex);
result<std::shared_ptr<device_bytes>> subspan(link& l, const device_bytes& parent, std::uint64_t offset, std::uint64_t bytes,
                                              std::uint64_t align);
result<std::shared_ptr<device_bytes>> allocate_owned(link& l, int device, std::uint64_t bytes);
result<void> upload(link& l, const device_bytes& dst, const std::byte* src, std::uint64_t bytes);
result<void> copy_all(link& l, const std::vector<device_copy>& copies);
result<void> fill_all(link& l, const std::vector<const device_bytes*>& spans, unsigned char value);
result<double> fastest_fill_ms(link& l, int device, std::uint64_t bytes);
result<void> flush_device_cache(link& l, int device, std::uint64_t bytes);
result<std::unique_ptr<device_clock>> make_device_clock(link& l, int device, clock_close close);
result<std::shared_ptr<device_bytes>> copy_to_owned(link& l, const device_bytes& src);
result<std::vector<std::shared_ptr<device_bytes>>> copy_all_to_owned(link& l, const std::vector<const device_bytes*>& srcs);
result<std::vector<std::byte>> download(link& l, const device_bytes& src);
result<std::vector<device_difference>> compare_all(link& l, const std::vector<device_comparison>& pairs, bool compare);
result<void> keep_freed_memory(link& l, int device, std::uint64_t bytes);
result<void> release_freed_memory(link& l, int device);
result<std::string> device_name(link& l, int device);
/// The agents' counters added to `into` (device_bytes_time).
void add_times(device_bytes_times& into) noexcept;

} // namespace agent

/// The agent's side: serves the connection `fd` (and every connection sent over it) until the
/// evaluator closes it; crucible-device's main. Returns the process's exit status.
int serve_device_agent(int fd, int device);

} // namespace crucible::env
