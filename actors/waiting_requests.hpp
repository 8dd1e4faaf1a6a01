// actors/waiting_requests.hpp: what the two engine actors (actors/engine.cpp, the local engine's;
// actors/endpoint_engine.cpp, an endpoint's) share about the generation requests waiting in them.
// Internal to those files.
#pragma once

#include <string>

#include <caf/actor_addr.hpp>

#include "actors/actor_config.hpp"

namespace crucible {

/// Drops the requests of `queue` (each with `req.group`, a response promise `rp` and its sender
/// `from`) that `from` sent, answering each errc::cancelled ("... before it `not_yet`"); how many.
template <class Queue>
std::uint64_t cancel_waiting_from(Queue& queue, const caf::strong_actor_ptr& from, const char* not_yet) {
  std::uint64_t n = 0;
  for (auto it = queue.begin(); it != queue.end();) {
    if (it->from == from) {
      it->rp.deliver(make_error(errc::cancelled, "generation request of group " + std::to_string(it->req.group.value) +
                                                   " cancelled by its sender before it " + not_yet));
      ++n;
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
  return n;
}

} // namespace crucible
