// storage/code_similarity.hpp: token n-gram similarity of candidate sources, used to find the
// hacking cases most like a new candidate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace crucible::storage {

/// Splits `code` into identifier, number and punctuation tokens (views into `code`), dropping
/// whitespace and comments. Candidates are Python with C++/CUDA inside string literals, so the
/// comment rules follow the string state: outside a string literal `#` starts a comment to the
/// end of the line; inside one (`"`, `'`, `"""`, `'''`) `//` and `/* */` are comments and `#`
/// is a token (`#include`). String delimiters are tokens; a backslash escape is one token.
/// Pure; thread-safe.
std::vector<std::string_view> code_tokens(std::string_view code);

/// The sorted, distinct 64-bit hashes of the n-token windows (shingles) of code_tokens(code);
/// code with fewer than `n` tokens gives one shingle of all its tokens, and no tokens gives
/// none. `n` ≥ 1. Pure; thread-safe.
std::vector<std::uint64_t> shingle_set(std::string_view code, std::size_t n = 3);

/// Jaccard similarity |a ∩ b| / |a ∪ b| of two sets given as sorted, distinct hashes (as
/// shingle_set returns them); 1 when both are empty, 0 when only one is.
double jaccard(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b) noexcept;

} // namespace crucible::storage
