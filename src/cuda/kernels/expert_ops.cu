// The functional device operations of evenep/cuda/expert_ops.hpp over the plan tensor and caller memory: plan and
// handle packing, receive rows in and out of the Ep's buffers, the grouped GEMM's tables, the copies of ranks that
// hold every home weight. (weight_rows is with the MoE layer's row kernel in swiglu.cu.)
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "cuda/device/plan_pack.cuh"
#include "cuda/kernels/launch.cuh"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/detail/layout.hpp"

namespace evenep::cuda {
namespace {

inline constexpr int kThreads = 256;
inline constexpr size_t kMaxCopyListSmem = 200 * 1024;  // the copies tables staged in shared memory

int blocks_for(int64_t n, int cap = 1024) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

// What the kernels read of the Ep's buffers: byte offsets inside one rank's buffer (EpLayout) and the served ranks.
struct RankBuffers {
    char* const* bases;  // device [R] (Window::d_peers)
    size_t s, dst, cu_seqlens, recv_x, recv_w;
    int K, G, H;
    int64_t nvs;
    int rank_begin, L;
};

RankBuffers rank_buffers(const Ep& ep) {
    const EpLayout& l = ep.layout();
    return RankBuffers{ep.window().d_peers, l.plan.s, l.dst, l.plan.cu_seqlens, l.recv_x(), l.recv_w(), l.K, l.G,
                       l.H, l.nvs, ep.rank_begin(), ep.num_local_ranks()};
}

__device__ __forceinline__ const int32_t* i32(const char* base, size_t off) {
    return reinterpret_cast<const int32_t*>(base + off);
}

// ---------------------------------------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) pack_plan_kernel(RankBuffers o, PlanPackColumns cols, int32_t* plan) {
    const int r = o.rank_begin + static_cast<int>(blockIdx.x);  // row blockIdx.x: served rank r
    device::pack_plan_row(o.bases[r], r, cols, plan + blockIdx.x * cols.width, threadIdx.x, blockDim.x);
}

__global__ void __launch_bounds__(kThreads) pack_handle_kernel(RankBuffers o, int32_t* handle, int64_t s_pad) {
    const int i_row = blockIdx.y, r = o.rank_begin + i_row;
    const char* b = o.bases[r];
    const int64_t n = s_pad * o.K, used = static_cast<int64_t>(i32(b, o.s)[r]) * o.K;
    const int32_t* dst = i32(b, o.dst);
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        handle[i_row * n + i] = i < used ? dst[i] : detail::kMaskedDst;
}

// The inverse of both packings: row i (served rank r) into the plan arrays of rank q's buffer at r's share, and, in
// r's own buffer, the handle's destinations into dst (a code outside the group's R*NvS rows becomes masked: no
// kernel reads or writes out of bounds, whatever the handle holds). blockIdx.y: the row; blockIdx.z: the target
// (q = r when there is one target, else q = blockIdx.z: every rank of the team).
__global__ void __launch_bounds__(kThreads) unpack_plan_kernel(RankBuffers o,
                                                               PlanPackColumns cols,
                                                               const int32_t* plan,
                                                               const int32_t* handle,
                                                               int64_t s_pad,
                                                               int num_targets,
                                                               int64_t flat_end) {
    const int i_row = blockIdx.y, r = o.rank_begin + i_row;
    const int q = num_targets == 1 ? r : static_cast<int>(blockIdx.z);
    char* b = o.bases[q];
    const int32_t* row = plan + i_row * cols.width;
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    for (int k = 0; k < cols.n; ++k) {
        const PlanPackColumn& c = cols.c[k];
        for (int64_t j = tid; j < c.count; j += step) {
            const int64_t at = static_cast<int64_t>(r) * c.count + j;
            if (c.bytes == 1)
                reinterpret_cast<int8_t*>(b + c.src)[at] = static_cast<int8_t>(row[c.dst + j]);
            else
                reinterpret_cast<int32_t*>(b + c.src)[at] = row[c.dst + j];
        }
    }
    if (handle == nullptr || q != r) return;
    const int64_t n = s_pad * o.K;
    int32_t* dst = reinterpret_cast<int32_t*>(b + o.dst);
    for (int64_t j = tid; j < n; j += step) {
        const int32_t code = handle[i_row * n + j];
        dst[j] = detail::is_masked(code) || detail::decode_dst(code) < flat_end ? code : detail::kMaskedDst;
    }
}

// ---------------------------------------------------------------------------------------------------------
// Receive rows
// ---------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) gather_recv_kernel(RankBuffers o, uint16_t* recv_x, float* recv_w) {
    const int i_row = blockIdx.y, r = o.rank_begin + i_row;
    const char* b = o.bases[r];
    const int64_t used = i32(b, o.cu_seqlens)[static_cast<int64_t>(r) * o.G + o.G - 1];
    const int64_t vec_per_row = o.H / 8, n = o.nvs * vec_per_row;
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    if (recv_x) {
        const uint4* src = reinterpret_cast<const uint4*>(b + o.recv_x);
        uint4* dst = reinterpret_cast<uint4*>(recv_x) + i_row * n;
        for (int64_t i = tid; i < n; i += step) dst[i] = i / vec_per_row < used ? src[i] : make_uint4(0, 0, 0, 0);
    }
    if (recv_w) {
        const float* w = reinterpret_cast<const float*>(b + o.recv_w);
        for (int64_t i = tid; i < o.nvs; i += step) recv_w[i_row * o.nvs + i] = i < used ? w[i] : 0.0f;
    }
}

