// jinja/detail.hpp: what the files of jinja/ share and nothing outside it includes: the error that
// unwinds a parse or a rendering, Python's text and value semantics (text.cpp, value.cpp), the
// tokens of lexer.cpp, the syntax tree of parser.cpp and the evaluator that walks it (render.cpp,
// expressions.cpp, builtins.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "jinja/jinja.hpp"

namespace crucible::jinja::detail {

// -- errors ----------------------------------------------------------------------------------

/// An error raised while parsing or rendering: unwinds the interpreter to program::parse/render,
/// which turn it into a result. Exceptions keep the recursive evaluator free of error plumbing.
struct template_error {
  errc code;
  std::size_t pos;
  std::string message;
};

/// Raises a template_error at byte offset `pos` of the (normalised) template source.
[[noreturn]] inline void raise(errc code, std::size_t pos, std::string message) {
  throw template_error{code, pos, std::move(message)};
}

/// An error raised inside a builtin, which does not know where it was called from; call() adds
/// the position.
[[noreturn]] inline void raise_in_call(errc code, std::string message) {
  throw template_error{code, std::string::npos, std::move(message)};
}

// -- text helpers (text.cpp) -----------------------------------------------------------------

/// Python's str.isspace() (and the `\s` of its str regexes).
inline bool py_isspace(char32_t c) noexcept {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680
         || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/// Code points of UTF-8 text; an invalid byte stands for itself (as U+DC80.. would in Python, close
/// enough for lengths and slices of text that is valid in practice).
std::vector<char32_t> code_points(std::string_view s);
/// The UTF-8 text of the code points cps[from, to).
std::string from_code_points(const std::vector<char32_t>& cps, std::size_t from = 0,
                             std::size_t to = std::string::npos);
/// Python's len() of a str.
std::size_t code_point_count(std::string_view s);
/// Python's str.strip() family with the default (whitespace) or a set of characters.
std::string py_strip(std::string_view s, bool left, bool right, const std::vector<char32_t>* chars = nullptr);
/// str.rstrip() with no argument.
std::string rstrip_ws(std::string_view s);
/// True when every character of `s` is Python whitespace (and for "").
bool all_space(std::string_view s);
/// Length of the Python-whitespace run at s[i...].
std::size_t space_run(std::string_view s, std::size_t i);
/// Python's repr() of a str.
std::string py_str_repr(std::string_view s);
/// str.upper() / str.lower() of ASCII text; `what` names the caller when the text is not ASCII.
std::string ascii_case(const std::string& s, bool upper, const std::string& what);
/// Python's str.replace(from, to, count); a negative count replaces all.
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, std::int64_t count);
/// Python's str.split(sep, maxsplit): a list of str.
value py_split(const std::string& s, const value& sep, std::int64_t maxsplit);
/// Python's float(str); nullopt where Python raises ValueError.
std::optional<double> parse_py_float(const std::string& text);
/// Python's int(str, base) within 64 bits; nullopt where Python raises ValueError (or beyond 64 bits).
std::optional<std::int64_t> parse_py_int(const std::string& text, int base);

// -- value semantics (value.cpp) -------------------------------------------------------------

/// Python's type names, for messages that match what jinja2 would say.
const char* type_name(const value& v);

inline bool is_number(const value& v) {
  return v.type() == value::kind::integer || v.type() == value::kind::floating || v.type() == value::kind::boolean;
}
inline bool is_int_like(const value& v) {
  return v.type() == value::kind::integer || v.type() == value::kind::boolean;
}

/// Python's str(); `pos` places the error for a value that cannot be printed.
std::string to_str(const value& v, std::size_t pos);
/// Python's repr().
std::string repr(const value& v, std::size_t pos);

/// json.dumps(x, ensure_ascii, indent, separators, sort_keys), as transformers' tojson calls it.
struct json_style {
  bool ensure_ascii = false;
  bool indent_set = false;
  std::string indent; // per level
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

/// Appends json.dumps(v) in style `st` at nesting `level` to `out`.
void to_json(std::string& out, const value& v, const json_style& st, int level, std::size_t pos);

/// Python's ==.
bool py_equal(const value& a, const value& b);
/// <0, 0, >0 for a < b, a == b, a > b; a TypeError for unorderable types.
int py_compare(const value& a, const value& b, const std::string& op, std::size_t pos);
/// `key` itself when Python could hash it (str, int, float, bool, none, undefined, a function, a
/// tuple of these); a TypeError ("unhashable type") for a list, dict or namespace.
const value& hashable(const value& key, std::size_t pos);
/// A dict key as json.dumps writes it: a str as it is, an int or float as its repr, a bool as
/// true/false, none as null; other keys are a TypeError.
std::string json_key(const value& key, std::size_t pos);
/// Python's `item in container`.
bool py_in(const value& item, const value& container, std::size_t pos);
/// Checked 64-bit arithmetic: Python's integers do not overflow, ours refuse to.
std::int64_t checked(bool overflow, std::int64_t v, std::size_t pos);
/// Python's // of integers (rounds towards negative infinity).
std::int64_t floor_div(std::int64_t a, std::int64_t b);
/// Python's len().
std::int64_t length_of(const value& v, std::size_t pos);
/// What `for x in v` iterates over.
value_list iterate(const value& v, std::size_t pos);
/// Python's index `i` (negative counts from the end) into `n` items; `ok` false when out of range.
std::size_t py_index(std::int64_t i, std::size_t n, bool& ok);
/// Python's slice.indices() and the element positions it selects.
std::vector<std::size_t> slice_positions(std::size_t n, const value& start, const value& stop, const value& step,
                                         std::size_t pos);

// -- tokens (lexer.cpp) ----------------------------------------------------------------------

enum class tok : std::uint8_t {
  data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof,
};

struct token {
  tok type;
  std::string text; // data, name, op text, decoded string literal, number text
  std::size_t pos;
};

/// The tokens of normalised template source, ending with tok::eof; raises on a lexical error.
std::vector<token> lex(const std::string& source);

// -- syntax tree (parser.cpp) ----------------------------------------------------------------

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  enum class op : std::uint8_t {
    literal, name, getattr, getitem, slice, call, filter, test, not_, neg, pos, binary, compare, and_, or_, cond,
    list, tuple, dict, concat,
  };
  op kind;
  std::size_t pos;
  value lit;                  // literal
  std::string name;           // name, attribute, filter or test name, binary operator
  std::vector<expr_ptr> args; // operands; slice: start, stop, step (null when absent)
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  std::vector<std::string> ops; // compare: operators between args
};

struct node;
using body = std::vector<node>;

struct node {
  enum class kind : std::uint8_t { text, output, if_, for_, set, set_block, break_, continue_, block, macro, call_block };
  kind k;
  std::size_t pos;
  std::string text;
  expr_ptr e;                                   // output, set value, for iterable
  std::vector<std::pair<expr_ptr, body>> branches; // if/elif (test, body); else is a null test;
                                                   // macro: each parameter's default (null: none)
  body inner;                                   // for body, set block body, generation body, macro body,
                                                // call block body (the caller's)
  body otherwise;                               // for else
  std::vector<std::string> targets;             // for/set names (one, or a tuple); macro parameters
                                                // (its name is `text`)
  bool tuple_target = false;
  std::string ns_attr;                          // set ns.attr = ...: targets[0] is the namespace
  expr_ptr loop_filter;                         // for ... if cond
  std::uint8_t catches = 0;                     // macro, call block: names its body reads (catch_varargs ...)

