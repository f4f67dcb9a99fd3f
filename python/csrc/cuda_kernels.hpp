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

// Byte offsets inside one rank's buffer (cuda::EpLayout) of what the packers read.
struct BufferOffsets {
    size_t s, tpe, dst, cu_seqlens, group_count, group_expert, group_source, group_slot, copies, recv_x, recv_w;
    int R, E, K, G, B, H;
    int64_t nvs;
};

// Plan tensor [R, width] int32 (PlanLayout of context.hpp) from each rank's resident plan (rank r's row from rank
// r's buffer; group_source widened from int8).
void pack_plan(const BufferOffsets& o, char* const* bases, int32_t* plan, int64_t width, cudaStream_t stream);

// Handle [R, s_pad*K] int32: rank r's encoded destinations for its first s_r tokens, kMaskedDst after them.
void pack_handle(const BufferOffsets& o, char* const* bases, int32_t* handle, int64_t s_pad, cudaStream_t stream);

// recv_x [R, NvS, H] bf16 (and recv_w [R, NvS] fp32 when non-null) from the buffers: the rows before the resident
// plan's last group end (cu_seqlens[G-1]) are copied, the rest are zero.
void gather_recv(const BufferOffsets& o, char* const* bases, uint16_t* recv_x, float* recv_w, cudaStream_t stream);

// Every rank's receive rows (all NvS) from rows [R, NvS, H] bf16 into the buffers (expert outputs, row gradients).
void scatter_recv(const BufferOffsets& o, char* const* bases, const uint16_t* rows, cudaStream_t stream);

// Per-group matrix pointers [R*G] of the grouped GEMM from the plan tensor: home (kLocal, kPeer) -> home +
// expert * mat_bytes, kSlot -> slots + (r*B + slot) * mat_bytes, kEmpty -> null.
void group_table(const int32_t* plan,
                 int64_t width,
                 int R,
                 int E,
                 int G,
                 int B,
                 const char* home,
                 const char* slots,
                 int64_t mat_bytes,
                 const void** table,
                 cudaStream_t stream);

// slots[r, b] = weight[copies[r][b]] (mat_bytes each), zero where copies = -1 (or out of [0, E)).
void prefetch(const int32_t* plan,
              int64_t width,
              int R,
              int E,
              int G,
              int B,
              const char* weight,
              char* slots,
              int64_t mat_bytes,
              cudaStream_t stream);

// grad[e] = sum over r ascending, b ascending with copies[r][b] == e of slot_grads[r, b] (fp32, that order; 0 when
// none): the CPU op's order, bit for bit.
void reduce_grad(const int32_t* plan,
                 int64_t width,
                 int R,
                 int E,
                 int G,
                 int B,
                 const float* slot_grads,
                 float* grad,
                 int64_t mat_elems,
                 cudaStream_t stream);

}  // namespace evenep::python::cukernels
