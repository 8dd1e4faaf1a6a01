#include "actors/endpoint_engine.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_config.hpp"
#include "actors/waiting_requests.hpp"
#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/token.hpp"

#ifdef CRUCIBLE_HAVE_HTTPLIB
#  include <httplib.h>
#endif

namespace crucible {

result<endpoint_options> endpoint_options::from(const config& cfg) {
  const auto& p = cfg.policy;
  endpoint_options o;
  o.base_url = p.base_url;
  while (!o.base_url.empty() && o.base_url.back() == '/')
    o.base_url.pop_back();
  o.model = p.model;
  o.concurrency = static_cast<std::uint64_t>(std::max<std::int64_t>(1, p.concurrency));
  o.retries = static_cast<std::uint64_t>(std::max<std::int64_t>(0, p.retries));
  o.timeout_s = p.timeout_s;
  o.logprobs = p.logprobs;
  o.token_ids = p.token_ids;
  o.max_queued = static_cast<std::uint64_t>(std::max<std::int64_t>(1, cfg.engine.max_queued));
  if (!p.api_key_file.empty()) {
    auto key = read_token_file(p.api_key_file);
    if (!key)
      return fail(errc::config, "policy.api_key_file: ", key.error().message);
    o.api_key = *key;
  }
  return o;
}

#ifdef CRUCIBLE_HAVE_HTTPLIB

namespace {

// BASE_URL split into what httplib's client takes: "scheme://host:port" and the path prefix.
struct url_parts {
  std::string origin, prefix;
};

url_parts split_url(const std::string& base) {
  const auto scheme_end = base.find("://");
  const auto path_at = base.find('/', scheme_end == std::string::npos ? 0 : scheme_end + 3);
  if (path_at == std::string::npos)
    return {base, ""};
  return {base.substr(0, path_at), base.substr(path_at)};
}

std::unique_ptr<httplib::Client> make_client(const endpoint_options& opt) {
  auto c = std::make_unique<httplib::Client>(split_url(opt.base_url).origin);
  const auto whole = std::chrono::duration<double>(opt.timeout_s);
  const auto secs = static_cast<time_t>(opt.timeout_s);
  const auto usecs = static_cast<time_t>((whole.count() - static_cast<double>(secs)) * 1e6);
  c->set_connection_timeout(std::min<time_t>(secs, 30), 0);
  c->set_read_timeout(secs, usecs);
  c->set_write_timeout(std::min<time_t>(secs, 60), 0);
  c->set_keep_alive(true);
  if (!opt.api_key.empty())
    c->set_bearer_token_auth(opt.api_key);
  return c;
}

std::string cut(std::string s, std::size_t n = 300) {
  if (s.size() > n)
    s = s.substr(0, n) + "...";
  return s;
}

// The message of an error body ({"error": {"message"}} or {"error": "..."}), else the body cut.
std::string error_message(const std::string& body) {
  if (auto j = parse_json(body); j && j->is_object())
    if (const auto* e = j->find("error")) {
      if (e->is_string())
        return e->as_string();
      if (const auto* m = e->find("message"); m != nullptr && m->is_string())
        return m->as_string();
    }
  return cut(body);
}

bool retryable(int status) { return status == 408 || status == 429 || status >= 500; }

// One HTTP exchange with retries: the answer's body, or the error after the last try.
result<std::string> exchange(httplib::Client& client, const endpoint_options& opt, const std::string& method,
                             const std::string& path, const std::string& body) {
  const auto where = opt.base_url + path.substr(split_url(opt.base_url).prefix.size());
  double wait = opt.backoff_s;
  for (std::uint64_t attempt = 0;; ++attempt) {
    const auto res = method == "GET" ? client.Get(path) : client.Post(path, body, "application/json");
    std::string why;
    bool again = false;
    double retry_after = -1;
    if (!res) {
      why = "cannot reach " + where + ": " + httplib::to_string(res.error());
      again = true;
    } else if (res->status >= 200 && res->status < 300) {
      return res->body;
    } else {
      why = where + " answered " + std::to_string(res->status) + ": " + error_message(res->body);
      again = retryable(res->status);
      if (res->has_header("Retry-After"))
        try {
          retry_after = std::stod(res->get_header_value("Retry-After"));
        } catch (...) {
        }
      if (res->status == 401 || res->status == 403)
        return fail(errc::refused, why, " (policy.api_key_file)");
    }
    if (!again || attempt >= opt.retries)
      return fail(res ? errc::protocol : errc::io, why,
                  attempt > 0 ? " (after " + std::to_string(attempt + 1) + " tries)" : std::string{});
    const double s = std::min(30.0, retry_after >= 0 ? std::max(retry_after, wait) : wait);
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
    wait = std::min(30.0, wait * 2);
  }
}

// The chat completion request of `r`.
std::string request_body(const endpoint_options& opt, const generation_request& r) {
  json_writer w;
  w.begin_object().field("model", opt.model).key("messages").begin_array();
  for (const auto& m : r.messages)
    w.begin_object().field("role", m.role).field("content", m.content).end_object();
  w.end_array()
    .field("n", r.samples)
    .field("temperature", r.params.temperature)
    .field("top_p", r.params.top_p)
    .field("max_tokens", r.params.max_new_tokens);
  // No seed: an endpoint batches requests that carry none (crucible serve-policy samples a seeded
  // request alone, to reproduce it), and a batched server is not bit-reproducible anyway.
  if (r.params.top_k > 0)
    w.field("top_k", r.params.top_k);
  if (!r.params.stop.empty())
    w.field("stop", r.params.stop);
  if (opt.logprobs)
    w.field("logprobs", true);
  if (opt.token_ids)
    w.field("return_token_ids", true);
  w.end_object();
  return std::move(w).take();
}

// A chat completion's answer into the group's completions; errc::protocol naming what is wrong.
result<generation_result> parse_answer(const endpoint_options& opt, const generation_request& r, const std::string& text) {
  const auto garbage = [&](const std::string& what) {
    return fail(errc::protocol, opt.base_url, "/chat/completions answered what is not a chat completion (", what,
                "): ", cut(text, 200));
  };
  const auto doc = parse_json(text);
  const json_value* list = doc && doc->is_object() ? doc->find("choices") : nullptr;
  if (list == nullptr || !list->is_array())
    return garbage("no 'choices' list");
  const auto& choices = list->as_array();
  if (choices.size() != r.samples)
    return garbage(std::to_string(choices.size()) + " choices for n = " + std::to_string(r.samples));
  generation_result out;
  out.group = r.group;
  out.task = r.task;
  out.completions.resize(r.samples);
  std::vector<bool> seen(r.samples, false);
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    const auto* at = c.find("index");
    const std::size_t index = at != nullptr && at->is_uint() ? static_cast<std::size_t>(at->as_uint()) : i;
    if (index >= r.samples || seen[index])
      return garbage("choice index " + std::to_string(index) + " out of place");
    seen[index] = true;
    const auto* message = c.find("message");
    if (message == nullptr || !message->is_object())
      return garbage("choice " + std::to_string(index) + " has no message");
    const auto* content = message->find("content");
    if (content != nullptr && !content->is_string() && !content->is_null())
      return garbage("choice " + std::to_string(index) + "'s content is not text");
    auto& x = out.completions[index];
    x.text = content != nullptr && content->is_string() ? content->as_string() : std::string{};
    if (const auto* lp = c.find("logprobs"))
      if (const auto* lc = lp->find("content"); lc != nullptr && lc->is_array())
        for (const auto& t : lc->as_array())
          if (const auto* p = t.find("logprob"); p != nullptr && p->is_number())
            x.logprobs.push_back(static_cast<float>(p->as_double()));
    if (const auto* ids = c.find("token_ids"); ids != nullptr && ids->is_array())
      for (const auto& id : ids->as_array())
        if (id.is_int())
          x.token_ids.push_back(static_cast<std::int32_t>(id.as_int()));
    if (!x.token_ids.empty() && !x.logprobs.empty() && x.token_ids.size() != x.logprobs.size())
      x.logprobs.clear(); // they would not pair up
  }
  if (const auto* ids = doc->find("prompt_token_ids"); ids != nullptr && ids->is_array())
    for (const auto& id : ids->as_array())
      if (id.is_int())
        out.prompt_token_ids.push_back(static_cast<std::int32_t>(id.as_int()));
  return out;
}

// -- the worker: one connection, blocking calls on a thread of its own --------------------------

using endpoint_worker_actor = caf::typed_actor<caf::replies_to<generation_request>::with<generation_result>>;

struct worker_state {
  std::unique_ptr<httplib::Client> client;
  static inline const char* name = "crucible.endpoint_worker";
};

endpoint_worker_actor::behavior_type endpoint_worker(endpoint_worker_actor::stateful_pointer<worker_state> self,
                                                     endpoint_options opt, logger* log) {
  self->state.client = make_client(opt);
  return {
    [=](const generation_request& r) -> caf::result<generation_result> {
      if (r.messages.empty())
        return make_error(errc::invalid_arg, "generation request " + to_string(r.group) + ": no messages for the endpoint");
      if (r.samples < 1)
        return make_error(errc::invalid_arg, "generation request " + to_string(r.group) + ": samples must be at least 1");
      const auto path = split_url(opt.base_url).prefix + "/chat/completions";
      auto answer = exchange(*self->state.client, opt, "POST", path, request_body(opt, r));
      if (!answer) {
        log->warn("endpoint", "group ", r.group.value, ": ", answer.error().message);
        return make_error(answer.error());
      }
      auto parsed = parse_answer(opt, r, *answer);
      if (!parsed) {
        log->warn("endpoint", "group ", r.group.value, ": ", parsed.error().message);
        return make_error(parsed.error());
      }
      return std::move(*parsed);
    },
  };
}

// -- the front: the engine_actor interface, a queue, the idle workers ----------------------------

struct front_state {
  front_state() = default;
  endpoint_options opt;
  std::vector<endpoint_worker_actor> idle;
  std::deque<waiting_request> queue;
  engine_status status;
  static inline const char* name = "crucible.endpoint_engine";
};

using front_pointer = engine_actor::stateful_pointer<front_state>;

void pump(front_pointer self) {
  auto& st = self->state;
  while (!st.idle.empty() && !st.queue.empty()) {
    auto w = st.idle.back();
    st.idle.pop_back();
    auto job = std::move(st.queue.front());
    st.queue.pop_front();
    ++st.status.running;
    ++st.status.batches;
    auto rp = job.rp;
    self->request(w, caf::infinite, std::move(job.req))
      .then(
        [=](generation_result& r) mutable {
          auto& st = self->state;
          ++st.status.requests;
          st.status.samples += r.completions.size();
          --st.status.running;
          rp.deliver(std::move(r));
          st.idle.push_back(w);
          pump(self);
        },
        [=](const caf::error& e) mutable {
          auto& st = self->state;
          ++st.status.failed;
          --st.status.running;
          rp.deliver(e);
          st.idle.push_back(w);
          pump(self);
        });
  }
}

engine_actor::behavior_type endpoint_front(front_pointer self, endpoint_options opt, logger* log) {
  auto& st = self->state;
  st.opt = opt;
  for (std::uint64_t i = 0; i < opt.concurrency; ++i)
    st.idle.push_back(self->spawn<caf::detached + caf::linked>(endpoint_worker, opt, log));
  const auto unsupported = [](const char* what) {
    return make_error(errc::unsupported, std::string{what} + ": the policy is behind an endpoint (policy.backend openai); "
                                                              "nothing here trains it");
  };
  return {
    [=](generation_request& req) -> caf::result<generation_result> {
      return queue_generation(self, req, " for the endpoint", [](front_pointer s) { pump(s); });
    },
    [=](cancel_atom) {
      auto& st = self->state;
      st.status.cancelled += cancel_waiting_from(st.queue, self->current_sender(), "was sent");
    },
    [=](weight_update&) -> caf::result<policy_version> { return unsupported("weight_update"); },
    [=](weights_published&) -> caf::result<policy_version> { return unsupported("weights_published"); },
    [=](caf::get_atom) -> engine_status {
      auto out = self->state.status;
      out.queued = self->state.queue.size();
      return out;
    },
  };
}

} // namespace

