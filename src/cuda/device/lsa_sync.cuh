// Flag primitives of the team barrier at the scope the team needs (SPEC §5).
//
// The local team keeps every virtual rank on one GPU: its flags are ordered at GPU scope. The NCCL team places each
// rank's inbound flags in its own symmetric window and its peers are other GPUs reached through LSA (NVLink) load/
// store mappings, so a flag written by one GPU and read by another must be ordered at system scope (PTX ISA memory
// consistency model: threads of different GPUs share only the .sys scope). TeamView::system_scope selects the scope
// at run time; the branch is uniform over the launch, so the kernels stay one code path for both teams.
//
// Where the flags live: TeamView::inbox, when set, is a device table [R] and rank dst's flags are inbox[dst][0..R)
// (in dst's window, reached from every GPU through the peer mapping); otherwise the local team's one array
// flags[dst * R + src] is used.
#pragma once

#include <cstdint>

#include "evenep/cuda/team.hpp"

namespace evenep::cuda::device {

// ---- Explicit-scope primitives (PTX ISA: ld.acquire, red.release, atom, fence) ----

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_gpu(uint32_t* p, uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void red_release_add_sys(uint32_t* p, uint32_t v) {
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void red_release_add_gpu(uint32_t* p, uint32_t v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void red_relaxed_add_sys(uint32_t* p, uint32_t v) {
    asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void red_relaxed_add_gpu(uint32_t* p, uint32_t v) {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- Team-scope dispatch ----

// Address of the flag counting the arrivals of `src` not yet consumed by `dst`.
__device__ __forceinline__ uint32_t* team_flag(const TeamView& t, int dst, int src) {
    if (t.inbox != nullptr) return t.inbox[dst] + src;
    return t.flags + static_cast<size_t>(dst) * t.num_ranks + src;
}

// Acquire load of a team flag: what the arriving rank published before its arrival is visible after it.
__device__ __forceinline__ uint32_t team_flag_load(const TeamView& t, const uint32_t* p) {
    return t.system_scope ? ld_acquire_sys(p) : ld_acquire_gpu(p);
}

// One arrival (release): publishes every write ordered before it (by team_fence) to the rank that acquires it.
__device__ __forceinline__ void team_flag_arrive(const TeamView& t, uint32_t* p) {
    if (t.system_scope)
        red_release_add_sys(p, 1u);
    else
        red_release_add_gpu(p, 1u);
}

// Consumes one arrival (relaxed: the acquire load before it already ordered the data). The same scope as the
// arrivals, so that the two read-modify-writes are morally strong and never lose an update.
__device__ __forceinline__ void team_flag_consume(const TeamView& t, uint32_t* p) {
    if (t.system_scope)
        red_relaxed_add_sys(p, 0xffffffffu);
    else
        red_relaxed_add_gpu(p, 0xffffffffu);
}

// Fence of the team's scope: cumulative over the writes the calling thread observed (a block's writes gathered by
// __syncthreads), among them stores into peers' windows.
__device__ __forceinline__ void team_fence(const TeamView& t) {
    if (t.system_scope)
        __threadfence_system();
    else
        __threadfence();
}

}  // namespace evenep::cuda::device
