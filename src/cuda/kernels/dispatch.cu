// dispatch (SPEC §4.1): every token row is read once and written once per destination rank straight into its final
// row of that rank's receive buffer; every entry's route weight goes to its row; the destination then copies the
// payload row into the token's duplicate rows locally and zeroes the padding rows.
//
// One cooperative launch for all virtual ranks, a warp per token:
//   A. source:       read the token's K codes; per entry store recv_w[row], recv_next (next row of the same
//                    (token, destination) chain) and recv_ret (chain heads: the return address of the token's
//                    combine partial; others kRetDuplicate) — encodings of evenep/detail/buffer_layout.hpp;
//                    stream the x row in 16-byte vectors, kUnroll per lane in flight, to every chain head row.
//   A'. destination: padding rows of the rank's own groups: zero payload and weight, kChainEnd, kRetPadding.
//   -- team barrier (kDispatchSent): every payload row, weight and link has arrived
//   B. destination:  for each payload row with a chain, copy it into the chain's rows.
// FP8 (DataParams::fp8, the forward dispatch of an Ep with precision.fp8; docs/fp8.md): in A the token's warp
// quantises the row once — per 1 x 128 block a lane holds 4 channels, the amax is a warp max (order-free, so the
// scale equals cpu::Buffer's), then e4m3(x / s) with fp8.hpp's functions — and stores the codes and scales into
// recv_x8 / recv_scale of every chain head row (recv_x is not written); every token row is checked for NaN/Inf
// (masked tokens too, as the CPU backend does), recorded as DeviceErrorKind::kNonFiniteInput. Rows quantised by
// the caller (RankIo::x8, x_scales) are moved as given, checked (DeviceErrorKind::kBadFp8Input). The receive codes
// and scales are the caller's (RankIo::rows8 / row_scales) or the buffer's. A' zeroes the padding rows' codes and
// scales, B copies codes and scales along the chains.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/device/data_path.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"