__global__ void __launch_bounds__(kThreads) scatter_recv_kernel(RankBuffers o, const uint16_t* rows) {
    const int i_row = blockIdx.y;
    const int64_t n = o.nvs * (o.H / 8);
    const uint4* src = reinterpret_cast<const uint4*>(rows) + i_row * n;
    uint4* dst = reinterpret_cast<uint4*>(o.bases[o.rank_begin + i_row] + o.recv_x);
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

// ---------------------------------------------------------------------------------------------------------
// Grouped GEMM tables
// ---------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) group_table_kernel(GroupTableArgs a) {
    const PlanRowLayout& c = a.plan.layout;
    const int i = blockIdx.x * blockDim.x + threadIdx.x, G1 = c.G + 1;
    if (i >= a.plan.rows * G1) return;
    const int r = i / G1, g = i % G1;
    const int32_t* row = a.plan.data + r * c.width;
    const void* p = nullptr;
    if (g == c.G) {  // the gap after the rank's last group: not computed
        if (a.cu) a.cu[i] = static_cast<int32_t>((r + 1) * a.nvs);
    } else {
        if (a.cu) a.cu[i] = static_cast<int32_t>(r * a.nvs + row[c.cu_seqlens + g]);
        switch (static_cast<WeightSource>(row[c.group_source + g])) {
            case WeightSource::kLocal:
            case WeightSource::kPeer: {
                const int32_t e = row[c.group_expert + g];
                const int64_t first = a.expert_base + (a.homes ? static_cast<int64_t>(r) * a.num_home : 0);
                const char* home = static_cast<const char*>(a.homes ? a.homes[r] : a.home);
                if (e - first >= 0 && e - first < a.num_home) {
                    if (home) p = home + (e - first) * a.mat_bytes;
                } else if (a.peers && a.num_home > 0 && e >= 0 && e / a.num_home < a.num_peers) {
                    const char* peer = static_cast<const char*>(a.peers[e / a.num_home]);
                    if (peer) p = peer + static_cast<int64_t>(e % a.num_home) * a.mat_bytes;
                }
                break;
            }
            case WeightSource::kSlot: {
                const int32_t b = row[c.group_slot + g];
                if (b >= 0 && b < c.B) {
                    if (a.row_slots) {
                        if (a.row_slots[r]) p = static_cast<const char*>(a.row_slots[r]) + b * a.mat_bytes;
                    } else {
                        p = static_cast<const char*>(a.slots) + (static_cast<int64_t>(r) * c.B + b) * a.mat_bytes;
                    }
                }
                break;
            }
            case WeightSource::kEmpty:
                break;
        }
    }
    a.table[i] = p;
}