  static constexpr std::uint8_t catch_varargs = 1, catch_kwargs = 2, catch_caller = 4;
};

// The filters and tests jinja2 defines: anything else is a syntax error there (TemplateAssertionError
// at compile time), and here.
inline const std::set<std::string, std::less<>> jinja_filters = {
  "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
  "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join",
  "last", "length", "list", "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr",
  "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags",
  "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount",
  "wordwrap", "xmlattr"};
inline const std::set<std::string, std::less<>> jinja_tests = {
  "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false", "true",
  "integer", "float", "lower", "upper", "string", "mapping", "number", "sequence", "iterable", "callable",
  "sameas", "escaped", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan", "ge", ">=", "<",
  "lt", "lessthan", "<=", "le"};

/// The template's statements from its tokens (lex()); raises on a syntax error.
body parse(std::vector<token> tokens);

// -- evaluation (render.cpp, expressions.cpp, builtins.cpp) ----------------------------------

/// The variables of a rendering, a `for` iteration or a loop filter's probe; lookups go up the
/// parents.
struct scope {
  std::unordered_map<std::string, value> vars;
  scope* parent = nullptr;
};

/// How a statement ends: normally or at a `break` or `continue`.
enum class flow : std::uint8_t { normal, break_, continue_ };

/// Walks the syntax tree of one rendering, appending text to `out`. One per program::render call.
class evaluator {
public:
  /// `macro_depth`: the rendering's count of nested macro calls (null: this evaluator's own,
  /// for a rendering's first evaluator).
  evaluator(const render_options& opt, std::string& out, int* macro_depth = nullptr)
      : opt_(opt), out_(out), macro_depth_(macro_depth != nullptr ? macro_depth : &own_depth_) {}
  evaluator(const evaluator&) = delete;
  evaluator& operator=(const evaluator&) = delete;

