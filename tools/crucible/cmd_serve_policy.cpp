// `crucible serve-policy`: a model directory behind an OpenAI-compatible endpoint
// (docs/service.md): /v1/completions and /v1/chat/completions with streaming, n samples and the
// sampled tokens' log-probs, over crucible's own engine (service/policy_service.hpp batches the
// requests). The official `openai` client, vLLM's clients and crucible's `policy.backend: openai`
// talk to it unchanged.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "core/log.hpp"
#include "jinja/jinja.hpp"
#include "policy/model/engine.hpp"
#include "policy/model/model_config.hpp"
#include "service/policy_service.hpp"
#include "text/tokenizer.hpp"
#include "tools/crucible/commands.hpp"
#include "tools/crucible/serve_common.hpp"

namespace crucible::cli {

namespace {

#ifdef CRUCIBLE_HAVE_HTTPLIB

namespace fs = std::filesystem;
using nlohmann::json;
using clock_type = std::chrono::steady_clock;

// The served model and what requests are checked against. Read-only once serving.
struct served_model {
  std::string name;
  std::shared_ptr<const policy::tokenizer> tok;
  std::optional<jinja::program> chat; // the tokenizer's chat template, when it has one and is used
  bool plain = false;                 // chat as crucible's plain prompts: the contents by blank lines, special tokens added
  std::string chat_why;               // why the chat template is not used (plain), for the banner
  std::map<std::string, std::string> special;
  std::vector<std::int32_t> eos_ids;
  std::int64_t vocab = 0;
  std::int64_t context = 0;       // prompt plus completion tokens, at most
  std::int64_t max_tokens = 2048; // the most a request may ask for, and chat's default
  std::int64_t created = 0;
};

// An error as OpenAI's API answers it: {"error": {"message", "type", "param", "code"}}.
// The largest request body serve-policy reads.
constexpr std::size_t max_request_bytes = static_cast<std::size_t>(64) << 20;

struct api_error {
  int status = 400;
  std::string message;
  std::string param;
  std::string type = "invalid_request_error";
  std::string code;

  api_error(int status_, std::string message_, std::string param_ = {}, std::string type_ = "invalid_request_error",
            std::string code_ = {})
      : status(status_), message(std::move(message_)), param(std::move(param_)), type(std::move(type_)),
        code(std::move(code_)) {}
};

json error_body(const api_error& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const api_error& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e)), "application/json");
}

api_error bad(std::string param, std::string message) { return api_error{400, std::move(message), std::move(param)}; }

enum class api_kind { completions, chat };

// A request, checked: the engine's job and how to answer.
struct request_plan {
  api_kind kind = api_kind::completions;
  service::generation_job job;
  std::int64_t n = 1;
  bool stream = false, include_usage = false;
  bool logprobs = false;      // the sampled tokens' log-probs
  bool token_ids = false;     // return_token_ids: each choice's token ids, the prompts' too
  bool tokens_as_ids = false; // return_tokens_as_token_ids: logprobs' tokens spelled "token_id:N"
  bool skip_special = true;   // skip_special_tokens (vLLM's, default true): special tokens left out of the text
  std::string id;
};

std::string random_id(const char* prefix) {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock{m};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}

// Reads an optional field of a type; an error names the field.
struct fields {
  const json_value& body;

