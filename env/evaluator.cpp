// The evaluator's side of the worker protocol: one `evaluation` per candidate walks the
// phases (reference, load, trials, timing), enforces each phase's deadline, compares outputs
// on raw bytes and builds the verdict.
#include "env/evaluator.hpp"

#include "core/file_io.hpp"

#include <yaml-cpp/yaml.h>
#include <zmq.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <utility>

#include "core/json.hpp"
#include "core/sha256.hpp"
#include "env/compare.hpp"
#include "env/device_bytes.hpp"
#include "env/reward.hpp"
#include "env/timing.hpp"

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

std::string json_string(const std::string& s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

// Decodes the outputs listed in a message header, taking their bytes from the frames, or mapping
// the device memory the worker exported (on CUDA device `cuda_device` of this process).
result<std::vector<tensor_blob>> decode_outputs(const YAML::Node& list, worker_message& msg, int cuda_device) {
  std::vector<tensor_blob> out;
  if (!list.IsDefined() || list.IsNull())
    return out;
  if (!list.IsSequence())
    return fail(errc::protocol, "outputs is not a list");
  for (const auto& item : list) {
    tensor_blob b;
    if (item["kind"].IsDefined()) {
      b.kind = item["kind"].as<std::string>();
      out.push_back(std::move(b));
      continue;
    }
    auto type = parse_dtype(item["dtype"].as<std::string>());
    if (!type) {
      b.kind = "tensor of unsupported dtype " + item["dtype"].as<std::string>();
      out.push_back(std::move(b));
      continue;
    }
    b.type = *type;
    for (const auto& d : item["shape"])
      b.shape.push_back(d.as<std::int64_t>());
    if (item["ipc"].IsDefined()) {
      if (cuda_device < 0)
        return fail(errc::protocol, "a device output arrived but this evaluator asked for host bytes");
      auto mapped = map_exported(cuda_device, item["ipc"].as<std::string>(), item["offset"].as<std::uint64_t>(),
                                 item["bytes"].as<std::uint64_t>(), element_size(b.type));
      if (!mapped)
        return mapped.error();
      b.device = std::move(*mapped);
      out.push_back(std::move(b));
      continue;
    }
    auto frame = item["frame"].as<std::size_t>();
    if (frame == 0 || frame > msg.frames.size())
      return fail(errc::protocol, "output refers to missing frame ", std::to_string(frame));
    b.bytes = std::move(msg.frames[frame - 1]);
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<double> as_doubles(const YAML::Node& n) {
  std::vector<double> out;
  if (n.IsSequence())
    for (const auto& x : n)
      out.push_back(x.as<double>());
  return out;
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
    // the driver and the profiler's first use left it alone (docs/PERFORMANCE.md, "A device
    // gate"). Beside other evaluations' references and trials any step costs nothing measured,
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

std::string device_evaluator::protocol_key() const {
  // Everything that can change a verdict of the same code on the same hardware.
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "%s;trials=%lld;rounds=%lld;max_rounds=%lld;min_rounds=%lld/%g;warmup=%g;buckets=%lld;spread=%g/%g;disagree=%g;win=%g;"
                "recheck=%g/%g/%lld;baseline=%s;flush=%llu;jitter=%llu;sample=%g/%lld;tol=%g/%g/%g/%g/%g/%g/%g;static=%d;threads=%lld;connections=%lld;"
                "mode=%s",
                protocol_version, static_cast<long long>(opt_.trials), static_cast<long long>(opt_.rounds),
                static_cast<long long>(opt_.max_rounds), static_cast<long long>(opt_.min_rounds), opt_.early_stop_spread,
                opt_.warmup_ms, static_cast<long long>(opt_.buckets), opt_.max_spread, opt_.band_floor,
                opt_.max_bucket_disagreement, opt_.win_threshold, opt_.recheck_above, opt_.recheck_tolerance, static_cast<long long>(opt_.recheck_rounds),
                to_string(opt_.baseline), static_cast<unsigned long long>(opt_.flush_bytes),
                static_cast<unsigned long long>(opt_.placement_jitter_bytes), opt_.sample_ms,
                static_cast<long long>(opt_.max_calls), opt_.fp32_atol,
                opt_.fp32_rtol, opt_.fp16_atol, opt_.fp16_rtol, opt_.bf16_atol, opt_.bf16_rtol, opt_.rounding_factor,
                opt_.static_checks ? 1 : 0, static_cast<long long>(opt_.cpu_threads),
                static_cast<long long>(opt_.cuda_max_connections), opt_.eval_mode ? "eval" : "train");
  return buf;
}

// ---------------------------------------------------------------------------------------------

// Adds the time between construction and destruction to a counter.
struct time_spent {
  std::atomic<std::uint64_t>& total;
  clock_type::time_point t0 = clock_type::now();
  ~time_spent() {
    total += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count());
  }
};

/// One candidate's walk through the protocol. Lives on the calling thread's stack.
class evaluation {
public:
  evaluation(device_evaluator& ev, const eval_request& req, device_evaluator::ready_worker w)
    : ev_(ev), req_(req), w_(std::move(w)) {
    v_.hardware = w_.hardware;
    v_.baseline = to_string(ev.opt_.baseline);
    tol_.f64 = {ev.opt_.fp32_atol, ev.opt_.fp32_rtol};
    tol_.f32 = {ev.opt_.fp32_atol, ev.opt_.fp32_rtol};
    tol_.f16 = {ev.opt_.fp16_atol, ev.opt_.fp16_rtol};
    tol_.bf16 = {ev.opt_.bf16_atol, ev.opt_.bf16_rtol};
  }

  verdict run();
  /// The worker was SIGKILLed by someone else (the OOM killer, an operator): worth one retry.
  bool lost_worker() const noexcept { return lost_worker_; }
  /// The verdict comes from a failure in the evaluator's own process (its device memory, its
  /// comparison), not from the candidate: it is not cached.
  bool evaluator_failed() const noexcept { return evaluator_failed_; }
  /// Closes this evaluation's mappings of the worker's exports (outputs kept on the device), if
  /// an early end left any: before the worker goes.
  void drop_outputs() noexcept { reference_.clear(); }
  /// Bytes of one trial's inputs and reference outputs (0 before the reference ran): how much
  /// memory the task itself asks of the device. A loss of two 4 GiB inputs has a 4-byte output.
  std::uint64_t task_bytes() const noexcept {
    std::uint64_t n = input_bytes_;
    if (!reference_.empty())
      for (const auto& b : reference_.front())
        if (b.kind.empty())
          n += static_cast<std::uint64_t>(b.numel()) * element_size(b.type);
    return n;
  }
  /// The worker's process, after run(): for device_evaluator::retire.
  std::unique_ptr<worker> take_process() noexcept { return std::move(w_.proc); }

private:
  enum class next { more, finished };

  // Receives one message before `deadline`; on death or deadline fills the verdict and
  // returns false.
  bool receive(double seconds, const char* phase, YAML::Node& header, worker_message& msg);
  bool send(const std::string& json);
  // Handles a `done` message: fills the verdict from it.
  void take_done(const YAML::Node& n);
  void set(verdict_status s, std::string message) {
    v_.status = s;
    v_.message = std::move(message);
    failed_ = true;
  }
  // One trial's `candidate` message with its outputs decoded (mapped, for outputs on the
  // device); a decoding failure is kept and reported when the checks reach that trial.
  struct trial_outputs {
    YAML::Node header;
    std::size_t trial = 0; // the header's; past the reference's trials when it names none
    std::vector<tensor_blob> outs, again; // `again`: repeat_outputs, where the message has them
    bool has_again = false;
    std::string outs_error, again_error;
  };
  trial_outputs decode_trial(const YAML::Node& n, worker_message& msg);
  bool check_candidate(const trial_outputs& tr, const device_differences& ahead);
  void phase(const char* name) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", std::chrono::duration<double>(clock_type::now() - t0_).count());
    ev_.log_.debug("evaluator", ev_.device_, " ", req_.target.name, ": ", name, " at +", buf, " s");
    if (ev_.observer_)
      ev_.observer_(name, w_.proc->pid());
  }
  // At debug level, a wait at the device gate since `since` longer than a millisecond:
  // "<who> waited S s for <why...> to finish".
  template <class... Why>
  void log_gate_wait(clock_type::time_point since, const char* who, const Why&... why) {
    const auto waited = std::chrono::duration<double>(clock_type::now() - since).count();
    if (waited <= 1e-3 || !ev_.log_.enabled(log_level::debug))
      return;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", waited);
    ev_.log_.debug("evaluator", ev_.device_, " ", req_.target.name, ": ", who, " waited ", buf, " s for ", why...,
                   " to finish");
  }
  // Asks for `rounds` more timed rounds and appends their settled times. A continuation (more
  // rounds of the same measurement, or a recheck) follows the previous request at once and
  // plays no warm-up rounds.
  bool measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation = false);
  // One measurement: evaluator.rounds rounds, or only evaluator.min_rounds when their band is
  // already within evaluator.early_stop_spread.
  bool measure_once(const timing_policy& policy, std::vector<double>& ref, std::vector<double>& cand);

  device_evaluator& ev_;
  const eval_request& req_;
  device_evaluator::ready_worker w_;
  verdict v_;
  tolerances tol_;
  std::vector<std::vector<tensor_blob>> reference_;
  const int cuda_device_ = ev_.outputs_device_; // >= 0: outputs stay on this CUDA device
  bool measured_ = false; // a measurement was made (its warm-up rounds played)
  bool measuring_ = false; // the device gate has let this timing begin its measured rounds
  bool done_ = false; // the worker sent `done` (or died): no further messages
  bool lost_worker_ = false;
  bool failed_ = false; // set() was called: the verdict is decided
  bool evaluator_failed_ = false; // see evaluator_failed()
  /// Kernels (or operators) of the candidate's profiled call that the reference's did not run
  /// (the worker's own_work); -1 unknown. 0: no speed credit.
  long own_kernels_ = -1;
  /// Calls per timed sample (evaluator.sample_ms; the worker's choice): the times are per call.
  long calls_ = 1;
  /// Correctness trials: evaluator.trials, or fewer where the worker found that their outputs
  /// would not fit the device (its reference messages say so; Worker.fit_trials).
  std::int64_t trials_ = 0;
  std::uint64_t input_bytes_ = 0; // one trial's inputs, from the reference messages
  clock_type::time_point t0_ = clock_type::now();
};