result<void> check_endpoint(const endpoint_options& opt) {
  auto client = make_client(opt);
  auto quick = opt;
  quick.retries = std::min<std::uint64_t>(opt.retries, 2);
  auto answer = exchange(*client, quick, "GET", split_url(opt.base_url).prefix + "/models", "");
  if (!answer)
    return fail(answer.error().code, "policy.base_url: ", answer.error().message);
  const auto doc = parse_json(*answer);
  const json_value* data = doc && doc->is_object() ? doc->find("data") : nullptr;
  if (data == nullptr || !data->is_array())
    return fail(errc::protocol, "policy.base_url: ", opt.base_url, "/models answered what is not a model list: ", cut(*answer, 200));
  std::string served;
  for (const auto& m : data->as_array()) {
    const auto* id = m.find("id");
    if (id == nullptr || !id->is_string())
      continue;
    if (id->as_string() == opt.model)
      return {};
    served += (served.empty() ? "" : ", ") + id->as_string();
  }
  return fail(errc::not_found, "policy.model: '", opt.model, "' is not served by ", opt.base_url,
              served.empty() ? std::string{" (it lists no model)"} : "; it serves: " + served);
}

result<engine_actor> spawn_endpoint_engine(caf::actor_system& sys, endpoint_options opt, logger& log) {
  if (opt.base_url.rfind("http://", 0) != 0 && opt.base_url.rfind("https://", 0) != 0)
    return fail(errc::config, "policy.base_url: must start with http:// or https://, got '", opt.base_url, "'");
  if (opt.model.empty())
    return fail(errc::config, "policy.model: the endpoint's model name is required");
  opt.concurrency = std::max<std::uint64_t>(1, opt.concurrency);
  engine_actor h = sys.spawn(endpoint_front, std::move(opt), &log);
  return h;
}

#else

result<void> check_endpoint(const endpoint_options&) {
  return fail(errc::unsupported, "policy.backend openai: this build has no HTTP client (cpp-httplib was not found when it "
                                 "was configured; tools/setup.sh installs libcpp-httplib-dev)");
}

result<engine_actor> spawn_endpoint_engine(caf::actor_system&, endpoint_options, logger&) {
  return fail(errc::unsupported, "policy.backend openai: this build has no HTTP client (cpp-httplib was not found when it "
                                 "was configured; tools/setup.sh installs libcpp-httplib-dev)");
}

#endif

} // namespace crucible
