// SHA-256 through OpenSSL's EVP interface (core/sha256.hpp). libcrypto uses the processor's SHA
// extensions where it has them; a failure of the library itself (no memory) is thrown, since no
// caller could go on without its digest.
#include "core/sha256.hpp"

#include <openssl/evp.h>

#include <stdexcept>

namespace crucible {

namespace {
template <class Owner>
EVP_MD_CTX* ctx_of(const Owner& p) {
  return static_cast<EVP_MD_CTX*>(p.get());
}

void check(int ok, const char* what) {
  if (ok != 1)
    throw std::runtime_error(std::string{"sha256: OpenSSL's "} + what + " failed");
}
} // namespace

void sha256::context_free::operator()(void* ctx) const noexcept { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx)); }

sha256::sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_)
    throw std::runtime_error("sha256: OpenSSL's EVP_MD_CTX_new failed");
  check(EVP_DigestInit_ex(ctx_of(ctx_), EVP_sha256(), nullptr), "EVP_DigestInit_ex");
}

sha256::sha256(const sha256& other) : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_)
    throw std::runtime_error("sha256: OpenSSL's EVP_MD_CTX_new failed");
  check(EVP_MD_CTX_copy_ex(ctx_of(ctx_), ctx_of(other.ctx_)), "EVP_MD_CTX_copy_ex");
}

sha256& sha256::operator=(const sha256& other) {
  if (this != &other)
    *this = sha256{other};
  return *this;
}

sha256::~sha256() = default;

void sha256::update(const void* data, std::size_t size) {
  check(EVP_DigestUpdate(ctx_of(ctx_), data, size), "EVP_DigestUpdate");
}

std::array<std::uint8_t, 32> sha256::finish() {
  std::array<std::uint8_t, 32> out{};
  unsigned int n = 0;
  check(EVP_DigestFinal_ex(ctx_of(ctx_), out.data(), &n), "EVP_DigestFinal_ex");
  return out;
}

std::string sha256_hex(std::string_view data) {
  sha256 h;
  h.update(data);
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (auto b : h.finish()) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

} // namespace crucible
