// The warm workers of one device (env/eval/worker_pool.hpp): the zygote, a worker's start and
// handshake, the refill threads and the retire thread.
#include "env/eval/worker_pool.hpp"
#include "env/eval/device_kind.hpp"
#include "env/eval/worker_messages.hpp"

#include <zmq.hpp>

#include <algorithm>
#include <optional>
#include <utility>

namespace crucible::env {

using clock_type = std::chrono::steady_clock;

worker_pool::worker_pool(const evaluator_options& opt, harness_location where, std::string device, logger& log,
                         device_gate& gate, std::filesystem::path scratch_root, std::filesystem::path extensions_dir)
  : opt_(opt), where_(std::move(where)), device_(std::move(device)), log_(log), gate_(gate),
    scratch_root_(std::move(scratch_root)), extensions_dir_(std::move(extensions_dir)),
    zmq_(std::make_unique<zmq::context_t>(1)) {}

void worker_pool::launch() {
  // One refill thread per warm worker: workers start (import, fork, initialise the device)
  // side by side, so a queue of evaluations never waits for them one after another.
  for (std::int64_t i = 0; i < std::max<std::int64_t>(1, opt_.warm_workers); ++i)
    refill_.emplace_back([this] { refill_loop(); });
  retire_thread_ = std::thread([this] { retire_loop(); });
}

result<void> worker_pool::wait_started() {
  std::unique_lock lock{mtx_};
  // Failed as many times as there are refill threads, none starting now: all of them in their back-off.
  pool_cv_.wait(lock, [&] { return any_started_ || (failed_starts_ >= refill_.size() && starting_ == 0); });
  if (any_started_)
    return {};
  return *first_failure_;
}

worker_pool::~worker_pool() {
  {
    std::lock_guard guard{mtx_};
    stopping_ = true;
  }
  refill_cv_.notify_all();
  for (auto& t : refill_)
    t.join();
  {
    std::lock_guard guard{retire_mtx_};
    retire_stop_ = true;
  }
  retire_cv_.notify_all();
  if (retire_thread_.joinable())
    retire_thread_.join(); // it ends with retiring_ empty, and retire() no longer queues
  idle_.clear(); // kills the idle workers before the ZeroMQ context goes
}

void worker_pool::evaluation_begins() {
  std::lock_guard guard{mtx_};
  ++in_flight_;
}

void worker_pool::evaluation_ends() {
  bool idle;
  {
    std::lock_guard guard{mtx_};
    idle = --in_flight_ == 0;
  }
  if (idle)
    refill_cv_.notify_all();
}

std::int64_t worker_pool::in_flight() const {
  std::lock_guard guard{mtx_};
  return in_flight_;
}

void worker_pool::retire(std::unique_ptr<worker> w) {
  if (!w)
    return;
  {
    std::lock_guard guard{retire_mtx_};
    if (!retire_stop_ && retire_thread_.joinable()) {
      retiring_.push_back(std::move(w));
      retire_cv_.notify_one();
      return;
    }
  }
  w.reset(); // no retire thread (stopping): here and now
}

void worker_pool::retire_loop() {
  std::unique_lock lock{retire_mtx_};
  for (;;) {
    retire_cv_.wait(lock, [&] { return retire_stop_ || !retiring_.empty(); });
    if (retiring_.empty())
      return; // stopping, nothing left
    auto batch = std::move(retiring_);
    retiring_.clear();
    reaping_ = true;
    lock.unlock();
    {
      // A worker's exit tears its CUDA context down, work the driver does on the device: kept
      // away from measured rounds like other untimed work (evaluator.teardown_hold).
      std::optional<untimed_hold> device;
      if (opt_.teardown_hold)
        device.emplace(gate_);
      batch.clear(); // kills, reaps, removes the scratch directories
    }
    lock.lock();
    reaping_ = false;
    if (retiring_.empty())
      retired_cv_.notify_all();
  }
}

void worker_pool::discard_idle() {
  std::vector<ready_worker> gone;
  {
    std::lock_guard guard{mtx_};
    gone.swap(idle_);
  }
  for (auto& w : gone)
    retire(std::move(w.proc));
  refill_cv_.notify_all();
}

void worker_pool::await_retired() {
  std::unique_lock lock{retire_mtx_};
  retired_cv_.wait(lock, [&] { return (retiring_.empty() && !reaping_) || !retire_thread_.joinable(); });
}

std::string worker_pool::hardware() const {
  std::lock_guard guard{mtx_};
  return hardware_;
}

isolation_report worker_pool::isolation() const {
  std::lock_guard guard{mtx_};
  return isolation_;
}

std::shared_ptr<zygote> worker_pool::current_zygote(const worker_spec& spec) {
  std::lock_guard guard{zygote_mtx_};
  if (!opt_.zygote || zygote_off_)
    return nullptr;
  if (zygote_ && zygote_->alive())
    return zygote_;
  zygote_.reset(); // dead: its workers died with it, and their evaluations say so
  auto z = zygote::start(spec, std::chrono::duration_cast<clock_type::duration>(
                                 std::chrono::duration<double>(opt_.start_timeout_s)));
  if (!z) {
    log_.warn("evaluator", device_, ": the worker zygote did not start (", z.error().message,
              "); workers are started one interpreter each");
    zygote_off_ = true;
    return nullptr;
  }
  zygote_ = std::move(*z);
  return zygote_;
}

worker_spec worker_pool::spec() const {
  worker_spec spec;
  spec.python = where_.python;
  spec.harness = where_.worker_py;
  spec.kernels = where_.kernels;
  spec.device = device_;
  spec.scratch_root = scratch_root_;
  spec.extensions_dir = extensions_dir_;
  spec.scratch_mb = opt_.scratch_mb;
  spec.memory_limit_mb = opt_.memory_limit_mb;
  spec.cpu_threads = opt_.cpu_threads;
  spec.cuda_max_connections = opt_.cuda_max_connections;
  spec.huge_pages = opt_.huge_pages;
  spec.own_device_only = opt_.cuda_own_device_only;
  return spec;
}

result<void> worker_pool::check_isolation(const wire::node& started) {
  // The worker has confined itself (env/eval/harness/confine.py) and says how; no candidate code
  // has run in it yet.
  auto iso = parse_isolation(started["isolation"]);
  add_evaluator_layers(iso);
  std::lock_guard guard{mtx_};
  if (!iso.missing.empty()) {
    if (opt_.isolation == isolation_mode::strict)
      return fail(errc::unsupported, "the workers' sandbox on ", device_, " lacks: ", iso.missing_text(),
                  ". evaluator.isolation is strict; set it to best-effort to evaluate without these layers");
    if (isolation_.missing.empty())
      log_.warn("evaluator", device_, ": evaluator.isolation is best-effort and the workers' sandbox lacks: ",
                iso.missing_text());
  }
  isolation_ = std::move(iso);
  return {};
}

result<std::unique_ptr<worker>> worker_pool::start_builder(clock_type::time_point deadline) {
  const auto s = spec();
  result<std::unique_ptr<worker>> w = fail(errc::unsupported, "no zygote");
  if (auto z = current_zygote(s))
    w = worker::fork_from(*z, *zmq_, s);
  if (!w)
    w = worker::start(*zmq_, s);
  if (!w)
    return w.error();
  ++started_;
  worker_message msg;
  switch ((*w)->receive(deadline, msg)) {
    case receive_outcome::deadline: return fail(errc::timeout, "the extension builder sent no started message in time");
    case receive_outcome::died: return fail(errc::worker_lost, "the extension builder ", (*w)->exit_description(), " before it started");
    case receive_outcome::message: break;
  }
  try {
    auto n = wire::parse(msg.json);
    if (n["type"].as<std::string>() != "started")
      return fail(errc::protocol, "the extension builder sent ", msg.json.substr(0, 200), " instead of started");
    if (auto ok = check_isolation(n); !ok)
      return ok.error();
  } catch (const wire::error& e) {
    return fail(errc::protocol, "the extension builder's started message is malformed: ", e.what());
  }
  return w;
}

result<ready_worker> worker_pool::start_worker() {
  const auto spec = this->spec();
  if (auto z = current_zygote(spec)) {
    auto w = worker::fork_from(*z, *zmq_, spec);
    if (!w) {
      log_.warn("evaluator", device_, ": cannot fork a worker (", w.error().message,
                "); workers are started one interpreter each from now on");
      std::lock_guard guard{zygote_mtx_};
      zygote_off_ = true;
      zygote_.reset();
    } else {
      ++started_;
      ++forked_;
      auto ready = handshake(std::move(*w));
      if (ready) {
        ++forked_ready_;
        fork_failures_in_a_row_ = 0;
        return ready;
      }
      // A forked worker that cannot start (e.g. a device that refuses to initialise after a
      // fork) must not cost every later verdict a failed start: execute workers from now on.
      // Once forked workers have started, one failure is more likely the moment's (the device's
      // memory full while it created its context) than the zygote's: this worker alone is
      // executed, unless three forked workers in a row failed.
      const auto in_a_row = ++fork_failures_in_a_row_;
      if (forked_ready_ > 0 && in_a_row < 3) {
        log_.warn("evaluator", device_, ": a worker forked from the zygote failed to start (", ready.error().message,
                  "); starting this one as its own interpreter");
      } else {
        log_.warn("evaluator", device_, ": a worker forked from the zygote failed to start (", ready.error().message,
                  "); workers are started one interpreter each from now on");
        std::lock_guard guard{zygote_mtx_};
        zygote_off_ = true;
        zygote_.reset();
      }
    }
  }
  auto w = worker::start(*zmq_, spec);
  if (!w)
    return w.error();
  ++started_;
  return handshake(std::move(*w));
}

result<ready_worker> worker_pool::handshake(std::unique_ptr<worker> proc) {
  const auto started = clock_type::now();
  auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                        std::chrono::duration<double>(opt_.start_timeout_s));
  // The worker imports torch on its own ("started"), then initialises the device in three steps
  // at our word: starting the driver ("init" -> "driver"), creating its CUDA context ("context"
  // -> "context"), the profiler's first use (-> "ready"). The steps named by
  // evaluator.init_hold run while we hold the device as untimed work, so that they never run
  // while another candidate is being timed.
  auto expect = [&](const char* type, wire::node& n) -> result<bool> {
    worker_message msg;
    auto got = proc->receive(deadline, msg);
    if (got == receive_outcome::deadline) {
      proc->kill();
      return fail(errc::timeout, "worker on ", device_, " sent no ", type, " message within ",
                  std::to_string(opt_.start_timeout_s), " s");
    }
    if (got == receive_outcome::died)
      return fail(errc::worker_lost, "worker on ", device_, " ", proc->exit_description(),
                  " before it was ready (is torch installed for ", where_.python, "?)");
    try {
      n = wire::parse(msg.json);
      if (n["type"].as<std::string>() != type)
        return fail(errc::protocol, "worker sent ", msg.json.substr(0, 200), " instead of a ", type, " message");
    } catch (const wire::error& e) {
      return fail(errc::protocol, "worker's ", type, " message is malformed: ", e.what());
    }
    return true;
  };
  wire::node n;
  if (auto ok = expect("started", n); !ok)
    return ok.error();
  if (auto ok = check_isolation(n); !ok) {
    proc->kill();
    return ok.error();
  }
  if (control_group::unavailable_reason().empty())
    if (auto in = proc->enclose(); !in) {
      proc->kill();
      return in.error();
    }
  {
    // Creating a CUDA context beside a timed kernel raised that kernel's p99 by 10-13%; starting
    // the driver and the profiler's first use left it alone (docs/performance-history.md, "A
    // device gate"). Beside other evaluations' references and trials any step costs nothing measured,
    // nor beside a timing's warm-up (evaluator.starts_beside_warmup): its measured rounds wait.
    std::optional<start_hold> device;
    clock_type::time_point held_since{};
    double held_s = 0;
    auto hold = [&] {
      device.emplace(gate_);
      held_since = clock_type::now();
    };
    auto release = [&](clock_type::time_point now) {
      device.reset();
      held_s = std::chrono::duration<double>(now - held_since).count();
    };
    if (opt_.init_hold == device_init_hold::all)
      hold();
    const auto t0 = clock_type::now();
    if (auto sent = proc->send(worker_msg::command("init")); !sent)
      return sent.error();
    if (auto ok = expect("driver", n); !ok)
      return ok.error();
    if (opt_.init_hold == device_init_hold::context)
      hold();
    if (auto sent = proc->send(worker_msg::command("context")); !sent)
      return sent.error();
    if (auto ok = expect("context", n); !ok)
      return ok.error();
    if (opt_.init_hold == device_init_hold::context)
      release(clock_type::now());
    if (auto ok = expect("ready", n); !ok)
      return ok.error();
    const auto done = clock_type::now();
    if (opt_.init_hold == device_init_hold::all)
      release(done);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(done - t0).count();
    init_ns_ += static_cast<std::uint64_t>(ns);
    init_held_ns_ += static_cast<std::uint64_t>(held_s * 1e9);
    char buf[200];
    double driver_ms = -1, context_ms = -1, profiler_ms = -1; // the worker's own laps, when it sends them
    if (const auto laps = n["init_ms"]; laps.is_object()) {
      try {
        driver_ms = laps["driver"].as<double>();
        context_ms = laps["context"].as<double>();
        profiler_ms = laps["profiler"].as<double>();
      } catch (const wire::error&) {
      }
    }
    std::snprintf(buf, sizeof buf,
                  "%.3f s (device initialisation %.3f s, %.3f s of it holding the device: driver %.0f ms, context %.0f "
                  "ms, profiler's first use %.0f ms)",
                  std::chrono::duration<double>(clock_type::now() - started).count(), static_cast<double>(ns) * 1e-9,
                  held_s, driver_ms, context_ms, profiler_ms);
    log_.debug("evaluator", device_, ": worker ", std::to_string(proc->pid()), proc->forked() ? " forked" : " executed",
               ", ready in ", buf);
    // CUDA workers report whether they loaded the harness's own kernels; without them every
    // verdict pays the lazy loading of the torch operations used instead (docs/evaluator.md).
    if (const auto k = n["kernels"]; k.is_scalar() && kind_of(device_).harness_kernels && k.as<std::string>() != "module" &&
                                      !kernels_warned_.exchange(true))
      log_.warn("evaluator", device_, ": workers use ", k.as<std::string>(),
                " for the harness's own device work; each verdict then pays their first launches (about 0.2 s on "
                "an H100)");
  }
  try {
    return ready_worker{std::move(proc), n["hardware"].as<std::string>()};
  } catch (const wire::error& e) {
    return fail(errc::protocol, "worker's ready message is malformed: ", e.what());
  }
}

