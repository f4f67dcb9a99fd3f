// Hopper grouped GEMM (include/evenep/cuda/grouped_gemm.hpp, issue 5): TMA + wgmma, warp-specialised, persistent.
//
// One block per SM, 384 threads = 3 warpgroups. Warpgroup 0 is the producer: one thread walks the block's work
// units and issues TMA tile loads into a kStages-deep ring of shared-memory stages (full/empty mbarriers). Warpgroups
// 1 and 2 are the consumers: each owns 64 of the tile's 128 rows and runs wgmma m64n256k16 (bf16 in, fp32
// accumulators in registers, 128 per thread) over the stage, then releases it. Register budget moves from the
// producer (40) to the consumers (232) with setmaxnreg.
//
// A work unit is one 128 x 256 output tile:
//   forward  y[rows of the group][out]   A = x rows (K-major), B = W_g [in][out] (MN-major, wgmma transposes it)
//   dgrad    y[rows of the group][in]    A = dY rows (K-major), B = W_g read as [in][out] = K-major for B
//   wgrad    dW_g[in][out] over a chunk of the group's rows: A = x chunk read transposed (MN-major), B = dY chunk
//            (MN-major); the tile is added into dW_g by bulk fp32 reductions (cp.reduce.async.bulk .add.f32)
//            from a small staging buffer, so the read-modify-write of the gradient runs in the memory system while
//            the consumers go on with the next tile.
// Every group gets its own pair of tensor maps (A rows of the group, B weights or dY rows of the group), written by
// the prepare kernel into the workspace from host-encoded templates with tensormap.replace (address and row count):
// rows past the group's end load as zeros, so a partial last k-block of a wgrad chunk needs no masking and a
// forward tile never reads another group's rows into a stored row.
//
// Scheduling: the prepare kernel (grouped_gemm_sm90_schedule.cuh) orders the work units (by the cost model where
// the schedule or the op asks for it); blocks take them statically (u mod grid) or from an atomic counter.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda/device/sm90.cuh"
#include "cuda/kernels/grouped_gemm_sm90.hpp"
#include "cuda/kernels/grouped_gemm_sm90_schedule.cuh"
#include "evenep/cuda/check.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda::sm90 {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// The GEMM.
// ---------------------------------------------------------------------------------------------------------------
struct GemmParams {
    const uint8_t* ws;
    const int32_t* cu;
    const void* const* ptrs;
    void* y;  // fwd/dgrad output [rows][N]
    int G;
    int K;  // fwd/dgrad inner dimension
    int N;  // output columns
    int M;  // wgrad: gradient rows (in)
    int dynamic;
    int accumulate;  // wgrad: 1 = add the tile into the gradient, 0 = write it
};

struct Unit {
    int group;
    int row0;      // fwd/dgrad: first row of the tile relative to the group; wgrad: first gradient row (m)
    int col0;      // first output column
    int kb_begin;  // first k-block (wgrad: in rows relative to the group, times kBk)
    int kb_end;
    int rows;      // fwd/dgrad: rows of the group
};

