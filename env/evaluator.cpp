// The evaluator's pool of workers for one device: it finds the harness, starts workers (from a
// zygote where it can) and keeps them warm, builds extensions for them, and runs one candidate's
// evaluation (env/evaluation.cpp) on a worker, with the retries and the verdict cache around it.
#include "env/evaluator.hpp"
#include "env/evaluation.hpp"

#include "core/file_io.hpp"

#include <yaml-cpp/yaml.h>
#include <zmq.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>

#include "core/json.hpp"
#include "core/sha256.hpp"
#include "env/device_bytes.hpp"
#include "env/reward.hpp"

namespace crucible::env {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

// A directory of the extension cache: workers (nobody, where we are root) read it, we alone write.
constexpr auto readable_dir = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec
                              | fs::perms::others_read | fs::perms::others_exec;

fs::path cache_home() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return fs::path{x} / "crucible";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return fs::path{h} / ".cache" / "crucible";
  return fs::temp_directory_path() / "crucible-cache";
}

} // namespace

result<harness_location> locate_harness(const evaluator_options& opt) {
  harness_location loc;
  std::vector<fs::path> roots;
  if (const char* h = std::getenv("CRUCIBLE_HARNESS"); h != nullptr && *h != '\0')
    loc.worker_py = h;
  // The build tree lives inside (or beside) the checkout: walk up from the executable.
  for (auto dir = executable_dir(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path())
    roots.push_back(dir);
  roots.push_back(fs::current_path());
  fs::path checkout;
  for (const auto& r : roots) {
    if (fs::exists(r / "env" / "harness" / "worker.py")) {
      checkout = r;
      break;
    }
  }
  if (loc.worker_py.empty()) {
    if (checkout.empty())
      return fail(errc::not_found, "cannot find env/harness/worker.py above ", executable_dir().string(),
                  " or in the working directory (set CRUCIBLE_HARNESS)");
    loc.worker_py = checkout / "env" / "harness" / "worker.py";
  }
  // The interpreter: the configured one, CRUCIBLE_PYTHON, the checkout's .venv, the one the
  // build was configured with, then python3 on PATH.
  std::vector<fs::path> candidates;
  if (!opt.python.empty())
    candidates.emplace_back(opt.python);
  if (const char* p = std::getenv("CRUCIBLE_PYTHON"); p != nullptr && *p != '\0')
    candidates.emplace_back(p);
  if (!checkout.empty())
    candidates.push_back(checkout / ".venv" / "bin" / "python");
#ifdef CRUCIBLE_BUILD_PYTHON
  candidates.emplace_back(CRUCIBLE_BUILD_PYTHON);
#endif
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string dirs = path;
    for (size_t start = 0; start <= dirs.size();) {
      auto end = dirs.find(':', start);
      if (end == std::string::npos)
        end = dirs.size();
      if (end > start)
        candidates.push_back(fs::path{dirs.substr(start, end - start)} / "python3");
      start = end + 1;
    }
  }
  if (!opt.python.empty()) {
    loc.python = opt.python; // configured explicitly: use it or fail naming it
  } else {
    for (const auto& c : candidates) {
      std::error_code ec;
      if (fs::exists(c, ec)) {
        loc.python = c.string();
        break;
      }
    }
  }
  if (const char* k = std::getenv("CRUCIBLE_HARNESS_KERNELS"); k != nullptr && *k != '\0')
    loc.kernels = k; // named: used as it is, and a worker that cannot read it says so
#ifdef CRUCIBLE_HARNESS_KERNELS
  else if (std::error_code ec; fs::exists(CRUCIBLE_HARNESS_KERNELS, ec))
    loc.kernels = CRUCIBLE_HARNESS_KERNELS;
#endif
  if (loc.python.empty() || !fs::exists(loc.python))
    return fail(errc::not_found, loc.python.empty() ? std::string{"no Python interpreter for the workers (set evaluator.python)"}
                                                   : loc.python + ": no such interpreter (evaluator.python)");
  return loc;
}

