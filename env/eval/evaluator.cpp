// The evaluator's pool of workers for one device: it finds the harness, starts workers (from a
// zygote where it can) and keeps them warm, builds extensions for them, and runs one candidate's
// evaluation (env/eval/evaluation.cpp) on a worker, with the retries and the verdict cache around it.
#include "env/eval/evaluator.hpp"
#include "env/eval/device_kind.hpp"
#include "env/eval/device/mps.hpp"
#include "env/eval/build_service.hpp"
#include "env/eval/evaluation.hpp"
#include "env/eval/limits.hpp"

#include "core/device.hpp"
#include "core/file_io.hpp"

#include <yaml-cpp/yaml.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>

#include "core/sha256.hpp"
#include "env/eval/device/device_agent.hpp"
#include "env/eval/device/device_bytes.hpp"
#include "env/reward.hpp"

namespace crucible::env {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

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
    if (fs::exists(r / "env" / "eval" / "harness" / "worker.py")) {
      checkout = r;
      break;
    }
  }
  if (loc.worker_py.empty()) {
    if (checkout.empty())
      return fail(errc::not_found, "cannot find env/eval/harness/worker.py above ", executable_dir().string(),
                  " or in the working directory (set CRUCIBLE_HARNESS)");
    loc.worker_py = checkout / "env" / "eval" / "harness" / "worker.py";
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

result<std::vector<std::unique_ptr<device_evaluator>>> make_device_evaluators(const evaluator_options& opt,
                                                                              const reward_options& reward,
                                                                              const std::vector<std::string>& devices,
                                                                              logger& log, verdict_cache_use use) {
  auto where = locate_harness(opt);
  if (!where)
    return where.error();
  // Before anything of this process's starts CUDA, and before the workers' environment is made.
  if (auto mps = prepare_cuda_mps(opt, devices, log); !mps)
    return mps.error();
  std::shared_ptr<verdict_cache> cache;
  if (use == verdict_cache_use::configured) {
    auto opened = verdict_cache::open_configured(opt.cache);
    if (!opened)
      return opened.error();
    cache = std::move(*opened);
  }
  const bool configured = devices == opt.devices;
  // Every device's warm pool starts before any is waited for: the devices warm up together, so
  // the start does not grow with their number.
  std::vector<std::unique_ptr<device_evaluator>> out;
  for (const auto& device : devices)
    out.push_back(device_evaluator::launch(opt, reward, *where, device, log, cache));
  for (std::size_t i = 0; i < devices.size(); ++i)
    if (auto started = out[i]->wait_started(); !started)
      return fail(started.error().code, configured ? "evaluator.devices[" + std::to_string(i) + "] " : std::string{},
                  devices[i], ": ", started.error().message);
  return out;
}

// ---------------------------------------------------------------------------------------------

device_evaluator::device_evaluator(const evaluator_options& opt, const reward_options& reward,
                                   harness_location where, std::string device, logger& log,
                                   std::shared_ptr<verdict_cache> cache)
  : opt_(opt), reward_(reward), where_(std::move(where)), device_(std::move(device)), log_(log),
    cache_(std::move(cache)), gate_(shared_gate(device_, opt.share_untimed, opt.starts_beside_warmup, opt.untimed_beside_warmup)),
    flush_(opt.flush_bytes) {
  const auto scratch_root = fs::temp_directory_path() / "crucible";
  // What an evaluator killed earlier (kill -9, a crash) left behind: its workers died with it
  // (PR_SET_PDEATHSIG), their scratch folders did not.
  if (auto r = reclaim_scratch(scratch_root); r.removed > 0 || r.failed > 0)
    log_.info("evaluator", device_, ": removed ", r.removed, " scratch folders of evaluators no longer running (",
              r.bytes >> 20, " MiB) under ", scratch_root.string(),
              r.failed > 0 ? "; " + std::to_string(r.failed) + " could not be removed" : std::string{});
  // and their control groups (env/eval/control_group.hpp), emptied and removed.
  if (const auto groups = reclaim_control_groups(); groups > 0)
    log_.info("evaluator", device_, ": removed the workers' control groups of ", groups, " evaluators no longer running");
  const auto extensions_dir = opt_.extensions_dir.empty() ? cache_home() / "extensions" : fs::path{opt_.extensions_dir};
  pool_ = std::make_unique<worker_pool>(opt_, where_, device_, log_, *gate_, scratch_root, extensions_dir);
  builds_ = std::make_unique<build_service>(*pool_, where_.python, extensions_dir);
}

result<std::unique_ptr<device_evaluator>> device_evaluator::create(const evaluator_options& opt,
                                                                   const reward_options& reward,
                                                                   const harness_location& where,
                                                                   std::string device, logger& log,
                                                                   std::shared_ptr<verdict_cache> cache) {
  if (auto mps = prepare_cuda_mps(opt, {device}, log); !mps)
    return mps.error();
  auto ev = launch(opt, reward, where, std::move(device), log, std::move(cache));
  if (auto started = ev->wait_started(); !started)
    return started.error();
  return ev;
}

std::unique_ptr<device_evaluator> device_evaluator::launch(const evaluator_options& opt, const reward_options& reward,
                                                           const harness_location& where, std::string device,
                                                           logger& log, std::shared_ptr<verdict_cache> cache) {
  std::unique_ptr<device_evaluator> ev{new device_evaluator(opt, reward, where, std::move(device), log, std::move(cache))};
  if (kind_of(ev->device_).outputs_on_device) {
    // Outputs stay on the device: this process maps the workers' exports and compares them with
    // its own kernel. Its CUDA context is made now, not inside the first verdict; without it no
    // verdict of the device can be judged across the trust boundary (evaluation.cpp's judge).
    constexpr const char* unjudged = "; no verdict of this device can be judged (checks of a task alone still run)";
    if (!device_bytes_available()) {
      log.warn("evaluator", ev->device_, ": built without CUDA", unjudged);
    } else {
      const auto id = parse_device(ev->device_);
      if (!id) {
        log.warn("evaluator", ev->device_, ": ", id.error().message, unjudged);
      } else if (auto name = device_name(id->index); name) {
        ev->outputs_device_ = id->index;
        if (auto kept = keep_freed_memory(id->index, ev->opt_.keep_freed_mb << 20); !kept)
          log.warn("evaluator", ev->device_, ": ", kept.error().message);
      } else if (name.error().code == errc::not_found) {
        // No such device here: no worker could start on it either, and each would say so with a
        // traceback of torch's. The evaluator does not start (wait_started says why).
        ev->start_error_ = name.error();
        return ev;
      } else {
        log.warn("evaluator", ev->device_, ": ", name.error().message, unjudged);
      }
    }
  }
  ev->pool_->launch();
  return ev;
}

result<void> device_evaluator::wait_started() {
  if (start_error_)
    return *start_error_;
  if (auto started = pool_->wait_started(); !started)
    return started.error();
  log_.info("evaluator", device_, ": ", hardware(), " (", where_.python, ")");
  return {};
}

device_evaluator::~device_evaluator() = default;

std::string device_evaluator::hardware() const { return pool_->hardware(); }
isolation_report device_evaluator::isolation() const { return pool_->isolation(); }
bool device_evaluator::wait_warm(double timeout_s) { return pool_->wait_warm(timeout_s); }
std::size_t device_evaluator::warm_now() const { return pool_->warm_now(); }
std::uint64_t device_evaluator::extension_builds() const noexcept { return builds_->builds(); }
std::uint64_t device_evaluator::header_builds() const noexcept { return builds_->header_builds(); }

std::string device_evaluator::build_extension(const std::string& request, clock_type::time_point deadline) {
  return builds_->build(request, deadline);
}

std::string device_evaluator::protocol_key() const {
  // Everything that can change a verdict of the same code on the same hardware.
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "%s;trials=%lld;rounds=%lld;max_rounds=%lld;min_rounds=%lld/%g;slow=%lld/%g;warmup=%g;buckets=%lld;spread=%g/%g;disagree=%g;win=%g;"
                "recheck=%g/%g/%lld;baseline=%s;flush=%llu;jitter=%llu;sample=%g/%lld;tol=%g/%g/%g/%g/%g/%g/%g;static=%d;threads=%lld;connections=%lld;"
                "mode=%s;boundary=process/%g/1/%d;huge_pages=%d", // boundary: as when a verdict could take another path, so that kept keys still match
                protocol_version, static_cast<long long>(opt_.trials), static_cast<long long>(opt_.rounds),
                static_cast<long long>(opt_.max_rounds), static_cast<long long>(opt_.min_rounds), opt_.early_stop_spread,
                static_cast<long long>(opt_.slow_stop_rounds), opt_.slow_stop_below, opt_.warmup_ms, static_cast<long long>(opt_.buckets), opt_.max_spread, opt_.band_floor,
                opt_.max_bucket_disagreement, opt_.win_threshold, opt_.recheck_above, opt_.recheck_tolerance, static_cast<long long>(opt_.recheck_rounds),
                to_string(opt_.baseline), static_cast<unsigned long long>(opt_.flush_bytes),
                static_cast<unsigned long long>(opt_.placement_jitter_bytes), opt_.sample_ms,
                static_cast<long long>(opt_.max_calls), opt_.fp32_atol,
                opt_.fp32_rtol, opt_.fp16_atol, opt_.fp16_rtol, opt_.bf16_atol, opt_.bf16_rtol, opt_.rounding_factor,
                opt_.static_checks ? 1 : 0, static_cast<long long>(opt_.cpu_threads),
                static_cast<long long>(opt_.cuda_max_connections), opt_.eval_mode ? "eval" : "train",
                opt_.reference_band, opt_.cuda_clock_poll ? 1 : 0, opt_.huge_pages ? 1 : 0);
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
    worker_pool& pool;
    explicit in_flight(worker_pool& p) : pool(p) { pool.evaluation_begins(); }
    ~in_flight() { pool.evaluation_ends(); }
    in_flight(const in_flight&) = delete;
    in_flight& operator=(const in_flight&) = delete;
  } flying{*pool_};
  auto finish = [&](verdict v) {
    v.wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    // How far from the limit (evaluator.limits): the task's bound on this hardware, where its
    // peaks are known in this process (a cached verdict gets it too; off, none carries it).
    // A reference whose own call moved its bytes faster than the measured copy rate raises that
    // rate first (raise_copy_rate): a bound no honest call beats. The call taken is at the fast
    // edge of the verdict's band (at most 5%): the same code measures anywhere within it (on an
    // H200, KernelBench's 48_Mean_reduction against itself: its reference at 1.000 of the raised
    // bound, the identical candidate 0.14% faster at 1.0014).
    v.bound = {};
    if (opt_.limits) {
      const auto& hw = v.hardware.empty() ? hardware() : v.hardware;
      const double band = std::isfinite(v.speedup_spread) ? std::clamp(v.speedup_spread, 0.0, 0.05) : 0.0;
      const double edge_ms = v.ref_ms / (1.0 + band);
      if (const double raised = peaks_registry::process().observe(hw, v.work, edge_ms); !std::isnan(raised)) {
        char buf[200];
        std::snprintf(buf, sizeof buf, "%.3f TB/s (its reference's own call: %.4f ms for %.0f bytes, %.4f ms at its band's fast edge)",
                      raised / 1e9, v.ref_ms, v.work.bytes_read + v.work.bytes_written, edge_ms);
        log_.info("evaluator", device_, " ", req.target.name, ": the copy rate of ", hw, " raised to ", buf);
      }
      if (auto peaks = peaks_registry::process().find(hw))
        v.bound = bound_of(v.work, *peaks);
    }
    v.reward = compute_reward(v, reward_);
    return v;
  };
  // evaluator.isolation best-effort: every verdict says what the sandbox lacked.
  auto note_isolation = [&](verdict v) {
    if (auto iso = isolation(); !iso.missing.empty())
      v.message = "[sandbox best-effort, without: " + iso.missing_text() + "] " + v.message;
    return v;
  };
  auto w = pool_->take();
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
      pool_->give_back(std::move(*w)); // it never saw the candidate
      hit->cache_hit = true;
      return note_isolation(finish(*hit));
    }
  }
  bool evaluator_failed = false; // the verdict reports this process's failure, not the candidate's
  // The first verdict on a hardware whose peaks this process lacks has its reference's worker
  // measure them (one verdict at a time asks; one that brings none lets the next ask).
  const bool ask_peaks = opt_.limits && !peaks_registry::process().find(w->hardware) && !peaks_asked_.exchange(true);
  const evaluation_context context{opt_,      device_,   log_,   *gate_,     *pool_,           *builds_,  baselines_,
                                   counters_, flush_,    observer_, outputs_device_, protocol_key(), ask_peaks};
  // One evaluation on a worker, beside the others or alone on the device (solo_gate).
  struct attempt {
    verdict v;
    bool lost_worker = false;
    bool device_fault = false;    // its device's agent ended while it ran (env/eval/device/device_agent.hpp)
    std::string mps_changed;      // what of the MPS daemon was changed while it ran (check_cuda_mps)
    std::uint64_t task_bytes = 0; // one trial's inputs and reference outputs
  };
  const int agent_device = outputs_device_ >= 0 && device_agent_running(outputs_device_) ? outputs_device_ : -1;
  // held: the caller holds the device alone already (again_alone below).
  auto run_once = [&](auto&& worker, bool alone, bool fresh = false, bool held = false) {
    const auto agents_before = agent_device >= 0 ? device_agent_generation(agent_device) : 0;
    const auto daemon_before = agent_device >= 0 ? cuda_mps_restarts() : 0;
    std::optional<solo_hold> hold;
    if (!held)
      hold.emplace(solo_, alone);
    if (alone) {
      // The device's memory to this evaluation: the workers of the evaluations that ended are
      // reaped, and this process's pool returns what it kept of their reference copies (up to
      // evaluator.keep_freed_mb; KernelBench level 1 on an H100 failed alone for want of it).
      pool_->await_retired();
      if (outputs_device_ >= 0)
        if (auto r = release_freed_memory(outputs_device_); !r)
          log_.warn("evaluator", device_, ": ", r.error().message);
    }
    evaluation e{context, req, std::move(worker)};
    if (fresh)
      e.use_fresh_workers();
    attempt a;
    a.v = e.run();
    if (auto peaks = e.take_peaks()) {
      peaks->hardware = hardware();
      log_.info("evaluator", device_, ": peaks of ", peaks->hardware, ": ", to_json(*peaks));
      peaks_registry::process().keep(std::move(*peaks));
    }
    a.task_bytes = e.task_bytes();
    e.drop_outputs();
    pool_->retire(e.take_process());
    if (auto cand = e.take_candidate_process())
      pool_->retire(std::move(cand));
    a.lost_worker = e.lost_worker();
    evaluator_failed = e.evaluator_failed();
    // Under MPS a fault of any client ends every client's context on the device, the agent's and
    // other verdicts' workers included: a verdict that did not end ok while the agent ended (or
    // that ends with it no longer taking work) may carry another candidate's fault.
    if (agent_device >= 0) {
      a.mps_changed = check_cuda_mps(log_); // a candidate can reach the daemon's control socket
      if (a.mps_changed.empty() && cuda_mps_restarts() != daemon_before)
        a.mps_changed = "the MPS control daemon was changed beside it and started again";
    }
    if (agent_device >= 0 && a.v.status != verdict_status::ok)
      a.device_fault = device_agent_generation(agent_device) != agents_before || !device_agent_alive(agent_device);
    return a;
  };
  auto v = [&] {
    auto first = run_once(*w, false);
    // Once more on a worker from the pool (alone on the device or beside others), `how` in the log.
    auto judge_again = [&](const char* how, bool alone) -> std::optional<attempt> {
      log_.warn("evaluator", device_, " ", req.target.name, ": ", first.v.message.substr(0, 200), "; ", how);
      auto again = pool_->take();
      if (!again)
        return std::nullopt;
      return run_once(*again, alone);
    };
    const bool out_of_memory = kind_of(device_).out_of_memory_alone && first.v.status == verdict_status::runtime_error
                               && out_of_device_memory(first.v.message);
    if (out_of_memory && (first.v.message.find("ModelNew") == std::string::npos || first.task_bytes >= retry_alone_bytes)) {
      // Out of device memory beside other evaluations (KernelBench's level 1 at concurrency 6 on
      // an H100: tasks of 6.4 GB inputs and outputs): once more alone on the device, after the
      // evaluations running now have ended. Out of memory alone is the task's or candidate's. A
      // candidate's own call out of memory is retried so only where the task's inputs and outputs are large
      // (retry_alone_bytes): else a policy writing allocations that fail would hold up the
      // evaluator's other verdicts each time.
      auto second = judge_again("retrying alone on the device", true);
      if (!second)
        return first.v;
      if (second->v.status == verdict_status::runtime_error && out_of_device_memory(second->v.message))
        second->v.message += " (alone on the device as well)";
      return second->v;
    }
    // Under MPS, after a fault or a change to the daemon while this verdict ran: judged again alone
    // on the device, on new workers, once the agent has started again (its restart first ends
    // this process's other clients of the faulted server, the idle workers among them). A
    // candidate that does it again alone is the one that did.
    // The device is held alone from before the restart to the verdict's end: two verdicts caught
    // by one fault (on an H200, an illegal address beside a legitimate verdict) would otherwise
    // both restart the agent and start workers, and the faulting one's second run would end the
    // other's agent and workers again, blaming it for the fault.
    auto again_alone = [&](const std::string& what) -> std::optional<attempt> {
      log_.warn("evaluator", device_, " ", req.target.name, ": ", what, " during this verdict (", first.v.message.substr(0, 160),
                "); judging it again alone on the device");
      solo_hold hold{solo_, true};
      pool_->discard_idle();
      if (auto r = restart_device_agent(agent_device); !r) // here, before the new workers
        log_.warn("evaluator", device_, ": ", r.error().message);
      pool_->discard_idle(); // any started while the faulted server was still there
      auto again = pool_->start_fresh();
      if (!again)
        return std::nullopt;
      return run_once(*again, true, true, true);
    };
    if (!first.mps_changed.empty()) {
      auto second = again_alone(first.mps_changed);
      if (!second)
        return first.v;
      if (second->mps_changed.empty())
        return second->v;
      verdict refused = second->v;
      refused.status = verdict_status::rejected;
      refused.speedup = NAN;
      refused.speedup_spread = NAN;
      refused.checks_failed.push_back("runtime:mps_control");
      refused.message = "the candidate changed the device's MPS control daemon (" + second->mps_changed
                        + "), judged alone on the device; its socket is reachable by every client, and what it sets reaches every later verdict";
      return refused;
    }
    if (first.device_fault) {
      auto second = again_alone("the device's agent ended");
      if (!second)
        return first.v;
      if (second->device_fault)
        second->v.message += " (judged again alone on the device, it ended the device's agent again: the fault is its own)";
      return second->v;
    }
    if (first.v.status == verdict_status::rejected
        && first.v.checks_failed == std::vector<std::string>{"runtime:slow_reference"}) {
      // The reference slower during the verdict than alone, and nothing else against it: the
      // candidate's doing, or the host's load falling between the two windows (CI's two cores,
      // a neighbour test ending: the honest in-place relu of 01_relu_scale refused so). Judged
      // once more on other workers; a candidate that slows the reference does it again, and a
      // load change that falls just so twice is rare. The first verdict is in the log only.
      auto second = judge_again("judging it again on other workers", false);
      if (!second)
        return first.v;
      if (second->v.status == verdict_status::rejected
          && std::find(second->v.checks_failed.begin(), second->v.checks_failed.end(), "runtime:slow_reference")
               != second->v.checks_failed.end())
        second->v.message += " (in two verdicts)";
      return second->v;
    }
    if (!first.lost_worker && !evaluator_failed)
      return first.v;
    // A worker killed from outside is retried once on a fresh worker, so an operator's kill
    // or a neighbour's memory pressure loses nothing; a candidate that exhausts memory again
    // is killed again and keeps its runtime_error. So is a failure of this process's own (its
    // copy of a reference output found the device full while other evaluations held it: CUDA-L1's
    // 3090 release, level 1 task 60, at concurrency 6): the candidate is not to blame for it.
    // Fresh means started now, not taken from the idle ones, for the reference's worker and, across
    // the trust boundary, the candidate's: what killed this worker (an operator killing every
    // process below the run, the kernel's OOM killer) may have killed them too, and one of them
    // would fail the retry as "killed ... before it took the job".
    log_.warn("evaluator", device_, ": ", first.v.message, "; retrying on a fresh worker");
    auto again = pool_->start_fresh();
    if (!again)
      return first.v;
    auto second = run_once(*again, false, true);
    if (second.lost_worker)
      second.v.message += " (twice; out of memory?)";
    return second.v;
  }();
  if (ask_peaks && !peaks_registry::process().find(hardware()))
    peaks_asked_ = false; // its reference's worker brought none: the next verdict asks
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
