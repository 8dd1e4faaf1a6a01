// jinja/value.cpp: the template language's values (jinja.hpp's value, built from literals, JSON
// and the render context) and their Python semantics for the evaluator: str(), repr(), json.dumps,
// ==, ordering, `in`, len(), iteration, indices and slices.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/json.hpp"
#include "core/json_parse.hpp"
#include "core/utf8.hpp"
#include "jinja/detail.hpp"

namespace crucible::jinja {

value value::none() {
  value v;
  v.kind_ = kind::none;
  return v;
}

value::value(bool b) : kind_(kind::boolean), b_(b), i_(b ? 1 : 0) {}
value::value(std::int64_t i) : kind_(kind::integer), i_(i) {}
value::value(double d) : kind_(kind::floating), d_(d) {}
value::value(std::string s) : kind_(kind::string), s_(std::make_shared<const std::string>(std::move(s))) {}
value::value(value_list items, bool tuple)
  : kind_(kind::list), tuple_(tuple), list_(std::make_shared<const value_list>(std::move(items))) {}
value::value(value_dict members) : kind_(kind::dict), dict_(std::make_shared<value_dict>(std::move(members))) {}

value value::make_namespace(value_dict members) {
  value v{std::move(members)};
  v.kind_ = kind::ns;
  return v;
}

value value::function(std::string name, function_type f) {
  value v;
  v.kind_ = kind::function;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const function_type>(std::move(f));
  return v;
}

value value::from_json(const json_value& j) {
  switch (j.type()) {
    case json_value::kind::null: return none();
    case json_value::kind::boolean: return value{j.as_bool()};
    case json_value::kind::integer: return value{j.as_int()};
    case json_value::kind::real: return value{j.as_double()};
    case json_value::kind::string: return value{j.as_string()};
    case json_value::kind::array: {
      value_list items;
      for (const auto& x : j.as_array())
        items.push_back(from_json(x));
      return value{std::move(items)};
    }
    case json_value::kind::object: {
      value_dict members;
      for (const auto& m : j.as_object()) {
        // Python's dict keeps the last of duplicate keys, at the first one's position.
        auto it = std::find_if(members.begin(), members.end(), [&](const auto& p) { return p.first.as_string() == m.key; });
        if (it != members.end())
          it->second = from_json(m.value);
        else
          members.emplace_back(m.key, from_json(m.value));
      }
      return value{std::move(members)};
    }
  }
  return {};
}

const value* value::find(std::string_view key) const {
  if (!is_dict())
    return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k.is_string() && k.as_string() == key)
      return &v;
  return nullptr;
}

const value* value::find_key(const value& key) const {
  if (!is_dict())
    return nullptr;
  for (const auto& [k, v] : *dict_)
    if (detail::py_equal(k, key))
      return &v;
  return nullptr;
}

bool value::truthy() const noexcept {
  switch (kind_) {
    case kind::undefined:
    case kind::none: return false;
    case kind::boolean: return b_;
    case kind::integer: return i_ != 0;
    case kind::floating: return d_ != 0;
    case kind::string: return !s_->empty();
    case kind::list: return !list_->empty();
    case kind::dict: return !dict_->empty();
    case kind::ns:
    case kind::function: return true;
  }
  return false;
}

namespace detail {

const char* type_name(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::none: return "NoneType";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::floating: return "float";
    case value::kind::string: return "str";
    case value::kind::list: return v.is_tuple() ? "tuple" : "list";
    case value::kind::dict: return "dict";
    case value::kind::ns: return "Namespace";
    case value::kind::function: return "function";
  }
  return "?";
}

std::string to_str(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return "";
    case value::kind::none: return "None";
    case value::kind::boolean: return v.as_bool() ? "True" : "False";
    case value::kind::integer: return std::to_string(v.as_int());
    case value::kind::floating: return python_float_repr(v.as_double());
    case value::kind::string: return v.as_string();
    case value::kind::list:
    case value::kind::dict: return repr(v, pos);
    case value::kind::ns:
    case value::kind::function: break;
  }
  raise(errc::unsupported, pos, std::string{"printing a "} + type_name(v) + " is not supported");
}

