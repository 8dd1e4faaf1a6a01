// Membership: joining nodes -> membership actor -> evaluator pool; the node agent on the other side.
#include "actors/membership.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "actors/actor_config.hpp"
#include "core/host_port.hpp"
#include "core/token.hpp"

namespace crucible {

namespace {

std::uint64_t to_ms(caf::timespan t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(t).count());
}

std::string seconds_text(caf::timespan t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(t).count());
  return buf;
}

// Compares in time independent of where the two differ, so that a peer cannot find the token
// byte by byte from response times.
bool same_token(const std::string& given, const std::string& expected) {
  if (expected.empty())
    return false;
  unsigned diff = given.size() != expected.size() ? 1u : 0u;
  for (std::size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(expected[i % expected.size()]);
  return diff == 0;
}

// -- membership actor -----------------------------------------------------------------------

struct member {
  node_id id;
  node_announce announce; // token blanked
  caf::actor_addr agent;  // the sender of the announce: heartbeats and leave come from it
  caf::actor_clock::time_point last_seen;
};

struct membership_state {
  std::vector<member> nodes;
  run_setup setup;
  std::uint64_t admitted = 0; // nodes admitted so far: numbers node ids
  static inline const char* name = "crucible.membership";
};

using membership_pointer = membership_impl_actor::stateful_pointer<membership_state>;

std::string describe(const node_announce& a) {
  std::string out;
  for (const auto& d : a.devices)
    out += (out.empty() ? "" : ", ") + d.name;
  return out;
}

// Takes node `it` out: its evaluators leave the pool (which re-queues their candidates).
void remove_node(membership_pointer self, const membership_deps& deps, std::vector<member>::iterator it,
                 const std::string& why, log_level level = log_level::warn) {
  if (deps.log != nullptr)
    deps.log->log(level, "membership", "node ", it->id.value, " ", why, ": ", it->announce.actors.size(),
                  " evaluators removed, their candidates re-queued");
  self->demonitor(it->agent);
  self->send(deps.pool, caf::delete_atom_v, it->announce.actors);
  self->state.nodes.erase(it);
}

// The admitted node `id` whose agent sent the current message, or end().
std::vector<member>::iterator find_from_agent(membership_pointer self, const node_id& id) {
  auto& ns = self->state.nodes;
  auto sender = caf::actor_cast<caf::actor_addr>(self->current_sender());
  return std::find_if(ns.begin(), ns.end(), [&](const member& m) { return m.id == id && m.agent == sender; });
}

caf::error unknown_node(const node_id& id) {
  return make_error(errc::not_found, "node " + id.value + " is not a member (removed, or never admitted)");
}

membership_impl_actor::behavior_type membership(membership_pointer self, membership_deps deps, membership_options opt) {
  for (const auto& [id, t] : *deps.tasks)
    self->state.setup.tasks.push_back(task_source{id, t.source, t.level, t.number});
  self->state.setup.config = opt.config_yaml;
  self->set_down_handler([=](const caf::down_msg& down) {
    auto& ns = self->state.nodes;
    auto it = std::find_if(ns.begin(), ns.end(), [&](const member& m) { return m.agent == down.source; });
    if (it != ns.end())
      remove_node(self, deps, it, "disconnected (" + to_error(down.reason).message + ")");
  });
  self->set_exit_handler([=](const caf::exit_msg& msg) {
    while (!self->state.nodes.empty())
      remove_node(self, deps, self->state.nodes.begin(), "dropped: membership stops");
    self->quit(msg.reason);
  });
  self->delayed_send(self, opt.heartbeat, expire_atom_v);
  return {
    [=](const tasks_request& req) -> caf::result<run_setup> {
      if (!same_token(req.token, opt.token)) {
        if (deps.log != nullptr)
          deps.log->warn("membership", "refused a task request: wrong token");
        return make_error(errc::refused, "wrong token");
      }
      return self->state.setup;
    },
    [=](node_announce& a) -> caf::result<node_welcome> {
      if (!same_token(a.token, opt.token)) {
        if (deps.log != nullptr)
          deps.log->warn("membership", "refused node ", a.host, ": wrong token");
        return make_error(errc::refused, "wrong token");
      }
      if (a.role != node_role::evaluator)
        return make_error(errc::unsupported, std::string{"nodes of role "} + to_string(a.role) + " cannot join in this build");
      if (a.devices.empty() || a.actors.size() != a.devices.size()
          || std::any_of(a.actors.begin(), a.actors.end(), [](const caf::actor& x) { return !x; }))
        return make_error(errc::invalid_arg, "an announce needs one evaluator handle per device, and a device");
      auto sender = self->current_sender();
      if (!sender)
        return make_error(errc::invalid_arg, "an anonymous announce has no agent to watch");
      auto agent = caf::actor_cast<caf::actor_addr>(sender);
      auto& ns = self->state.nodes;
      if (auto it = std::find_if(ns.begin(), ns.end(), [&](const member& m) { return m.agent == agent; }); it != ns.end())
        return make_error(errc::invalid_arg, "this agent has joined already as " + it->id.value);
      a.token.clear();
      node_id id{a.host + "#" + std::to_string(++self->state.admitted)};
      self->monitor(sender);
      // Before the welcome: a candidate the pool sends the node cannot overtake its admission.
      self->send(deps.pool, caf::add_atom_v, a.actors);
      if (deps.log != nullptr)
        deps.log->info("membership", "node ", id.value, " joined with ", a.devices.size(), " evaluators: ", describe(a));
      ns.push_back(member{id, std::move(a), agent, self->clock().now()});
      return node_welcome{id, opt.run, to_ms(opt.heartbeat), to_ms(opt.timeout)};
    },
    [=](heartbeat_atom, const node_id& id) -> caf::result<void> {
      auto it = find_from_agent(self, id);
      if (it == self->state.nodes.end())
        return unknown_node(id);
      it->last_seen = self->clock().now();
      return caf::unit;
    },
    [=](caf::leave_atom, const node_id& id) -> caf::result<void> {
      auto it = find_from_agent(self, id);
      if (it == self->state.nodes.end())
        return unknown_node(id);
      remove_node(self, deps, it, "left", log_level::info);
      return caf::unit;
    },
    [=](caf::get_atom) {
      // For status displays: who is there with which devices. Anybody who reaches the port may
      // ask, so neither tokens nor evaluator handles are handed out.
      std::vector<node_announce> out;
      for (const auto& m : self->state.nodes) {
        out.push_back(m.announce);
        out.back().actors.clear();
      }
      return out;
    },
    [=](expire_atom) {
      auto now = self->clock().now();
      auto& ns = self->state.nodes;
      for (auto it = ns.begin(); it != ns.end();) {
        if (now - it->last_seen > opt.timeout) {
          remove_node(self, deps, it, "sent no heartbeat for " + seconds_text(now - it->last_seen));
          it = ns.begin(); // remove_node erased it
        } else {
          ++it;
        }
      }
      self->delayed_send(self, opt.heartbeat, expire_atom_v);
    },
  };
}

// -- node agent -----------------------------------------------------------------------------

struct agent_state {
  node_welcome welcome;
  bool joined = false;
  bool leaving = false;
  static inline const char* name = "crucible.node_agent";
};

using agent_pointer = node_agent_impl_actor::stateful_pointer<agent_state>;

node_agent_impl_actor::behavior_type node_agent(agent_pointer self, membership_actor m, node_announce announce,
                                                caf::timespan join_timeout) {
  self->monitor(m);
  self->set_down_handler([=](const caf::down_msg& down) {
    if (down.source == m.address())
      self->quit(make_error(errc::worker_lost, "the coordinator went away (" + to_error(down.reason).message + ")"));
  });
  auto timeout = [=] { return caf::timespan{std::chrono::milliseconds{self->state.welcome.timeout_ms}}; };
  return {
    [=](caf::join_atom) -> caf::result<node_welcome> {
      if (self->state.joined)
        return self->state.welcome;
      auto rp = self->make_response_promise<node_welcome>();
      self->request(m, join_timeout, announce)
        .then(
          [=](const node_welcome& w) mutable {
            self->state.welcome = w;
            self->state.joined = true;
            self->delayed_send(self, std::chrono::milliseconds{w.heartbeat_ms}, heartbeat_atom_v);
            rp.deliver(w);
          },
          [=](const caf::error& e) mutable {
            rp.deliver(e);
            self->quit(e);
          });
      return rp;
    },
    [=](caf::leave_atom) {
      if (!self->state.joined) {
        self->quit();
        return;
      }
      if (self->state.leaving)
        return;
      self->state.leaving = true;
      // Quits once the coordinator has taken the node's evaluators out of its pool, or gave no
      // answer in time: the node goes either way.
      self->request(m, timeout(), caf::leave_atom_v, self->state.welcome.node)
        .then([=] { self->quit(); }, [=](const caf::error&) { self->quit(); });
    },
    [=](heartbeat_atom) {
      if (self->state.leaving)
        return;
      self->request(m, timeout(), heartbeat_atom_v, self->state.welcome.node)
        .then(
          [=] {
            if (!self->state.leaving)
              self->delayed_send(self, std::chrono::milliseconds{self->state.welcome.heartbeat_ms}, heartbeat_atom_v);
          },
          [=](const caf::error& e) {
            if (self->state.leaving)
              return;
            auto err = to_error(e);
            if (err.code == errc::timeout)
              self->quit(make_error(errc::timeout, "the coordinator answered no heartbeat within "
                                                     + seconds_text(timeout())));
            else if (err.code == errc::not_found)
              self->quit(make_error(errc::not_found, "the coordinator removed this node: " + err.message));
            else
              self->quit(e);
          });
    },
  };
}

} // namespace

