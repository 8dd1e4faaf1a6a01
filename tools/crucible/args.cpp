#include "tools/crucible/args.hpp"

#include "core/device.hpp"
#include "core/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace crucible::cli {

std::string parsed_args::get(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  return it == values.end() || it->second.empty() ? fallback : it->second.back();
}

std::vector<std::string> parsed_args::all(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? std::vector<std::string>{} : it->second;
}

namespace {

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n])
    ++n;
  return n;
}

} // namespace

result<parsed_args> parse_args(const command_spec& spec, const std::vector<std::string>& args) {
  parsed_args out;
  const std::string who = "crucible " + spec.name;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      out.help = true;
      return out;
    }
    if (arg == "--") {
      out.positional.insert(out.positional.end(), args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      out.positional.push_back(arg);
      continue;
    }
    auto eq = arg.find('=');
    auto name = arg.substr(0, eq);
    auto opt = std::find_if(spec.options.begin(), spec.options.end(),
                            [&](const option_spec& o) { return o.name == name; });
    if (opt == spec.options.end()) {
      std::string hint;
      size_t best = 2;
      for (const auto& o : spec.options) {
        auto p = common_prefix(o.name, name);
        if (p > best) {
          best = p;
          hint = " (did you mean " + o.name + "?)";
        }
      }
      return fail(errc::invalid_arg, who, ": unknown option ", name, hint,
                  "; see 'crucible ", spec.name, " --help'");
    }
    std::string value;
    if (opt->metavar.empty()) {
      if (eq != std::string::npos)
        return fail(errc::invalid_arg, who, ": option ", name, " takes no value");
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return fail(errc::invalid_arg, who, ": option ", name, " needs a value (", opt->metavar, ")");
    }
    if (!opt->repeatable && out.values.count(name) != 0)
      return fail(errc::invalid_arg, who, ": option ", name, " given twice");
    out.values[name].push_back(std::move(value));
  }
  if (out.positional.size() < spec.positionals.size())
    return fail(errc::invalid_arg, who, ": missing ", spec.positionals[out.positional.size()],
                "; usage: crucible ", spec.name, " ", spec.usage);
  const auto most = spec.positionals.size() + spec.optional_positionals.size();
  if (out.positional.size() > most)
    return fail(errc::invalid_arg, who, ": unexpected argument '", out.positional[most],
                "'; usage: crucible ", spec.name, " ", spec.usage);
  return out;
}

result<std::int64_t> int_option(const parsed_args& args, const std::string& name, std::int64_t fallback,
                                std::int64_t min, std::int64_t max) {
  if (!args.has(name))
    return fallback;
  const auto text = args.get(name);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v < min || v > max)
    return fail(errc::invalid_arg, name, ": expected an integer from ", std::to_string(min), " to ",
                std::to_string(max), ", got '", text, "'");
  return v;
}

result<double> real_option(const parsed_args& args, const std::string& name, double fallback, double min, double max) {
  if (!args.has(name))
    return fallback;
  const auto text = args.get(name);
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || !std::isfinite(v) || v < min || v > max) {
    char range[64];
    std::snprintf(range, sizeof range, "%g to %g", min, max);
    return fail(errc::invalid_arg, name, ": expected a number from ", range, ", got '", text, "'");
  }
  return v;
}

result<std::string> parse_device(const std::string& name, const std::string& device) {
  const auto id = crucible::parse_device(device);
  if (!id)
    return fail(errc::invalid_arg, name, ": ", id.error().message);
  return id->to_string();
}

result<std::string> device_option(const parsed_args& args, const std::string& name, const std::string& fallback) {
  return parse_device(name, args.get(name, fallback));
}

std::uint32_t device_index(const std::string& device) {
  return static_cast<std::uint32_t>(std::max(0, cuda_index(device)));
}

std::string render_help(const command_spec& spec) {
  std::string out = "usage: crucible " + spec.name + " " + spec.usage + "\n\n" + spec.summary + "\n";
  if (!spec.description.empty())
    out += "\n" + spec.description + "\n";
  out += "\noptions:\n";
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& o : spec.options)
    rows.emplace_back(o.name + (o.metavar.empty() ? "" : " " + o.metavar), o.help + (o.repeatable ? " (repeatable)" : ""));
  rows.emplace_back("-h, --help", "show this help");
  size_t width = 0;
  for (const auto& r : rows)
    width = std::max(width, r.first.size());
  for (const auto& [left, right] : rows)
    out += "  " + left + std::string(width - left.size() + 2, ' ') + right + "\n";
  return out;
}

std::string speedup_text(double x) {
  if (std::isnan(x))
    return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fx", x);
  return buf;
}

result<config> config_option(const parsed_args& args) {
  return args.has("--config") ? load_config(args.get("--config"), args.all("--set"))
                              : parse_config("", "--set", args.all("--set"));
}

} // namespace crucible::cli
