// env/device_gate.cpp: see device_gate.hpp.
#include "env/device_gate.hpp"

#include <algorithm>
#include <functional>
#include <thread>

namespace crucible::env {

namespace {
std::uint64_t ns_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}
} // namespace

void device_gate::note_locked(event::kind_t kind, clock::time_point now) {
  if (recording_)
    events_.push_back({std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(), kind,
                       std::hash<std::thread::id>{}(std::this_thread::get_id())});
}

void device_gate::record(bool on) {
  std::lock_guard lock{mtx_};
  recording_ = on;
}

std::vector<device_gate::event> device_gate::take_events() {
  std::lock_guard lock{mtx_};
  return std::exchange(events_, {});
}

void device_gate::enter_locked(clock::time_point now) {
  if (untimed_ == 0 && !timed_)
    busy_since_ = now;
}

void device_gate::leave_locked(clock::time_point now) {
  if (untimed_ == 0 && !timed_)
    busy_ns_ += ns_between(busy_since_, now);
}

bool device_gate::untimed_may_enter() const {
  return !timed_ && timed_waiting_ == 0 && (share_ || untimed_ == 0);
}

void device_gate::enter_untimed_locked() {
  const auto now = clock::now();
  note_locked(event::untimed_enter, now);
  enter_locked(now);
  ++untimed_;
  max_untimed_ = std::max(max_untimed_, untimed_);
}

void device_gate::lock_untimed() {
  std::unique_lock lock{mtx_};
  if (!untimed_may_enter())
    note_locked(event::untimed_wait, clock::now());
  cv_.wait(lock, [&] { return untimed_may_enter(); });
  enter_untimed_locked();
}

bool device_gate::try_lock_untimed() {
  std::lock_guard lock{mtx_};
  if (!untimed_may_enter())
    return false;
  enter_untimed_locked();
  return true;
}

void device_gate::unlock_untimed() {
  {
    std::lock_guard lock{mtx_};
    const auto now = clock::now();
    note_locked(event::untimed_leave, now);
    --untimed_;
    leave_locked(now);
  }
  cv_.notify_all();
}

void device_gate::lock_timed() {
  std::unique_lock lock{mtx_};
  ++timed_waiting_;
  if (timed_ || untimed_ > 0)
    note_locked(event::timed_wait, clock::now());
  if (!timed_ && untimed_ > 0 && !draining_) {
    draining_ = true;
    drain_since_ = clock::now();
  }
  cv_.wait(lock, [&] { return !timed_ && untimed_ == 0; });
  --timed_waiting_;
  const auto now = clock::now();
  if (draining_) {
    drain_ns_ += ns_between(drain_since_, now);
    draining_ = false;
  }
  note_locked(event::timed_enter, now);
  enter_locked(now);
  timed_ = true;
  timed_since_ = now;
}

void device_gate::unlock_timed() {
  {
    std::lock_guard lock{mtx_};
    const auto now = clock::now();
    note_locked(event::timed_leave, now);
    timed_ = false;
    timed_ns_ += ns_between(timed_since_, now);
    leave_locked(now);
  }
  cv_.notify_all();
}

std::uint64_t device_gate::busy_ns() const {
  std::lock_guard lock{mtx_};
  return busy_ns_ + (untimed_ > 0 || timed_ ? ns_between(busy_since_, clock::now()) : 0);
}

std::uint64_t device_gate::timed_ns() const {
  std::lock_guard lock{mtx_};
  return timed_ns_ + (timed_ ? ns_between(timed_since_, clock::now()) : 0);
}

std::uint64_t device_gate::drain_ns() const {
  std::lock_guard lock{mtx_};
  return drain_ns_ + (draining_ ? ns_between(drain_since_, clock::now()) : 0);
}

int device_gate::timed_waiting() const {
  std::lock_guard lock{mtx_};
  return timed_waiting_;
}

int device_gate::max_untimed() const {
  std::lock_guard lock{mtx_};
  return max_untimed_;
}

} // namespace crucible::env