bool evaluation::send(const std::string& json) {
  if (auto r = w_.proc->send(json); !r) {
    set(verdict_status::runtime_error, "worker stopped listening: " + r.error().message);
    return false;
  }
  return true;
}

// The correctness tolerances as the job gives them to the worker, which holds every timed call's
// outputs to them: {"float32": [atol, rtol], ...}.
static std::string tolerances_json(const tolerances& t) {
  std::string out = "{";
  const std::pair<const char*, tolerance> each[] = {{"float64", t.f64}, {"float32", t.f32}, {"float16", t.f16}, {"bfloat16", t.bf16}};
  for (const auto& [name, tol] : each) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s\"%s\":[%.17g,%.17g]", out.size() > 1 ? "," : "", name, tol.atol, tol.rtol);
    out += buf;
  }
  return out + "}";
}

bool evaluation::receive(double seconds, const char* phase, YAML::Node& header, worker_message& msg) {
  auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    switch (w_.proc->receive(deadline, msg)) {
      case receive_outcome::deadline: {
        w_.proc->kill();
        done_ = true;
        char buf[160];
        std::snprintf(buf, sizeof buf, "no progress within %.0f s while %s; the worker was killed", seconds, phase);
        set(verdict_status::timeout, buf);
        return false;
      }
      case receive_outcome::died: {
        done_ = true;
        auto how = w_.proc->exit_description();
        auto msg_text = std::string{"the worker "} + (how.rfind("killed", 0) == 0 ? "was " : "") + how + " while " + phase;
        lost_worker_ = w_.proc->died_by_signal() && w_.proc->exit_signal() == SIGKILL;
        set(verdict_status::runtime_error, msg_text);
        return false;
      }
      case receive_outcome::message: break;
    }
    try {
      header = YAML::Load(msg.json);
      if (!header.IsMap() || !header["type"].IsDefined())
        throw YAML::Exception(YAML::Mark::null_mark(), "no type");
    } catch (const YAML::Exception& e) {
      w_.proc->kill();
      done_ = true;
      set(verdict_status::runtime_error, "the worker broke the protocol while " + std::string{phase} + ": " + e.what());
      return false;
    }
    const auto type = header["type"].as<std::string>();
    if (type == "build") {
      // The build service, in any phase (Triton builds at a kernel's first launch), within the
      // phase's deadline; then the message the phase waits for.
      if (!send(ev_.build_extension(msg.json, deadline)))
        return false;
      continue;
    }
    if (type == "done") {
      take_done(header);
      done_ = true;
      return false;
    }
    return true;
  }
}

