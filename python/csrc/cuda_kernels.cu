// python/csrc/cuda_kernels.cu — device kernels of the torch binding's CUDA ops (see cuda_kernels.hpp).
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "cuda_kernels.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/error.hpp"

namespace evenep::python::cukernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int cap = 1024) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

__device__ const int32_t* i32(const char* base, size_t off) { return reinterpret_cast<const int32_t*>(base + off); }

__global__ void pack_plan_kernel(BufferOffsets o, char* const* bases, int32_t* plan, int64_t width) {
    const int r = o.rank_begin + static_cast<int>(blockIdx.x);  // row blockIdx.x: served rank r
    const char* b = bases[r];
    int32_t* row = plan + blockIdx.x * width;
    const int E = o.E, G = o.G;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
        int32_t v;
        if (c == 0) {
            v = i32(b, o.s)[r];
        } else if (c < 1 + E) {
            v = i32(b, o.tpe)[static_cast<int64_t>(r) * E + (c - 1)];
        } else {
            const int64_t j = c - 1 - E;
            const int64_t f = j / G, g = static_cast<int64_t>(r) * G + j % G;
            switch (f) {
                case 0:
                    v = i32(b, o.cu_seqlens)[g];
                    break;
                case 1:
                    v = i32(b, o.group_count)[g];
                    break;
                case 2:
                    v = i32(b, o.group_expert)[g];
                    break;
                case 3:
                    v = reinterpret_cast<const int8_t*>(b + o.group_source)[g];
                    break;
                case 4:
                    v = i32(b, o.group_slot)[g];
                    break;
                default:
                    v = i32(b, o.copies)[static_cast<int64_t>(r) * o.B + (j - 5 * G)];
                    break;
            }
        }
        row[c] = v;
    }
}

__global__ void pack_handle_kernel(BufferOffsets o, char* const* bases, int32_t* handle, int64_t s_pad) {
    const int i_row = blockIdx.y, r = o.rank_begin + i_row;
    const char* b = bases[r];
    const int64_t n = s_pad * o.K, used = static_cast<int64_t>(i32(b, o.s)[r]) * o.K;
    const int32_t* dst = i32(b, o.dst);
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        handle[i_row * n + i] = i < used ? dst[i] : INT32_MIN;  // detail::kMaskedDst
}

__global__ void gather_recv_kernel(BufferOffsets o, char* const* bases, uint16_t* recv_x, float* recv_w) {
    const int i_row = blockIdx.y, r = o.rank_begin + i_row;
    const char* b = bases[r];
    const int64_t used = i32(b, o.cu_seqlens)[static_cast<int64_t>(r) * o.G + o.G - 1];
    const int64_t vec_per_row = o.H / 8, n = o.nvs * vec_per_row;
    const uint4* src = reinterpret_cast<const uint4*>(b + o.recv_x);
    uint4* dst = reinterpret_cast<uint4*>(recv_x) + i_row * n;
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    if (recv_x)
        for (int64_t i = tid; i < n; i += step) dst[i] = i / vec_per_row < used ? src[i] : make_uint4(0, 0, 0, 0);
    if (recv_w) {
        const float* w = reinterpret_cast<const float*>(b + o.recv_w);
        for (int64_t i = tid; i < o.nvs; i += step) recv_w[i_row * o.nvs + i] = i < used ? w[i] : 0.0f;
    }
}

