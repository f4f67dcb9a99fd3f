// Shared pieces of the data-path kernels (dispatch, combine): parameters, per-token entry decoding, group walks.
#pragma once

#include <cstdint>

#include "cuda/device/team.cuh"
#include "cuda/device/vec.cuh"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/detail/ep_layout.hpp"
#include "evenep/detail/layout.hpp"

namespace evenep::cuda::device {

struct DataParams {
    TeamView team;
    EpLayout lay;
    const RankIo* io;  // device table [R]
    int32_t s[kMaxVirtualRanks];
    int blocks_per_rank;
    int apply_weights;
    int ue8m0;  // FP8 dispatch (the dispatch_kernel<.., true> instantiation): power-of-two scales
};

// Rank `rank`'s receive rows [NvS, H] for this call: the caller's (RankIo::rows; the local team, whose table holds
// every rank's entry) or recv_x of the rank's buffer.
__device__ __forceinline__ uint16_t* recv_rows(const DataParams& p, int rank) {
    uint16_t* rows = multi_process(p.team) ? nullptr : p.io[rank].rows;
    return rows != nullptr ? rows : EpLayout::at<uint16_t>(p.team.peers[rank], p.lay.recv_x());
}

// The FP8 dispatch's receive codes [NvS, H] and scales [NvS, H/128] of `rank`: the caller's (RankIo::rows8 /
// row_scales, local team only) or the rank's buffer's (recv_x8 / recv_scale).
__device__ __forceinline__ uint8_t* recv_rows8(const DataParams& p, int rank) {
    uint8_t* rows = multi_process(p.team) ? nullptr : p.io[rank].rows8;
    return rows != nullptr ? rows : EpLayout::at<uint8_t>(p.team.peers[rank], p.lay.recv_x8());
}
__device__ __forceinline__ float* recv_scales(const DataParams& p, int rank) {
    float* scales = multi_process(p.team) ? nullptr : p.io[rank].row_scales;
    return scales != nullptr ? scales : EpLayout::at<float>(p.team.peers[rank], p.lay.recv_scale());
}

// A 64-bit pointer from lane `src` (warp-uniform call).
template <typename T>
__device__ __forceinline__ T* shfl_ptr(T* ptr, int src) {
    return reinterpret_cast<T*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(ptr), src));
}

// One token's K entries held one per lane (lanes >= K hold nothing). Every field is lane-local except the masks.
struct TokenEntries {
    int32_t code;       // encoded dst (SPEC §3.4) or kMaskedDst
    bool live;          // lane < K and not masked
    bool payload;       // live and the first entry of the token for its destination rank
    int drank;          // destination rank (live lanes)
    int32_t row;        // row on the destination rank (live lanes)
    unsigned same;      // lanes whose entries go to the same destination rank as this lane's (live lanes)
    unsigned payloads;  // lanes holding payload entries (warp-uniform)
};

__device__ __forceinline__ TokenEntries load_token_entries(const int32_t* codes, int K, int64_t nvs, int lane) {
    TokenEntries te;
    te.code = lane < K ? codes[lane] : detail::kMaskedDst;
    te.live = !detail::is_masked(te.code);
    te.payload = te.live && detail::is_payload(te.code);
    const int32_t flat = te.live ? detail::decode_dst(te.code) : 0;
    te.drank = te.live ? static_cast<int>(flat / nvs) : -1;
    te.row = te.live ? static_cast<int32_t>(flat - static_cast<int64_t>(te.drank) * nvs) : 0;
    te.same = __match_any_sync(0xffffffffu, te.live ? te.drank : -2 - lane);
    te.payloads = __ballot_sync(0xffffffffu, te.payload);
    return te;
}

// Calls f(row) for every entry row of `rank`'s groups (rows holding entries, not padding), strided over the
// rank's warps (warp index gw of num_warps). Uniform per warp.
template <typename F>
__device__ __forceinline__ void for_each_entry_row(
    const EpLayout& L, char* base, int rank, int gw, int num_warps, F&& f) {
    const int32_t* gc = EpLayout::at<int32_t>(base, L.plan.group_count) + static_cast<int64_t>(rank) * L.G;
    const int32_t* cu = EpLayout::at<int32_t>(base, L.plan.cu_seqlens) + static_cast<int64_t>(rank) * L.G;
    // NOTE: rows are dealt out over the concatenation of all groups so that every warp gets an even share.
    int32_t before = 0;  // entry rows of earlier groups
    for (int g = 0; g < L.G; ++g) {
        const int32_t begin = g == 0 ? 0 : cu[g - 1], cnt = gc[g];
        int32_t first = gw - before % num_warps;
        if (first < 0) first += num_warps;
        for (int32_t i = first; i < cnt; i += num_warps) f(begin + i);
        before += cnt;
    }
}

// Same for padding rows [begin + cnt, end) of every group.
template <typename F>
__device__ __forceinline__ void for_each_padding_row(
    const EpLayout& L, char* base, int rank, int gw, int num_warps, F&& f) {
    const int32_t* gc = EpLayout::at<int32_t>(base, L.plan.group_count) + static_cast<int64_t>(rank) * L.G;
    const int32_t* cu = EpLayout::at<int32_t>(base, L.plan.cu_seqlens) + static_cast<int64_t>(rank) * L.G;
    int32_t before = 0;
    for (int g = 0; g < L.G; ++g) {
        const int32_t begin = (g == 0 ? 0 : cu[g - 1]) + gc[g], cnt = cu[g] - begin;
        int32_t first = gw - before % num_warps;
        if (first < 0) first += num_warps;
        for (int32_t i = first; i < cnt; i += num_warps) f(begin + i);
        before += cnt;
    }
}

}  // namespace evenep::cuda::device