namespace evenep::cuda {
namespace {

using device::DataParams;
using device::kBf16PerVec;
using device::kWarpSize;

inline constexpr int kDispatchThreads = 512;
inline constexpr int kDispatchUnroll = 4;  // 16-byte vectors in flight per lane
inline constexpr int kFp8Unroll = 4;       // 1 x 128 blocks whose channels a lane loads before quantising them
inline constexpr int kFp8PerLane = kFp8Block / kWarpSize;  // channels of one block per lane (4: 8 bytes of bf16)
static_assert(kFp8PerLane == 4, "the FP8 send loads 4 bf16 channels per lane as one uint2");

// One 1 x 128 block of caller-quantised codes (RankIo::x8) as the cast would give it: lane's 4 codes of block b of
// token t and the block's scale, checked (a NaN code; a scale not finite and > 0, or not a power of two with ue8m0:
// recorded as DeviceErrorKind::kBadFp8Input, first failing lane). Warp-uniform.
__device__ __forceinline__ uint32_t
load_quantised_block(const DataParams& p, const RankIo& io, int rank, int t, int b, int lane, float& scale) {
    const int H = p.lay.H, spr = H / kFp8Block, ch = b * kFp8Block + lane * kFp8PerLane;
    const uint32_t q = __ldg(reinterpret_cast<const uint32_t*>(io.x8 + static_cast<int64_t>(t) * H + ch));
    scale = __ldg(io.x_scales + static_cast<int64_t>(t) * spr + b);
    int nan_i = -1;
#pragma unroll
    for (int i = 0; i < kFp8PerLane; ++i)
        if (nan_i < 0 && ((q >> (8 * i)) & 0x7Fu) == 0x7Fu) nan_i = i;
    const uint32_t sbits = float_as_bits(scale);
    const int scale_bad = !(isfinite(scale) && scale > 0.0f) ? 1 : (p.ue8m0 != 0 && (sbits & 0x7FFFFFu) != 0) ? 2 : 0;
    const unsigned bad = __ballot_sync(0xffffffffu, nan_i >= 0 || (lane == 0 && scale_bad != 0));
    if (bad != 0 && lane == __ffs(bad) - 1) {
        if (nan_i >= 0)
            device::record_error(p.team, DeviceErrorKind::kBadFp8Input, rank, -1, Phase::kNone, t, ch + nan_i,
                                 static_cast<int32_t>((q >> (8 * nan_i)) & 0xFFu), 0, 0);
        else
            device::record_error(p.team, DeviceErrorKind::kBadFp8Input, rank, -1, Phase::kNone, t, b,
                                 static_cast<int32_t>(sbits), scale_bad, 0);
    }
    return q;
}

// FP8 send of token t's row (phase A): quantise each 1 x 128 block once (or take the caller's codes and scale,
// RankIo::x8), store codes and scale into every payload (chain head) row of the token. Warp-uniform.
__device__ __forceinline__ void send_token_fp8(
    const DataParams& p, const device::TokenEntries& te, const RankIo& io, int rank, int t, int lane) {
    const EpLayout& L = p.lay;
    const int H = L.H, spr = H / kFp8Block;
    const uint16_t* xrow = io.x8 != nullptr ? nullptr : io.x + static_cast<int64_t>(t) * H;
    uint8_t* my_row = nullptr;
    float* my_scale = nullptr;
    if (te.payload) {
        my_row = device::recv_rows8(p, te.drank) + static_cast<int64_t>(te.row) * H;
        my_scale = device::recv_scales(p, te.drank) + static_cast<int64_t>(te.row) * spr;
    }
    auto store = [&](int b, uint32_t q, float s) {
        const int ch = b * kFp8Block + lane * kFp8PerLane;
        for (unsigned m = te.payloads; m; m &= m - 1) {
            const int src = __ffs(m) - 1;
            uint8_t* drow = device::shfl_ptr(my_row, src);
            float* dscale = device::shfl_ptr(my_scale, src);
            *reinterpret_cast<uint32_t*>(drow + ch) = q;
            if (lane == 0) dscale[b] = s;
        }
    };
    if (io.x8 != nullptr) {
        for (int b = 0; b < spr; ++b) {
            float s = 0.0f;
            const uint32_t q = load_quantised_block(p, io, rank, t, b, lane, s);
            store(b, q, s);
        }
        return;
    }
    for (int b0 = 0; b0 < spr; b0 += kFp8Unroll) {
        uint2 v[kFp8Unroll];
#pragma unroll
        for (int u = 0; u < kFp8Unroll; ++u)
            if (b0 + u < spr)
                v[u] = __ldg(reinterpret_cast<const uint2*>(xrow + (b0 + u) * kFp8Block + lane * kFp8PerLane));
#pragma unroll
        for (int u = 0; u < kFp8Unroll; ++u) {
            const int b = b0 + u;
            if (b >= spr) break;
            const int ch = b * kFp8Block + lane * kFp8PerLane;
            const Bf16 x[kFp8PerLane] = {
                Bf16{static_cast<uint16_t>(v[u].x & 0xFFFFu)}, Bf16{static_cast<uint16_t>(v[u].x >> 16)},
                Bf16{static_cast<uint16_t>(v[u].y & 0xFFFFu)}, Bf16{static_cast<uint16_t>(v[u].y >> 16)}};
            float amax = 0.0f;
            int bad_i = -1;
#pragma unroll
            for (int i = 0; i < kFp8PerLane; ++i) {
                if (bad_i < 0 && !bf16_is_finite(x[i])) bad_i = i;
                const float a = bf16_abs(x[i]);
                amax = a > amax ? a : amax;
            }
            const unsigned bad = __ballot_sync(0xffffffffu, bad_i >= 0);
            if (bad != 0 && lane == __ffs(bad) - 1)
                device::record_error(p.team, DeviceErrorKind::kNonFiniteInput, rank, -1, Phase::kNone, t, ch + bad_i,
                                     x[bad_i].bits, H, 0);
#pragma unroll
            for (int o = kWarpSize / 2; o > 0; o >>= 1) {
                const float a = __shfl_xor_sync(0xffffffffu, amax, o);
                amax = a > amax ? a : amax;
            }
            const float s = fp8_block_scale(amax, p.ue8m0 != 0);
            uint32_t q = 0;
#pragma unroll
            for (int i = 0; i < kFp8PerLane; ++i)
                q |= static_cast<uint32_t>(fp8_quantize(bf16_to_float(x[i]), s).bits) << (8 * i);
            store(b, q, s);
        }
    }
}

template <int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads, 2) dispatch_kernel(const DataParams p) {
    constexpr int kWarps = kThreads / kWarpSize;
    const device::RankCtx c = device::rank_ctx(p.team, p.blocks_per_rank);
    const EpLayout& L = p.lay;
    const int K = L.K, H = L.H;
    const int lane = threadIdx.x % kWarpSize;
    const int gw = c.block * kWarps + static_cast<int>(threadIdx.x) / kWarpSize, num_warps = c.num_blocks * kWarps;
    char* const* peers = p.team.peers;
    char* base = peers[c.rank];
    const int s = p.s[c.rank];
    const RankIo io = p.io[c.rank];
    const int32_t* dst = EpLayout::at<int32_t>(base, L.dst);
    const int num_vec = H / kBf16PerVec;
    // Ranks in other processes may still read their buffers for the previous call (combine pulls rows, the
    // duplicate fill reads payload rows): every peer must enter this call before anyone writes into it.
    if (device::multi_process(p.team) && !device::barrier(p.team, c, Phase::kEntry, true)) return;

    // ---- A. Source: weights, chain links, payload rows. ----
    for (int t = gw; t < s; t += num_warps) {
        const device::TokenEntries te = device::load_token_entries(dst + static_cast<int64_t>(t) * K, K, L.nvs, lane);
        const unsigned later = te.same & ~((2u << lane) - 1u);  // same destination rank, higher k
        const int next_lane = later ? __ffs(later) - 1 : lane;
        const int32_t next_row = __shfl_sync(0xffffffffu, te.row, next_lane);
        // Staging units before this head's partial: one per earlier head, one more per earlier multi-entry head.
        const unsigned multi = __ballot_sync(0xffffffffu, te.payload && __popc(te.same) >= 2);
        const unsigned lt = device::lanemask_lt();
        if (te.live) {
            char* db = peers[te.drank];
            EpLayout::at<float>(db, L.recv_w())[te.row] = io.topk_w[static_cast<int64_t>(t) * K + lane];
            EpLayout::at<int32_t>(db, L.recv_next())[te.row] = later ? next_row : detail::kChainEnd;
            const int64_t unit =
                static_cast<int64_t>(t) * L.buf.units_per_token + __popc(te.payloads & lt) + __popc(multi & lt);
            EpLayout::at<int32_t>(db, L.recv_ret())[te.row] =
                te.payload ? detail::encode_ret(c.rank, unit, L.buf.stage_units()) : detail::kRetDuplicate;
        }
        if (p.fp8) {  // the row is read (checked) even when fully masked
            send_token_fp8(p, te, io, c.rank, t, lane);
            continue;
        }
        if (te.payloads == 0) continue;  // a fully masked token: nothing to send, its row is not read
        uint16_t* my_row = te.payload ? device::recv_rows(p, te.drank) + static_cast<int64_t>(te.row) * H : nullptr;
        const uint16_t* xrow = io.x + static_cast<int64_t>(t) * H;
        for (int v0 = 0; v0 < num_vec; v0 += kWarpSize * kUnroll) {
            uint4 buf[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int v = v0 + u * kWarpSize + lane;
                if (v < num_vec) buf[u] = device::ld_nc_v4(xrow + static_cast<int64_t>(v) * kBf16PerVec);
            }
            for (unsigned m = te.payloads; m; m &= m - 1) {
                uint16_t* drow = device::shfl_ptr(my_row, __ffs(m) - 1);
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const int v = v0 + u * kWarpSize + lane;
                    if (v < num_vec) device::st_v4(drow + static_cast<int64_t>(v) * kBf16PerVec, buf[u]);
                }
            }
        }
    }

