// Evaluator actors: pool -> evaluator (one per device) -> detached runners -> env::device_evaluator.
#include "actors/evaluator.hpp"

#include <caf/all.hpp>

#include <deque>
#include <optional>

#include "actors/actor_config.hpp"

namespace crucible {

verdict to_message(const env::verdict& v) {
  verdict m;
  m.status = static_cast<verdict_status>(v.status);
  m.correct = v.correct;
  m.has_speedup = v.has_speedup();
  m.speedup = m.has_speedup ? v.speedup : 0;
  m.speedup_spread = std::isnan(v.speedup_spread) ? 0 : v.speedup_spread;
  m.ref_ms = std::isnan(v.ref_ms) ? 0 : v.ref_ms;
  m.cand_ms = std::isnan(v.cand_ms) ? 0 : v.cand_ms;
  m.reward = v.reward;
  m.checks_failed = v.checks_failed;
  m.message = v.message;
  m.hardware = v.hardware;
  m.cache_hit = v.cache_hit;
  return m;
}

namespace {

static_assert(static_cast<int>(env::verdict_status::format_error) == static_cast<int>(verdict_status::format_error),
              "env and message verdict statuses must list the same values in the same order");

// -- runner ---------------------------------------------------------------------------------

evaluation_runner_actor::behavior_type runner(evaluation_runner_actor::pointer self,
                                              std::shared_ptr<env::device_evaluator> device,
                                              std::shared_ptr<const task_catalog> tasks) {
  return {
    [=](const candidate& c) -> caf::result<verdict> {
      auto it = tasks->find(c.task);
      if (it == tasks->end())
        return make_error(errc::not_found, "unknown task " + c.task.value);
      env::eval_request req{it->second, c.code, 0, true};
      return to_message(device->evaluate(req));
    },
  };
}

// -- evaluator ------------------------------------------------------------------------------

struct evaluator_state {
  std::vector<evaluation_runner_actor> idle;
  std::deque<std::pair<candidate, caf::typed_response_promise<verdict>>> waiting;
  device_info info;
  static inline const char* name = "crucible.evaluator";
};

using evaluator_pointer = evaluator_actor::stateful_pointer<evaluator_state>;

void dispatch(evaluator_pointer self) {
  auto& st = self->state;
  while (!st.idle.empty() && !st.waiting.empty()) {
    auto r = st.idle.back();
    st.idle.pop_back();
    auto [c, rp] = std::move(st.waiting.front());
    st.waiting.pop_front();
    self->request(r, caf::infinite, std::move(c))
      .then(
        [=](const verdict& v) mutable {
          rp.deliver(v);
          self->state.idle.push_back(r);
          dispatch(self);
        },
        [=](const caf::error& e) mutable {
          rp.deliver(e);
          self->state.idle.push_back(r);
          dispatch(self);
        });
  }
}

evaluator_actor::behavior_type evaluator(evaluator_pointer self, evaluator_deps deps) {
  self->state.info = deps.info;
  for (std::int64_t i = 0; i < std::max<std::int64_t>(1, deps.concurrency); ++i) {
    auto r = self->spawn<caf::detached + caf::linked>(runner, deps.device, deps.tasks);
    self->state.idle.push_back(r);
  }
  return {
    [=](candidate& c) -> caf::result<verdict> {
      auto rp = self->make_response_promise<verdict>();
      self->state.waiting.emplace_back(std::move(c), rp);
      dispatch(self);
      return rp;
    },
    [=](caf::get_atom) -> device_info { return self->state.info; },
  };
}

// -- pool -----------------------------------------------------------------------------------

// A candidate sent to an evaluator and not yet answered. Kept by the pool so that it can be
// sent elsewhere when the evaluator goes down: a dead actor's unfulfilled promises never answer.
struct in_flight {
  std::uint64_t token;
  candidate cand;
  caf::typed_response_promise<verdict> rp;
};

struct pool_member {
  evaluator_actor handle;
  device_info info;
  std::vector<in_flight> sent;
  bool ready = false; // its device_info has arrived
};

struct pool_state {
  std::vector<pool_member> members;
  std::deque<std::pair<candidate, caf::typed_response_promise<verdict>>> waiting;
  evaluator_pool_options opt;
  std::uint64_t next_token = 0;
  static inline const char* name = "crucible.evaluator_pool";
};

using pool_pointer = evaluator_pool_actor::stateful_pointer<pool_state>;

bool matches(const pool_member& m, const candidate& c) {
  return m.ready && (c.hardware.empty() || m.info.hardware == c.hardware || m.info.name == c.hardware);
}

bool any_match(pool_pointer self, const candidate& c) {
  for (const auto& m : self->state.members)
    if (matches(m, c))
      return true;
  return false;
}

void pump(pool_pointer self);

// Removes and returns the in-flight entry `token`, if it is still there (it is not when its
// evaluator went down and the candidate was sent elsewhere).
std::optional<in_flight> take_in_flight(pool_pointer self, std::uint64_t token) {
  for (auto& m : self->state.members)
    for (auto it = m.sent.begin(); it != m.sent.end(); ++it)
      if (it->token == token) {
        auto out = std::move(*it);
        m.sent.erase(it);
        return out;
      }
  return std::nullopt;
}

// Sends `c` to the least-loaded matching member with a free slot; false if none has one.
bool try_send(pool_pointer self, candidate& c, caf::typed_response_promise<verdict>& rp) {
  auto& st = self->state;
  pool_member* best = nullptr;
  for (auto& m : st.members)
    if (matches(m, c) && static_cast<std::int64_t>(m.sent.size()) < st.opt.slots_per_evaluator
        && (best == nullptr || m.sent.size() < best->sent.size()))
      best = &m;
  if (best == nullptr)
    return false;
  auto token = st.next_token++;
  best->sent.push_back({token, c, rp});
  self->request(best->handle, caf::infinite, c)
    .then(
      [=](const verdict& v) {
        if (auto entry = take_in_flight(self, token)) {
          entry->rp.deliver(v);
          pump(self);
        }
      },
      [=](const caf::error& e) {
        if (auto entry = take_in_flight(self, token)) {
          // An evaluator that is gone takes no candidate with it: back in line.
          if (e == caf::sec::request_receiver_down && any_match(self, entry->cand))
            self->state.waiting.emplace_front(std::move(entry->cand), std::move(entry->rp));
          else
            entry->rp.deliver(e);
          pump(self);
        }
      });
  return true;
}

void pump(pool_pointer self) {
  auto& st = self->state;
  for (auto it = st.waiting.begin(); it != st.waiting.end();) {
    if (!any_match(self, it->first)) {
      it->second.deliver(make_error(errc::not_found, "no evaluator left for hardware \"" + it->first.hardware + "\""));
      it = st.waiting.erase(it);
    } else if (try_send(self, it->first, it->second)) {
      it = st.waiting.erase(it);
    } else {
      ++it;
    }
  }
}

evaluator_pool_actor::behavior_type evaluator_pool(pool_pointer self, std::vector<evaluator_actor> evaluators,
                                                   evaluator_pool_options opt) {
  self->state.opt = opt;
  for (auto& e : evaluators) {
    self->state.members.push_back(pool_member{e, {}, {}, false});
    self->monitor(e);
    self->request(e, caf::infinite, caf::get_atom_v).then([=](const device_info& info) {
      for (auto& m : self->state.members)
        if (m.handle == e) {
          m.info = info;
          m.ready = true;
        }
      pump(self);
    });
  }
  self->set_down_handler([=](const caf::down_msg& down) {
    auto& ms = self->state.members;
    auto it = std::find_if(ms.begin(), ms.end(), [&](const pool_member& m) { return m.handle.address() == down.source; });
    if (it == ms.end())
      return;
    auto lost = std::move(it->sent);
    ms.erase(it);
    for (auto r = lost.rbegin(); r != lost.rend(); ++r)
      self->state.waiting.emplace_front(std::move(r->cand), std::move(r->rp));
    pump(self);
  });
  return {
    [=](candidate& c) -> caf::result<verdict> {
      auto& st = self->state;
      bool pending_info = false;
      for (const auto& m : st.members)
        pending_info = pending_info || !m.ready;
      if (!any_match(self, c) && !pending_info)
        return make_error(errc::not_found, "no evaluator has hardware kind \"" + c.hardware + "\"");
      bool free_slot = false;
      for (const auto& m : st.members)
        free_slot = free_slot || (matches(m, c) && static_cast<std::int64_t>(m.sent.size()) < st.opt.slots_per_evaluator);
      bool sendable = st.waiting.empty() && free_slot;
      // Refuse before making a promise: once made, the promise owns the reply.
      if (!sendable && static_cast<std::int64_t>(st.waiting.size()) >= st.opt.max_pending)
        return make_error(errc::busy, "every evaluator queue is full (" + std::to_string(st.waiting.size())
                                        + " candidates waiting); retry later");
      auto rp = self->make_response_promise<verdict>();
      if (!sendable || !try_send(self, c, rp))
        st.waiting.emplace_back(std::move(c), rp);
      return rp;
    },
    [=](caf::get_atom) -> std::vector<device_info> {
      std::vector<device_info> out;
      for (const auto& m : self->state.members)
        if (m.ready)
          out.push_back(m.info);
      return out;
    },
  };
}

} // namespace

evaluator_actor spawn_evaluator(caf::actor_system& sys, evaluator_deps deps) {
  return sys.spawn(evaluator, std::move(deps));
}

evaluator_pool_actor spawn_evaluator_pool(caf::actor_system& sys, std::vector<evaluator_actor> evaluators,
                                          evaluator_pool_options opt) {
  return sys.spawn(evaluator_pool, std::move(evaluators), opt);
}

} // namespace crucible
