// python/csrc/cuda_kernels.hpp — the small device kernels of the torch binding's CUDA ops (python/csrc/ops_cuda.cpp):
// packing the plan and the handle into their tensors, moving receive rows between op tensors and the Ep's buffers,
// the grouped GEMM's weight tables, prefetch and gradient reduction over the plan tensor's copies table.
// Plain CUDA (no torch headers: compiled by nvcc); every launcher is asynchronous on `stream`, allocates nothing
// and is graph capturable. Bases are device tables [R] of every rank's buffer (cuda::Window::d_peers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace evenep::python::cukernels {

// Byte offsets inside one rank's buffer (cuda::EpLayout) of what the packers read. The packers act for the L ranks
// this process serves, [rank_begin, rank_begin + L) (all R on the local team, one on the NCCL team): output row i is
// rank rank_begin + i.
struct BufferOffsets {
    size_t s, tpe, dst, cu_seqlens, group_count, group_expert, group_source, group_slot, copies, recv_x, recv_w;
    int R, E, K, G, B, H;
    int64_t nvs;
    int rank_begin, L;
};

// Plan tensor [L, width] int32 (PlanLayout of context.hpp) from each served rank's resident plan (rank r's row from
// rank r's buffer; group_source widened from int8).
void pack_plan(const BufferOffsets& o, char* const* bases, int32_t* plan, int64_t width, cudaStream_t stream);

// Handle [L, s_pad*K] int32: rank r's encoded destinations for its first s_r tokens, kMaskedDst after them.
void pack_handle(const BufferOffsets& o, char* const* bases, int32_t* handle, int64_t s_pad, cudaStream_t stream);

// recv_x [L, NvS, H] bf16 and recv_w [L, NvS] fp32 (each when non-null) from the buffers: the rows before the
// resident plan's last group end (cu_seqlens[G-1]) are copied, the rest are zero.
void gather_recv(const BufferOffsets& o, char* const* bases, uint16_t* recv_x, float* recv_w, cudaStream_t stream);

// Every served rank's receive rows (all NvS) from rows [L, NvS, H] bf16 into the buffers (expert outputs, row
// gradients).
void scatter_recv(const BufferOffsets& o, char* const* bases, const uint16_t* rows, cudaStream_t stream);

// One grouped GEMM over the receive rows of all L rows of the plan tensor [L, width] at once: L*(G+1) groups, rank
// r's G groups then one gap group (rows cu_seqlens[G-1] .. NvS, null pointer: not computed).
//   table[r*(G+1) + g]  home (kLocal, kPeer) -> home + (expert - expert_base) * mat_bytes when that index is in
//                       [0, num_home), kSlot -> slots + (r*B + slot) * mat_bytes, kEmpty / gap -> null;
//   cu[r*(G+1) + g]     r*NvS + cu_seqlens[r][g], the gap group's end (r+1)*NvS (rows of x [L*NvS, in]).
// expert_base/num_home: 0/E with every expert's home weights in `home`; rank*E/R and E/R on the NCCL team.
void group_table(const int32_t* plan,
                 int64_t width,
                 int L,
                 int E,
                 int G,
                 int B,
                 int64_t nvs,
                 int expert_base,
                 int num_home,
                 const char* home,
                 const char* slots,
                 int64_t mat_bytes,
                 const void** table,
                 int32_t* cu,
                 cudaStream_t stream);

// out[r, b] = copies[r][b] >= 0 ? in[r, b] : 0 for the L rows of the plan tensor (mat_bytes per slot; the slots a
// library prefetch into the pool left untouched are zero in the op's output, as on the CPU).
void select_slots(const int32_t* plan,
                  int64_t width,
                  int L,
                  int E,
                  int G,
                  int B,
                  const char* in,
                  char* out,
                  int64_t mat_bytes,
                  cudaStream_t stream);

// slots[r, b] = weight[copies[r][b]] (mat_bytes each); where copies = -1 (or out of [0, E)) zero with zero_empty,
// else not written.
void prefetch(const int32_t* plan,
              int64_t width,
              int R,
              int E,
              int G,
              int B,
              const char* weight,
              char* slots,
              int64_t mat_bytes,
              bool zero_empty,
              cudaStream_t stream);

// grad[e] = sum over r ascending, b ascending with copies[r][b] == e of slot_grads[r, b] (fp32, that order; 0 when
// none): the CPU op's order, bit for bit. Each block lists every expert's copies in shared memory, then streams its
// share of each expert's matrices with 16-byte loads (the grid is sized by one matrix, not by E). accumulate: grad[e] = grad[e] + that sum, only for experts with copies (the
// others are not touched).
void reduce_grad(const int32_t* plan,
                 int64_t width,
                 int R,
                 int E,
                 int G,
                 int B,
                 const float* slot_grads,
                 float* grad,
                 int64_t mat_elems,
                 bool accumulate,
                 cudaStream_t stream);

// The weighted combine's backward on the dispatched gradient rows [L, NvS, H] bf16, for the rows of each rank's
// groups (plan row i's cu_seqlens[G-1]): grad_w[i, n] = sum_h rows * y (fp32) and rows = bf16(recv_w * rows) in
// place (one rounding); grad_w is 0 past the groups, where rows are left as they are. A warp per row.
void weight_rows(const int32_t* plan,
                 int64_t width,
                 int L,
                 int E,
                 int G,
                 int64_t nvs,
                 int H,
                 uint16_t* rows,
                 const uint16_t* y,
                 const float* recv_w,
                 float* grad_w,
                 cudaStream_t stream);

}  // namespace evenep::python::cukernels
