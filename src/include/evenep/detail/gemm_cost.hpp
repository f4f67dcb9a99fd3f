// evenep/detail/gemm_cost.hpp — the cost formula of the Hopper grouped GEMM's load-aware scheduler, host and device.
//
// The time one SM spends on one output tile of kGemmTileRows x kGemmTileCols is c_tile + c_kblock x (k-blocks of
// kGemmKBlock) (coefficients: cuda::GemmCostModel, calibrated by `evenep bench gemm --calibrate`). The scheduler
// (src/cuda/kernels/grouped_gemm_sm90.cu) sorts and splits groups by it; cuda::grouped_gemm_group_cost_us (the
// model column of `evenep bench gemm`) applies the same functions on the host.
#pragma once

#include "evenep/detail/align.hpp"
#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

inline constexpr int kGemmTileRows = 128;  // output rows of one tile (forward / dgrad: rows of x)
inline constexpr int kGemmTileCols = 256;  // output columns of one tile
inline constexpr int kGemmKBlock = 64;     // inner elements of one k-block

// Output tiles ("units") of a group of `rows` rows: forward / dgrad tile the group's [rows, N] output (n_tiles
// column tiles); wgrad tiles the whole [in, out] gradient (m_tiles x n_tiles) whatever the rows.
EVENEP_HOST_DEVICE constexpr int gemm_group_units(bool wgrad, int rows, int m_tiles, int n_tiles) {
    return wgrad ? m_tiles * n_tiles : static_cast<int>(ceil_div(rows, kGemmTileRows)) * n_tiles;
}

// k-blocks one unit walks: wgrad reduces over the group's rows, forward / dgrad over K (k_blocks of the call).
EVENEP_HOST_DEVICE constexpr int gemm_group_k_blocks(bool wgrad, int rows, int k_blocks) {
    return wgrad ? static_cast<int>(ceil_div(rows, kGemmKBlock)) : k_blocks;
}

// Modelled time (µs) of one unit walking `k_blocks` k-blocks.
EVENEP_HOST_DEVICE constexpr float gemm_unit_cost_us(int k_blocks, float c_tile, float c_kblock) {
    return c_tile + c_kblock * k_blocks;
}

// Modelled time (µs on one SM) of `units` units of `k_blocks` k-blocks each.
EVENEP_HOST_DEVICE constexpr float gemm_group_cost_us(int units, int k_blocks, float c_tile, float c_kblock) {
    return units * gemm_unit_cost_us(k_blocks, c_tile, c_kblock);
}

}  // namespace evenep::detail
