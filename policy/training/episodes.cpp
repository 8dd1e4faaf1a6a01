#include "policy/training/episodes.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace crucible::policy {

result<std::vector<double>> turn_returns(std::span<const double> rewards, turn_return_kind kind, double gamma) {
  if (!(gamma >= 0.0 && gamma <= 1.0))
    return fail(errc::invalid_arg, "the discount gamma must be in [0, 1], got ", std::to_string(gamma));
  for (std::size_t t = 0; t < rewards.size(); ++t)
    if (!std::isfinite(rewards[t]))
      return fail(errc::invalid_arg, "the reward of turn ", std::to_string(t), " is not a finite number");
  std::vector<double> out(rewards.size(), 0.0);
  // From the last turn back: G_t from r_t and G_{t+1}.
  for (std::size_t k = rewards.size(); k-- > 0;) {
    const bool last = k + 1 == rewards.size();
    switch (kind) {
      case turn_return_kind::discounted: out[k] = rewards[k] + (last ? 0.0 : gamma * out[k + 1]); break;
      case turn_return_kind::best: out[k] = last ? rewards[k] : std::max(rewards[k], gamma * out[k + 1]); break;
      case turn_return_kind::immediate: out[k] = rewards[k]; break;
    }
  }
  return out;
}

result<std::vector<std::vector<double>>> turn_advantages(const std::vector<std::vector<double>>& returns,
                                                         turn_advantage_kind kind, bool std_normalize, double eps) {
  std::vector<std::vector<double>> out(returns.size());
  std::size_t turns = 0;
  for (std::size_t i = 0; i < returns.size(); ++i) {
    out[i].assign(returns[i].size(), 0.0);
    turns = std::max(turns, returns[i].size());
    for (std::size_t t = 0; t < returns[i].size(); ++t)
      if (!std::isfinite(returns[i][t]))
        return fail(errc::invalid_arg, "the return of episode ", std::to_string(i), " at turn ", std::to_string(t),
                    " is not a finite number");
  }
  for (std::size_t t = 0; t < turns; ++t) {
    std::vector<std::size_t> at; // the episodes that reached turn t
    for (std::size_t i = 0; i < returns.size(); ++i)
      if (t < returns[i].size())
        at.push_back(i);
    const double n = static_cast<double>(at.size());
    if (at.size() < 2)
      continue; // nothing to compare with: 0
    double sum = 0.0;
    for (auto i : at)
      sum += returns[i][t];
    const bool all_equal =
      std::all_of(at.begin(), at.end(), [&](std::size_t i) { return returns[i][t] == returns[at.front()][t]; });
    if (all_equal)
      continue; // no preference: exactly 0
    if (kind == turn_advantage_kind::trloo) {
      for (auto i : at)
        out[i][t] = returns[i][t] - (sum - returns[i][t]) / (n - 1.0);
      continue;
    }
    const double mean = sum / n;
    double var = 0.0;
    for (auto i : at)
      var += (returns[i][t] - mean) * (returns[i][t] - mean);
    const double sd = std::sqrt(var / (n - 1.0));
    for (auto i : at)
      out[i][t] = std_normalize ? (returns[i][t] - mean) / (sd + eps) : returns[i][t] - mean;
  }
  return out;
}

namespace {

result<void> check(const episode_tokens& e) {
  if (e.completions.empty())
    return fail(errc::invalid_arg, "an episode needs at least one turn");
  if (e.prompt.empty())
    return fail(errc::invalid_arg, "an episode's prompt is empty");
  if (e.feedback.size() + 1 != e.completions.size())
    return fail(errc::invalid_arg, "an episode of ", std::to_string(e.completions.size()), " turns needs ",
                std::to_string(e.completions.size() - 1), " feedback turns, got ", std::to_string(e.feedback.size()));
  return {};
}

} // namespace

result<episode_sequence> flatten(const episode_tokens& e) {
  if (auto ok = check(e); !ok)
    return ok.error();
  episode_sequence s;
  auto add = [&](const std::vector<std::int32_t>& part, std::uint8_t mask, std::int32_t turn) {
    s.tokens.insert(s.tokens.end(), part.begin(), part.end());
    s.mask.insert(s.mask.end(), part.size(), mask);
    s.turn.insert(s.turn.end(), part.size(), turn);
  };
  add(e.prompt, 0, -1);
  for (std::size_t t = 0; t < e.completions.size(); ++t) {
    add(e.completions[t], 1, static_cast<std::int32_t>(t));
    if (t < e.feedback.size())
      add(e.feedback[t], 0, -1);
  }
  return s;
}

result<std::vector<turn_row>> turn_rows(const episode_tokens& e) {
  if (auto ok = check(e); !ok)
    return ok.error();
  std::vector<turn_row> rows;
  std::vector<std::int32_t> context = e.prompt;
  for (std::size_t t = 0; t < e.completions.size(); ++t) {
    rows.push_back({t, context, e.completions[t]});
    context.insert(context.end(), e.completions[t].begin(), e.completions[t].end());
    if (t < e.feedback.size())
      context.insert(context.end(), e.feedback[t].begin(), e.feedback[t].end());
  }
  return rows;
}

} // namespace crucible::policy
