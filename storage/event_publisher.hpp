// storage/event_publisher.hpp: the run's live event stream (`crucible watch`). The coordinator
// publishes every metrics record and a periodic heartbeat on a ZeroMQ PUB socket; watchers
// subscribe with event_subscriber. Messages have two frames: the topic (the record's `event`
// field, e.g. "run_started" or "heartbeat") and the one-line JSON record.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace crucible::storage {

/// A bound PUB socket. publish() never blocks: a message that the socket cannot queue (no
/// room below the send high-water mark) is dropped and counted. Movable, not copyable; not
/// thread-safe (one owner, the coordinator).
class event_publisher final {
public:
  /// Binds `endpoint` (tcp://HOST:PORT with PORT 0 for any free port, or ipc://PATH) with at
  /// most `send_hwm` messages queued per subscriber. errc::invalid_arg names an endpoint that
  /// cannot be bound.
  static result<event_publisher> bind(const std::string& endpoint, int send_hwm = 1000);

  event_publisher(event_publisher&&) noexcept;
  event_publisher& operator=(event_publisher&&) noexcept;
  event_publisher(const event_publisher&) = delete;
  event_publisher& operator=(const event_publisher&) = delete;
  ~event_publisher();

  /// The endpoint actually bound, with the chosen port (e.g. "tcp://127.0.0.1:40713").
  const std::string& endpoint() const noexcept;
  /// Queues one message without blocking; false (and dropped() grows) when it was dropped.
  bool publish(std::string_view topic, std::string_view json);
  std::uint64_t sent() const noexcept;
  std::uint64_t dropped() const noexcept;

private:
  struct impl;
  explicit event_publisher(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// One published message.
struct published_event {
  std::string topic;
  std::string json;
};

/// A SUB socket connected to a publisher, subscribed to every topic. Movable, not copyable.
class event_subscriber final {
public:
  /// Connects to `endpoint` (tcp://HOST:PORT or ipc://PATH). Connecting does not wait for the
  /// peer: a peer that is not there shows as receive() timing out. errc::invalid_arg names a
  /// malformed endpoint.
  static result<event_subscriber> connect(const std::string& endpoint);

  event_subscriber(event_subscriber&&) noexcept;
  event_subscriber& operator=(event_subscriber&&) noexcept;
  event_subscriber(const event_subscriber&) = delete;
  event_subscriber& operator=(const event_subscriber&) = delete;
  ~event_subscriber();

  /// The next message, waiting at most `timeout`; std::nullopt when none came in time.
  /// errc::io on a socket failure or a message that is not topic + JSON.
  result<std::optional<published_event>> receive(std::chrono::milliseconds timeout);

private:
  struct impl;
  explicit event_subscriber(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace crucible::storage