__device__ __forceinline__ Unit decode_unit(const GemmParams& p, int mode, int n_tiles, int u) {
    const Header* h = header_of(p.ws, p.G);
    const int32_t* order_end = reinterpret_cast<const int32_t*>(h + 1) + p.G + (p.G & 1);
    const Segment* segs = reinterpret_cast<const Segment*>(order_end);
    const int32_t* prefix = reinterpret_cast<const int32_t*>(segs + max_segments(p.G));
    int lo = 0, hi = __ldg(&h->nseg) - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (__ldg(prefix + mid) <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    const Segment s{__ldg(&segs[lo].group), __ldg(&segs[lo].row_begin), __ldg(&segs[lo].row_end),
                    __ldg(&segs[lo].units)};
    const int local = u - __ldg(prefix + lo);
    const int mt = local / n_tiles, nt = local - mt * n_tiles;
    Unit out;
    out.group = s.group;
    out.row0 = mt * kBm;
    out.col0 = nt * kBn;
    if (mode == kModeWgr) {
        out.kb_begin = s.row_begin / kBk;
        out.kb_end = (s.row_end + kBk - 1) / kBk;
        out.rows = s.row_end;
    } else {
        out.kb_begin = 0;
        out.kb_end = (p.K + kBk - 1) / kBk;
        out.rows = s.row_end;
    }
    return out;
}

// Two floats to bf16x2 (round to nearest even) in one branch-free instruction.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <int kMode, bool kOutF32>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(const GemmParams p) {
#if defined(EVENEP_SM90_ENABLED)
        constexpr int kStages = stages_of(kMode, kOutF32);
        extern __shared__ uint8_t smem_raw[];
        uint8_t* smem = reinterpret_cast<uint8_t*>(detail::align_up(reinterpret_cast<uintptr_t>(smem_raw), 1024));
        uint8_t* stage_base = smem;
        float* staging = reinterpret_cast<float*>(smem + kStages * kStageBytes);
        uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes +
                                                     staging_of(kMode, kOutF32));
        uint64_t* full = bars;                  // [kStages]
        uint64_t* empty = bars + kStages;       // [kStages]
        uint64_t* unit_full = bars + 2 * kStages;   // [2]
        uint64_t* unit_empty = unit_full + 2;       // [2]
        int* s_unit = reinterpret_cast<int*>(unit_empty + 2);  // [2]

        const int wg = threadIdx.x / 128;
        const int t = threadIdx.x % 128;
        const int n_tiles = (p.N + kBn - 1) / kBn;
        const int total = header_of(p.ws, p.G)->total;
        const CUtensorMap* maps = reinterpret_cast<const CUtensorMap*>(p.ws);

        if (threadIdx.x == 0) {
            for (int s = 0; s < kStages; ++s) {
                mbar_init(&full[s], 1);
                mbar_init(&empty[s], 2);
            }
            for (int s = 0; s < 2; ++s) {
                mbar_init(&unit_full[s], 1);
                mbar_init(&unit_empty[s], 256);
            }
            fence_mbar_init();
        }
        __syncthreads();

        if (wg == 0) {
            // ---------------- producer ----------------
            regs_decrease<40>();
            if (t == 0) {
                int stage = 0;
                uint32_t phase = 0;
                int slot = 0;
                uint32_t uphase = 0;
                int last_group = -1;
                auto* counter = const_cast<unsigned long long*>(&header_of(p.ws, p.G)->counter);
                for (int i = 0;; ++i) {
                    int u;
                    if (!p.dynamic) {
                        u = static_cast<int>(blockIdx.x) + i * static_cast<int>(gridDim.x);
                    } else {
                        u = static_cast<int>(atomicAdd(counter, 1ull));
                        u = u < total ? u : total;
                    }
                    mbar_wait(&unit_empty[slot], uphase ^ 1);
                    s_unit[slot] = u;
                    mbar_arrive(&unit_full[slot]);
                    slot ^= 1;
                    if (slot == 0) uphase ^= 1;
                    if (u >= total) break;
                    const Unit un = decode_unit(p, kMode, n_tiles, u);
                    const CUtensorMap* ma = maps + 2 * un.group;
                    const CUtensorMap* mb = ma + 1;
                    if (un.group != last_group) {
                        tensormap_acquire(ma);
                        tensormap_acquire(mb);
                        last_group = un.group;
                    }
                    for (int kb = un.kb_begin; kb < un.kb_end; ++kb) {
                        mbar_wait(&empty[stage], phase ^ 1);
                        uint8_t* sa = stage_base + stage * kStageBytes;
                        uint8_t* sb = sa + kABytes;
                        mbar_arrive_expect_tx(&full[stage], kStageBytes);
                        if constexpr (kMode == kModeWgr) {
                            tma_load_2d(sa, ma, &full[stage], un.row0, kb * kBk);
                            tma_load_2d(sa + 8192, ma, &full[stage], un.row0 + 64, kb * kBk);
#pragma unroll
                            for (int j = 0; j < 4; ++j)
                                tma_load_2d(sb + j * 8192, mb, &full[stage], un.col0 + 64 * j, kb * kBk);
                        } else {
                            tma_load_2d(sa, ma, &full[stage], kb * kBk, un.row0);
                            if constexpr (kMode == kModeFwd) {
#pragma unroll
                                for (int j = 0; j < 4; ++j)
                                    tma_load_2d(sb + j * 8192, mb, &full[stage], un.col0 + 64 * j, kb * kBk);
                            } else {
                                tma_load_2d(sb, mb, &full[stage], kb * kBk, un.col0);
                            }
                        }
                        if (++stage == kStages) {
                            stage = 0;
                            phase ^= 1;
                        }
                    }
                }
            }
        } else {
            // ---------------- consumers ----------------
            regs_increase<232>();
            const int w = wg - 1;  // rows [64 w, 64 w + 64) of the tile
            const int warp = t / 32, lane = t % 32;
            int stage = 0;
            uint32_t phase = 0;
            int slot = 0;
            uint32_t uphase = 0;
            int chunk_count = 0;  // wgrad staging chunks issued so far (double buffer index)
            float acc[128];
#pragma unroll
            for (int i = 0; i < 128; ++i) acc[i] = 0.f;
            for (;;) {
                mbar_wait(&unit_full[slot], uphase);
                const int u = s_unit[slot];
                mbar_arrive(&unit_empty[slot]);
                slot ^= 1;
                if (slot == 0) uphase ^= 1;
                if (u >= total) break;
                const Unit un = decode_unit(p, kMode, n_tiles, u);

                int prev_stage = -1;
                for (int kb = un.kb_begin; kb < un.kb_end; ++kb) {
                    mbar_wait(&full[stage], phase);
                    const uint32_t sa = smem_u32(stage_base + stage * kStageBytes);
                    const uint32_t sb = sa + kABytes;
                    wgmma_fence();
                    fence_regs(acc);
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {
                        const int scale_d = (kb > un.kb_begin || kk > 0) ? 1 : 0;
                        if constexpr (kMode == kModeFwd) {
                            wgmma_m64n256k16<0, 1>(acc, make_desc(sa + w * 8192 + kk * 32, 16, 1024),
                                                   make_desc(sb + kk * 2048, 8192, 1024), scale_d);
                        } else if constexpr (kMode == kModeDgr) {
                            wgmma_m64n256k16<0, 0>(acc, make_desc(sa + w * 8192 + kk * 32, 16, 1024),
                                                   make_desc(sb + kk * 32, 16, 1024), scale_d);
                        } else {
                            wgmma_m64n256k16<1, 1>(acc, make_desc(sa + w * 8192 + kk * 2048, 8192, 1024),
                                                   make_desc(sb + kk * 2048, 8192, 1024), scale_d);
                        }
                    }
                    wgmma_commit();
                    fence_regs(acc);
                    if (prev_stage >= 0) {
                        wgmma_wait<1>();
                        fence_regs(acc);
                        if (t == 0) mbar_arrive(&empty[prev_stage]);
                    }
                    prev_stage = stage;
                    if (++stage == kStages) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
                wgmma_wait<0>();
                fence_regs(acc);
                if (t == 0 && prev_stage >= 0) mbar_arrive(&empty[prev_stage]);

                // ---------------- epilogue ----------------
                const int lr = 16 * warp + lane / 4;  // local row in the WG's 64 rows (and lr + 8)
                const int lc = 2 * (lane % 4);         // local column in each 8-column chunk
                if constexpr (kMode != kModeWgr && kOutF32) {
                    const int g_begin = un.group == 0 ? 0 : p.cu[un.group - 1];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        // Accumulators are read unconditionally (a read under a divergent branch makes ptxas
                        // serialise the wgmma pipeline); only the stores are predicated.
                        const int rrel = un.row0 + 64 * w + lr + 8 * h;
                        const bool row_ok = rrel < un.rows;
                        const size_t row_off = static_cast<size_t>(g_begin + (row_ok ? rrel : 0)) * p.N;
#pragma unroll
                        for (int j = 0; j < 32; ++j) {
                            const int col = un.col0 + 8 * j + lc;
                            const float2 v = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
                            if (row_ok && col < p.N)
                                *reinterpret_cast<float2*>(static_cast<float*>(p.y) + row_off + col) = v;
                        }
                    }
                } else if constexpr (kMode != kModeWgr) {
                    // bf16: registers -> this warpgroup's staging rows -> one bulk copy per output row, issued
                    // asynchronously so that the next tile's wgmma starts at once; the buffer is reused only after
                    // the previous tile's copies have read it.
                    uint16_t* buf = reinterpret_cast<uint16_t*>(staging) + w * 64 * kOutRow;
                    if (t < 64) bulk_wait_read<0>();
                    named_barrier_sync(1 + w, 128);
#pragma unroll
                    for (int j = 0; j < 32; ++j) {
                        *reinterpret_cast<uint32_t*>(buf + lr * kOutRow + 8 * j + lc) =
                            pack_bf16x2(acc[4 * j], acc[4 * j + 1]);
                        *reinterpret_cast<uint32_t*>(buf + (lr + 8) * kOutRow + 8 * j + lc) =
                            pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]);
                    }
                    fence_proxy_async_smem();
                    named_barrier_sync(1 + w, 128);
                    if (t < 64) {
                        const int rrel = un.row0 + 64 * w + t;
                        const int cols = min(kBn, p.N - un.col0);
                        if (rrel < un.rows) {
                            const int g_begin = un.group == 0 ? 0 : p.cu[un.group - 1];
                            bulk_store(static_cast<uint16_t*>(p.y) + static_cast<size_t>(g_begin + rrel) * p.N +
                                           un.col0,
                                       buf + t * kOutRow, static_cast<uint32_t>(cols) * 2u);
                        }
                        bulk_commit();
                    }
                } else {
                    float* grad = static_cast<float*>(const_cast<void*>(p.ptrs[un.group]));
                    float* my_staging = staging + w * 2 * 64 * kStageRow;
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        float* buf = my_staging + (chunk_count & 1) * 64 * kStageRow;
                        if (t < 64) bulk_wait_read<1>();
                        named_barrier_sync(1 + w, 128);
#pragma unroll
                        for (int jj = 0; jj < 8; ++jj) {
                            const int j = 8 * c + jj;
                            *reinterpret_cast<float2*>(buf + lr * kStageRow + 8 * jj + lc) =
                                make_float2(acc[4 * j], acc[4 * j + 1]);
                            *reinterpret_cast<float2*>(buf + (lr + 8) * kStageRow + 8 * jj + lc) =
                                make_float2(acc[4 * j + 2], acc[4 * j + 3]);
                        }
                        fence_proxy_async_smem();
                        named_barrier_sync(1 + w, 128);
                        if (t < 64) {
                            const int m = un.row0 + 64 * w + t;
                            const int n = un.col0 + 64 * c;
                            const int cols = min(64, p.N - n);
                            if (m < p.M && cols > 0) {
                                if (p.accumulate)
                                    bulk_reduce_add_f32(grad + static_cast<size_t>(m) * p.N + n, buf + t * kStageRow,
                                                        static_cast<uint32_t>(cols) * 4u);
                                else
                                    bulk_store(grad + static_cast<size_t>(m) * p.N + n, buf + t * kStageRow,
                                               static_cast<uint32_t>(cols) * 4u);
                            }
                            bulk_commit();
                        }
                        ++chunk_count;
                    }
                }
            }
            if (t < 64) bulk_wait<0>();  // this thread's bulk copies / reductions are complete
        }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------------------------
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult q{};
        EVENEP_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, q == cudaDriverEntryPointSuccess && f != nullptr,
                          "grouped_gemm: the CUDA driver has no cuTensorMapEncodeTiled");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

