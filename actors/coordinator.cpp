#include "actors/coordinator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_config.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"
#include "storage/atomic_file.hpp"

namespace crucible {

namespace {

constexpr std::string_view component = "coordinator";

struct coordinator_state {
  static inline const char* name = "crucible.coordinator";

  // A unique_ptr because CAF default-constructs the state and deps holds references.
  std::unique_ptr<coordinator_deps> deps;
  run_status status;
  bool started = false;
  bool stepping = false;       // a trainer step is under way
  std::chrono::steady_clock::time_point step_sent; // when the step under way was requested
  bool pause_running = false;  // the pause sequence (stop rollouts, checkpoint) is under way
  std::uint64_t pauses = 0;    // pause requests so far (matches a grace reminder to its pause)
  std::uint64_t last_checkpoint = 0; // step of the last checkpoint
  // Stops owed a reply once the pause sequence ends.
  std::vector<caf::typed_response_promise<run_status>> stopping;
  // Replies owed to start/resume: sent when the run stops advancing (finished, paused, crashed).
  std::vector<caf::typed_response_promise<run_status>> waiting;
};

using self_pointer = coordinator_impl_actor::stateful_pointer<coordinator_state>;

std::string lifecycle_record(std::string_view event, const run_status& s, clock::wall_time t) {
  json_writer w;
  w.begin_object().field("event", event).field("time", format_iso8601(t));
  write_fields(w, s);
  w.end_object();
  return std::move(w).take();
}

// status.json: the status, plus the endpoint of the live event stream when there is one, and
// where nodes join while the process takes them (running or pausing; a paused or finished run's
// process is gone, a crashed one's is going).
std::string status_file_text(const coordinator_deps& d, const run_status& s) {
  const bool joins = !d.join.empty() && (s.state == run_state::running || s.state == run_state::pausing);
  if (!d.publisher && d.pid == 0 && !joins)
    return to_json(s) + "\n";
  json_writer w;
  w.begin_object();
  write_fields(w, s);
  if (d.publisher)
    w.field("publish", d.publisher->endpoint());
  if (d.pid != 0)
    w.field("pid", d.pid);
  if (joins)
    w.field("join", d.join);
  w.end_object();
  return std::move(w).take() + "\n";
}

// Appends one metrics record and publishes it (topic = its event) without blocking.
result<void> append_record(coordinator_deps& d, std::string_view event, const std::string& line) {
  auto r = d.metrics.append(line);
  if (d.publisher)
    d.publisher->publish(event, line);
  return r;
}

// Makes the current status durable (status.json, then the metrics record) and logs it.
result<void> record(coordinator_state& st, std::string_view event) {
  auto& d = *st.deps;
  if (auto r = storage::write_file_atomic(d.status_file, status_file_text(d, st.status)); !r)
    return r.error();
  if (auto r = append_record(d, event, lifecycle_record(event, st.status, d.clk.now())); !r)
    return r.error();
  d.log.info(component, event, " (state ", to_string(st.status.state), ", step ",
             st.status.step, ", ", to_string(st.status.policy_version), ")");
  return {};
}

// Answers everybody waiting for the run to stop advancing.
void settle(coordinator_state& st) {
  for (auto& rp : st.waiting)
    rp.deliver(st.status);
  st.waiting.clear();
}

// The run cannot go on: say so wherever still possible and fail everybody waiting.
caf::error crash(coordinator_state& st, const crucible::error& err) {
  auto& d = *st.deps;
  st.status.state = run_state::crashed;
  d.log.error(component, "run crashed: ", err.to_string());
  // Best effort: the failure may be the very file system these writes need.
  (void) storage::write_file_atomic(d.status_file, status_file_text(d, st.status));
  (void) append_record(d, "run_crashed", lifecycle_record("run_crashed", st.status, d.clk.now()));
  auto failure = make_error(err);
  for (auto& rp : st.waiting)
    rp.deliver(failure);
  st.waiting.clear();
  return failure;
}

// Queues the next advance step and promises the caller the status at which advancing stops.
caf::result<run_status> keep_advancing(self_pointer self) {
  self->send(caf::actor_cast<coordinator_impl_actor>(self), advance_atom_v);
  auto rp = self->make_response_promise<run_status>();
  self->state.waiting.push_back(rp);
  return rp;
}

bool live(run_state s) {
  return s == run_state::running || s == run_state::pausing || s == run_state::paused;
}

// The heartbeat record: the status plus the publisher's counters. Not written to metrics.jsonl.
std::string heartbeat_record(const coordinator_deps& d, const run_status& s) {
  json_writer w;
  w.begin_object().field("event", "heartbeat").field("time", format_iso8601(d.clk.now()));
  write_fields(w, s);
  w.field("published", d.publisher->sent()).field("dropped_events", d.publisher->dropped());
  w.end_object();
  return std::move(w).take();
}

// The `event` of a record line written by json_writer ("record" when it has none).
std::string_view event_of(const std::string& line) {
  if (auto k = line.find("\"event\":\""); k != std::string::npos) {
    auto b = k + 9;
    if (auto e = line.find('"', b); e != std::string::npos)
      return std::string_view{line}.substr(b, e - b);
  }
  return "record";
}

// Copies a trainer report into the status, appends its records and rewrites status.json.
result<void> take_report(coordinator_state& st, const stage_report& rep) {
  st.status.stage = rep.stage;
  st.status.step = rep.step;
  st.status.policy_version = rep.policy_version;
  st.status.variants = rep.variants;
  st.status.best_speedup = rep.best_speedup;
  st.status.mean_speedup = rep.mean_speedup;
  st.status.dropped_stale = rep.dropped_stale;
  st.status.discarded = rep.discarded;
  st.status.unfinished = rep.unfinished;
  st.status.skipped_tasks = rep.skipped_tasks;
  st.status.devices = rep.devices;
  for (const auto& line : rep.records) {
    if (auto r = append_record(*st.deps, event_of(line), line); !r)
      return r;
  }
  // status.json follows every step, so that `crucible status` shows the run's progress.
  return storage::write_file_atomic(st.deps->status_file, status_file_text(*st.deps, st.status));
}

// Answers the stops waiting for the pause sequence, then quits.
void answer_stops(self_pointer self) {
  auto& st = self->state;
  if (st.stopping.empty())
    return;
  (void) st.deps->metrics.sync();
  for (auto& rp : st.stopping)
    rp.deliver(st.status);
  st.stopping.clear();
  st.deps->log.info(component, "stopped (state ", to_string(st.status.state), ")");
  self->quit();
}

// Notes where metrics.jsonl stood when checkpoint `dir` (of `step`) was recorded, in the run's
// metrics.checkpoint: a resume after a crash sets aside what came after it (cmd_train.cpp,
// set_aside_after_crash), the records of steps the resumed run does again.
result<void> note_metrics_offset(coordinator_deps& d, const std::string& dir, std::uint64_t step) {
  if (auto r = d.metrics.sync(); !r)
    return r.error();
  auto bytes = d.metrics.size();
  if (!bytes)
    return bytes.error();
  json_writer w;
  w.begin_object().field("dir", dir).field("step", step).field("bytes", *bytes).end_object();
  return storage::write_file_atomic(d.status_file.parent_path() / "metrics.checkpoint", std::move(w).take() + "\n");
}

// Checkpoints through the trainer, then calls `then` (or crashes the run).
void checkpoint(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  const auto began = std::chrono::steady_clock::now();
  self->request(st.deps->trainer, caf::infinite, save_atom_v)
    .then(
      [self, then, began](const std::string& dir) {
        auto& st = self->state;
        st.last_checkpoint = st.status.step;
        // What was written and how long the request took (the learner's state, the stores, the
        // samplers), for the write rate at size.
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
        const std::uint64_t bytes = directory_bytes(dir);
        json_writer w;
        w.begin_object().field("event", "checkpoint").field("time", format_iso8601(st.deps->clk.now()))
          .field("step", st.status.step).field("dir", dir).field("seconds", seconds).field("bytes", bytes).end_object();
        if (auto r = append_record(*st.deps, "checkpoint", std::move(w).take()); !r) {
          crash(st, r.error());
          answer_stops(self);
          return;
        }
        if (auto r = note_metrics_offset(*st.deps, dir, st.status.step); !r) {
          crash(st, r.error());
          answer_stops(self);
          return;
        }
        then();
      },
      [self](const caf::error& e) {
        crash(self->state, to_error(e));
        answer_stops(self);
      });
}

// The pause sequence once no step is under way: stop the rollouts, checkpoint, paused.
void run_pause(self_pointer self) {
  auto& st = self->state;
  if (st.pause_running)
    return;
  st.pause_running = true;
  self->request(st.deps->trainer, caf::infinite, stop_atom_v)
    .then(
      [self](stage_report& rep) {
        auto& st = self->state;
        if (auto r = take_report(st, rep); !r) {
          st.pause_running = false;
          crash(st, r.error());
          answer_stops(self);
          return;
        }
        checkpoint(self, [self] {
          auto& st = self->state;
          st.pause_running = false;
          st.status.state = run_state::paused;
          if (auto r = record(st, "run_paused"); !r) {
            crash(st, r.error());
            answer_stops(self);
            return;
          }
          settle(st);
          answer_stops(self);
        });
      },
      [self](const caf::error& e) {
        self->state.pause_running = false;
        crash(self->state, to_error(e));
        answer_stops(self);
      });
}

// A pause request while running: wait for the step under way, if any.
void begin_pause(self_pointer self) {
  auto& st = self->state;
  st.status.state = run_state::pausing;
  if (auto r = record(st, "run_pausing"); !r) {
    crash(st, r.error());
    answer_stops(self);
    return;
  }
  if (!st.stepping) {
    run_pause(self);
    return;
  }
  st.deps->log.info(component, "pausing: waiting for step ", st.status.step + 1, " under way to finish");
  if (st.deps->pause_grace.count() > 0)
    self->delayed_send(self, st.deps->pause_grace, drain_atom_v, ++st.pauses);
}

// A step of the schedule is done.
void on_step(self_pointer self, stage_report rep) {
  auto& st = self->state;
  st.stepping = false;
  const auto before = st.status.step;
  const double round_trip = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.step_sent).count();
  if (auto r = take_report(st, rep); !r) {
    crash(st, r.error());
    answer_stops(self);
    return;
  }
  // A step that trained: its time as the coordinator saw it, request to reply (the train_step
  // record splits the trainer's side; tools/bench/actor_overhead.py relates the two).
  if (std::any_of(rep.records.begin(), rep.records.end(), [](const std::string& l) { return event_of(l) == "train_step"; })) {
    json_writer w;
    w.begin_object().field("event", "step_timing").field("time", format_iso8601(st.deps->clk.now()))
      .field("step", rep.step).field("round_trip_seconds", round_trip).end_object();
    if (auto r = append_record(*st.deps, "step_timing", std::move(w).take()); !r) {
      crash(st, r.error());
      answer_stops(self);
      return;
    }
  }
  if (st.status.state == run_state::crashed)
    return;
  if (rep.done) {
    // The end: a last checkpoint (unless this step has one), then finished.
    auto finish = [self] {
      auto& st = self->state;
      st.status.state = run_state::finished;
      st.status.stage.clear();
      if (auto r = record(st, "run_finished"); !r) {
        crash(st, r.error());
        answer_stops(self);
        return;
      }
      settle(st);
      answer_stops(self);
    };
    if (st.last_checkpoint == st.status.step) // saved already, or nothing trained
      finish();
    else
      checkpoint(self, finish);
    return;
  }
  auto go_on = [self] {
    auto& st = self->state;
    if (st.deps->pause_after > 0 && st.status.step >= st.deps->pause_after && st.status.state == run_state::running) {
      st.deps->log.info(component, "pausing after step ", st.status.step, " as asked");
      begin_pause(self);
      return;
    }
    if (st.status.state == run_state::pausing) {
      run_pause(self);
      return;
    }
    if (st.status.state == run_state::running)
      self->send(caf::actor_cast<coordinator_impl_actor>(self), advance_atom_v);
  };
  const bool stepped = st.status.step > before;
  if (stepped && st.deps->checkpoint_every > 0 && st.status.step % st.deps->checkpoint_every == 0)
    checkpoint(self, go_on);
  else
    go_on();
}

coordinator_impl_actor::behavior_type coordinator(self_pointer self, coordinator_deps deps) {
  self->state.deps = std::make_unique<coordinator_deps>(std::move(deps));
  return {
    [self](drain_atom, std::uint64_t pause) {
      auto& st = self->state;
      if (pause != st.pauses || st.status.state != run_state::pausing || !st.stepping || !st.deps->trainer)
        return;
      self->request(st.deps->trainer, caf::infinite, drain_atom_v)
        .then([self](const std::string& what) { self->state.deps->log.info(component, "pausing: ", what); },
              [self](const caf::error& e) {
                self->state.deps->log.warn(component, "pausing: the trainer did not answer: ", to_error(e).to_string());
              });
    },
    [self](start_atom) -> caf::result<run_status> {
      auto& st = self->state;
      if (st.started)
        return make_error(errc::invalid_arg, std::string{"run already started (state "}
                                               + to_string(st.status.state) + ")");
      st.started = true;
      st.status = st.deps->initial;
      st.status.state = run_state::running;
      st.last_checkpoint = st.deps->resumed ? st.status.step : 0;
      if (auto r = record(st, st.deps->resumed ? "run_resumed" : "run_started"); !r)
        return crash(st, r.error());
      if (st.deps->publisher)
        self->send(caf::actor_cast<coordinator_impl_actor>(self), heartbeat_atom_v);
      return keep_advancing(self);
    },
    [self](caf::get_atom) -> run_status { return self->state.status; },
    [self](pause_atom) -> caf::result<run_status> {
      auto& st = self->state;
      if (st.status.state != run_state::running)
        return st.status;
      if (!st.deps->trainer) {
        // No schedule, so nothing in flight: straight to paused.
        st.status.state = run_state::paused;
        if (auto r = record(st, "run_paused"); !r)
          return crash(st, r.error());
        settle(st);
        return st.status;
      }
      begin_pause(self);
      return st.status;
    },
    [self](resume_atom) -> caf::result<run_status> {
      auto& st = self->state;
      if (st.status.state != run_state::paused)
        return st.status;
      st.status.state = run_state::running;
      if (auto r = record(st, "run_resumed"); !r)
        return crash(st, r.error());
      return keep_advancing(self);
    },
    [self](stop_atom) -> caf::result<run_status> {
      auto& st = self->state;
      auto rp = self->make_response_promise<run_status>();
      if (st.deps->trainer && (st.status.state == run_state::running || st.status.state == run_state::pausing)) {
        // Pause properly (step under way, rollouts, checkpoint), then answer and quit.
        st.stopping.push_back(rp);
        if (st.status.state == run_state::running)
          begin_pause(self);
        return rp;
      }
      caf::error err;
      if (st.status.state == run_state::running) {
        st.status.state = run_state::paused;
        if (auto r = record(st, "run_stopped"); !r)
          err = crash(st, r.error());
      }
      if (auto r = st.deps->metrics.sync(); !r && !err)
        err = make_error(r.error());
      settle(st);
      st.deps->log.info(component, "stopped (state ", to_string(st.status.state), ")");
      if (err)
        rp.deliver(std::move(err));
      else
        rp.deliver(st.status);
      self->quit();
      return rp;
    },
    [self](heartbeat_atom) {
      auto& st = self->state;
      if (!st.deps->publisher || !live(st.status.state))
        return;
      st.deps->publisher->publish("heartbeat", heartbeat_record(*st.deps, st.status));
      self->delayed_send(caf::actor_cast<coordinator_impl_actor>(self), st.deps->heartbeat, heartbeat_atom_v);
    },
    [self](advance_atom) {
      auto& st = self->state;
      if (st.status.state != run_state::running)
        return; // paused or stopped since this step was queued
      if (!st.deps->trainer) {
        // The schedule is empty: the run is complete.
        st.status.state = run_state::finished;
        st.status.stage.clear();
        if (auto r = record(st, "run_finished"); !r) {
          crash(st, r.error());
          return;
        }
        settle(st);
        return;
      }
      st.stepping = true;
      st.step_sent = std::chrono::steady_clock::now();
      self->request(st.deps->trainer, caf::infinite, advance_atom_v)
        .then([self](stage_report& rep) { on_step(self, std::move(rep)); },
              [self](const caf::error& e) {
                auto& st = self->state;
                st.stepping = false;
                crash(st, to_error(e));
                answer_stops(self);
              });
    },
  };
}

} // namespace

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_deps deps) {
  return sys.spawn(coordinator, std::move(deps));
}

} // namespace crucible
