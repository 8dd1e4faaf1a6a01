// Evaluator actors: pool -> evaluator (one per device) -> detached runners -> env::device_evaluator.
#include "actors/evaluator.hpp"

#include <caf/all.hpp>

#include <cctype>
#include <deque>
#include <optional>

#include "actors/actor_config.hpp"

namespace crucible {

namespace {

// -- runner ---------------------------------------------------------------------------------

evaluation_runner_actor::behavior_type runner(evaluation_runner_actor::pointer self,
                                              std::shared_ptr<env::device_evaluator> device,
                                              std::shared_ptr<const task_catalog> tasks) {
  return {
    [=](const candidate& c) -> caf::result<verdict> {
      auto it = tasks->find(c.task);
      if (it == tasks->end())
        return make_error(errc::not_found, "unknown task " + c.task.value);
      if (c.reference_only)
        return device->check_task(it->second);
      // A recheck is a second, independent measurement: a cached verdict would only repeat
      // the first.
      env::eval_request req{it->second, c.code, 0, !c.recheck};
      return device->evaluate(req);
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

// The first verdict of a candidate that is being re-measured on a second device.
struct first_measurement {
  verdict v;
  device_info device;
  caf::actor_addr source; // the evaluator that gave it: the recheck goes to another
};

// A candidate on its way through the pool with the promise of the client's reply; for a
// recheck, `first` holds the verdict that the second one is reconciled with.
struct job {
  candidate cand;
  caf::typed_response_promise<verdict> rp;
  std::optional<first_measurement> first;
};

// A job sent to an evaluator and not yet answered. Kept by the pool so that it can be sent
// elsewhere when the evaluator goes down: a dead actor's unfulfilled promises never answer.
struct in_flight {
  std::uint64_t token;
  job work;
};

struct pool_member {
  evaluator_actor handle;
  device_info info;
  std::vector<in_flight> sent;
  bool ready = false; // its device_info has arrived
};

struct pool_state {
  std::vector<pool_member> members;
  // Device-list requests that arrived while a member had not yet said what device it is.
  std::vector<caf::typed_response_promise<std::vector<device_info>>> listing;
  std::deque<job> waiting;
  evaluator_pool_options opt;
  std::uint64_t next_token = 0;
  static inline const char* name = "crucible.evaluator_pool";
};

using pool_pointer = evaluator_pool_actor::stateful_pointer<pool_state>;

// "device 1 (NVIDIA H100 80GB HBM3)": a device as verdict messages name it.
std::string label(const device_info& d) {
  return "device " + std::to_string(d.index) + " (" + d.name + ")";
}

// The device of the evaluator at `source` as a recheck's messages name it: distinct for any two
// members of the pool, so that a disagreement does not name one device twice. Another node's
// device names its node; two members of one node with the same device (two nodes' "cpu" devices
// both seen locally, two CPU evaluators) their places in the pool.
std::string label(pool_pointer self, const device_info& d, const caf::actor_addr& source) {
  auto out = label(d);
  if (source && source.node() != self->node())
    out += " on node " + caf::to_string(source.node());
  std::size_t alike = 0, place = 0;
  const auto& ms = self->state.members;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const auto& m = ms[i];
    if (m.info.index == d.index && m.info.name == d.name && m.handle.node() == source.node())
      ++alike;
    if (m.handle.address() == source)
      place = i + 1;
  }
  if (alike > 1 && place > 0)
    out += ", pool member " + std::to_string(place);
  return out;
}

bool matches(const pool_member& m, const candidate& c) {
  return m.ready && (c.hardware.empty() || m.info.hardware == c.hardware || m.info.name == c.hardware);
}

// A recheck goes only to another device of the first one's hardware kind.
bool matches(const pool_member& m, const job& j) {
  if (!j.first)
    return matches(m, j.cand);
  return m.ready && m.info.hardware == j.first->device.hardware && m.handle.address() != j.first->source;
}

template <class Work>
bool any_match(pool_pointer self, const Work& w) {
  for (const auto& m : self->state.members)
    if (matches(m, w))
      return true;
  return false;
}

// True while an evaluator that could take `j` may still turn up: one whose device is not yet
// known, or, for a fresh candidate, any at all while the pool is empty (nodes join later).
bool may_match_later(pool_pointer self, const job& j) {
  const auto& ms = self->state.members;
  bool pending = std::any_of(ms.begin(), ms.end(), [](const pool_member& m) { return !m.ready; });
  return pending || (ms.empty() && !j.first);
}

// Gives up on a job no evaluator can take (any more): a recheck leaves the first verdict
// standing, anything else is an error.
void abandon(job& j, const std::string& why) {
  if (j.first)
    j.rp.deliver(env::recheck_lost(j.first->v, why));
  else
    j.rp.deliver(make_error(errc::not_found, why));
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

// A verdict came back for `j` from the evaluator of `device` at `source`: deliver it, or
// first have it re-measured (a large speedup on a device with a sibling of its kind), or
// reconcile it with the first measurement (it was the recheck).
void on_verdict(pool_pointer self, job j, const verdict& v, const device_info& device, const caf::actor_addr& source) {
  const auto& opt = self->state.opt.recheck;
  if (j.first) {
    j.rp.deliver(env::reconcile_recheck(j.first->v, label(self, j.first->device, j.first->source), v,
                                        label(self, device, source), opt));
    return;
  }
  if (!j.cand.recheck && env::needs_recheck(v, opt)) {
    job again{j.cand, j.rp, first_measurement{v, device, source}};
    again.cand.recheck = true;
    if (any_match(self, again)) {
      // Ahead of new candidates: its client has waited for one evaluation already.
      self->state.waiting.push_front(std::move(again));
      return;
    }
  }
  j.rp.deliver(v);
}

// Sends `j` to the least-loaded matching member with a free slot (moving it into that
// member's in-flight list); false, leaving `j` as it was, if none has one.
bool try_send(pool_pointer self, job& j) {
  auto& st = self->state;
  pool_member* best = nullptr;
  for (auto& m : st.members)
    if (matches(m, j) && static_cast<std::int64_t>(m.sent.size()) < st.opt.slots_per_evaluator
        && (best == nullptr || m.sent.size() < best->sent.size()))
      best = &m;
  if (best == nullptr)
    return false;
  auto token = st.next_token++;
  auto device = best->info;
  auto source = best->handle.address();
  self->request(best->handle, caf::infinite, j.cand)
    .then(
      [=](const verdict& v) {
        if (auto entry = take_in_flight(self, token)) {
          on_verdict(self, std::move(entry->work), v, device, source);
          pump(self);
        }
      },
      [=](const caf::error& e) {
        if (auto entry = take_in_flight(self, token)) {
          auto& work = entry->work;
          if (work.first)
            work.rp.deliver(env::recheck_lost(work.first->v, label(self, device, source) + ": " + to_error(e).to_string()));
          // An evaluator that is gone takes no candidate with it: back in line.
          else if (e == caf::sec::request_receiver_down && (any_match(self, work) || may_match_later(self, work)))
            self->state.waiting.push_front(std::move(work));
          else
            work.rp.deliver(e);
          pump(self);
        }
      });
  best->sent.push_back({token, std::move(j)});
  return true;
}

void pump(pool_pointer self) {
  auto& st = self->state;
  for (auto it = st.waiting.begin(); it != st.waiting.end();) {
    if (!any_match(self, *it) && !may_match_later(self, *it)) {
      abandon(*it, it->first ? "no other device of kind \"" + it->first->device.hardware + "\" is left"
                             : "no evaluator left for hardware \"" + it->cand.hardware + "\"");
      it = st.waiting.erase(it);
    } else if (try_send(self, *it)) {
      it = st.waiting.erase(it);
    } else {
      ++it;
    }
  }
}

// True while a member added to the pool has not yet said what device it is.
bool announcing(const pool_state& st) {
  return std::any_of(st.members.begin(), st.members.end(), [](const pool_member& m) { return !m.ready; });
}

std::vector<device_info> ready_devices(const pool_state& st) {
  std::vector<device_info> out;
  for (const auto& m : st.members)
    if (m.ready)
      out.push_back(m.info);
  return out;
}

// Answers the device-list requests held back, once no member is still announcing its device.
void answer_listing(pool_pointer self) {
  auto& st = self->state;
  if (st.listing.empty() || announcing(st))
    return;
  auto devices = ready_devices(st);
  for (auto& rp : st.listing)
    rp.deliver(devices);
  st.listing.clear();
}

// Takes `e` into the pool (unless it is there already): monitored, and ready for candidates
// once its device_info has arrived.
void add_member(pool_pointer self, const evaluator_actor& e) {
  auto& ms = self->state.members;
  if (!e || std::any_of(ms.begin(), ms.end(), [&](const pool_member& m) { return m.handle == e; }))
    return;
  ms.push_back(pool_member{e, {}, {}, false});
  self->monitor(e);
  self->request(e, caf::infinite, caf::get_atom_v).then([=](const device_info& info) {
    for (auto& m : self->state.members)
      if (m.handle == e) {
        m.info = info;
        m.ready = true;
      }
    answer_listing(self);
    pump(self);
  });
}

// Takes the member at `source` out of the pool (it died or was removed): its candidates in
// flight go back to the head of the queue, its rechecks leave the first verdict standing.
// Verdicts it sends later find no in-flight entry and are dropped.
void remove_member(pool_pointer self, const caf::actor_addr& source, const std::string& why) {
  auto& ms = self->state.members;
  auto it = std::find_if(ms.begin(), ms.end(), [&](const pool_member& m) { return m.handle.address() == source; });
  if (it == ms.end())
    return;
  auto lost = std::move(it->sent);
  auto device = label(it->info);
  ms.erase(it);
  answer_listing(self);
  for (auto r = lost.rbegin(); r != lost.rend(); ++r) {
    if (r->work.first)
      r->work.rp.deliver(env::recheck_lost(r->work.first->v, "the evaluator of " + device + " " + why));
    else
      self->state.waiting.push_front(std::move(r->work));
  }
  pump(self);
}

evaluator_pool_actor::behavior_type evaluator_pool(pool_pointer self, std::vector<evaluator_actor> evaluators,
                                                   evaluator_pool_options opt) {
  self->state.opt = opt;
  for (auto& e : evaluators)
    add_member(self, e);
  self->set_down_handler([=](const caf::down_msg& down) { remove_member(self, down.source, "went down"); });
  return {
    [=](candidate& c) -> caf::result<verdict> {
      auto& st = self->state;
      bool pending_info = false;
      for (const auto& m : st.members)
        pending_info = pending_info || !m.ready;
      if (!any_match(self, c) && !pending_info && !st.members.empty())
        return make_error(errc::not_found, "no evaluator has hardware kind \"" + c.hardware + "\"");
      bool free_slot = false;
      for (const auto& m : st.members)
        free_slot = free_slot || (matches(m, c) && static_cast<std::int64_t>(m.sent.size()) < st.opt.slots_per_evaluator);
      bool sendable = st.waiting.empty() && free_slot;
      // Refuse before making a promise: once made, the promise owns the reply.
      if (!sendable && static_cast<std::int64_t>(st.waiting.size()) >= st.opt.max_pending)
        return make_error(errc::busy, "every evaluator queue is full (" + std::to_string(st.waiting.size())
                                        + " candidates waiting); retry later");
      job j{std::move(c), self->make_response_promise<verdict>(), std::nullopt};
      auto rp = j.rp;
      if (!sendable || !try_send(self, j))
        st.waiting.push_back(std::move(j));
      return rp;
    },
    [=](caf::get_atom) -> caf::result<std::vector<device_info>> {
      // A member added but not yet ready (its device_info is on the way): answer once it is,
      // so a node that has just joined is listed.
      auto& st = self->state;
      if (!announcing(st))
        return ready_devices(st);
      st.listing.push_back(self->make_response_promise<std::vector<device_info>>());
      return st.listing.back();
    },
    [=](caf::add_atom, const std::vector<caf::actor>& added) {
      for (const auto& e : added)
        add_member(self, caf::actor_cast<evaluator_actor>(e));
      pump(self);
    },
    [=](caf::delete_atom, const std::vector<caf::actor>& removed) {
      for (const auto& e : removed) {
        self->demonitor(e);
        remove_member(self, e.address(), "was removed from the pool");
      }
    },
  };
}

} // namespace

device_info device_info_of(const env::device_evaluator& dev, std::uint32_t index) {
  device_info out;
  out.index = index;
  out.name = dev.hardware();
  out.hardware = hardware_kind_of(dev.device(), out.name);
  return out;
}

evaluator_actor spawn_evaluator(caf::actor_system& sys, evaluator_deps deps) {
  return sys.spawn(evaluator, std::move(deps));
}

evaluator_pool_actor spawn_evaluator_pool(caf::actor_system& sys, std::vector<evaluator_actor> evaluators,
                                          evaluator_pool_options opt) {
  return sys.spawn(evaluator_pool, std::move(evaluators), opt);
}

} // namespace crucible
