// tools/crucible/main.cpp: the crucible command line. Parses the subcommand and its flags, then
// hands typed values to the subcommand; nothing below main() reads argv.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/crucible/commands.hpp"

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: crucible COMMAND [options]\n\n"
               "crucible trains a language model to write fast GPU kernels by asynchronous\n"
               "reinforcement learning.\n\ncommands:\n");
  for (const auto& cmd : crucible::cli::all_commands())
    std::fprintf(out, "  %-10s %s\n", cmd.spec.name.c_str(), cmd.spec.summary.c_str());
  std::fprintf(out, "\n'crucible COMMAND --help' describes a command and its options.\n");
}

} // namespace

int main(int argc, char** argv) {
  using namespace crucible::cli;
  if (argc < 2) {
    print_usage(stderr);
    return exit_usage;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return exit_ok;
  }
  if (name == "--version") {
    std::printf("crucible %s\n", CRUCIBLE_VERSION);
    return exit_ok;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& cmd : all_commands()) {
    if (cmd.spec.name != name)
      continue;
    auto parsed = parse_args(cmd.spec, args);
    if (!parsed) {
      std::fprintf(stderr, "%s\n", parsed.error().message.c_str());
      return exit_usage;
    }
    if (parsed->help) {
      std::fputs(render_help(cmd.spec).c_str(), stdout);
      return exit_ok;
    }
    return cmd.run(*parsed);
  }
  std::fprintf(stderr, "crucible: unknown command '%s'; see 'crucible --help'\n", name.c_str());
  return exit_usage;
}
