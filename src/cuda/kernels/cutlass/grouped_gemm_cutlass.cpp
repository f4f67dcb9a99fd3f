// The CUTLASS grouped GEMM backend's dispatch (grouped_gemm_cutlass.hpp): picks the instantiation of (op, schedule),
// sizes the workspace over all of them. No CUTLASS header here: the instantiations live in their own .cu files.
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "evenep/cuda/check.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda::cutlass_gemm {
namespace {

// Multiprocessors of the current device (cached per device); 0 without a device.
int sm_count() {
    static std::mutex mutex;
    static std::map<int, int> cache;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(device);
    if (it != cache.end()) return it->second;
    int sms = 0;
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cache[device] = sms;
    return sms;
}

// EVENEP_CUTLASS_RASTER: "m" or "n" overrides the raster order (grouped_gemm_cutlass.hpp, launch); unset, empty: none.
std::optional<bool> raster_override() {
    static const std::optional<bool> value = []() -> std::optional<bool> {
        const char* v = std::getenv("EVENEP_CUTLASS_RASTER");
        if (v == nullptr || *v == '\0') return std::nullopt;
        EVENEP_CHECK(std::strcmp(v, "m") == 0 || std::strcmp(v, "n") == 0, "EVENEP_CUTLASS_RASTER = '", v,
                     "': expected m or n (or unset)");
        return std::strcmp(v, "n") == 0;
    }();
    return value;
}

template <Op kOp>
void launch_op(Schedule schedule, const LaunchArgs& a, int sms, cudaStream_t stream) {
    if (a.y_fp32) {
        EVENEP_CHECK(kOp == Op::kDgrad && schedule == Schedule::kCooperative,
                     "grouped_gemm (CUTLASS): fp32 output only for the cooperative dgrad");
        if constexpr (kOp == Op::kDgrad) instance_launch<Op::kDgrad, Schedule::kCooperative, true>(a, sms, stream);
        return;
    }
    if (schedule == Schedule::kCooperative) {
        instance_launch<kOp, Schedule::kCooperative>(a, sms, stream);
        return;
    }
#if defined(EVENEP_CUTLASS_CANDIDATES)
    instance_launch<kOp, Schedule::kPingpong>(a, sms, stream);
#else
    EVENEP_CHECK(false,
                 "grouped_gemm (CUTLASS): the ping-pong schedule is a tuning candidate "
                 "(EVENEP_CUTLASS_CANDIDATES=ON)");
#endif
}

}  // namespace

bool raster_along_n(Op op, int64_t rows_capacity, int num_groups, int in_dim, int out_dim) {
    if (const std::optional<bool> o = raster_override()) return *o;
    const int n_dim = op == Op::kDgrad ? in_dim : out_dim;
    return op != Op::kWgrad && rows_capacity > static_cast<int64_t>(num_groups) * n_dim;
}

bool candidates_built() {
#if defined(EVENEP_CUTLASS_CANDIDATES)
    return true;
#else
    return false;
#endif
}

bool supported() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    int major = 0, minor = 0;
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
}

size_t workspace_bytes(int num_groups) {
    // Without a device, size for the largest Hopper part (the CUTLASS workspace grows with the SM count).
    constexpr int kMaxSms = 144;
    const int sms = std::max(sm_count(), kMaxSms);
    size_t bytes = std::max({instance_workspace_bytes<Op::kForward, Schedule::kCooperative>(num_groups, sms),
                             instance_workspace_bytes<Op::kDgrad, Schedule::kCooperative>(num_groups, sms),
                             instance_workspace_bytes<Op::kWgrad, Schedule::kCooperative>(num_groups, sms),
                             instance_workspace_bytes<Op::kDgrad, Schedule::kCooperative, true>(num_groups, sms),
                             fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseForward>(num_groups, sms),
                             fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseDgrad>(num_groups, sms),
                             fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseForwardOverlap>(num_groups, sms),
                             fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseDgradOverlap>(num_groups, sms)});
#if defined(EVENEP_CUTLASS_CANDIDATES)
    bytes = std::max({bytes, instance_workspace_bytes<Op::kForward, Schedule::kPingpong>(num_groups, sms),
                      instance_workspace_bytes<Op::kDgrad, Schedule::kPingpong>(num_groups, sms),
                      instance_workspace_bytes<Op::kWgrad, Schedule::kPingpong>(num_groups, sms),
                      fp8_instance_workspace_bytes<Fp8Kind::kUnscaled>(num_groups, sms),
                      fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseWgrad>(num_groups, sms),
                      fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseForwardWide>(num_groups, sms),
                      fp8_instance_workspace_bytes<Fp8Kind::kBlockwiseDgradWide>(num_groups, sms)});
#endif
    return bytes;
}

