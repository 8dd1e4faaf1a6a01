// env/eval/device_gate.hpp: who uses an evaluator's device when. Timed rounds have the device to
// themselves; untimed work (references, correctness trials) and starting workers' device
// initialisation measure nothing, so several of them may share the device. A timed user that
// waits goes first: no untimed user enters while one waits, and the untimed users inside finish
// their phase (unless untimed work may stay beside a warm-up, below).
//
// With starts (or untimed work) beside warm-up on, a timing holds the device in two steps: its
// warm-up (first calls, clock warm-up, warm-up rounds), beside which starting workers may go on
// creating their contexts (and other evaluations on with their references and trials) and new
// ones may begin; then its measured rounds (begin_measure()), which wait for the users inside to
// finish and let none begin until the timing leaves.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace crucible::env {

class device_gate {
public:
  /// share_untimed false: untimed users (starts included) take the device one at a time.
  /// starts_beside_warmup (with share_untimed only): starts may run beside a timing's warm-up.
  /// untimed_beside_warmup (with share_untimed only): so may untimed users.
  explicit device_gate(bool share_untimed = true, bool starts_beside_warmup = false,
                       bool untimed_beside_warmup = false)
      : share_(share_untimed), beside_(share_untimed && starts_beside_warmup),
        untimed_beside_(share_untimed && untimed_beside_warmup) {}
  device_gate(const device_gate&) = delete;
  device_gate& operator=(const device_gate&) = delete;

  void lock_untimed();
  /// lock_untimed() if it would not wait; false otherwise.
  bool try_lock_untimed();
  void unlock_untimed();
  /// A starting worker's held initialisation step(s) (evaluator.init_hold): untimed work that
  /// may also run beside a timing's warm-up when starts beside warm-up are on.
  void lock_start();
  /// lock_start() if it would not wait; false otherwise.
  bool try_lock_start();
  void unlock_start();
  /// Enters for a timing's warm-up: waits for another timed user to leave, and for the users
  /// inside that may not stay beside a warm-up (untimed ones, starts) to leave. With neither kind
  /// beside warm-up the timing is measuring from the start.
  void lock_timed();
  /// The measured rounds begin: waits for the starts and untimed users inside to finish; none
  /// begins until the timed user leaves. Does nothing when already measuring.
  void begin_measure();
  void unlock_timed();
  /// Work of this process's own on the device that is no evaluation: the policy's generation
  /// and updates where an evaluator shares the policy's GPU (host_hold). It never runs beside
  /// measured rounds: it waits while a timing measures (or waits to begin measuring), and a
  /// timing's measured rounds wait for it to leave. It goes before waiting timings (the policy
  /// is the run's critical path; a timing waits at most one generation batch or update), and
  /// shares the device with everything else, a timing's warm-up included.
  void lock_host();
  void unlock_host();
  /// The rules of the constructor, for a gate made before its evaluator (by host work).
  void set_rules(bool share_untimed, bool starts_beside_warmup, bool untimed_beside_warmup);
  /// Seconds since the gate was made.
  double age_seconds() const;
  bool starts_beside_warmup() const noexcept { return beside_; }
  bool untimed_beside_warmup() const noexcept { return untimed_beside_; }
  /// A timing's warm-up may have company: its measured rounds must be begun (begin_measure()).
  bool warmup_shared() const noexcept { return beside_ || untimed_beside_; }

  /// Nanoseconds during which at least one evaluation's user held the device (union of their
  /// holds; host work not counted).
  std::uint64_t busy_ns() const;
  /// Nanoseconds during which host work held the device (union of its holds).
  std::uint64_t host_ns() const;
  /// Nanoseconds during which host work waited for measured rounds to end.
  std::uint64_t host_wait_ns() const;
  /// Nanoseconds during which a timed user held it.
  std::uint64_t timed_ns() const;
  /// Nanoseconds during which a timed user waited for untimed users inside to finish their phase
  /// (a timing was ready and the device was not being timed).
  std::uint64_t drain_ns() const;
  /// Nanoseconds during which a timed user waited in begin_measure() for users inside to finish.
  std::uint64_t measure_wait_ns() const;
  /// Nanoseconds during which a timed user and at least one start were inside together.
  std::uint64_t beside_ns() const;
  /// Nanoseconds during which a timed user and at least one untimed user were inside together.
  std::uint64_t untimed_beside_ns() const;
  /// Most untimed users (starts included) seen inside at once (for tests and figures).
  int max_untimed() const;
  /// Starts inside now (for tests).
  int starts() const;
  /// What is inside now that measured rounds would wait for ("1 worker start, 2 untimed users"), or
  /// "" where nothing is: said before such a wait, so that a wait that never ends names its cause.
  std::string inside() const;
  /// Timed users waiting to enter (for tests).
  int timed_waiting() const;
  /// Host work waiting to enter (for tests).
  int host_waiting() const;

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
      start_wait = 'v',
      start_enter = 'c',
      start_leave = 'y',
      measure_wait = 'M', // begin_measure() waits for starts (and untimed users) to finish
      measure_enter = 'm',
      host_wait = 'h',
      host_enter = 'H',
      host_leave = 'g',
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
  bool start_may_enter() const;   // mtx_ held
  bool may_enter_alone() const;   // mtx_ held: the rule for users kept from every part of a timing
  bool may_enter_warmup() const;  // mtx_ held: the rule for users allowed beside a warm-up
  bool idle_locked() const { return untimed_ == 0 && starts_ == 0 && !timed_; }
  void enter_untimed_locked();
  void enter_start_locked();
  void track_beside_locked(clock::time_point now); // after timed_, starts_ or untimed_ changed
  void enter_locked(clock::time_point now); // first user in: the device becomes busy
  void leave_locked(clock::time_point now); // last user out
  void note_locked(event::kind_t kind, clock::time_point now);

