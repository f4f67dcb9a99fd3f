// FP8 grouped GEMM (include/evenep/cuda/grouped_gemm.hpp, grouped_gemm_fp8): the checked front door of CUTLASS's
// e4m3 ptr-array grouped GEMM with 1 x 128 / 128 x 128 block scales (src/cuda/kernels/cutlass/, built with
// EVENEP_CUTLASS), and the e4m3 random fill of the benchmarks and tests. The bf16 entry points and the portable
// kernel are grouped_gemm.cu's.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(EVENEP_HAVE_CUTLASS)
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.hpp"
#endif
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/grouped_gemm.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/gemm_cost.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

__global__ void fill_random_e4m3_kernel(uint8_t* p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const float v = bf16_to_float(detail::random_bf16(detail::hash64(seed, i), scale));
        p[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
    }
}

}  // namespace

void fill_random_e4m3(uint8_t* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
    if (n == 0) return;
    fill_random_e4m3_kernel<<<1024, 256, 0, stream>>>(p, n, seed, scale);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void grouped_gemm_fp8(const GroupedGemmFp8Args& a, cudaStream_t stream) {
    EVENEP_CHECK(a.num_groups >= 1 && a.num_groups <= kMaxGemmGroups, "grouped_gemm_fp8: num_groups = ", a.num_groups,
                 " must be in [1, ", kMaxGemmGroups, "]");
    EVENEP_CHECK(a.in_dim > 0 && a.in_dim % 128 == 0, "grouped_gemm_fp8: in_dim = ", a.in_dim,
                 " must be a positive multiple of 128 (the scale block)");
    EVENEP_CHECK(a.out_dim > 0 && a.out_dim % 128 == 0, "grouped_gemm_fp8: out_dim = ", a.out_dim,
                 " must be a positive multiple of 128 (the scale block)");
    EVENEP_CHECK(a.workspace != nullptr, "grouped_gemm_fp8: workspace is null");
    EVENEP_CHECK(a.x != nullptr && a.cu_seqlens != nullptr && a.weights != nullptr && a.y != nullptr,
                 "grouped_gemm_fp8: null pointer among x, cu_seqlens, weights, y");
    EVENEP_CHECK(!a.block_scaled || (a.x_scales != nullptr && a.weight_scales != nullptr),
                 "grouped_gemm_fp8: block_scaled needs x_scales and weight_scales");
    EVENEP_CHECK(
        grouped_gemm_has_cutlass(),
        "grouped_gemm_fp8: needs a build with EVENEP_CUTLASS=ON and a compute capability 9.0 device (H100/H200)");
    EVENEP_CHECK(a.block_scaled || grouped_gemm_has_candidates(),
                 "grouped_gemm_fp8: block_scaled = false (CUTLASS's unscaled FP8 anchor) is a tuning candidate: it "
                 "needs a build with EVENEP_CUTLASS_CANDIDATES=ON");
    EVENEP_CHECK(a.mainloop == Fp8Mainloop::kAuto || a.mainloop == Fp8Mainloop::kCutlass ||
                     a.mainloop == Fp8Mainloop::kOverlapped || a.mainloop == Fp8Mainloop::kOverlappedWide,
                 "grouped_gemm_fp8: mainloop = ", static_cast<int>(a.mainloop), " is not an Fp8Mainloop");
    EVENEP_CHECK(a.mainloop != Fp8Mainloop::kOverlappedWide || grouped_gemm_has_candidates(),
                 "grouped_gemm_fp8: mainloop = kOverlappedWide (128 x 256 tiles) is a tuning candidate: it needs a "
                 "build with EVENEP_CUTLASS_CANDIDATES=ON");
    EVENEP_CHECK(a.rows_capacity >= 0, "grouped_gemm_fp8: rows_capacity = ", a.rows_capacity, " must be >= 0");
    // kAuto: EvenEP's consumer loop where the output has more columns than the inner dimension (Fp8Mainloop).
    const bool fwd = a.op == GemmOp::kForward;
    const int k_dim = fwd ? a.in_dim : a.out_dim, n_dim = fwd ? a.out_dim : a.in_dim;
    const Fp8Mainloop mainloop = a.mainloop != Fp8Mainloop::kAuto ? a.mainloop
                                 : n_dim > k_dim                  ? Fp8Mainloop::kOverlapped
                                                                  : Fp8Mainloop::kCutlass;
#if defined(EVENEP_HAVE_CUTLASS)
    const cutlass_gemm::Fp8LaunchArgs l{.op = fwd ? cutlass_gemm::Op::kForward : cutlass_gemm::Op::kDgrad,
                                        .block_scaled = a.block_scaled,
                                        .mainloop = mainloop,
                                        .x = a.x,
                                        .x_scales = a.x_scales,
                                        .cu = a.cu_seqlens,
                                        .ptrs = reinterpret_cast<const void* const*>(a.weights),
                                        .weight_scales = a.weight_scales,
                                        .y = a.y,
                                        .num_groups = a.num_groups,
                                        .in_dim = a.in_dim,
                                        .out_dim = a.out_dim,
                                        .load_aware = a.schedule == GemmSchedule::kLoadAware,
                                        .rows_capacity = a.rows_capacity,
                                        .cost = grouped_gemm_cost_model(),
                                        .workspace = a.workspace};
    cutlass_gemm::launch_fp8(l, stream);
#else
    (void)stream;
    (void)mainloop;
#endif
}

void grouped_gemm_wgrad_fp8(const GroupedWgradFp8Args& a, cudaStream_t stream) {
    EVENEP_CHECK(a.num_groups >= 1 && a.num_groups <= kMaxGemmGroups,
                 "grouped_gemm_wgrad_fp8: num_groups = ", a.num_groups, " must be in [1, ", kMaxGemmGroups, "]");
    EVENEP_CHECK(a.in_dim > 0 && a.in_dim % 128 == 0 && a.out_dim > 0 && a.out_dim % 128 == 0,
                 "grouped_gemm_wgrad_fp8: in_dim = ", a.in_dim, ", out_dim = ", a.out_dim,
                 " must be positive multiples of 128");
    EVENEP_CHECK(a.capacity >= 0 && a.capacity <= INT32_MAX, "grouped_gemm_wgrad_fp8: capacity = ", a.capacity,
                 " must be in [0, 2^31)");
    EVENEP_CHECK(a.workspace != nullptr, "grouped_gemm_wgrad_fp8: workspace is null");
    EVENEP_CHECK(a.x_cols != nullptr && a.x_col_scales != nullptr && a.dy_cols != nullptr &&
                     a.dy_col_scales != nullptr && a.cu_seqlens != nullptr && a.grads != nullptr,
                 "grouped_gemm_wgrad_fp8: null pointer among x_cols, x_col_scales, dy_cols, dy_col_scales, "
                 "cu_seqlens, grads");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.x_cols) % 16 == 0 && reinterpret_cast<uintptr_t>(a.dy_cols) % 16 == 0,
                 "grouped_gemm_wgrad_fp8: x_cols and dy_cols must be 16-byte aligned");
    EVENEP_CHECK(grouped_gemm_has_candidates(),
                 "grouped_gemm_wgrad_fp8: needs a build with EVENEP_CUTLASS=ON and EVENEP_CUTLASS_CANDIDATES=ON and "
                 "a compute capability 9.0 device (H100/H200)");
#if defined(EVENEP_HAVE_CUTLASS)
    cutlass_gemm::Fp8LaunchArgs l{};
    l.op = cutlass_gemm::Op::kWgrad;
    l.x = a.x_cols;
    l.x_scales = a.x_col_scales;
    l.dy = a.dy_cols;
    l.dy_scales = a.dy_col_scales;
    l.cu = a.cu_seqlens;
    l.ptrs = reinterpret_cast<const void* const*>(a.grads);
    l.num_groups = a.num_groups;
    l.in_dim = a.in_dim;
    l.out_dim = a.out_dim;
    l.capacity = a.capacity;
    l.accumulate = a.accumulate;
    l.load_aware = a.schedule == GemmSchedule::kLoadAware;
    l.cost = grouped_gemm_cost_model();
    l.workspace = a.workspace;
    cutlass_gemm::launch_fp8(l, stream);
#else
    (void)stream;
#endif
}

}  // namespace evenep::cuda
