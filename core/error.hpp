// core/error.hpp: the project's one error enum and a small result<T> for code below the actors.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace crucible {

/// Infrastructure failures. Outcomes of untrusted candidates are verdict values, not errors;
/// bugs are assertions. Names stay within 10 characters so CAF 0.17 can carry them.
enum class errc : std::uint8_t {
  none = 0,
  config,       ///< invalid configuration file, key or override
  io,           ///< file system or pipe failure
  corrupt,      ///< a file exists but its content is damaged (checksum, torn write)
  busy,         ///< a resource (run directory, device) is held by another process
  not_found,    ///< a named file, run, task or peer does not exist
  invalid_arg,  ///< a caller passed a value outside the contract
  protocol,     ///< a peer sent a message that breaks the protocol
  refused,      ///< a peer refused us (bad token, wrong version)
  timeout,      ///< a deadline passed
  device,       ///< CUDA, NCCL or driver failure
  worker_lost,  ///< a sandbox worker or remote node died
  unsupported,  ///< a feature this build or platform lacks
  cancelled,    ///< work abandoned on shutdown or pause
};

/// Stable lower-case name of an error code, e.g. "not_found".
const char* to_string(errc code) noexcept;

/// An error code with a message that names the file, key or peer at fault. Value type.
struct error {
  errc code = errc::none;
  std::string message;

  /// "config: configs/x.yaml:3: run.seed: expected ..."
  std::string to_string() const;
};

/// Either a value or an error. Value type; not thread-safe.
template <class T>
class [[nodiscard]] result {
public:
  result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  result(crucible::error err) : v_(std::in_place_index<1>, std::move(err)) {
    assert(std::get<1>(v_).code != errc::none);
  }

  explicit operator bool() const noexcept { return v_.index() == 0; }
  bool ok() const noexcept { return v_.index() == 0; }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const crucible::error& error() const { assert(!ok()); return std::get<1>(v_); }

private:
  std::variant<T, crucible::error> v_;
};

/// result<void>: success or an error.
template <>
class [[nodiscard]] result<void> {
public:
  result() = default;
  result(crucible::error err) : err_(std::move(err)) { assert(err_.code != errc::none); }

  explicit operator bool() const noexcept { return err_.code == errc::none; }
  bool ok() const noexcept { return err_.code == errc::none; }
  const crucible::error& error() const { assert(!ok()); return err_; }

private:
  crucible::error err_;
};

/// Where a check stands in the source, for its message: "env/eval/boundary.cpp:123" (the path from
/// the checkout's top folder on; outside one, the file's folder and the file). Use CRUCIBLE_SITE().
std::string source_site(const char* file, int line);

/// Shorthand: `return fail(errc::io, "cannot open ", path);`
template <class... Ts>
crucible::error fail(errc code, Ts&&... parts) {
  std::string msg;
  (msg.append(std::string_view{parts}), ...);
  return crucible::error{code, std::move(msg)};
}

} // namespace crucible

/// The calling line's source_site: "env/eval/device/device_bytes.cu:415".
#define CRUCIBLE_SITE() ::crucible::source_site(__FILE__, __LINE__)
