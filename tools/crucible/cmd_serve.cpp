// `crucible serve`: the evaluator pool behind an HTTP/JSON API (docs/service.md), for trainers
// that are not crucible's own (TRL, verifiers, verl): service/verdict_service.hpp judges, this
// file speaks HTTP through cpp-httplib.
#include <cstdio>
#include <sstream>
#include <string>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <vector>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_config.hpp"
#include "actors/evaluator.hpp"
#include "actors/membership.hpp"

#include "core/config.hpp"
#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "core/log.hpp"
#include "core/token.hpp"
#include "core/sha256.hpp"
#include "env/eval/evaluator.hpp"
#include "env/prompt/feedback.hpp"
#include "env/prompt/prompt.hpp"
#include "env/task.hpp"
#include "service/verdict_service.hpp"
#include "text/tokenizer.hpp"
#include "tools/crucible/commands.hpp"
#include "tools/crucible/serve_common.hpp"

namespace crucible::cli {

namespace {

using nlohmann::json;
using clock_type = std::chrono::steady_clock;

#ifdef CRUCIBLE_HAVE_HTTPLIB

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void refuse(httplib::Response& res, int status, const std::string& why) { reply(res, status, json{{"error", why}}); }

// What a request may name as its task: a registered suite's task by name, or a task's source.
struct task_registry {
  std::map<std::string, env::task> by_name;
  std::string suite;
};

struct serve_limits {
  std::size_t max_request_bytes = 4u << 20;
  double max_timeout_s = 3600;
  double default_timeout_s = 600;
};

// The number of single-character edits between two short field names.
std::size_t edits(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A field of `body` that is none of `known` (a misspelt 'timeout_s' would otherwise be ignored
// without a word), named with the nearest known field where one is close.
result<void> only_fields(const json_value& body, std::initializer_list<const char*> known, const std::string& what) {
  if (!body.is_object())
    return {};
  for (const auto& [key, value] : body.as_object()) {
    bool ok = false;
    std::string nearest;
    std::size_t best = 3; // at most two edits away
    for (const auto* k : known) {
      if (key == k) {
        ok = true;
        break;
      }
      if (const auto d = edits(key, k); d < best)
        best = d, nearest = k;
    }
    if (ok)
      continue;
    std::string list;
    for (const auto* k : known)
      list += (list.empty() ? "'" : ", '") + std::string{k} + "'";
    return fail(errc::invalid_arg, what, " has an unknown field '", key, "'",
                nearest.empty() ? std::string{} : " (did you mean '" + nearest + "'?)", "; its fields are ", list);
  }
  return {};
}

// A field's value, or nullptr where the body does not give it (absent or null).
const json_value* given(const json_value& body, const char* key) {
  const auto* v = body.find(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

// One request object of /v1/evaluate (or an item of a batch) into a verdict request; an error
// names the field. Without `with_candidate` (the task part of /v1/prompt) no candidate is read.
result<service::verdict_request> request_of(const json_value& body, const task_registry& tasks,
                                            bool with_candidate = true) {
  if (!body.is_object())
    return fail(errc::invalid_arg, "the request is not a JSON object");
  service::verdict_request r;
  auto str = [&](const char* key, std::string& out, bool required) -> result<void> {
    const auto* v = given(body, key);
    if (v == nullptr) {
      if (required)
        return fail(errc::invalid_arg, "the request has no '", key, "'");
      return {};
    }
    if (!v->is_string())
      return fail(errc::invalid_arg, "'", key, "' is not a string");
    out = v->as_string();
    return {};
  };
  if (auto ok = str("id", r.id, false); !ok)
    return ok.error();
  if (r.id.size() > 200)
    return fail(errc::invalid_arg, "'id' is longer than 200 characters");
  if (!r.id.empty() && r.id.front() == '~')
    return fail(errc::invalid_arg, "'id' may not start with '~' (the service's own ids do)");
  if (with_candidate)
    if (auto ok = str("candidate", r.candidate, true); !ok)
      return ok.error();
  std::string task_name, task_source;
  if (auto ok = str("task", task_name, false); !ok)
    return ok.error();
  if (auto ok = str("task_source", task_source, false); !ok)
    return ok.error();
  if (task_name.empty() == task_source.empty())
    return fail(errc::invalid_arg, "give either 'task' (a registered task's name, GET /v1/tasks) or 'task_source' "
                                   "(a task's Python source), not both or neither");
  if (!task_name.empty() && task_source.empty()) {
    auto it = tasks.by_name.find(task_name);
    if (it == tasks.by_name.end())
      return fail(errc::not_found, "no task '", task_name, "' in the registered suite ", tasks.suite, " (GET /v1/tasks)");
    r.task = it->second;
  } else {
    if (auto missing = env::missing_task_parts(task_source); !missing.empty())
      return fail(errc::invalid_arg, "'task_source' is not a task: it lacks ", missing);
    r.task.name = task_name.empty() ? "submitted" : task_name;
    r.task.source = task_source;
    r.task.sha256 = sha256_hex(env::normalize_source(task_source));
  }
  if (const auto* seed = given(body, "seed")) {
    if (!seed->is_uint())
      return fail(errc::invalid_arg, "'seed' is not a non-negative integer");
    r.seed = seed->as_uint();
  }
  if (const auto* cache = given(body, "cache")) {
    if (!cache->is_bool())
      return fail(errc::invalid_arg, "'cache' is not true or false");
    r.use_cache = cache->as_bool();
  }
  return r;
}

// When a request's answer is due: `timeout_s` seconds (default_timeout_s where it gives none) from now.
result<clock_type::time_point> deadline_of(const json_value& body, const serve_limits& lim) {
  double seconds = lim.default_timeout_s;
  if (const auto* t = given(body, "timeout_s")) {
    if (!t->is_number() || t->as_double() < 0 || t->as_double() > lim.max_timeout_s)
      return fail(errc::invalid_arg, "'timeout_s' is not a number of seconds in [0, ", std::to_string(lim.max_timeout_s), "]");
    seconds = t->as_double();
  }
  return clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
}

// A json_value (the one tree JSON is read into) as the writer's value, for a reply to carry.
json writer_value(const json_value& v) {
  switch (v.type()) {
  case json_value::kind::null: return nullptr;
  case json_value::kind::boolean: return v.as_bool();
  case json_value::kind::integer: return v.as_int();
  case json_value::kind::real: return v.is_uint() ? json(v.as_uint()) : json(v.as_double());
  case json_value::kind::string: return v.as_string();
  case json_value::kind::array: {
    json out = json::array();
    for (const auto& x : v.as_array())
      out.push_back(writer_value(x));
    return out;
  }
  case json_value::kind::object: {
    json out = json::object();
    for (const auto& m : v.as_object())
      if (!out.contains(m.key)) // the first of a repeated key, as json_value::find reads it
        out[m.key] = writer_value(m.value);
    return out;
  }
  }
  return nullptr;
}

json verdict_json(const env::verdict& v) {
  auto parsed = parse_json(env::to_json(v), "a verdict");
  return parsed ? writer_value(*parsed) : json{{"error", parsed.error().message}};
}

// The answer to one admitted request: its verdict, or "pending" when it is not judged by `until`.
json answer(service::verdict_service& svc, const service::verdict_service::ticket& t, clock_type::time_point until) {
  if (auto v = svc.wait(t, until))
    return json{{"id", t.id}, {"state", "judged"}, {"verdict", verdict_json(*v)}};
  return json{{"id", t.id}, {"state", "pending"}};
}

// An admission that is not a ticket to wait on: the HTTP status and error for it.
std::pair<int, std::string> refusal(service::verdict_service::admission how, const std::string& id) {
  using adm = service::verdict_service::admission;
  switch (how) {
    case adm::full: return {429, "the queue is full; retry later"};
    case adm::conflict: return {409, "the id '" + id + "' was used for another request"};
    case adm::stopping: return {503, "the service is stopping"};
    default: return {500, "not refused"};
  }
}

// POST /v1/prompt: the contrastive prompt crucible's own rollouts sample on (prompt.template, within
// prompt.max_tokens), for a task and the exemplars a client keeps: {"task" or "task_source",
// "exemplars": [{"code", "speedup"}], "hardware"} in, {"system", "user", "messages", "exemplars_shown"}
// out. The client's model applies its own chat template to the messages. With "turns" (a
// multi-turn episode: [{"answer": the model's whole response, "evaluation": the id of the
// /v1/evaluate request that judged its code}], oldest first) and "turns_total" (the episode's
// turns; default one more than given), the messages are the next turn's: each earlier answer and
// the feedback on its verdict (prompt.feedback_template), older turns shortened first to fit.
result<json> prompt_of(const json_value& body, const task_registry& tasks, const env::prompt_builder& builder,
                       const std::string& hardware, const service::verdict_service& svc,
                       const env::feedback_template& feedback) {
  if (!body.is_object())
    return fail(errc::invalid_arg, "the request is not a JSON object");
  auto r = request_of(body, tasks, /*with_candidate=*/false); // its task part: no candidate here
  if (!r)
    return r.error();
  env::prompt_request pr;
  pr.task_name = r->task.name;
  pr.reference_code = r->task.source;
  pr.hardware = hardware;
  if (const auto* hw = given(body, "hardware")) {
    if (!hw->is_string() || hw->as_string().empty())
      return fail(errc::invalid_arg, "'hardware' is not a non-empty string");
    pr.hardware = hw->as_string();
  }
  if (const auto* list = given(body, "exemplars")) {
    if (!list->is_array() || list->as_array().size() > 64)
      return fail(errc::invalid_arg, "'exemplars' is not a list of at most 64 {\"code\", \"speedup\"}");
    for (std::size_t i = 0; i < list->as_array().size(); ++i) {
      const auto& x = list->as_array()[i];
      const auto* code = x.find("code");
      const auto* speedup = x.find("speedup");
      if (code == nullptr || !code->is_string() || speedup == nullptr || !speedup->is_number() || !(speedup->as_double() > 0))
        return fail(errc::invalid_arg, "'exemplars[", std::to_string(i), "]' is not {\"code\": string, \"speedup\": number above 0}");
      const auto* hw = given(x, "hardware");
      if (hw != nullptr && !hw->is_string())
        return fail(errc::invalid_arg, "'exemplars[", std::to_string(i), "].hardware' is not a string");
      pr.exemplars.push_back({code->as_string(), speedup->as_double(), hw != nullptr ? hw->as_string() : pr.hardware});
    }
  }
  auto built = builder.build(pr);
  if (!built)
    return built.error();
  std::size_t shown = 0;
  for (const auto& p : built->exemplars)
    shown += p.kept ? 1 : 0;
  std::vector<env::episode_turn> turns;
  if (const auto* list = given(body, "turns")) {
    constexpr std::size_t most = 32;
    if (!list->is_array() || list->as_array().size() > most)
      return fail(errc::invalid_arg, "'turns' is not a list of at most ", std::to_string(most),
                  " {\"answer\": string, \"evaluation\": id}");
    const auto& items = list->as_array();
    std::size_t total = items.size() + 1;
    if (const auto* t = given(body, "turns_total")) {
      if (!t->is_int() || t->as_int() < static_cast<std::int64_t>(items.size()) + 1 || t->as_int() > 64)
        return fail(errc::invalid_arg, "'turns_total' is not an integer from ", std::to_string(items.size() + 1),
                    " (the turns given and the next) to 64");
      total = static_cast<std::size_t>(t->as_int());
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& x = items[i];
      const std::string where = "'turns[" + std::to_string(i) + "]'";
      const auto* answer = x.find("answer");
      const auto* evaluation = x.find("evaluation");
      if (answer == nullptr || !answer->is_string() || evaluation == nullptr || !evaluation->is_string())
        return fail(errc::invalid_arg, where, " is not {\"answer\": string, \"evaluation\": id}");
      const auto& id = evaluation->as_string();
      auto found = svc.find(id);
      if (!found)
        return fail(errc::not_found, where, ": no evaluation '", id, "' is known (never sent, or forgotten)");
      if (!found->judged)
        return fail(errc::busy, where, ": evaluation '", id, "' is not judged yet");
      if (found->task != pr.task_name)
        return fail(errc::invalid_arg, where, ": evaluation '", id, "' judged task '", found->task, "', not '",
                    pr.task_name, "'");
      turns.push_back({answer->as_string(), env::render_feedback(feedback, found->v, i + 1, total - (i + 1))});
    }
    if (!turns.empty()) {
      auto next = builder.continue_episode(*built, turns);
      if (!next)
        return next.error();
      built = std::move(next);
    }
  }
  json messages = json::array();
  for (const auto& [role, content] : built->messages)
    messages.push_back(json{{"role", role}, {"content", content}});
  return json{{"task", pr.task_name},
              {"system", built->system},
              {"user", built->user},
              {"messages", messages},
              {"turn", turns.size() + 1},
              {"exemplars_shown", shown},
              {"tokens", built->tokens}};
}

// Why a request nothing here can judge is refused (a service whose devices are all nodes').
const char* const nodes_only = "this service judges on evaluator nodes only, which know the registered suite and draw "
                               "fresh inputs: name a registered task (GET /v1/tasks), without 'seed' or 'cache': false";

void add_routes(httplib::Server& srv, service::verdict_service& svc, const task_registry& tasks, const serve_limits& lim,
                const std::string& token, const env::prompt_builder& prompts, const env::feedback_template& feedback) {
  // Every request carries the token (Authorization: Bearer TOKEN).
  srv.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
    const auto auth = req.get_header_value("Authorization");
    if (!bearer_matches(auth, token)) {
      refuse(res, 401, auth.empty() ? "no token: send 'Authorization: Bearer TOKEN'" : "wrong token");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  srv.Get("/v1/health", [&](const httplib::Request&, httplib::Response& res) {
    const auto c = svc.counters();
    reply(res, 200, json{{"status", "ok"}, {"devices", svc.devices()}, {"queued", c.queued}, {"running", c.running}});
  });
  srv.Get("/v1/metrics", [&](const httplib::Request&, httplib::Response& res) {
    // Prometheus' text format.
    const auto c = svc.counters();
    std::ostringstream m;
    m << "# TYPE crucible_serve_queued gauge\ncrucible_serve_queued " << c.queued << "\n"
      << "# TYPE crucible_serve_running gauge\ncrucible_serve_running " << c.running << "\n"
      << "# TYPE crucible_serve_judged_total counter\ncrucible_serve_judged_total " << c.judged << "\n"
      << "# TYPE crucible_serve_refused_full_total counter\ncrucible_serve_refused_full_total " << c.refused_full << "\n"
      << "# TYPE crucible_serve_duplicates_total counter\ncrucible_serve_duplicates_total " << c.duplicates << "\n"
      << "# TYPE crucible_serve_judged_seconds_total counter\ncrucible_serve_judged_seconds_total " << c.judged_wall_s << "\n"
      << "# TYPE crucible_serve_verdicts_total counter\n";
    for (const auto& [status, n] : c.by_status)
      m << "crucible_serve_verdicts_total{status=\"" << status << "\"} " << n << "\n";
    res.set_content(m.str(), "text/plain; version=0.0.4");
  });
  srv.Get("/v1/tasks", [&](const httplib::Request&, httplib::Response& res) {
    json list = json::array();
    for (const auto& [name, t] : tasks.by_name)
      list.push_back(json{{"name", name}, {"sha256", t.sha256}});
    reply(res, 200, json{{"suite", tasks.suite}, {"tasks", list}});
  });
  srv.Get(R"(/v1/evaluations/(.+))", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto found = svc.find(id);
    if (!found)
      return refuse(res, 404, "no request '" + id + "' is known (never sent, or forgotten)");
    if (!found->judged)
      return reply(res, 200, json{{"id", id}, {"state", "pending"}});
    reply(res, 200, json{{"id", id}, {"state", "judged"}, {"verdict", verdict_json(found->v)}});
  });
  post_any_type(srv, "/v1/evaluate", [&](const httplib::Request& req, httplib::Response& res) {
    const auto parsed = parse_json(req.body);
    if (!parsed)
      return refuse(res, 400, "the body is not JSON");
    const json_value& body = *parsed;
    if (auto ok = only_fields(body, {"id", "candidate", "task", "task_source", "seed", "cache", "timeout_s"}, "the request");
        !ok)
      return refuse(res, 400, ok.error().message);
    auto r = request_of(body, tasks);
    if (!r)
      return refuse(res, r.error().code == errc::not_found ? 404 : 400, r.error().message);
    auto until = deadline_of(body, lim);
    if (!until)
      return refuse(res, 400, until.error().message);
    if (!svc.can_judge(env::eval_request{r->task, r->candidate, r->seed, r->use_cache}))
      return refuse(res, 400, nodes_only);
    auto t = svc.submit(std::move(*r));
    if (!t.e) {
      auto [status, why] = refusal(t.how, t.id);
      if (status == 429)
        res.set_header("Retry-After", "5");
      return refuse(res, status, why);
    }
    auto a = answer(svc, t, *until);
    reply(res, a["state"] == "judged" ? 200 : 202, a);
  });
  post_any_type(srv, "/v1/prompt", [&](const httplib::Request& req, httplib::Response& res) {
    const auto parsed = parse_json(req.body);
    if (!parsed)
      return refuse(res, 400, "the body is not JSON");
    const json_value& body = *parsed;
    if (auto ok = only_fields(body, {"task", "task_source", "hardware", "exemplars", "turns", "turns_total"}, "the request");
        !ok)
      return refuse(res, 400, ok.error().message);
    const auto hw = svc.hardware();
    auto p = prompt_of(body, tasks, prompts, hw.empty() ? std::string{} : hw.front(), svc, feedback);
    if (!p)
      return refuse(res, p.error().code == errc::not_found ? 404 : p.error().code == errc::busy ? 409 : 400,
                    p.error().message);
    reply(res, 200, *p);
  });
  post_any_type(srv, "/v1/evaluate/batch", [&](const httplib::Request& req, httplib::Response& res) {
    const auto parsed = parse_json(req.body);
    if (!parsed)
      return refuse(res, 400, "the body is not JSON");
    const json_value& body = *parsed;
    const json_value* requests = body.find("requests");
    if (requests == nullptr || !requests->is_array())
      return refuse(res, 400, "a batch is {\"requests\": [...]}");
    if (auto ok = only_fields(body, {"requests", "timeout_s"}, "the batch"); !ok)
      return refuse(res, 400, ok.error().message);
    auto until = deadline_of(body, lim);
    if (!until)
      return refuse(res, 400, until.error().message);
    // Each item is admitted on its own (a full queue refuses the rest, each saying so), then
    // all are waited for together.
    std::vector<json> results(requests->as_array().size());
    std::vector<std::pair<std::size_t, service::verdict_service::ticket>> admitted;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const json_value& item = requests->as_array()[i];
      if (auto ok = only_fields(item, {"id", "candidate", "task", "task_source", "seed", "cache"},
                                "requests[" + std::to_string(i) + "]");
          !ok) {
        results[i] = json{{"error", ok.error().message}};
        continue;
      }
      auto r = request_of(item, tasks);
      if (!r) {
        results[i] = json{{"error", r.error().message}};
        continue;
      }
      if (!svc.can_judge(env::eval_request{r->task, r->candidate, r->seed, r->use_cache})) {
        results[i] = json{{"error", nodes_only}};
        continue;
      }
      auto t = svc.submit(std::move(*r));
      if (!t.e)
        results[i] = json{{"id", t.id}, {"error", refusal(t.how, t.id).second}};
      else
        admitted.emplace_back(i, std::move(t));
    }
    for (const auto& [i, t] : admitted)
      results[i] = answer(svc, t, *until);
    reply(res, 200, json{{"results", results}});
  });
  answer_exceptions(srv, [](httplib::Response& res, const std::string& why) { refuse(res, 500, why); });
  answer_library_errors(srv, lim.max_request_bytes, "--max-request-kb",
                        [](httplib::Response& res, int status, const std::string& why) { refuse(res, status, why); });
  srv.set_payload_max_length(lim.max_request_bytes);
}

// The evaluators of nodes that joined (crucible evaluator --join, docs/scaling.md), behind the run's
// evaluator pool actor: a request goes to the pool as a candidate of a registered task, and the
// pool gives it to the node device with the shortest queue (a node that leaves has its candidates
// sent to another). Nodes know the registered suite only, draw fresh inputs (seed 0) and read the
// verdict cache: other requests are not theirs.
class nodes_judge final : public service::judge {
public:
  nodes_judge(caf::actor_system& sys, evaluator_pool_actor pool, std::shared_ptr<const task_catalog> tasks,
              double timeout_s)
      : sys_(sys), pool_(std::move(pool)), tasks_(std::move(tasks)), timeout_s_(timeout_s) {}
  std::string device() const override { return "nodes"; }
  std::string hardware() const override {
    std::lock_guard lock{m_};
    return hardware_;
  }
  bool takes(const env::eval_request& r) const override { return devices_.load() > 0 && could_take(r); }
  bool could_take(const env::eval_request& r) const override {
    if (r.seed != 0 || !r.use_cache)
      return false;
    auto it = tasks_->find(task_id{r.target.name});
    return it != tasks_->end() && it->second.sha256 == r.target.sha256;
  }
  std::optional<env::verdict> evaluate(const env::eval_request& r) override {
    caf::scoped_actor self{sys_};
    std::optional<env::verdict> out;
    candidate c{variant_id{++next_variant_}, task_id{r.target.name}, r.candidate, "", false, false};
    self->request(pool_, std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s_ * 1000)), std::move(c))
      .receive([&](verdict& v) { out = std::move(v); },
               [&](const caf::error& e) {
                 // No node device now (all left), or every queue full: back to the queue; the
                 // next look at the pool decides whether this judge takes requests again.
                 const auto err = to_error(e);
                 if (err.code == errc::busy)
                   std::this_thread::sleep_for(std::chrono::milliseconds(200));
                 else
                   devices_ = 0;
               });
    return out;
  }
  // The pool's devices, asked for again (every heartbeat): how many, and their models.
  void refresh() {
    caf::scoped_actor self{sys_};
    self->request(pool_, std::chrono::seconds(5), caf::get_atom_v)
      .receive(
        [&](const std::vector<device_info>& ds) {
          std::string names;
          for (const auto& d : ds)
            names += (names.empty() ? "" : ", ") + d.name;
          std::lock_guard lock{m_};
          hardware_ = names;
          devices_ = ds.size();
        },
        [&](const caf::error&) {});
  }
  std::size_t devices() const { return devices_.load(); }

private:
  caf::actor_system& sys_;
  evaluator_pool_actor pool_;
  std::shared_ptr<const task_catalog> tasks_;
  double timeout_s_;
  std::atomic<std::size_t> devices_{0};
  mutable std::mutex m_;
  std::string hardware_;
  std::atomic<std::uint64_t> next_variant_{1ull << 62}; // the service's own variant ids, apart from a run's
};

int run_serve(const parsed_args& args) {
  auto where = listen_option(args, "127.0.0.1:8470");
  if (!where) {
    std::fprintf(stderr, "crucible serve: %s\n", where.error().message.c_str());
    return exit_usage;
  }
  auto token_read = token_option(args);
  if (!token_read) {
    std::fprintf(stderr, "crucible serve: %s\n", token_read.error().message.c_str());
    return exit_usage;
  }
  const std::string token = *token_read;
  auto loaded = config_option(args);
  if (!loaded) {
    std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
    return exit_usage;
  }
  const config cfg = *loaded;
  auto queue = int_option(args, "--queue", 64, 1, 1'000'000);
  auto max_kb = int_option(args, "--max-request-kb", 4096, 1, 1 << 20);
  if (const auto* bad = first_error(queue, max_kb)) {
    std::fprintf(stderr, "crucible serve: %s\n", bad->message.c_str());
    return exit_usage;
  }
  std::vector<std::string> devices = args.all("--device");
  if (devices.empty())
    devices = cfg.evaluator.devices;
  // --device none: no device of this machine; every verdict is a node's (--join-listen).
  if (devices == std::vector<std::string>{"none"})
    devices.clear();
  const bool nodes = args.has("--join-listen");
  if (devices.empty() && !nodes) {
    std::fprintf(stderr, "crucible serve: --device none needs --join-listen: nothing would judge the requests\n");
    return exit_usage;
  }
  auto node_concurrency = int_option(args, "--node-concurrency", 8, 1, 4096);
  if (!node_concurrency) {
    std::fprintf(stderr, "crucible serve: %s\n", node_concurrency.error().message.c_str());
    return exit_usage;
  }
  std::string join_token = token;
  if (args.has("--join-token-file")) {
    auto t = read_token_file(args.get("--join-token-file"));
    if (!t) {
      std::fprintf(stderr, "crucible serve: --join-token-file %s\n", t.error().message.c_str());
      return exit_usage;
    }
    join_token = *t;
  }
  // The registered suite: tasks.suite of the configuration, or --suite.
  task_registry tasks;
  tasks.suite = shipped_path(args.get("--suite", cfg.tasks.suite));
  auto indexed = env::index_tasks(tasks.suite);
  if (!indexed) {
    std::fprintf(stderr, "crucible serve: --suite %s\n", indexed.error().message.c_str());
    return exit_usage;
  }
  for (auto& t : *indexed)
    tasks.by_name.emplace(t.name, std::move(t));

  // The contrastive prompt of /v1/prompt: prompt.template within prompt.max_tokens, counted with
  // --tokenizer's encoding, else estimated as a token per 3 bytes of UTF-8.
  std::shared_ptr<const policy::tokenizer> tok;
  if (args.has("--tokenizer")) {
    auto loaded_tok = policy::tokenizer::load(args.get("--tokenizer"));
    if (!loaded_tok) {
      std::fprintf(stderr, "crucible serve: --tokenizer %s\n", loaded_tok.error().message.c_str());
      return exit_usage;
    }
    tok = std::make_shared<const policy::tokenizer>(std::move(*loaded_tok));
  }
  auto template_file = env::resolve_prompt_template(cfg.prompt.template_file);
  auto templ = template_file ? env::load_prompt_template(*template_file) : result<env::prompt_template>{template_file.error()};
  if (!templ) {
    std::fprintf(stderr, "crucible serve: prompt.template: %s\n", templ.error().message.c_str());
    return exit_usage;
  }
  env::token_counter count = [tok](std::string_view text) -> std::size_t {
    return tok ? tok->encode(text, true).size() : (text.size() + 2) / 3;
  };
  auto prompts = env::prompt_builder::create(std::move(*templ), cfg.prompt, env::chat_format{}, std::move(count));
  if (!prompts) {
    std::fprintf(stderr, "crucible serve: %s\n", prompts.error().message.c_str());
    return exit_usage;
  }
  // The feedback of /v1/prompt's multi-turn form (prompt.feedback_template).
  auto feedback = env::load_configured_feedback_template(cfg.prompt.feedback_template);
  if (!feedback) {
    std::fprintf(stderr, "crucible serve: prompt.feedback_template: %s\n", feedback.error().message.c_str());
    return exit_usage;
  }

  system_clock clk;
  logger log{clk, args.has("--verbose") ? log_level::debug : log_level::warn};
  auto made = env::make_device_evaluators(cfg.evaluator, cfg.reward, devices, log,
                                          args.has("--no-cache") ? env::verdict_cache_use::none
                                                                 : env::verdict_cache_use::configured);
  if (!made) {
    std::fprintf(stderr, "crucible serve: %s\n", made.error().message.c_str());
    return exit_failure;
  }
  // Evaluator nodes (--join-listen): the run's machinery as `crucible train` has it, an evaluator
  // pool the membership actor fills with the nodes' evaluators. The actor system outlives the
  // service, whose threads talk to the pool.
  actor_config acfg;
  if (nodes)
    acfg.load<caf::io::middleman>();
  caf::actor_system sys{acfg};
  service::service_options sopt;
  sopt.queue_limit = *queue;
  sopt.concurrency = cfg.evaluator.concurrency;
  service::verdict_service svc{std::move(*made), sopt, log};
  std::optional<membership_handle> members;
  std::shared_ptr<nodes_judge> node_judge;
  std::thread watcher;
  std::mutex watch_m;
  std::condition_variable watch_cv;
  bool watch_stop = false;
  if (nodes) {
    auto catalog = std::make_shared<task_catalog>();
    for (const auto& [name, t] : tasks.by_name)
      catalog->emplace(task_id{name}, t);
    auto pool = spawn_evaluator_pool(sys, {}, evaluator_pool_options::from(cfg));
    membership_options mopt;
    mopt.listen = args.get("--join-listen");
    mopt.token = join_token;
    mopt.run = "serve";
    mopt.config_yaml = to_yaml(cfg);
    mopt.heartbeat = std::chrono::milliseconds(static_cast<std::int64_t>(cfg.membership.heartbeat_s * 1000));
    mopt.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(cfg.membership.timeout_s * 1000));
    auto h = start_membership(sys, membership_deps{pool, catalog, &log}, std::move(mopt));
    if (!h) {
      std::fprintf(stderr, "crucible serve: --join-listen %s: %s\n", args.get("--join-listen").c_str(),
                   h.error().message.c_str());
      caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
      return exit_usage;
    }
    members = *h;
    node_judge = std::make_shared<nodes_judge>(sys, pool, catalog, cfg.evaluator.run_timeout_s * 4 + 600);
    svc.add_judge(node_judge, *node_concurrency);
    // The pool's devices, looked at every heartbeat: a node that joined or left changes what the
    // nodes' judge takes.
    const auto every = std::chrono::milliseconds(static_cast<std::int64_t>(cfg.membership.heartbeat_s * 1000));
    watcher = std::thread([&, every] {
      std::unique_lock lock{watch_m};
      while (!watch_stop) {
        lock.unlock();
        const auto before = node_judge->devices();
        node_judge->refresh();
        if (node_judge->devices() != before) {
          log.info("serve", "evaluator nodes: ", node_judge->devices(), " devices (", node_judge->hardware(), ")");
          svc.wake();
        }
        lock.lock();
        watch_cv.wait_for(lock, every, [&] { return watch_stop; });
      }
    });
  }
  auto stop_nodes = [&] {
    if (!nodes)
      return;
    {
      std::lock_guard lock{watch_m};
      watch_stop = true;
    }
    watch_cv.notify_all();
    if (watcher.joinable())
      watcher.join();
    if (members)
      stop_membership(sys, *members);
  };
  serve_limits lim;
  lim.max_request_bytes = static_cast<std::size_t>(*max_kb) * 1024;
  httplib::Server srv;
  add_routes(srv, svc, tasks, lim, token, *prompts, *feedback);
  const int bound = bind_server(srv, *where);
  if (bound <= 0) {
    std::fprintf(stderr, "crucible serve: cannot listen on %s\n", args.get("--listen", "127.0.0.1:8470").c_str());
    stop_nodes();
    return exit_failure;
  }
  if (members)
    std::printf("crucible serve: evaluator nodes join at %s (crucible evaluator --join %s --token-file ...)\n",
                members->endpoint().c_str(), members->endpoint().c_str());
  std::printf("crucible serve: listening on http://%s:%d (%zu tasks of %s; devices", where->host.c_str(), bound,
              tasks.by_name.size(), tasks.suite.c_str());
  for (const auto& d : svc.devices())
    std::printf(" %s", d.c_str());
  std::printf(")\n");
  std::fflush(stdout);
  listen_until_signal(srv);
  stop_nodes();
  std::printf("crucible serve: stopped\n");
  return exit_ok;
}

#else

int run_serve(const parsed_args&) { return no_http_server("serve"); }

#endif

} // namespace

command serve_command() {
  return {{"serve", "--token-file FILE [--listen HOST:PORT] [options]",
           "Serve the evaluator over HTTP/JSON, for other trainers (docs/service.md)",
           "Puts the evaluator pool behind an HTTP/JSON API: POST /v1/evaluate judges one (task,\n"
           "candidate) as `crucible eval` does and answers its verdict; POST /v1/evaluate/batch takes\n"
           "{\"requests\": [...]}; GET /v1/evaluations/ID asks again for a request by its id;\n"
           "GET /v1/tasks lists the registered suite; POST /v1/prompt gives a task's contrastive prompt\n"
           "(prompt.template, with the exemplars the request carries); GET /v1/health and /v1/metrics.\n"
           "Every request carries 'Authorization: Bearer TOKEN', the token of --token-file. A request\n"
           "with an id is judged once however often it is sent. A full queue answers 429 at once.\n"
           "Listens on loopback unless --public. Prints 'listening on http://HOST:PORT' when ready\n"
           "(--listen 127.0.0.1:0 takes a free port); SIGINT or SIGTERM stop it.",
           {},
           {{"--listen", "HOST:PORT", "where to listen (default 127.0.0.1:8470; port 0: any free one)"},
            {"--public", "", "allow a --listen address that is not loopback"},
            {"--token-file", "FILE", "the token every request must carry (one word, 16 characters or more)"},
            {"--device", "DEVICE", "cpu or cuda:N (default: evaluator.devices); several: the flag again; none: "
                                   "only nodes judge (--join-listen)", true},
            {"--join-listen", "HOST:PORT", "evaluator nodes join here (crucible evaluator --join; port 0: any free "
                                           "one); their devices judge registered tasks beside this machine's"},
            {"--join-token-file", "FILE", "the token nodes present (default: --token-file's)"},
            {"--node-concurrency", "N", "requests in flight on the nodes together, at most (default 8)"},
            {"--suite", "DIR", "the registered tasks (default: tasks.suite)"},
            {"--queue", "N", "requests waiting or being judged, at most (default 64)"},
            {"--tokenizer", "DIR", "count /v1/prompt's budget (prompt.max_tokens) in this tokenizer's tokens (default: "
                                   "a token per 3 bytes)"},
            {"--max-request-kb", "N", "largest request body (default 4096)"},
            {"--config", "CONFIG", "take evaluator and reward settings from a configuration file"},
            {"--set", "KEY=VALUE", "override a configuration key, e.g. --set evaluator.concurrency=2", true},
            {"--no-cache", "", "neither read nor write the verdict cache (evaluator.cache)"},
            {"--verbose", "", "log each verdict and the evaluator's progress to stderr"}}},
          run_serve};
}

} // namespace crucible::cli
