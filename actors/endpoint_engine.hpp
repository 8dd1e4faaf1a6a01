// actors/endpoint_engine.hpp: an engine actor whose completions come from an OpenAI-compatible
// endpoint (policy.backend openai: vLLM, SGLang, `crucible serve-policy`, a hosted API) instead of
// crucible's own engine. Each generation request (one group) is one chat completion of the
// request's messages with n = its group size, `policy.concurrency` at a time; nothing trains the
// model, so weight messages are refused.
#pragma once

#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "actors/interfaces.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace crucible {

/// Where and how an endpoint engine samples. Value type; the `policy:` section converts into it.
struct endpoint_options {
  std::string base_url;          ///< e.g. http://127.0.0.1:8000/v1
  std::string model;             ///< the endpoint's model name
  std::string api_key;           ///< sent as "Authorization: Bearer KEY"; "": none
  std::uint64_t concurrency = 8; ///< requests in flight at most (≥ 1)
  std::uint64_t retries = 5;     ///< retries of a request that failed to connect or got 408, 429 or 5xx
  double timeout_s = 600.0;      ///< one request's limit
  bool logprobs = false;         ///< ask for the sampled tokens' log-probs
  bool token_ids = false;        ///< ask for token ids (return_token_ids)
  std::uint64_t max_queued = 64; ///< requests waiting for a free connection; more are errc::busy
  double backoff_s = 1.0;        ///< the first retry's wait; doubled each retry, at most 30 s

  /// The `policy:` section of `cfg`, the key read from policy.api_key_file (errc::config naming the
  /// key for an unreadable file or one others may read).
  static result<endpoint_options> from(const config& cfg);
};

/// GET BASE_URL/models: the endpoint answers and serves `opt.model`. errc::io for an endpoint that
/// cannot be reached, errc::refused for a key it refuses, errc::not_found naming the models it
/// serves when `opt.model` is not among them, errc::protocol for an answer that is not a model list.
result<void> check_endpoint(const endpoint_options& opt);

/// Spawns the endpoint engine: an engine_actor whose generation requests become chat completions
/// (the request's `messages`; sampling settings as they are, top_k only when set, the stop strings
/// cut from the text by the endpoint). A completion's text is the choice's message content; its
/// token ids and log-probs are the endpoint's when asked for and given, else empty; its policy
/// version is 0. A failed request is retried (connection failures, 408, 429, 5xx) after a backoff
/// that honours Retry-After, then answered with the error naming the endpoint, the status and its
/// message (logged too). weight_update and weights_published are errc::unsupported.
/// errc::unsupported in a build without cpp-httplib.
result<engine_actor> spawn_endpoint_engine(caf::actor_system& sys, endpoint_options opt, logger& log);

} // namespace crucible
