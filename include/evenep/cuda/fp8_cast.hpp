// evenep/cuda/fp8_cast.hpp — the FP8 casts on the device (kernels in src/cuda/kernels/fp8.cu): activations 1 x 128,
// weights 128 x 128, as the FP8 data path (docs/fp8.md) and the PyTorch package's evenep.fp8.quantize /
// quantize_weight on CUDA tensors use them.
//
// Both casts call the functions of evenep/detail/fp8.hpp (fp8_block_scale, fp8_quantize), so their bytes equal the
// CPU oracle's cpu::quantize_rows_fp8 / cpu::quantize_weight_fp8 bit for bit (docs/fp8.md); the amax is a max, so
// the device's reduction order does not matter. Device pointers; stream last; no allocation, no synchronisation
// (graph capturable); cudaGetLastError() checked.
//
// Non-finite inputs: the CPU refuses them before casting; a kernel cannot throw, so it raises *nonfinite (device
// uint32, nullable; set to 1, never cleared) when its block holds a NaN or an inf, and the caller checks the flag
// at its API boundary. The block's output is then undefined.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "evenep/detail/fp8.hpp"

namespace evenep::cuda {

// Activations: rows [0, rows) of in ([rows, dim] bf16, dim a positive multiple of 128) -> codes [rows, dim] and
// scales [rows, dim/128] (1 x 128 blocks). rows = 0 launches nothing.
void launch_fp8_cast_rows(const Bf16* in,
                          int64_t rows,
                          int dim,
                          bool ue8m0,
                          Fp8E4m3* codes,
                          float* scales,
                          uint32_t* nonfinite,
                          cudaStream_t stream);

// Weights: w [in, out] bf16 (both positive multiples of 128) -> codes [in, out] and scales [in/128, out/128]
// (128 x 128 blocks, row-major). launch_fp8_cast_weights with count 1.
void launch_fp8_cast_weight(const Bf16* w,
                            int in,
                            int out,
                            bool ue8m0,
                            Fp8E4m3* codes,
                            float* scales,
                            uint32_t* nonfinite,
                            cudaStream_t stream);

// Weights, `count` matrices in one launch: matrix m is w + m*w_stride elements, [in, out] bf16 (both positive
// multiples of 128) -> codes + m*codes_stride [in, out] e4m3 and scales + m*scale_stride floats [in/128, out/128]
// (128 x 128 blocks, row-major), and, when `transposed` is set, transposed + m*codes_stride [out, in]: the same codes
// K-major (the forward GEMM's operand; e4m3 wgmma reads only K-major), written from the same pass, so no separate
// transpose reads the codes again. count = 0 launches nothing.
struct Fp8WeightCast {
    const Bf16* w = nullptr;
    int64_t w_stride = 0;  // elements
    int count = 1, in = 0, out = 0;
    bool ue8m0 = false;
    Fp8E4m3* codes = nullptr;
    Fp8E4m3* transposed = nullptr;  // nullable
    int64_t codes_stride = 0;       // elements, for codes and transposed
    float* scales = nullptr;
    int64_t scale_stride = 0;  // floats
    uint32_t* nonfinite = nullptr;
};
void launch_fp8_cast_weights(const Fp8WeightCast& cast, cudaStream_t stream);

// Wgrad operands (evenep/detail/fp8.hpp "wgrad cols"; cpu::quantize_cols_fp8 bit for bit): the rows of `in`
// ([capacity, dim] bf16, dim a positive multiple of 128), grouped by cu_seqlens ([G] device, inclusive padded ends,
// cu_seqlens[G-1] <= capacity), transposed and quantised per channel in 128-row blocks from each group's first row ->
// codes [dim][fp8_cols_ld(capacity)] (columns past cu_seqlens[G-1] written 0) and scales
// [fp8_cols_scale_rows(capacity, G)][dim] (rows of no block not written). The layout depends on capacity and G only:
// nothing is read on the host. Group starts that are multiples of 16 rows get 16-byte stores, others byte stores.
struct Fp8ColsCast {
    const Bf16* in = nullptr;  // 16-byte aligned
    const int32_t* cu_seqlens = nullptr;
    int num_groups = 0;
    int64_t capacity = 0;
    int dim = 0;
    bool ue8m0 = false;
    Fp8E4m3* codes = nullptr;  // 16-byte aligned
    float* scales = nullptr;
    uint32_t* nonfinite = nullptr;
};
void launch_fp8_cast_cols(const Fp8ColsCast& cast, cudaStream_t stream);

}  // namespace evenep::cuda
