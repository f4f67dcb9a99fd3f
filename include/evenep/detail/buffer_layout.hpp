// evenep/detail/buffer_layout.hpp — byte layout of every symmetric buffer and the per-row metadata encoding,
// shared by the CPU reference backend and the CUDA backend (one definition, STYLE "Do" 3).
//
// Everything here is a pure function of the static configuration (R, E, K, S, tp, H, H', B); nothing depends on
// the routing (SPEC invariant 4). Every region starts at a multiple of kBufferAlignBytes.
//
// Per-rank communication buffer (BufferLayout), all regions symmetric (same offsets on every rank):
//   recv_x     [NvS, H]  bf16   expert-GEMM input rows in group order (zero-copy dispatch target)
//   recv_w     [NvS]     fp32   route weight of each row's entry; 0 on padding rows
//   recv_next  [NvS]     int32  next row of the same token on this rank (k ascending), kChainEnd at the end
//   recv_ret   [NvS]     int32  head row: return address of the token's combine partial; kRetDuplicate on the
//                               other rows of the chain; kRetPadding on padding rows
//   gather     [R, E+2]  int32  all-gathered (s_r, s_total or -1, tpe[r][0..E)) of every rank
//   stage      [S*U, H]  bf16 units (U = min(K, 2R) units per token): combine partials pushed by destinations
//   recv_x8    [NvS, H]        e4m3  FP8 dispatch only (BufferConfig::precision.fp8, else 0 bytes): the rows as
//                                    e4m3 codes, in group order like recv_x (docs/fp8.md)
//   recv_scale [NvS, H/128]    fp32  FP8 dispatch only: one scale per 1 x 128 channel block of each row
// The FP8 regions come after every bf16 region, so turning FP8 on moves no other offset.
//
// Dispatch chains (SPEC §3.4): the entries of one token that land on one destination rank form a chain in
// k-ascending order. The first (the "head") receives the token row; the others are duplicates that the
// destination fills locally from the head. Combine walks the same chain to pre-sum the token's entries in fp32.
//
// Combine staging: a token's partials are stored in the staging area of its source rank, one after another in
// the order of each destination's first k. A partial of one entry is its bf16 row (1 unit = H bf16 = 2H bytes);
// a partial of >= 2 entries is their fp32 sum (2 units = H fp32). A token therefore needs at most
// min(K, 2R) units. The return address stored in recv_ret is src_rank * (S*U) + t*U + unit offset.
#pragma once

#include <cstdint>

#include "evenep/detail/fp8.hpp"
#include "evenep/detail/host_device.hpp"
#include "evenep/detail/layout.hpp"

namespace evenep::detail {

inline constexpr int64_t kBufferAlignBytes = 256;
inline constexpr int kHiddenAlign = 8;  // H % 8 == 0: rows are 16-byte multiples (vector copies)

inline constexpr int32_t kChainEnd = -1;      // recv_next: no later entry of this token on this rank
inline constexpr int32_t kRetDuplicate = -1;  // recv_ret: a duplicate row (payload copied from its chain head)
inline constexpr int32_t kRetPadding = -2;    // recv_ret: a padding row (zero payload and weight)

// Staging units a token may need: one per destination holding one entry, two per destination holding >= 2.
EVENEP_HOST_DEVICE constexpr int64_t stage_units_per_token(int64_t K, int64_t R) { return K < 2 * R ? K : 2 * R; }
// Units of one partial of `entries` >= 1 entries.
EVENEP_HOST_DEVICE constexpr int partial_units(int entries) { return entries >= 2 ? 2 : 1; }
// Return address of a partial: unit `unit` of source rank `src`'s staging area of `units_per_rank` (= S*U) units.
EVENEP_HOST_DEVICE constexpr int32_t encode_ret(int64_t src, int64_t unit, int64_t units_per_rank) {
    return static_cast<int32_t>(src * units_per_rank + unit);
}
EVENEP_HOST_DEVICE constexpr int32_t ret_rank(int32_t ret, int64_t units_per_rank) {
    return static_cast<int32_t>(ret / units_per_rank);
}
EVENEP_HOST_DEVICE constexpr int64_t ret_unit(int32_t ret, int64_t units_per_rank) { return ret % units_per_rank; }

EVENEP_HOST_DEVICE constexpr int64_t align_bytes(int64_t x) { return align_up(x, kBufferAlignBytes); }

// The per-rank communication buffer. All offsets in bytes from the rank's base address.
struct BufferLayout {
    int64_t R = 0, E = 0, K = 0, S = 0, H = 0;
    int64_t num_recv_rows = 0;    // NvS
    int64_t units_per_token = 0;  // U = min(K, 2R)
    int64_t recv_x_offset = 0, recv_w_offset = 0, recv_next_offset = 0, recv_ret_offset = 0;
    int64_t gather_offset = 0, stage_offset = 0, total_bytes = 0;
    bool fp8 = false;
    int64_t recv_x8_offset = 0, recv_scale_offset = 0;  // FP8 regions (0 bytes without fp8)