void launch(Schedule schedule, const LaunchArgs& args, cudaStream_t stream) {
    LaunchArgs a = args;
    a.raster_along_n = raster_along_n(a.op, a.rows_capacity, a.num_groups, a.in_dim, a.out_dim);
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 128 == 0,
                 "grouped_gemm (CUTLASS): workspace must be 128-byte aligned");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0, "grouped_gemm (CUTLASS): x must be 16-byte aligned");
    EVENEP_CHECK(a.op != Op::kWgrad || reinterpret_cast<uintptr_t>(a.dy) % 16 == 0,
                 "grouped_gemm_wgrad (CUTLASS): dy must be 16-byte aligned");
    EVENEP_CHECK(a.op == Op::kWgrad || reinterpret_cast<uintptr_t>(a.y) % 16 == 0,
                 "grouped_gemm (CUTLASS): y must be 16-byte aligned");
    const int sms = sm_count();
    switch (a.op) {
        case Op::kForward:
            launch_op<Op::kForward>(schedule, a, sms, stream);
            break;
        case Op::kDgrad:
            launch_op<Op::kDgrad>(schedule, a, sms, stream);
            break;
        case Op::kWgrad:
            launch_op<Op::kWgrad>(schedule, a, sms, stream);
            break;
    }
}

void launch_fp8(const Fp8LaunchArgs& args, cudaStream_t stream) {
    Fp8LaunchArgs a = args;
    a.raster_along_n = raster_along_n(a.op, a.rows_capacity, a.num_groups, a.in_dim, a.out_dim);
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 128 == 0,
                 "grouped_gemm_fp8: workspace must be 128-byte aligned");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0, "grouped_gemm_fp8: x must be 16-byte aligned");
    EVENEP_CHECK(a.op == Op::kWgrad || reinterpret_cast<uintptr_t>(a.y) % 16 == 0,
                 "grouped_gemm_fp8: y must be 16-byte aligned");
    if (a.op == Op::kWgrad) {  // grouped_gemm_wgrad_fp8 refuses first where the candidate is not built
        EVENEP_CHECK(a.block_scaled, "grouped_gemm_wgrad_fp8: block-scaled only");
#if defined(EVENEP_CUTLASS_CANDIDATES)
        fp8_instance_launch<Fp8Kind::kBlockwiseWgrad>(a, sm_count(), stream);
#endif
        return;
    }
    const int sms = sm_count();
    if (!a.block_scaled) {  // grouped_gemm_fp8 refuses first where the candidate is not built
#if defined(EVENEP_CUTLASS_CANDIDATES)
        fp8_instance_launch<Fp8Kind::kUnscaled>(a, sms, stream);
#endif
        return;
    }
    EVENEP_CHECK(a.mainloop != Fp8Mainloop::kAuto, "grouped_gemm_fp8: the caller resolves mainloop = kAuto");
    if (a.mainloop == Fp8Mainloop::kOverlappedWide) {  // grouped_gemm_fp8 refuses first where not built
#if defined(EVENEP_CUTLASS_CANDIDATES)
        if (a.op == Op::kForward)
            fp8_instance_launch<Fp8Kind::kBlockwiseForwardWide>(a, sms, stream);
        else
            fp8_instance_launch<Fp8Kind::kBlockwiseDgradWide>(a, sms, stream);
#endif
        return;
    }
    if (a.mainloop == Fp8Mainloop::kOverlapped) {
        if (a.op == Op::kForward)
            fp8_instance_launch<Fp8Kind::kBlockwiseForwardOverlap>(a, sms, stream);
        else
            fp8_instance_launch<Fp8Kind::kBlockwiseDgradOverlap>(a, sms, stream);
        return;
    }
    if (a.op == Op::kForward)
        fp8_instance_launch<Fp8Kind::kBlockwiseForward>(a, sms, stream);
    else
        fp8_instance_launch<Fp8Kind::kBlockwiseDgrad>(a, sms, stream);
}

}  // namespace evenep::cuda::cutlass_gemm
