// tools/crucible/commands.hpp: the crucible subcommands. Each parses nothing itself: main()
// parses its arguments against its spec and calls `run` with the result.
#pragma once

#include <string>
#include <vector>

#include "tools/crucible/args.hpp"

namespace crucible::cli {

/// Exit codes shared by every subcommand.
enum exit_code : int {
  exit_ok = 0,
  exit_failure = 1, ///< the command ran and failed (I/O, a peer, a crashed run)
  exit_usage = 2,   ///< bad flags, configuration or input files
};

struct command {
  command_spec spec;
  int (*run)(const parsed_args& args);
};

command train_command();
command resume_command();
command pause_command();
command status_command();
command config_command();
command info_command();
command eval_command();
command serve_command();
command serve_policy_command();
command tasks_command();
command tokenizer_command();
command init_model_command();
command memory_plan_command();
command generate_command();
command replay_command();
command report_command();
command watch_command();
command evaluator_command();

/// Every subcommand, in the order `crucible --help` lists them.
std::vector<command> all_commands();

} // namespace crucible::cli
