// Tuning candidate (EVENEP_CUTLASS_CANDIDATES; grouped_gemm_cutlass.hpp, Schedule): FP8 block-scaled dgrad, cooperative
// in clusters of two along M.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass_fp8.cuh"

namespace evenep::cuda::cutlass_gemm {
template size_t fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseDgrad, Schedule::kCooperativeCluster>(int, int);
template void fp8_instance_launch<Fp8Kind::kBlockwiseDgrad, Schedule::kCooperativeCluster>(const Fp8LaunchArgs&,
                                                                                           int,
                                                                                           cudaStream_t);
}  // namespace evenep::cuda::cutlass_gemm
