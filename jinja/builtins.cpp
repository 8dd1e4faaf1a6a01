// jinja/builtins.cpp: what a template calls by name, for the expressions of expressions.cpp: the
// globals (raise_exception, strftime_now, namespace, dict, range), the dict and str methods, the
// filters and the tests; arguments in as call_args, values out.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>

#include "jinja/detail.hpp"

namespace crucible::jinja::detail {

namespace {

// By value: callers pass temporaries as defaults.
value arg_at(const call_args& a, std::size_t i, const char* name, const value& def) {
  if (i < a.positional.size())
    return a.positional[i];
  for (const auto& [k, v] : a.keyword)
    if (k == name)
      return v;
  return def;
}

void check_arity(const call_args& a, std::size_t max_positional, std::initializer_list<const char*> keywords,
                 const std::string& what) {
  if (a.positional.size() > max_positional)
    raise_in_call(errc::invalid_arg, what + " takes at most " + std::to_string(max_positional) + " positional arguments");
  for (const auto& [k, v] : a.keyword)
    if (std::find_if(keywords.begin(), keywords.end(), [&](const char* w) { return k == w; }) == keywords.end())
      raise_in_call(errc::invalid_arg, what + " got an unexpected keyword argument '" + k + "'");
}

// Jinja's attribute getter for filters: dotted parts, integers as indices, item lookup first.
value attr_path(evaluator& ev, const value& item, const std::string& path, std::size_t pos) {
  value cur = item;
  std::size_t i = 0;
  while (true) {
    auto dot = path.find('.', i);
    auto part = path.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    value key{part};
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      key = value{static_cast<std::int64_t>(std::stoll(part))};
    cur = ev.get_item(cur, key, pos);
    if (dot == std::string::npos)
      return cur;
    i = dot + 1;
  }
}

} // namespace

value evaluator::method(const value& obj, const std::string& name, std::size_t pos) {
  (void)pos;
  if (obj.type() == value::kind::dict) {
    if (name == "items" || name == "keys" || name == "values")
      return value::function("dict." + name, [obj, name](const call_args& a) -> value {
        check_arity(a, 0, {}, "dict." + name + "()");
        value_list out;
        for (const auto& [k, v] : obj.as_dict()) {
          if (name == "items")
            out.emplace_back(value_list{k, v}, true);
          else if (name == "keys")
            out.emplace_back(k);
          else
            out.push_back(v);
        }
        return value{std::move(out)};
      });
    if (name == "get")
      return value::function("dict.get", [obj](const call_args& a) -> value {
        if (a.positional.empty() || a.positional.size() > 2 || !a.keyword.empty())
          raise_in_call(errc::invalid_arg, "dict.get() takes 1 or 2 positional arguments");
        if (const value* v = obj.find_key(hashable(a.positional[0], std::string::npos)))
          return *v;
        return a.positional.size() > 1 ? a.positional[1] : value::none();
      });
    static const std::set<std::string, std::less<>> others = {"pop", "update", "copy", "clear", "setdefault",
                                                              "popitem", "fromkeys"};
    if (others.count(name) != 0)
      return value::function("dict." + name, [name](const call_args&) -> value {
        raise_in_call(errc::unsupported, "dict." + name + "() is not supported (the sandbox forbids changing data)");
      });
    return {};
  }
  if (obj.is_string()) {
    const std::string s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return value::function("str." + name, [s, name](const call_args& a) -> value {
        check_arity(a, 1, {}, "str." + name + "()");
        const value chars = arg_at(a, 0, "", value::none());
        std::vector<char32_t> set;
        if (!chars.is_none()) {
          if (!chars.is_string())
            raise_in_call(errc::invalid_arg, name + " arg must be None or str");
          set = code_points(chars.as_string());
        }
        return value{py_strip(s, name != "rstrip", name != "lstrip", chars.is_none() ? nullptr : &set)};
      });
    if (name == "split")
      return value::function("str.split", [s](const call_args& a) -> value {
        check_arity(a, 2, {"sep", "maxsplit"}, "str.split()");
        const value sep = arg_at(a, 0, "sep", value::none());
        const value maxsplit = arg_at(a, 1, "maxsplit", value{std::int64_t{-1}});
        if (!is_int_like(maxsplit))
          raise_in_call(errc::invalid_arg, "maxsplit must be an integer");
        return py_split(s, sep, maxsplit.as_int());
      });
    if (name == "startswith" || name == "endswith")
      return value::function("str." + name, [s, name](const call_args& a) -> value {
        if (a.positional.size() != 1 || !a.keyword.empty())
          raise_in_call(errc::unsupported, "str." + name + "() with start/end arguments is not supported");
        const value& p = a.positional[0];
        value_list options = p.is_tuple() ? p.as_list() : value_list{p};
        for (const auto& o : options) {
          if (!o.is_string())
            raise_in_call(errc::invalid_arg, name + " first arg must be str or a tuple of str");
          const auto& x = o.as_string();
          bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0
                                          : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
          if (hit)
            return value{true};
        }
        return value{false};
      });
    if (name == "upper" || name == "lower")
      return value::function("str." + name, [s, name](const call_args& a) -> value {
        check_arity(a, 0, {}, "str." + name + "()");
        return value{ascii_case(s, name == "upper", "str." + name + "()")};
      });
    if (name == "replace")
      return value::function("str.replace", [s](const call_args& a) -> value {
        check_arity(a, 3, {"count"}, "str.replace()");
        const value from = arg_at(a, 0, "", value{});
        const value to = arg_at(a, 1, "", value{});
        const value count = arg_at(a, 2, "count", value{std::int64_t{-1}});
        if (!from.is_string() || !to.is_string() || !is_int_like(count))
          raise_in_call(errc::invalid_arg, "str.replace() takes two strings and an optional count");
        return value{py_replace(s, from.as_string(), to.as_string(), count.as_int())};
      });
    static const std::set<std::string, std::less<>> others = {
      "capitalize", "casefold", "center", "count", "encode", "expandtabs", "find", "format", "format_map", "index",
      "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
      "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "maketrans", "partition", "removeprefix",
      "removesuffix", "rfind", "rindex", "rjust", "rpartition", "rsplit", "splitlines", "swapcase", "title",
      "translate", "zfill"};
    if (others.count(name) != 0)
      return value::function("str." + name, [name](const call_args&) -> value {
        raise_in_call(errc::unsupported, "str." + name + "() is not supported");
      });
    return {};
  }
  if (obj.is_list()) {
    static const std::set<std::string, std::less<>> others = {"append", "extend", "insert", "pop", "remove",
                                                              "clear", "sort", "reverse", "index", "count", "copy"};
    if (others.count(name) != 0)
      return value::function("list." + name, [name](const call_args&) -> value {
        raise_in_call(errc::unsupported, "list." + name + "() is not supported");
      });
  }
  return {};
}

value evaluator::global(const std::string& name) {
  if (name == "raise_exception")
    return value::function(name, [](const call_args& a) -> value {
      std::string msg = a.positional.empty() ? "" : (a.positional[0].is_string() ? a.positional[0].as_string() : "");
      raise_in_call(errc::invalid_arg, "the template raised an exception: " + msg);
    });
  if (name == "strftime_now") {
    auto now = opt_.now;
    return value::function(name, [now](const call_args& a) -> value {
      if (a.positional.size() != 1 || !a.positional[0].is_string())
        raise_in_call(errc::invalid_arg, "strftime_now() takes one format string");
      std::time_t t = std::chrono::system_clock::to_time_t(now);
      std::tm tm{};
      localtime_r(&t, &tm);
      const auto& fmt = a.positional[0].as_string();
      for (std::size_t i = 0; i + 1 < fmt.size(); ++i)
        if (fmt[i] == '%' && std::strchr("fzZ", fmt[i + 1]) != nullptr)
          raise_in_call(errc::unsupported, "strftime_now: %f, %z and %Z are not supported");
      std::string buf(fmt.size() * 8 + 64, '\0');
      auto n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
      if (n == 0 && !fmt.empty())
        raise_in_call(errc::unsupported, "strftime_now: format gives no output");
      buf.resize(n);
      return value{buf};
    });
  }
  if (name == "namespace" || name == "dict")
    return value::function(name, [name](const call_args& a) -> value {
      value_dict members;
      for (const auto& p : a.positional) {
        if (!p.is_dict())
          raise_in_call(errc::unsupported, name + "() with a positional argument other than a dict is not supported");
        for (const auto& m : p.as_dict())
          members.push_back(m);
      }
      for (const auto& [k, v] : a.keyword) {
        auto it = std::find_if(members.begin(), members.end(),
                               [&](const auto& m) { return m.first.is_string() && m.first.as_string() == k; });
        if (it != members.end())
          it->second = v;
        else
          members.emplace_back(k, v);
      }
      return name == "namespace" ? value::make_namespace(std::move(members)) : value{std::move(members)};
    });
  if (name == "range")
    return value::function(name, [](const call_args& a) -> value {
      if (a.positional.empty() || a.positional.size() > 3 || !a.keyword.empty())
        raise_in_call(errc::invalid_arg, "range expected 1 to 3 integer arguments");
      for (const auto& p : a.positional)
        if (!is_int_like(p))
          raise_in_call(errc::invalid_arg, "range() arguments must be integers");
      std::int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3)
          step = a.positional[2].as_int();
      }
      if (step == 0)
        raise_in_call(errc::invalid_arg, "range() arg 3 must not be zero");
      value_list out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 100000) // jinja2.sandbox.MAX_RANGE
          raise_in_call(errc::invalid_arg, "range too big");
        out.emplace_back(i);
      }
      return value{std::move(out)};
    });
  static const std::set<std::string, std::less<>> others = {"lipsum", "cycler", "joiner"};
  if (others.count(name) != 0)
    return value::function(name, [name](const call_args&) -> value {
      raise_in_call(errc::unsupported, "the global '" + name + "' is not supported");
    });
  return {};
}

