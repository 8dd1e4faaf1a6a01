// Decoding, encoding and documenting the configuration from one declaration, describe().
#include "core/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace crucible {

namespace {

// -- value types ----------------------------------------------------------------------------

// A constraint beyond the type: `expected` replaces the type's own wording in messages.
template <class T>
struct constraint {
  const char* expected = nullptr;
  std::function<bool(const T&)> ok;
};

template <class T> struct value_traits;

template <> struct value_traits<std::string> {
  static constexpr const char* expected = "a string";
  static constexpr const char* type_name = "string";
  static bool parse(const std::string& s, std::string& out) { out = s; return true; }
  static std::string render(const std::string& v) { return v; }
};

template <> struct value_traits<bool> {
  static constexpr const char* expected = "true or false";
  static constexpr const char* type_name = "bool";
  static bool parse(const std::string& s, bool& out) {
    if (s == "true" || s == "True") { out = true; return true; }
    if (s == "false" || s == "False") { out = false; return true; }
    return false;
  }
  static std::string render(bool v) { return v ? "true" : "false"; }
};

template <class Int>
bool parse_integer(const std::string& s, Int& out) {
  auto first = s.data();
  auto last = s.data() + s.size();
  if (first != last && *first == '+')
    ++first;
  auto [end, ec] = std::from_chars(first, last, out);
  return ec == std::errc{} && end == last && first != last;
}

template <> struct value_traits<std::int64_t> {
  static constexpr const char* expected = "an integer";
  static constexpr const char* type_name = "integer";
  static bool parse(const std::string& s, std::int64_t& out) { return parse_integer(s, out); }
  static std::string render(std::int64_t v) { return std::to_string(v); }
};

template <> struct value_traits<std::uint64_t> {
  static constexpr const char* expected = "a non-negative integer";
  static constexpr const char* type_name = "integer ≥ 0";
  static bool parse(const std::string& s, std::uint64_t& out) {
    return !s.empty() && s[0] != '-' && parse_integer(s, out);
  }
  static std::string render(std::uint64_t v) { return std::to_string(v); }
};

template <> struct value_traits<double> {
  static constexpr const char* expected = "a number";
  static constexpr const char* type_name = "number";
  static bool parse(const std::string& s, double& out) {
    auto first = s.data();
    auto last = s.data() + s.size();
    if (first != last && *first == '+')
      ++first;
    auto [end, ec] = std::from_chars(first, last, out, std::chars_format::general);
    return ec == std::errc{} && end == last && first != last && std::isfinite(out);
  }
  static std::string render(double v) {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    std::string out(buf, end);
    if (out.find_first_of(".e") == std::string::npos)
      out += ".0";
    return out;
  }
};

template <> struct value_traits<log_level> {
  static constexpr const char* expected = "one of trace, debug, info, warn, error, off";
  static constexpr const char* type_name = "`trace`, `debug`, `info`, `warn`, `error` or `off`";
  static bool parse(const std::string& s, log_level& out) {
    auto lvl = parse_log_level(s);
    if (lvl)
      out = *lvl;
    return lvl.has_value();
  }
  static std::string render(log_level v) { return to_string(v); }
};

bool looks_numeric(const std::string& s) {
  double d;
  return value_traits<double>::parse(s, d);
}

// How a rejected node is shown after "got".
std::string describe_node(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull())
    return "nothing";
  if (n.IsMap())
    return "a map";
  if (n.IsSequence())
    return "a list";
  const auto& s = n.Scalar();
  if (looks_numeric(s) || s == "true" || s == "false")
    return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

// -- the declaration of every key -----------------------------------------------------------

constraint<std::string> run_name() {
  return {"a name of letters, digits, '.', '-' and '_'", [](const std::string& s) {
            return !s.empty() && s != "." && s != ".."
                   && std::all_of(s.begin(), s.end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'
                               || c == '_';
                      });
          }};
}

constraint<std::string> non_empty() {
  return {"a non-empty string", [](const std::string& s) { return !s.empty(); }};
}

constraint<std::int64_t> at_least(std::int64_t lo, const char* expected) {
  return {expected, [lo](std::int64_t v) { return v >= lo; }};
}

template <class V>
void describe(V& v, config& c) {
  v.section("run", "Naming and placing the run.", [&] {
    v.field("name", c.run.name, "Run name; the run directory is `run.dir/run.name`.", run_name());
    v.field("dir", c.run.dir, "Directory that holds the run directories.", non_empty());
    v.field("seed", c.run.seed, "Root of every random stream in the run.");
  });
  v.section("log", "Logging to stderr and to the run directory's `events.log`.", [&] {
    v.field("level", c.log.level, "Threshold for messages on stderr.");
    v.field("file_level", c.log.file_level, "Threshold for messages in `events.log`.");
  });
  v.section("actors", "The actor system of each crucible process.", [&] {
    v.field("threads", c.actors.threads, "Scheduler worker threads; 0 means one per core.",
            at_least(0, "a non-negative integer"));
  });
}

