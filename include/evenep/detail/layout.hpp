// evenep/detail/layout.hpp — buffer-layout and encoding maths shared bit-for-bit by host and device.
//
// Everything here is a pure function of the static configuration (S, K, epn, tp, R, slack); nothing depends on
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

// The imbalance budget ε (SPEC §3.6 "slack") in integer parts per million, so host and device derive the same bound
// from it bit for bit: ε = slack_ppm / 10^6, 0 <= slack_ppm <= 10^6 (Config::slack_ppm rounds Config::slack).
inline constexpr int64_t kSlackPpmOne = 1000000;

// The most entries a rank with quota q may compute under slack: c = ⌈(1+ε)·q⌉ = q + ⌈q·slack_ppm / 10^6⌉ (exact
// integer arithmetic; q < 2^31, so q·slack_ppm < 2^51). slack_ppm = 0 gives q.
EVENEP_HOST_DEVICE constexpr int64_t slack_cap(int64_t q, int64_t slack_ppm) {
    return q + (q * slack_ppm + kSlackPpmOne - 1) / kSlackPpmOne;
}

// Rows of the receive buffer of every rank: align_up(c + (tp-1)*2*epn, tp) with c = slack_cap(S*K, slack_ppm), the
// largest target any rank can get (every quota is <= S*K); with slack_ppm = 0 this is SPEC invariant 4's
// align_up(S*K + (tp-1)*2*epn, tp). Still a function of the static configuration alone.
EVENEP_HOST_DEVICE constexpr int64_t recv_rows(int64_t S, int64_t K, int64_t epn, int64_t tp, int64_t slack_ppm = 0) {
    return align_up(slack_cap(S * K, slack_ppm) + (tp - 1) * 2 * epn, tp);
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