void evaluation::take_done(const YAML::Node& n) {
  if (n["host_ms"].IsDefined() && n["host_ms"].IsMap() && ev_.log_.enabled(log_level::debug)) {
    // Where the worker's host time went, step by step (docs/evaluator.md, Timing).
    std::string text;
    for (const auto& kv : n["host_ms"])
      text += "; " + kv.first.as<std::string>() + " " + kv.second.as<std::string>();
    ev_.log_.debug("evaluator", ev_.device_, " ", req_.target.name, ": worker host ms", text);
  }
  auto status = parse_verdict_status(n["status"].as<std::string>("runtime_error"));
  auto s = status.value_or(verdict_status::runtime_error);
  if (s == verdict_status::ok) {
    // The worker may only confirm; ok is decided here, from outputs and timings. A check of a
    // task alone (check_task) ran no candidate code: the worker's word that the reference ran
    // is the result.
    if (req_.reference_only)
      set(verdict_status::ok, n["message"].as<std::string>(""));
    return;
  }
  set(s, n["message"].as<std::string>(""));
  if (n["checks_failed"].IsSequence())
    for (const auto& c : n["checks_failed"])
      v_.checks_failed.push_back(c.as<std::string>());
}

evaluation::trial_outputs evaluation::decode_trial(const YAML::Node& n, worker_message& msg) {
  trial_outputs tr;
  tr.header = YAML::Clone(n); // a copy: assigning a Node shares it, and `n` is reused for the next message
  tr.trial = n["trial"].as<std::size_t>(reference_.size());
  if (auto outs = decode_outputs(n["outputs"], msg, cuda_device_))
    tr.outs = std::move(*outs);
  else
    tr.outs_error = outs.error().message;
  if (n["repeat_outputs"].IsDefined()) {
    tr.has_again = true;
    if (auto again = decode_outputs(n["repeat_outputs"], msg, cuda_device_))
      tr.again = std::move(*again);
    else
      tr.again_error = again.error().message;
  }
  return tr;
}

