// jinja/jinja.hpp: a Jinja2 subset, enough to render the chat templates that Hugging Face
// tokenizers carry (tokenizer_config.json `chat_template`) exactly as transformers'
// apply_chat_template does: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
// with its tojson, raise_exception and strftime_now. Template text in, rendered text out.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace crucible {
class json_value;
}

namespace crucible::jinja {

class value;
using value_list = std::vector<value>;
/// A dict in insertion order (Python dicts keep it; tojson and iteration follow it). Keys are
/// hashable values: str, int, float, bool, none or a tuple of them (Python's equality: 1, 1.0
/// and True are one key).
using value_dict = std::vector<std::pair<value, value>>;

/// The arguments of a call from a template: positional, then keyword (`f(1, indent=4)`).
struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;
};

/// A value of the template language, with Python's semantics: `undefined` (Jinja's default
/// Undefined: prints as "", iterates as empty, false), `none`, bool, int (64-bit; overflow is an
/// error, not a big integer), float, str (UTF-8; length and indexing count code points), list,
/// dict (keys of the hashable kinds), namespace (the one mutable object) and function. Lists and dicts are
/// shared and immutable once built, so copies are cheap. Not thread-safe to mutate; a rendering
/// builds its own values.
class value {
public:
  enum class kind : std::uint8_t { undefined, none, boolean, integer, floating, string, list, dict, ns, function };
  using function_type = std::function<value(const call_args&)>;

  value() = default; ///< undefined
  static value none();
  value(bool b);
  value(std::int64_t i);
  value(int i) : value(static_cast<std::int64_t>(i)) {}
  value(double d);
  value(std::string s);
  value(const char* s) : value(std::string{s}) {}
  value(value_list items, bool tuple = false);
  value(value_dict members);
  /// A namespace object (`namespace(a=1)`): a dict whose attributes `set ns.a = ...` may change.
  static value make_namespace(value_dict members);
  /// A callable a template may call (the interpreter's globals and bound methods are made this
  /// way); `name` is used in error messages. `f` must not throw: a rendering does not catch
  /// exceptions of caller-supplied functions.
  static value function(std::string name, function_type f);
  /// JSON to value: objects become dicts (document order), arrays lists, null none.
  static value from_json(const json_value& j);

  kind type() const noexcept { return kind_; }
  bool is_undefined() const noexcept { return kind_ == kind::undefined; }
  bool is_none() const noexcept { return kind_ == kind::none; }
  bool is_string() const noexcept { return kind_ == kind::string; }
  bool is_list() const noexcept { return kind_ == kind::list; }
  bool is_dict() const noexcept { return kind_ == kind::dict || kind_ == kind::ns; }
  bool is_tuple() const noexcept { return kind_ == kind::list && tuple_; }

  bool as_bool() const noexcept { return b_; }
  std::int64_t as_int() const noexcept { return i_; }
  double as_double() const noexcept { return kind_ == kind::floating ? d_ : static_cast<double>(i_); }
  const std::string& as_string() const { return *s_; }
  const value_list& as_list() const { return *list_; }
  const value_dict& as_dict() const { return *dict_; }
  value_dict& namespace_members() { return *dict_; } ///< only for kind::ns
  const std::string& function_name() const { return *s_; }
  const function_type& as_function() const { return *fn_; }

  /// Member `key` of a dict or namespace; nullptr when absent or not a dict.
  const value* find(std::string_view key) const;
  /// Member `key` (compared as Python compares keys) of a dict or namespace; nullptr when absent.
  const value* find_key(const value& key) const;

  /// Python truth: "", 0, 0.0, none, undefined, empty list and dict are false.
  bool truthy() const noexcept;

private:
  kind kind_ = kind::undefined;
  bool tuple_ = false;
  bool b_ = false;
  std::int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const value_list> list_;
  std::shared_ptr<value_dict> dict_;
  std::shared_ptr<const function_type> fn_;
};

/// Options of one rendering.
struct render_options {
  /// What `strftime_now` formats (local time, C locale), e.g. Llama 3.2's "Today Date".
  std::chrono::system_clock::time_point now = std::chrono::system_clock::now();
};

