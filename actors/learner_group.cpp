// Learner group: one learner handle in, every data-parallel rank's learner actor out; rank 0's
// reply (or the first rank's failure) back once all ranks have answered.
#include "actors/learner_group.hpp"

#include <caf/all.hpp>

#include <memory>
#include <string>
#include <utility>

#include "actors/actor_config.hpp"

namespace crucible {

namespace {

struct learner_group_state {
  learner_group_state() = default; // not an aggregate (see actors/engine.cpp's runner_state)

  std::vector<learner_actor> ranks;
  std::size_t next = 0; // the rank the next lone rollout_group goes to
  static inline const char* name = "crucible.learner_group";
};

using group_pointer = learner_actor::stateful_pointer<learner_group_state>;

// The answers to one request so far, shared by the per-rank reply handlers.
template <class Reply>
struct gathering {
  caf::typed_response_promise<Reply> promise;
  std::size_t waiting = 0;
  Reply first{};             // rank 0's reply
  int failed_rank = -1;      // the rank whose failure arrived first; -1: none yet
  crucible::error failure{errc::none, {}};
  std::size_t failures = 0;
};

// "learner rank R of W: MESSAGE", unless the learner actor already put its rank in front (a failed
// join does: "learner rank R of W: joining the data-parallel group: ...").
crucible::error named(crucible::error e, int rank, std::size_t world) {
  const std::string prefix = "learner rank " + std::to_string(rank) + " of " + std::to_string(world);
  if (e.message.rfind(prefix, 0) != 0)
    e.message = prefix + ": " + e.message;
  return e;
}

// Sends the message `xs` to every rank and answers with rank 0's reply once every rank has replied, or with
// the first failure. Requests to the ranks have no timeout of their own: each rank's collectives
// time out (learner.collective_timeout_s), and the trainer's request has its own deadline.
template <class Reply, class... Ts>
caf::result<Reply> to_every_rank(group_pointer self, const Ts&... xs) {
  const auto& ranks = self->state.ranks;
  auto g = std::make_shared<gathering<Reply>>();
  g->promise = self->template make_response_promise<Reply>();
  g->waiting = ranks.size();
  const auto world = ranks.size();
  auto answered = [g, world] {
    if (--g->waiting > 0)
      return;
    if (g->failed_rank < 0) {
      g->promise.deliver(std::move(g->first));
      return;
    }
    auto e = named(g->failure, g->failed_rank, world);
    if (g->failures > 1)
      e.message += " (" + std::to_string(g->failures - 1) + " other rank" + (g->failures > 2 ? "s" : "") + " failed too)";
    g->promise.deliver(make_error(e));
  };
  for (std::size_t r = 0; r < ranks.size(); ++r)
    self->request(ranks[r], caf::infinite, xs...)
      .then(
        [g, r, answered](Reply& reply) {
          if (r == 0)
            g->first = std::move(reply);
          answered();
        },
        [g, r, answered](caf::error& err) {
          if (g->failures++ == 0) {
            g->failed_rank = static_cast<int>(r);
            g->failure = to_error(err);
          }
          answered();
        });
  return g->promise;
}

learner_actor::behavior_type group_fn(group_pointer self, std::vector<learner_actor> ranks) {
  self->state.ranks = std::move(ranks);
  // Every message type, and why it goes where it goes (the learner actor's handlers,
  // actors/learner.cpp): the updates (train_atom, learner_batch, sft_batch) run collectives and
  // each rank takes its own share of the batch, so every rank must get each of them in the same
  // order; reset_atom changes each rank's optimiser state (under ZeRO-1 each its own shard);
  // save_atom is collective (rank 0 writes the model and manifest, each rank its ZeRO-1 shard).
  // Publishing new weights is rank 0's own business after an update and needs no request. A
  // rollout_group is data, not a command: it joins one rank's queue.
  return {
    [=](rollout_group& g) {
      auto& st = self->state;
      self->send(st.ranks[st.next], std::move(g));
      st.next = (st.next + 1) % st.ranks.size();
    },
    [=](train_atom a) -> caf::result<train_report> { return to_every_rank<train_report>(self, a); },
    [=](const learner_batch& b) -> caf::result<train_report> { return to_every_rank<train_report>(self, b); },
    [=](const sft_batch& b) -> caf::result<train_report> { return to_every_rank<train_report>(self, b); },
    [=](reset_atom a) {
      for (const auto& r : self->state.ranks)
        self->send(r, a);
    },
    [=](save_atom a, const std::string& dir) -> caf::result<policy_version> {
      return to_every_rank<policy_version>(self, a, dir);
    },
  };
}

} // namespace

result<learner_actor> spawn_learner_group(caf::actor_system& sys, std::vector<learner_actor> ranks) {
  if (ranks.empty())
    return fail(errc::invalid_arg, "learner group: no ranks");
  for (const auto& r : ranks)
    if (!r)
      return fail(errc::invalid_arg, "learner group: an invalid rank handle");
  return learner_actor{sys.spawn(group_fn, std::move(ranks))};
}

} // namespace crucible