bool evaluation::check_candidate(const trial_outputs& tr, const device_differences& ahead) {
  const auto& n = tr.header;
  const auto trial = tr.trial;
  if (trial >= reference_.size()) {
    set(verdict_status::runtime_error, "the worker reported an unknown trial");
    return false;
  }
  if (!tr.outs_error.empty()) {
    set(verdict_status::runtime_error, "the worker broke the protocol: " + tr.outs_error);
    return false;
  }
  if (n["threads_after"].IsDefined() && n["threads_before"].IsDefined()
      && n["threads_after"].as<int>() > n["threads_before"].as<int>()) {
    v_.checks_failed.push_back("runtime:threads");
    set(verdict_status::rejected, "the candidate left threads running after its forward");
    return false;
  }
  if (const auto own = n["own_kernels"]; own.IsDefined() && own.IsScalar())
    own_kernels_ = own.as<long>(-1);
  if (n["kernels"].IsDefined() && n["kernels"].as<long>(1) == 0) {
    v_.checks_failed.push_back("runtime:no_kernel");
    set(verdict_status::rejected, "no kernel or operator ran in the candidate's forward");
    return false;
  }
  auto cmp = compare_outputs(reference_[trial], tr.outs, tol_, &ahead);
  if (!cmp.ok && cmp.evaluator_error) {
    evaluator_failed_ = true;
    set(verdict_status::runtime_error, "trial " + std::to_string(trial) + ": " + cmp.message);
    return false;
  }
  if (!cmp.ok) {
    // The worker's input distributions (docs/evaluator.md, Correctness).
    static const char* const dists[] = {"the task's inputs", "inputs scaled by U(0.5, 2)",
                                        "inputs scaled by U(0.5, 2) with random signs",
                                        "inputs scaled by U(0.5, 2) with random signs, times 32"};
    const int d = n["distribution"].as<int>(static_cast<int>(trial % 2));
    set(verdict_status::incorrect, "trial " + std::to_string(trial) + " (distribution " + std::to_string(d)
                                     + (d >= 0 && d <= 3 ? std::string{": "} + dists[d] : std::string{}) + "): " + cmp.message);
    return false;
  }
  if (!n["inputs_unchanged"].as<bool>(true)) {
    v_.checks_failed.push_back("runtime:input_mutation");
    set(verdict_status::rejected, "the candidate changed its inputs (trial " + std::to_string(trial) + ")");
    return false;
  }
  if (tr.has_again) {
    if (!tr.again_error.empty()) {
      set(verdict_status::runtime_error, "the worker broke the protocol: " + tr.again_error);
      return false;
    }
    auto same = compare_outputs(tr.outs, tr.again, tol_, &ahead);
    if (!same.ok && same.evaluator_error) {
      evaluator_failed_ = true;
      set(verdict_status::runtime_error, "trial " + std::to_string(trial) + ", second call: " + same.message);
      return false;
    }
    if (!same.ok) {
      set(verdict_status::incorrect, "not deterministic: a second call on the same inputs gave " + same.message);
      return false;
    }
  }
  return true;
}

bool evaluation::measure_once(const timing_policy& policy, std::vector<double>& ref, std::vector<double>& cand) {
  const auto& opt = ev_.opt_;
  const auto first = std::max<std::int64_t>(opt.min_rounds, static_cast<std::int64_t>(policy.buckets));
  if (opt.early_stop_spread <= 0 || first >= opt.rounds)
    return measure(opt.rounds, ref, cand);
  const auto from = ref.size();
  if (!measure(first, ref, cand))
    return false;
  std::vector<double> r(ref.begin() + static_cast<long>(from), ref.end());
  std::vector<double> c(cand.begin() + static_cast<long>(from), cand.end());
  if (may_stop_early(summarize_rounds(r, c, policy), opt.early_stop_spread, policy))
    return true; // already far inside max_spread: more rounds would cost time and tell little
  return measure(opt.rounds - first, ref, cand, true);
}

