// env/eval/device_gate.cpp: see device_gate.hpp.
#include "env/eval/device_gate.hpp"
#include "env/eval/device_kind.hpp"
#include "core/device.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
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
  if (idle_locked())
    busy_since_ = now;
}

void device_gate::leave_locked(clock::time_point now) {
  if (idle_locked())
    busy_ns_ += ns_between(busy_since_, now);
}

void device_gate::overlap::track(bool b, clock::time_point t) {
  if (b && !now)
    since = t;
  else if (!b && now)
    ns += ns_between(since, t);
  now = b;
}

std::uint64_t device_gate::overlap::total(clock::time_point t) const {
  return ns + (now ? ns_between(since, t) : 0);
}

void device_gate::track_beside_locked(clock::time_point now) {
  beside_starts_.track(timed_ && starts_ > 0, now);
  beside_untimed_.track(timed_ && untimed_ > 0, now);
}

bool device_gate::may_enter_alone() const {
  return !timed_ && timed_waiting_ == 0 && (share_ || untimed_ + starts_ == 0);
}

bool device_gate::may_enter_warmup() const {
  // Beside untimed work, beside a timing's warm-up, and while a timing waits to begin its
  // warm-up; never beside measured rounds, nor once a timing waits to begin them.
  return !measuring_ && !measure_waiting_;
}

bool device_gate::untimed_may_enter() const {
  return untimed_beside_ ? may_enter_warmup() : may_enter_alone();
}

bool device_gate::start_may_enter() const {
  return beside_ ? may_enter_warmup() : may_enter_alone();
}

void device_gate::enter_untimed_locked() {
  const auto now = clock::now();
  note_locked(event::untimed_enter, now);
  enter_locked(now);
  ++untimed_;
  max_untimed_ = std::max(max_untimed_, untimed_ + starts_);
  track_beside_locked(now);
}

void device_gate::enter_start_locked() {
  const auto now = clock::now();
  note_locked(event::start_enter, now);
  enter_locked(now);
  ++starts_;
  max_untimed_ = std::max(max_untimed_, untimed_ + starts_);
  track_beside_locked(now);
}

void device_gate::lock_start() {
  std::unique_lock lock{mtx_};
  if (!start_may_enter())
    note_locked(event::start_wait, clock::now());
  cv_.wait(lock, [&] { return start_may_enter(); });
  enter_start_locked();
}

bool device_gate::try_lock_start() {
  std::lock_guard lock{mtx_};
  if (!start_may_enter())
    return false;
  enter_start_locked();
  return true;
}

void device_gate::unlock_start() {
  {
    std::lock_guard lock{mtx_};
    const auto now = clock::now();
    note_locked(event::start_leave, now);
    --starts_;
    leave_locked(now);
    track_beside_locked(now);
  }
  cv_.notify_all();
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
    track_beside_locked(now);
  }
  cv_.notify_all();
}

void device_gate::lock_host() {
  std::unique_lock lock{mtx_};
  // The rule of users allowed beside a warm-up (never beside measured rounds, nor once a timing
  // waits to begin them), whatever the evaluator's rules: waiting timings do not hold it back.
  if (!may_enter_warmup()) {
    const auto since = clock::now();
    note_locked(event::host_wait, since);
    ++host_waiting_;
    cv_.wait(lock, [&] { return may_enter_warmup(); });
    --host_waiting_;
    host_wait_ns_ += ns_between(since, clock::now());
  }
  const auto now = clock::now();
  note_locked(event::host_enter, now);
  ++host_;
  host_busy_.track(true, now);
}

void device_gate::unlock_host() {
  {
    std::lock_guard lock{mtx_};
    const auto now = clock::now();
    note_locked(event::host_leave, now);
    --host_;
    host_busy_.track(host_ > 0, now);
  }
  cv_.notify_all();
}

void device_gate::lock_timed() {
  std::unique_lock lock{mtx_};
  ++timed_waiting_;
  // What the timing waits for: untimed users and starts, unless they may stay beside warm-up.
  auto blocking = [&] {
    return (!untimed_beside_ && untimed_ > 0) || (!beside_ && starts_ > 0) || (!warmup_shared() && host_ > 0);
  };
  if (timed_ || blocking())
    note_locked(event::timed_wait, clock::now());
  if (!timed_ && blocking() && !draining_) {
    draining_ = true;
    drain_since_ = clock::now();
  }
  cv_.wait(lock, [&] { return !timed_ && !blocking(); });
  --timed_waiting_;
  const auto now = clock::now();
  if (draining_) {
    drain_ns_ += ns_between(drain_since_, now);
    draining_ = false;
  }
  note_locked(event::timed_enter, now);
  enter_locked(now);
  timed_ = true;
  measuring_ = !warmup_shared(); // no company allowed beside warm-up, none is inside: measuring from the start
  timed_since_ = now;
  track_beside_locked(now);
}

void device_gate::begin_measure() {
  std::unique_lock lock{mtx_};
  if (measuring_)
    return;
  if (starts_ + untimed_ + host_ > 0) {
    measure_waiting_ = true; // no start, untimed user or host work begins from now on
    const auto since = clock::now();
    note_locked(event::measure_wait, since);
    measure_wait_since_ = since;
    cv_.wait(lock, [&] { return starts_ == 0 && untimed_ == 0 && host_ == 0; });
    measure_wait_ns_ += ns_between(since, clock::now());
    measure_waiting_ = false;
  }
  measuring_ = true;
  note_locked(event::measure_enter, clock::now());
}

