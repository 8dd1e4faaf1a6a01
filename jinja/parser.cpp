// jinja/parser.cpp: tokens in (from lexer.cpp), the syntax tree of statements and expressions out
// (to render.cpp): recursive descent with Jinja's operator precedence; syntax Jinja refuses, and
// statements outside the subset, are errors here.
#include <algorithm>
#include <charconv>

#include "jinja/detail.hpp"

namespace crucible::jinja::detail {

namespace {

expr_ptr make(expr::op k, std::size_t pos) {
  auto e = std::make_unique<expr>();
  e->kind = k;
  e->pos = pos;
  return e;
}

class parser {
public:
  explicit parser(std::vector<token> toks) : t_(std::move(toks)) {}

  body parse_template() {
    auto b = parse_body({});
    if (cur().type != tok::eof)
      raise(errc::invalid_arg, cur().pos, "unexpected tag");
    return b;
  }

private:
  const token& cur() const { return t_[i_]; }
  const token& look(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size())
      ++i_;
  }
  bool is_op(std::string_view o) const { return cur().type == tok::op && cur().text == o; }
  bool is_name(std::string_view n) const { return cur().type == tok::name && cur().text == n; }
  bool skip_op(std::string_view o) {
    if (!is_op(o))
      return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n))
      return false;
    next();
    return true;
  }
  static std::string describe(const token& t) {
    switch (t.type) {
      case tok::eof: return "end of template";
      case tok::block_end: return "end of statement block";
      case tok::var_end: return "end of print statement";
      case tok::data: return "template data";
      case tok::string: return "string";
      case tok::integer:
      case tok::floating: return "number " + t.text;
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view o) {
    if (!skip_op(o))
      raise(errc::invalid_arg, cur().pos, "expected '" + std::string{o} + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != tok::name)
      raise(errc::invalid_arg, cur().pos, "expected a name, got " + describe(cur()));
    auto n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != tok::block_end)
      raise(errc::invalid_arg, cur().pos, "expected end of statement block, got " + describe(cur()));
    next();
  }

  // Statements until a block tag whose keyword is in `ends` (left unconsumed, positioned at the
  // keyword), or the end of the template.
  body parse_body(const std::vector<std::string_view>& ends) {
    body out;
    while (true) {
      const auto& t = cur();
      if (t.type == tok::eof) {
        if (!ends.empty()) {
          std::string want;
          for (auto e : ends)
            want += (want.empty() ? "'" : " or '") + std::string{e} + "'";
          raise(errc::invalid_arg, t.pos, "unexpected end of template, expected " + want);
        }
        return out;
      }
      if (t.type == tok::data) {
        out.push_back(node{node::kind::text, t.pos, t.text, {}, {}, {}, {}, {}, false, {}, {}});
        next();
        continue;
      }
      if (t.type == tok::var_begin) {
        auto pos = t.pos;
        next();
        auto e = parse_tuple(true, {});
        if (cur().type != tok::var_end)
          raise(errc::invalid_arg, cur().pos, "expected end of print statement, got " + describe(cur()));
        next();
        node n{node::kind::output, pos, {}, std::move(e), {}, {}, {}, {}, false, {}, {}};
        out.push_back(std::move(n));
        continue;
      }
      if (t.type == tok::block_begin) {
        const auto& kw = look();
        if (kw.type == tok::name && std::find(ends.begin(), ends.end(), kw.text) != ends.end()) {
          next(); // at the keyword
          return out;
        }
        next();
        out.push_back(parse_statement(t.pos));
        continue;
      }
      raise(errc::invalid_arg, t.pos, "unexpected " + describe(t));
    }
  }

  node parse_statement(std::size_t pos) {
    if (cur().type != tok::name)
      raise(errc::invalid_arg, cur().pos, "tag name expected");
    auto kw = cur().text;
    auto kw_pos = cur().pos;
    next();
    if (kw == "if")
      return parse_if(pos);
    if (kw == "for")
      return parse_for(pos);
    if (kw == "set")
      return parse_set(pos);
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0)
        raise(errc::invalid_arg, kw_pos, "'" + kw + "' outside of a loop");
      expect_block_end();
      return node{kw == "break" ? node::kind::break_ : node::kind::continue_, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    }
    if (kw == "macro")
      return parse_macro(pos);
    if (kw == "call")
      return parse_call_block(pos);
    if (kw == "generation") {
      // transformers' AssistantTracker: renders its body unchanged.
      expect_block_end();
      node n{node::kind::block, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
      n.inner = parse_body({"endgeneration"});
      next();
      expect_block_end();
      return n;
    }
    static const std::set<std::string, std::less<>> known = {
      "filter", "include", "import", "from", "extends", "block", "with", "autoescape", "do", "raw"};
    if (known.count(kw) != 0)
      raise(errc::unsupported, kw_pos, "the '" + kw + "' statement is not supported");
    raise(errc::invalid_arg, kw_pos, "unknown tag '" + kw + "'");
  }

  node parse_if(std::size_t pos) {
    node n{node::kind::if_, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    auto test = parse_tuple(false, {});
    expect_block_end();
    while (true) {
      auto b = parse_body({"elif", "else", "endif"});
      n.branches.emplace_back(std::move(test), std::move(b));
      auto kw = cur().text;
      next();
      if (kw == "elif") {
        test = parse_tuple(false, {});
        expect_block_end();
        continue;
      }
      if (kw == "else") {
        expect_block_end();
        auto eb = parse_body({"endif"});
        next();
        n.branches.emplace_back(nullptr, std::move(eb));
      }
      expect_block_end();
      return n;
    }
  }

  // Names, or a tuple of names, before `in` / `=`.
  void parse_targets(node& n, bool allow_namespace) {
    auto first_pos = cur().pos;
    bool paren = skip_op("(");
    n.targets.push_back(expect_name());
    if (allow_namespace && !paren && is_op(".")) {
      next();
      n.ns_attr = expect_name();
      return;
    }
    while (skip_op(",")) {
      n.tuple_target = true;
      if (cur().type != tok::name)
        break;
      n.targets.push_back(expect_name());
    }
    if (paren) {
      n.tuple_target = true;
      expect_op(")");
    }
    if (n.targets.empty())
      raise(errc::invalid_arg, first_pos, "expected an assignment target");
    for (const auto& name : n.targets)
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None")
        raise(errc::invalid_arg, first_pos, "cannot assign to '" + name + "'");
  }

  node parse_for(std::size_t pos) {
    node n{node::kind::for_, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    parse_targets(n, false);
    if (!skip_name("in"))
      raise(errc::invalid_arg, cur().pos, "expected 'in', got " + describe(cur()));
    n.e = parse_tuple(false, {"recursive"});
    if (skip_name("if"))
      n.loop_filter = parse_expression(true);
    if (is_name("recursive"))
      raise(errc::unsupported, cur().pos, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n.inner = parse_body({"endfor", "else"});
    --loop_depth_;
    if (cur().text == "else") {
      next();
      expect_block_end();
      n.otherwise = parse_body({"endfor"});
    }
    next();
    expect_block_end();
    return n;
  }

  // (a, b=default, ...) of a macro or a call block, into n.targets and n.branches.
  void parse_params(node& n) {
    expect_op("(");
    while (!is_op(")")) {
      const auto param_pos = cur().pos;
      auto name = expect_name();
      if (std::find(n.targets.begin(), n.targets.end(), name) != n.targets.end())
        raise(errc::invalid_arg, param_pos, "duplicate argument '" + name + "' in macro '" + n.text + "'");
      n.targets.push_back(std::move(name));
      if (skip_op("=")) {
        n.branches.emplace_back(parse_expression(true), body{});
      } else {
        if (!n.branches.empty() && n.branches.back().first)
          raise(errc::invalid_arg, param_pos, "non-default argument follows default argument");
        n.branches.emplace_back(nullptr, body{});
      }
      if (!skip_op(","))
        break;
    }
    expect_op(")");
  }

  // The body of a macro or a call block, up to `end`: a loop around it is not the body's, and the
  // names varargs, kwargs and caller read in it (nested macros included, as jinja2 finds them)
  // make the macro take extra arguments.
  void parse_macro_body(node& n, const char* end) {
    const auto loops = loop_depth_;
    loop_depth_ = 0;
    open_macros_.push_back(&n.catches);
    n.inner = parse_body({end});
    open_macros_.pop_back();
    loop_depth_ = loops;
    next();
  }

  // {% macro name(a, b=default, ...) %}body{% endmacro %}
  node parse_macro(std::size_t pos) {
    node n{node::kind::macro, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    n.text = expect_name();
    parse_params(n);
    expect_block_end();
    parse_macro_body(n, "endmacro");
    if (cur().type == tok::name && cur().text == n.text) // {% endmacro name %}
      next();
    expect_block_end();
    return n;
  }

  // {% call(a, b=default) m(x) %}body{% endcall %}: m(x, caller=<a macro of the body>), its output printed.
  node parse_call_block(std::size_t pos) {
    node n{node::kind::call_block, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    n.text = "caller";
    if (is_op("("))
      parse_params(n);
    const auto call_pos = cur().pos;
    n.e = parse_expression(true);
    if (n.e->kind != expr::op::call)
      raise(errc::invalid_arg, call_pos, "expected a call after 'call'");
    expect_block_end();
    parse_macro_body(n, "endcall");
    expect_block_end();
    return n;
  }

  node parse_set(std::size_t pos) {
    node n{node::kind::set, pos, {}, {}, {}, {}, {}, {}, false, {}, {}};
    parse_targets(n, true);
    if (skip_op("=")) {
      n.e = parse_tuple(true, {});
      expect_block_end();
      return n;
    }
    if (is_op("|"))
      raise(errc::unsupported, cur().pos, "filters on a block assignment are not supported");
    if (!n.ns_attr.empty() || n.tuple_target)
      raise(errc::invalid_arg, cur().pos, "expected '=' in an assignment to an attribute or a tuple");
    expect_block_end();
    n.k = node::kind::set_block;
    n.inner = parse_body({"endset"});
    next();
    expect_block_end();
    return n;
  }

  bool tuple_end(const std::vector<std::string_view>& extra) const {
    const auto& t = cur();
    if (t.type == tok::var_end || t.type == tok::block_end || t.type == tok::eof)
      return true;
    if (t.type == tok::op && t.text == ")")
      return true;
    if (t.type == tok::name)
      for (auto e : extra)
        if (t.text == e)
          return true;
    return false;
  }

  expr_ptr parse_tuple(bool with_condexpr, const std::vector<std::string_view>& extra, bool explicit_parens = false) {
    auto pos = cur().pos;
    std::vector<expr_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty())
        expect_op(",");
      if (tuple_end(extra))
        break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty())
        return std::move(items[0]);
      if (!explicit_parens)
        raise(errc::invalid_arg, cur().pos, "expected an expression, got " + describe(cur()));
    }
    auto e = make(expr::op::tuple, pos);
    e->args = std::move(items);
    return e;
  }

  expr_ptr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  expr_ptr parse_condexpr() {
    auto e1 = parse_or();
    while (is_name("if")) {
      auto pos = cur().pos;
      next();
      auto e2 = parse_or();
      expr_ptr e3;
      if (skip_name("else"))
        e3 = parse_condexpr();
      auto c = make(expr::op::cond, pos);
      c->args.push_back(std::move(e2)); // test
      c->args.push_back(std::move(e1)); // then
      c->args.push_back(std::move(e3)); // else (may be null)
      e1 = std::move(c);
    }
    return e1;
  }

  expr_ptr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      auto pos = cur().pos;
      next();
      auto e = make(expr::op::or_, pos);
      e->args.push_back(std::move(left));
      e->args.push_back(parse_and());
      left = std::move(e);
    }
    return left;
  }

  expr_ptr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      auto pos = cur().pos;
      next();
      auto e = make(expr::op::and_, pos);
      e->args.push_back(std::move(left));
      e->args.push_back(parse_not());
      left = std::move(e);
    }
    return left;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      auto pos = cur().pos;
      next();
      auto e = make(expr::op::not_, pos);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    auto pos = cur().pos;
    auto first = parse_math1();
    std::vector<std::string> ops;
    std::vector<expr_ptr> operands;
    while (true) {
      if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        ops.emplace_back("in");
        next();
      } else if (is_name("not") && look().type == tok::name && look().text == "in") {
        ops.emplace_back("not in");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty())
      return first;
    auto e = make(expr::op::compare, pos);
    e->args.push_back(std::move(first));
    for (auto& o : operands)
      e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  expr_ptr binary(std::string op, std::size_t pos, expr_ptr l, expr_ptr r) {
    auto e = make(expr::op::binary, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  expr_ptr parse_math1() {
    auto left = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto op = cur().text;
      auto pos = cur().pos;
      next();
      left = binary(op, pos, std::move(left), parse_concat());
    }
    return left;
  }

  expr_ptr parse_concat() {
    auto pos = cur().pos;
    auto first = parse_math2();
    if (!is_op("~"))
      return first;
    auto e = make(expr::op::concat, pos);
    e->args.push_back(std::move(first));
    while (skip_op("~"))
      e->args.push_back(parse_math2());
    return e;
  }

  expr_ptr parse_math2() {
    auto left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto op = cur().text;
      auto pos = cur().pos;
      next();
      left = binary(op, pos, std::move(left), parse_pow());
    }
    return left;
  }

  expr_ptr parse_pow() {
    auto left = parse_unary(true);
    while (is_op("**")) {
      auto pos = cur().pos;
      next();
      left = binary("**", pos, std::move(left), parse_unary(true));
    }
    return left;
  }

  expr_ptr parse_unary(bool with_filter) {
    expr_ptr node;
    auto pos = cur().pos;
    if (is_op("-") || is_op("+")) {
      bool neg = cur().text == "-";
      next();
      node = make(neg ? expr::op::neg : expr::op::pos, pos);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter)
      node = parse_filter_expr(std::move(node));
    return node;
  }

  expr_ptr parse_primary() {
    const auto& t = cur();
    auto pos = t.pos;
    switch (t.type) {
      case tok::name: {
        auto n = t.text;
        next();
        auto e = make(expr::op::literal, pos);
        if (n == "true" || n == "True") {
          e->lit = value{true};
        } else if (n == "false" || n == "False") {
          e->lit = value{false};
        } else if (n == "none" || n == "None") {
          e->lit = value::none();
        } else {
          e->kind = expr::op::name;
          e->name = n;
          const std::uint8_t bit = n == "varargs" ? node::catch_varargs : n == "kwargs" ? node::catch_kwargs
                                   : n == "caller"                     ? node::catch_caller : 0;
          for (auto* catches : open_macros_)
            *catches |= bit;
        }
        return e;
      }
      case tok::string: {
        std::string s;
        while (cur().type == tok::string) { // adjacent literals concatenate
          s += cur().text;
          next();
        }
        auto e = make(expr::op::literal, pos);
        e->lit = value{std::move(s)};
        return e;
      }
      case tok::integer: {
        std::int64_t v = 0;
        auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (ec != std::errc{})
          raise(errc::unsupported, pos, "integer literal too large (only 64-bit integers are supported)");
        next();
        auto e = make(expr::op::literal, pos);
        e->lit = value{v};
        return e;
      }
      case tok::floating: {
        double v = 0;
        auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (ec != std::errc{} && ec != std::errc::result_out_of_range)
          raise(errc::invalid_arg, pos, "bad float literal " + t.text);
        if (ec == std::errc::result_out_of_range)
          raise(errc::unsupported, pos, "float literal out of range: " + t.text);
        next();
        auto e = make(expr::op::literal, pos);
        e->lit = value{v};
        return e;
      }
      case tok::op:
        if (t.text == "(") {
          next();
          auto e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = make(expr::op::list, pos);
          while (!is_op("]")) {
            if (!e->args.empty())
              expect_op(",");
            if (is_op("]"))
              break;
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(expr::op::dict, pos);
          while (!is_op("}")) {
            if (!e->args.empty())
              expect_op(",");
            if (is_op("}"))
              break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    raise(errc::invalid_arg, pos, "unexpected " + describe(t));
  }

  expr_ptr parse_postfix(expr_ptr node) {
    while (true) {
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  expr_ptr parse_filter_expr(expr_ptr node) {
    while (true) {
      if (is_op("|"))
        node = parse_filter(std::move(node));
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  expr_ptr parse_subscript(expr_ptr node) {
    auto pos = cur().pos;
    if (skip_op(".")) {
      if (cur().type == tok::name) {
        auto e = make(expr::op::getattr, pos);
        e->name = cur().text;
        next();
        e->args.push_back(std::move(node));
        return e;
      }
      if (cur().type == tok::integer) {
        auto e = make(expr::op::getitem, pos);
        e->args.push_back(std::move(node));
        auto k = make(expr::op::literal, cur().pos);
        k->lit = value{static_cast<std::int64_t>(std::stoll(cur().text))};
        next();
        e->args.push_back(std::move(k));
        return e;
      }
      raise(errc::invalid_arg, cur().pos, "expected name or number after '.'");
    }
    expect_op("[");
    std::vector<expr_ptr> items;
    while (!is_op("]")) {
      if (!items.empty())
        expect_op(",");
      items.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(expr::op::getitem, pos);
    e->args.push_back(std::move(node));
    if (items.size() == 1) {
      e->args.push_back(std::move(items[0]));
    } else {
      auto tup = make(expr::op::tuple, pos);
      tup->args = std::move(items);
      e->args.push_back(std::move(tup));
    }
    return e;
  }

  expr_ptr parse_subscribed() {
    auto pos = cur().pos;
    std::vector<expr_ptr> parts;
    if (is_op(":")) {
      next();
      parts.push_back(nullptr);
    } else {
      auto e = parse_expression(true);
      if (!is_op(":"))
        return e;
      next();
      parts.push_back(std::move(e));
    }
    if (is_op(":"))
      parts.push_back(nullptr);
    else if (!is_op("]") && !is_op(","))
      parts.push_back(parse_expression(true));
    else
      parts.push_back(nullptr);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(","))
        parts.push_back(parse_expression(true));
      else
        parts.push_back(nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto s = make(expr::op::slice, pos);
    s->args = std::move(parts);
    return s;
  }

  void parse_call_args(expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first)
        expect_op(",");
      first = false;
      if (is_op(")"))
        break;
      if (is_op("*") || is_op("**"))
        raise(errc::unsupported, cur().pos, "*args and **kwargs in calls are not supported");
      if (cur().type == tok::name && look().type == tok::op && look().text == "=") {
        auto key = cur().text;
        next();
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty())
          raise(errc::invalid_arg, cur().pos, "positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  expr_ptr parse_call(expr_ptr callee) {
    auto e = make(expr::op::call, callee->pos);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    auto n = expect_name();
    while (is_op(".")) {
      next();
      n += "." + expect_name();
    }
    return n;
  }

  expr_ptr parse_filter(expr_ptr node) {
    auto pos = cur().pos;
    expect_op("|");
    auto name_pos = cur().pos;
    auto name = dotted_name();
    if (jinja_filters.count(name) == 0)
      raise(errc::invalid_arg, name_pos, "no filter named '" + name + "'");
    auto e = make(expr::op::filter, pos);
    e->name = name;
    e->args.push_back(std::move(node));
    if (is_op("("))
      parse_call_args(*e);
    return e;
  }

  expr_ptr parse_test(expr_ptr node) {
    auto pos = cur().pos;
    next(); // is
    bool negated = skip_name("not");
    auto name_pos = cur().pos;
    std::string name;
    if (cur().type == tok::name)
      name = dotted_name();
    else if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                       cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      // Jinja's lexer gives no name token here; `x is == y` is a syntax error there too.
      raise(errc::invalid_arg, name_pos, "expected a test name, got " + describe(cur()));
    } else {
      raise(errc::invalid_arg, name_pos, "expected a test name, got " + describe(cur()));
    }
    if (jinja_tests.count(name) == 0)
      raise(errc::invalid_arg, name_pos, "no test named '" + name + "'");
    auto e = make(expr::op::test, pos);
    e->name = name;
    e->args.push_back(std::move(node));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == tok::name || cur().type == tok::string || cur().type == tok::integer ||
                cur().type == tok::floating || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is"))
        raise(errc::invalid_arg, cur().pos, "you cannot chain multiple tests with is");
      auto arg = parse_primary();
      e->args.push_back(parse_postfix(std::move(arg)));
    }
    if (!negated)
      return e;
    auto n = make(expr::op::not_, pos);
    n->args.push_back(std::move(e));
    return n;
  }

  std::vector<token> t_;
  std::size_t i_ = 0;
  int loop_depth_ = 0;
  std::vector<std::uint8_t*> open_macros_; // the macros and call blocks whose bodies are being parsed
};

} // namespace

body parse(std::vector<token> tokens) { return parser{std::move(tokens)}.parse_template(); }

} // namespace crucible::jinja::detail
