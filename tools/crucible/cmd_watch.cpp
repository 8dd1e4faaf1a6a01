// `crucible watch HOST:PORT|RUN`: a run's events live, from the coordinator's PUB socket
// (run.publish). Given a run directory, finds the endpoint in status.json; a run that is no
// longer running is reported from its metrics.jsonl instead.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "core/json_parse.hpp"
#include "storage/event_publisher.hpp"
#include "storage/metrics_log.hpp"
#include "storage/run_dir.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

using steady = std::chrono::steady_clock;

std::string number(const json_value& v) {
  char buf[32];
  if (v.is_int())
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v.as_int()));
  else if (v.is_number())
    std::snprintf(buf, sizeof buf, "%.3g", v.as_double());
  else if (v.is_null())
    return "-";
  else if (v.is_string())
    return v.as_string();
  else
    return "?";
  return buf;
}

// One readable line: time, event, then the key fields the record has.
std::string readable(const std::string& line) {
  auto v = parse_json(line, "event");
  if (!v || !v->is_object())
    return line;
  auto str = [&](const char* k) {
    auto* f = v->find(k);
    return f && f->is_string() ? f->as_string() : std::string{"-"};
  };
  char head[128];
  std::snprintf(head, sizeof head, "%-24s %-14s", str("time").c_str(), str("event").c_str());
  std::string out = head;
  auto add = [&](const char* label, const json_value* f, const char* suffix = "") {
    if (f)
      out += std::string{" "} + label + "=" + number(*f) + (f->is_number() ? suffix : "");
  };
  auto add_string = [&](const char* label, const char* key) {
    if (auto* f = v->find(key); f && f->is_string() && !f->as_string().empty())
      out += std::string{" "} + label + "=" + f->as_string();
  };
  add_string("state", "state");
  add_string("stage", "stage");
  add("step", v->find("step"));
  if (auto* p = v->find("policy_version"); p && p->is_int())
    out += " policy=v" + std::to_string(p->as_int());
  // A verdict: its task, status and speedup; a training step: its loss and sampling figures.
  add_string("task", "task");
  add_string("status", "status");
  add("speedup", v->find("speedup"), "x");
  add("of-limit", v->find("fraction")); // the candidate's fraction of its hardware's limit
  add("loss", v->find("loss"));
  add("reward", v->find("mean_reward"));
  add("correct", v->find("correct_share"));
  add("verdicts/min", v->find("verdicts_per_minute"));
  // Queue depths: any `*_queue` member, or the members of a `queues` object.
  for (const auto& m : v->as_object())
    if (m.key.size() > 6 && m.key.compare(m.key.size() - 6, 6, "_queue") == 0)
      add(m.key.c_str(), &m.value);
  if (auto* q = v->find("queues"); q && q->is_object())
    for (const auto& m : q->as_object())
      add((m.key + "_queue").c_str(), &m.value);
  add("mean", v->find("mean_speedup"), "x");
  add("best", v->find("best_speedup"), "x");
  add("turn", v->find("turn")); // a verdict of a multi-turn episode (from 0)
  // A training step of multi-turn episodes: each turn's correct share and mean speedup (turns from 1).
  if (auto* t = v->find("turns"); t && t->is_array())
    for (const auto& x : t->as_array()) {
      auto* turn = x.find("turn");
      if (!turn || !turn->is_int())
        continue;
      const auto label = "turn" + std::to_string(turn->as_int() + 1);
      add((label + ".correct").c_str(), x.find("correct_share"));
      add((label + ".mean").c_str(), x.find("mean_speedup"), "x");
    }
  // Per-device utilisation: `devices: [{"device": "cuda:0", "utilisation": 0.93}, ...]`.
  if (auto* d = v->find("devices"); d && d->is_array())
    for (const auto& dev : d->as_array()) {
      auto* name = dev.find("device");
      auto* util = dev.find("utilisation");
      if (name && name->is_string() && util && util->is_number()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %s=%.0f%%", name->as_string().c_str(), 100.0 * util->as_double());
        out += buf;
      }
    }
  if (auto* dr = v->find("dropped_events"); dr && dr->is_int() && dr->as_int() > 0)
    out += " dropped_events=" + std::to_string(dr->as_int());
  return out;
}

std::string event_of(const std::string& line) {
  auto v = parse_json(line, "event");
  if (!v || !v->is_object())
    return {};
  auto* e = v->find("event");
  return e && e->is_string() ? e->as_string() : std::string{};
}

struct printer {
  bool json = false;
  std::string until;
  bool reached = false;

  // Prints one record; true when it is the --until event.
  bool print(const std::string& line) {
    std::printf("%s\n", json ? line.c_str() : readable(line).c_str());
    std::fflush(stdout);
    reached = !until.empty() && event_of(line) == until;
    return reached;
  }
};

int finish_until_missing(const printer& p, const char* why) {
  std::fprintf(stderr, "crucible watch: %s before %s\n", why, p.until.c_str());
  return exit_failure;
}

