// service/verdict_service.hpp: the evaluator pool behind `crucible serve` (docs/service.md). A
// bounded queue of requests, each (task, candidate) judged by a device evaluator exactly as
// `crucible eval` judges it, `evaluator.concurrency` at a time per device; requests named by an
// id are judged once however often they are sent, and their verdicts are kept for later asks.
// No HTTP here: tools/crucible/cmd_serve.cpp puts this behind its endpoints.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "env/eval/evaluator.hpp"
#include "env/task.hpp"
#include "env/verdict.hpp"

namespace crucible::service {

/// Limits of the service. Plain value.
struct service_options {
  std::int64_t queue_limit = 64;   ///< requests waiting or being judged, at most; more are refused at once
  std::int64_t remember = 4096;    ///< judged requests whose verdicts are kept for their ids (oldest dropped)
  std::int64_t concurrency = 1;    ///< verdicts in flight per device (evaluator.concurrency)
};

/// One request: a task, a candidate, and what names it. Plain value.
struct verdict_request {
  std::string id;           ///< the client's; empty: the service names it
  env::task task;
  std::string candidate;    ///< Python source defining ModelNew
  std::uint64_t seed = 0;   ///< inputs' seed; 0: random
  bool use_cache = true;    ///< read and write the verdict cache, as `crucible eval` does
};

/// The service's counters (the metrics endpoint's). Plain value.
struct service_counters {
  std::int64_t queued = 0; ///< waiting for a device (the queue's length when counters() read it)
  std::int64_t running = 0, judged = 0, refused_full = 0, duplicates = 0;
  std::map<std::string, std::int64_t> by_status; ///< verdict status -> count
  double judged_wall_s = 0;                      ///< the judged requests' evaluation time, in all
};

/// What judges the service's requests: a local device evaluator, or the evaluators of nodes that
/// joined (tools/crucible/cmd_serve.cpp). Each runs on threads of the service.
class judge {
public:
  virtual ~judge() = default;
  /// Its name in logs and /v1/health: "cpu", "cuda:0", "nodes".
  virtual std::string device() const = 0;
  /// The device model it judges on ("" while unknown).
  virtual std::string hardware() const = 0;
  /// Whether it can judge `r` now (nodes know the registered tasks only). Called under the
  /// service's lock: quick, no blocking.
  virtual bool takes(const env::eval_request& r) const = 0;
  /// Whether it could ever take `r` (nodes: a registered task, fresh inputs, the cache read),
  /// whether or not it can now.
  virtual bool could_take(const env::eval_request& r) const { return takes(r); }
  /// The verdict of `r`; nullopt when it could not judge it after all (a node left): the
  /// request goes back to the head of the queue.
  virtual std::optional<env::verdict> evaluate(const env::eval_request& r) = 0;
};

class verdict_service {
public:
  /// One judged or pending request. Thread-safe through the service.
  struct entry;
  enum class admission : std::uint8_t {
    queued,   ///< new: waiting for a device
    known,    ///< its id was seen before with the same request: the same entry
    full,     ///< refused: the queue holds queue_limit requests
    conflict, ///< refused: its id was seen before with another request
    stopping, ///< refused: the service is shutting down
  };
  struct ticket {
    admission how = admission::full;
    std::shared_ptr<entry> e; ///< set for queued and known
    std::string id;           ///< the request's id (the service's where it gave none)
  };

  /// Takes the device evaluators (env::make_device_evaluators, one per device) and starts
  /// `concurrency` judging threads for each.
  verdict_service(std::vector<std::unique_ptr<env::device_evaluator>> evaluators, service_options opt, logger& log);
  /// Stops taking requests, finishes the ones being judged, answers the waiting ones
  /// `runtime_error` ("the service stopped"), and joins its threads.
  ~verdict_service();
  verdict_service(const verdict_service&) = delete;
  verdict_service& operator=(const verdict_service&) = delete;

  ticket submit(verdict_request r);
  /// Adds a judge with `concurrency` threads (evaluator nodes, once their pool exists).
  void add_judge(std::shared_ptr<judge> j, std::int64_t concurrency);
  /// Wakes the threads: a judge's takes() may have changed (a node joined or left).
  void wake();
  /// Whether some judge could take `r`, now or later (false: the service cannot judge it).
  bool can_judge(const env::eval_request& r) const;
  /// The verdict of `t` once judged, waiting until `until` at most; nullopt at the deadline.
  std::optional<env::verdict> wait(const ticket& t, std::chrono::steady_clock::time_point until);
  /// The request `id` as known: nullopt for an id never seen (or forgotten), else its verdict
  /// once judged (`judged` false while it waits or runs).
  struct lookup {
    bool judged = false;
    env::verdict v;
    std::string task; ///< the task's name
  };
  std::optional<lookup> find(const std::string& id) const;
  service_counters counters() const;
  /// The judges' names, local devices first ("cpu", "cuda:0", then "nodes" where nodes may join).
  std::vector<std::string> devices() const;
  /// Their device models ("NVIDIA H100 80GB HBM3", the CPU's), in the same order.
  std::vector<std::string> hardware() const;

private:
  void judge_loop(std::shared_ptr<judge> j);

  service_options opt_;
  logger& log_;
  std::vector<std::shared_ptr<judge>> judges_; // guarded by mtx_
  mutable std::mutex mtx_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<entry>> queue_;
  std::map<std::string, std::shared_ptr<entry>> by_id_;
  std::deque<std::string> judged_order_; // ids of judged entries, oldest first: forgotten past `remember`
  std::uint64_t next_id_ = 0;
  bool stopping_ = false;
  service_counters counters_;
  std::vector<std::thread> threads_;
};

} // namespace crucible::service