// A bf16 2-D tensor map [rows][inner] with row stride `ld` elements, box {box_inner, box_rows}, 128-B swizzle.
CUtensorMap make_map(const void* base, int64_t inner, int64_t rows, int64_t ld, uint32_t box_inner, uint32_t box_rows) {
    CUtensorMap m;
    std::memset(&m, 0, sizeof(m));
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
    const cuuint32_t box[2] = {box_inner, box_rows};
    const cuuint32_t estr[2] = {1, 1};
    const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                                   estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, r == CUDA_SUCCESS, "grouped_gemm: cuTensorMapEncodeTiled failed (CUresult ",
                      static_cast<int>(r), ") for inner = ", inner, ", rows = ", rows, ", box ", box_inner, " x ",
                      box_rows);
    return m;
}

template <int kMode, bool kOutF32>
int grid_for() {
    static std::mutex mutex;
    static std::map<int, int> cache;
    int device = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(device);
    if (it != cache.end()) return it->second;
    auto kernel = gemm_kernel<kMode, kOutF32>;
    const int smem = static_cast<int>(smem_bytes(kMode, kOutF32));
    EVENEP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int sms = 0, per_sm = 0;
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    EVENEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, per_sm >= 1, "grouped_gemm (sm90): kernel does not fit on device ", device);
    cache[device] = sms * per_sm;
    return sms * per_sm;
}

