// core/sha256.hpp: SHA-256, for cache keys (task and candidate sources) and checkpoint checksums,
// computed by OpenSSL's libcrypto (docs/building.md says why this library).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace crucible {

/// Incremental SHA-256. Value type (copies hash on independently); not thread-safe.
class sha256 {
public:
  sha256();
  sha256(const sha256& other);
  sha256& operator=(const sha256& other);
  sha256(sha256&&) noexcept = default;
  sha256& operator=(sha256&&) noexcept = default;
  ~sha256();
  /// Feeds more bytes.
  void update(const void* data, std::size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  /// The digest; the object must not be updated afterwards.
  std::array<std::uint8_t, 32> finish();

private:
  struct context_free {
    void operator()(void* ctx) const noexcept;
  };
  std::unique_ptr<void, context_free> ctx_; // EVP_MD_CTX
};

/// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

} // namespace crucible
