#include "policy/training/episode_batch.hpp"

#include <string>

namespace crucible::policy {

result<std::vector<grpo_group>> episode_groups(std::span<const scored_episode> episodes, const episode_options& opt,
                                               std::uint64_t policy_version) {
  std::vector<std::vector<double>> returns;
  std::vector<std::vector<turn_row>> rows;
  for (std::size_t i = 0; i < episodes.size(); ++i) {
    const auto& e = episodes[i];
    const auto who = "episode " + std::to_string(i) + ": ";
    const auto turns = e.tokens.completions.size();
    if (e.rewards.size() != turns || e.behaviour_log_probs.size() != turns)
      return fail(errc::invalid_arg, who, std::to_string(turns), " turns, ", std::to_string(e.rewards.size()),
                  " rewards and ", std::to_string(e.behaviour_log_probs.size()), " log-prob lists");
    for (std::size_t t = 0; t < turns; ++t)
      if (e.behaviour_log_probs[t].size() != e.tokens.completions[t].size())
        return fail(errc::invalid_arg, who, "turn ", std::to_string(t), " has ",
                    std::to_string(e.behaviour_log_probs[t].size()), " log-probs for ",
                    std::to_string(e.tokens.completions[t].size()), " tokens");
    auto g = turn_returns(e.rewards, opt.returns, opt.gamma);
    if (!g)
      return fail(errc::invalid_arg, who, g.error().message);
    result<std::vector<turn_row>> r = std::vector<turn_row>{};
    if (e.contexts.empty()) {
      r = turn_rows(e.tokens);
    } else if (e.contexts.size() != turns) {
      return fail(errc::invalid_arg, who, std::to_string(turns), " turns and ", std::to_string(e.contexts.size()),
                  " contexts");
    } else {
      for (std::size_t t = 0; t < turns; ++t) {
        if (e.contexts[t].empty())
          return fail(errc::invalid_arg, who, "turn ", std::to_string(t), " has an empty context");
        r->push_back({t, e.contexts[t], e.tokens.completions[t]});
      }
    }
    if (!r)
      return fail(errc::invalid_arg, who, r.error().message);
    returns.push_back(std::move(*g));
    rows.push_back(std::move(*r));
  }
  auto adv = turn_advantages(returns, opt.advantages, opt.std_normalize, opt.eps);
  if (!adv)
    return adv.error();
  std::vector<grpo_group> out;
  for (std::size_t i = 0; i < episodes.size(); ++i)
    for (auto& row : rows[i]) {
      grpo_group g;
      g.prompt = std::move(row.context);
      g.policy_version = policy_version;
      grpo_sample s;
      s.completion = std::move(row.completion);
      s.behaviour_log_probs = episodes[i].behaviour_log_probs[row.turn];
      s.reward = returns[i][row.turn];
      s.advantage = (*adv)[i][row.turn];
      g.samples.push_back(std::move(s));
      out.push_back(std::move(g));
    }
  return out;
}

} // namespace crucible::policy
