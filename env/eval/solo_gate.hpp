// env/eval/solo_gate.hpp: evaluations beside each other, or one alone. A device evaluator runs several
// evaluations at once (evaluator.concurrency); one that ran out of device memory beside the others
// is retried alone (device_evaluator::evaluate): it waits until the evaluations running have
// ended, and none starts while it waits or runs, so a stream of new evaluations cannot keep it
// waiting for ever.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace crucible::env {

class solo_gate {
public:
  /// Enters beside the others (alone false: waits while an alone user waits or runs) or alone
  /// (waits until no user is inside).
  void enter(bool alone) {
    std::unique_lock lk{mtx_};
    if (alone) {
      ++waiting_;
      cv_.wait(lk, [&] { return running_ == 0 && !alone_; });
      --waiting_;
      alone_ = true;
    } else {
      cv_.wait(lk, [&] { return may_enter_beside(); });
      ++running_;
    }
  }
  /// enter(alone) if it would not wait; false otherwise.
  bool try_enter(bool alone) {
    std::lock_guard lk{mtx_};
    if (alone ? (running_ != 0 || alone_) : !may_enter_beside())
      return false;
    if (alone)
      alone_ = true;
    else
      ++running_;
    return true;
  }
  void leave(bool alone) {
    {
      std::lock_guard lk{mtx_};
      if (alone)
        alone_ = false;
      else
        --running_;
    }
    cv_.notify_all();
  }
  /// Users waiting to enter alone (for tests).
  std::int64_t waiting_alone() const {
    std::lock_guard lk{mtx_};
    return waiting_;
  }
  /// Whether a user is inside alone (for tests).
  bool alone_inside() const {
    std::lock_guard lk{mtx_};
    return alone_;
  }

private:
  bool may_enter_beside() const { return waiting_ == 0 && !alone_; } // mtx_ held

  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::int64_t running_ = 0; // users beside each other inside
  std::int64_t waiting_ = 0; // users waiting to enter alone
  bool alone_ = false;       // a user inside alone
};

/// One stay in a solo_gate, beside the others or alone.
class solo_hold {
public:
  solo_hold(solo_gate& g, bool alone) : g_{g}, alone_{alone} { g_.enter(alone_); }
  ~solo_hold() { g_.leave(alone_); }
  solo_hold(const solo_hold&) = delete;
  solo_hold& operator=(const solo_hold&) = delete;

private:
  solo_gate& g_;
  bool alone_;
};

} // namespace crucible::env
