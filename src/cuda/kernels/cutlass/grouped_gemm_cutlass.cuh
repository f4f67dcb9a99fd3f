// src/cuda/kernels/cutlass/grouped_gemm_cutlass.cuh — the CUTLASS grouped GEMM instantiations behind
// grouped_gemm_cutlass.hpp. Included only by the grouped_gemm_cutlass_<op>_<schedule>.cu files, each of which
// instantiates one (op, schedule) pair: each pulls in all of CUTLASS and takes about a minute to compile.
//
// The GEMM is CUTLASS 3.x's Hopper ptr-array grouped GEMM (GemmUniversal over a GroupProblemShape, TMA loads and
// stores, wgmma, persistent warp-specialised blocks, per-group tensor maps rewritten on the device), built through
// CUTLASS's collective builders. Problem shapes, pointers and strides stay on the device: a one-block prepare kernel
// on the same stream writes them from cu_seqlens and the pointer table, so nothing is synchronised and the call is
// graph capturable. Per op (D[M, N] = A[M, K] B[K, N], CUTLASS's names):
//   forward  M = rows_g, N = out, K = in:   A = x rows (K-major), B = W_g [in][out] (N-major), D = y rows (bf16)
//   dgrad    M = rows_g, N = in,  K = out:  A = dY rows (K-major), B = W_g read as [out][in] (K-major), D = dX rows
//            (bf16, or fp32: the y_fp32 instantiation)
//   wgrad    M = in, N = out, K = rows_g:   A = x rows read transposed (M-major), B = dY rows (N-major),
//            C = D = dW_g (fp32, in place; beta = 1 accumulates, beta = 0 overwrites)
// A group without rows, with a null pointer or with a pointer that is not 16-byte aligned (rejected, reported in
// the error word) gets M = 0: no tile.
//
// Load-aware order: CUTLASS's group scheduler (PersistentTileSchedulerSm90Group) deals the tiles of the problem
// list, in list order, round-robin to the persistent blocks. With kLoadAware the prepare kernel permutes the groups
// in that list by the calibrated cost model (GemmCostModel; evenep/detail/gemm_cost.hpp): wgrad groups by decreasing
// unit (tile) cost, forward / dgrad by decreasing group cost, ties by index — so every round of tiles dealt to the
// SMs costs about the same and the short tiles fill the tail. A custom CUTLASS tile scheduler (dynamic hand-out,
// wgrad row splitting as the hand-written kernel does) is not done: the permutation is EvenEP's schedule here.
// (CUTLASS 4.2's ptr-array kernels already run the group scheduler on a producer warp of its own that hands each work
// tile to the other warps through a shared-memory pipeline, so a scheduler that claims tiles from a global counter
// fits there: a TileSchedulerSelector specialisation for this ProblemShape, its counter in the scheduler workspace.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/cutlass/grouped_gemm_cutlass.hpp"
#include "cuda/kernels/grouped_gemm_sm90.hpp"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/detail/gemm_cost.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda::cutlass_gemm {
namespace {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using ProblemMnk = ProblemShape::UnderlyingProblemShape;

// The group scheduler's raster order (its swizzle stays 1: with the shapes on the device only it has no grid to
// swizzle over): M-fastest walks down a group's row tiles with one weight column tile shared, N-fastest across the
// weight's column tiles with one row tile shared. Which keeps more of a call's operands in L2 depends on the groups'
// heights (EVENEP_CUTLASS_RASTER measures both).
template <class Arguments>
void set_raster_order(Arguments& args, bool along_n) {
    using Order = decltype(args.scheduler.raster_order);
    args.scheduler.raster_order = along_n ? Order::AlongN : Order::AlongM;
}

template <class LayoutA_, class LayoutB_, class ElementC_, class ElementD_>
struct OpTypesOf {
    using LayoutA = LayoutA_;
    using LayoutB = LayoutB_;
    using ElementC = ElementC_;
    using ElementD = ElementD_;
};
template <Op kOp, bool kF32>
struct OpTypes;
template <>
struct OpTypes<Op::kForward, false>
    : OpTypesOf<cutlass::layout::RowMajor, cutlass::layout::RowMajor, void, cutlass::bfloat16_t> {};
template <bool kF32>  // fp32 output: the layer's dgrads (dh, and dg / du summed into dx afterwards)
struct OpTypes<Op::kDgrad, kF32> : OpTypesOf<cutlass::layout::RowMajor,
                                             cutlass::layout::ColumnMajor,
                                             void,
                                             std::conditional_t<kF32, float, cutlass::bfloat16_t>> {};
template <>
struct OpTypes<Op::kWgrad, false> : OpTypesOf<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float> {};

// Tiles: cooperative 128 x 256 x 64 (two consumer warpgroups of 64 x 256, the hand-written kernel's tile);
// ping-pong 128 x 128 x 64 per consumer warpgroup. Clusters of one block: clusters of two along M (B shared by TMA
// multicast, torch._grouped_mm's configuration) were 0-5% slower on the planner's rows (H100, 2026-12-07,
// docs/benchmarks.md), as they round every group's M-tiles up to an even count.
using Cluster1 = cute::Shape<cute::_1, cute::_1, cute::_1>;
template <Schedule kSchedule>
struct ScheduleTypes;
template <>
struct ScheduleTypes<Schedule::kCooperative> {
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
    using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
    using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
};
template <>
struct ScheduleTypes<Schedule::kPingpong> {
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
    using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
    using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
};

template <class Element>
constexpr int alignment_of(int fallback) {
    if constexpr (std::is_void_v<Element>) {
        return fallback;
    } else {
        return 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte accesses (TMA)
    }
}

inline constexpr size_t kTableAlign = 128;  // CUtensorMap needs 64; CUTLASS's workspace follows the tables

// Consecutive device tables at the front of the workspace, each aligned to kTableAlign. The base may be null
// (sizing only: the offsets are what counts).
class TableCarver {
  public:
    explicit TableCarver(void* base) : base_(reinterpret_cast<uintptr_t>(base)) {}
    template <class T>
    T* take(int n) {
        const uintptr_t p = base_ + off_;
        off_ += detail::align_up(static_cast<size_t>(n) * sizeof(T), kTableAlign);
        return reinterpret_cast<T*>(p);
    }
    uint8_t* end() const { return reinterpret_cast<uint8_t*>(base_ + off_); }
    size_t bytes() const { return off_; }

