// env/mps.hpp: CUDA MPS for the evaluator's devices (evaluator.cuda_mps). Under an MPS server the
// evaluator and its workers share one device context a device, so a timed sample across the
// boundary holds no switch between the processes' contexts (docs/evaluator.md, Trust boundary;
// docs/PERFORMANCE.md, "The CUDA boundary's context switches: MPS").
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
  bool root = false;        ///< this process runs as root (its workers then run as nobody)
  std::string program;      ///< nvidia-cuda-mps-control's path; empty where not found
  bool cuda_started = false; ///< the CUDA driver is already loaded in this process
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

/// Starts (once per process) a private MPS control daemon where decide_cuda_mps says so, with its
/// own pipe and log directories (`<tmp>/crucible-mps-<pid>/`), in the foreground as this process's
/// child (it dies with it), and sets CUDA_MPS_PIPE_DIRECTORY here: this process's CUDA and every
/// worker's (env/sandbox.cpp passes it, the worker's confinement binds it in read-only) connect
/// to it. Must run before anything starts CUDA in this process. Daemons of evaluators no longer
/// running are told to quit and their directories removed first. Errors: `on` where it cannot,
/// a daemon that does not start (its log's last lines in the message).
result<void> prepare_cuda_mps(const evaluator_options& opt, const std::vector<std::string>& devices, logger& log);

/// This process's daemon's pipe directory; empty if none runs.
std::string cuda_mps_pipe();

} // namespace crucible::env
