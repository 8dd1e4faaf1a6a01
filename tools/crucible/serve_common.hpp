// tools/crucible/serve_common.hpp: what `crucible serve` and `crucible serve-policy` share: the
// listen address (loopback unless --public), the token file, and stopping on SIGINT/SIGTERM.
#pragma once

#include <functional>
#include <string>

#include "core/error.hpp"
#include "tools/crucible/args.hpp"

#ifdef CRUCIBLE_HAVE_HTTPLIB
#  include <httplib.h>
#endif

namespace crucible::cli {

/// Where a server listens: --listen HOST:PORT (default `fallback`), an IPv6 host unbracketed.
struct listen_address {
  std::string host;
  int port = 0;
};

/// --listen, checked: HOST:PORT, and a loopback host unless --public. The message names the flag.
result<listen_address> listen_option(const parsed_args& args, const std::string& fallback);

/// --token-file, read and checked: required, owner-only, one word of at least 16 characters.
result<std::string> token_option(const parsed_args& args);

/// Whether `authorization` (the header's value) carries `token`, compared in constant time.
bool bearer_matches(const std::string& authorization, const std::string& token);

/// What a build without cpp-httplib answers for `command` (serve, serve-policy): exit 1, saying so.
int no_http_server(const char* command);

#ifdef CRUCIBLE_HAVE_HTTPLIB
/// An exception out of a handler is answered 500 through `answer(res, "internal error: WHAT")`.
void answer_exceptions(httplib::Server& srv, std::function<void(httplib::Response&, const std::string&)> answer);
/// An error answer the server library makes itself, with an empty body (a body over the limit,
/// no such endpoint, a malformed request), is given its reason through `answer(res, status, WHY)`:
/// 413 names `limit_bytes` and the flag that sets it (`limit_flag`), 404 the method and path.
void answer_library_errors(httplib::Server& srv, std::size_t limit_bytes, const std::string& limit_flag,
                           std::function<void(httplib::Response&, int, const std::string&)> answer);
/// A POST route whose body is read here, whatever its Content-Type (cpp-httplib refuses a body
/// sent as a form, curl -d's default, over 8 KiB with an empty 413, and Debian builds that limit
/// into its library): `handler` gets the request with its body. A body over the server's payload
/// limit is answered 413 (answer_library_errors gives the reason).
void post_any_type(httplib::Server& srv, const std::string& pattern, httplib::Server::Handler handler);
/// Binds `srv` to `where` (port 0: any free one); the port bound, or -1.
int bind_server(httplib::Server& srv, const listen_address& where);
/// Serves until SIGINT or SIGTERM (or srv.stop()).
void listen_until_signal(httplib::Server& srv);
#endif

} // namespace crucible::cli
