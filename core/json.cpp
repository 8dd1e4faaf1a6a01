#include "core/json.hpp"

#include <cassert>
#include <charconv>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace crucible {

void append_json_string(std::string& out, std::string_view text) {
  out += nlohmann::json(std::string{text}).dump(-1, ' ', /*ensure_ascii=*/false,
                                                nlohmann::json::error_handler_t::replace);
}

void json_writer::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back())
      out_ += ',';
    first_.back() = false;
  }
}

json_writer& json_writer::begin_object() {
  before_value();
  out_ += '{';
  first_.push_back(true);
  return *this;
}

json_writer& json_writer::end_object() {
  assert(!first_.empty() && !after_key_);
  first_.pop_back();
  out_ += '}';
  return *this;
}

json_writer& json_writer::begin_array() {
  before_value();
  out_ += '[';
  first_.push_back(true);
  return *this;
}

json_writer& json_writer::end_array() {
  assert(!first_.empty() && !after_key_);
  first_.pop_back();
  out_ += ']';
  return *this;
}

json_writer& json_writer::key(std::string_view k) {
  assert(!after_key_);
  before_value();
  append_json_string(out_, k);
  out_ += ':';
  after_key_ = true;
  return *this;
}

json_writer& json_writer::value(std::string_view v) {
  before_value();
  append_json_string(out_, v);
  return *this;
}

json_writer& json_writer::raw(std::string_view json) {
  before_value();
  out_ += json;
  return *this;
}

json_writer& json_writer::value(bool v) {
  before_value();
  out_ += v ? "true" : "false";
  return *this;
}

json_writer& json_writer::value(double v) {
  before_value();
  if (!std::isfinite(v)) {
    out_ += "null";
    return *this;
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  assert(ec == std::errc{});
  out_.append(buf, end);
  return *this;
}

json_writer& json_writer::value(std::int64_t v) {
  before_value();
  out_ += std::to_string(v);
  return *this;
}

json_writer& json_writer::value(std::uint64_t v) {
  before_value();
  out_ += std::to_string(v);
  return *this;
}

json_writer& json_writer::null() {
  before_value();
  out_ += "null";
  return *this;
}

json_writer& json_writer::value(const std::vector<std::string>& v) {
  begin_array();
  for (const auto& s : v)
    value(std::string_view{s});
  return end_array();
}

} // namespace crucible