// -- decoding -------------------------------------------------------------------------------

class decoder {
public:
  decoder(std::string origin, const std::map<std::string, std::string>& overrides,
          std::vector<std::string>& problems)
    : origin_(std::move(origin)), overrides_(overrides), problems_(problems) {}

  void root(const YAML::Node& node, config& c) {
    frames_.push_back(frame{node, "", {}});
    describe(*this, c);
    check_unknown_keys();
    frames_.pop_back();
  }

  template <class F>
  void section(const char* name, const char* doc, F body) {
    auto& top = frames_.back();
    top.declared.insert(name);
    auto path = top.prefix + name;
    YAML::Node child = find(top.node, name);
    if (child.IsDefined() && !child.IsNull() && !child.IsMap()) {
      report(path, child, "expected a map of settings, got " + describe_node(child));
      child = YAML::Node{};
    }
    frames_.push_back(frame{child, path + ".", {}});
    body();
    check_unknown_keys();
    frames_.pop_back();
  }

  template <class T>
  void field(const char* name, T& out, const char* doc, const constraint<T>& c = {}) {
    auto& top = frames_.back();
    top.declared.insert(name);
    auto path = top.prefix + name;
    YAML::Node n = find(top.node, name);
    if (!n.IsDefined())
      return; // absent: keep the default
    const char* expected = c.expected != nullptr ? c.expected : value_traits<T>::expected;
    T value{};
    if (!n.IsScalar() || !value_traits<T>::parse(n.Scalar(), value) || (c.ok && !c.ok(value))) {
      report(path, n, std::string{"expected "} + expected + ", got " + describe_node(n));
      return;
    }
    out = std::move(value);
  }

private:
  struct frame {
    YAML::Node node; // a map, or undefined/null when the section is absent
    std::string prefix;
    std::set<std::string> declared;
  };

  static YAML::Node find(const YAML::Node& map, const char* name) {
    if (!map.IsDefined() || !map.IsMap())
      return YAML::Node{YAML::NodeType::Undefined};
    for (auto it = map.begin(); it != map.end(); ++it)
      if (it->first.IsScalar() && it->first.Scalar() == name)
        return it->second;
    return YAML::Node{YAML::NodeType::Undefined};
  }

  void check_unknown_keys() {
    auto& top = frames_.back();
    if (!top.node.IsDefined() || !top.node.IsMap())
      return;
    std::set<std::string> seen;
    for (auto it = top.node.begin(); it != top.node.end(); ++it) {
      auto key = it->first.IsScalar() ? it->first.Scalar() : std::string{"?"};
      auto path = top.prefix + key;
      if (!seen.insert(key).second) {
        report(path, it->first, "duplicate key");
      } else if (top.declared.count(key) == 0) {
        report(path, it->first, "unknown key" + suggestion(key, top.declared, top.prefix));
      }
    }
  }

  // " (did you mean run.seed?)" for a key within edit distance 2 of a declared one.
  static std::string suggestion(const std::string& key, const std::set<std::string>& declared,
                                const std::string& prefix) {
    std::string best;
    size_t best_d = 3;
    for (const auto& cand : declared) {
      auto d = edit_distance(key, cand);
      if (d < best_d) {
        best_d = d;
        best = cand;
      }
    }
    if (!best.empty())
      return " (did you mean " + prefix + best + "?)";
    std::string all;
    for (const auto& cand : declared)
      all += (all.empty() ? "" : ", ") + cand;
    return " (expected one of: " + all + ")";
  }

  static size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j)
      prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  }

  void report(const std::string& path, const YAML::Node& at, const std::string& what) {
    // An override names itself; a value from the file names its line. Overrides of a parent
    // section (e.g. --set run=3) are found by prefix.
    for (const auto& [opath, text] : overrides_) {
      if (path == opath || path.rfind(opath + ".", 0) == 0) {
        problems_.push_back("--set " + text + ": " + path + ": " + what);
        return;
      }
    }
    auto mark = at.Mark();
    std::string where = origin_;
    if (mark.line >= 0)
      where += ":" + std::to_string(mark.line + 1);
    problems_.push_back(where + ": " + path + ": " + what);
  }

  std::string origin_;
  const std::map<std::string, std::string>& overrides_;
  std::vector<std::string>& problems_;
  std::vector<frame> frames_;
};

