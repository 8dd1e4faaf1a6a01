// actors/membership.hpp: nodes join a running experiment. A joining node (crucible evaluator
// --join) -> the membership actor, published on HOST:PORT over CAF's middleman -> the evaluator
// pool, which takes the node's evaluators; the node's agent keeps a heartbeat, and a node that
// leaves, disconnects or falls silent has its evaluators removed and their candidates re-queued.
//
// The join, step by step (docs/scaling.md):
//   1. node -> membership: tasks_request{token}        -> run_setup: the task sources and the
//                                                          run's configuration (or refused)
//   2. the node starts one evaluator per device over those tasks, with the run's settings
//   3. node's agent -> membership: node_announce{token, host, devices, evaluator handles}
//                                                       -> node_welcome{node id, heartbeat, timeout}
//      the membership actor adds the evaluators to the pool and monitors the agent
//   4. agent -> membership: (heartbeat, node id) every heartbeat; (leave, node id) at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/timespan.hpp>

#include "actors/evaluator.hpp"
#include "actors/interfaces.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace crucible {

/// Settings of the membership actor. Value type.
struct membership_options {
  std::string listen = "127.0.0.1:0"; ///< HOST:PORT to publish on; port 0: any free port
  std::string token;                  ///< the shared secret a node must present (not empty)
  std::string run;                    ///< run name, told to joining nodes
  std::string config_yaml;            ///< the run's resolved configuration (to_yaml), sent to joining nodes
  caf::timespan heartbeat = std::chrono::seconds{2}; ///< a node's heartbeat interval; also the check interval
  caf::timespan timeout = std::chrono::seconds{10};  ///< a node silent this long is removed (> heartbeat)

  /// The `membership:` section of `cfg`, `run.name` and `cfg` itself as YAML, with the token read from
  /// `membership.token_file` (core/token.hpp: errors for a missing, empty or world-accessible
  /// file). When that key is empty the token comes from `run_dir/membership.token`, which is
  /// created with a fresh random token (mode 0600) when it does not exist, so a resumed run keeps
  /// its token. errc::config when `membership.listen` is empty (no membership).
  static result<membership_options> from(const config& cfg, const std::filesystem::path& run_dir);
};

/// Whom the membership actor works with.
struct membership_deps {
  evaluator_pool_actor pool;                 ///< admitted evaluators are added here
  std::shared_ptr<const task_catalog> tasks; ///< sent to joining nodes; not null
  logger* log = nullptr;                     ///< borrowed, optional: joins, leaves, removals, refusals
};

/// Spawns the membership actor without publishing it (tests on the deterministic scheduler;
/// start_membership publishes). It checks node heartbeats every `opt.heartbeat` and keeps
/// running until it is sent an exit; nodes still admitted then are removed from the pool
/// (unless the exit is exit_reason::kill, which no actor can handle).
membership_actor spawn_membership(caf::actor_system& sys, membership_deps deps, membership_options opt);

/// A published membership actor and the address it is bound to.
struct membership_handle {
  membership_actor actor;
  std::string host;       ///< as in membership_options::listen
  std::uint16_t port = 0; ///< the bound port (the actual one when 0 was asked for)

  /// "HOST:PORT", what nodes pass to --join.
  std::string endpoint() const { return host + ":" + std::to_string(port); }
};

/// Spawns the membership actor and publishes it on `opt.listen` through the actor system's
/// middleman (the caller loads it: actor_config::load<caf::io::middleman>()). errc::unsupported
/// without a middleman; errc::invalid_arg for an empty token, a malformed address or a timeout
/// not above the heartbeat; errc::io, naming the address, when the port cannot be bound.
result<membership_handle> start_membership(caf::actor_system& sys, membership_deps deps, membership_options opt);

/// Closes the port and stops the membership actor (its nodes' evaluators leave the pool).
void stop_membership(caf::actor_system& sys, const membership_handle& handle);

/// Spawns the agent of a node about to join through `membership` with `announce` (its token,
/// host, devices and evaluator handles). It does nothing until it receives join_atom.
/// `join_timeout` bounds the wait for the welcome; after that the welcome's heartbeat and
/// timeout apply. The agent quits with
///  - errc::worker_lost when the coordinator goes away (its connection closes),
///  - errc::timeout when a heartbeat goes unanswered for the welcome's timeout,
///  - errc::not_found when the coordinator no longer knows the node (it was removed),
///  - the refusal, when the join is refused (errc::refused for a wrong token),
///  - normally after a leave.
node_agent_actor spawn_node_agent(caf::actor_system& sys, membership_actor membership, node_announce announce,
                                  caf::timespan join_timeout);

} // namespace crucible
