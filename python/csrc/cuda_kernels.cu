// python/csrc/cuda_kernels.cu — device kernels of the torch binding's CUDA ops (see cuda_kernels.hpp).
#include <climits>

#include "cuda_kernels.hpp"
#include "evenep/cuda/check.hpp"

namespace evenep::python::cukernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int cap = 1024) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

__device__ const int32_t* i32(const char* base, size_t off) { return reinterpret_cast<const int32_t*>(base + off); }

__global__ void pack_plan_kernel(BufferOffsets o, char* const* bases, int32_t* plan, int64_t width) {
    const int r = blockIdx.x;
    const char* b = bases[r];
    int32_t* row = plan + r * width;
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
    const int r = blockIdx.y;
    const char* b = bases[r];
    const int64_t n = s_pad * o.K, used = static_cast<int64_t>(i32(b, o.s)[r]) * o.K;
    const int32_t* dst = i32(b, o.dst);
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        handle[r * n + i] = i < used ? dst[i] : INT32_MIN;  // detail::kMaskedDst
}

__global__ void gather_recv_kernel(BufferOffsets o, char* const* bases, uint16_t* recv_x, float* recv_w) {
    const int r = blockIdx.y;
    const char* b = bases[r];
    const int64_t used = i32(b, o.cu_seqlens)[static_cast<int64_t>(r) * o.G + o.G - 1];
    const int64_t vec_per_row = o.H / 8, n = o.nvs * vec_per_row;
    const uint4* src = reinterpret_cast<const uint4*>(b + o.recv_x);
    uint4* dst = reinterpret_cast<uint4*>(recv_x) + r * n;
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    for (int64_t i = tid; i < n; i += step) dst[i] = i / vec_per_row < used ? src[i] : make_uint4(0, 0, 0, 0);
    if (recv_w) {
        const float* w = reinterpret_cast<const float*>(b + o.recv_w);
        for (int64_t i = tid; i < o.nvs; i += step) recv_w[r * o.nvs + i] = i < used ? w[i] : 0.0f;
    }
}

__global__ void scatter_recv_kernel(BufferOffsets o, char* const* bases, const uint16_t* rows) {
    const int r = blockIdx.y;
    const int64_t n = o.nvs * (o.H / 8);
    const uint4* src = reinterpret_cast<const uint4*>(rows) + r * n;
    uint4* dst = reinterpret_cast<uint4*>(bases[r] + o.recv_x);
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

__global__ void group_table_kernel(
    const int32_t* plan, PlanCols c, const char* home, const char* slots, int64_t mat_bytes, const void** table) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= c.R * c.G) return;
    const int r = i / c.G, g = i % c.G;
    const int32_t* row = plan + r * c.width;
    const int32_t src = row[c.source() + g];
    const void* p = nullptr;
    if (src == 1 || src == 3) {  // WeightSource::kLocal, kPeer: the home expert
        const int32_t e = row[c.expert() + g];
        if (e >= 0 && e < c.E) p = home + e * mat_bytes;
    } else if (src == 2) {  // kSlot
        const int32_t b = row[c.slot() + g];
        if (b >= 0 && b < c.B) p = slots + (static_cast<int64_t>(r) * c.B + b) * mat_bytes;
    }
    table[i] = p;
}

__global__ void prefetch_kernel(const int32_t* plan, PlanCols c, const char* weight, char* slots, int64_t mat_bytes) {
    const int rb = blockIdx.y, r = rb / c.B, b = rb % c.B;
    const int32_t e = plan[r * c.width + c.copies() + b];
    const bool have = e >= 0 && e < c.E;
    char* dst = slots + rb * mat_bytes;
    const char* src = weight + (have ? e : 0) * mat_bytes;
    const int64_t tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
    if (mat_bytes % 16 == 0) {
        const int64_t n = mat_bytes / 16;
        for (int64_t i = tid; i < n; i += step)
            reinterpret_cast<uint4*>(dst)[i] = have ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
    } else {
        for (int64_t i = tid; i < mat_bytes; i += step) dst[i] = have ? src[i] : 0;
    }
}

__global__ void reduce_grad_kernel(const int32_t* plan, PlanCols c, const float* sg, float* grad, int64_t n) {
    const int e = blockIdx.y;
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int r = 0; r < c.R; ++r)
            for (int b = 0; b < c.B; ++b)
                if (plan[r * c.width + c.copies() + b] == e) acc += sg[(static_cast<int64_t>(r) * c.B + b) * n + i];
        grad[e * n + i] = acc;
    }
}

}  // namespace

void pack_plan(const BufferOffsets& o, char* const* bases, int32_t* plan, int64_t width, cudaStream_t stream) {
    pack_plan_kernel<<<o.R, kThreads, 0, stream>>>(o, bases, plan, width);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void pack_handle(const BufferOffsets& o, char* const* bases, int32_t* handle, int64_t s_pad, cudaStream_t stream) {
    pack_handle_kernel<<<dim3(blocks_for(s_pad * o.K, 64), o.R), kThreads, 0, stream>>>(o, bases, handle, s_pad);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void gather_recv(const BufferOffsets& o, char* const* bases, uint16_t* recv_x, float* recv_w, cudaStream_t stream) {
    gather_recv_kernel<<<dim3(blocks_for(o.nvs * (o.H / 8), 128), o.R), kThreads, 0, stream>>>(o, bases, recv_x,
                                                                                               recv_w);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

void scatter_recv(const BufferOffsets& o, char* const* bases, const uint16_t* rows, cudaStream_t stream) {
    scatter_recv_kernel<<<dim3(blocks_for(o.nvs * (o.H / 8), 128), o.R), kThreads, 0, stream>>>(o, bases, rows);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

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
                 cudaStream_t stream) {
    group_table_kernel<<<blocks_for(static_cast<int64_t>(R) * G), kThreads, 0, stream>>>(
        plan, PlanCols{width, R, E, G, B}, home, slots, mat_bytes, table);
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
              cudaStream_t stream) {
    if (static_cast<int64_t>(R) * B == 0 || mat_bytes == 0) return;
    prefetch_kernel<<<dim3(blocks_for(mat_bytes / 16 + 1, 64), R * B), kThreads, 0, stream>>>(
        plan, PlanCols{width, R, E, G, B}, weight, slots, mat_bytes);
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
                 cudaStream_t stream) {
    if (E == 0 || mat_elems == 0) return;
    reduce_grad_kernel<<<dim3(blocks_for(mat_elems, 64), E), kThreads, 0, stream>>>(plan, PlanCols{width, R, E, G, B},
                                                                                    slot_grads, grad, mat_elems);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace evenep::python::cukernels