template <int kMode, bool kOutF32>
void run(const LaunchArgs& a, cudaStream_t stream) {
    const int grid = grid_for<kMode, kOutF32>();
    auto* ws = static_cast<uint8_t*>(a.workspace);
    PrepareParams pp{};
    pp.cu = a.cu;
    pp.ptrs = a.ptrs;
    pp.G = a.G;
    pp.mode = kMode;
    // Wgrad is handed out longest first with either schedule (kFixed: never split); forward / dgrad kFixed statically.
    const bool by_cost = a.load_aware || kMode == kModeWgr;
    pp.order_by_cost = by_cost ? 1 : 0;
    pp.split = a.load_aware ? 1 : 0;
    pp.grid = grid;
    pp.error_word = gemm_error_word(a.workspace, a.G);
    pp.accumulate = a.accumulate ? 1 : 0;
    CUtensorMap ta, tb;
    if constexpr (kMode == kModeWgr) {
        // x [rows][M], dY [rows][N]: boxes of 64 (inner) x 64 rows.
        ta = make_map(a.x, a.M, kBk, a.M, 64, kBk);
        tb = make_map(a.dy, a.N, kBk, a.N, 64, kBk);
        pp.a_base = a.x;
        pp.b_rows = a.dy;
        pp.lda = a.M;
        pp.ldb = a.N;
        pp.n_tiles = (a.N + kBn - 1) / kBn;
        pp.m_tiles = (a.M + kBm - 1) / kBm;
    } else {
        ta = make_map(a.x, a.K, kBm, a.K, 64, kBm);
        if constexpr (kMode == kModeFwd)
            tb = make_map(a.x, a.N, a.K, a.N, 64, kBk);  // W [K][N]; address replaced per group
        else
            tb = make_map(a.x, a.K, a.N, a.K, 64, kBn);  // W [N][K] (= [in][out]); address replaced per group
        pp.a_base = a.x;
        pp.b_rows = nullptr;
        pp.lda = a.K;
        pp.n_tiles = (a.N + kBn - 1) / kBn;
        pp.k_blocks = (a.K + kBk - 1) / kBk;
    }
    prepare_kernel<<<1, 1024, 0, stream>>>(ta, tb, pp, ws);
    EVENEP_CUDA_CHECK(cudaGetLastError());
    GemmParams gp{};
    gp.ws = ws;
    gp.cu = a.cu;
    gp.ptrs = a.ptrs;
    gp.y = a.y;
    gp.G = a.G;
    gp.K = a.K;
    gp.N = a.N;
    gp.M = a.M;
    gp.dynamic = by_cost ? 1 : 0;
    gp.accumulate = a.accumulate ? 1 : 0;
    gemm_kernel<kMode, kOutF32><<<grid, kThreads, smem_bytes(kMode, kOutF32), stream>>>(gp);
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t workspace_bytes(int G) {
    return maps_bytes(G) + sizeof(Header) + sizeof(int32_t) * (static_cast<size_t>(G) + 1) +
           sizeof(Segment) * max_segments(G) + sizeof(int32_t) * (max_segments(G) + 1);
}

bool supported() {
    static std::mutex mutex;
    static std::map<int, bool> cache;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(device);
    if (it != cache.end()) return it->second;
    int major = 0, minor = 0;
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    const bool ok = major == 9 && minor == 0;
    cache[device] = ok;
    return ok;
}

GemmCostModel cost_model() {
    return GemmCostModel{kCostTileUs, kCostTileWgradUs, kCostKBlockUs, kCostKBlockWgradUs, kSplitFraction,
                         kCostModelSource};
}

void launch(const LaunchArgs& a, cudaStream_t stream) {
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.workspace) % 128 == 0, "grouped_gemm: workspace must be 128-byte aligned");
    EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0, "grouped_gemm: x must be 16-byte aligned");
    EVENEP_CHECK(a.mode == 2 || reinterpret_cast<uintptr_t>(a.y) % 16 == 0, "grouped_gemm: y must be 16-byte aligned");
    switch (a.mode) {
        case 0:
            if (a.y_fp32)
                run<kModeFwd, true>(a, stream);
            else
                run<kModeFwd, false>(a, stream);
            break;
        case 1:
            if (a.y_fp32)
                run<kModeDgr, true>(a, stream);
            else
                run<kModeDgr, false>(a, stream);
            break;
        default:
            EVENEP_CHECK(reinterpret_cast<uintptr_t>(a.dy) % 16 == 0, "grouped_gemm_wgrad: dy must be 16-byte aligned");
            run<kModeWgr, true>(a, stream);
            break;
    }
}

int grid_blocks(int mode) {
    return mode == 0 ? grid_for<kModeFwd, false>() : mode == 1 ? grid_for<kModeDgr, false>() : grid_for<kModeWgr, true>();
}

}  // namespace evenep::cuda::sm90
