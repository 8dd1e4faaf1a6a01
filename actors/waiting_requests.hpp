// actors/waiting_requests.hpp: what the two engine actors (actors/engine.cpp, the local engine's;
// actors/endpoint_engine.cpp, an endpoint's) share about the generation requests waiting in them.
// Internal to those files.
#pragma once

#include <string>

#include <caf/actor_addr.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_config.hpp"
#include "actors/messages.hpp"

namespace crucible {

/// A generation request waiting in an engine actor, with whom to answer.
struct waiting_request {
  generation_request req;
  caf::typed_response_promise<generation_result> rp;
  caf::strong_actor_ptr from; // the sender, for cancel_atom
};

/// Queues the generation request `req` that `self` (an engine actor whose state has `queue`,
/// `opt.max_queued` and `status`) was sent, and starts what can start (`pump`); errc::busy,
/// counted as refused, when opt.max_queued requests are waiting already (`waiting_for` names for
/// what in the message: "" or " for the endpoint").
template <class Self, class Pump>
caf::result<generation_result> queue_generation(Self self, generation_request& req, const char* waiting_for, Pump pump) {
  auto& st = self->state;
  if (st.queue.size() >= st.opt.max_queued) {
    ++st.status.refused;
    return make_error(errc::busy, std::to_string(st.queue.size()) + " generation requests are waiting" + waiting_for +
                                    " (limit " + std::to_string(st.opt.max_queued) + "); retry later");
  }
  auto from = self->current_sender(); // before the promise takes the message over
  auto rp = self->template make_response_promise<generation_result>();
  st.queue.push_back({std::move(req), rp, std::move(from)});
  pump(self);
  return rp;
}

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
