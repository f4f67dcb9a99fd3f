// evenep/detail/align.hpp — the one rounding helper of the library: ceil_div and align_up, host and device.
//
// Both compute in the common type of their arguments and int64_t: int arguments give int64_t (no int32 overflow
// near the caps), size_t arguments give size_t (byte counts). `a` must be >= 1; align_up(x, a) is the smallest
// multiple of a that is >= x, for x >= 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

template <typename T, typename U>
using AlignType = std::common_type_t<T, U, int64_t>;

template <typename T, typename U>
EVENEP_HOST_DEVICE constexpr AlignType<T, U> ceil_div(T x, U a) {
    static_assert(std::is_integral_v<T> && std::is_integral_v<U>, "ceil_div takes integers");
    const AlignType<T, U> xx = x, aa = a;
    return (xx + aa - 1) / aa;
}

template <typename T, typename U>
EVENEP_HOST_DEVICE constexpr AlignType<T, U> align_up(T x, U a) {
    return ceil_div(x, a) * static_cast<AlignType<T, U>>(a);
}

static_assert(align_up(0, 4) == 0 && align_up(1, 4) == 4 && align_up(8, 4) == 8 && ceil_div(9, 4) == 3);
static_assert(std::is_same_v<decltype(align_up(size_t{1}, 256)), size_t>, "byte counts stay size_t");
static_assert(std::is_same_v<decltype(align_up(int32_t{1}, 2)), int64_t>, "ints widen to int64_t");

}  // namespace evenep::detail
