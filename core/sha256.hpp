// core/sha256.hpp: SHA-256, for cache keys (task and candidate sources) and checkpoint checksums.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace crucible {

/// Incremental SHA-256 (FIPS 180-4), with x86's SHA extensions where the processor has them.
/// Value type; not thread-safe.
class sha256 {
public:
  sha256();
  /// Feeds more bytes.
  void update(const void* data, std::size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  /// The digest; the object must not be updated afterwards.
  std::array<std::uint8_t, 32> finish();

private:
  void block(const std::uint8_t* p);                 // the portable compression of one block
  void blocks(const std::uint8_t* p, std::size_t n); // n blocks, with x86's SHA extensions where present
  std::array<std::uint32_t, 8> h_;
  std::array<std::uint8_t, 64> buf_{};
  std::size_t buf_len_ = 0;
  std::uint64_t total_ = 0;
};

/// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

} // namespace crucible