value apply_filter(evaluator& ev, const std::string& name, const value& v, const call_args& a) {
  const value none = value::none();
  auto str_of = [&](const value& x) { return to_str(x, std::string::npos); };
  if (name == "length" || name == "count") {
    check_arity(a, 0, {}, name);
    return value{length_of(v, std::string::npos)};
  }
  if (name == "trim") {
    check_arity(a, 1, {"chars"}, name);
    const value chars = arg_at(a, 0, "chars", none);
    if (chars.is_none())
      return value{py_strip(str_of(v), true, true)};
    if (!chars.is_string())
      raise_in_call(errc::invalid_arg, "strip arg must be None or str");
    auto set = code_points(chars.as_string());
    return value{py_strip(str_of(v), true, true, &set)};
  }
  if (name == "default" || name == "d") {
    check_arity(a, 2, {"default_value", "boolean"}, name);
    const value def = arg_at(a, 0, "default_value", value{std::string{}});
    const value boolean = arg_at(a, 1, "boolean", value{false});
    if (v.is_undefined() || (boolean.truthy() && !v.truthy()))
      return def;
    return v;
  }
  if (name == "tojson") {
    check_arity(a, 4, {"ensure_ascii", "indent", "separators", "sort_keys"}, name);
    json_style st;
    st.ensure_ascii = arg_at(a, 0, "ensure_ascii", value{false}).truthy();
    const value indent = arg_at(a, 1, "indent", none);
    const value seps = arg_at(a, 2, "separators", none);
    st.sort_keys = arg_at(a, 3, "sort_keys", value{false}).truthy();
    if (!indent.is_none()) {
      st.indent_set = true;
      if (is_int_like(indent))
        st.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, indent.as_int())), ' ');
      else if (indent.is_string())
        st.indent = indent.as_string();
      else
        raise_in_call(errc::invalid_arg, "tojson: indent must be an integer or a string");
      st.item_sep = ",";
    }
    if (!seps.is_none()) {
      if (!seps.is_list() || seps.as_list().size() != 2 || !seps.as_list()[0].is_string() ||
          !seps.as_list()[1].is_string())
        raise_in_call(errc::invalid_arg, "tojson: separators must be a pair of strings");
      st.item_sep = seps.as_list()[0].as_string();
      st.key_sep = seps.as_list()[1].as_string();
    }
    std::string out;
    to_json(out, v, st, 0, std::string::npos);
    return value{std::move(out)};
  }
  if (name == "join") {
    check_arity(a, 2, {"d", "attribute"}, name);
    const value sep = arg_at(a, 0, "d", value{std::string{}});
    const value attribute = arg_at(a, 1, "attribute", none);
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v, std::string::npos)) {
      if (!first)
        out += str_of(sep);
      first = false;
      out += str_of(attribute.is_none() ? item : attr_path(ev, item, str_of(attribute), std::string::npos));
    }
    return value{std::move(out)};
  }
  if (name == "first" || name == "last") {
    check_arity(a, 0, {}, name);
    auto items = iterate(v, std::string::npos);
    if (items.empty())
      return {};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    check_arity(a, 0, {}, name);
    return value{iterate(v, std::string::npos)};
  }
  if (name == "reverse") {
    check_arity(a, 0, {}, name);
    if (v.is_string()) {
      auto cps = code_points(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return value{from_code_points(cps)};
    }
    auto items = iterate(v, std::string::npos);
    std::reverse(items.begin(), items.end());
    return value{std::move(items)};
  }
  if (name == "items") {
    check_arity(a, 0, {}, name);
    if (v.is_undefined())
      return value{value_list{}};
    if (v.type() != value::kind::dict)
      raise_in_call(errc::invalid_arg, "Can only get item pairs from a mapping.");
    value_list out;
    for (const auto& [k, x] : v.as_dict())
      out.emplace_back(value_list{k, x}, true);
    return value{std::move(out)};
  }
  if (name == "dictsort") {
    // jinja2's dictsort: the (key, value) pairs sorted by key or value, strings compared lowered
    // unless case_sensitive; keys of kinds Python cannot order are its TypeError.
    check_arity(a, 3, {"case_sensitive", "by", "reverse"}, name);
    const bool case_sensitive = arg_at(a, 0, "case_sensitive", value{false}).truthy();
    const value by = arg_at(a, 1, "by", value{"key"});
    const bool reverse = arg_at(a, 2, "reverse", value{false}).truthy();
    if (!by.is_string() || (by.as_string() != "key" && by.as_string() != "value"))
      raise_in_call(errc::invalid_arg, "You can only sort by either 'key' or 'value'");
    if (v.type() != value::kind::dict)
      raise_in_call(errc::invalid_arg, std::string{"dictsort of a '"} + type_name(v) + "', not a dict");
    const std::size_t field = by.as_string() == "key" ? 0 : 1;
    std::vector<std::pair<value, value>> keyed; // (sort key, the pair)
    for (const auto& [k, x] : v.as_dict()) {
      const value& on = field == 0 ? k : x;
      value sort_on = !case_sensitive && on.is_string() ? value{ascii_case(on.as_string(), false, "dictsort")} : on;
      keyed.emplace_back(std::move(sort_on), value{value_list{k, x}, true});
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
      return reverse ? py_compare(q.first, p.first, "<", std::string::npos) < 0
                     : py_compare(p.first, q.first, "<", std::string::npos) < 0;
    });
    value_list out;
    for (auto& p : keyed)
      out.push_back(std::move(p.second));
    return value{std::move(out)};
  }
  if (name == "string") {
    check_arity(a, 0, {}, name);
    return value{str_of(v)};
  }
  if (name == "upper" || name == "lower") {
    check_arity(a, 0, {}, name);
    return value{ascii_case(str_of(v), name == "upper", "the " + name + " filter")};
  }
  if (name == "capitalize") {
    check_arity(a, 0, {}, name);
    auto s = ascii_case(str_of(v), false, "the capitalize filter");
    if (!s.empty())
      s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return value{s};
  }
  if (name == "replace") {
    check_arity(a, 3, {"old", "new", "count"}, name);
    const value from = arg_at(a, 0, "old", value{});
    const value to = arg_at(a, 1, "new", value{});
    const value count = arg_at(a, 2, "count", none);
    if (!from.is_string() || !to.is_string())
      raise_in_call(errc::invalid_arg, "replace: old and new must be strings");
    if (!count.is_none() && !is_int_like(count))
      raise_in_call(errc::invalid_arg, "replace: count must be an integer");
    return value{py_replace(str_of(v), from.as_string(), to.as_string(), count.is_none() ? -1 : count.as_int())};
  }
  if (name == "abs") {
    check_arity(a, 0, {}, name);
    if (is_int_like(v)) {
      if (v.as_int() == std::numeric_limits<std::int64_t>::min())
        raise_in_call(errc::unsupported, "integer overflow (only 64-bit integers are supported)");
      return value{v.as_int() < 0 ? -v.as_int() : v.as_int()};
    }
    if (v.type() == value::kind::floating)
      return value{std::fabs(v.as_double())};
    raise_in_call(errc::invalid_arg, std::string{"bad operand type for abs(): '"} + type_name(v) + "'");
  }
  if (name == "int") {
    check_arity(a, 2, {"default", "base"}, name);
    const value def = arg_at(a, 0, "default", value{std::int64_t{0}});
    const value base = arg_at(a, 1, "base", value{std::int64_t{10}});
    if (!is_int_like(base) || base.as_int() != 10)
      raise_in_call(errc::unsupported, "the int filter supports base 10 only");
    if (is_int_like(v))
      return value{v.as_int()};
    std::optional<double> d;
    if (v.is_string()) {
      if (auto i = parse_py_int(v.as_string(), 10))
        return value{*i};
      d = parse_py_float(v.as_string());
    } else if (v.type() == value::kind::floating) {
      d = v.as_double();
    }
    if (!d || std::isnan(*d) || std::isinf(*d))
      return def;
    if (std::fabs(*d) >= 9.2e18)
      raise_in_call(errc::unsupported, "integer overflow (only 64-bit integers are supported)");
    return value{static_cast<std::int64_t>(std::trunc(*d))};
  }
  if (name == "float") {
    check_arity(a, 1, {"default"}, name);
    const value def = arg_at(a, 0, "default", value{0.0});
    if (is_number(v))
      return value{v.as_double()};
    if (v.is_string())
      if (auto d = parse_py_float(v.as_string()))
        return value{*d};
    return def;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    if (!a.keyword.empty())
      raise_in_call(errc::unsupported, name + " with keyword arguments is not supported");
    std::size_t k = 0;
    std::string attribute;
    if (attr) {
      if (a.positional.empty() || !a.positional[0].is_string())
        raise_in_call(errc::invalid_arg, name + " needs an attribute name");
      attribute = a.positional[0].as_string();
      k = 1;
    }
    std::string test_name;
    std::vector<value> test_args;
    if (k < a.positional.size()) {
      if (!a.positional[k].is_string())
        raise_in_call(errc::invalid_arg, name + ": the test name must be a string");
      test_name = a.positional[k].as_string();
      if (jinja_tests.count(test_name) == 0)
        raise_in_call(errc::invalid_arg, "no test named '" + test_name + "'");
      test_args.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(k + 1), a.positional.end());
    }
    value_list out;
    if (v.is_none()) // jinja2 selects from a None as from nothing
      return value{std::move(out)};
    for (const auto& item : iterate(v, std::string::npos)) {
      const value x = attr ? attr_path(ev, item, attribute, std::string::npos) : item;
      bool hit = test_name.empty() ? x.truthy() : apply_test(ev, test_name, x, test_args);
      if (hit == keep_if)
        out.push_back(item);
    }
    return value{std::move(out)};
  }
  if (name == "map") {
    value_list out;
    const value* attribute = nullptr;
    const value* def = nullptr;
    for (const auto& [k, x] : a.keyword) {
      if (k == "attribute")
        attribute = &x;
      else if (k == "default")
        def = &x;
    }
    if (attribute != nullptr) {
      if (!a.positional.empty() || a.keyword.size() > (def ? 2u : 1u))
        raise_in_call(errc::invalid_arg, "map: attribute= takes no other arguments but default=");
      for (const auto& item : iterate(v, std::string::npos)) {
        auto x = attr_path(ev, item, to_str(*attribute, std::string::npos), std::string::npos);
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return value{std::move(out)};
    }
    if (a.positional.empty() || !a.positional[0].is_string())
      raise_in_call(errc::invalid_arg, "map: expected a filter name or attribute=");
    auto fname = a.positional[0].as_string();
    if (jinja_filters.count(fname) == 0)
      raise_in_call(errc::invalid_arg, "no filter named '" + fname + "'");
    call_args rest{{a.positional.begin() + 1, a.positional.end()}, a.keyword};
    for (const auto& item : iterate(v, std::string::npos))
      out.push_back(apply_filter(ev, fname, item, rest));
    return value{std::move(out)};
  }
  raise_in_call(errc::unsupported, "the filter '" + name + "' is not supported");
}

