// storage/event_publisher.cpp: ZeroMQ PUB/SUB for the run's live events.
#include "storage/event_publisher.hpp"

#include <iterator>
#include <string>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace crucible::storage {

namespace {

// libzmq spells "any free port" as '*'; the configuration uses the usual port 0.
std::string bindable(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) == 0 && endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
    return endpoint.substr(0, endpoint.size() - 1) + "*";
  return endpoint;
}

} // namespace

struct event_publisher::impl {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::pub};
  std::string endpoint;
  std::uint64_t sent = 0;
  std::uint64_t dropped = 0;
};

event_publisher::event_publisher(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
event_publisher::event_publisher(event_publisher&&) noexcept = default;
event_publisher& event_publisher::operator=(event_publisher&&) noexcept = default;
event_publisher::~event_publisher() = default;

result<event_publisher> event_publisher::bind(const std::string& endpoint, int send_hwm) {
  auto p = std::make_unique<impl>();
  try {
    // A short linger lets the last records (run_finished) reach connected watchers on exit;
    // with no subscriber a PUB socket holds nothing, so closing never waits then.
    p->sock.set(zmq::sockopt::linger, 1000);
    p->sock.set(zmq::sockopt::sndhwm, send_hwm);
    // A plain PUB socket drops silently at the high-water mark; with xpub_nodrop a send that
    // cannot be queued fails with EAGAIN instead (dontwait), so the drops can be counted.
    p->sock.set(zmq::sockopt::xpub_nodrop, 1);
    p->sock.bind(bindable(endpoint));
    p->endpoint = p->sock.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return fail(errc::invalid_arg, "run.publish: cannot bind '", endpoint, "': ", e.what());
  }
  return event_publisher{std::move(p)};
}

const std::string& event_publisher::endpoint() const noexcept { return impl_->endpoint; }
std::uint64_t event_publisher::sent() const noexcept { return impl_->sent; }
std::uint64_t event_publisher::dropped() const noexcept { return impl_->dropped; }

bool event_publisher::publish(std::string_view topic, std::string_view json) {
  try {
    // dontwait: at the high-water mark the send fails at once (see xpub_nodrop in bind()).
    // The frames of a message are queued together: the first is refused when the whole would be.
    auto a = impl_->sock.send(zmq::buffer(topic.data(), topic.size()), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (a) {
      auto b = impl_->sock.send(zmq::buffer(json.data(), json.size()), zmq::send_flags::dontwait);
      if (b) {
        ++impl_->sent;
        return true;
      }
    }
  } catch (const zmq::error_t&) {
  }
  ++impl_->dropped;
  return false;
}

struct event_subscriber::impl {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::sub};
  std::string endpoint;
};

event_subscriber::event_subscriber(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
event_subscriber::event_subscriber(event_subscriber&&) noexcept = default;
event_subscriber& event_subscriber::operator=(event_subscriber&&) noexcept = default;
event_subscriber::~event_subscriber() = default;

result<event_subscriber> event_subscriber::connect(const std::string& endpoint) {
  auto p = std::make_unique<impl>();
  p->endpoint = endpoint;
  try {
    p->sock.set(zmq::sockopt::linger, 0);
    p->sock.set(zmq::sockopt::subscribe, "");
    p->sock.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return fail(errc::invalid_arg, "cannot connect to '", endpoint, "': ", e.what());
  }
  return event_subscriber{std::move(p)};
}

result<std::optional<published_event>> event_subscriber::receive(std::chrono::milliseconds timeout) {
  try {
    zmq::pollitem_t item{static_cast<void*>(impl_->sock), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0)
      return std::optional<published_event>{};
    std::vector<zmq::message_t> parts;
    auto got = zmq::recv_multipart(impl_->sock, std::back_inserter(parts), zmq::recv_flags::dontwait);
    if (!got)
      return std::optional<published_event>{};
    if (parts.size() != 2)
      return fail(errc::io, impl_->endpoint, ": expected a message of 2 frames (topic, JSON), got ", std::to_string(parts.size()));
    return std::optional<published_event>{published_event{parts[0].to_string(), parts[1].to_string()}};
  } catch (const zmq::error_t& e) {
    return fail(errc::io, impl_->endpoint, ": ", e.what());
  }
}

} // namespace crucible::storage
