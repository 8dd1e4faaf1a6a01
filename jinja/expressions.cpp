// jinja/expressions.cpp: the value of an expression for the statements of render.cpp: names,
// literals, attribute and item access, slices, calls, filters and tests (applied by builtins.cpp),
// Python's arithmetic, comparisons and boolean operators.
#include <algorithm>
#include <cmath>
#include <limits>

#include "jinja/detail.hpp"

namespace crucible::jinja::detail {

value evaluator::get_attr(const value& obj, const std::string& name, std::size_t pos) {
  // Python objects have many dunder attributes (the sandbox hides some, not all); none is modelled.
  if (name.rfind("__", 0) == 0)
    raise(errc::unsupported, pos, "the attribute '" + name + "' is not supported");
  if (obj.is_undefined())
    raise(errc::invalid_arg, pos, "'" + name + "' of an undefined value: the object is undefined");
  if (obj.type() == value::kind::ns) {
    if (const value* v = obj.find(name))
      return *v;
    return {};
  }
  // Python attribute first (the methods), then the item, as the sandbox's getattr does.
  auto m = method(obj, name, pos);
  if (!m.is_undefined())
    return m;
  if (obj.type() == value::kind::dict)
    if (const value* v = obj.find(name))
      return *v;
  return {};
}

value evaluator::get_item(const value& obj, const value& key, std::size_t pos) {
  if (obj.is_undefined())
    raise(errc::invalid_arg, pos, "item of an undefined value: the object is undefined");
  if (key.type() == value::kind::list && key.is_tuple() && !obj.is_dict())
    raise(errc::unsupported, pos, "multi-dimensional subscripts are not supported");
  switch (obj.type()) {
    case value::kind::dict:
    case value::kind::ns:
      if (!key.is_string()) {
        if (const value* v = obj.find_key(hashable(key, pos)))
          return *v;
      } else {
        if (const value* v = obj.find(key.as_string()))
          return *v;
        if (key.as_string().rfind("__", 0) == 0)
          raise(errc::unsupported, pos, "the attribute '" + key.as_string() + "' is not supported");
        if (obj.type() == value::kind::dict) {
          auto m = method(obj, key.as_string(), pos);
          if (!m.is_undefined())
            return m;
        }
      }
      return {};
    case value::kind::list:
      if (is_int_like(key)) {
        bool ok = false;
        auto i = py_index(key.as_int(), obj.as_list().size(), ok);
        return ok ? obj.as_list()[i] : value{};
      }
      break;
    case value::kind::string:
      if (is_int_like(key)) {
        auto cps = code_points(obj.as_string());
        bool ok = false;
        auto i = py_index(key.as_int(), cps.size(), ok);
        return ok ? value{from_code_points(cps, i, i + 1)} : value{};
      }
      break;
    default: break;
  }
  if (key.is_string()) {
    if (key.as_string().rfind("__", 0) == 0)
      raise(errc::unsupported, pos, "the attribute '" + key.as_string() + "' is not supported");
    return method(obj, key.as_string(), pos);
  }
  return {};
}

call_args evaluator::eval_args(const expr& e, scope& sc) {
  call_args a;
  for (std::size_t i = 1; i < e.args.size(); ++i)
    a.positional.push_back(eval(*e.args[i], sc));
  for (const auto& [k, x] : e.kwargs)
    a.keyword.emplace_back(k, eval(*x, sc));
  return a;
}

value evaluator::call(const value& fn, call_args args, std::size_t pos) {
  if (fn.is_undefined())
    raise(errc::invalid_arg, pos, "call of an undefined value");
  if (fn.type() != value::kind::function)
    raise(errc::invalid_arg, pos, std::string{"'"} + type_name(fn) + "' object is not callable");
  try {
    return fn.as_function()(args);
  } catch (template_error& e) {
    if (e.pos == std::string::npos)
      e.pos = pos;
    throw;
  }
}

value evaluator::binary(const std::string& op, const value& a, const value& b, std::size_t pos) {
  if (a.is_undefined() || b.is_undefined())
    raise(errc::invalid_arg, pos, "'" + op + "' with an undefined value");
  auto type_error = [&]() -> value {
    raise(errc::invalid_arg, pos, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                                    type_name(b) + "'");
  };
  const bool ints = is_int_like(a) && is_int_like(b);
  const bool nums = is_number(a) && is_number(b);
  if (op == "+") {
    if (ints) {
      std::int64_t r = 0;
      const bool overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return value{checked(overflow, r, pos)};
    }
    if (nums)
      return value{a.as_double() + b.as_double()};
    if (a.is_string() && b.is_string())
      return value{a.as_string() + b.as_string()};
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      value_list l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return value{std::move(l), a.is_tuple()};
    }
    if (a.is_string() && !b.is_string())
      raise(errc::invalid_arg, pos, std::string{"can only concatenate str (not \""} + type_name(b) + "\") to str");
    return type_error();
  }
  if (op == "-") {
    if (ints) {
      std::int64_t r = 0;
      const bool overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return value{checked(overflow, r, pos)};
    }
    if (nums)
      return value{a.as_double() - b.as_double()};
    return type_error();
  }
  if (op == "*") {
    if (ints) {
      std::int64_t r = 0;
      const bool overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return value{checked(overflow, r, pos)};
    }
    if (nums)
      return value{a.as_double() * b.as_double()};
    const value* seq = (a.is_string() || a.is_list()) && is_int_like(b) ? &a
                       : (b.is_string() || b.is_list()) && is_int_like(a) ? &b
                                                                          : nullptr;
    if (seq != nullptr) {
      std::int64_t n = (seq == &a ? b : a).as_int();
      if (n > 0 && length_of(*seq, pos) * n > 100000000)
        raise(errc::unsupported, pos, "repetition result too large");
      if (seq->is_string()) {
        std::string out;
        for (std::int64_t i = 0; i < n; ++i)
          out += seq->as_string();
        return value{std::move(out)};
      }
      value_list out;
      for (std::int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
      return value{std::move(out), seq->is_tuple()};
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums)
      return type_error();
    if (b.as_double() == 0)
      raise(errc::invalid_arg, pos, "division by zero");
    return value{a.as_double() / b.as_double()};
  }
  if (op == "//" || op == "%") {
    if (a.is_string() && op == "%")
      raise(errc::unsupported, pos, "printf-style string formatting is not supported");
    if (!nums)
      return type_error();
    if (b.as_double() == 0)
      raise(errc::invalid_arg, pos, op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      if (a.as_int() == std::numeric_limits<std::int64_t>::min() && b.as_int() == -1)
        raise(errc::unsupported, pos, "integer overflow (only 64-bit integers are supported)");
      auto q = floor_div(a.as_int(), b.as_int());
      return op == "//" ? value{q} : value{a.as_int() - q * b.as_int()};
    }
    // CPython's float divmod.
    double x = a.as_double(), y = b.as_double();
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%")
      return value{mod};
    double fd;
    if (div != 0) {
      fd = std::floor(div);
      if (div - fd > 0.5)
        fd += 1.0;
    } else {
      fd = std::copysign(0.0, x / y);
    }
    return value{fd};
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      std::int64_t r = 1;
      for (std::int64_t i = 0; i < b.as_int(); ++i)
        if (__builtin_mul_overflow(r, a.as_int(), &r))
          checked(true, r, pos);
      return value{r};
    }
    if (nums) {
      if (a.as_double() == 0 && b.as_double() < 0)
        raise(errc::invalid_arg, pos, "0.0 cannot be raised to a negative power");
      double r = std::pow(a.as_double(), b.as_double());
      if (std::isnan(r))
        raise(errc::unsupported, pos, "complex results of ** are not supported");
      return value{r};
    }
    return type_error();
  }
  raise(errc::unsupported, pos, "operator " + op + " is not supported");
}

