// actors/actor_config.hpp: the CAF configuration every crucible actor system starts from, and
// the bridge between crucible's error enum and caf::error.
#pragma once

#include <string>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>

#include "core/error.hpp"

namespace crucible {

/// Error category under which crucible::errc travels in a caf::error.
constexpr caf::atom_value error_category = caf::atom("crucible");

/// A caf::actor_system_config with the `crucible` type-ID block (actors/messages.hpp) and
/// crucible::errc as an error category registered. Loading the middleman is left to `main`
/// (nodes that join a cluster need it, tests do not). One per actor system; not thread-safe.
class actor_config : public caf::actor_system_config {
public:
  actor_config();
};

/// A caf::error of category `crucible` with `code` and `msg` as its context. With the
/// default argument it is found by ADL, so `caf::error e = errc::io;` and returning an errc
/// from a handler that returns caf::result<T> work.
caf::error make_error(errc code, std::string msg = {});

/// The caf::error for `err` (same code, its message as context).
caf::error make_error(const crucible::error& err);

/// The crucible::error for a caf::error: the code and message for category `crucible`;
/// errc::timeout for caf's request_timeout; errc::worker_lost when the receiver is gone
/// (request_receiver_down, cannot_forward_to_invalid_actor);
/// errc::protocol with caf's rendering for anything else. errc::none for no error.
crucible::error to_error(const caf::error& err);

} // namespace crucible