__global__ void scatter_recv_kernel(BufferOffsets o, char* const* bases, const uint16_t* rows) {
    const int i_row = blockIdx.y;
    const int64_t n = o.nvs * (o.H / 8);
    const uint4* src = reinterpret_cast<const uint4*>(rows) + i_row * n;
    uint4* dst = reinterpret_cast<uint4*>(bases[o.rank_begin + i_row] + o.recv_x);
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

struct PlanCols {
    int64_t width;
    int R, E, G, B;
    __device__ int64_t expert() const { return 1 + E + 2 * G; }
    __device__ int64_t source() const { return 1 + E + 3 * G; }
    __device__ int64_t slot() const { return 1 + E + 4 * G; }
    __device__ int64_t copies() const { return 1 + E + 5 * G; }
};

struct TableArgs {
    int64_t nvs;
    int expert_base, num_home;
};

__global__ void group_table_kernel(const int32_t* plan,
                                   PlanCols c,
                                   TableArgs t,
                                   const char* home,
                                   const char* slots,
                                   int64_t mat_bytes,
                                   const void** table,
                                   int32_t* cu) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, G1 = c.G + 1;
    if (i >= c.R * G1) return;  // c.R: the plan tensor's rows (L)
    const int r = i / G1, g = i % G1;
    const int32_t* row = plan + r * c.width;
    const void* p = nullptr;
    if (g == c.G) {  // the gap after the rank's last group: not computed
        cu[i] = static_cast<int32_t>((r + 1) * t.nvs);
    } else {
        cu[i] = static_cast<int32_t>(r * t.nvs + row[1 + c.E + g]);
        const int32_t src = row[c.source() + g];
        if (src == 1 || src == 3) {  // WeightSource::kLocal, kPeer: the home expert
            const int32_t e = row[c.expert() + g] - t.expert_base;
            if (e >= 0 && e < t.num_home) p = home + e * mat_bytes;
        } else if (src == 2) {  // kSlot
            const int32_t b = row[c.slot() + g];
            if (b >= 0 && b < c.B) p = slots + (static_cast<int64_t>(r) * c.B + b) * mat_bytes;
        }
    }
    table[i] = p;
}

__global__ void select_slots_kernel(const int32_t* plan, PlanCols c, const char* in, char* out, int64_t mat_bytes) {
    const int rb = blockIdx.y, r = rb / c.B, b = rb % c.B;
    const int32_t e = plan[r * c.width + c.copies() + b];
    const bool have = e >= 0 && e < c.E;
    const int64_t n = mat_bytes / 16, tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    const uint4* src = reinterpret_cast<const uint4*>(in + rb * mat_bytes);
    uint4* dst = reinterpret_cast<uint4*>(out + rb * mat_bytes);
    for (int64_t i = tid; i < n; i += step) dst[i] = have ? src[i] : make_uint4(0, 0, 0, 0);
}

// The plan's copies table staged into shared memory: cp[j] = copies of rank j / B, slot j % B (j < R*B).
__device__ void stage_copies(const int32_t* plan, const PlanCols& c, int32_t* cp) {
    for (int j = threadIdx.x; j < c.R * c.B; j += blockDim.x)
        cp[j] = plan[static_cast<int64_t>(j / c.B) * c.width + c.copies() + j % c.B];
    __syncthreads();
}

// Every block walks the slots (from shared memory) and copies its share of each used one: the grid is sized by one
// matrix, not by R*B matrices, so empty slots cost nothing.
__global__ void prefetch_kernel(
    const int32_t* plan, PlanCols c, const char* weight, char* slots, int64_t mat_bytes, bool zero_empty) {
    extern __shared__ int32_t cp[];
    stage_copies(plan, c, cp);
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    for (int j = 0; j < c.R * c.B; ++j) {
        const int32_t e = cp[j];
        const bool have = e >= 0 && e < c.E;
        if (!have && !zero_empty) continue;
        char* dst = slots + j * mat_bytes;
        const char* src = weight + (have ? e : 0) * mat_bytes;
        if (mat_bytes % 16 == 0) {
            const int64_t n = mat_bytes / 16;
            for (int64_t i = tid; i < n; i += step)
                reinterpret_cast<uint4*>(dst)[i] =
                    have ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
        } else {
            for (int64_t i = tid; i < mat_bytes; i += step) dst[i] = have ? src[i] : 0;
        }
    }
}