  private:
    uintptr_t base_;
    size_t off_ = 0;
};

// The per-group tables of every CUTLASS grouped GEMM call (in problem-list order). ElementC void: no C operand (its
// table holds null pointers).
template <class ElementAB, class ElementC, class ElementD, class StrideA, class StrideB, class StrideC, class StrideD>
struct GroupTables {
    using PtrC = std::conditional_t<std::is_void_v<ElementC>, const void*, const ElementC*>;
    ProblemMnk* shapes;
    const ElementAB** a;
    const ElementAB** b;
    ElementD** d;
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
    PtrC* c;
    StrideC* sc;
    void take(TableCarver& carver, int G) {
        shapes = carver.take<ProblemMnk>(G);
        a = carver.take<const ElementAB*>(G);
        b = carver.take<const ElementAB*>(G);
        d = carver.take<ElementD*>(G);
        sa = carver.take<StrideA>(G);
        sb = carver.take<StrideB>(G);
        sd = carver.take<StrideD>(G);
        c = carver.take<PtrC>(G);
        sc = carver.take<StrideC>(G);
    }
};

template <Op kOp, Schedule kSchedule, bool kF32>
struct Instance {
    using Types = OpTypes<kOp, kF32>;
    using Sched = ScheduleTypes<kSchedule>;
    using ElementAB = cutlass::bfloat16_t;
    using ElementAcc = float;
    using ElementC = typename Types::ElementC;
    using ElementD = typename Types::ElementD;
    using LayoutCD = cutlass::layout::RowMajor;
    using ClusterShape = Cluster1;
    static constexpr int kAlignAB = alignment_of<ElementAB>(0);
    static constexpr int kAlignD = alignment_of<ElementD>(0);
    static constexpr int kAlignC = alignment_of<ElementC>(kAlignD);

    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90,
        cutlass::arch::OpClassTensorOp,
        typename Sched::Tile,
        ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto,
        ElementAcc,
        ElementAcc,
        ElementC,
        LayoutCD*,
        kAlignC,
        ElementD,
        LayoutCD*,
        kAlignD,
        typename Sched::Epilogue,
        cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAcc, ElementC, ElementAcc>>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90,
        cutlass::arch::OpClassTensorOp,
        ElementAB,
        typename Types::LayoutA*,
        kAlignAB,
        ElementAB,
        typename Types::LayoutB*,
        kAlignAB,
        ElementAcc,
        typename Sched::Tile,
        ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        typename Sched::Kernel>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideC = typename Kernel::InternalStrideC;
    using StrideD = typename Kernel::InternalStrideD;