void worker_pool::refill_loop() {
  std::unique_lock lock{mtx_};
  for (;;) {
    // evaluator.refill when-idle: starts wait until no evaluation is in flight, so that their
    // contexts are made on a device nothing else uses, several together, and a burst of
    // evaluations is timed without them; but an empty pool gets one start at once, so that a
    // stream of evaluations does not wait for its workers' starts (docs/evaluator.md, The warm pool).
    refill_cv_.wait(lock, [&] {
      const auto pool = static_cast<std::int64_t>(idle_.size()) + starting_;
      // Until a worker has started, one is wanted even with warm_workers 0: it names the hardware.
      const auto target = any_started_ ? opt_.warm_workers : std::max<std::int64_t>(1, opt_.warm_workers);
      return stopping_ || (pool < target
                           && (opt_.refill == worker_refill::at_once || in_flight_ == 0 || pool == 0));
    });
    if (stopping_)
      return;
    ++starting_;
    lock.unlock();
    auto w = start_worker();
    lock.lock();
    --starting_;
    if (!w) {
      if (!any_started_ && failed_starts_++ == 0)
        first_failure_ = w.error(); // wait_started() reports it if no start succeeds
      else
        log_.warn("evaluator", device_, ": warm worker failed to start: ", w.error().message);
      // Back off instead of spinning on a broken interpreter; take_worker() reports the error.
      pool_cv_.notify_all();
      refill_cv_.wait_for(lock, std::chrono::seconds{5}, [&] { return stopping_; });
      continue;
    }
    if (!any_started_) {
      any_started_ = true;
      hardware_ = w->hardware;
      if (first_failure_)
        log_.warn("evaluator", device_, ": ", failed_starts_, " warm worker start", failed_starts_ == 1 ? "" : "s",
                  " failed before the first worker started; the first: ", first_failure_->message);
    }
    idle_.push_back(std::move(*w));
    pool_cv_.notify_all();
  }
}

bool worker_pool::wait_warm(double timeout_s) {
  std::unique_lock lock{mtx_};
  return pool_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    return static_cast<std::int64_t>(idle_.size()) >= opt_.warm_workers;
  });
}

std::size_t worker_pool::warm_now() const {
  std::lock_guard guard{mtx_};
  return idle_.size();
}

result<ready_worker> worker_pool::take() {
  {
    std::lock_guard guard{mtx_};
    if (!idle_.empty()) {
      auto w = std::move(idle_.back());
      idle_.pop_back();
      refill_cv_.notify_all();
      return w;
    }
  }
  refill_cv_.notify_all();
  return start_worker(); // the pool is empty: start one here rather than wait for the refill
}

void worker_pool::give_back(ready_worker w) {
  {
    std::lock_guard guard{mtx_};
    idle_.push_back(std::move(w));
  }
  pool_cv_.notify_all();
}

} // namespace crucible::env