// Every block lists each expert's copies in shared memory (head[e] -> next[j] ..., slots ascending: one thread per
// expert scans the staged table), then walks the experts and sums its share of each: the grid is sized by one
// matrix, and with accumulate the experts without copies cost nothing.
__global__ void reduce_grad_kernel(
    const int32_t* plan, PlanCols c, const float* sg, float* grad, int64_t n, bool vec, bool accumulate) {
    extern __shared__ int32_t lists[];
    const int RB = c.R * c.B;
    int32_t *cp = lists, *next = lists + RB, *head = lists + 2 * RB;
    stage_copies(plan, c, cp);
    for (int e = threadIdx.x; e < c.E; e += blockDim.x) {
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
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    for (int e = 0; e < c.E; ++e) {
        const int32_t first = head[e];
        if (accumulate && first < 0) continue;  // nothing to add: grad[e] stays as it is
        if (vec) {  // n % 4 == 0, 16-byte aligned: the same fp32 sums, four lanes at a time
            const int64_t n4 = n / 4;
            const float4* s4 = reinterpret_cast<const float4*>(sg);
            float4* g4 = reinterpret_cast<float4*>(grad) + e * n4;
            for (int64_t i = tid; i < n4; i += step) {
                float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int32_t j = first; j >= 0; j = next[j]) {
                    const float4 v = s4[j * n4 + i];
                    acc.x += v.x;
                    acc.y += v.y;
                    acc.z += v.z;
                    acc.w += v.w;
                }
                if (accumulate) {
                    const float4 g = g4[i];
                    acc = make_float4(g.x + acc.x, g.y + acc.y, g.z + acc.z, g.w + acc.w);
                }
                g4[i] = acc;
            }
        } else {
            for (int64_t i = tid; i < n; i += step) {
                float acc = 0.0f;
                for (int32_t j = first; j >= 0; j = next[j]) acc += sg[j * n + i];
                grad[e * n + i] = accumulate ? grad[e * n + i] + acc : acc;
            }
        }
    }
}

__device__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__global__ void weight_rows_kernel(const int32_t* plan,
                                   PlanCols c,
                                   int64_t nvs,
                                   int H,
                                   uint16_t* rows,
                                   const uint16_t* y,
                                   const float* recv_w,
                                   float* grad_w) {
    const int i = blockIdx.y, lane = threadIdx.x % 32;
    const int64_t used = plan[static_cast<int64_t>(i) * c.width + 1 + c.E + c.G - 1];  // cu_seqlens[G-1]
    const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
    const int64_t warps = gridDim.x * static_cast<int64_t>(blockDim.x) / 32;
    const int vecs = H / 8;
    for (int64_t n = warp; n < nvs; n += warps) {
        const int64_t row = static_cast<int64_t>(i) * nvs + n;
        if (n >= used) {
            if (lane == 0) grad_w[row] = 0.0f;
            continue;
        }
        const float w = recv_w[row];
        uint4* g4 = reinterpret_cast<uint4*>(rows + row * H);
        const uint4* y4 = reinterpret_cast<const uint4*>(y + row * H);
        float acc = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            uint4 g = g4[v];
            const uint4 yv = y4[v];
            uint32_t* gw = reinterpret_cast<uint32_t*>(&g);
            const uint32_t* yw = reinterpret_cast<const uint32_t*>(&yv);
            for (int k = 0; k < 4; ++k) {
                const float g0 = bf16_bits_to_float(gw[k] & 0xffffu), g1 = bf16_bits_to_float(gw[k] >> 16);
                acc = fmaf(g0, bf16_bits_to_float(yw[k] & 0xffffu), acc);
                acc = fmaf(g1, bf16_bits_to_float(yw[k] >> 16), acc);
                const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(w * g0));
                const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(w * g1));
                gw[k] = lo | (hi << 16);
            }
            g4[v] = g;
        }
        for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) grad_w[row] = acc;
    }
}

// Dynamic shared memory of `bytes` for `kernel` (the 48 KB default raised once when needed); checked.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
    constexpr size_t kDefault = 48 * 1024, kMax = 200 * 1024;
    EVENEP_CHECK(bytes <= kMax, what, ": the plan's copy lists need ", bytes, " bytes of shared memory, at most ",
                 kMax, " supported");
    if (bytes > kDefault)
        EVENEP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