    // ---- A'. Destination: padding rows are zero (payload and weight). ----
    uint16_t* recv_x = device::recv_rows(p, c.rank);
    float* recv_w = EpLayout::at<float>(base, L.recv_w());
    int32_t* next = EpLayout::at<int32_t>(base, L.recv_next());
    int32_t* ret = EpLayout::at<int32_t>(base, L.recv_ret());
    uint8_t* recv_x8 = device::recv_rows8(p, c.rank);
    float* recv_scale = device::recv_scales(p, c.rank);
    const int spr = H / kFp8Block, num_vec8 = H / 16;  // fp8 only: scales per row, 16-byte vectors of codes
    device::for_each_padding_row(L, base, c.rank, gw, num_warps, [&](int32_t row) {
        if (p.fp8) {
            uint8_t* drow = recv_x8 + static_cast<int64_t>(row) * H;
            for (int v = lane; v < num_vec8; v += kWarpSize) device::st_v4(drow + v * 16, make_uint4(0, 0, 0, 0));
            for (int j = lane; j < spr; j += kWarpSize) recv_scale[static_cast<int64_t>(row) * spr + j] = 0.0f;
        } else {
            uint16_t* drow = recv_x + static_cast<int64_t>(row) * H;
            for (int v = lane; v < num_vec; v += kWarpSize)
                device::st_v4(drow + static_cast<int64_t>(v) * kBf16PerVec, make_uint4(0, 0, 0, 0));
        }
        if (lane == 0) {
            recv_w[row] = 0.0f;
            next[row] = detail::kChainEnd;
            ret[row] = detail::kRetPadding;
        }
    });

