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
// FP8 (dispatch_kernel<.., true>, the forward dispatch of an Ep with precision.fp8; docs/fp8.md): in A the token's warp
// quantises the row once — a half warp a 1 x 128 block, 8 channels a lane, the amax a max (order-free, so the
// scale equals cpu::Buffer's), then e4m3(x / s) bit for bit fp8.hpp's functions (device/fp8_vec.cuh) — and stores the
// codes and scales into recv_x8 / recv_scale of every chain head row (recv_x is not written); every token row is
// checked for NaN/Inf (masked tokens too, as the CPU backend does), recorded as DeviceErrorKind::kNonFiniteInput. Rows
// quantised by the caller (RankIo::x8, x_scales) are moved as given, checked (DeviceErrorKind::kBadFp8Input). The
// receive codes and scales are the caller's (RankIo::rows8 / row_scales) or the buffer's. A' zeroes the padding rows'
// codes and scales, B copies codes and scales along the chains.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/device/data_path.cuh"
#include "cuda/device/fp8_vec.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/detail/launchers.hpp"

namespace evenep::cuda {
namespace {

using device::DataParams;
using device::kBf16PerVec;
using device::kWarpSize;

inline constexpr int kDispatchThreads = 512;
inline constexpr int kDispatchUnroll = 4;  // 16-byte vectors in flight per lane
// The FP8 send is its own instantiation (dispatch_kernel<.., true>): sharing one with the bf16 copy made both spill.
inline constexpr int kFp8Threads = 256;
inline constexpr int kFp8MinBlocks = 3;
inline constexpr int kFp8Unroll = 4;  // 16-byte vectors a lane loads before casting (or checking) and storing them

// Scales of blocks [b0, b0 + n) (n <= 32): lane j < n holds block b0 + j's; stored into every payload row's scales.
__device__ __forceinline__ void store_scales(
    const device::TokenEntries& te, float* my_scale, int b0, int n, float s, int lane) {
    for (unsigned m = te.payloads; m; m &= m - 1) {
        float* dscale = device::shfl_ptr(my_scale, __ffs(m) - 1);
        if (lane < n) dscale[b0 + lane] = s;
    }
}

// Caller-quantised row (RankIo::x8, x_scales) of token t, moved as given: 16 codes (one 16-byte vector) a lane,
// kFp8Unroll vectors in flight, then the scales, lane j holding block j of each 32. Checked as they pass: a NaN code;
// a scale not finite and > 0, or not a power of two with ue8m0 (DeviceErrorKind::kBadFp8Input, the first failing
// lane of the warp). Warp-uniform.
__device__ __forceinline__ void send_quantised_row(const DataParams& p,
                                                   const device::TokenEntries& te,
                                                   const RankIo& io,
                                                   int rank,
                                                   int t,
                                                   int lane,
                                                   uint8_t* my_row,
                                                   float* my_scale) {
    const int H = p.lay.H, spr = H / kFp8Block, nvec = H / 16;
    const uint8_t* qrow = io.x8 + static_cast<int64_t>(t) * H;
    for (int v0 = 0; v0 < nvec; v0 += kWarpSize * kFp8Unroll) {
        uint4 buf[kFp8Unroll];
#pragma unroll
        for (int u = 0; u < kFp8Unroll; ++u) {
            const int v = v0 + u * kWarpSize + lane;
            buf[u] = v < nvec ? device::ld_nc_v4(qrow + v * 16) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kFp8Unroll; ++u) {
            const int v = v0 + u * kWarpSize + lane, nan_i = device::first_nan_e4m3x16(buf[u]);
            const unsigned bad = __ballot_sync(0xffffffffu, nan_i >= 0);
            if (bad != 0 && lane == __ffs(bad) - 1)
                device::record_error(p.team, DeviceErrorKind::kBadFp8Input, rank, -1, Phase::kNone, t, v * 16 + nan_i,
                                     static_cast<int32_t>(qrow[v * 16 + nan_i]), 0, 0);
        }
        for (unsigned m = te.payloads; m; m &= m - 1) {
            uint8_t* drow = device::shfl_ptr(my_row, __ffs(m) - 1);
#pragma unroll
            for (int u = 0; u < kFp8Unroll; ++u) {
                const int v = v0 + u * kWarpSize + lane;
                if (v < nvec) device::st_v4(drow + v * 16, buf[u]);
            }
        }
    }
    for (int b0 = 0; b0 < spr; b0 += kWarpSize) {
        const int b = b0 + lane;
        const float s = b < spr ? __ldg(io.x_scales + static_cast<int64_t>(t) * spr + b) : 1.0f;
        const uint32_t sbits = float_as_bits(s);
        const int scale_bad = !(isfinite(s) && s > 0.0f) ? 1 : (p.ue8m0 != 0 && (sbits & 0x7FFFFFu) != 0) ? 2 : 0;
        const unsigned bad = __ballot_sync(0xffffffffu, scale_bad != 0);
        if (bad != 0 && lane == __ffs(bad) - 1)
            device::record_error(p.team, DeviceErrorKind::kBadFp8Input, rank, -1, Phase::kNone, t, b,
                                 static_cast<int32_t>(sbits), scale_bad, 0);
        store_scales(te, my_scale, b0, min(kWarpSize, spr - b0), s, lane);
    }
}

// FP8 send of token t's row (phase A): cast each 1 x 128 block once (device::quantize_bf16x8: a half warp a block,
// kFp8Unroll 16-byte vectors a lane in flight, i.e. 2 kFp8Unroll blocks a step), or take the caller's codes and
// scales (RankIo::x8), and store codes and scales into every payload (chain head) row of the token; every channel
// is checked for NaN / inf (DeviceErrorKind::kNonFiniteInput, the first failing channel of the step). Warp-uniform.
__device__ __forceinline__ void send_token_fp8(
    const DataParams& p, const device::TokenEntries& te, const RankIo& io, int rank, int t, int lane) {
    const EpLayout& L = p.lay;
    const int H = L.H, spr = H / kFp8Block;
    uint8_t* my_row = nullptr;
    float* my_scale = nullptr;
    if (te.payload) {
        my_row = device::recv_rows8(p, te.drank) + static_cast<int64_t>(te.row) * H;
        my_scale = device::recv_scales(p, te.drank) + static_cast<int64_t>(te.row) * spr;
    }
    if (io.x8 != nullptr) {
        send_quantised_row(p, te, io, rank, t, lane, my_row, my_scale);
        return;
    }
    const uint16_t* xrow = io.x + static_cast<int64_t>(t) * H;
    const int nvec = H / kBf16PerVec;  // a multiple of 16: a half warp's vectors are all in the row or all past it
    for (int v0 = 0; v0 < nvec; v0 += kWarpSize * kFp8Unroll) {
        uint4 buf[kFp8Unroll];
#pragma unroll
        for (int u = 0; u < kFp8Unroll; ++u) {
            const int v = v0 + u * kWarpSize + lane;
            buf[u] = v < nvec ? device::ld_nc_v4(xrow + static_cast<int64_t>(v) * kBf16PerVec) : make_uint4(0, 0, 0, 0);
        }
        uint2 q[kFp8Unroll];
        float my_s = 0.0f;  // lane j: the scale of block j of this step
#pragma unroll
        for (int u = 0; u < kFp8Unroll; ++u) {
            const int v = v0 + u * kWarpSize + lane, bad_i = device::first_nonfinite_bf16x8(buf[u]);
            const unsigned bad = __ballot_sync(0xffffffffu, bad_i >= 0);
            if (bad != 0 && lane == __ffs(bad) - 1)
                device::record_error(p.team, DeviceErrorKind::kNonFiniteInput, rank, -1, Phase::kNone, t,
                                     v * kBf16PerVec + bad_i, device::bf16x8_lane(buf[u], bad_i).bits, H, 0);
            const device::Fp8Vec c = device::quantize_bf16x8(buf[u], p.ue8m0 != 0);
            q[u] = c.codes;
            device::keep_step_scale(c.scale, u, lane, my_s);
        }
        for (unsigned m = te.payloads; m; m &= m - 1) {
            uint8_t* drow = device::shfl_ptr(my_row, __ffs(m) - 1);
#pragma unroll
            for (int u = 0; u < kFp8Unroll; ++u) {
                const int v = v0 + u * kWarpSize + lane;
                if (v < nvec) *reinterpret_cast<uint2*>(drow + v * kBf16PerVec) = q[u];
            }
        }
        const int b0 = v0 / device::kFp8LanesPerBlock;
        store_scales(te, my_scale, b0, min(2 * kFp8Unroll, spr - b0), my_s, lane);
    }
}

// Duplicate fill of one payload row (phase B): elements [0, n) of the row, element i on lane i % kWarpSize; a lane
// loads kUnroll elements (load(i) returns one) before storing them (store(d, i, value)) into every row d of the chain
// first, next[first], ... up to kChainEnd. Lanes past n load and store nothing; with kZeroPad their buffer slots hold
// zero, else they stay unset. Warp-uniform.
// NOTE: kZeroPad is register allocation only: the FP8 kernel's scale fill needs it (without it ptxas spills 8 / 24
// bytes at 80 registers), the 16-byte vector fills do without (with it they take more instructions).
template <int kUnroll, bool kZeroPad, typename Load, typename Store>
__device__ __forceinline__ void fill_chain(
    int n, int32_t first, const int32_t* next, int lane, const Load& load, const Store& store) {
    using T = decltype(load(0));
    for (int i0 = 0; i0 < n; i0 += kWarpSize * kUnroll) {
        T buf[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int i = i0 + u * kWarpSize + lane;
            if constexpr (kZeroPad) {
                buf[u] = i < n ? load(i) : T{};
            } else {
                if (i < n) buf[u] = load(i);
            }
        }
        for (int32_t d = first; d != detail::kChainEnd; d = next[d]) {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int i = i0 + u * kWarpSize + lane;
                if (i < n) store(d, i, buf[u]);
            }
        }
    }
}

template <int kThreads, int kMinBlocks, bool kFp8>
__global__ void __launch_bounds__(kThreads, kMinBlocks) dispatch_kernel(const DataParams p) {
    constexpr int kUnroll = kDispatchUnroll;
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
        if constexpr (kFp8) {  // the row is read (checked) even when fully masked
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
        if constexpr (kFp8) {
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
        if constexpr (kFp8) {
            // the codes (16-byte vectors), then the scales
            const uint8_t* srow = recv_x8 + static_cast<int64_t>(row) * H;
            fill_chain<kUnroll, /*kZeroPad=*/false>(
                num_vec8, first, next, lane, [&](int v) { return device::ld_v4(srow + v * 16); },
                [&](int32_t d, int v, uint4 val) {
                    device::st_v4(recv_x8 + static_cast<int64_t>(d) * H + v * 16, val);
                });
            const float* ssrc = recv_scale + static_cast<int64_t>(row) * spr;
            fill_chain<kUnroll, /*kZeroPad=*/true>(
                spr, first, next, lane, [&](int j) { return __ldcg(ssrc + j); },
                [&](int32_t d, int j, float val) { recv_scale[static_cast<int64_t>(d) * spr + j] = val; });
        } else {
            const uint16_t* srow = recv_x + static_cast<int64_t>(row) * H;
            fill_chain<kUnroll, /*kZeroPad=*/false>(
                num_vec, first, next, lane,
                [&](int v) { return device::ld_v4(srow + static_cast<int64_t>(v) * kBf16PerVec); },
                [&](int32_t d, int v, uint4 val) {
                    device::st_v4(recv_x + static_cast<int64_t>(d) * H + static_cast<int64_t>(v) * kBf16PerVec, val);
                });
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
    p.ue8m0 = precision.ue8m0 ? 1 : 0;
    for (int r = 0; r < layout.R; ++r) {
        EVENEP_CHECK(s[r] >= 1 && s[r] <= layout.S, "dispatch: rank ", r, ": s = ", s[r], " outside [1, S = ", layout.S,
                     "]");
        p.s[r] = s[r];
    }
    auto launch = [&](auto kernel, int threads) {
        const int nb = clamp_co_resident(kernel, threads, 0, team.launch_ranks, sm_budget);
        p.blocks_per_rank = nb;
        launch_cooperative(kernel, team.launch_ranks * nb, threads, 0, stream, p);
        return nb;
    };
    return precision.fp8 ? launch(dispatch_kernel<kFp8Threads, kFp8MinBlocks, true>, kFp8Threads)
                         : launch(dispatch_kernel<kDispatchThreads, 2, false>, kDispatchThreads);
}

}  // namespace evenep::cuda