    // slack_ppm: Config::slack_ppm() (the receive rows grow with the imbalance budget; 0 = SPEC invariant 4).
    EVENEP_HOST_DEVICE static constexpr BufferLayout make(
        int64_t R, int64_t E, int64_t K, int64_t S, int64_t tp, int64_t H, int64_t slack_ppm = 0, bool fp8 = false) {
        BufferLayout l{};
        l.R = R;
        l.E = E;
        l.K = K;
        l.S = S;
        l.H = H;
        l.fp8 = fp8;
        l.num_recv_rows = recv_rows(S, K, E / R, tp, slack_ppm);
        l.units_per_token = stage_units_per_token(K, R);
        int64_t off = 0;
        l.recv_x_offset = off;
        off += align_bytes(l.recv_x_bytes());
        l.recv_w_offset = off;
        off += align_bytes(l.recv_w_bytes());
        l.recv_next_offset = off;
        off += align_bytes(l.recv_next_bytes());
        l.recv_ret_offset = off;
        off += align_bytes(l.recv_ret_bytes());
        l.gather_offset = off;
        off += align_bytes(l.gather_bytes());
        l.stage_offset = off;
        off += align_bytes(l.stage_bytes());
        l.recv_x8_offset = off;
        off += align_bytes(l.recv_x8_bytes());
        l.recv_scale_offset = off;
        off += align_bytes(l.recv_scale_bytes());
        l.total_bytes = off;
        return l;
    }

    EVENEP_HOST_DEVICE constexpr int64_t recv_x_bytes() const { return num_recv_rows * H * 2; }
    EVENEP_HOST_DEVICE constexpr int64_t recv_w_bytes() const { return num_recv_rows * 4; }
    EVENEP_HOST_DEVICE constexpr int64_t recv_next_bytes() const { return num_recv_rows * 4; }
    EVENEP_HOST_DEVICE constexpr int64_t recv_ret_bytes() const { return num_recv_rows * 4; }
    EVENEP_HOST_DEVICE constexpr int64_t gather_row_ints() const { return E + 2; }  // [s, s_total, tpe[0..E)]
    EVENEP_HOST_DEVICE constexpr int64_t gather_bytes() const { return R * gather_row_ints() * 4; }
    EVENEP_HOST_DEVICE constexpr int64_t stage_units() const { return S * units_per_token; }  // per rank
    EVENEP_HOST_DEVICE constexpr int64_t stage_unit_bytes() const { return H * 2; }
    EVENEP_HOST_DEVICE constexpr int64_t stage_bytes() const { return stage_units() * stage_unit_bytes(); }
    EVENEP_HOST_DEVICE constexpr int64_t recv_x8_bytes() const { return fp8 ? num_recv_rows * H : 0; }
    EVENEP_HOST_DEVICE constexpr int64_t scales_per_row() const { return H / kFp8Block; }
    EVENEP_HOST_DEVICE constexpr int64_t recv_scale_bytes() const {
        return fp8 ? num_recv_rows * scales_per_row() * 4 : 0;
    }
    EVENEP_HOST_DEVICE constexpr int64_t num_bytes() const { return total_bytes; }
};

// Expert projections of a SwiGLU expert: h = silu(x·W_gate) ⊙ (x·W_up), y = h·W_down. Each weight is stored
// row-major [in, out] (x·W), so gate/up are [H, H'] and down is [H', H].
inline constexpr int kNumProjections = 3;
inline constexpr int kProjGate = 0;
inline constexpr int kProjUp = 1;
inline constexpr int kProjDown = 2;
EVENEP_HOST_DEVICE constexpr int64_t proj_in_dim(int proj, int64_t H, int64_t F) { return proj == kProjDown ? F : H; }
EVENEP_HOST_DEVICE constexpr int64_t proj_out_dim(int proj, int64_t H, int64_t F) { return proj == kProjDown ? H : F; }

// Places one region of `bytes` per projection from byte `off` on (each aligned); returns the offset after them.
EVENEP_HOST_DEVICE constexpr int64_t place_per_projection(int64_t (&offsets)[kNumProjections],
                                                          int64_t off,
                                                          int64_t bytes) {
    for (int p = 0; p < kNumProjections; ++p) {
        offsets[p] = off;
        off += align_bytes(bytes);
    }
    return off;
}

// FP8 copy of a weight matrix [in, out]: in*out e4m3 codes (same layout as the bf16 matrix) and
// (in/128)*(out/128) fp32 scales, one per 128 x 128 block, row-major over (in block, out block). Only with
// BufferConfig::precision.fp8 (H and H' multiples of 128); otherwise the FP8 regions below have 0 bytes.
EVENEP_HOST_DEVICE constexpr int64_t fp8_weight_scales(int64_t H, int64_t F) {
    return (H / kFp8Block) * (F / kFp8Block);
}

// One rank's process-wide expert pool, shared by all MoE layers: per projection B prefetch slots (bf16 weights)
// and the fp32 reduce buffer of the slots' weight gradients. The group-wide view of a reduce buffer is
// [R, B, in, out] (this rank's part is [B, in, out]). With fp8, per projection also B e4m3 slots
// [B, in, out] and their scales [B, in/128, out/128] (after every bf16/fp32 region).
struct ExpertPoolLayout {
    int64_t B = 0, H = 0, F = 0;
    bool fp8 = false;
    int64_t slot_w_offset[kNumProjections] = {};
    int64_t slot_grad_offset[kNumProjections] = {};
    int64_t slot_w8_offset[kNumProjections] = {};
    int64_t slot_scale_offset[kNumProjections] = {};
    int64_t total_bytes = 0;