bool evaluation::measure(std::int64_t rounds, std::vector<double>& ref, std::vector<double>& cand, bool continuation) {
  time_spent timed{ev_.timing_ns_};
  // Warm-up rounds before the first measurement only: later ones (more rounds, a recheck)
  // follow at once, with the device's clocks still up (the worker still plays 3 rounds, none
  // for a continuation of the same measurement).
  char warmup[32];
  std::snprintf(warmup, sizeof warmup, "%.17g", measured_ ? 0.0 : ev_.opt_.warmup_ms);
  measured_ = true;
  // Company beside warm-up (starts, untimed work): the worker says when its warm-up is over
  // ("warmed") and begins its measured rounds at our word ("measure"), once the starting
  // workers' held steps and other evaluations' untimed phases inside are done. Without either
  // the gate lets nothing beside any part of a timing.
  const bool announce = !measuring_ && ev_.gate_.warmup_shared();
  if (!send("{\"type\":\"time\",\"rounds\":" + std::to_string(rounds) + ",\"warmup_ms\":" + warmup
            + ",\"warmup_rounds\":" + (continuation ? "0" : "3") + ",\"announce\":" + (announce ? "true" : "false")
            + "}"))
    return false;
  YAML::Node n;
  worker_message msg;
  if (!receive(ev_.opt_.run_timeout_s, "timing", n, msg))
    return false;
  if (announce) {
    if (n["type"].as<std::string>() != "warmed") {
      set(verdict_status::runtime_error, "the worker sent " + n["type"].as<std::string>() + " instead of warmed");
      return false;
    }
    const auto wait0 = clock_type::now();
    ev_.gate_.begin_measure();
    measuring_ = true;
    log_gate_wait(wait0, "measured rounds", "starting workers' initialisation",
                  ev_.gate_.untimed_beside_warmup() ? " and other evaluations' untimed work" : "");
    if (!send("{\"type\":\"measure\"}") || !receive(ev_.opt_.run_timeout_s, "timing", n, msg))
      return false;
  }
  if (n["type"].as<std::string>() != "timing") {
    set(verdict_status::runtime_error, "the worker sent " + n["type"].as<std::string>() + " instead of timing");
    return false;
  }
  auto r = as_doubles(n["ref_ms"]);
  auto c = as_doubles(n["cand_ms"]);
  auto rs = as_doubles(n["ref_stream_ms"]);
  auto cs = as_doubles(n["cand_stream_ms"]);
  if (r.size() != static_cast<size_t>(rounds) || c.size() != r.size() || rs.size() != r.size()
      || cs.size() != r.size()) {
    set(verdict_status::runtime_error, "the worker returned a wrong number of timed rounds");
    return false;
  }
  for (size_t i = 0; i < r.size(); ++i) {
    const bool finite = std::isfinite(r[i]) && std::isfinite(c[i]) && std::isfinite(rs[i]) && std::isfinite(cs[i]);
    // Both times of a call share its start event, and the synchronised stop event comes after
    // the stream's own one: anything else is a broken or tampered timer.
    if (!finite || !(rs[i] > 0) || !(cs[i] > 0) || !(rs[i] <= r[i]) || !(cs[i] <= c[i])) {
      v_.checks_failed.push_back("runtime:timer");
      set(verdict_status::rejected, "a timed round reported a non-positive or inconsistent time");
      return false;
    }
  }
  auto settled = settle_rounds(r, rs, c, cs);
  if (ev_.log_.enabled(log_level::debug)) {
    // Every round's raw times, for studying the protocol (tools/bench/timing_probe.py).
    std::string rounds_text;
    char buf[96];
    for (size_t i = 0; i < r.size(); ++i) {
      std::snprintf(buf, sizeof buf, " %.4f/%.4f:%.4f/%.4f", rs[i], r[i], cs[i], c[i]);
      rounds_text += buf;
    }
    std::snprintf(buf, sizeof buf, "%.4f", settled.host_latency_ms);
    ev_.log_.debug("evaluator", ev_.device_, " ", req_.target.name, ": host latency floor ", buf,
                   " ms; rounds ref stream/synced : cand stream/synced (ms):", rounds_text);
  }
  // The physics floor the worker measured (Worker.measure_floor): the candidate's median
  // settled time under it is faster than the device writes the outputs.
  if (const auto f = n["floor_ms"]; f.IsDefined() && f.IsScalar()) {
    const double floor_ms = f.as<double>(0.0);
    const double m = median(settled.cand_ms);
    if (m < floor_ms) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "the candidate's median timed call took %.2f us, below the floor of %.2f us (half the fastest "
                    "fill of its %lld output bytes on this device); no call produces its outputs faster than the "
                    "hardware writes them",
                    m * 1e3, floor_ms * 1e3, n["floor_bytes"].as<long long>(0));
      v_.checks_failed.push_back("runtime:below_floor");
      set(verdict_status::rejected, buf);
      return false;
    }
  }
  if (const auto k = n["calls"]; k.IsDefined() && k.IsScalar())
    calls_ = k.as<long>(1);
  r = std::move(settled.ref_ms);
  c = std::move(settled.cand_ms);
  double call_ms = 0;
  for (size_t i = 0; i < r.size(); ++i)
    call_ms += r[i] + c[i];
  ev_.timed_calls_ns_ += static_cast<std::uint64_t>(call_ms * 1e6);
  ref.insert(ref.end(), r.begin(), r.end());
  cand.insert(cand.end(), c.begin(), c.end());
  return true;
}