/// A parsed template. Parse once, render many times; render() is const and thread-safe.
///
/// Supported: text with `{{ }}`, `{% %}`, `{# #}` and whitespace control (`-`, `+`, trim_blocks,
/// lstrip_blocks, one trailing newline dropped, newlines normalised to "\n"); statements `if`/
/// `elif`/`else`, `for` (tuple targets, `else`, an `if` filter, `loop.index`, `index0`,
/// `revindex`, `revindex0`, `first`, `last`, `length`, `previtem`, `nextitem`), `set` (names,
/// tuples, namespace attributes, block form), `break`, `continue`, `raw`, `generation`, `macro`
/// (parameters with defaults, called positionally or by name; `varargs`, `kwargs` and `caller`
/// where the body reads them, as jinja2 decides), `call` blocks (with the caller's parameters);
/// expressions with literals, lists, tuples, dicts, attribute and item access, slices, calls,
/// `+ - * / // % **`, `~`, comparisons, `in`, `not in`, `and`, `or`, `not`, `x if c else y`;
/// filters abs, capitalize, count, default (d), dictsort, first, float, int, items, join, last, length,
/// list, lower, map, reject, rejectattr, replace, reverse, select, selectattr, string, tojson
/// (transformers' json.dumps form: indent, separators, sort_keys), trim, upper; tests defined,
/// undefined, none, boolean, true, false, integer, float, number, string, mapping, iterable,
/// sequence, callable, lower, upper, odd, even, divisibleby, eq/equalto/==, ne/!=, lt/<, le/<=,
/// gt/>, ge/>=, in; globals raise_exception, strftime_now, namespace, range, dict; the dict
/// methods items/keys/values/get and the str methods strip/lstrip/rstrip/split/startswith/
/// endswith/upper/lower/replace.
///
/// Anything else (`filter` blocks, includes, other filters and methods, big integers, ...) is refused
/// with an error naming the template, line and column: at parse time for syntax Jinja itself
/// would refuse or that this subset cannot parse, at render time for a construct Jinja has but
/// this subset does not implement (so a template whose unsupported branch is not taken still
/// renders). Never a silently different rendering.
class program final {
public:
  /// Parses `source`; `name` prefixes error messages ("NAME:LINE:COLUMN: ..."). errc::invalid_arg
  /// for a syntax error, errc::unsupported for a construct outside the subset.
  static result<program> parse(std::string_view source, std::string name = "template");

  /// Renders with the members of `context` (a dict) as the template's variables. errc::invalid_arg
  /// for an error Jinja raises too (undefined attribute of an undefined value, a type error,
  /// `raise_exception(...)`: its message is quoted), errc::unsupported for a construct outside
  /// the subset; both name the line and column.
  result<std::string> render(const value& context, const render_options& opt = {}) const;

  const std::string& name() const noexcept;

  program(program&&) noexcept;
  program& operator=(program&&) noexcept;
  ~program();

  struct impl;

private:
  explicit program(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// One chat message as apply_chat_template takes it.
struct chat_message {
  std::string role;    ///< "system", "user", "assistant", ...
  std::string content;
};

/// Renders `messages` with a chat template the way transformers' apply_chat_template(messages,
/// tokenize=False, add_generation_prompt=...) does: the variables are `messages` (list of
/// {role, content} dicts), `tools` and `documents` (none), `add_generation_prompt`, and the
/// tokenizer's special tokens (`bos_token`, `eos_token`, ... as given in `special_tokens`; pass
/// only those the tokenizer defines, as transformers' special_tokens_map does).
result<std::string> render_chat(const program& chat_template, std::span<const chat_message> messages,
                                const std::map<std::string, std::string>& special_tokens,
                                bool add_generation_prompt = true, const render_options& opt = {});

/// Python's repr() of a float ("1.0", "1e+16", "inf"), as str() and json.dumps print floats.
std::string python_float_repr(double d);

} // namespace crucible::jinja
