// `crucible config`: check, show and document configurations without starting a run.
#include <cstdio>

#include "core/config.hpp"
#include "tools/crucible/commands.hpp"

namespace crucible::cli {

namespace {

int run_config(const parsed_args& args) {
  const auto& action = args.positional[0];
  if (action == "docs") {
    std::fputs(config_reference_markdown().c_str(), stdout);
    return exit_ok;
  }
  if (action != "check" && action != "show") {
    std::fprintf(stderr, "crucible config: unknown action '%s' (expected check, show or docs)\n",
                 action.c_str());
    return exit_usage;
  }
  if (!args.has("--file")) {
    std::fprintf(stderr, "crucible config %s: needs --file CONFIG\n", action.c_str());
    return exit_usage;
  }
  auto cfg = load_config(args.get("--file"), args.all("--set"));
  if (!cfg) {
    std::fprintf(stderr, "%s\n", cfg.error().message.c_str());
    return exit_usage;
  }
  if (action == "show")
    std::fputs(to_yaml(*cfg).c_str(), stdout);
  else
    std::printf("%s: ok\n", args.get("--file").c_str());
  return exit_ok;
}

} // namespace

command config_command() {
  return {{"config", "check|show|docs [--file CONFIG] [--set KEY=VALUE]...",
           "Check a configuration, print it resolved, or print the key reference",
           "  check  decode CONFIG and report every problem with file, line and key\n"
           "  show   print CONFIG resolved (defaults and overrides applied) as YAML\n"
           "  docs   print the reference of every key (docs/configuration.md)",
           {"ACTION (check, show or docs)"},
           {{"--file", "CONFIG", "configuration file"},
            {"--set", "KEY=VALUE", "override a key, e.g. --set run.seed=7", true}}},
          run_config};
}

} // namespace crucible::cli
