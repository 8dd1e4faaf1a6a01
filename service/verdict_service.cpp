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

namespace {

// A local device's evaluator: judges every request, as `crucible eval` does (its lost-worker retry
// and its out-of-memory retry alone on the device included).
class local_judge final : public judge {
public:
  explicit local_judge(std::unique_ptr<env::device_evaluator> ev) : ev_(std::move(ev)) {}
  std::string device() const override { return ev_->device(); }
  std::string hardware() const override { return ev_->hardware(); }
  bool takes(const env::eval_request&) const override { return true; }
  std::optional<env::verdict> evaluate(const env::eval_request& r) override { return ev_->evaluate(r); }

private:
  std::unique_ptr<env::device_evaluator> ev_;
};

} // namespace

verdict_service::verdict_service(std::vector<std::unique_ptr<env::device_evaluator>> evaluators, service_options opt,
                                 logger& log)
    : opt_(opt), log_(log) {
  for (auto& ev : evaluators)
    add_judge(std::make_shared<local_judge>(std::move(ev)), opt_.concurrency);
}

void verdict_service::add_judge(std::shared_ptr<judge> j, std::int64_t concurrency) {
  std::lock_guard lock{mtx_};
  if (stopping_)
    return;
  judges_.push_back(j);
  for (std::int64_t k = 0; k < std::max<std::int64_t>(1, concurrency); ++k)
    threads_.emplace_back([this, j] { judge_loop(j); });
}

void verdict_service::wake() {
  { std::lock_guard lock{mtx_}; }
  work_.notify_all();
}

bool verdict_service::can_judge(const env::eval_request& r) const {
  std::lock_guard lock{mtx_};
  return std::any_of(judges_.begin(), judges_.end(), [&](const auto& j) { return j->could_take(r); });
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
  std::vector<std::thread> threads;
  {
    std::lock_guard lock{mtx_};
    threads.swap(threads_);
  }
  for (auto& t : threads)
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
  work_.notify_all(); // judges differ in what they take: each looks
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
  return lookup{it->second->judged, it->second->v, it->second->req.target.name};
}

service_counters verdict_service::counters() const {
  std::lock_guard lock{mtx_};
  auto c = counters_;
  c.queued = static_cast<std::int64_t>(queue_.size());
  return c;
}

std::vector<std::string> verdict_service::devices() const {
  std::lock_guard lock{mtx_};
  std::vector<std::string> out;
  for (const auto& j : judges_)
    out.push_back(j->device());
  return out;
}

std::vector<std::string> verdict_service::hardware() const {
  std::lock_guard lock{mtx_};
  std::vector<std::string> out;
  for (const auto& j : judges_)
    out.push_back(j->hardware());
  return out;
}

void verdict_service::judge_loop(std::shared_ptr<judge> j) {
  for (;;) {
    std::shared_ptr<entry> e;
    {
      std::unique_lock lock{mtx_};
      auto first_taken = [&] {
        return std::find_if(queue_.begin(), queue_.end(), [&](const auto& x) { return j->takes(x->req); });
      };
      work_.wait(lock, [&] { return stopping_ || first_taken() != queue_.end(); });
      const auto it = first_taken();
      if (it == queue_.end())
        return; // stopping, and nothing is left to judge
      e = *it;
      queue_.erase(it);
      ++counters_.running;
    }
    auto judged = j->evaluate(e->req);
    if (!judged) { // it could not after all (a node left): back to the head of the queue
      std::lock_guard lock{mtx_};
      --counters_.running;
      if (stopping_) {
        e->v = env::verdict{};
        e->v.status = env::verdict_status::runtime_error;
        e->v.message = "the service stopped before this request was judged";
        e->judged = true;
        e->done.notify_all();
        continue;
      }
      queue_.push_front(e);
      work_.notify_all();
      continue;
    }
    auto v = std::move(*judged);
    log_.info("serve", j->device(), " ", e->id, " (", e->req.target.name, "): ", env::to_string(v.status));
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