result<membership_options> membership_options::from(const config& cfg, const std::filesystem::path& run_dir) {
  const auto& m = cfg.membership;
  if (m.listen.empty())
    return fail(errc::config, "membership.listen is empty: this run takes no nodes");
  membership_options out;
  out.listen = m.listen;
  out.run = cfg.run.name;
  out.config_yaml = to_yaml(cfg);
  out.heartbeat = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(m.heartbeat_s));
  out.timeout = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(m.timeout_s));
  if (!m.token_file.empty()) {
    auto token = read_token_file(m.token_file);
    if (!token)
      return fail(token.error().code, "membership.token_file: ", token.error().message);
    out.token = std::move(*token);
    return out;
  }
  auto file = run_dir / "membership.token";
  auto token = read_token_file(file);
  if (!token && token.error().code == errc::not_found)
    token = create_token_file(file);
  if (!token)
    return token.error();
  out.token = std::move(*token);
  return out;
}

membership_actor spawn_membership(caf::actor_system& sys, membership_deps deps, membership_options opt) {
  return caf::actor_cast<membership_actor>(sys.spawn(membership, std::move(deps), std::move(opt)));
}

result<membership_handle> start_membership(caf::actor_system& sys, membership_deps deps, membership_options opt) {
  if (!sys.has_middleman())
    return fail(errc::unsupported, "membership needs the actor system's middleman (caf::io)");
  if (opt.token.empty())
    return fail(errc::invalid_arg, "membership: the token is empty");
  if (opt.timeout <= opt.heartbeat)
    return fail(errc::invalid_arg, "membership: the timeout must exceed the heartbeat interval");
  if (!deps.pool || !deps.tasks)
    return fail(errc::invalid_arg, "membership: no evaluator pool or task catalogue");
  const auto address = split_host_port(opt.listen);
  if (!address)
    return fail(errc::invalid_arg, "membership: listen address \"", opt.listen,
                "\" is not HOST:PORT with a port from 0 to 65535");
  const auto& [host, port] = *address;
  auto actor = spawn_membership(sys, std::move(deps), std::move(opt));
  // reuse_addr: a restarted coordinator binds its fixed port again while old connections linger.
  auto bound = sys.middleman().publish(actor, port, host.c_str(), true);
  if (!bound) {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return fail(errc::io, "membership: cannot listen on ", host, ":", std::to_string(port), ": ",
                sys.render(bound.error()));
  }
  return membership_handle{actor, host, *bound};
}

void stop_membership(caf::actor_system& sys, const membership_handle& handle) {
  if (sys.has_middleman())
    static_cast<void>(sys.middleman().unpublish(handle.actor, handle.port));
  caf::anon_send_exit(handle.actor, caf::exit_reason::user_shutdown);
}

node_agent_actor spawn_node_agent(caf::actor_system& sys, membership_actor membership, node_announce announce,
                                  caf::timespan join_timeout) {
  return caf::actor_cast<node_agent_actor>(
    sys.spawn(node_agent, std::move(membership), std::move(announce), join_timeout));
}

} // namespace crucible
