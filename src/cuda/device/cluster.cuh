// Thread-block cluster primitives (sm_90): the split arrive/wait barrier over every thread of the cluster and the
// address of a variable in another block's shared memory (distributed shared memory). Used by the planner's cluster
// (plan_cluster.cuh).
#pragma once

#include <cuda_runtime.h>

namespace evenep::cuda::device {

// This block's index in its cluster.
__device__ __forceinline__ int cluster_block() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(__clusterRelativeBlockRank());
#else
    return 0;
#endif
}

// barrier.cluster.arrive (release: this thread's earlier writes, shared or global, are visible to the threads that
// wait on this phase) and barrier.cluster.wait (acquire). Every thread of every block of the cluster alternates them.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __cluster_barrier_arrive();
#elif defined(__CUDA_ARCH__)
    __trap();  // clusters need sm_90
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __cluster_barrier_wait();
#elif defined(__CUDA_ARCH__)
    __trap();  // clusters need sm_90
#endif
}

// The address of *p (in this block's shared memory) in block `block` of the cluster: a generic pointer into the
// cluster's shared window (loads, stores and atomics through it reach that block's copy).
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, int block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<T*>(__cluster_map_shared_rank(static_cast<void*>(p), static_cast<unsigned>(block)));
#else
    (void)block;
    return p;  // (host pass; device code before sm_90 never launches a cluster)
#endif
}

}  // namespace evenep::cuda::device
