// evenep/detail/layout.hpp — buffer-layout and encoding maths shared bit-for-bit by host and device.
//
// Everything here is a pure function of the static configuration (S, K, epn, tp, R); nothing depends on
// the routing (SPEC invariant 4).
#pragma once

#include <cstdint>

#include "evenep/detail/align.hpp"
#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

inline constexpr int kMaxTopK = 32;  // SPEC §1: K <= 32

// Encoded destination of a masked (expert id == -1) entry. Distinct from every encoded value:
// first-payload destinations are >= 0 and duplicates are -dst-1 >= -(R*NvS) > INT32_MIN.
inline constexpr int32_t kMaskedDst = INT32_MIN;

// Rows of the receive buffer of every rank: align_up(S*K + (tp-1)*2*epn, tp) (SPEC invariant 4).
EVENEP_HOST_DEVICE constexpr int64_t recv_rows(int64_t S, int64_t K, int64_t epn, int64_t tp) {
    return align_up(S * K + (tp - 1) * 2 * epn, tp);
}

// Flat destination of row `row` on rank `rank`.
EVENEP_HOST_DEVICE constexpr int64_t flat_dst(int64_t rank, int64_t row, int64_t num_recv_rows) {
    return rank * num_recv_rows + row;
}

// SPEC §3.4: the first entry of a token for a destination rank carries the payload and stores dst;
// every later entry for the same rank stores -dst-1.
EVENEP_HOST_DEVICE constexpr int32_t encode_duplicate(int32_t dst) { return -dst - 1; }
EVENEP_HOST_DEVICE constexpr bool is_masked(int32_t code) { return code == kMaskedDst; }
EVENEP_HOST_DEVICE constexpr bool is_payload(int32_t code) { return code >= 0; }
// Flat destination of any non-masked code (payload or duplicate).
EVENEP_HOST_DEVICE constexpr int32_t decode_dst(int32_t code) { return code >= 0 ? code : -(code + 1); }

}  // namespace evenep::detail