    // The per-group tables at the front of the workspace (in problem-list order), then CUTLASS's workspace.
    struct Tables : GroupTables<ElementAB, ElementC, ElementD, StrideA, StrideB, StrideC, StrideD> {
        uint8_t* cutlass_workspace;
    };
    static Tables carve(void* workspace, int G, size_t* bytes = nullptr) {
        TableCarver carver(workspace);
        Tables t{};
        t.take(carver, G);
        t.cutlass_workspace = carver.end();
        if (bytes != nullptr) *bytes = carver.bytes();
        return t;
    }

    static typename Gemm::Arguments arguments(
        const Tables& t, int G, float beta, int device, int sm_count, bool along_n = false) {
        typename Gemm::Arguments args{};
        set_raster_order(args, along_n);
        args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
        args.problem_shape = {G, t.shapes, nullptr};  // device-side shapes only (no host copy: no sync)
        args.mainloop = {t.a, t.sa, t.b, t.sb};
        args.epilogue.thread.alpha = 1.0f;
        args.epilogue.thread.beta = beta;
        args.epilogue.ptr_C = reinterpret_cast<decltype(args.epilogue.ptr_C)>(t.c);
        args.epilogue.dC = t.sc;
        args.epilogue.ptr_D = t.d;
        args.epilogue.dD = t.sd;
        args.hw_info.device_id = device;
        args.hw_info.sm_count = sm_count;
        return args;
    }
};

// The groups of one call and their order in the problem list (device side, shared by every prepare kernel).
struct GroupOrder {
    const int32_t* cu;
    const void* const* ptrs;  // weights or gradients: null = skipped group
    int G;
    int k_blocks;  // forward / dgrad: k-blocks of the inner dimension
    int wgrad;
    int load_aware;
    float c_tile, c_kblock;  // the cost model of this op

