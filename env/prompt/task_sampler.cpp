// Task sampler: pool and verdicts in, the next task out (formulas in task_sampler.hpp).
#include "env/prompt/task_sampler.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

namespace crucible::env {

namespace {

constexpr std::string_view save_header = "crucible-task-sampler 1";

// A uniform double in [0, 1) from the top 53 bits: unlike std::uniform_real_distribution, the
// same on every standard library.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

std::string hex(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::hex);
  return std::string(buf, end);
}

} // namespace

task_sampler::task_sampler(std::vector<std::string> tasks, task_sampling kind, double mix, std::uint64_t seed)
  : tasks_(std::move(tasks)), records_(tasks_.size()), kind_(kind), mix_(mix), rng_(seed) {
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    index_.emplace(tasks_[i], i);
}

result<task_sampler> task_sampler::create(std::vector<std::string> tasks, task_sampling kind, double mix,
                                          std::uint64_t seed) {
  if (tasks.empty())
    return fail(errc::invalid_arg, "task sampler: the task pool is empty");
  if (!(mix >= 0.0 && mix <= 1.0))
    return fail(errc::invalid_arg, "rollout.sampler_mix: must be in [0, 1], got ", std::to_string(mix));
  std::unordered_map<std::string, std::size_t> seen;
  for (const auto& t : tasks)
    if (!seen.emplace(t, 0).second)
      return fail(errc::invalid_arg, "task sampler: task '", t, "' is in the pool twice");
  return task_sampler{std::move(tasks), kind, mix, seed};
}

double task_sampler::weight(std::size_t i) const {
  return 1.0 / (1.0 + records_[i].best_speedup);
}

std::vector<double> task_sampler::probabilities() const {
  const auto n = static_cast<double>(tasks_.size());
  std::vector<double> p(tasks_.size(), 1.0 / n);
  if (kind_ == task_sampling::uniform)
    return p;
  double total = 0;
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    total += weight(i);
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    p[i] = (1.0 - mix_) * weight(i) / total + mix_ / n;
  return p;
}

std::size_t task_sampler::next_index() {
  const auto n = tasks_.size();
  if (kind_ == task_sampling::uniform) {
    // Lemire-free and bias-free enough: n is small against 2^64, and the draw stays
    // platform-independent (std::uniform_int_distribution is not).
    return static_cast<std::size_t>(uniform01(rng_) * static_cast<double>(n)) % n;
  }
  auto p = probabilities();
  auto u = uniform01(rng_);
  double acc = 0;
  for (std::size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc)
      return i;
  }
  return n - 1; // rounding left u just above the sum
}

bool task_sampler::observe(std::string_view task, const verdict& v) {
  auto it = index_.find(std::string{task});
  if (it == index_.end())
    return false;
  auto& r = records_[it->second];
  ++r.attempts;
  if (v.status != verdict_status::ok) {
    ++r.failures;
  } else if (v.has_speedup() && std::isfinite(v.speedup) && v.speedup > r.best_speedup) {
    r.best_speedup = v.speedup;
  }
  return true;
}

std::string task_sampler::save() const {
  std::ostringstream os;
  os << save_header << '\n' << tasks_.size() << '\n';
  for (std::size_t i = 0; i < tasks_.size(); ++i)
    os << tasks_[i] << '\t' << records_[i].attempts << '\t' << records_[i].failures << '\t'
       << hex(records_[i].best_speedup) << '\n';
  os << rng_ << '\n';
  return os.str();
}

namespace {

crucible::error corrupt(const std::string& what) {
  return fail(errc::corrupt, "task sampler state: ", what);
}

// The header line and the task count of a saved state.
result<std::size_t> read_header(std::istream& in) {
  std::string line;
  if (!std::getline(in, line) || line != save_header)
    return corrupt("missing header '" + std::string{save_header} + "'");
  std::size_t n = 0;
  if (!std::getline(in, line) || std::from_chars(line.data(), line.data() + line.size(), n).ec != std::errc{})
    return corrupt("missing task count");
  return n;
}

// The line of task `i`, next in `in`.
result<std::string> read_task_line(std::istream& in, std::size_t i) {
  std::string line;
  if (!std::getline(in, line))
    return corrupt("line of task " + std::to_string(i) + " is missing");
  return line;
}

} // namespace

result<std::vector<std::string>> task_sampler::saved_tasks(std::string_view saved) {
  std::istringstream in{std::string{saved}};
  auto count = read_header(in);
  if (!count)
    return count.error();
  std::vector<std::string> out;
  for (std::size_t i = 0; i < *count; ++i) {
    auto line = read_task_line(in, i);
    if (!line)
      return line.error();
    auto tab = line->find('\t');
    if (tab == std::string::npos || tab == 0)
      return corrupt("line of task " + std::to_string(i) + " has no task name");
    out.push_back(line->substr(0, tab));
  }
  return out;
}

result<void> task_sampler::restore(std::string_view saved) {
  std::istringstream in{std::string{saved}};
  auto count = read_header(in);
  if (!count)
    return count.error();
  const std::size_t n = *count;
  if (n != tasks_.size())
    return corrupt(std::to_string(n) + " tasks saved, the pool has " + std::to_string(tasks_.size()));
  std::vector<task_record> records(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto line = read_task_line(in, i);
    if (!line)
      return line.error();
    std::istringstream row{*line};
    std::string name, best;
    if (!std::getline(row, name, '\t') || name != tasks_[i])
      return corrupt("task " + std::to_string(i) + " is '" + name + "', the pool has '" + tasks_[i] + "'");
    auto& r = records[i];
    if (!(row >> r.attempts >> r.failures >> best))
      return corrupt("malformed record of task '" + name + "'");
    auto [end, ec] = std::from_chars(best.data(), best.data() + best.size(), r.best_speedup, std::chars_format::hex);
    if (ec != std::errc{} || end != best.data() + best.size())
      return corrupt("malformed best speedup of task '" + name + "'");
  }
  std::mt19937_64 rng;
  if (!(in >> rng))
    return corrupt("malformed generator state");
  records_ = std::move(records);
  rng_ = rng;
  return {};
}

} // namespace crucible::env
