// env/device_gate.hpp: who uses an evaluator's device when. Timed rounds have the device to
// themselves; untimed work (workers' device initialisation, references, correctness trials)
// measures nothing, so several evaluations' untimed work may share the device. A timed user
// that waits goes first: no untimed user enters while one waits, and the untimed users inside
// finish their phase.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace crucible::env {

class device_gate {
public:
  /// share_untimed false: untimed users also take the device one at a time.
  explicit device_gate(bool share_untimed = true) : share_(share_untimed) {}
  device_gate(const device_gate&) = delete;
  device_gate& operator=(const device_gate&) = delete;

  void lock_untimed();
  /// lock_untimed() if it would not wait; false otherwise.
  bool try_lock_untimed();
  void unlock_untimed();
  void lock_timed();
  void unlock_timed();

  /// Nanoseconds during which at least one user held the device (union of all holds).
  std::uint64_t busy_ns() const;
  /// Nanoseconds during which a timed user held it.
  std::uint64_t timed_ns() const;
  /// Nanoseconds during which a timed user waited for untimed users inside to finish their phase
  /// (a timing was ready and the device was not being timed).
  std::uint64_t drain_ns() const;
  /// Most untimed users seen inside at once (for tests and figures).
  int max_untimed() const;
  /// Timed users waiting to enter (for tests).
  int timed_waiting() const;

  /// One step of a user through the gate, for timelines (tools/bench/bench_eval_throughput
  /// --timeline): what happened, when (steady clock), on which thread.
  struct event {
    enum kind_t : char {
      untimed_wait = 'w',
      untimed_enter = 'u',
      untimed_leave = 'x',
      timed_wait = 'W',
      timed_enter = 'T',
      timed_leave = 'X',
    };
    std::int64_t ns; // steady_clock::time_point::time_since_epoch()
    kind_t kind;
    std::size_t thread; // std::hash of std::this_thread::get_id()
  };
  /// Starts (or stops) keeping every event; off by default.
  void record(bool on);
  /// The events kept so far, oldest first; the gate keeps none after this.
  std::vector<event> take_events();

private:
  using clock = std::chrono::steady_clock;
  bool untimed_may_enter() const; // mtx_ held
  void enter_untimed_locked();
  void enter_locked(clock::time_point now); // first user in: the device becomes busy
  void leave_locked(clock::time_point now); // last user out
  void note_locked(event::kind_t kind, clock::time_point now);

  const bool share_;
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  int untimed_ = 0;
  int timed_waiting_ = 0;
  bool timed_ = false;
  int max_untimed_ = 0;
  clock::time_point busy_since_{};
  clock::time_point timed_since_{};
  bool draining_ = false; // a timed user waits for untimed users to leave
  clock::time_point drain_since_{};
  std::uint64_t drain_ns_ = 0;
  std::uint64_t busy_ns_ = 0;
  std::uint64_t timed_ns_ = 0;
  bool recording_ = false;
  std::vector<event> events_;
};

/// Holds the device for untimed work; release() ends the hold early.
class untimed_hold {
public:
  explicit untimed_hold(device_gate& g) : g_(&g) { g.lock_untimed(); }
  ~untimed_hold() { release(); }
  untimed_hold(const untimed_hold&) = delete;
  untimed_hold& operator=(const untimed_hold&) = delete;
  void release() {
    if (g_ != nullptr)
      std::exchange(g_, nullptr)->unlock_untimed();
  }
  bool held() const noexcept { return g_ != nullptr; }

private:
  device_gate* g_;
};

/// Holds the device for timed rounds.
class timed_hold {
public:
  explicit timed_hold(device_gate& g) : g_(g) { g.lock_timed(); }
  ~timed_hold() { g_.unlock_timed(); }
  timed_hold(const timed_hold&) = delete;
  timed_hold& operator=(const timed_hold&) = delete;

private:
  device_gate& g_;
};

} // namespace crucible::env