  /// The field, or nullptr where it is absent or null.
  const json_value* find(const char* key) const {
    const auto* v = body.find(key);
    return v == nullptr || v->is_null() ? nullptr : v;
  }
  std::optional<api_error> number(const char* key, double lo, double hi, double& out) const {
    if (const auto* v = find(key)) {
      if (!v->is_number() || v->as_double() < lo || v->as_double() > hi)
        return bad(key, std::string{"'"} + key + "' must be a number in [" + json(lo).dump() + ", " + json(hi).dump() + "]");
      out = v->as_double();
    }
    return std::nullopt;
  }
  std::optional<api_error> integer(const char* key, std::int64_t lo, std::int64_t hi, std::int64_t& out) const {
    if (const auto* v = find(key)) {
      if (!v->is_int() || v->as_int() < lo || v->as_int() > hi)
        return bad(key, std::string{"'"} + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
      out = v->as_int();
    }
    return std::nullopt;
  }
  std::optional<api_error> boolean(const char* key, bool& out) const {
    if (const auto* v = find(key)) {
      if (!v->is_bool())
        return bad(key, std::string{"'"} + key + "' must be true or false");
      out = v->as_bool();
    }
    return std::nullopt;
  }
};

bool is_text(const json_value* v, std::string_view text) { return v != nullptr && v->is_string() && v->as_string() == text; }

// Parameters of OpenAI's API this engine does not implement: refused when set to anything but
// their neutral value, never silently ignored.
std::optional<api_error> unsupported(const fields& f) {
  for (const char* key : {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"})
    if (const auto* v = f.find(key); v != nullptr && !(v->is_number() && v->as_double() == (key[0] == 'r' ? 1.0 : 0.0)))
      return bad(key, std::string{"'"} + key + "' is not supported by crucible's engine; leave it out");
  if (const auto* v = f.find("logit_bias"); v != nullptr && !(v->is_object() && v->as_object().empty()))
    return bad("logit_bias", "'logit_bias' is not supported by crucible's engine; leave it out");
  for (const char* key : {"tools", "functions"})
    if (const auto* v = f.find(key); v != nullptr && !(v->is_array() && v->as_array().empty()))
      return bad(key, std::string{"'"} + key + "' (tool calls) is not supported by crucible's engine");
  if (const auto* v = f.find("tool_choice"); v != nullptr && !is_text(v, "none") && !is_text(v, "auto"))
    return bad("tool_choice", "'tool_choice' (tool calls) is not supported by crucible's engine");
  if (const auto* v = f.find("response_format"); v != nullptr && !is_text(v->find("type"), "text"))
    return bad("response_format", "'response_format' other than {\"type\": \"text\"} is not supported by crucible's engine");
  if (const auto* v = f.find("echo"); v != nullptr && !(v->is_bool() && !v->as_bool()))
    return bad("echo", "'echo' is not supported by crucible's engine");
  if (const auto* v = f.find("suffix"); v != nullptr && !is_text(v, ""))
    return bad("suffix", "'suffix' is not supported by crucible's engine");
  return std::nullopt;
}

// The prompts of /v1/completions: a string, strings, token ids, or lists of token ids.
std::variant<std::vector<std::vector<std::int32_t>>, api_error> completion_prompts(const json_value& p, const served_model& m) {
  std::vector<std::vector<std::int32_t>> out;
  auto ids_of = [&](const json_value& a) -> std::optional<std::vector<std::int32_t>> {
    std::vector<std::int32_t> ids;
    for (const auto& x : a.as_array()) {
      if (!x.is_int() || x.as_int() < 0 || x.as_int() >= m.vocab)
        return std::nullopt;
      ids.push_back(static_cast<std::int32_t>(x.as_int()));
    }
    return ids;
  };
  const auto vocab_error = bad("prompt", "'prompt' holds a token id that is not an integer in [0, " + std::to_string(m.vocab) + ")");
  const bool list = p.is_array() && !p.as_array().empty();
  if (p.is_string()) {
    out.push_back(m.tok->encode(p.as_string()));
  } else if (list && p.as_array().front().is_string()) {
    for (const auto& s : p.as_array()) {
      if (!s.is_string())
        return bad("prompt", "'prompt' mixes strings with other values");
      out.push_back(m.tok->encode(s.as_string()));
    }
  } else if (list && p.as_array().front().is_array()) {
    for (const auto& a : p.as_array()) {
      if (!a.is_array())
        return bad("prompt", "'prompt' mixes lists of token ids with other values");
      auto ids = ids_of(a);
      if (!ids)
        return vocab_error;
      out.push_back(std::move(*ids));
    }
  } else if (list) {
    auto ids = ids_of(p);
    if (!ids)
      return vocab_error;
    out.push_back(std::move(*ids));
  } else {
    return bad("prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists");
  }
  if (out.size() > 1024)
    return bad("prompt", "'prompt' holds more than 1024 prompts");
  for (const auto& ids : out)
    if (ids.empty())
      return bad("prompt", "a prompt encodes to no tokens");
  return out;
}

// The prompt of /v1/chat/completions: the messages through the model's chat template.
std::variant<std::vector<std::int32_t>, api_error> chat_prompt(const json_value& messages, const served_model& m) {
  if (!m.chat && !m.plain)
    return api_error{400, "the model " + m.name + " has no chat template (tokenizer_config.json chat_template); use "
                          "/v1/completions"};
  if (!messages.is_array() || messages.as_array().empty())
    return bad("messages", "'messages' must be a non-empty list of {\"role\", \"content\"}");
  std::vector<jinja::chat_message> msgs;
  for (std::size_t i = 0; i < messages.as_array().size(); ++i) {
    const auto& x = messages.as_array()[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    const auto* role = x.find("role");
    if (role == nullptr || !role->is_string())
      return bad(where, "'" + where + "' has no 'role' string");
    jinja::chat_message msg{role->as_string(), {}};
    const auto* content = x.find("content");
    if (content == nullptr || content->is_null()) {
    } else if (content->is_string()) {
      msg.content = content->as_string();
    } else if (content->is_array()) { // [{"type": "text", "text": ...}, ...]
      for (const auto& part : content->as_array()) {
        const auto* text = part.find("text");
        if (!is_text(part.find("type"), "text") || text == nullptr || !text->is_string())
          return bad(where, "'" + where + ".content' holds a part that is not {\"type\": \"text\", \"text\": ...}");
        msg.content += text->as_string();
      }
    } else {
      return bad(where, "'" + where + ".content' must be a string or a list of text parts");
    }
    msgs.push_back(std::move(msg));
  }
  if (m.plain) {
    // As crucible's rollouts write a prompt with prompt.chat_template none (env/prompt/prompt.cpp): each
    // message's content, separated by a blank line, encoded with the tokenizer's special tokens.
    std::string text;
    for (std::size_t i = 0; i < msgs.size(); ++i)
      text += (i == 0 ? "" : "\n\n") + msgs[i].content;
    auto ids = m.tok->encode(text, true);
    if (ids.empty())
      return bad("messages", "the messages encode to no tokens");
    return ids;
  }
  auto text = jinja::render_chat(*m.chat, msgs, m.special, true);
  if (!text)
    return bad("messages", "the chat template refused the messages: " + text.error().message);
  auto ids = m.tok->encode(*text, false); // the template wrote the special tokens, as apply_chat_template does
  if (ids.empty())
    return bad("messages", "the messages encode to no tokens");
  return ids;
}

std::variant<request_plan, api_error> plan_request(const json_value& body, api_kind kind, const served_model& m) {
  if (!body.is_object())
    return bad("", "the body is not a JSON object");
  request_plan r;
  r.kind = kind;
  const fields f{body};
  if (const auto* model = f.find("model"); model != nullptr && !is_text(model, m.name))
    return api_error{404, "The model '" + (model->is_string() ? model->as_string() : to_json_text(*model)) +
                              "' does not exist; this server serves '" + m.name + "' (GET /v1/models)",
                     "model", "invalid_request_error", "model_not_found"};
  if (auto e = unsupported(f))
    return *e;
  auto& so = r.job.options;
  if (auto e = f.integer("n", 1, 128, r.n))
    return *e;
  so.samples_per_prompt = r.n;
  if (const auto* best = f.find("best_of"); best != nullptr && !(best->is_int() && best->as_int() == r.n))
    return bad("best_of", "'best_of' other than n is not supported by crucible's engine");
  if (auto e = f.number("temperature", 0, 2, so.temperature))
    return *e;
  if (auto e = f.number("top_p", 0, 1, so.top_p))
    return *e;
  if (so.top_p <= 0)
    return bad("top_p", "'top_p' must be above 0");
  std::int64_t top_k = 0;
  if (auto e = f.integer("top_k", -1, std::int64_t{1} << 31, top_k)) // vLLM's: -1 or 0, off
    return *e;
  so.top_k = std::max<std::int64_t>(0, top_k);
  std::int64_t max_tokens = kind == api_kind::completions ? 16 : -1; // OpenAI's defaults: 16, and the context's rest
  const char* max_key = kind == api_kind::chat && f.find("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = f.integer(max_key, 1, m.max_tokens, max_tokens))
    return *e;
  if (const auto* stop = f.find("stop")) {
    if (stop->is_string()) {
      so.stop.push_back(stop->as_string());
    } else if (stop->is_array() && stop->as_array().size() <= 16) {
      for (const auto& s : stop->as_array()) {
        if (!s.is_string())
          return bad("stop", "'stop' must be a string or a list of at most 16 strings");
        so.stop.push_back(s.as_string());
      }
    } else {
      return bad("stop", "'stop' must be a string or a list of at most 16 strings");
    }
    if (std::find(so.stop.begin(), so.stop.end(), std::string{}) != so.stop.end())
      return bad("stop", "'stop' holds an empty string");
  }
  if (const auto* seed = f.find("seed")) {
    if (!seed->is_int() && !seed->is_uint())
      return bad("seed", "'seed' must be an integer");
    // A negative seed is taken modulo 2^64, as a 64-bit seed above 2^63 is taken as it is.
    so.seed = seed->is_int() ? static_cast<std::uint64_t>(seed->as_int()) : seed->as_uint();
    r.job.seeded = true;
  }
  if (auto e = f.boolean("stream", r.stream))
    return *e;
  if (const auto* opts = f.find("stream_options")) {
    if (!opts->is_object())
      return bad("stream_options", "'stream_options' must be an object");
    if (auto e = fields{*opts}.boolean("include_usage", r.include_usage))
      return *e;
  }
  if (auto e = f.boolean("return_token_ids", r.token_ids))
    return *e;
  if (auto e = f.boolean("return_tokens_as_token_ids", r.tokens_as_ids))
    return *e;
  if (auto e = f.boolean("skip_special_tokens", r.skip_special))
    return *e;
  if (kind == api_kind::completions) {
    std::int64_t lp = -1;
    if (auto e = f.integer("logprobs", 0, 5, lp))
      return *e;
    if (lp > 0)
      return bad("logprobs", "'logprobs' above 0 (alternatives per token) is not supported: crucible's engine reports "
                             "the sampled token's log-probability only (logprobs: 0)");
    r.logprobs = lp == 0;
    const auto* prompt = f.find("prompt");
    if (prompt == nullptr)
      return bad("prompt", "the request has no 'prompt'");
    auto p = completion_prompts(*prompt, m);
    if (auto* e = std::get_if<api_error>(&p))
      return *e;
    r.job.prompts = std::move(std::get<0>(p));
    r.id = random_id("cmpl-");
  } else {
    if (auto e = f.boolean("logprobs", r.logprobs))
      return *e;
    std::int64_t top = 0;
    if (auto e = f.integer("top_logprobs", 0, 20, top))
      return *e;
    if (top > 0)
      return bad("top_logprobs", "'top_logprobs' above 0 is not supported: crucible's engine reports the sampled "
                                 "token's log-probability only");
    const auto* messages = f.find("messages");
    if (messages == nullptr)
      return bad("messages", "the request has no 'messages'");
    auto p = chat_prompt(*messages, m);
    if (auto* e = std::get_if<api_error>(&p))
      return *e;
    r.job.prompts.push_back(std::move(std::get<0>(p)));
    r.id = random_id("chatcmpl-");
  }
  std::int64_t longest = 0;
  for (const auto& p : r.job.prompts)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(p.size()));
  if (max_tokens < 0) // chat without a limit: the rest of the context, at most --max-tokens
    max_tokens = std::min(m.max_tokens, m.context - longest);
  if (longest + max_tokens > m.context || max_tokens < 1)
    return bad(max_key, "This model's maximum context length is " + std::to_string(m.context) + " tokens; the prompt has " +
                            std::to_string(longest) + " and " + max_key + " asks for " + std::to_string(max_tokens));
  if (static_cast<std::int64_t>(r.job.prompts.size()) * r.n > 4096)
    return bad("n", "prompts times n is above 4096 completions");
  so.max_new_tokens = max_tokens;
  so.eos_ids = m.eos_ids;
  return r;
}

const char* finish_name(policy::finish_reason f) { return f == policy::finish_reason::length ? "length" : "stop"; }

// The text of `c` a stream may show now: with `final`, the completion's text; otherwise the
// decoded tokens less an eos, less a tail that may still become a stop string or is an
// incomplete UTF-8 character.
std::string visible_text(const request_plan& r, const policy::completion& c, const served_model& m, bool final) {
  const auto& so = r.job.options;
  const policy::detokenize_fn detok = [&](std::span<const std::int32_t> ids) { return m.tok->decode(ids, r.skip_special); };
  if (final)
    return policy::completion_text(c, detok);
  std::span<const std::int32_t> ids{c.tokens};
  if (!ids.empty() && std::find(so.eos_ids.begin(), so.eos_ids.end(), ids.back()) != so.eos_ids.end())
    ids = ids.first(ids.size() - 1);
  std::string text = detok(ids);
  static const std::string replacement = "\xEF\xBF\xBD";
  while (text.size() >= 3 && text.compare(text.size() - 3, 3, replacement) == 0)
    text.resize(text.size() - 3);
  std::size_t hold = 0;
  for (const auto& s : so.stop)
    hold = std::max(hold, s.size() - 1);
  text.resize(text.size() - std::min(hold, text.size()));
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) // a cut character's tail bytes
    text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) // its lead byte
    text.pop_back();
  return text;
}

// The log-probs of tokens [from, to) of `c`, in the API's form (chat: content entries; completions:
// the legacy lists).
json logprobs_json(const request_plan& r, const policy::completion& c, std::size_t from, std::size_t to,
                   const served_model& m, std::size_t text_offset) {
  json tokens = json::array(), values = json::array(), offsets = json::array(), content = json::array();
  for (std::size_t i = from; i < to && i < c.tokens.size(); ++i) {
    const std::int32_t id = c.tokens[i];
    std::string spelled = r.tokens_as_ids ? "token_id:" + std::to_string(id)
                                          : m.tok->decode(std::span<const std::int32_t>(&c.tokens[i], 1));
    const double lp = c.logprobs[i];
    if (r.kind == api_kind::chat) {
      json bytes = json::array();
      for (unsigned char b : r.tokens_as_ids ? m.tok->decode(std::span<const std::int32_t>(&c.tokens[i], 1)) : spelled)
        bytes.push_back(static_cast<int>(b));
      content.push_back(json{{"token", spelled}, {"logprob", lp}, {"bytes", bytes}, {"top_logprobs", json::array()}});
    } else {
      offsets.push_back(text_offset);
      text_offset += spelled.size();
      tokens.push_back(std::move(spelled));
      values.push_back(lp);
    }
  }
  if (r.kind == api_kind::chat)
    return json{{"content", content}};
  return json{{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", nullptr}, {"text_offset", offsets}};
}

json usage_json(const request_plan& r, const std::vector<policy::completion>& cs) {
  std::int64_t prompt = 0, completion = 0;
  for (const auto& p : r.job.prompts)
    prompt += static_cast<std::int64_t>(p.size());
  for (const auto& c : cs)
    completion += static_cast<std::int64_t>(c.tokens.size());
  return json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json response_head(const request_plan& r, const served_model& m, bool chunk) {
  const char* object = r.kind == api_kind::chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json{{"id", r.id}, {"object", object}, {"created", static_cast<std::int64_t>(std::time(nullptr))}, {"model", m.name}};
}

std::size_t choice_index(const request_plan& r, const policy::completion& c) {
  return c.prompt_index * static_cast<std::size_t>(r.n) + c.sample_index;
}

json full_response(const request_plan& r, const served_model& m, std::vector<policy::completion> cs) {
  std::sort(cs.begin(), cs.end(), [&](const auto& a, const auto& b) { return choice_index(r, a) < choice_index(r, b); });
  json choices = json::array();
  for (const auto& c : cs) {
    const auto text = visible_text(r, c, m, true);
    json choice{{"index", choice_index(r, c)}, {"finish_reason", finish_name(c.finish)}};
    if (r.kind == api_kind::chat)
      choice["message"] = json{{"role", "assistant"}, {"content", text}};
    else
      choice["text"] = text;
    choice["logprobs"] = r.logprobs ? logprobs_json(r, c, 0, c.tokens.size(), m, 0) : json(nullptr);
    if (c.finish == policy::finish_reason::stop)
      choice["stop_reason"] = c.stop_string;
    if (r.token_ids)
      choice["token_ids"] = c.tokens;
    choices.push_back(std::move(choice));
  }
  auto out = response_head(r, m, false);
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(r, cs);
  if (r.token_ids)
    out["prompt_token_ids"] = r.job.prompts.size() == 1 ? json(r.job.prompts.front()) : json(r.job.prompts);
  return out;
}

// What a stream has sent of each choice.
struct stream_progress {
  std::vector<std::size_t> tokens, text_bytes;
  std::vector<std::string> text;
  std::vector<bool> started;
};

// The chunks that bring the client from `sent` to `cs` (final: to the end, finish reasons too).
std::vector<json> stream_chunks(const request_plan& r, const served_model& m, const std::vector<policy::completion>& cs,
                                stream_progress& sent, bool final) {
  std::vector<json> out;
  for (const auto& c : cs) {
    const auto i = choice_index(r, c);
    if (sent.tokens.size() <= i) {
      sent.tokens.resize(i + 1, 0);
      sent.text_bytes.resize(i + 1, 0);
      sent.text.resize(i + 1);
      sent.started.resize(i + 1, false);
    }
    const std::string now = visible_text(r, c, m, final);
    std::string delta;
    if (now.size() > sent.text[i].size() && now.compare(0, sent.text[i].size(), sent.text[i]) == 0) {
      delta = now.substr(sent.text[i].size());
      sent.text[i] = now;
    }
    const bool new_tokens = c.tokens.size() > sent.tokens[i];
    if (delta.empty() && !final && sent.started[i] && !(new_tokens && (r.logprobs || r.token_ids)))
      continue; // nothing to show yet (a held-back tail)
    json choice{{"index", i}, {"finish_reason", final ? json(finish_name(c.finish)) : json(nullptr)}};
    if (r.kind == api_kind::chat) {
      json d = json::object();
      if (!sent.started[i])
        d["role"] = "assistant";
      if (!delta.empty() || !sent.started[i])
        d["content"] = delta;
      choice["delta"] = d;
    } else {
      choice["text"] = delta;
    }
    choice["logprobs"] = r.logprobs && new_tokens ? logprobs_json(r, c, sent.tokens[i], c.tokens.size(), m, sent.text_bytes[i])
                                                  : json(nullptr);
    if (r.token_ids && new_tokens)
      choice["token_ids"] = std::vector<std::int32_t>(c.tokens.begin() + static_cast<std::ptrdiff_t>(sent.tokens[i]), c.tokens.end());
    if (final && c.finish == policy::finish_reason::stop)
      choice["stop_reason"] = c.stop_string;
    sent.text_bytes[i] = sent.text[i].size();
    sent.tokens[i] = c.tokens.size();
    sent.started[i] = true;
    auto chunk = response_head(r, m, true);
    chunk["choices"] = json::array({choice});
    out.push_back(std::move(chunk));
  }
  return out;
}

api_error refusal(service::policy_service::admission how) {
  if (how == service::policy_service::admission::full)
    return api_error{429, "the server's queue is full; retry later", "", "rate_limit_error", "rate_limit_exceeded"};
  return api_error{503, "the server is stopping", "", "server_error", ""};
}

api_error engine_failure(const crucible::error& e) {
  if (e.code == errc::invalid_arg)
    return api_error{400, e.message};
  return api_error{e.code == errc::cancelled ? 503 : 500, e.message, "", "server_error", ""};
}

void handle_generation(service::policy_service& svc, const served_model& m, api_kind kind, const httplib::Request& req,
                       httplib::Response& res) {
  const auto body = parse_json(req.body);
  if (!body)
    return send_error(res, bad("", "the body is not JSON"));
  auto planned = plan_request(*body, kind, m);
  if (auto* e = std::get_if<api_error>(&planned))
    return send_error(res, *e);
  auto plan = std::make_shared<request_plan>(std::move(std::get<request_plan>(planned)));
  auto t = svc.submit(plan->job);
  if (!t.state) {
    if (t.how == service::policy_service::admission::full)
      res.set_header("Retry-After", "1");
    return send_error(res, refusal(t.how));
  }
  if (!plan->stream) {
    std::uint64_t seen = 0;
    service::policy_service::snapshot snap;
    do
      snap = service::policy_service::wait(*t.state, seen, clock_type::now() + std::chrono::hours(24));
    while (!snap.finished);
    if (snap.failure)
      return send_error(res, engine_failure(*snap.failure));
    res.set_content(dump(full_response(*plan, m, std::move(snap.completions))), "application/json");
    return;
  }
  // Server-sent events: a chunk per choice as its tokens reach the host, the finish reasons, the
  // usage when asked for, then [DONE]. A client that goes away abandons the job.
  auto state = t.state;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [plan, state, &m](std::size_t, httplib::DataSink& sink) {
    auto send = [&](const json& j) {
      const std::string line = "data: " + dump(j) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    stream_progress sent;
    std::uint64_t seen = 0;
    for (;;) {
      auto snap = service::policy_service::wait(*state, seen, clock_type::now() + std::chrono::seconds(1));
      if (snap.failure) {
        send(error_body(engine_failure(*snap.failure)));
        break;
      }
      bool alive = sink.is_writable();
      for (const auto& chunk : stream_chunks(*plan, m, snap.completions, sent, snap.finished))
        alive = alive && send(chunk);
      if (!alive) {
        std::lock_guard lock{state->mutex};
        state->abandoned = true;
        return false;
      }
      if (snap.finished) {
        if (plan->include_usage) {
          auto usage = response_head(*plan, m, true);
          usage["choices"] = json::array();
          usage["usage"] = usage_json(*plan, snap.completions);
          send(usage);
        }
        break;
      }
    }
    const std::string done = "data: [DONE]\n\n";
    sink.write(done.data(), done.size());
    sink.done();
    return true;
  });
}

void add_routes(httplib::Server& srv, service::policy_service& svc, const served_model& m, const std::string& token) {
  srv.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") // liveness only, as vLLM's: no token
      return httplib::Server::HandlerResponse::Unhandled;
    const auto auth = req.get_header_value("Authorization");
    if (!bearer_matches(auth, token)) {
      send_error(res, api_error{401, auth.empty() ? "no token: send 'Authorization: Bearer TOKEN'" : "wrong token", "",
                                "authentication_error", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  srv.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  srv.Get("/v1/models", [&m](const httplib::Request&, httplib::Response& res) {
    json model{{"id", m.name}, {"object", "model"}, {"created", m.created}, {"owned_by", "crucible"},
               {"max_model_len", m.context}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  srv.Get("/metrics", [&svc](const httplib::Request&, httplib::Response& res) {
    const auto c = svc.counters();
    std::ostringstream o;
    auto metric = [&](const char* name, const char* type, auto value) {
      o << "# TYPE crucible_policy_" << name << " " << type << "\ncrucible_policy_" << name << " " << value << "\n";
    };
    metric("queued", "gauge", c.queued);
    metric("running", "gauge", c.running);
    metric("requests_finished_total", "counter", c.finished);
    metric("requests_failed_total", "counter", c.failed);
    metric("refused_full_total", "counter", c.refused_full);
    metric("engine_calls_total", "counter", c.engine_calls);
    metric("engine_seconds_total", "counter", c.engine_seconds);
    metric("prompt_tokens_total", "counter", c.prompt_tokens);
    metric("generated_tokens_total", "counter", c.generated_tokens);
    res.set_content(o.str(), "text/plain; version=0.0.4");
  });
  post_any_type(srv, "/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    handle_generation(svc, m, api_kind::completions, req, res);
  });
  post_any_type(srv, "/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    handle_generation(svc, m, api_kind::chat, req, res);
  });
  answer_library_errors(srv, max_request_bytes, "64 MiB, fixed",
                        [](httplib::Response& res, int status, const std::string& why) {
                          send_error(res, api_error{status, status == 404 ? why + " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models)" : why,
                                                    "", status >= 500 ? "server_error" : "invalid_request_error", ""});
                        });
  answer_exceptions(srv, [](httplib::Response& res, const std::string& why) {
    send_error(res, api_error{500, why, "", "server_error", ""});
  });
}

int run_serve_policy(const parsed_args& args) {
  auto fail_usage = [](const std::string& why) {
    std::fprintf(stderr, "crucible serve-policy: %s\n", why.c_str());
    return exit_usage;
  };
  if (!args.has("--model"))
    return fail_usage("missing --model DIR; see 'crucible serve-policy --help'");
  auto where = listen_option(args, "127.0.0.1:8471");
  if (!where)
    return fail_usage(where.error().message);
  auto token = token_option(args);
  if (!token)
    return fail_usage(token.error().message);
  auto device = device_option(args, "--device", "cpu");
  auto queue = int_option(args, "--queue", 256, 1, 1'000'000);
  auto batch = int_option(args, "--max-batch", 64, 1, 4096);
  auto max_tokens = int_option(args, "--max-tokens", 2048, 1, 1 << 24);
  auto sync = int_option(args, "--sync-interval", 0, 0, 1024);
  if (const auto* e = first_error(device, queue, batch, max_tokens, sync))
    return fail_usage(e->message);
  const auto dtype = args.get("--dtype");
  if (!dtype.empty() && dtype != "bfloat16" && dtype != "float16" && dtype != "float32")
    return fail_usage("--dtype: expected bfloat16, float16 or float32, got '" + dtype + "'");
  const fs::path model_dir = args.get("--model");
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return fail_usage("--model " + model_dir.string() + ": no such directory");

  served_model m;
  auto tok = policy::tokenizer::load(args.get("--tokenizer", model_dir.string()));
  if (!tok)
    return fail_usage("--tokenizer: " + tok.error().message);
  m.tok = std::make_shared<const policy::tokenizer>(std::move(*tok));
  // How the model's prompts were written in training: --chat-template, else the checkpoint's
  // policy::prompt_format_file (a run with prompt.chat_template none trained on plain text), else auto.
  std::string format = args.get("--chat-template");
  std::string format_from = "--chat-template";
  if (format.empty()) {
    format = "auto";
    format_from = "";
    if (fs::exists(model_dir / policy::prompt_format_file, ec)) {
      auto text = read_file(model_dir / policy::prompt_format_file);
      auto doc = text ? parse_json(*text) : result<json_value>{text.error()};
      const json_value* chat_template = doc ? doc->find("chat_template") : nullptr;
      if (chat_template == nullptr || !chat_template->is_string())
        return fail_usage((model_dir / policy::prompt_format_file).string() + ": not {\"chat_template\": \"auto\" | \"none\"}");
      format = chat_template->as_string();
      format_from = (model_dir / policy::prompt_format_file).string();
    }
  }
  if (format != "auto" && format != "none")
    return fail_usage((format_from.empty() ? std::string{"--chat-template"} : format_from) + ": expected auto or none, got '" + format + "'");
  if (format == "none") {
    m.plain = true;
    m.chat_why = format_from == "--chat-template" ? "--chat-template none" : "trained with prompt.chat_template none (" + format_from + ")";
  } else if (!m.tok->chat_template().empty()) {
    auto chat = jinja::program::parse(m.tok->chat_template(), "chat_template");
    if (!chat)
      return fail_usage("the model's chat template: " + chat.error().message);
    m.chat.emplace(std::move(*chat));
    m.special = m.tok->special_tokens_map();
  }
  policy::engine_options eo;
  eo.device = *device;
  eo.dtype = dtype;
  eo.cuda_graphs = !args.has("--no-graphs");
  // Tokens reach the host (and a stream) every sync interval: each step on the CPU, where a copy
  // costs nothing, every 16 on a GPU, where it stalls the device.
  eo.sync_interval = *sync > 0 ? *sync : (eo.device == "cpu" ? 1 : 16);
  auto engine = policy::engine::load(model_dir, eo);
  if (!engine)
    return fail_usage("--model: " + engine.error().message);
  const auto& cfg = (*engine)->config();
  m.vocab = cfg.vocab_size;
  m.context = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096;
  m.max_tokens = std::min<std::int64_t>(*max_tokens, m.context);
  for (auto id : cfg.eos_token_ids)
    if (id >= 0 && id < m.vocab)
      m.eos_ids.push_back(static_cast<std::int32_t>(id));
  if (auto id = m.tok->eos_id(); id && *id < m.vocab && std::find(m.eos_ids.begin(), m.eos_ids.end(), *id) == m.eos_ids.end())
    m.eos_ids.push_back(*id);
  m.name = args.get("--served-model-name", fs::weakly_canonical(model_dir).filename().string());
  m.created = static_cast<std::int64_t>(std::time(nullptr));

  system_clock clk;
  logger log{clk, args.has("--verbose") ? log_level::debug : log_level::warn};
  service::policy_service_options so;
  so.queue_limit = *queue;
  so.max_batch_rows = *batch;
  auto tokenizer = m.tok;
  service::policy_service svc{std::move(*engine),
                              [tokenizer](std::span<const std::int32_t> ids) { return tokenizer->decode(ids); }, so, log};
  httplib::Server srv;
  add_routes(srv, svc, m, *token);
  srv.set_payload_max_length(max_request_bytes);
  const int bound = bind_server(srv, *where);
  if (bound <= 0) {
    std::fprintf(stderr, "crucible serve-policy: cannot listen on %s\n", args.get("--listen", "127.0.0.1:8471").c_str());
    return exit_failure;
  }
  std::printf("crucible serve-policy: listening on http://%s:%d/v1 (model '%s' on %s, context %lld tokens%s)\n",
              where->host.c_str(), bound, m.name.c_str(), eo.device.c_str(), static_cast<long long>(m.context),
              m.chat ? ", chat template" : m.plain ? (", chat as plain text: " + m.chat_why).c_str() : "");
  std::fflush(stdout);
  listen_until_signal(srv);
  std::printf("crucible serve-policy: stopped\n");
  return exit_ok;
}

#else

int run_serve_policy(const parsed_args&) { return no_http_server("serve-policy"); }

#endif

} // namespace

command serve_policy_command() {
  return {{"serve-policy", "--model DIR --token-file FILE [--listen HOST:PORT] [options]",
           "Serve a model over an OpenAI-compatible API (docs/service.md)",
           "Puts a model directory (a trained policy's export, or any Llama/Qwen2 model) behind\n"
           "OpenAI's API, sampled by crucible's engine: POST /v1/completions (prompt: text, texts or\n"
           "token ids), POST /v1/chat/completions (through the tokenizer's chat template), GET\n"
           "/v1/models, GET /metrics (Prometheus text) and GET /health (no token). Supports stream\n"
           "(server-sent events), n, temperature, top_p, top_k, max_tokens, stop, seed, the sampled\n"
           "tokens' log-probs (logprobs: 0 for completions, logprobs: true for chat; under the\n"
           "temperature-scaled distribution) and vLLM's return_token_ids and\n"
           "return_tokens_as_token_ids and skip_special_tokens (default true); parameters the engine lacks (penalties, logit_bias, tools,\n"
           "alternatives per token) are refused, never ignored. Concurrent requests that sample\n"
           "alike are batched into one engine call; a request with a seed runs alone and gives the\n"
           "same completions each time. Every request but /health carries 'Authorization: Bearer\n"
           "TOKEN' (the openai client's api_key). Listens on loopback unless --public; prints\n"
           "'listening on http://HOST:PORT/v1' when ready; SIGINT or SIGTERM stop it.\n"
           "  crucible serve-policy --model runs/exp1/export --token-file token --listen 127.0.0.1:0",
           {},
           {{"--model", "DIR", "Hugging Face model directory (config.json, safetensors, tokenizer.json)"},
            {"--token-file", "FILE", "the token every request must carry (one word, 16 characters or more)"},
            {"--listen", "HOST:PORT", "where to listen (default 127.0.0.1:8471; port 0: any free one)"},
            {"--public", "", "allow a --listen address that is not loopback"},
            {"--served-model-name", "NAME", "the model's name in the API (default: the directory's name)"},
            {"--tokenizer", "DIR", "tokenizer directory (default: --model)"},
            {"--chat-template", "auto|none", "how chat messages become a prompt: the tokenizer's chat template (auto), or "
                                             "crucible's plain text (none); default: the model's crucible_prompt.json, else auto"},
            {"--device", "DEVICE", "cpu or cuda:N (default cpu)"},
            {"--dtype", "TYPE", "bfloat16, float16 or float32 (default: bfloat16 on CUDA, float32 on the CPU)"},
            {"--max-tokens", "N", "the most tokens a request may ask for, and chat's default (default 2048)"},
            {"--max-batch", "N", "completions one engine call samples together, at most (default 64)"},
            {"--queue", "N", "requests waiting or running, at most; more are answered 429 (default 256)"},
            {"--sync-interval", "N", "decoding steps between token copies to the host, a stream's granularity "
                                     "(default: 1 on the CPU, 16 on a GPU)"},
            {"--no-graphs", "", "do not capture decoding steps in CUDA graphs"},
            {"--verbose", "", "log the server's work to stderr"}}},
          run_serve_policy};
}

} // namespace crucible::cli
