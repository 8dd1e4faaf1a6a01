#include "tools/crucible/serve_common.hpp"

#include <csignal>
#include <cstdio>

#include "core/host_port.hpp"
#include "core/token.hpp"

namespace crucible::cli {

namespace {

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

} // namespace

result<listen_address> listen_option(const parsed_args& args, const std::string& fallback) {
  const auto listen = args.get("--listen", fallback);
  const auto address = split_host_port(listen);
  if (!address)
    return fail(errc::invalid_arg, "--listen ", listen, " is not HOST:PORT (port 0..65535)");
  listen_address out{address->host, address->port};
  if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']') // [::1]:8470
    out.host = out.host.substr(1, out.host.size() - 2);
  if (!loopback(out.host) && !args.has("--public"))
    return fail(errc::invalid_arg, "--listen ", listen, " is not a loopback address; add --public to serve other machines");
  return out;
}

result<std::string> token_option(const parsed_args& args) {
  if (!args.has("--token-file"))
    return fail(errc::invalid_arg, "missing --token-file FILE (the token every request must carry)");
  auto read = read_token_file(args.get("--token-file"));
  if (!read)
    return fail(read.error().code, "--token-file ", read.error().message);
  if (read->size() < 16 || read->find_first_of(" \t") != std::string::npos)
    return fail(errc::invalid_arg, "the token in ", args.get("--token-file"), " must be one word of at least 16 characters");
  return *read;
}

bool bearer_matches(const std::string& authorization, const std::string& token) {
  const std::string want = "Bearer " + token;
  if (authorization.size() != want.size())
    return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    diff |= static_cast<unsigned char>(authorization[i] ^ want[i]);
  return diff == 0;
}

int no_http_server(const char* command) {
  std::fprintf(stderr, "crucible %s: this build has no HTTP server (cpp-httplib was not found when it was configured; "
                       "tools/setup.sh installs libcpp-httplib-dev)\n", command);
  return 1;
}

#ifdef CRUCIBLE_HAVE_HTTPLIB

void answer_exceptions(httplib::Server& srv, std::function<void(httplib::Response&, const std::string&)> answer) {
  srv.set_exception_handler([answer](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string why = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      why = std::string{"internal error: "} + e.what();
    } catch (...) {
    }
    answer(res, why);
  });
}

void answer_library_errors(httplib::Server& srv, std::size_t limit_bytes, const std::string& limit_flag,
                           std::function<void(httplib::Response&, int, const std::string&)> answer) {
  srv.set_error_handler(httplib::Server::HandlerWithResponse{[=](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty())
      return httplib::Server::HandlerResponse::Unhandled; // a handler's own answer
    std::string why;
    switch (res.status) {
      case 413:
        why = "the request body is larger than this server's limit of " + std::to_string(limit_bytes) + " bytes (" + limit_flag + ")";
        break;
      case 404:
        why = "no endpoint " + req.method + " " + req.path;
        break;
      case 405:
        why = "method " + req.method + " is not allowed on " + req.path;
        break;
      case 400:
        why = "the request could not be read as HTTP (a malformed header, a bad Content-Length or chunked body)";
        break;
      default:
        why = "HTTP " + std::to_string(res.status) + " answered by the server library";
    }
    answer(res, res.status, why);
    return httplib::Server::HandlerResponse::Handled;
  }});
}

void post_any_type(httplib::Server& srv, const std::string& pattern, httplib::Server::Handler handler) {
  srv.Post(pattern, [handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    std::string body;
    const bool whole = read([&](const char* data, std::size_t n) {
      body.append(data, n);
      return true;
    });
    if (!whole) {
      if (res.status < 400)
        res.status = 400;
      return;
    }
    httplib::Request with = req;
    with.body = std::move(body);
    handler(with, res);
  });
}

namespace {

httplib::Server* running = nullptr; // for the signal handler: stop() is safe from it

void stop_on_signal(int) {
  if (running != nullptr)
    running->stop();
}

} // namespace

int bind_server(httplib::Server& srv, const listen_address& where) {
  if (where.port == 0)
    return srv.bind_to_any_port(where.host);
  return srv.bind_to_port(where.host, where.port) ? where.port : -1;
}

void listen_until_signal(httplib::Server& srv) {
  running = &srv;
  std::signal(SIGINT, stop_on_signal);
  std::signal(SIGTERM, stop_on_signal);
  srv.listen_after_bind();
  running = nullptr;
}

#endif

} // namespace crucible::cli