// ---------------------------------------------------------------------------------------------------------
// Copies
// ---------------------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) select_slots_kernel(PlanRows plan, const char* in, char* out,
                                                                int64_t mat_bytes) {
    const PlanRowLayout& c = plan.layout;
    const int rb = blockIdx.y, r = rb / c.B, b = rb % c.B;
    const int32_t e = plan.data[r * c.width + c.copies + b];
    const bool have = e >= 0 && e < c.E;
    const int64_t n = mat_bytes / 16, tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    const uint4* src = reinterpret_cast<const uint4*>(in + rb * mat_bytes);
    uint4* dst = reinterpret_cast<uint4*>(out + rb * mat_bytes);
    for (int64_t i = tid; i < n; i += step) dst[i] = have ? src[i] : make_uint4(0, 0, 0, 0);
}

// The copies tables staged into shared memory: cp[j] = copies of row j / B, slot j % B (j < R*B).
__device__ void stage_copies(const ExpertCopies& c, int32_t* cp) {
    for (int j = threadIdx.x; j < c.R * c.B; j += blockDim.x)
        cp[j] = c.copies[static_cast<int64_t>(j / c.B) * c.copies_stride + j % c.B];
    __syncthreads();
}

__device__ __forceinline__ char* matrix(const RankMatrices& m, int rank, int64_t index, int64_t mat_bytes) {
    char* b = m.bases ? m.bases[rank] : m.base + rank * m.rank_stride;
    return b + m.offset + index * mat_bytes;
}
__device__ __forceinline__ char* home_of(const ExpertCopies& c, int e) {
    return matrix(c.home, e / c.epn, e % c.epn, c.mat_bytes);
}

// Every block walks the slots (from shared memory) and copies its share of each used one: the grid is sized by one
// matrix, not by R*B matrices, so empty slots cost nothing.
__global__ void __launch_bounds__(kThreads) prefetch_copies_kernel(ExpertCopies c, bool zero_empty) {
    extern __shared__ int32_t cp[];
    stage_copies(c, cp);
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x, bytes = c.mat_bytes;
    for (int j = 0; j < c.R * c.B; ++j) {
        const int32_t e = cp[j];
        const bool have = e >= 0 && e < c.E;
        if (!have && !zero_empty) continue;
        char* dst = matrix(c.slots, j / c.B, j % c.B, bytes);
        const char* src = have ? home_of(c, e) : nullptr;
        if (bytes % 16 == 0) {
            const int64_t n = bytes / 16;
            for (int64_t i = tid; i < n; i += step)
                reinterpret_cast<uint4*>(dst)[i] =
                    have ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
        } else {
            for (int64_t i = tid; i < bytes; i += step) dst[i] = have ? src[i] : 0;
        }
    }
}

// Shared memory of reduce_copies_kernel: the slot entries' matrices (RB pointers), then cp [RB], next [RB], head [E].
size_t reduce_smem_bytes(const ExpertCopies& c) {
    const size_t RB = static_cast<size_t>(c.R) * c.B;
    return RB * sizeof(char*) + (2 * RB + c.E) * sizeof(int32_t);
}