    __device__ int rows(int g) const { return cu[g] - (g == 0 ? 0 : cu[g - 1]); }
    __device__ int begin(int g) const { return g == 0 ? 0 : cu[g - 1]; }
    // Rows that get tiles: 0 when empty, null or rejected (TMA needs 16-byte aligned bases).
    __device__ int valid_rows(int g) const {
        const int r = rows(g);
        return r > 0 && ptrs[g] != nullptr && (reinterpret_cast<uintptr_t>(ptrs[g]) & 15u) == 0 ? r : 0;
    }
    // A group with rows whose pointer is not 16-byte aligned: recorded as G - g (the first one wins), 0 = none.
    __device__ void record_rejected(int g, int32_t* error_word) const {
        if (rows(g) > 0 && ptrs[g] != nullptr && valid_rows(g) == 0) atomicMax(error_word, G - g);
    }
    // The cost model's sort key: wgrad unit (tile) cost, forward / dgrad group cost; -1 without tiles.
    __device__ float key(int g) const {
        const int r = valid_rows(g);
        if (r == 0) return -1.0f;
        const int kb = detail::gemm_group_k_blocks(wgrad != 0, r, k_blocks);
        if (wgrad) return detail::gemm_unit_cost_us(kb, c_tile, c_kblock);
        return detail::gemm_group_cost_us(detail::gemm_group_units(false, r, 0, 1), kb, c_tile, c_kblock);
    }
    // Position of group g in the problem list: index order, or (load_aware) a stable rank sort by decreasing key
    // (O(G) per group).
    __device__ int position(int g) const {
        if (!load_aware) return g;
        const float kg = key(g);
        int pos = 0;
        for (int h = 0; h < G; ++h) {
            const float kh = key(h);
            pos += (kh > kg) || (kh == kg && h < g);
        }
        return pos;
    }
};

// `inner`: the inner dimension of forward / dgrad (k-blocks of the cost model).
GroupOrder make_group_order(const int32_t* cu,
                            const void* const* ptrs,
                            int G,
                            int inner,
                            bool wgrad,
                            bool load_aware,
                            const GemmCostModel& cost) {
    return GroupOrder{cu,
                      ptrs,
                      G,
                      static_cast<int>(detail::ceil_div(inner, detail::kGemmKBlock)),
                      wgrad ? 1 : 0,
                      load_aware ? 1 : 0,
                      wgrad ? cost.c_tile_wgrad : cost.c_tile,
                      wgrad ? cost.c_kblock_wgrad : cost.c_kblock};
}

template <class I>
struct PrepareParams {
    GroupOrder order;
    const uint16_t* x;   // A rows: x (forward, wgrad) or dY (dgrad)
    const uint16_t* dy;  // wgrad: B rows
    void* y;             // forward / dgrad output
    int in_dim;
    int out_dim;
    typename I::StrideA sa;
    typename I::StrideB sb;
    typename I::StrideC sc;
    typename I::StrideD sd;
    typename I::Tables t;
    int32_t* error_word;
};

// One block: the error word, then each group's entry at its position in the problem list.
template <Op kOp, Schedule kSchedule, bool kF32>
__global__ void __launch_bounds__(1024) prepare_kernel(PrepareParams<Instance<kOp, kSchedule, kF32>> p) {
    using I = Instance<kOp, kSchedule, kF32>;
    if (threadIdx.x == 0) *p.error_word = 0;
    __syncthreads();
    const GroupOrder& o = p.order;
    for (int g = threadIdx.x; g < o.G; g += blockDim.x) {
        o.record_rejected(g, p.error_word);
        const int r = o.valid_rows(g);
        const int pos = o.position(g);
        const int64_t begin = o.begin(g);
        const auto* ab = reinterpret_cast<const typename I::ElementAB*>(p.x);
        if constexpr (kOp == Op::kWgrad) {
            const auto* bb = reinterpret_cast<const typename I::ElementAB*>(p.dy);
            auto* grad = r > 0 ? static_cast<float*>(const_cast<void*>(o.ptrs[g])) : nullptr;
            p.t.shapes[pos] = ProblemMnk{r > 0 ? p.in_dim : 0, p.out_dim, r};
            p.t.a[pos] = ab + begin * p.in_dim;
            p.t.b[pos] = bb + begin * p.out_dim;
            p.t.c[pos] = grad;
            p.t.d[pos] = grad;
        } else {
            const int n = kOp == Op::kForward ? p.out_dim : p.in_dim;
            const int k = kOp == Op::kForward ? p.in_dim : p.out_dim;
            p.t.shapes[pos] = ProblemMnk{r, n, k};
            p.t.a[pos] = ab + begin * k;
            p.t.b[pos] = r > 0 ? static_cast<const typename I::ElementAB*>(o.ptrs[g]) : ab;
            p.t.c[pos] = nullptr;
            p.t.d[pos] = static_cast<typename I::ElementD*>(p.y) + begin * n;
        }
        p.t.sa[pos] = p.sa;
        p.t.sb[pos] = p.sb;
        p.t.sc[pos] = p.sc;
        p.t.sd[pos] = p.sd;
    }
}

// Runs a CUTLASS grouped GEMM (GemmUniversalAdapter) on arguments whose device tables the prepare kernel writes.
template <class Gemm>
void run_gemm(const typename Gemm::Arguments& args, void* cutlass_workspace, const char* what, cudaStream_t stream) {
    Gemm gemm;
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, gemm.can_implement(args) == cutlass::Status::kSuccess, what,
                      " (CUTLASS): the kernel cannot run these arguments");
    const cutlass::Status init = gemm.initialize(args, cutlass_workspace, stream);
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, init == cutlass::Status::kSuccess, what,
                      " (CUTLASS): initialize failed: ", cutlass::cutlassGetStatusString(init));
    const cutlass::Status run = gemm.run(stream);
    EVENEP_CHECK_KIND(ErrorKind::kRuntime, run == cutlass::Status::kSuccess, what,
                      " (CUTLASS): launch failed: ", cutlass::cutlassGetStatusString(run));
    EVENEP_CUDA_CHECK(cudaGetLastError());
}