std::string repr(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::string: return py_str_repr(v.as_string());
    case value::kind::list: {
      const auto& l = v.as_list();
      std::string out = v.is_tuple() ? "(" : "[";
      for (std::size_t i = 0; i < l.size(); ++i)
        out += (i ? ", " : "") + repr(l[i], pos);
      if (v.is_tuple() && l.size() == 1)
        out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case value::kind::dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.as_dict()) {
        out += (first ? "" : ", ") + repr(k, pos) + ": " + repr(x, pos);
        first = false;
      }
      return out + "}";
    }
    default: return to_str(v, pos);
  }
}

namespace {

// json.dumps's two-character escape of `c`, or nullptr when it has none.
const char* json_short_escape(char32_t c) noexcept {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: return nullptr;
  }
}

// A str as json.dumps writes it: \uXXXX for control characters, and for all non-ASCII ones
// (surrogate pairs above U+FFFF) when ensure_ascii.
void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : code_points(s)) {
    if (const char* e = json_short_escape(c)) {
      out += e;
    } else if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      char b[16];
      if (c > 0xFFFF) {
        char32_t v = c - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      }
      out += b;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      append_utf8(out, c);
    }
  }
  out += '"';
}

} // namespace

const value& hashable(const value& key, std::size_t pos) {
  switch (key.type()) {
    case value::kind::list:
      if (key.is_tuple()) {
        for (const auto& x : key.as_list())
          hashable(x, pos);
        return key;
      }
      break;
    case value::kind::dict:
    case value::kind::ns: break;
    default: return key;
  }
  raise(errc::invalid_arg, pos, std::string{"unhashable type: '"} + type_name(key) + "'");
}

std::string json_key(const value& key, std::size_t pos) {
  switch (key.type()) {
    case value::kind::string: return key.as_string();
    case value::kind::integer:
    case value::kind::boolean:
    case value::kind::none:
    case value::kind::floating: { // json.dumps writes such a key as it writes the value
      std::string out;
      to_json(out, key, json_style{}, 0, pos);
      return out;
    }
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"keys must be str, int, float, bool or None, not "} + type_name(key));
}

void to_json(std::string& out, const value& v, const json_style& st, int level, std::size_t pos) {
  auto newline = [&](int l) {
    out += '\n';
    for (int i = 0; i < l; ++i)
      out += st.indent;
  };
  switch (v.type()) {
    case value::kind::none: out += "null"; return;
    case value::kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::floating: {
      double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float_repr(d);
      return;
    }
    case value::kind::string: json_string(out, v.as_string(), st.ensure_ascii); return;
    case value::kind::list: {
      const auto& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (i)
          out += st.item_sep;
        if (st.indent_set)
          newline(level + 1);
        to_json(out, l[i], st, level + 1, pos);
      }
      if (st.indent_set)
        newline(level);
      out += ']';
      return;
    }
    case value::kind::dict: {
      std::vector<const std::pair<value, value>*> members;
      for (const auto& m : v.as_dict())
        members.push_back(&m);
      if (members.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys) // Python sorts the keys as they are (a TypeError for str beside int), then writes them
        std::stable_sort(members.begin(), members.end(), [pos](auto* a, auto* b) {
          return py_compare(a->first, b->first, "<", pos) < 0; // strings: UTF-8 byte order is code point order
        });
      out += '{';
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (i)
          out += st.item_sep;
        if (st.indent_set)
          newline(level + 1);
        json_string(out, json_key(members[i]->first, pos), st.ensure_ascii);
        out += st.key_sep;
        to_json(out, members[i]->second, st, level + 1, pos);
      }
      if (st.indent_set)
        newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"Object of type "} + type_name(v) + " is not JSON serializable");
}

bool py_equal(const value& a, const value& b) {
  if (is_number(a) && is_number(b)) {
    if (is_int_like(a) && is_int_like(b))
      return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.type() != b.type())
    return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.as_string() == b.as_string();
    case value::kind::list: {
      if (a.is_tuple() != b.is_tuple())
        return false;
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size())
        return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i]))
          return false;
      return true;
    }
    case value::kind::dict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.size() != y.size())
        return false;
      for (const auto& [k, v] : x) {
        const value* w = b.find_key(k);
        if (w == nullptr || !py_equal(v, *w))
          return false;
      }
      return true;
    }
    case value::kind::ns: return &a.as_dict() == &b.as_dict();
    case value::kind::function: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