// Every block lists each expert's copies in shared memory (head[e] -> next[j] ..., slots ascending: one thread per
// expert scans the staged table) with each slot entry's matrix (so the summing loop addresses a slot by one shared
// load, no division), then walks the experts and sums its share of each: the grid is sized by one matrix, and with
// accumulate the experts without copies cost nothing.
__global__ void __launch_bounds__(kThreads)
    reduce_copies_kernel(ExpertCopies c, bool vec, bool accumulate, bool zero_consumed) {
    extern __shared__ __align__(16) unsigned char reduce_smem[];
    const int E = c.E, RB = c.R * c.B;
    char** slot_at = reinterpret_cast<char**>(reduce_smem);
    int32_t *cp = reinterpret_cast<int32_t*>(slot_at + RB), *next = cp + RB, *head = cp + 2 * RB;
    for (int j = threadIdx.x; j < RB; j += blockDim.x) slot_at[j] = matrix(c.slots, j / c.B, j % c.B, c.mat_bytes);
    stage_copies(c, cp);  // (its barrier also publishes slot_at)
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t prev = -1;
        head[e] = -1;
        for (int j = 0; j < RB; ++j) {
            if (cp[j] != e) continue;
            if (prev < 0) head[e] = j;
            else next[prev] = j;
            prev = j;
        }
        if (prev >= 0) next[prev] = -1;
    }
    __syncthreads();
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x, n = c.mat_bytes / 4;
    auto slot = [&](int32_t j) { return reinterpret_cast<float*>(slot_at[j]); };
    for (int e = 0; e < E; ++e) {
        const int32_t first = head[e];
        if (accumulate && first < 0) continue;  // nothing to add: home(e) stays as it is
        float* g = reinterpret_cast<float*>(home_of(c, e));
        if (vec) {  // n % 4 == 0, 16-byte aligned: the same fp32 sums, four lanes at a time
            float4* g4 = reinterpret_cast<float4*>(g);
            for (int64_t i = tid; i < n / 4; i += step) {
                float4 acc = accumulate ? g4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int32_t j = first; j >= 0; j = next[j]) {
                    float4* s4 = reinterpret_cast<float4*>(slot(j)) + i;
                    const float4 v = *s4;
                    acc.x += v.x;
                    acc.y += v.y;
                    acc.z += v.z;
                    acc.w += v.w;
                    if (zero_consumed) *s4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
                g4[i] = acc;
            }
        } else {
            for (int64_t i = tid; i < n; i += step) {
                float acc = accumulate ? g[i] : 0.0f;
                for (int32_t j = first; j >= 0; j = next[j]) {
                    float* sj = slot(j) + i;
                    acc += *sj;
                    if (zero_consumed) *sj = 0.0f;
                }
                g[i] = acc;
            }
        }
    }
}

void check_plan_rows(const PlanRows& p, const char* what) {
    EVENEP_CHECK(p.data != nullptr && p.rows >= 1 && p.layout.width > 0, what, ": plan tensor ",
                 p.data ? "set" : "null", " with ", p.rows, " rows of ", p.layout.width, " columns");
}

size_t checked_smem(size_t bytes, const char* what) {
    EVENEP_CHECK(bytes <= kMaxCopyListSmem, what, ": the plan's copy lists need ", bytes,
                 " bytes of shared memory, at most ", kMaxCopyListSmem, " supported");
    return bytes;
}

}  // namespace

namespace {

PlanPackColumns pack_columns(const Ep& ep, const char* what) {
    return plan_pack_columns(ep.config(), ep.layout().plan, what);
}

}  // namespace

void pack_plan(const Ep& ep, int32_t* plan, cudaStream_t stream) {
    EVENEP_CHECK(plan != nullptr, "pack_plan: null plan tensor");
    pack_plan_kernel<<<ep.num_local_ranks(), kThreads, 0, stream>>>(rank_buffers(ep), pack_columns(ep, "pack_plan"),
                                                                    plan);
    check_launch(stream);
}

EpPlan unpack_plan(Ep& ep, const UnpackPlanArgs& a, cudaStream_t stream) {
    check_plan_rows(a.plan, "unpack_plan");
    const PlanPackColumns cols = pack_columns(ep, "unpack_plan");
    const int L = ep.num_local_ranks(), R = ep.config().R;
    EVENEP_CHECK(a.plan.rows == L && a.plan.layout.width == cols.width, "unpack_plan: plan tensor of ", a.plan.rows,
                 " rows of ", a.plan.layout.width, " columns, expected ", L, " rows (the served ranks) of ",
                 cols.width);
    EVENEP_CHECK(a.s_pad >= 1 && a.s_pad <= ep.config().S, "unpack_plan: s_pad = ", a.s_pad, " outside [1, S = ",
                 ep.config().S, "]");
    const std::vector<int32_t> s(R, static_cast<int32_t>(a.s_pad));
    EpPlan p = ep.adopt_plan(s, stream);
    const RankBuffers o = rank_buffers(ep);
    int64_t work = a.handle ? a.s_pad * o.K : 0;
    for (int k = 0; k < cols.n; ++k) work = std::max(work, cols.c[k].count);
    const dim3 grid(blocks_for(work, 64), L, a.every_rank ? R : 1);
    unpack_plan_kernel<<<grid, kThreads, 0, stream>>>(o, cols, a.plan.data, a.handle, a.s_pad, a.every_rank ? R : 1,
                                                      static_cast<int64_t>(R) * o.nvs);
    check_launch(stream);
    return p;
}

