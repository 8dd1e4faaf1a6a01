#include "tools/crucible/commands.hpp"

namespace crucible::cli {

std::vector<command> all_commands() {
  return {train_command(), resume_command(), pause_command(), status_command(), watch_command(), eval_command(),
          tasks_command(), tokenizer_command(), init_model_command(), memory_plan_command(), generate_command(), replay_command(),
          report_command(), evaluator_command(), serve_command(), serve_policy_command(), config_command(),
          info_command()};
}

} // namespace crucible::cli
