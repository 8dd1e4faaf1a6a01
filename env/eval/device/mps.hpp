// env/eval/device/mps.hpp: CUDA MPS for the evaluator's devices (evaluator.cuda_mps). Under an MPS server the
// workers and the evaluator's device agents (env/eval/device/device_agent.hpp: the evaluator's device work, in
// a process of its own as the workers' user) share one device context a device, so a timed sample
// across the boundary holds no switch between the processes' contexts (docs/evaluator.md, Trust
// boundary; docs/PERFORMANCE.md, "Sealed copies across the CUDA boundary, with and without MPS").
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace crucible::env {

/// What decides whether the daemon starts, as prepare_cuda_mps finds it.
struct mps_facts {
  bool cuda_device = false; ///< a device among the evaluator's is CUDA
  std::string program;      ///< nvidia-cuda-mps-control's path; empty where not found
  std::string external_pipe; ///< CUDA_MPS_PIPE_DIRECTORY as this process was given it: a daemon of the user's own
};

/// Whether to start the daemon: empty when it should start, else why not. `on` makes every
/// reason an error (`refuse` set) but a daemon of the user's own (CUDA_MPS_PIPE_DIRECTORY given,
/// which the workers are passed too); `auto` an info line; `off` and no CUDA device start
/// nothing and say nothing (`quiet`).
struct mps_decision {
  bool start = false;
  bool refuse = false;
  bool quiet = false;
  std::string why_not;
};
mps_decision decide_cuda_mps(cuda_mps_mode mode, const mps_facts& facts);

/// The user the MPS clients run as: the workers' (env/eval/harness/confine.py: nobody where this
/// process runs as root; uid -1, this process's own, otherwise). MPS serves one user at a time.
struct mps_identity {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};
mps_identity mps_client_identity();

/// Starts (once per process) a private MPS control daemon where decide_cuda_mps says so, with its
/// own pipe and log directories (`<tmp>/crucible-mps-<pid>/`, given to the clients' user), in the
/// foreground as this process's child (it dies with it), or takes the user's own daemon
/// (CUDA_MPS_PIPE_DIRECTORY); then starts a device agent for every CUDA device of `devices`, a
/// client of that daemon. This process never becomes a client: its device work for those devices
/// runs in the agents, and the workers are given the pipe directory (env/eval/sandbox.cpp; the
/// worker's confinement binds it in read-only). Daemons of evaluators no longer running are told
/// to quit and their directories removed first. Errors (`on`; `auto` warns and goes on without
/// MPS): no control program, a daemon that does not start (its log's last lines in the message),
/// an agent that does not.
result<void> prepare_cuda_mps(const evaluator_options& opt, const std::vector<std::string>& devices, logger& log);

/// Whether the MPS daemon the workers and agents are clients of is as this process left it (a
/// candidate reaches its control socket: every client must): running, and giving every client the
/// whole device (active thread percentage 100). Where it is not, this process's own daemon is
/// started again (its clients and the agents ended first) and what had changed is returned; a
/// daemon of the user's own is only logged (once), never told to a verdict. Empty where all is as
/// it was, or MPS is not used.
std::string check_cuda_mps(logger& log);

/// How many times check_cuda_mps has started the daemon again: a verdict that saw it grow ran while
/// the daemon was changed (by itself or by a verdict beside it).
std::uint64_t cuda_mps_restarts();

/// The MPS control program as prepare_cuda_mps finds it (on PATH, or where the driver's packages
/// put it); empty where there is none.
std::string cuda_mps_control_program();

/// The pipe directory the workers and agents connect to (this process's daemon's or the user's);
/// empty where MPS is not used.
std::string cuda_mps_pipe();

} // namespace crucible::env