int run_watch(const parsed_args& args) {
  auto timeout = real_option(args, "--timeout", 0, 0, 1e9);
  auto silence = real_option(args, "--silence", 10, 0.001, 1e9);
  if (auto* e = first_error(timeout, silence)) {
    std::fprintf(stderr, "crucible watch: %s\n", e->message.c_str());
    return exit_usage;
  }
  printer out{args.has("--json"), args.get("--until")};
  const std::string target = args.positional[0];
  std::string endpoint;
  std::filesystem::path run;
  std::error_code ec;
  if (std::filesystem::is_directory(target, ec)) {
    run = target;
    if (!std::filesystem::exists(run / "config.yaml", ec)) {
      std::fprintf(stderr, "crucible watch: %s is not a run directory (no config.yaml)\n", run.c_str());
      return exit_usage;
    }
    auto status = read_json_file(run / "status.json");
    if (!status || !status->is_object()) {
      std::fprintf(stderr, "crucible watch: %s\n",
                   status ? ((run / "status.json").string() + ": not a JSON object").c_str() : status.error().message.c_str());
      return exit_failure;
    }
    auto* state = status->find("state");
    std::string st = state && state->is_string() ? state->as_string() : "unknown";
    bool live = (st == "running" || st == "pausing" || st == "paused" || st == "starting")
                && storage::run_directory_locked(run);
    if (!live) {
      // Nothing will be published any more: the record is the history in metrics.jsonl.
      auto lines = storage::read_metrics(run / "metrics.jsonl");
      if (!lines) {
        std::fprintf(stderr, "crucible watch: %s\n", lines.error().message.c_str());
        return exit_failure;
      }
      for (const auto& l : *lines)
        if (out.print(l))
          return exit_ok;
      if (st != "finished" && st != "crashed")
        st = "crashed (its process is gone)";
      std::fprintf(stderr, "crucible watch: run %s is %s; nothing more will be published\n", run.c_str(), st.c_str());
      return out.until.empty() ? exit_ok : finish_until_missing(out, ("the run ended as " + st).c_str());
    }
    auto* pub = status->find("publish");
    if (!pub || !pub->is_string() || pub->as_string().empty()) {
      std::fprintf(stderr, "crucible watch: run %s publishes no events (run.publish is empty)\n", run.c_str());
      return exit_failure;
    }
    endpoint = pub->as_string();
  } else if (target.find("://") != std::string::npos) {
    endpoint = target;
  } else if (auto colon = target.rfind(':'); colon != std::string::npos && colon > 0 && colon + 1 < target.size()) {
    endpoint = "tcp://" + target;
  } else {
    std::fprintf(stderr, "crucible watch: '%s' is neither a run directory nor HOST:PORT\n", target.c_str());
    return exit_usage;
  }

  auto sub = storage::event_subscriber::connect(endpoint);
  if (!sub) {
    std::fprintf(stderr, "crucible watch: %s\n", sub.error().message.c_str());
    return exit_usage;
  }
  const auto start = steady::now();
  const bool bounded = *timeout > 0;
  const auto deadline = start + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(*timeout));
  const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(*silence));
  std::set<std::string> seen; // history already printed from metrics.jsonl
  bool first = true;
  for (;;) {
    auto wait = quiet;
    bool by_deadline = false;
    if (bounded) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (left <= std::chrono::milliseconds{0})
        left = std::chrono::milliseconds{0};
      if (left < wait) {
        wait = left;
        by_deadline = true;
      }
    }
    auto msg = sub->receive(wait);
    if (!msg) {
      std::fprintf(stderr, "crucible watch: %s\n", msg.error().message.c_str());
      return exit_failure;
    }
    if (!*msg) {
      if (by_deadline) {
        std::fprintf(stderr, "crucible watch: --timeout %g s reached\n", *timeout);
        return out.until.empty() ? exit_ok : finish_until_missing(out, "--timeout reached");
      }
      std::fprintf(stderr, "crucible watch: no event from %s %s %g s (is a run publishing there?)\n", endpoint.c_str(),
                   first ? "within" : "for", *silence);
      return exit_failure;
    }
    if (first && !run.empty()) {
      // Subscribed for sure now (a message came), so the file holds everything published
      // before it; print that history, then only what the file did not have.
      first = false;
      auto lines = storage::read_metrics(run / "metrics.jsonl");
      if (lines)
        for (const auto& l : *lines) {
          seen.insert(l);
          if (out.print(l))
            return exit_ok;
        }
    }
    first = false;
    if (seen.count((*msg)->json) != 0)
      continue;
    if (out.print((*msg)->json))
      return exit_ok;
  }
}

} // namespace

command watch_command() {
  return {{"watch", "HOST:PORT|RUN [--json] [--until EVENT] [--timeout S]", "Follow a run's events and metrics live",
           "Subscribes to the events a run publishes on run.publish (status.json's `publish` names\n"
           "the bound endpoint, so RUN may be the run directory) and prints one line per event:\n"
           "time, event and the key fields (step, policy version, verdicts per minute, queue depths,\n"
           "mean and best speedup, per-device utilisation). Given RUN, the events already in\n"
           "metrics.jsonl come first; a run that is no longer running is reported from that file.\n"
           "Exits 0 at --until EVENT, at --timeout without --until; 1 when the peer sends nothing\n"
           "for --silence seconds or the run ends (or --timeout passes) before --until.",
           {"HOST:PORT|RUN"},
           {{"--json", "", "print each event as its JSON line"},
            {"--until", "EVENT", "exit after printing this event, e.g. run_finished"},
            {"--timeout", "S", "stop after S seconds (default: no limit)"},
            {"--silence", "S", "fail when nothing arrives for S seconds (default 10; heartbeats come every run.heartbeat_s)"}}},
          run_watch};
}

} // namespace crucible::cli
