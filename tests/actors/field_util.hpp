// tests/actors/field_util.hpp: visits the fields of an aggregate message struct one by one, so
// tests can check that a sample value sets every field and that a round trip restores every
// field, without listing fields by hand (a field added later is covered automatically).
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace crucible::test {

namespace detail {

/// Converts to anything; used only in unevaluated brace-initialization.
struct any_field {
  template <class U>
  operator U() const;
};

template <class T, std::size_t... I>
constexpr bool brace_constructible(std::index_sequence<I...>) {
  return requires { T{((void) I, any_field{})...}; };
}

} // namespace detail

/// Number of fields of aggregate `T` (the largest N for which T{x1..xN} compiles).
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
  static_assert(std::is_aggregate_v<T>);
  if constexpr (N < 25 && detail::brace_constructible<T>(std::make_index_sequence<N + 1>{}))
    return field_count<T, N + 1>();
  else
    return N;
}

#define CRUCIBLE_TEST_VISIT(n, ...)                                                         \
  if constexpr (field_count<T>() == n) {                                                    \
    auto& [__VA_ARGS__] = x;                                                                \
    auto ys = [&] {                                                                         \
      auto& [__VA_ARGS__] = y;                                                              \
      return std::tie(__VA_ARGS__);                                                         \
    }();                                                                                    \
    auto xs = std::tie(__VA_ARGS__);                                                        \
    [&]<std::size_t... I>(std::index_sequence<I...>) {                                      \
      (f(I, std::get<I>(xs), std::get<I>(ys)), ...);                                        \
    }(std::make_index_sequence<n>{});                                                       \
    return;                                                                                 \
  }

/// Calls f(index, x_field, y_field) for each field of the aggregate T, in order.
template <class T, class F>
void for_each_field_pair(const T& x, const T& y, F&& f) {
  static_assert(field_count<T>() >= 1 && field_count<T>() <= 24, "extend the visitor");
  CRUCIBLE_TEST_VISIT(1, a)
  CRUCIBLE_TEST_VISIT(2, a, b)
  CRUCIBLE_TEST_VISIT(3, a, b, c)
  CRUCIBLE_TEST_VISIT(4, a, b, c, d)
  CRUCIBLE_TEST_VISIT(5, a, b, c, d, e)
  CRUCIBLE_TEST_VISIT(6, a, b, c, d, e, g)
  CRUCIBLE_TEST_VISIT(7, a, b, c, d, e, g, h)
  CRUCIBLE_TEST_VISIT(8, a, b, c, d, e, g, h, i)
  CRUCIBLE_TEST_VISIT(9, a, b, c, d, e, g, h, i, j)
  CRUCIBLE_TEST_VISIT(10, a, b, c, d, e, g, h, i, j, k)
  CRUCIBLE_TEST_VISIT(11, a, b, c, d, e, g, h, i, j, k, l)
  CRUCIBLE_TEST_VISIT(12, a, b, c, d, e, g, h, i, j, k, l, m)
  CRUCIBLE_TEST_VISIT(13, a, b, c, d, e, g, h, i, j, k, l, m, n)
  CRUCIBLE_TEST_VISIT(14, a, b, c, d, e, g, h, i, j, k, l, m, n, o)
  CRUCIBLE_TEST_VISIT(15, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p)
  CRUCIBLE_TEST_VISIT(16, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q)
  CRUCIBLE_TEST_VISIT(17, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r)
  CRUCIBLE_TEST_VISIT(18, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s)
  CRUCIBLE_TEST_VISIT(19, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s, t)
  CRUCIBLE_TEST_VISIT(20, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u)
  CRUCIBLE_TEST_VISIT(21, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u, v)
  CRUCIBLE_TEST_VISIT(22, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u, v, w)
  CRUCIBLE_TEST_VISIT(23, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u, v, w, z)
  CRUCIBLE_TEST_VISIT(24, a, b, c, d, e, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u, v, w, z, aa)
}

#undef CRUCIBLE_TEST_VISIT

} // namespace crucible::test