void pack_handle(const Ep& ep, int32_t* handle, int64_t s_pad, cudaStream_t stream) {
    EVENEP_CHECK(handle != nullptr && s_pad >= 1, "pack_handle: handle ", handle ? "set" : "null", ", s = ", s_pad);
    const RankBuffers o = rank_buffers(ep);
    pack_handle_kernel<<<dim3(blocks_for(s_pad * o.K, 64), o.L), kThreads, 0, stream>>>(o, handle, s_pad);
    check_launch(stream);
}

void gather_recv(const Ep& ep, uint16_t* recv_x, float* recv_w, cudaStream_t stream) {
    if (!recv_x && !recv_w) return;
    const RankBuffers o = rank_buffers(ep);
    const int64_t work = recv_x ? o.nvs * (o.H / 8) : o.nvs;  // recv_w alone: one thread per row
    gather_recv_kernel<<<dim3(blocks_for(work, 128), o.L), kThreads, 0, stream>>>(o, recv_x, recv_w);
    check_launch(stream);
}

void scatter_recv(const Ep& ep, const uint16_t* rows, cudaStream_t stream) {
    EVENEP_CHECK(rows != nullptr, "scatter_recv: null rows");
    const RankBuffers o = rank_buffers(ep);
    scatter_recv_kernel<<<dim3(blocks_for(o.nvs * (o.H / 8), 128), o.L), kThreads, 0, stream>>>(o, rows);
    check_launch(stream);
}

void build_group_table(const GroupTableArgs& a, cudaStream_t stream) {
    check_plan_rows(a.plan, "build_group_table");
    EVENEP_CHECK(a.table != nullptr && a.nvs >= 0 && a.mat_bytes >= 0 && a.num_home >= 0 && a.num_peers >= 0 &&
                     (a.peers == nullptr || a.num_home > 0),
                 "build_group_table: table ", a.table ? "set" : "null", ", NvS = ", a.nvs, ", matrix bytes = ",
                 a.mat_bytes, ", home matrices = ", a.num_home, ", peers = ", a.num_peers);
    group_table_kernel<<<blocks_for(static_cast<int64_t>(a.plan.rows) * (a.plan.layout.G + 1)), kThreads, 0,
                         stream>>>(a);
    check_launch(stream);
}

void select_slots(const PlanRows& plan, const void* in, void* out, int64_t mat_bytes, cudaStream_t stream) {
    check_plan_rows(plan, "select_slots");
    if (static_cast<int64_t>(plan.rows) * plan.layout.B == 0 || mat_bytes == 0) return;
    EVENEP_CHECK(mat_bytes % 16 == 0, "select_slots: ", mat_bytes, " bytes per slot, expected a multiple of 16");
    select_slots_kernel<<<dim3(blocks_for(mat_bytes / 16, 64), plan.rows * plan.layout.B), kThreads, 0, stream>>>(
        plan, static_cast<const char*>(in), static_cast<char*>(out), mat_bytes);
    check_launch(stream);
}