bool apply_test(evaluator& ev, const std::string& name, const value& v, const std::vector<value>& args) {
  (void)ev;
  auto need = [&](std::size_t n) {
    if (args.size() != n)
      raise_in_call(errc::invalid_arg, "the test '" + name + "' takes " + std::to_string(n) + " argument(s)");
  };
  using k = value::kind;
  if (name == "defined") return need(0), !v.is_undefined();
  if (name == "undefined") return need(0), v.is_undefined();
  if (name == "none") return need(0), v.is_none();
  if (name == "boolean") return need(0), v.type() == k::boolean;
  if (name == "true") return need(0), v.type() == k::boolean && v.as_bool();
  if (name == "false") return need(0), v.type() == k::boolean && !v.as_bool();
  if (name == "integer") return need(0), v.type() == k::integer;
  if (name == "float") return need(0), v.type() == k::floating;
  if (name == "number") return need(0), is_number(v);
  if (name == "string") return need(0), v.is_string();
  if (name == "mapping") return need(0), v.type() == k::dict;
  if (name == "callable") return need(0), v.type() == k::function;
  if (name == "iterable")
    return need(0), v.is_undefined() || v.is_string() || v.is_list() || v.type() == k::dict;
  if (name == "sequence")
    return need(0), v.is_undefined() || v.is_string() || v.is_list() || v.type() == k::dict;
  if (name == "lower" || name == "upper") {
    need(0);
    // str.islower(): at least one cased character and no character of the other case.
    auto s = to_str(v, std::string::npos);
    bool cased = false;
    for (unsigned char c : s) {
      if (c >= 0x80)
        raise_in_call(errc::unsupported, "the test '" + name + "' on non-ASCII text is not supported");
      if (std::isalpha(c)) {
        cased = true;
        if ((name == "lower") != (std::islower(c) != 0))
          return false;
      }
    }
    return cased;
  }
  if (name == "odd" || name == "even") {
    need(0);
    if (!is_int_like(v))
      raise_in_call(errc::invalid_arg, "the test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    need(1);
    if (!is_int_like(v) || !is_int_like(args[0]))
      raise_in_call(errc::unsupported, "divisibleby of non-integers is not supported");
    if (args[0].as_int() == 0)
      raise_in_call(errc::invalid_arg, "integer division or modulo by zero");
    return v.as_int() % args[0].as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return need(1), py_equal(v, args[0]);
  if (name == "ne" || name == "!=") return need(1), !py_equal(v, args[0]);
  if (name == "lt" || name == "lessthan" || name == "<") return need(1), py_compare(v, args[0], "<", std::string::npos) < 0;
  if (name == "le" || name == "<=") return need(1), py_compare(v, args[0], "<=", std::string::npos) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return need(1), py_compare(v, args[0], ">", std::string::npos) > 0;
  if (name == "ge" || name == ">=") return need(1), py_compare(v, args[0], ">=", std::string::npos) >= 0;
  if (name == "in") return need(1), py_in(v, args[0], std::string::npos);
  raise_in_call(errc::unsupported, "the test '" + name + "' is not supported");
}

} // namespace crucible::jinja::detail