    EVENEP_HOST_DEVICE static constexpr ExpertPoolLayout make(int64_t B, int64_t H, int64_t F, bool fp8 = false) {
        ExpertPoolLayout l{};
        l.B = B, l.H = H, l.F = F, l.fp8 = fp8;
        int64_t off = place_per_projection(l.slot_w_offset, 0, B * l.expert_elems() * 2);
        off = place_per_projection(l.slot_grad_offset, off, B * l.expert_elems() * 4);
        off = place_per_projection(l.slot_w8_offset, off, fp8 ? B * l.expert_elems() : 0);
        l.total_bytes = place_per_projection(l.slot_scale_offset, off, fp8 ? B * l.expert_scales() * 4 : 0);
        return l;
    }
    EVENEP_HOST_DEVICE constexpr int64_t expert_elems() const { return H * F; }  // every projection has H*H'
    EVENEP_HOST_DEVICE constexpr int64_t expert_scales() const { return fp8_weight_scales(H, F); }
    EVENEP_HOST_DEVICE constexpr int64_t slot_w8(int proj, int64_t slot) const {
        return slot_w8_offset[proj] + slot * expert_elems();
    }
    EVENEP_HOST_DEVICE constexpr int64_t slot_scale(int proj, int64_t slot) const {
        return slot_scale_offset[proj] + slot * expert_scales() * 4;
    }
    EVENEP_HOST_DEVICE constexpr int64_t slot_w(int proj, int64_t slot) const {
        return slot_w_offset[proj] + slot * expert_elems() * 2;
    }
    EVENEP_HOST_DEVICE constexpr int64_t slot_grad(int proj, int64_t slot) const {
        return slot_grad_offset[proj] + slot * expert_elems() * 4;
    }
    EVENEP_HOST_DEVICE constexpr int64_t num_bytes() const { return total_bytes; }
};

// One MoE layer's local experts on one rank (symmetric, so peers can prefetch or read them): per projection
// [epn, in, out] bf16 (the master weights). With fp8, per projection also their e4m3 cast [epn, in, out] and its
// scales [epn, in/128, out/128] (made once per step by the home, read by the ranks that copy the expert).
// The fp32 weight gradients of the local experts are not symmetric and live elsewhere.
struct ExpertWeightsLayout {
    int64_t epn = 0, H = 0, F = 0;
    bool fp8 = false;
    int64_t w_offset[kNumProjections] = {};
    int64_t w8_offset[kNumProjections] = {};
    int64_t scale_offset[kNumProjections] = {};
    int64_t total_bytes = 0;

    EVENEP_HOST_DEVICE static constexpr ExpertWeightsLayout make(int64_t epn, int64_t H, int64_t F, bool fp8 = false) {
        ExpertWeightsLayout l{};
        l.epn = epn, l.H = H, l.F = F, l.fp8 = fp8;
        int64_t off = place_per_projection(l.w_offset, 0, epn * H * F * 2);
        off = place_per_projection(l.w8_offset, off, fp8 ? epn * H * F : 0);
        l.total_bytes = place_per_projection(l.scale_offset, off, fp8 ? epn * l.expert_scales() * 4 : 0);
        return l;
    }
    EVENEP_HOST_DEVICE constexpr int64_t expert_elems() const { return H * F; }
    EVENEP_HOST_DEVICE constexpr int64_t expert_scales() const { return fp8_weight_scales(H, F); }
    EVENEP_HOST_DEVICE constexpr int64_t weight8(int proj, int64_t local_expert) const {
        return w8_offset[proj] + local_expert * expert_elems();
    }
    EVENEP_HOST_DEVICE constexpr int64_t scale(int proj, int64_t local_expert) const {
        return scale_offset[proj] + local_expert * expert_scales() * 4;
    }
    EVENEP_HOST_DEVICE constexpr int64_t weight(int proj, int64_t local_expert) const {
        return w_offset[proj] + local_expert * expert_elems() * 2;
    }
    EVENEP_HOST_DEVICE constexpr int64_t num_bytes() const { return total_bytes; }
};

}  // namespace evenep::detail