  // A span of time during which a condition held, summed.
  struct overlap {
    bool now = false;
    clock::time_point since{};
    std::uint64_t ns = 0;
    void track(bool b, clock::time_point t);
    std::uint64_t total(clock::time_point t) const;
  };

  // About 20 members, kept together on purpose: the three rules, the counts of users in each
  // state and the time each overlap held are read and changed together under one mutex, and
  // splitting them would split that lock.
  bool share_;          // the rules: set at construction, or once by set_rules()
  bool beside_;
  bool untimed_beside_;
  const clock::time_point made_ = clock::now();
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  int untimed_ = 0;
  int starts_ = 0;
  int host_ = 0;              // host work inside (lock_host)
  int host_waiting_ = 0;      // ... and waiting to enter
  overlap host_busy_;         // host work inside
  std::uint64_t host_wait_ns_ = 0;
  int timed_waiting_ = 0;
  bool timed_ = false;
  bool measuring_ = false;    // the timed user is in its measured rounds
  bool measure_waiting_ = false; // ... or waits in begin_measure() for starts and untimed users to finish
  clock::time_point measure_wait_since_{};
  std::uint64_t measure_wait_ns_ = 0;
  overlap beside_starts_;  // a timed user and a start inside together
  overlap beside_untimed_; // a timed user and an untimed user inside together
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

/// Holds the device for untimed work, or, `alone`, as a timing's measured rounds hold it: nothing
/// else of the process's on the device beside it (a phase that measures without being a timing:
/// the reference's worker measuring the hardware's peaks, env/eval/limits.hpp). release() ends
/// either early.
class phase_hold {
public:
  phase_hold(device_gate& g, bool alone) : g_(&g), alone_(alone) {
    if (alone) {
      g.lock_timed();
      g.begin_measure();
    } else {
      g.lock_untimed();
    }
  }
  ~phase_hold() { release(); }
  phase_hold(const phase_hold&) = delete;
  phase_hold& operator=(const phase_hold&) = delete;
  void release() {
    if (g_ == nullptr)
      return;
    auto* g = std::exchange(g_, nullptr);
    if (alone_)
      g->unlock_timed();
    else
      g->unlock_untimed();
  }

private:
  device_gate* g_;
  bool alone_;
};

/// Holds the device for a starting worker's held initialisation step(s).
class start_hold {
public:
  explicit start_hold(device_gate& g) : g_(g) { g.lock_start(); }
  ~start_hold() { g_.unlock_start(); }
  start_hold(const start_hold&) = delete;
  start_hold& operator=(const start_hold&) = delete;

private:
  device_gate& g_;
};

/// Holds the device for host work (device_gate::lock_host); a null gate holds nothing.
class host_hold {
public:
  explicit host_hold(device_gate* g) : g_(g) {
    if (g_ != nullptr)
      g_->lock_host();
  }
  ~host_hold() {
    if (g_ != nullptr)
      g_->unlock_host();
  }
  host_hold(const host_hold&) = delete;
  host_hold& operator=(const host_hold&) = delete;

private:
  device_gate* g_;
};

/// The gate of a CUDA `device` in this process (kept for the process's life), shared by everyone
/// who asks for it: the device's evaluator (these rules: the first evaluator's stand) and the
/// policy's work on the same device (gate_for_host_work). On the CPU, a gate of the caller's own.
std::shared_ptr<device_gate> shared_gate(const std::string& device, bool share_untimed, bool starts_beside_warmup,
                                         bool untimed_beside_warmup);
/// The gate of `device` in this process, or null where nobody made one.
std::shared_ptr<device_gate> existing_gate(const std::string& device);

/// What one device's gate has seen since it was made: for the share of time each GPU is busy.
struct device_use {
  std::string device;
  double seconds = 0;     ///< since the gate was made
  double evaluation_s = 0; ///< an evaluation's user held it (busy_ns)
  double policy_s = 0;    ///< host work held it (host_ns)
  bool evaluator = false; ///< an evaluator of this process times on it
};
/// Every gate of this process, by device name.
std::vector<device_use> device_uses();

/// The gate host work on `device` takes: on a CUDA device, the process's gate of that device (made
/// here where no evaluator has made it yet: it then only counts the host work, and waits for
/// nothing); null on the CPU.
std::shared_ptr<device_gate> gate_for_host_work(const std::string& device);

/// Holds the device for timed rounds (see device_gate::begin_measure()).
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
