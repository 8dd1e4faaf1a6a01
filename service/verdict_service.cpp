// The evaluator pool behind `crucible serve` (service/verdict_service.hpp).
#include "service/verdict_service.hpp"

#include <algorithm>
#include <utility>

#include "core/sha256.hpp"

namespace crucible::service {

using clock_type = std::chrono::steady_clock;

struct verdict_service::entry {
  std::string id;
  std::string fingerprint; // what the request asked: a retry with the same id must ask the same
  env::eval_request req;
  bool judged = false;
  env::verdict v;
  std::condition_variable done;
};

namespace {

// The request's identity beside its id (a digest of task source, name, candidate, seed and
// cache use): a retry must ask the same, and a kept entry holds 64 characters of it.
std::string fingerprint_of(const verdict_request& r) {
  return sha256_hex(r.task.sha256 + "\n" + r.task.name + "\n" + std::to_string(r.seed) + (r.use_cache ? "c" : "n")
                    + "\n" + r.candidate);
}

} // namespace

verdict_service::verdict_service(std::vector<std::unique_ptr<env::device_evaluator>> evaluators, service_options opt,
                                 logger& log)
    : opt_(opt), log_(log), evaluators_(std::move(evaluators)) {
  for (auto& ev : evaluators_)
    for (std::int64_t k = 0; k < std::max<std::int64_t>(1, opt_.concurrency); ++k)
      threads_.emplace_back([this, e = ev.get()] { judge_loop(e); });
}

verdict_service::~verdict_service() {
  std::deque<std::shared_ptr<entry>> left;
  {
    std::lock_guard lock{mtx_};
    stopping_ = true;
    left.swap(queue_);
    for (auto& e : left) {
      e->v = env::verdict{};
      e->v.status = env::verdict_status::runtime_error;
      e->v.message = "the service stopped before this request was judged";
      e->judged = true;
      e->done.notify_all();
    }
  }
  work_.notify_all();
  for (auto& t : threads_)
    t.join();
}

verdict_service::ticket verdict_service::submit(verdict_request r) {
  std::lock_guard lock{mtx_};
  ticket t;
  if (stopping_) {
    t.how = admission::stopping;
    return t;
  }
  const auto fp = fingerprint_of(r);
  if (!r.id.empty()) {
    t.id = r.id;
    if (auto it = by_id_.find(r.id); it != by_id_.end()) {
      if (it->second->fingerprint != fp) {
        t.how = admission::conflict;
        return t;
      }
      ++counters_.duplicates;
      t.how = admission::known;
      t.e = it->second;
      return t;
    }
  }
  if (static_cast<std::int64_t>(queue_.size()) + counters_.running >= opt_.queue_limit) {
    ++counters_.refused_full;
    t.how = admission::full;
    return t;
  }
  if (r.id.empty()) {
    // An id of the service's own, which no client id of this form can take: "~" then a count.
    do
      r.id = "~" + std::to_string(++next_id_);
    while (by_id_.count(r.id) != 0);
    t.id = r.id;
  }
  auto e = std::make_shared<entry>();
  e->id = r.id;
  e->fingerprint = fp;
  e->req = env::eval_request{std::move(r.task), std::move(r.candidate), r.seed, r.use_cache};
  by_id_.emplace(e->id, e);
  queue_.push_back(e);
  t.how = admission::queued;
  t.e = std::move(e);
  work_.notify_one();
  return t;
}

std::optional<env::verdict> verdict_service::wait(const ticket& t, clock_type::time_point until) {
  if (!t.e)
    return std::nullopt;
  std::unique_lock lock{mtx_};
  if (!t.e->done.wait_until(lock, until, [&] { return t.e->judged; }))
    return std::nullopt;
  return t.e->v;
}

std::optional<verdict_service::lookup> verdict_service::find(const std::string& id) const {
  std::lock_guard lock{mtx_};
  auto it = by_id_.find(id);
  if (it == by_id_.end())
    return std::nullopt;
  return lookup{it->second->judged, it->second->v};
}

service_counters verdict_service::counters() const {
  std::lock_guard lock{mtx_};
  auto c = counters_;
  c.queued = static_cast<std::int64_t>(queue_.size());
  return c;
}

std::vector<std::string> verdict_service::devices() const {
  std::vector<std::string> out;
  for (const auto& ev : evaluators_)
    out.push_back(ev->device());
  return out;
}

std::vector<std::string> verdict_service::hardware() const {
  std::vector<std::string> out;
  for (const auto& ev : evaluators_)
    out.push_back(ev->hardware());
  return out;
}

void verdict_service::judge_loop(env::device_evaluator* ev) {
  for (;;) {
    std::shared_ptr<entry> e;
    {
      std::unique_lock lock{mtx_};
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty())
        return; // stopping, and nothing is left to judge
      e = std::move(queue_.front());
      queue_.pop_front();
      ++counters_.running;
    }
    // As `crucible eval` judges one pair: the device evaluator's own verdict, its lost-worker
    // retry and its out-of-memory retry alone on the device included.
    auto v = ev->evaluate(e->req);
    log_.info("serve", ev->device(), " ", e->id, " (", e->req.target.name, "): ", env::to_string(v.status));
    std::lock_guard lock{mtx_};
    e->v = std::move(v);
    e->judged = true;
    e->req.candidate.clear(); // kept only until judged; the fingerprint still tells a retry apart
    e->req.target.source.clear();
    --counters_.running;
    ++counters_.judged;
    ++counters_.by_status[env::to_string(e->v.status)];
    counters_.judged_wall_s += e->v.wall_s;
    e->done.notify_all();
    judged_order_.push_back(e->id);
    while (static_cast<std::int64_t>(judged_order_.size()) > std::max<std::int64_t>(1, opt_.remember)) {
      by_id_.erase(judged_order_.front());
      judged_order_.pop_front();
    }
  }
}

} // namespace crucible::service