int current_device() {
    int device = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&device));
    return device;
}

}  // namespace

template <Op kOp, Schedule kSchedule, bool kF32>
size_t instance_workspace_bytes(int num_groups, int sm_count) {
    using I = Instance<kOp, kSchedule, kF32>;
    size_t tables = 0;
    const typename I::Tables t = I::carve(nullptr, num_groups, &tables);
    const auto args = I::arguments(t, num_groups, 0.0f, 0, sm_count);  // the raster order does not size it
    return tables + I::Gemm::get_workspace_size(args);
}

template <Op kOp, Schedule kSchedule, bool kF32>
void instance_launch(const LaunchArgs& a, int sm_count, cudaStream_t stream) {
    using I = Instance<kOp, kSchedule, kF32>;
    const int G = a.num_groups;
    const typename I::Tables t = I::carve(a.workspace, G);

    // Strides: the same for every group (in and out are the call's).
    const int in = a.in_dim, out = a.out_dim;
    PrepareParams<I> p{};
    p.order =
        make_group_order(a.cu, a.ptrs, G, kOp == Op::kForward ? in : out, kOp == Op::kWgrad, a.load_aware, a.cost);
    p.x = a.x;
    p.dy = a.dy;
    p.y = a.y;
    p.in_dim = in;
    p.out_dim = out;
    // make_cute_packed_stride reads the (M, K, L) / (N, K, L) / (M, N, L) extents that set the one run-time stride;
    // the group's own extent (rows) never enters it, so 1 stands in for it.
    if constexpr (kOp == Op::kForward) {
        p.sa = cutlass::make_cute_packed_stride(typename I::StrideA{}, {1, in, 1});
        p.sb = cutlass::make_cute_packed_stride(typename I::StrideB{}, {out, in, 1});
        p.sc = cutlass::make_cute_packed_stride(typename I::StrideC{}, {1, out, 1});
        p.sd = cutlass::make_cute_packed_stride(typename I::StrideD{}, {1, out, 1});
    } else if constexpr (kOp == Op::kDgrad) {
        p.sa = cutlass::make_cute_packed_stride(typename I::StrideA{}, {1, out, 1});
        p.sb = cutlass::make_cute_packed_stride(typename I::StrideB{}, {in, out, 1});
        p.sc = cutlass::make_cute_packed_stride(typename I::StrideC{}, {1, in, 1});
        p.sd = cutlass::make_cute_packed_stride(typename I::StrideD{}, {1, in, 1});
    } else {
        p.sa = cutlass::make_cute_packed_stride(typename I::StrideA{}, {in, 1, 1});
        p.sb = cutlass::make_cute_packed_stride(typename I::StrideB{}, {out, 1, 1});
        p.sc = cutlass::make_cute_packed_stride(typename I::StrideC{}, {in, out, 1});
        p.sd = cutlass::make_cute_packed_stride(typename I::StrideD{}, {in, out, 1});
    }
    p.t = t;
    p.error_word = gemm_error_word(a.workspace, G);
    prepare_kernel<kOp, kSchedule, kF32><<<1, 1024, 0, stream>>>(p);
    EVENEP_CUDA_CHECK(cudaGetLastError());
    const float beta = kOp == Op::kWgrad && a.accumulate ? 1.0f : 0.0f;
    run_gemm<typename I::Gemm>(I::arguments(t, G, beta, current_device(), sm_count, a.raster_along_n),
                               t.cutlass_workspace, kOp == Op::kWgrad ? "grouped_gemm_wgrad" : "grouped_gemm", stream);
}

}  // namespace evenep::cuda::cutlass_gemm