  /// Macro calls nested deeper than this are refused (a template's runaway recursion), not a
  /// stack overflow.
  static constexpr int max_macro_depth = 100;

  /// Runs statements (render.cpp).
  flow exec(const body& b, scope& sc);

  /// The value of an expression (expressions.cpp).
  value eval(const expr& e, scope& sc);
  /// The arguments of a call or filter expression: its operands after the first, and its keywords.
  call_args eval_args(const expr& e, scope& sc);

private:
  // Statements (render.cpp).
  flow exec(const node& n, scope& sc);
  void assign(const node& n, value v, scope& sc);
  static value_list unpack(const value& v, std::size_t want, std::size_t pos);
  flow exec_for(const node& n, scope& sc);
  void bind_targets(const node& n, const value& item, scope& sc);
  static value* lookup(const std::string& name, scope& sc);
  // A macro's value outlives neither the rendering nor its root scope, but may outlive the
  // evaluator that defined it (a namespace attribute set inside another macro), so a call gets
  // what lives as long as the rendering: its options and its depth count.
  static value call_macro(const render_options& opt, int* depth, const node& def, scope& root,
                          const std::unordered_map<std::string, value>& closure, const call_args& a);
  // The callable of a macro definition (or a call block's caller) made in scope `sc`.
  value macro_value(const node& def, scope& sc);

public:
  // Builtins (builtins.cpp): a global name, a method of a dict, str or list (undefined when none).
  value global(const std::string& name);
  value method(const value& obj, const std::string& name, std::size_t pos);
  // Expressions (expressions.cpp).
  value get_attr(const value& obj, const std::string& name, std::size_t pos);
  value get_item(const value& obj, const value& key, std::size_t pos);
  value call(const value& fn, call_args args, std::size_t pos);
  value binary(const std::string& op, const value& a, const value& b, std::size_t pos);

  const render_options& opt_;
  std::string& out_;
  int own_depth_ = 0;
  int* macro_depth_; // macro calls under way in this rendering
};

// Filters and tests by name (builtins.cpp), shared by `|name`, `is name`, select/reject and map.
value apply_filter(evaluator& ev, const std::string& name, const value& v, const call_args& a);
bool apply_test(evaluator& ev, const std::string& name, const value& v, const std::vector<value>& args);

} // namespace crucible::jinja::detail