verdict evaluation::run() {
  const auto& opt = ev_.opt_;
  auto seed = req_.seed;
  if (seed == 0) {
    std::random_device rd;
    seed = (static_cast<std::uint64_t>(rd()) << 20) ^ rd();
    seed &= (1ull << 52) - 1; // exact in a JSON double
    if (seed == 0)
      seed = 1;
  }
  trials_ = req_.reference_only ? 1 : opt.trials;
  std::string job = "{\"type\":\"job\",\"task_name\":" + json_string(req_.target.name)
                    + ",\"task_source\":" + json_string(req_.target.source)
                    + ",\"candidate_source\":" + json_string(req_.candidate)
                    + ",\"seed\":" + std::to_string(seed)
                    + ",\"trials\":" + std::to_string(req_.reference_only ? 1 : opt.trials)
                    + (req_.reference_only ? ",\"reference_only\":true" : "")
                    + ",\"baseline\":" + json_string(to_string(opt.baseline))
                    + ",\"flush_bytes\":" + std::to_string(opt.flush_bytes != 0 ? opt.flush_bytes
                                                           : ev_.device_ == "cpu" ? (64ull << 20) : (256ull << 20))
                    + ",\"placement_jitter_bytes\":" + std::to_string(opt.placement_jitter_bytes)
                    + ",\"sample_ms\":" + std::to_string(opt.sample_ms)
                    + ",\"max_calls\":" + std::to_string(opt.max_calls)
                    + ",\"timing_reserve\":" + (opt.timing_reserve ? "true" : "false")
                    + ",\"quiet_gc\":" + (opt.quiet_gc ? "true" : "false")
                    + ",\"eval_mode\":" + (opt.eval_mode ? "true" : "false")
                    + ",\"static_checks\":" + (opt.static_checks ? "true" : "false")
                    + ",\"tolerances\":" + tolerances_json(tol_)
                    + ",\"rounding_factor\":" + std::to_string(opt.rounding_factor)
                    + ",\"outputs\":" + (cuda_device_ >= 0 && !req_.reference_only ? "\"device\"" : "\"host\"") + "}";
  YAML::Node n;
  worker_message msg;
  {
    // Phase 1: reference outputs, on the device, before any candidate code runs.
    double mapped_s = 0, copied_s = 0; // receiving (and mapping) the outputs; copying device ones
    untimed_hold device{ev_.gate_};
    phase("reference");
    if (!send(job))
      return v_;
    for (;;) {
      if (!receive(opt.reference_timeout_s, "computing the reference", n, msg))
        return v_;
      auto type = n["type"].as<std::string>();
      if (type == "phase")
        break;
      if (type == "device_done") {
        // The reference outputs follow. As host bytes, receiving and keeping them needs no
        // device; kept on the device, they are copied here, still holding it.
        if (cuda_device_ < 0)
          device.release();
        phase("reference outputs");
        continue;
      }
      if (type != "reference") {
        set(verdict_status::runtime_error, "unexpected message " + type + " during the reference phase");
        return v_;
      }
      const auto m0 = clock_type::now();
      auto outs = decode_outputs(n["outputs"], msg, cuda_device_);
      if (!outs) {
        set(verdict_status::runtime_error, "the worker broke the protocol: " + outs.error().message);
        return v_;
      }
      mapped_s += std::chrono::duration<double>(clock_type::now() - m0).count();
      // The reference's own rounding error per output (its distance from a float64 copy of
      // itself on these inputs, measured before any candidate code existed) widens atol.
      if (const auto r = n["rounding"]; r.IsSequence()) {
        for (size_t i = 0; i < std::min<size_t>(r.size(), outs->size()); ++i) {
          const double e = r[i].as<double>(0);
          if (std::isfinite(e) && e > 0)
            (*outs)[i].slack = opt.rounding_factor * e;
        }
      }
      reference_.push_back(std::move(*outs));
      if (const auto k = n["trials"]; k.IsDefined() && k.IsScalar()) // only ever fewer
        trials_ = std::clamp<std::int64_t>(k.as<std::int64_t>(trials_), 1, trials_);
      if (const auto b = n["input_bytes"]; b.IsDefined() && b.IsScalar())
        input_bytes_ = std::max<std::uint64_t>(input_bytes_, b.as<std::uint64_t>(0));
      if (cuda_device_ >= 0 && static_cast<std::int64_t>(reference_.size()) == trials_) {
        // The worker's exports are poisoned before the candidate loads: keep a copy of each, all
        // queued together and waited for once. The mappings are closed after the worker has been
        // told, while it goes on (it frees its exports only when `run` comes).
        const auto c0 = clock_type::now();
        std::vector<const device_bytes*> exported;
        for (const auto& outs_of_trial : reference_)
          for (const auto& b : outs_of_trial)
            if (b.device)
              exported.push_back(b.device.get());
        auto own = copy_all_to_owned(exported);
        if (!own) {
          evaluator_failed_ = true;
          set(verdict_status::runtime_error, "cannot keep a reference output: " + own.error().message);
          return v_;
        }
        std::vector<std::shared_ptr<device_bytes>> mappings;
        size_t k = 0;
        for (auto& outs_of_trial : reference_)
          for (auto& b : outs_of_trial)
            if (b.device)
              mappings.push_back(std::exchange(b.device, std::move((*own)[k++])));
        copied_s += std::chrono::duration<double>(clock_type::now() - c0).count();
        if (!send("{\"type\":\"taken\"}"))
          return v_;
        phase("reference kept"); // the worker now poisons its exports
        mappings.clear();
      }
    }
    if (ev_.log_.enabled(log_level::debug)) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "received in %.4f s, copied in %.4f s", mapped_s, copied_s);
      ev_.log_.debug("evaluator", ev_.device_, " ", req_.target.name, ": reference outputs ", buf);
    }
    if (static_cast<std::int64_t>(reference_.size()) != trials_) {
      set(verdict_status::runtime_error, "the worker sent " + std::to_string(reference_.size()) + " reference trials, expected "
                                           + std::to_string(trials_));
      return v_;
    }
  }
  // Phase 2: the candidate imports and compiles without the device; the extensions its module
  // builds are built by our build service (device_evaluator::build_extension, answered inside
  // receive), not by it.
  phase("load");
  if (!receive(opt.load_timeout_s, "loading the candidate", n, msg))
    return v_;
  if (n["type"].as<std::string>() != "loaded") {
    set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " while loading");
    return v_;
  }
  // Phase 3: trials, holding the device until the worker has computed every output; the
  // outputs are then compared without it.
  std::optional<untimed_hold> device{std::in_place, ev_.gate_};
  phase("trials");
  if (!send("{\"type\":\"run\"}"))
    return v_;
  if (!receive(opt.run_timeout_s, "running the correctness trials", n, msg))
    return v_;
  if (n["type"].as<std::string>() != "device_done") {
    set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " during the trials");
    return v_;
  }
  if (cuda_device_ < 0)
    device.reset(); // host bytes: moving and comparing them needs no device
  phase("trial outputs");
  {
    // Every trial's outputs first, then all device comparisons in one batch (one wait on the
    // device instead of one per output), then the checks trial by trial, in order.
    std::vector<trial_outputs> trials;
    for (std::int64_t t = 0; t < trials_; ++t) {
      if (!receive(opt.run_timeout_s, "running the correctness trials", n, msg))
        return v_;
      if (n["type"].as<std::string>() != "candidate") {
        set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " during the trials");
        return v_;
      }
      trials.push_back(decode_trial(n, msg));
    }
    std::vector<output_lists> lists;
    for (const auto& tr : trials) {
      if (tr.trial < reference_.size() && tr.outs_error.empty())
        lists.emplace_back(&reference_[tr.trial], &tr.outs);
      if (tr.has_again && tr.outs_error.empty() && tr.again_error.empty())
        lists.emplace_back(&tr.outs, &tr.again);
    }
    const auto ahead = compare_on_device_ahead(lists, tol_);
    const bool all_pass = std::all_of(trials.begin(), trials.end(),
                                      [&](const trial_outputs& tr) { return check_candidate(tr, ahead); });
    trials.clear(); // the mappings close before the worker frees what they map (at its next message)
    if (!all_pass) {
      (void) w_.proc->send("{\"type\":\"stop\"}");
      return v_;
    }
  }
  v_.correct = true;
  timing_policy policy{static_cast<std::size_t>(opt.buckets), opt.max_spread, opt.max_bucket_disagreement,
                       opt.win_threshold, opt.band_floor};
  std::vector<double> ref, cand;
  // Phase 4: timing (and re-measurement) with the device to itself: no other evaluation's
  // untimed work and no worker's held initialisation beside its measured rounds (beside its
  // warm-up only with evaluator.untimed_beside_warmup / starts_beside_warmup; measure()). While
  // it waits, no new untimed work starts (unless allowed beside warm-up); what has started
  // finishes its phase.
  const auto wait0 = clock_type::now();
  device.reset();
  timed_hold timed{ev_.gate_};
  log_gate_wait(wait0, "timing", "other timings",
                ev_.gate_.untimed_beside_warmup() ? "" : ", other evaluations' untimed device work",
                ev_.gate_.starts_beside_warmup() ? "" : ", starting workers' initialisation");
  phase("timing");
  if (!measure_once(policy, ref, cand))
    return v_;
  auto summary = summarize_rounds(ref, cand, policy);
  while (!summary.stable && static_cast<std::int64_t>(ref.size()) + opt.rounds <= opt.max_rounds) {
    if (!measure(opt.rounds, ref, cand))
      return v_;
    summary = summarize_rounds(ref, cand, policy);
  }
  const bool settled = summary.stable; // the first measurement's, before any recheck's rounds join it
  if (summary.speedup > opt.recheck_above) {
    // A large speedup is measured again, independently, before it is believed. The second
    // measurement is shorter (evaluator.recheck_rounds): it only has to agree. Two measurements
    // agree when they differ by less than the tolerance plus both their bands (ordinary noise);
    // when the first two do not, a third decides. The speedup then comes from the rounds of an
    // agreeing pair together; a candidate with no agreeing pair is rejected.
    struct rounds_of {
      std::vector<double> ref, cand;
      timing_summary summary;
    };
    std::vector<rounds_of> runs;
    runs.push_back({std::move(ref), std::move(cand), summary});
    auto agree = [&](const timing_summary& a, const timing_summary& b) {
      auto lo = std::min(a.speedup, b.speedup);
      auto hi = std::max(a.speedup, b.speedup);
      return (hi - lo) / lo <= opt.recheck_tolerance + a.band + b.band;
    };
    std::optional<std::size_t> partner; // of runs.back()
    for (int attempt = 0; attempt < 2 && !partner; ++attempt) {
      rounds_of again;
      if (!measure(opt.recheck_rounds, again.ref, again.cand, true))
        return v_;
      again.summary = summarize_rounds(again.ref, again.cand, policy);
      runs.push_back(std::move(again));
      for (std::size_t a = 0; a + 1 < runs.size() && !partner; ++a)
        if (agree(runs[a].summary, runs.back().summary))
          partner = a;
    }
    if (!partner) {
      v_.checks_failed.push_back("runtime:recheck");
      std::string what = "independent measurements of a large speedup disagree:";
      for (const auto& r : runs) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %.3fx (±%.1f%%)", r.summary.speedup, 100 * r.summary.band);
        what += buf;
      }
      set(verdict_status::rejected, what);
      v_.correct = true;
      return v_;
    }
    ref = std::move(runs[*partner].ref);
    cand = std::move(runs[*partner].cand);
    ref.insert(ref.end(), runs.back().ref.begin(), runs.back().ref.end());
    cand.insert(cand.end(), runs.back().cand.begin(), runs.back().cand.end());
    summary = summarize_rounds(ref, cand, policy);
  }
  const auto speedup = summary.speedup;
  phase("finish");
  if (!send("{\"type\":\"finish\"}"))
    return v_;
  if (receive(opt.run_timeout_s, "finishing", n, msg)) {
    set(verdict_status::runtime_error, "unexpected message " + n["type"].as<std::string>() + " after timing");
    return v_;
  }
  if (failed_)
    return v_; // death, deadline, or a `done` that carried a failure (a runtime check after timing)
  v_.status = verdict_status::ok;
  // A candidate whose forward ran the reference's own kernels (operators on the CPU), each as many
  // times, earns no speed credit: a fallback to the reference's code, or the reference itself
  // (docs/evaluator.md, Own work). Its measured times stay in ref_ms and cand_ms.
  const bool lazy = own_kernels_ == 0;
  // A speedup counts only when its whole band clears the threshold: a verdict of 1.04x within
  // ±11% may as well be 0.93x, and crediting it rewards noise (docs/evaluator.md, Timing: the
  // band). Below 1.00x the measured figure stands: the best estimate of a slower kernel.
  const bool cleared = band_clears(summary, opt.win_threshold);
  const bool uncertain = speedup > 1.0 && !cleared;
  v_.speedup = credited_speedup(summary, opt.win_threshold, lazy);
  v_.speedup_spread = summary.band;
  v_.ref_ms = summary.ref_ms;
  v_.cand_ms = summary.cand_ms;
  v_.rounds = static_cast<std::uint32_t>(ref.size());
  char buf[400];
  char calls[48] = "";
  if (calls_ > 1)
    std::snprintf(calls, sizeof calls, " of %ld calls", calls_);
  std::snprintf(buf, sizeof buf, "%s: %.3fx over %zu paired rounds%s (band ±%.1f%%)%s%s%s",
                cleared && !lazy ? "faster" : speedup < 1.0 / opt.win_threshold ? "slower" : "no faster",
                speedup, ref.size(), calls, 100 * summary.band, settled ? "" : "; unstable after max_rounds",
                lazy && speedup > 1.0 ? "; no speed credit: the candidate ran the reference's own kernels, each as many "
                                        "times (credited 1.00x)"
                                      : "",
                uncertain && !lazy ? "; the band reaches below the win threshold, so no speedup is credited (1.00x)"
                                   : "");
  v_.message = buf;
  if (trials_ < opt.trials)
    v_.message += "; " + std::to_string(trials_) + " correctness trial" + (trials_ == 1 ? "" : "s") + " of "
                  + std::to_string(opt.trials) + ": more of the task's outputs would not fit the device";
  return v_;
}

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
    log_.warn("evaluator", device_, ": ", first.v.message, "; retrying on a fresh worker");
    auto again = take_worker();
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
