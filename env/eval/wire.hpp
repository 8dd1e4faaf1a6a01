// env/eval/wire.hpp: how the evaluator reads what its workers, its zygote and its build service's
// clients send (docs/evaluator-protocol.md): one JSON object a message, parsed by core/json_parse
// into a json_value. A worker is candidate code's process, so a message may be anything: every read
// here is checked, a missing field is told apart from one of the wrong type, and nothing reads past
// the message. Internal to env/.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/json_parse.hpp"

namespace crucible::env::wire {

/// A message that is not JSON, or a field read as what it is not. Its text names the field.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

/// A double laid out as nlohmann/json writes one (as<std::string>() gave that text while messages
/// were read with it): fixed for decimal exponents -4 to 14 with at least one digit after the
/// point ("3.0", "0.25"), else "d.ddde+XX"; "null" if not finite. The digits are the shortest that
/// read back as `x` (std::to_chars, as Python's repr writes them); for about one random double in
/// 1,200, one that needs 17 digits, nlohmann's Grisu2 wrote another last digit.
inline std::string number_text(double x) {
  if (!std::isfinite(x))
    return "null";
  std::string out;
  if (std::signbit(x)) {
    out += '-';
    x = -x;
  }
  if (x == 0)
    return out + "0.0";
  char buf[40];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  if (ec != std::errc{})
    return out + "null"; // cannot happen: 40 bytes hold any double
  // buf is "D[.DDD]e[+-]XX": the digits and the decimal exponent of the first.
  const std::string_view sci{buf, static_cast<std::size_t>(end - buf)};
  const auto e = sci.find('e');
  std::string digits{sci.substr(0, 1)};
  if (e > 1)
    digits.append(sci.substr(2, e - 2));
  int exp10 = 0;
  std::from_chars(sci.data() + e + 2, sci.data() + sci.size(), exp10);
  if (sci[e + 1] == '-')
    exp10 = -exp10;
  const int k = static_cast<int>(digits.size());
  const int n = exp10 + 1; // where the decimal point goes, counted in digits
  if (k <= n && n <= 15)
    return out + digits + std::string(static_cast<std::size_t>(n - k), '0') + ".0";
  if (0 < n && n <= 15)
    return out + digits.substr(0, static_cast<std::size_t>(n)) + "." + digits.substr(static_cast<std::size_t>(n));
  if (-4 < n && n <= 0)
    return out + "0." + std::string(static_cast<std::size_t>(-n), '0') + digits;
  out += digits.substr(0, 1);
  if (k > 1)
    out += "." + digits.substr(1);
  const int shown = n - 1;
  out += shown < 0 ? "e-" : "e+";
  const auto mag = std::to_string(shown < 0 ? -shown : shown);
  return out + (mag.size() < 2 ? "0" : "") + mag;
}

} // namespace detail

/// A read-only view of one value of a parsed message, or of a field the message lacks
/// ("undefined"). Copies share the parsed message, which stays alive while any view of it does.
class node {
public:
  node() = default;

  /// Whether the message has this value (a JSON null counts as present).
  bool defined() const noexcept { return at_ != nullptr; }
  bool is_null() const noexcept { return at_ != nullptr && at_->is_null(); }
  bool is_object() const noexcept { return at_ != nullptr && at_->is_object(); }
  bool is_list() const noexcept { return at_ != nullptr && at_->is_array(); }
  /// A string, number or boolean.
  bool is_scalar() const noexcept {
    return at_ != nullptr && (at_->is_string() || at_->is_number() || at_->is_bool());
  }

  /// The field `key` of an object; undefined where this is not an object or has no such field.
  /// A key given twice means its last value. A scan of the fields: a message's objects are small.
  node operator[](std::string_view key) const {
    const json_value* found = nullptr;
    if (at_ != nullptr && at_->is_object())
      for (const auto& m : at_->as_object())
        if (m.key == key)
          found = &m.value;
    return node{root_, found, path_ + "." + std::string{key}};
  }
  /// Item `i` of a list; undefined past its end or where this is not a list.
  node operator[](std::size_t i) const {
    const bool in = i < size();
    return node{root_, in ? &at_->as_array()[i] : nullptr, path_ + "[" + std::to_string(i) + "]"};
  }
  /// The number of items of a list (0 for anything else).
  std::size_t size() const noexcept { return at_ != nullptr && at_->is_array() ? at_->as_array().size() : 0; }
  /// A list's items in a range-for (none for anything else).
  class iterator {
  public:
    iterator(const node* list, std::size_t i) : list_(list), i_(i) {}
    node operator*() const { return (*list_)[i_]; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }

  private:
    const node* list_;
    std::size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }
  /// Key and value of each field of an object (none for anything else), in the keys' order
  /// (sorted, as std::string compares them); a key given twice appears once, with its last value.
  std::vector<std::pair<std::string, node>> fields() const {
    std::vector<std::pair<std::string, node>> out;
    if (at_ == nullptr || !at_->is_object())
      return out;
    std::vector<const json_member*> members;
    for (const auto& m : at_->as_object())
      members.push_back(&m);
    // Stable: of a key's members, the last stays last, and is the one kept.
    std::stable_sort(members.begin(), members.end(),
                     [](const json_member* a, const json_member* b) { return a->key < b->key; });
    for (std::size_t i = 0; i < members.size(); ++i)
      if (i + 1 == members.size() || members[i + 1]->key != members[i]->key)
        out.emplace_back(members[i]->key, node{root_, &members[i]->value, path_ + "." + members[i]->key});
    return out;
  }

  /// The value as T (a string, bool, integer or floating-point type). Throws `error`, naming the
  /// field, where it is missing or of another type; an integer that does not fit T is an error too.
  /// A number read as a string gives its JSON text.
  template <class T>
  T as() const {
    if (at_ == nullptr)
      throw error{"the message has no " + path_name()};
    if constexpr (std::is_same_v<T, std::string>) {
      if (at_->is_string())
        return at_->as_string();
      if (at_->is_bool())
        return at_->as_bool() ? "true" : "false";
      if (at_->is_int())
        return std::to_string(at_->as_int());
      if (at_->is_uint())
        return std::to_string(at_->as_uint());
      if (at_->is_number())
        return detail::number_text(at_->as_double());
      throw error{where() + " is not a string"};
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!at_->is_bool())
        throw error{where() + " is not a boolean"};
      return at_->as_bool();
    } else if constexpr (std::is_integral_v<T>) {
      if (at_->is_uint()) {
        const auto v = at_->as_uint();
        if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
          throw error{where() + " is out of range"};
        return static_cast<T>(v);
      }
      if (at_->is_int()) {
        const auto v = at_->as_int();
        if constexpr (std::is_unsigned_v<T>) {
          if (v < 0)
            throw error{where() + " is negative"};
          if (static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
            throw error{where() + " is out of range"};
        } else if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min())
                   || v > static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
          throw error{where() + " is out of range"};
        }
        return static_cast<T>(v);
      }
      throw error{where() + " is not an integer"};
    } else {
      static_assert(std::is_floating_point_v<T>, "wire::node::as: a string, bool, integer or floating-point type");
      if (!at_->is_number())
        throw error{where() + " is not a number"};
      if (at_->is_int()) // converted once, not through a double
        return static_cast<T>(at_->as_int());
      if (at_->is_uint())
        return static_cast<T>(at_->as_uint());
      return static_cast<T>(at_->as_double());
    }
  }
  /// The value as T, or `fallback` where it is missing, null or of another type.
  template <class T>
  T as(T fallback) const {
    if (at_ == nullptr || at_->is_null())
      return fallback;
    try {
      return as<T>();
    } catch (const error&) {
      return fallback;
    }
  }

  /// The value itself in the message's JSON tree (core/json_parse.hpp), for a reader written
  /// against that tree (env/verdict.hpp's task_work_from_json); nullptr where it is undefined.
  const json_value* value() const noexcept { return at_; }

  /// Where this value is in its message ("the field .outputs[0].dtype").
  std::string where() const { return "the " + path_name(); }

  /// Parses one message (strict JSON, nesting at most 512 deep). Throws `error`, quoting the
  /// text's start, where `text` is not JSON.
  static node parse(std::string_view text) {
    auto doc = parse_json(text);
    if (!doc)
      throw error{"not JSON: " + std::string{text.substr(0, 120)}};
    auto root = std::make_shared<const json_value>(std::move(doc).value());
    const json_value* at = root.get();
    return node{std::move(root), at, ""};
  }

private:
  std::string path_name() const { return path_.empty() ? std::string{"message itself"} : "field " + path_; }
  node(std::shared_ptr<const json_value> root, const json_value* at, std::string path)
      : root_(std::move(root)), at_(at), path_(std::move(path)) {}

  std::shared_ptr<const json_value> root_;
  const json_value* at_ = nullptr;
  std::string path_;
};

/// Parses one message (node::parse).
inline node parse(std::string_view text) { return node::parse(text); }

} // namespace crucible::env::wire