ExpertCopies ExpertCopies::of_tensors(const PlanRows& plan, const void* home, void* slots, int64_t mat_bytes) {
    check_plan_rows(plan, "ExpertCopies::of_tensors");
    const PlanRowLayout& L = plan.layout;
    EVENEP_CHECK(plan.rows >= 1 && L.E % plan.rows == 0, "ExpertCopies::of_tensors: ", plan.rows,
                 " plan rows for E = ", L.E, " (every rank's row expected)");
    ExpertCopies c;
    c.copies = plan.data + L.copies;
    c.copies_stride = L.width;
    c.R = plan.rows;
    c.B = L.B;
    c.E = L.E;
    c.epn = L.E / plan.rows;
    c.mat_bytes = mat_bytes;
    c.home.base = static_cast<char*>(const_cast<void*>(home));
    c.home.rank_stride = c.epn * mat_bytes;
    c.slots.base = static_cast<char*>(slots);
    c.slots.rank_stride = c.B * mat_bytes;
    return c;
}

namespace {

void check_copies(const ExpertCopies& c, const char* what) {
    EVENEP_CHECK(c.copies != nullptr && c.R >= 1 && c.B >= 0 && c.E >= 1 && c.epn >= 1 && c.mat_bytes >= 0 &&
                     c.copies_stride >= c.B,
                 what, ": copies ", c.copies ? "set" : "null", ", R = ", c.R, ", B = ", c.B, ", E = ", c.E,
                 ", epn = ", c.epn, ", stride ", c.copies_stride, ", ", c.mat_bytes, " bytes per matrix");
    EVENEP_CHECK((c.home.bases || c.home.base) && (c.slots.bases || c.slots.base), what,
                 ": home and slots need a base or a table of bases");
}

bool aligned16(const RankMatrices& m) {
    return m.offset % 16 == 0 && m.rank_stride % 16 == 0 && reinterpret_cast<uintptr_t>(m.base) % 16 == 0;
}

}  // namespace

void prefetch_copies(const ExpertCopies& c, bool zero_empty, cudaStream_t stream) {
    check_copies(c, "prefetch_copies");
    if (static_cast<int64_t>(c.R) * c.B == 0 || c.mat_bytes == 0) return;
    EVENEP_CHECK(c.mat_bytes % 16 != 0 || (aligned16(c.home) && aligned16(c.slots)),
                 "prefetch_copies: matrices of a multiple of 16 bytes must start 16-byte aligned");
    const size_t smem = checked_smem(static_cast<size_t>(c.R) * c.B * sizeof(int32_t), "prefetch_copies");
    allow_dynamic_smem(prefetch_copies_kernel, smem);
    prefetch_copies_kernel<<<blocks_for(c.mat_bytes % 16 == 0 ? c.mat_bytes / 16 : c.mat_bytes, 1024), kThreads, smem,
                             stream>>>(c, zero_empty);
    check_launch(stream);
}

void reduce_copies(const ExpertCopies& c, bool accumulate, bool zero_consumed, cudaStream_t stream) {
    check_copies(c, "reduce_copies");
    EVENEP_CHECK(c.mat_bytes % 4 == 0, "reduce_copies: ", c.mat_bytes, " bytes per matrix, expected fp32 matrices");
    if (c.mat_bytes == 0) return;
    const size_t smem = checked_smem(reduce_smem_bytes(c), "reduce_copies");
    allow_dynamic_smem(reduce_copies_kernel, smem);
    const bool vec = c.mat_bytes % 16 == 0 && aligned16(c.home) && aligned16(c.slots);
    const int64_t n = c.mat_bytes / 4;
    reduce_copies_kernel<<<blocks_for(vec ? n / 4 : n, 1024), kThreads, smem, stream>>>(c, vec, accumulate,
                                                                                        zero_consumed);
    check_launch(stream);
}

PlanPackColumns plan_pack_columns(const Config& cfg, const PlanOffsets& offsets, const char* what) {
    PlanPackColumns cols{};
    PlanOffsets off = offsets;
    for_each_plan_column(cfg, off, [&](const PlanColumn& c, const auto& at) {
        EVENEP_CHECK_KIND(ErrorKind::kInternal, cols.n < kMaxPlanColumns, what, ": more than ", kMaxPlanColumns,
                          " plan columns");
        cols.c[cols.n++] = PlanPackColumn{at.at, c.offset, c.count, c.value_bytes};
        cols.width = c.offset + c.count;
    });
    return cols;
}

}  // namespace evenep::cuda