// ---------------------------------------------------------------------------------------------

device_evaluator::device_evaluator(const evaluator_options& opt, const reward_options& reward,
                                   harness_location where, std::string device, logger& log,
                                   std::shared_ptr<verdict_cache> cache)
  : opt_(opt), reward_(reward), where_(std::move(where)), device_(std::move(device)), log_(log),
    cache_(std::move(cache)), zmq_(std::make_unique<zmq::context_t>(1)), gate_(opt.share_untimed, opt.starts_beside_warmup, opt.untimed_beside_warmup) {
  scratch_root_ = fs::temp_directory_path() / "crucible";
  // What an evaluator killed earlier (kill -9, a crash) left behind: its workers died with it
  // (PR_SET_PDEATHSIG), their scratch folders did not.
  if (auto r = reclaim_scratch(scratch_root_); r.removed > 0 || r.failed > 0)
    log_.info("evaluator", device_, ": removed ", r.removed, " scratch folders of evaluators no longer running (",
              r.bytes >> 20, " MiB) under ", scratch_root_.string(),
              r.failed > 0 ? "; " + std::to_string(r.failed) + " could not be removed" : std::string{});
  extensions_dir_ = opt_.extensions_dir.empty() ? cache_home() / "extensions" : fs::path{opt_.extensions_dir};
  // Workers read the cache (a worker started as root reads it as nobody); only we write it.
  std::error_code ec;
  fs::create_directories(extensions_dir_, ec);
  fs::permissions(extensions_dir_, readable_dir, ec);
}

result<std::unique_ptr<device_evaluator>> device_evaluator::create(const evaluator_options& opt,
                                                                   const reward_options& reward,
                                                                   const harness_location& where,
                                                                   std::string device, logger& log,
                                                                   std::shared_ptr<verdict_cache> cache) {
  std::unique_ptr<device_evaluator> ev{new device_evaluator(opt, reward, where, std::move(device), log, std::move(cache))};
  if (opt.outputs_on_device && ev->device_.rfind("cuda:", 0) == 0) {
    // Outputs stay on the device: this process maps the workers' exports and compares them with
    // its own kernel. Its CUDA context is made now, not inside the first verdict.
    if (!device_bytes_available()) {
      log.info("evaluator", ev->device_, ": built without CUDA; outputs are compared on the host");
    } else {
      const auto digits = ev->device_.substr(5);
      const int index = !digits.empty() && digits.size() < 6 && digits.find_first_not_of("0123456789") == std::string::npos
                            ? std::stoi(digits) : -1;
      if (index < 0) {
        log.warn("evaluator", ev->device_, ": not a cuda:N device; outputs are compared on the host");
      } else if (auto name = device_name(index); name) {
        ev->outputs_device_ = index;
        if (auto kept = keep_freed_memory(index, ev->opt_.keep_freed_mb << 20); !kept)
          log.warn("evaluator", ev->device_, ": ", kept.error().message);
      } else {
        log.warn("evaluator", ev->device_, ": outputs are compared on the host: ", name.error().message);
      }
    }
  }
  auto first = ev->start_worker();
  if (!first)
    return first.error();
  {
    std::lock_guard guard{ev->mtx_};
    ev->hardware_ = first->hardware;
    ev->idle_.push_back(std::move(*first));
  }
  // One refill thread per warm worker: workers start (import, fork, initialise the device)
  // side by side, so a queue of evaluations never waits for them one after another.
  for (std::int64_t i = 0; i < std::max<std::int64_t>(1, ev->opt_.warm_workers); ++i)
    ev->refill_.emplace_back([raw = ev.get()] { raw->refill_loop(); });
  ev->retire_thread_ = std::thread([raw = ev.get()] { raw->retire_loop(); });
  log.info("evaluator", ev->device_, ": ", ev->hardware(), " (", where.python, ")");
  return ev;
}