void device_gate::unlock_timed() {
  {
    std::lock_guard lock{mtx_};
    const auto now = clock::now();
    note_locked(event::timed_leave, now);
    timed_ = false;
    measuring_ = false;
    timed_ns_ += ns_between(timed_since_, now);
    leave_locked(now);
    track_beside_locked(now);
  }
  cv_.notify_all();
}

std::uint64_t device_gate::busy_ns() const {
  std::lock_guard lock{mtx_};
  return busy_ns_ + (!idle_locked() ? ns_between(busy_since_, clock::now()) : 0);
}

std::uint64_t device_gate::host_ns() const {
  std::lock_guard lock{mtx_};
  return host_busy_.total(clock::now());
}

std::uint64_t device_gate::host_wait_ns() const {
  std::lock_guard lock{mtx_};
  return host_wait_ns_;
}

std::uint64_t device_gate::timed_ns() const {
  std::lock_guard lock{mtx_};
  return timed_ns_ + (timed_ ? ns_between(timed_since_, clock::now()) : 0);
}

std::uint64_t device_gate::drain_ns() const {
  std::lock_guard lock{mtx_};
  return drain_ns_ + (draining_ ? ns_between(drain_since_, clock::now()) : 0);
}

std::uint64_t device_gate::measure_wait_ns() const {
  std::lock_guard lock{mtx_};
  return measure_wait_ns_ + (measure_waiting_ ? ns_between(measure_wait_since_, clock::now()) : 0);
}

std::uint64_t device_gate::beside_ns() const {
  std::lock_guard lock{mtx_};
  return beside_starts_.total(clock::now());
}

std::uint64_t device_gate::untimed_beside_ns() const {
  std::lock_guard lock{mtx_};
  return beside_untimed_.total(clock::now());
}

int device_gate::starts() const {
  std::lock_guard lock{mtx_};
  return starts_;
}

std::string device_gate::inside() const {
  std::lock_guard lock{mtx_};
  std::string out;
  auto add = [&](int n, const char* one, const char* many) {
    if (n > 0)
      out += (out.empty() ? "" : ", ") + std::to_string(n) + " " + (n == 1 ? one : many);
  };
  add(starts_, "worker start", "worker starts");
  add(untimed_, "untimed user", "untimed users");
  add(host_, "host job", "host jobs");
  return out;
}

int device_gate::timed_waiting() const {
  std::lock_guard lock{mtx_};
  return timed_waiting_;
}

int device_gate::host_waiting() const {
  std::lock_guard lock{mtx_};
  return host_waiting_;
}

int device_gate::max_untimed() const {
  std::lock_guard lock{mtx_};
  return max_untimed_;
}

namespace {
struct gate_entry {
  std::shared_ptr<device_gate> gate;
  bool evaluator = false; // made (or taken over) by an evaluator, whose rules it follows
};
std::mutex gates_mtx;
std::map<std::string, gate_entry>& gates() {
  static std::map<std::string, gate_entry> g;
  return g;
}
} // namespace

void device_gate::set_rules(bool share_untimed, bool starts_beside_warmup, bool untimed_beside_warmup) {
  std::lock_guard lock{mtx_};
  share_ = share_untimed;
  beside_ = share_untimed && starts_beside_warmup;
  untimed_beside_ = share_untimed && untimed_beside_warmup;
}

double device_gate::age_seconds() const {
  return std::chrono::duration<double>(clock::now() - made_).count();
}

std::shared_ptr<device_gate> shared_gate(const std::string& device, bool share_untimed, bool starts_beside_warmup,
                                         bool untimed_beside_warmup) {
  if (!kind_of(device).process_wide_gate)
    return std::make_shared<device_gate>(share_untimed, starts_beside_warmup, untimed_beside_warmup);
  std::lock_guard lock{gates_mtx};
  auto& e = gates()[device];
  if (!e.gate)
    e.gate = std::make_shared<device_gate>(share_untimed, starts_beside_warmup, untimed_beside_warmup);
  else if (!e.evaluator)
    e.gate->set_rules(share_untimed, starts_beside_warmup, untimed_beside_warmup);
  e.evaluator = true;
  return e.gate;
}

std::shared_ptr<device_gate> existing_gate(const std::string& device) {
  std::lock_guard lock{gates_mtx};
  const auto it = gates().find(device);
  return it == gates().end() ? nullptr : it->second.gate;
}

std::shared_ptr<device_gate> gate_for_host_work(const std::string& device) {
  if (!kind_of(device).process_wide_gate)
    return nullptr;
  std::lock_guard lock{gates_mtx};
  auto& e = gates()[device];
  if (!e.gate)
    e.gate = std::make_shared<device_gate>();
  return e.gate;
}

std::vector<device_use> device_uses() {
  std::lock_guard lock{gates_mtx};
  std::vector<device_use> out;
  for (const auto& [name, e] : gates())
    out.push_back({name, e.gate->age_seconds(), static_cast<double>(e.gate->busy_ns()) * 1e-9,
                   static_cast<double>(e.gate->host_ns()) * 1e-9, e.evaluator});
  return out;
}

} // namespace crucible::env