    if (!device::barrier(p.team, c, Phase::kDispatchSent, true)) return;

    // ---- B. Destination: duplicate fill from each payload row into its chain. ----
    device::for_each_entry_row(L, base, c.rank, gw, num_warps, [&](int32_t row) {
        const int32_t first = next[row];
        if (ret[row] < 0 || first == detail::kChainEnd) return;  // a duplicate row, or a head without duplicates
        if (p.fp8) {
            const uint8_t* srow = recv_x8 + static_cast<int64_t>(row) * H;
            for (int v = lane; v < num_vec8; v += kWarpSize) {
                const uint4 val = device::ld_v4(srow + v * 16);
                for (int32_t d = first; d != detail::kChainEnd; d = next[d])
                    device::st_v4(recv_x8 + static_cast<int64_t>(d) * H + v * 16, val);
            }
            for (int j = lane; j < spr; j += kWarpSize) {
                const float val = __ldcg(recv_scale + static_cast<int64_t>(row) * spr + j);
                for (int32_t d = first; d != detail::kChainEnd; d = next[d])
                    recv_scale[static_cast<int64_t>(d) * spr + j] = val;
            }
            return;
        }
        const uint16_t* srow = recv_x + static_cast<int64_t>(row) * H;
        for (int v0 = 0; v0 < num_vec; v0 += kWarpSize * kUnroll) {
            uint4 buf[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int v = v0 + u * kWarpSize + lane;
                if (v < num_vec) buf[u] = device::ld_v4(srow + static_cast<int64_t>(v) * kBf16PerVec);
            }
            for (int32_t d = first; d != detail::kChainEnd; d = next[d]) {
                uint16_t* drow = recv_x + static_cast<int64_t>(d) * H;
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const int v = v0 + u * kWarpSize + lane;
                    if (v < num_vec) device::st_v4(drow + static_cast<int64_t>(v) * kBf16PerVec, buf[u]);
                }
            }
        }
    });
}

}  // namespace

int launch_dispatch(const TeamView& team,
                    const EpLayout& layout,
                    const RankIo* d_io,
                    std::span<const int32_t> s,
                    int sm_budget,
                    cudaStream_t stream,
                    const DataPrecision& precision) {
    EVENEP_CHECK(static_cast<int>(s.size()) == layout.R, "dispatch: s has ", s.size(),
                 " values, expected R = ", layout.R);
    EVENEP_CHECK(layout.H % kBf16PerVec == 0, "dispatch: hidden size H = ", layout.H,
                 " must be a multiple of 8 (16-byte rows)");
    EVENEP_CHECK(!precision.fp8 || (layout.buf.fp8 && layout.H % kFp8Block == 0),
                 "dispatch: fp8 needs a layout with the FP8 regions and H = ", layout.H, " a multiple of ", kFp8Block);
    DataParams p{};
    p.team = team;
    p.lay = layout;
    p.io = d_io;
    p.fp8 = precision.fp8 ? 1 : 0;
    p.ue8m0 = precision.ue8m0 ? 1 : 0;
    for (int r = 0; r < layout.R; ++r) {
        EVENEP_CHECK(s[r] >= 1 && s[r] <= layout.S, "dispatch: rank ", r, ": s = ", s[r], " outside [1, S = ", layout.S,
                     "]");
        p.s[r] = s[r];
    }
    auto kernel = dispatch_kernel<kDispatchThreads, kDispatchUnroll>;
    const int nb = clamp_co_resident(kernel, kDispatchThreads, 0, team.launch_ranks, sm_budget);
    p.blocks_per_rank = nb;
    launch_cooperative(kernel, team.launch_ranks * nb, kDispatchThreads, 0, stream, p);
    return nb;
}

}  // namespace evenep::cuda