value evaluator::eval(const expr& e, scope& sc) {
  switch (e.kind) {
    case expr::op::literal: return e.lit;
    case expr::op::name: {
      if (value* v = lookup(e.name, sc))
        return *v;
      return global(e.name);
    }
    case expr::op::getattr: return get_attr(eval(*e.args[0], sc), e.name, e.pos);
    case expr::op::getitem: {
      auto obj = eval(*e.args[0], sc);
      const auto& k = *e.args[1];
      if (k.kind == expr::op::slice) {
        if (obj.is_undefined())
          raise(errc::invalid_arg, e.pos, "slice of an undefined value");
        value start = k.args[0] ? eval(*k.args[0], sc) : value::none();
        value stop = k.args[1] ? eval(*k.args[1], sc) : value::none();
        value step = k.args[2] ? eval(*k.args[2], sc) : value::none();
        if (obj.is_string()) {
          auto cps = code_points(obj.as_string());
          std::vector<char32_t> sel;
          for (auto i : slice_positions(cps.size(), start, stop, step, k.pos))
            sel.push_back(cps[i]);
          return value{from_code_points(sel)};
        }
        if (obj.is_list()) {
          value_list sel;
          for (auto i : slice_positions(obj.as_list().size(), start, stop, step, k.pos))
            sel.push_back(obj.as_list()[i]);
          return value{std::move(sel), obj.is_tuple()};
        }
        return {};
      }
      return get_item(obj, eval(k, sc), e.pos);
    }
    case expr::op::call: {
      auto fn = eval(*e.args[0], sc);
      return call(fn, eval_args(e, sc), e.pos);
    }
    case expr::op::filter: {
      auto v = eval(*e.args[0], sc);
      auto a = eval_args(e, sc);
      try {
        return apply_filter(*this, e.name, v, a);
      } catch (template_error& err) {
        if (err.pos == std::string::npos)
          err.pos = e.pos;
        throw;
      }
    }
    case expr::op::test: {
      auto v = eval(*e.args[0], sc);
      std::vector<value> args;
      for (std::size_t i = 1; i < e.args.size(); ++i)
        args.push_back(eval(*e.args[i], sc));
      if (!e.kwargs.empty())
        raise(errc::unsupported, e.pos, "keyword arguments to tests are not supported");
      try {
        return value{apply_test(*this, e.name, v, args)};
      } catch (template_error& err) {
        if (err.pos == std::string::npos)
          err.pos = e.pos;
        throw;
      }
    }
    case expr::op::not_: return value{!eval(*e.args[0], sc).truthy()};
    case expr::op::neg:
    case expr::op::pos: {
      auto v = eval(*e.args[0], sc);
      if (!is_number(v))
        raise(errc::invalid_arg, e.pos, std::string{"bad operand type for unary "} +
                                          (e.kind == expr::op::neg ? "-" : "+") + ": '" + type_name(v) + "'");
      if (e.kind == expr::op::pos)
        return is_int_like(v) ? value{v.as_int()} : v;
      if (is_int_like(v)) {
        if (v.as_int() == std::numeric_limits<std::int64_t>::min())
          raise(errc::unsupported, e.pos, "integer overflow (only 64-bit integers are supported)");
        return value{-v.as_int()};
      }
      return value{-v.as_double()};
    }
    case expr::op::binary: {
      auto l = eval(*e.args[0], sc);
      auto r = eval(*e.args[1], sc);
      return binary(e.name, l, r, e.pos);
    }
    case expr::op::compare: {
      auto left = eval(*e.args[0], sc);
      for (std::size_t i = 0; i < e.ops.size(); ++i) {
        auto right = eval(*e.args[i + 1], sc);
        const auto& op = e.ops[i];
        bool r;
        if (op == "==")
          r = py_equal(left, right);
        else if (op == "!=")
          r = !py_equal(left, right);
        else if (op == "in")
          r = py_in(left, right, e.pos);
        else if (op == "not in")
          r = !py_in(left, right, e.pos);
        else {
          int c = py_compare(left, right, op, e.pos);
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r)
          return value{false};
        left = std::move(right);
      }
      return value{true};
    }
    case expr::op::and_: {
      auto l = eval(*e.args[0], sc);
      return l.truthy() ? eval(*e.args[1], sc) : l;
    }
    case expr::op::or_: {
      auto l = eval(*e.args[0], sc);
      return l.truthy() ? l : eval(*e.args[1], sc);
    }
    case expr::op::cond:
      if (eval(*e.args[0], sc).truthy())
        return eval(*e.args[1], sc);
      return e.args[2] ? eval(*e.args[2], sc) : value{};
    case expr::op::list:
    case expr::op::tuple: {
      value_list items;
      for (const auto& x : e.args)
        items.push_back(eval(*x, sc));
      return value{std::move(items), e.kind == expr::op::tuple};
    }
    case expr::op::dict: {
      value_dict members;
      for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
        auto k = eval(*e.args[i], sc);
        if (k.is_undefined()) // jinja2 hashes its Undefined; this subset does not keep it as a key
          raise(errc::unsupported, e.args[i]->pos, "an undefined value as a dict key is not supported");
        hashable(k, e.args[i]->pos);
        auto v = eval(*e.args[i + 1], sc);
        // Python keeps the first key's position and object (1 then 1.0: the key stays 1) and the last value.
        auto it = std::find_if(members.begin(), members.end(), [&](const auto& m) { return py_equal(m.first, k); });
        if (it != members.end())
          it->second = std::move(v);
        else
          members.emplace_back(std::move(k), std::move(v));
      }
      return value{std::move(members)};
    }
    case expr::op::concat: {
      std::string out;
      for (const auto& x : e.args)
        out += to_str(eval(*x, sc), x->pos);
      return value{std::move(out)};
    }
    case expr::op::slice: raise(errc::invalid_arg, e.pos, "a slice outside a subscript");
  }
  raise(errc::unsupported, e.pos, "unsupported expression");
}

} // namespace crucible::jinja::detail
