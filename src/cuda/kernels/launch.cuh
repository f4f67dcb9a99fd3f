// Host-side launch helpers shared by the kernel files: cooperative launch, co-residency clamp, error check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "evenep/cuda/check.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

// Allows `kernel` at least `smem` bytes of dynamic shared memory on the current device. The limit only ever grows: a
// launch with less after one with more (two layouts in one process) must not lower it under the larger launch.
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t smem) {
    if (smem <= 48 * 1024) return;  // the default limit
    int device = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&device));
    static std::mutex mutex;
    static std::map<std::pair<int, const void*>, size_t> limits;
    std::lock_guard<std::mutex> lock(mutex);
    size_t& limit = limits[{device, reinterpret_cast<const void*>(kernel)}];
    if (smem <= limit) return;
    EVENEP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    limit = smem;
}

// Blocks of `kernel` the current device holds at once, as (blocks per SM, SMs). The occupancy query runs once per
// (device, kernel, threads, smem); later calls (graph capture) only read the cache.
template <typename Kernel>
std::pair<int, int> co_resident_capacity(Kernel kernel, int threads, size_t smem) {
    struct Key {
        int device;
        const void* kernel;
        int threads;
        size_t smem;
        bool operator<(const Key& o) const {
            return std::tie(device, kernel, threads, smem) < std::tie(o.device, o.kernel, o.threads, o.smem);
        }
    };
    static std::mutex mutex;
    static std::map<Key, std::pair<int, int>> cache;  // -> (blocks per SM, SMs)
    int device = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&device));
    const Key key{device, reinterpret_cast<const void*>(kernel), threads, smem};
    allow_dynamic_smem(kernel, smem);
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) {
        int num_sms = 0, per_sm = 0;
        EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
        EVENEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
        it = cache.emplace(key, std::make_pair(per_sm, num_sms)).first;
    }
    return it->second;
}

// Blocks per virtual rank for an SM budget of `sm_budget` SMs per rank: sm_budget * (blocks of `kernel` one SM
// holds), clamped to max_blocks and so that num_ranks * blocks blocks fit on the current device at once
// (co-residency). With R virtual ranks on one GPU the clamp usually wins: the ranks share the GPU's SMs.
template <typename Kernel>
int clamp_co_resident(Kernel kernel, int threads, size_t smem, int num_ranks, int sm_budget, int max_blocks = 1 << 30) {
    EVENEP_CHECK(sm_budget >= 1, "launch: SM budget = ", sm_budget, " must be >= 1");
    const std::pair<int, int> occ = co_resident_capacity(kernel, threads, smem);
    const int capacity = occ.first * occ.second;
    EVENEP_CHECK(capacity >= num_ranks, "launch: ", num_ranks, " virtual ranks need ", num_ranks,
                 " co-resident blocks but the device holds only ", capacity, " (", occ.first, " per SM x ", occ.second,
                 " SMs)");
    const long long want = static_cast<long long>(sm_budget) * occ.first;
    return static_cast<int>(std::min<long long>({want, static_cast<long long>(max_blocks), capacity / num_ranks}));
}

// Cooperative launch (all blocks co-resident; valid inside stream capture), then cudaGetLastError().
template <typename... KernelArgs, typename... Args>
void launch_cooperative(
    void (*kernel)(KernelArgs...), int grid, int threads, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(grid));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    EVENEP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
    EVENEP_CUDA_CHECK(cudaGetLastError());
#ifdef EVENEP_SYNC_CHECK
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
}

// A launch configuration: thread-block clusters of `cluster` blocks (1: no cluster) and, with `early`, programmatic
// dependent launch — the kernel may be scheduled before the stream's previous kernel has ended, so it must call
// device::wait_previous_kernel() (team.cuh) before it touches global memory. attr: kept by the caller.
inline cudaLaunchConfig_t launch_config(
    int grid, int cluster, int threads, size_t smem, cudaStream_t stream, bool early, cudaLaunchAttribute (&attr)[2]) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(grid));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 0;
    if (cluster > 1) {
        cudaLaunchAttribute& a = attr[cfg.numAttrs++];
        a.id = cudaLaunchAttributeClusterDimension;
        a.val.clusterDim.x = static_cast<unsigned>(cluster);
        a.val.clusterDim.y = 1;
        a.val.clusterDim.z = 1;
    }
    if (early) {
        cudaLaunchAttribute& a = attr[cfg.numAttrs++];
        a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        a.val.programmaticStreamSerializationAllowed = 1;
    }
    return cfg;
}

// A launch in thread-block clusters of `cluster` blocks (grid a multiple of it; every block of a cluster is resident at
// once, on one GPC; 1: plain blocks), early or not (launch_config), then cudaGetLastError().
template <typename... KernelArgs, typename... Args>
void launch_clustered(void (*kernel)(KernelArgs...),
                      int grid,
                      int cluster,
                      int threads,
                      size_t smem,
                      cudaStream_t stream,
                      bool early,
                      Args&&... args) {
    EVENEP_CHECK(cluster >= 1 && grid % cluster == 0, "launch: grid ", grid, " is not a multiple of the cluster ",
                 cluster);
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = launch_config(grid, cluster, threads, smem, stream, early, attr);
    EVENEP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
    EVENEP_CUDA_CHECK(cudaGetLastError());
#ifdef EVENEP_SYNC_CHECK
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
}

// Clusters of `cluster` blocks of `kernel` the current device holds at once (0: such a cluster does not fit, e.g. its
// shared memory per block exceeds an SM's). Cached per (device, kernel, cluster, threads, smem).
template <typename Kernel>
int max_active_clusters(Kernel kernel, int cluster, int threads, size_t smem) {
    static std::mutex mutex;
    static std::map<std::tuple<int, const void*, int, int, size_t>, int> cache;
    int device = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&device));
    allow_dynamic_smem(kernel, smem);
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), cluster, threads, smem);
    auto it = cache.find(key);
    if (it == cache.end()) {
        cudaLaunchAttribute attr[2];
        const cudaLaunchConfig_t cfg = launch_config(cluster, cluster, threads, smem, nullptr, false, attr);
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();  // not launchable as such a cluster: report 0
            n = 0;
        }
        it = cache.emplace(key, n).first;
    }
    return it->second;
}

inline void check_launch(cudaStream_t stream) {
    EVENEP_CUDA_CHECK(cudaGetLastError());
#ifdef EVENEP_SYNC_CHECK
    EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
    (void)stream;
#endif
}

}  // namespace evenep::cuda
