// tools/crucible/args.hpp: command-line parsing for the crucible subcommands. Flags are parsed
// here, in tools/, and nowhere below: libraries receive typed options.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace crucible {
struct config;
}

namespace crucible::cli {

/// One option of a subcommand. An empty `metavar` makes it a flag without a value.
struct option_spec {
  std::string name;     ///< "--set"
  std::string metavar;  ///< "KEY=VALUE", or "" for a flag
  std::string help;
  bool repeatable = false;
};

/// A subcommand: its name, usage line, one-line summary, longer help and options.
struct command_spec {
  std::string name;        ///< "train"
  std::string usage;       ///< "CONFIG [options]"
  std::string summary;     ///< shown in `crucible --help`
  std::string description; ///< shown in `crucible NAME --help`
  std::vector<std::string> positionals; ///< names of required positional arguments
  std::vector<option_spec> options;
  std::vector<std::string> optional_positionals = {}; ///< names of trailing positionals that may be absent
};

/// The parsed command line of one subcommand.
struct parsed_args {
  bool help = false;
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;

  bool has(const std::string& name) const { return values.count(name) != 0; }
  /// Last value given for `name`, or `fallback`.
  std::string get(const std::string& name, const std::string& fallback = "") const;
  /// Every value given for a repeatable option.
  std::vector<std::string> all(const std::string& name) const;
};

/// Parses `args` (after the subcommand name) against `spec`. Accepts `--opt value`,
/// `--opt=value` and `--help`/`-h`. errc::invalid_arg names the unknown or malformed option.
result<parsed_args> parse_args(const command_spec& spec, const std::vector<std::string>& args);

/// The value of option `name` as an integer in [min, max], or `fallback` when it is absent.
/// errc::invalid_arg naming the option and the value ("--seed: expected an integer ...").
/// "1.234x", or "-" for NaN (no value yet): how status lines print a speedup.
std::string speedup_text(double x);

result<std::int64_t> int_option(const parsed_args& args, const std::string& name, std::int64_t fallback,
                                std::int64_t min, std::int64_t max);

/// The value of option `name` as a finite real number in [min, max], or `fallback` when absent.
result<double> real_option(const parsed_args& args, const std::string& name, double fallback, double min, double max);

/// `device` read as a device ("cpu", "cuda" or "cuda:N", core/device.hpp) and given back by its name,
/// "cpu" or "cuda:N"; errc::invalid_arg naming option `name` and the text.
result<std::string> parse_device(const std::string& name, const std::string& device);

/// The value of option `name` as a device, "cpu" or "cuda:N", or `fallback` when absent.
result<std::string> device_option(const parsed_args& args, const std::string& name, const std::string& fallback);

/// N of a checked device's cuda:N (0 for the CPU), as the evaluator pool's device_info names it.
std::uint32_t device_index(const std::string& device);

/// The first error among `results` (in argument order), or nullptr when all hold values.
template <class... Ts>
const crucible::error* first_error(const result<Ts>&... results) {
  const crucible::error* first = nullptr;
  ((first == nullptr && !results ? (first = &results.error(), 0) : 0), ...);
  return first;
}

/// `crucible NAME --help` text.
std::string render_help(const command_spec& spec);

/// The configuration of --config FILE with each --set KEY=VALUE applied, or the defaults with
/// them where there is no --config. The error names the file or the key.
result<config> config_option(const parsed_args& args);

} // namespace crucible::cli