void pack_plan(const BufferOffsets& o, char* const* bases, int32_t* plan, int64_t width, cudaStream_t stream) {
    pack_plan_kernel<<<o.L, kThreads, 0, stream>>>(o, bases, plan, width);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void pack_handle(const BufferOffsets& o, char* const* bases, int32_t* handle, int64_t s_pad, cudaStream_t stream) {
    pack_handle_kernel<<<dim3(blocks_for(s_pad * o.K, 64), o.L), kThreads, 0, stream>>>(o, bases, handle, s_pad);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void gather_recv(const BufferOffsets& o, char* const* bases, uint16_t* recv_x, float* recv_w, cudaStream_t stream) {
    const int64_t work = recv_x ? o.nvs * (o.H / 8) : o.nvs;  // recv_w alone: one thread per row
    gather_recv_kernel<<<dim3(blocks_for(work, 128), o.L), kThreads, 0, stream>>>(o, bases, recv_x, recv_w);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void scatter_recv(const BufferOffsets& o, char* const* bases, const uint16_t* rows, cudaStream_t stream) {
    scatter_recv_kernel<<<dim3(blocks_for(o.nvs * (o.H / 8), 128), o.L), kThreads, 0, stream>>>(o, bases, rows);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

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
                 cudaStream_t stream) {
    group_table_kernel<<<blocks_for(static_cast<int64_t>(L) * (G + 1)), kThreads, 0, stream>>>(
        plan, PlanCols{width, L, E, G, B}, TableArgs{nvs, expert_base, num_home}, home, slots, mat_bytes, table, cu);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void select_slots(const int32_t* plan,
                  int64_t width,
                  int L,
                  int E,
                  int G,
                  int B,
                  const char* in,
                  char* out,
                  int64_t mat_bytes,
                  cudaStream_t stream) {
    if (static_cast<int64_t>(L) * B == 0 || mat_bytes == 0) return;
    EVENEP_CHECK(mat_bytes % 16 == 0, "select_slots: ", mat_bytes, " bytes per slot, expected a multiple of 16");
    select_slots_kernel<<<dim3(blocks_for(mat_bytes / 16, 64), L * B), kThreads, 0, stream>>>(
        plan, PlanCols{width, L, E, G, B}, in, out, mat_bytes);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

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
              cudaStream_t stream) {
    if (static_cast<int64_t>(R) * B == 0 || mat_bytes == 0) return;
    const size_t smem = static_cast<size_t>(R) * B * sizeof(int32_t);
    allow_smem(prefetch_kernel, smem, "prefetch_weight");
    prefetch_kernel<<<blocks_for(mat_bytes % 16 == 0 ? mat_bytes / 16 : mat_bytes, 1024), kThreads, smem, stream>>>(
        plan, PlanCols{width, R, E, G, B}, weight, slots, mat_bytes, zero_empty);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

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
                 cudaStream_t stream) {
    if (E == 0 || mat_elems == 0) return;
    const size_t smem = (2 * static_cast<size_t>(R) * B + E) * sizeof(int32_t);
    allow_smem(reduce_grad_kernel, smem, "reduce_grad");
    const bool vec = mat_elems % 4 == 0 && reinterpret_cast<uintptr_t>(slot_grads) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(grad) % 16 == 0;
    reduce_grad_kernel<<<blocks_for(vec ? mat_elems / 4 : mat_elems, 1024), kThreads, smem, stream>>>(
        plan, PlanCols{width, R, E, G, B}, slot_grads, grad, mat_elems, vec, accumulate);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

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
                 cudaStream_t stream) {
    EVENEP_CHECK(H % 8 == 0, "weight_rows: H = ", H, " is not a multiple of 8");
    weight_rows_kernel<<<dim3(blocks_for(nvs * 32, 512), L), kThreads, 0, stream>>>(
        plan, PlanCols{width, L, E, G, 0}, nvs, H, rows, y, recv_w, grad_w);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace evenep::python::cukernels
