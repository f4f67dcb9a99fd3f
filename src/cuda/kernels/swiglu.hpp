// The elementwise kernels of the GPU MoE layer (src/cuda/kernels/swiglu.cu) and their launchers; the layer itself
// is evenep/cuda/moe_layer.hpp. Host-only declarations: the runtime includes this, swiglu.cu defines it.
//
// Every launcher covers the served ranks [rank_begin, rank_begin + num_local) in one launch (grid.y = rank -
// rank_begin) and bounds itself on the device by the rank's used rows, cu_seqlens[G-1] of its own plan copy: no host
// synchronisation, graph capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace evenep::cuda::kernels {

// Device pointers of one virtual rank, fixed for the life of the layer (one [R] table in device memory).
struct MoeRankView {
    uint16_t* recv_x;           // [NvS, H] bf16 receive buffer (Ep::recv_x)
    float* recv_w;              // [NvS] route weight of each receive row (Ep::recv_w)
    const int32_t* cu_seqlens;  // [G] the rank's inclusive padded group ends (its own plan copy)
};

struct MoeKernelParams {
    const MoeRankView* ranks = nullptr;  // device [R] (entries of other processes' ranks unused)
    int R = 0, G = 0, epn = 0, B = 0;
    int rank_begin = 0, num_local = 0;  // the ranks this process serves
    int H = 0, F = 0;                   // hidden and expert intermediate sizes (multiples of 8)
    int64_t nvs = 0;                    // receive rows per rank
    int64_t elems = 0;                  // H*F: elements of one expert matrix
    // Layer buffers, each [num_local][NvS][dim] (rank r at (r - rank_begin)*NvS*dim).
    uint16_t* x = nullptr;   // dim H: saved input rows
    uint16_t* g = nullptr;   // dim F: g_b
    uint16_t* u = nullptr;   // dim F: u_b
    uint16_t* h = nullptr;   // dim F: h_b
    uint16_t* y = nullptr;   // dim H: y_b
    uint16_t* dy = nullptr;  // dim H: dy_b
    uint16_t* dg = nullptr;  // dim F: dg_b
    uint16_t* du = nullptr;  // dim F: du_b
    float* f32a = nullptr;   // dim f32a_dim: dh [rows, F], later dg·Wg^T [rows, H]
    float* f32b = nullptr;   // dim f32b_dim: du·Wu^T [rows, H]
    int64_t f32a_dim = 0, f32b_dim = 0;
    int blocks_per_rank = 1;  // grid.x of the elementwise launches
};

// h = bf16(silu(g) * u) on the used rows.
void launch_swiglu_forward(const MoeKernelParams& p, cudaStream_t stream);
// x ← recv_x (saved for backward), then recv_x ← y (combine reads the expert output in place).
void launch_moe_place_output(const MoeKernelParams& p, cudaStream_t stream);
// Per used row (recv_x holds grad_out rows, recv_w the route weights): dw = <grad_row, y> (fp32) into recv_w in
// place, dy = bf16(w * grad_row).
void launch_moe_grad_rows(const MoeKernelParams& p, cudaStream_t stream);
// dg = bf16(dh * u * silu'(g)), du = bf16(dh * silu(g)) with dh = f32a [rows, F].
void launch_swiglu_backward(const MoeKernelParams& p, cudaStream_t stream);
// recv_x = bf16(f32a + f32b) on the used rows ([rows, H]): the input gradient rows for dispatch_backward.
void launch_moe_sum_dx(const MoeKernelParams& p, cudaStream_t stream);

}  // namespace evenep::cuda::kernels
