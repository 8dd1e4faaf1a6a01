// jinja/render.cpp: the entry points (program::parse: source to tree; program::render and
// render_chat: tree and variables to text) and the statements an evaluator runs: text, output,
// if, for (with loop.*), set, break and continue.
#include "jinja/jinja.hpp"

#include <algorithm>

#include "jinja/detail.hpp"

namespace crucible::jinja {

namespace detail {

flow evaluator::exec(const body& b, scope& sc) {
  for (const auto& n : b) {
    auto f = exec(n, sc);
    if (f != flow::normal)
      return f;
  }
  return flow::normal;
}

flow evaluator::exec(const node& n, scope& sc) {
  switch (n.k) {
    case node::kind::text: out_ += n.text; return flow::normal;
    case node::kind::output: out_ += to_str(eval(*n.e, sc), n.e->pos); return flow::normal;
    case node::kind::block: return exec(n.inner, sc);
    case node::kind::break_: return flow::break_;
    case node::kind::continue_: return flow::continue_;
    case node::kind::if_:
      for (const auto& [test, b] : n.branches)
        if (!test || eval(*test, sc).truthy())
          return exec(b, sc);
      return flow::normal;
    case node::kind::set: {
      auto v = eval(*n.e, sc);
      assign(n, std::move(v), sc);
      return flow::normal;
    }
    case node::kind::set_block: {
      std::string captured;
      std::swap(captured, out_);
      auto f = exec(n.inner, sc);
      std::swap(captured, out_);
      assign(n, value{std::move(captured)}, sc);
      return f;
    }
    case node::kind::for_: return exec_for(n, sc);
    case node::kind::macro: sc.vars[n.text] = macro_value(n, sc); return flow::normal;
    case node::kind::call_block: {
      // The call with one more keyword argument, `caller`: a macro of the block's body.
      const expr& c = *n.e;
      auto fn = eval(*c.args[0], sc);
      auto a = eval_args(c, sc);
      a.keyword.emplace_back("caller", macro_value(n, sc));
      out_ += to_str(call(fn, std::move(a), c.pos), c.pos);
      return flow::normal;
    }
  }
  return flow::normal;
}

value evaluator::macro_value(const node& def, scope& sc) {
  // The body sees the variables around its definition as they are now (a closure), and the
  // rendering's top-level ones (the context, top-level sets) as they are when it is called.
  scope* root = &sc;
  std::unordered_map<std::string, value> closure;
  for (; root->parent != nullptr; root = root->parent)
    for (const auto& [k, v] : root->vars)
      closure.emplace(k, v); // the innermost definition of a name wins
  return value::function(
    def.text, [opt = &opt_, depth = macro_depth_, d = &def, root, closure = std::move(closure)](const call_args& a) {
      return call_macro(*opt, depth, *d, *root, closure, a);
    });
}

// A call of a macro: parameters bound as Python binds them (positionally, then by name; a missing
// one without a default is undefined, as in jinja2), defaults evaluated in order in the macro's
// scope, and the body rendered into a string of its own. A body that reads `varargs` takes extra
// positional arguments (a tuple), one that reads `kwargs` extra keyword arguments (a dict), one
// that reads `caller` the call block's caller (undefined without one), as jinja2's macros do.
value evaluator::call_macro(const render_options& opt, int* depth, const node& def, scope& root,
                            const std::unordered_map<std::string, value>& closure, const call_args& a) {
  const auto& params = def.targets;
  if (*depth >= max_macro_depth)
    raise_in_call(errc::invalid_arg, "macro '" + def.text + "': calls nested deeper than " +
                                         std::to_string(max_macro_depth) + " (runaway recursion?)");
  const bool catch_varargs = (def.catches & node::catch_varargs) != 0;
  const bool catch_kwargs = (def.catches & node::catch_kwargs) != 0;
  const bool catch_caller = (def.catches & node::catch_caller) != 0;
  if (a.positional.size() > params.size() && !catch_varargs)
    raise_in_call(errc::invalid_arg, "macro '" + def.text + "' takes not more than " + std::to_string(params.size())
                                         + " argument(s)");
  scope local{closure, &root};
  std::vector<bool> bound(params.size(), false);
  value_list extra;
  for (std::size_t i = 0; i < a.positional.size(); ++i) {
    if (i >= params.size()) {
      extra.push_back(a.positional[i]);
      continue;
    }
    local.vars[params[i]] = a.positional[i];
    bound[i] = true;
  }
  value_dict extra_kw;
  value caller;
  for (const auto& [k, v] : a.keyword) {
    const auto it = std::find(params.begin(), params.end(), k);
    if (it == params.end() && k == "caller" && catch_caller) {
      caller = v;
      continue;
    }
    if (it == params.end() && catch_kwargs) {
      extra_kw.emplace_back(k, v);
      continue;
    }
    if (it == params.end())
      raise_in_call(errc::invalid_arg, "macro '" + def.text + "' takes no keyword argument '" + k + "'");
    const auto i = static_cast<std::size_t>(it - params.begin());
    if (bound[i])
      raise_in_call(errc::invalid_arg, "macro '" + def.text + "' got multiple values for argument '" + k + "'");
    local.vars[k] = v;
    bound[i] = true;
  }
  if (catch_varargs)
    local.vars["varargs"] = value{std::move(extra), true};
  if (catch_kwargs)
    local.vars["kwargs"] = value{std::move(extra_kw)};
  if (catch_caller)
    local.vars["caller"] = std::move(caller);
  ++*depth;
  struct leave {
    int* d;
    ~leave() { --*d; }
  } on_return{depth};
  std::string text;
  evaluator inner{opt, text, depth};
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!bound[i])
      local.vars[params[i]] = def.branches[i].first ? inner.eval(*def.branches[i].first, local) : value{};
  inner.exec(def.inner, local);
  return value{std::move(text)};
}

void evaluator::assign(const node& n, value v, scope& sc) {
  if (!n.ns_attr.empty()) {
    value* target = lookup(n.targets[0], sc);
    if (target == nullptr || target->type() != value::kind::ns)
      raise(errc::invalid_arg, n.pos, "cannot assign attribute on non-namespace object");
    auto& members = target->namespace_members();
    for (auto& [k, x] : members)
      if (k.is_string() && k.as_string() == n.ns_attr) {
        x = std::move(v);
        return;
      }
    members.emplace_back(n.ns_attr, std::move(v));
    return;
  }
  if (!n.tuple_target) {
    sc.vars[n.targets[0]] = std::move(v);
    return;
  }
  auto items = unpack(v, n.targets.size(), n.pos);
  for (std::size_t i = 0; i < items.size(); ++i)
    sc.vars[n.targets[i]] = std::move(items[i]);
}

value_list evaluator::unpack(const value& v, std::size_t want, std::size_t pos) {
  auto items = iterate(v, pos);
  if (items.size() != want)
    raise(errc::invalid_arg, pos, items.size() < want ? "not enough values to unpack (expected " +
                                                            std::to_string(want) + ", got " + std::to_string(items.size()) + ")"
                                                      : "too many values to unpack (expected " + std::to_string(want) + ")");
  return items;
}

flow evaluator::exec_for(const node& n, scope& sc) {
  auto all = iterate(eval(*n.e, sc), n.e->pos);
  value_list items;
  if (n.loop_filter) {
    for (auto& x : all) {
      scope probe{{}, &sc};
      bind_targets(n, x, probe);
      if (eval(*n.loop_filter, probe).truthy())
        items.push_back(std::move(x));
    }
  } else {
    items = std::move(all);
  }
  if (items.empty())
    return exec(n.otherwise, sc);
  const auto len = static_cast<std::int64_t>(items.size());
  for (std::int64_t i = 0; i < len; ++i) {
    scope iter{{}, &sc}; // each iteration starts from the enclosing scope, as in jinja2
    bind_targets(n, items[static_cast<std::size_t>(i)], iter);
    value_dict loop{
      {"index", value{i + 1}},
      {"index0", value{i}},
      {"revindex", value{len - i}},
      {"revindex0", value{len - i - 1}},
      {"first", value{i == 0}},
      {"last", value{i == len - 1}},
      {"length", value{len}},
      {"depth", value{std::int64_t{1}}},
      {"depth0", value{std::int64_t{0}}},
      {"previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : value{}},
      {"nextitem", i + 1 < len ? items[static_cast<std::size_t>(i + 1)] : value{}},
    };
    loop.emplace_back("cycle", value::function("loop.cycle", [i](const call_args& a) -> value {
      if (a.positional.empty())
        throw template_error{errc::invalid_arg, std::string::npos, "no items for cycling given"};
      return a.positional[static_cast<std::size_t>(i) % a.positional.size()];
    }));
    iter.vars["loop"] = value{std::move(loop)};
    auto f = exec(n.inner, iter);
    if (f == flow::break_)
      break;
  }
  return flow::normal;
}

void evaluator::bind_targets(const node& n, const value& item, scope& sc) {
  if (!n.tuple_target) {
    sc.vars[n.targets[0]] = item;
    return;
  }
  auto parts = unpack(item, n.targets.size(), n.pos);
  for (std::size_t k = 0; k < parts.size(); ++k)
    sc.vars[n.targets[k]] = std::move(parts[k]);
}

value* evaluator::lookup(const std::string& name, scope& sc) {
  for (scope* s = &sc; s != nullptr; s = s->parent) {
    auto it = s->vars.find(name);
    if (it != s->vars.end())
      return &it->second;
  }
  return nullptr;
}

} // namespace detail

namespace {

// Line and column (1-based, column in characters) of a byte offset.
std::pair<std::size_t, std::size_t> line_col(const std::string& src, std::size_t pos) {
  pos = std::min(pos, src.size());
  std::size_t line = 1, start = 0;
  for (std::size_t i = 0; i < pos; ++i)
    if (src[i] == '\n') {
      ++line;
      start = i + 1;
    }
  return {line, detail::code_point_count(std::string_view{src}.substr(start, pos - start)) + 1};
}

} // namespace

struct program::impl {
  std::string name;
  std::string source; // normalised
  detail::body root;