device_evaluator::~device_evaluator() {
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

void device_evaluator::retire(std::unique_ptr<worker> w) {
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

void device_evaluator::retire_loop() {
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

void device_evaluator::await_retired() {
  std::unique_lock lock{retire_mtx_};
  retired_cv_.wait(lock, [&] { return (retiring_.empty() && !reaping_) || !retire_thread_.joinable(); });
}

std::string device_evaluator::hardware() const {
  std::lock_guard guard{mtx_};
  return hardware_;
}

isolation_report device_evaluator::isolation() const {
  std::lock_guard guard{mtx_};
  return isolation_;
}

std::shared_ptr<zygote> device_evaluator::current_zygote(const worker_spec& spec) {
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

worker_spec device_evaluator::spec() const {
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
  return spec;
}

result<void> device_evaluator::check_isolation(const YAML::Node& started) {
  // The worker has confined itself (env/harness/confine.py) and says how; no candidate code
  // has run in it yet.
  auto iso = parse_isolation(YAML::Dump(started["isolation"]));
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

result<std::unique_ptr<worker>> device_evaluator::start_builder(clock_type::time_point deadline) {
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
    auto n = YAML::Load(msg.json);
    if (n["type"].as<std::string>() != "started")
      return fail(errc::protocol, "the extension builder sent ", msg.json.substr(0, 200), " instead of started");
    if (auto ok = check_isolation(n); !ok)
      return ok.error();
  } catch (const YAML::Exception& e) {
    return fail(errc::protocol, "the extension builder's started message is malformed: ", e.what());
  }
  return w;
}

std::string device_evaluator::build_extension(const std::string& request, clock_type::time_point deadline) {
  auto failed = [](const std::string& log) {
    std::string r = "{\"type\":\"build_failed\",\"log\":";
    append_json_string(r, log);
    return r + "}";
  };
  std::string name;
  std::string fn;
  try {
    const auto n = YAML::Load(request);
    name = n["args"]["name"].as<std::string>();
    fn = n["fn"].as<std::string>("");
  } catch (const YAML::Exception& e) {
    return failed(std::string{"the build request is malformed: "} + e.what());
  }
  const bool identifier = !name.empty() && name.size() <= 200 && std::isdigit(static_cast<unsigned char>(name[0])) == 0
                          && name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
                               == std::string::npos;
  if (!identifier)
    return failed("the extension's name '" + name.substr(0, 200) + "' is not a Python identifier");
  // The key covers the whole request (sources, functions, flags, name, build environment), the
  // interpreter (torch's version and headers) and the device model.
  const auto key = sha256_hex(request + "\n" + where_.python + "\n" + hardware()).substr(0, 32);
  const auto dir = extensions_dir_ / key;
  // A Triton kernel's build is its stages' files in one JSON document; every other build is a
  // library.
  const auto lib = dir / (name + (fn == "triton_kernel" ? ".json" : ".so"));
  auto built = [&] {
    std::string r = "{\"type\":\"built\",\"dir\":";
    append_json_string(r, dir.string());
    return r + "}";
  };
  std::error_code ec;
  {
    std::unique_lock lock{build_mtx_};
    build_cv_.wait(lock, [&] { return building_.count(key) == 0; });
    if (fs::exists(lib, ec))
      return built();
    building_.insert(key);
  }
  struct done_building {
    device_evaluator& ev;
    const std::string& key;
    ~done_building() {
      {
        std::lock_guard lock{ev.build_mtx_};
        ev.building_.erase(key);
      }
      ev.build_cv_.notify_all();
    }
  } guard{*this, key};
  auto b = start_builder(deadline);
  if (!b)
    return failed("the build service could not start a builder: " + b.error().message);
  ++builds_;
  std::unique_ptr<worker> builder = std::move(*b);
  if (auto sent = builder->send(request); !sent) {
    retire(std::move(builder));
    return failed("the builder stopped listening: " + sent.error().message);
  }
  worker_message msg;
  const auto got = builder->receive(deadline, msg);
  std::string reply;
  if (got == receive_outcome::deadline) {
    reply = failed("the build did not finish within evaluator.load_timeout_s");
  } else if (got == receive_outcome::died) {
    reply = failed("the builder " + builder->exit_description());
  } else {
    try {
      auto n = YAML::Load(msg.json);
      const auto type = n["type"].as<std::string>();
      if (type == "build_failed") {
        reply = failed(n["log"].as<std::string>(""));
      } else if (type != "built" || msg.frames.size() != 1 || msg.frames[0].empty()) {
        reply = failed("the builder broke the protocol: " + msg.json.substr(0, 200));
      } else {
        // Written beside, then renamed: a reader sees the whole library or none.
        fs::create_directories(dir, ec);
        fs::permissions(dir, readable_dir, ec);
        const auto tmp = dir / (lib.filename().string() + ".tmp" + std::to_string(::getpid()));
        {
          std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(msg.frames[0].data()), static_cast<std::streamsize>(msg.frames[0].size()));
          if (!out)
            ec = std::make_error_code(std::errc::io_error);
        }
        if (!ec)
          fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read, ec);
        if (!ec)
          fs::rename(tmp, lib, ec);
        reply = ec ? failed("cannot keep the built library in " + dir.string() + ": " + ec.message()) : built();
        if (ec)
          fs::remove(tmp, ec);
      }
    } catch (const YAML::Exception& e) {
      reply = failed(std::string{"the builder's reply is malformed: "} + e.what());
    }
  }
  retire(std::move(builder));
  return reply;
}

result<device_evaluator::ready_worker> device_evaluator::start_worker() {
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

result<device_evaluator::ready_worker> device_evaluator::handshake(std::unique_ptr<worker> proc) {
  const auto started = clock_type::now();
  auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                        std::chrono::duration<double>(opt_.start_timeout_s));
  // The worker imports torch on its own ("started"), then initialises the device in three steps
  // at our word: starting the driver ("init" -> "driver"), creating its CUDA context ("context"
  // -> "context"), the profiler's first use (-> "ready"). The steps named by
  // evaluator.init_hold run while we hold the device as untimed work, so that they never run
  // while another candidate is being timed.
  auto expect = [&](const char* type, YAML::Node& n) -> result<bool> {
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
      n = YAML::Load(msg.json);
      if (n["type"].as<std::string>() != type)
        return fail(errc::protocol, "worker sent ", msg.json.substr(0, 200), " instead of a ", type, " message");
    } catch (const YAML::Exception& e) {
      return fail(errc::protocol, "worker's ", type, " message is malformed: ", e.what());
    }
    return true;
  };
  YAML::Node n;
  if (auto ok = expect("started", n); !ok)
    return ok.error();
  if (auto ok = check_isolation(n); !ok) {
    proc->kill();
    return ok.error();
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
    if (auto sent = proc->send("{\"type\":\"init\"}"); !sent)
      return sent.error();
    if (auto ok = expect("driver", n); !ok)
      return ok.error();
    if (opt_.init_hold == device_init_hold::context)
      hold();
    if (auto sent = proc->send("{\"type\":\"context\"}"); !sent)
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
    if (const auto laps = n["init_ms"]; laps.IsDefined() && laps.IsMap()) {
      try {
        driver_ms = laps["driver"].as<double>();
        context_ms = laps["context"].as<double>();
        profiler_ms = laps["profiler"].as<double>();
      } catch (const YAML::Exception&) {
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
    if (const auto k = n["kernels"]; k.IsDefined() && k.IsScalar() && device_ != "cpu" && k.Scalar() != "module" &&
                                      !kernels_warned_.exchange(true))
      log_.warn("evaluator", device_, ": workers use ", k.Scalar(),
                " for the harness's own device work; each verdict then pays their first launches (about 0.2 s on "
                "an H100)");
  }
  try {
    return ready_worker{std::move(proc), n["hardware"].as<std::string>()};
  } catch (const YAML::Exception& e) {
    return fail(errc::protocol, "worker's ready message is malformed: ", e.what());
  }
}

void device_evaluator::refill_loop() {
  std::unique_lock lock{mtx_};
  for (;;) {
    // evaluator.refill when-idle: starts wait until no evaluation is in flight, so that their
    // contexts are made on a device nothing else uses, several together, and a burst of
    // evaluations is timed without them; but an empty pool gets one start at once, so that a
    // stream of evaluations does not wait for its workers' starts (docs/evaluator.md, The warm pool).
    refill_cv_.wait(lock, [&] {
      const auto pool = static_cast<std::int64_t>(idle_.size()) + starting_;
      return stopping_ || (pool < opt_.warm_workers
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
      log_.warn("evaluator", device_, ": warm worker failed to start: ", w.error().message);
      // Back off instead of spinning on a broken interpreter; take_worker() reports the error.
      pool_cv_.notify_all();
      refill_cv_.wait_for(lock, std::chrono::seconds{5}, [&] { return stopping_; });
      continue;
    }
    idle_.push_back(std::move(*w));
    pool_cv_.notify_all();
  }
}

bool device_evaluator::wait_warm(double timeout_s) {
  std::unique_lock lock{mtx_};
  return pool_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    return static_cast<std::int64_t>(idle_.size()) >= opt_.warm_workers;
  });
}

std::size_t device_evaluator::warm_now() const {
  std::lock_guard guard{mtx_};
  return idle_.size();
}

result<device_evaluator::ready_worker> device_evaluator::take_worker() {
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

void device_evaluator::give_back(ready_worker w) {
  {
    std::lock_guard guard{mtx_};
    idle_.push_back(std::move(w));
  }
  pool_cv_.notify_all();
}

void device_evaluator::flush_caches() {
  if (flush_buf_.empty())
    flush_buf_.assign(std::max<std::uint64_t>(opt_.flush_bytes != 0 ? opt_.flush_bytes : 64ull << 20, 8) / 8, 1);
  std::uint64_t sum = 0;
  for (const auto x : flush_buf_)
    sum += x;
  volatile std::uint64_t sink = sum; // the reads are used
  (void) sink;
}

std::string device_evaluator::protocol_key() const {
  // Everything that can change a verdict of the same code on the same hardware.
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "%s;trials=%lld;rounds=%lld;max_rounds=%lld;min_rounds=%lld/%g;warmup=%g;buckets=%lld;spread=%g/%g;disagree=%g;win=%g;"
                "recheck=%g/%g/%lld;baseline=%s;flush=%llu;jitter=%llu;sample=%g/%lld;tol=%g/%g/%g/%g/%g/%g/%g;static=%d;threads=%lld;connections=%lld;"
                "mode=%s;boundary=%s/%g/%d",
                protocol_version, static_cast<long long>(opt_.trials), static_cast<long long>(opt_.rounds),
                static_cast<long long>(opt_.max_rounds), static_cast<long long>(opt_.min_rounds), opt_.early_stop_spread,
                opt_.warmup_ms, static_cast<long long>(opt_.buckets), opt_.max_spread, opt_.band_floor,
                opt_.max_bucket_disagreement, opt_.win_threshold, opt_.recheck_above, opt_.recheck_tolerance, static_cast<long long>(opt_.recheck_rounds),
                to_string(opt_.baseline), static_cast<unsigned long long>(opt_.flush_bytes),
                static_cast<unsigned long long>(opt_.placement_jitter_bytes), opt_.sample_ms,
                static_cast<long long>(opt_.max_calls), opt_.fp32_atol,
                opt_.fp32_rtol, opt_.fp16_atol, opt_.fp16_rtol, opt_.bf16_atol, opt_.bf16_rtol, opt_.rounding_factor,
                opt_.static_checks ? 1 : 0, static_cast<long long>(opt_.cpu_threads),
                static_cast<long long>(opt_.cuda_max_connections), opt_.eval_mode ? "eval" : "train",
                to_string(opt_.boundary), opt_.reference_band, opt_.cuda_boundary ? 1 : 0);
  return buf;
}

// ---------------------------------------------------------------------------------------------


verdict device_evaluator::check_task(const task& t) {
  eval_request req{t, "", 0, false};
  req.reference_only = true;
  return evaluate(req);
}

namespace {
/// A candidate's call out of device memory is retried alone only where one trial's inputs and
/// reference outputs take at least this much (256 MiB).
constexpr std::uint64_t retry_alone_bytes = 256ull << 20;

/// A worker's or this process's message for running out of device memory: torch's
/// OutOfMemoryError, the CUDA runtime's and driver's codes, and the assertion torch's caching
/// allocator fails while describing an out-of-memory error where NVML cannot start (in the
/// worker's sandbox: 26 of KernelBench's level 1 tasks on an H100 at concurrency 6).
bool out_of_device_memory(const std::string& m) {
  for (const char* s : {"out of memory", "OutOfMemoryError", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY",
                        "DriverAPI::get()->nvmlInit"})
    if (m.find(s) != std::string::npos)
      return true;
  return false;
}
} // namespace

verdict device_evaluator::evaluate(const eval_request& req) {
  auto t0 = clock_type::now();
  // In flight from here to the verdict: with evaluator.refill when-idle, the pool refills once
  // none is.
  struct in_flight {
    device_evaluator& ev;
    explicit in_flight(device_evaluator& e) : ev(e) {
      std::lock_guard guard{ev.mtx_};
      ++ev.in_flight_;
    }
    ~in_flight() {
      bool idle;
      {
        std::lock_guard guard{ev.mtx_};
        idle = --ev.in_flight_ == 0;
      }
      if (idle)
        ev.refill_cv_.notify_all();
    }
    in_flight(const in_flight&) = delete;
    in_flight& operator=(const in_flight&) = delete;
  } flying{*this};
  auto finish = [&](verdict v) {
    v.wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    v.reward = compute_reward(v, reward_);
    return v;
  };
  // evaluator.isolation best-effort: every verdict says what the sandbox lacked.
  auto note_isolation = [&](verdict v) {
    if (auto iso = isolation(); !iso.missing.empty())
      v.message = "[sandbox best-effort, without: " + iso.missing_text() + "] " + v.message;
    return v;
  };
  auto w = take_worker();
  if (log_.enabled(log_level::debug)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", std::chrono::duration<double>(clock_type::now() - t0).count());
    log_.debug("evaluator", device_, " ", req.target.name, ": waited ", buf, " s for a worker");
  }
  if (!w) {
    verdict v;
    v.status = verdict_status::runtime_error;
    v.message = "no worker could be started: " + w.error().message;
    v.hardware = hardware();
    return finish(v);
  }
  verdict_key key{req.target.sha256, sha256_hex(normalize_source(req.candidate)), w->hardware, protocol_key()};
  if (req.use_cache && cache_) {
    if (auto hit = cache_->find(key)) {
      give_back(std::move(*w)); // it never saw the candidate
      hit->cache_hit = true;
      return note_isolation(finish(*hit));
    }
  }
  bool evaluator_failed = false; // the verdict reports this process's failure, not the candidate's
  // One evaluation on a worker, beside the others or alone on the device (solo_gate).
  struct attempt {
    verdict v;
    bool lost_worker = false;
    std::uint64_t task_bytes = 0; // one trial's inputs and reference outputs
  };
  auto run_once = [&](auto&& worker, bool alone) {
    solo_hold hold{solo_, alone};
    if (alone) {
      // The device's memory to this evaluation: the workers of the evaluations that ended are
      // reaped, and this process's pool returns what it kept of their reference copies (up to
      // evaluator.keep_freed_mb; KernelBench level 1 on an H100 failed alone for want of it).
      await_retired();
      if (outputs_device_ >= 0)
        if (auto r = release_freed_memory(outputs_device_); !r)
          log_.warn("evaluator", device_, ": ", r.error().message);
    }
    evaluation e{*this, req, std::move(worker)};
    attempt a{e.run()};
    a.task_bytes = e.task_bytes();
    e.drop_outputs();
    retire(e.take_process());
    if (auto cand = e.take_candidate_process())
      retire(std::move(cand));
    a.lost_worker = e.lost_worker();
    evaluator_failed = e.evaluator_failed();
    return a;
  };
  auto v = [&] {
    auto first = run_once(*w, false);
    const bool out_of_memory = device_ != "cpu" && first.v.status == verdict_status::runtime_error
                               && out_of_device_memory(first.v.message);
    if (out_of_memory && (first.v.message.find("ModelNew") == std::string::npos || first.task_bytes >= retry_alone_bytes)) {
      // Out of device memory beside other evaluations (KernelBench's level 1 at concurrency 6 on
      // an H100: tasks of 6.4 GB inputs and outputs): once more alone on the device, after the
      // evaluations running now have ended. Out of memory alone is the task's or candidate's. A
      // candidate's own call out of memory is retried so only where the task's inputs and outputs are large
      // (retry_alone_bytes): else a policy writing allocations that fail would hold up the
      // evaluator's other verdicts each time.
      log_.warn("evaluator", device_, " ", req.target.name, ": ", first.v.message.substr(0, 200),
                "; retrying alone on the device");
      auto again = take_worker();
      if (!again)
        return first.v;
      auto second = run_once(*again, true);
      if (second.v.status == verdict_status::runtime_error && out_of_device_memory(second.v.message))
        second.v.message += " (alone on the device as well)";
      return second.v;
    }
    if (!first.lost_worker && !evaluator_failed)
      return first.v;
    // A worker killed from outside is retried once on a fresh worker, so an operator's kill
    // or a neighbour's memory pressure loses nothing; a candidate that exhausts memory again
    // is killed again and keeps its runtime_error. So is a failure of this process's own (its
    // copy of a reference output found the device full while other evaluations held it: CUDA-L1's
    // 3090 release, level 1 task 60, at concurrency 6): the candidate is not to blame for it.
    // Fresh means started now, not taken from the idle ones: what killed this worker (an operator
    // killing every process below the run, the kernel's OOM killer) may have killed them too, and
    // one of them would fail the retry as "not accepting messages".
    log_.warn("evaluator", device_, ": ", first.v.message, "; retrying on a fresh worker");
    auto again = start_worker();
    if (!again)
      return first.v;
    auto second = run_once(*again, false);
    if (second.lost_worker)
      second.v.message += " (twice; out of memory?)";
    return second.v;
  }();
  v = finish(v);
  // Timeouts depend on the machine's load, and the evaluator's own failures (its device memory,
  // its comparison; a verdict without a worker returned above) are not the candidate's: keep
  // neither.
  // Nor a check of a task alone (check_task): its "ok" says the reference ran, and kept under the
  // key of an empty candidate it would answer an empty submission.
  bool cacheable = v.status != verdict_status::timeout && !evaluator_failed && !req.reference_only;
  if (cache_ && cacheable) {
    if (auto r = cache_->store(key, v); !r)
      log_.warn("evaluator", r.error().message);
  }
  log_.debug("evaluator", device_, " ", req.target.name, ": ", to_string(v.status), " ", v.message);
  return note_isolation(std::move(v));
}

} // namespace crucible::env