int py_compare(const value& a, const value& b, const std::string& op, std::size_t pos) {
  if (is_number(a) && is_number(b)) {
    if (is_int_like(a) && is_int_like(b))
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double();
    double y = b.as_double();
    if (std::isnan(x) || std::isnan(y))
      raise(errc::unsupported, pos, "ordering comparisons with NaN are not supported");
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!py_equal(x[i], y[i]))
        return py_compare(x[i], y[i], op, pos);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined())
    raise(errc::invalid_arg, pos, "an undefined value cannot be compared");
  raise(errc::invalid_arg, pos, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                                  type_name(b) + "'");
}

bool py_in(const value& item, const value& container, std::size_t pos) {
  switch (container.type()) {
    case value::kind::undefined: return false;
    case value::kind::string:
      if (!item.is_string())
        raise(errc::invalid_arg, pos, std::string{"'in <string>' requires string as left operand, not "} + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case value::kind::list:
      for (const auto& x : container.as_list())
        if (py_equal(x, item))
          return true;
      return false;
    case value::kind::dict: return container.find_key(hashable(item, pos)) != nullptr;
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"argument of type '"} + type_name(container) + "' is not iterable");
}

std::int64_t checked(bool overflow, std::int64_t v, std::size_t pos) {
  if (overflow)
    raise(errc::unsupported, pos, "integer overflow (only 64-bit integers are supported)");
  return v;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    --q;
  return q;
}

std::int64_t length_of(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return 0;
    case value::kind::string: return static_cast<std::int64_t>(code_point_count(v.as_string()));
    case value::kind::list: return static_cast<std::int64_t>(v.as_list().size());
    case value::kind::dict: return static_cast<std::int64_t>(v.as_dict().size());
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"object of type '"} + type_name(v) + "' has no len()");
}

value_list iterate(const value& v, std::size_t pos) {
  switch (v.type()) {
    case value::kind::undefined: return {};
    case value::kind::list: return v.as_list();
    case value::kind::dict: {
      value_list keys;
      for (const auto& m : v.as_dict())
        keys.emplace_back(m.first);
      return keys;
    }
    case value::kind::string: {
      value_list chars;
      for (char32_t c : code_points(v.as_string()))
        chars.emplace_back(from_code_points({c}));
      return chars;
    }
    default: break;
  }
  raise(errc::invalid_arg, pos, std::string{"'"} + type_name(v) + "' object is not iterable");
}

std::size_t py_index(std::int64_t i, std::size_t n, bool& ok) {
  if (i < 0)
    i += static_cast<std::int64_t>(n);
  ok = i >= 0 && static_cast<std::size_t>(i) < n;
  return ok ? static_cast<std::size_t>(i) : 0;
}

std::vector<std::size_t> slice_positions(std::size_t n, const value& start, const value& stop, const value& step,
                                         std::size_t pos) {
  auto as_opt_int = [&](const value& v, const char* what) -> std::optional<std::int64_t> {
    if (v.is_none() || v.is_undefined())
      return std::nullopt;
    if (!is_int_like(v))
      raise(errc::invalid_arg, pos, std::string{"slice "} + what + " must be an integer or none");
    return v.as_int();
  };
  auto st = as_opt_int(step, "step").value_or(1);
  if (st == 0)
    raise(errc::invalid_arg, pos, "slice step cannot be zero");
  const auto len = static_cast<std::int64_t>(n);
  auto clamp = [&](std::optional<std::int64_t> x, std::int64_t def) {
    if (!x)
      return def;
    std::int64_t v = *x;
    if (v < 0) {
      v += len;
      if (v < 0)
        v = st < 0 ? -1 : 0;
    } else if (v >= len) {
      v = st < 0 ? len - 1 : len;
    }
    return v;
  };
  std::int64_t b = clamp(as_opt_int(start, "start"), st < 0 ? len - 1 : 0);
  std::int64_t e = clamp(as_opt_int(stop, "stop"), st < 0 ? -1 : len);
  std::vector<std::size_t> out;
  if (st > 0)
    for (std::int64_t i = b; i < e; i += st)
      out.push_back(static_cast<std::size_t>(i));
  else
    for (std::int64_t i = b; i > e; i += st)
      out.push_back(static_cast<std::size_t>(i));
  return out;
}

} // namespace detail

} // namespace crucible::jinja
