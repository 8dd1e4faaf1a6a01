// env/eval/wire.hpp: how the evaluator reads what its workers, its zygote and its build service's
// clients send (docs/evaluator-protocol.md): one JSON object a message, parsed with nlohmann/json
// (the same library env/eval/worker_messages.cpp writes them with). A worker is candidate code's
// process, so a message may be anything: every read here is checked, a missing field is told
// apart from one of the wrong type, and nothing reads past the message. Internal to env/.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace crucible::env::wire {

/// A message that is not JSON, or a field read as what it is not. Its text names the field.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
  bool is_scalar() const noexcept { return at_ != nullptr && at_->is_primitive() && !at_->is_null(); }

  /// The field `key` of an object; undefined where this is not an object or has no such field.
  node operator[](std::string_view key) const {
    if (at_ == nullptr || !at_->is_object())
      return node{root_, nullptr, path_ + "." + std::string{key}};
    auto it = at_->find(key);
    return node{root_, it == at_->end() ? nullptr : &*it, path_ + "." + std::string{key}};
  }
  /// Item `i` of a list; undefined past its end or where this is not a list.
  node operator[](std::size_t i) const {
    const bool in = at_ != nullptr && at_->is_array() && i < at_->size();
    return node{root_, in ? &(*at_)[i] : nullptr, path_ + "[" + std::to_string(i) + "]"};
  }
  /// The number of items of a list (0 for anything else).
  std::size_t size() const noexcept { return at_ != nullptr && at_->is_array() ? at_->size() : 0; }
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
  /// Key and value of each field of an object (none for anything else), in the keys' order.
  std::vector<std::pair<std::string, node>> fields() const {
    std::vector<std::pair<std::string, node>> out;
    if (at_ != nullptr && at_->is_object())
      for (auto it = at_->begin(); it != at_->end(); ++it)
        out.emplace_back(it.key(), node{root_, &it.value(), path_ + "." + it.key()});
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
        return at_->get<std::string>();
      if (at_->is_number() || at_->is_boolean())
        return at_->dump();
      throw error{where() + " is not a string"};
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!at_->is_boolean())
        throw error{where() + " is not a boolean"};
      return at_->get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (at_->is_number_unsigned()) {
        const auto v = at_->get<std::uint64_t>();
        if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
          throw error{where() + " is out of range"};
        return static_cast<T>(v);
      }
      if (at_->is_number_integer()) {
        const auto v = at_->get<std::int64_t>();
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
      return at_->get<T>();
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

  /// Where this value is in its message ("the field .outputs[0].dtype").
  std::string where() const { return "the " + path_name(); }

  /// Parses one message. Throws `error` where `text` is not JSON (the parser's reason).
  static node parse(std::string_view text) {
    auto root = std::make_shared<nlohmann::json>(nlohmann::json::parse(text, nullptr, false));
    if (root->is_discarded())
      throw error{"not JSON: " + std::string{text.substr(0, 120)}};
    const nlohmann::json* at = root.get();
    return node{std::move(root), at, ""};
  }

private:
  std::string path_name() const { return path_.empty() ? std::string{"message itself"} : "field " + path_; }
  node(std::shared_ptr<const nlohmann::json> root, const nlohmann::json* at, std::string path)
      : root_(std::move(root)), at_(at), path_(std::move(path)) {}

  std::shared_ptr<const nlohmann::json> root_;
  const nlohmann::json* at_ = nullptr;
  std::string path_;
};

/// Parses one message (node::parse).
inline node parse(std::string_view text) { return node::parse(text); }

} // namespace crucible::env::wire
