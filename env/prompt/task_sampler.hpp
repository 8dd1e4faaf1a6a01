// env/prompt/task_sampler.hpp: the task pool of a run in, the next task for a rollout out; verdicts
// come back in so that tasks with room to improve can be drawn more often. No CAF, no clock:
// deterministic under its seed.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "env/verdict.hpp"

namespace crucible::env {

/// What the sampler has seen of one task. Plain value.
struct task_record {
  std::uint64_t attempts = 0;  ///< verdicts observed (format errors included)
  std::uint64_t failures = 0;  ///< of those, every status but ok
  double best_speedup = 0.0;   ///< highest speedup of an ok verdict; 0 while there is none

  friend bool operator==(const task_record&, const task_record&) = default;
};

/// Draws tasks from a fixed pool.
///
/// `uniform`: every task with probability 1/N.
///
/// `improvement`: task i has weight w_i = 1 / (1 + b_i), b_i its best speedup so far (0 until
/// an ok verdict arrives), and is drawn with probability
///
///     p_i = (1 - mix) * w_i / sum_j w_j + mix / N.
///
/// A task never solved weighs 1, one solved at 1x weighs 1/2, at 3x 1/4: effort goes where the
/// measured gain is smallest, and the uniform share `mix` keeps every task in play (a first
/// lucky speedup does not make a task disappear).
///
/// Draws use a std::mt19937_64 seeded with `seed` and a 53-bit uniform of its output, so the
/// sequence for a given seed, pool and observation history is the same on every platform.
/// Not thread-safe: one sampler per rollout actor.
class task_sampler final {
public:
  /// errc::invalid_arg for an empty pool, a duplicate task name, or `mix` outside [0, 1].
  static result<task_sampler> create(std::vector<std::string> tasks, task_sampling kind, double mix,
                                     std::uint64_t seed);

  /// The index of the next task (into tasks()).
  std::size_t next_index();
  /// The name of the next task.
  const std::string& next() { return tasks_[next_index()]; }

  /// Takes a verdict of `task` into account (attempts, failures, best speedup). False, and
  /// nothing changes, for a task outside the pool.
  bool observe(std::string_view task, const verdict& v);

  /// The probability of each task in the next draw, in the order of tasks().
  std::vector<double> probabilities() const;

  const std::vector<std::string>& tasks() const noexcept { return tasks_; }
  const std::vector<task_record>& records() const noexcept { return records_; }
  task_sampling kind() const noexcept { return kind_; }

  /// The records and the generator state as text, for checkpoints; restore() reads it back
  /// into a sampler over the same pool. errc::corrupt when the text does not fit the pool.
  std::string save() const;
  result<void> restore(std::string_view saved);

  /// The task names a save() text holds, in its order, without a sampler: what a resumed run
  /// compares with its pool to say which tasks changed. errc::corrupt for a malformed header,
  /// count or task line.
  static result<std::vector<std::string>> saved_tasks(std::string_view saved);

private:
  task_sampler(std::vector<std::string> tasks, task_sampling kind, double mix, std::uint64_t seed);
  double weight(std::size_t i) const;

  std::vector<std::string> tasks_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<task_record> records_;
  task_sampling kind_;
  double mix_;
  std::mt19937_64 rng_;
};

} // namespace crucible::env