// Applies "a.b.c=value" to the tree; the value is parsed as YAML (so `[0, 1]` is a list).
bool apply_override(YAML::Node& root, const std::string& text,
                    std::map<std::string, std::string>& applied, std::vector<std::string>& problems) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    problems.push_back("--set " + text + ": expected key.path=value");
    return false;
  }
  auto path = text.substr(0, eq);
  auto raw = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) {
      problems.push_back("--set " + text + ": empty component in key path \"" + path + "\"");
      return false;
    }
    parts.push_back(part);
  }
  if (path.back() == '.') {
    problems.push_back("--set " + text + ": empty component in key path \"" + path + "\"");
    return false;
  }
  YAML::Node value;
  try {
    value = YAML::Load(raw);
  } catch (const YAML::Exception& e) {
    problems.push_back("--set " + text + ": value is not valid YAML: " + e.msg);
    return false;
  }
  if (!root.IsDefined() || root.IsNull())
    root = YAML::Node(YAML::NodeType::Map);
  // yaml-cpp nodes are handles: walk with fresh handles (reset), never assign through one.
  YAML::Node cur;
  cur.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      next = YAML::Node(YAML::NodeType::Map);
      cur[parts[i]] = next;
      next.reset(cur[parts[i]]);
    } else if (!next.IsMap()) {
      std::string prefix;
      for (size_t k = 0; k <= i; ++k)
        prefix += (k ? "." : "") + parts[k];
      problems.push_back("--set " + text + ": " + prefix + " is not a map of settings");
      return false;
    }
    cur.reset(next);
  }
  cur[parts.back()] = value;
  applied[path] = text;
  return true;
}

// -- encoding and documentation -------------------------------------------------------------

class encoder {
public:
  explicit encoder(YAML::Emitter& out) : out_(out) {}

  template <class F>
  void section(const char* name, const char* doc, F body) {
    out_ << YAML::Key << name << YAML::Value << YAML::BeginMap;
    body();
    out_ << YAML::EndMap;
  }

  template <class T>
  void field(const char* name, T& value, const char* doc, const constraint<T>& = {}) {
    out_ << YAML::Key << name << YAML::Value;
    if constexpr (std::is_same_v<T, std::string>) {
      out_ << YAML::DoubleQuoted << value;
    } else {
      out_ << value_traits<T>::render(value);
    }
  }

private:
  YAML::Emitter& out_;
};

class documenter {
public:
  explicit documenter(std::string& out) : out_(out) {}

  template <class F>
  void section(const char* name, const char* doc, F body) {
    prefix_ = std::string{name} + ".";
    out_ += "\n## `" + std::string{name} + "`\n\n" + doc + "\n\n";
    out_ += "| key | type | default | meaning |\n|---|---|---|---|\n";
    body();
  }

  template <class T>
  void field(const char* name, T& value, const char* doc, const constraint<T>& c = {}) {
    std::string type = c.expected != nullptr ? c.expected : value_traits<T>::type_name;
    std::string def = value_traits<T>::render(value);
    if constexpr (std::is_same_v<T, std::string>)
      def = "\"" + def + "\"";
    out_ += "| `" + prefix_ + name + "` | " + type + " | `" + def + "` | " + doc + " |\n";
  }

private:
  std::string& out_;
  std::string prefix_;
};

} // namespace

result<config> parse_config(std::string_view yaml_text, const std::string& origin,
                            const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string{yaml_text});
  } catch (const YAML::ParserException& e) {
    return fail(errc::config, origin, ":", std::to_string(e.mark.line + 1),
                ": not valid YAML: ", e.msg);
  }
  std::vector<std::string> problems;
  if (root.IsDefined() && !root.IsNull() && !root.IsMap())
    return fail(errc::config, origin, ":", std::to_string(root.Mark().line + 1),
                ": expected a map of sections at the top level, got ", describe_node(root));
  std::map<std::string, std::string> applied;
  for (const auto& text : overrides)
    apply_override(root, text, applied, problems);
  config cfg;
  if (problems.empty()) {
    decoder dec{origin, applied, problems};
    dec.root(root, cfg);
  }
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems)
      msg += (msg.empty() ? "" : "\n") + p;
    return error{errc::config, std::move(msg)};
  }
  return cfg;
}

result<config> load_config(const std::filesystem::path& file,
                           const std::vector<std::string>& overrides) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec))
      return fail(errc::not_found, file.string(), ": no such configuration file");
    return fail(errc::io, file.string(), ": cannot read");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), file.string(), overrides);
}

std::string to_yaml(const config& cfg) {
  config copy = cfg;
  YAML::Emitter out;
  out << YAML::BeginMap;
  encoder enc{out};
  describe(enc, copy);
  out << YAML::EndMap;
  return std::string{out.c_str()} + "\n";
}

std::string config_reference_markdown() {
  std::string out =
    "# Configuration reference\n\n"
    "A run is configured by one YAML file (`crucible train CONFIG`), with any key overridden\n"
    "on the command line by `--set key.path=value`. Unknown keys, wrong types and invalid\n"
    "values are refused with the file, line and key path at fault. The resolved configuration,\n"
    "defaults included, is written to the run directory as `config.yaml`; `crucible config show\n"
    "--file CONFIG` prints it without starting a run.\n\n"
    "This file is generated from the declaration in `core/config.cpp` by `crucible config docs`;\n"
    "a test fails when the two differ.\n";
  config defaults;
  documenter doc{out};
  describe(doc, defaults);
  return out;
}

} // namespace crucible