  crucible::error to_error(const detail::template_error& e) const {
    auto [line, col] = line_col(source, e.pos == std::string::npos ? 0 : e.pos);
    return crucible::error{e.code, name + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + e.message};
  }
};

program::program(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
program::program(program&&) noexcept = default;
program& program::operator=(program&&) noexcept = default;
program::~program() = default;

const std::string& program::name() const noexcept { return impl_->name; }

result<program> program::parse(std::string_view source, std::string name) {
  auto p = std::make_unique<impl>();
  p->name = std::move(name);
  // jinja2: "\r\n", "\r" and "\n" all become "\n"; one trailing newline is dropped.
  std::string norm;
  norm.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      norm += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n')
        ++i;
    } else {
      norm += source[i];
    }
  }
  if (!norm.empty() && norm.back() == '\n')
    norm.pop_back();
  p->source = std::move(norm);
  try {
    p->root = detail::parse(detail::lex(p->source));
  } catch (const detail::template_error& e) {
    return p->to_error(e);
  }
  return program{std::move(p)};
}

result<std::string> program::render(const value& context, const render_options& opt) const {
  if (!context.is_dict())
    return fail(errc::invalid_arg, impl_->name, ": the render context must be a dict");
  std::string out;
  detail::scope root;
  for (const auto& [k, v] : context.as_dict()) {
    if (!k.is_string())
      return fail(errc::invalid_arg, impl_->name, ": the render context's keys must be strings, not ", detail::type_name(k));
    root.vars[k.as_string()] = v;
  }
  try {
    detail::evaluator ev{opt, out};
    ev.exec(impl_->root, root);
  } catch (const detail::template_error& e) {
    return impl_->to_error(e);
  }
  return out;
}

result<std::string> render_chat(const program& chat_template, std::span<const chat_message> messages,
                                const std::map<std::string, std::string>& special_tokens,
                                bool add_generation_prompt, const render_options& opt) {
  value_list msgs;
  for (const auto& m : messages)
    msgs.emplace_back(value_dict{{"role", value{m.role}}, {"content", value{m.content}}});
  value_dict ctx;
  for (const auto& [k, v] : special_tokens)
    ctx.emplace_back(k, value{v});
  // transformers passes these after the special tokens; a special token of the same name loses.
  auto put = [&](const std::string& k, value v) {
    auto it = std::find_if(ctx.begin(), ctx.end(), [&](const auto& m) { return m.first.as_string() == k; });
    if (it != ctx.end())
      it->second = std::move(v);
    else
      ctx.emplace_back(k, std::move(v));
  };
  put("messages", value{std::move(msgs)});
  put("tools", value::none());
  put("documents", value::none());
  put("add_generation_prompt", value{add_generation_prompt});
  return chat_template.render(value{std::move(ctx)}, opt);
}

} // namespace crucible::jinja
