// src/cuda/kernels/cutlass/grouped_gemm_cutlass_fp8.cuh — the FP8 CUTLASS grouped GEMM instantiations behind
// evenep::cuda::grouped_gemm_fp8 (grouped_gemm_cutlass.hpp, Fp8Kind). Included only by the
// grouped_gemm_cutlass_fp8_<kind>.cu files, one instantiation each.
//
// D[M, N] = A[M, K] B[K, N] with A = the e4m3 rows (K-major), B = the e4m3 weights read K-major (forward: W^T
// [out][in]; dgrad: W [in][out]), D bf16, fp32 accumulation. fp8 wgmma reads only K-major operands from shared
// memory, hence the forward's transposed weight copy.
//   block-scaled  CUTLASS's Hopper blockwise-scaling mainloop (KernelPtrArrayTmaWarpSpecializedCooperativeFP8-
//                 Blockwise): scale granularity 1 (M) x 128 (N) x 128 (K); every 128-deep k-block's wgmma partial
//                 sums are promoted into the fp32 accumulators times sx[m, kb] * sw[kb, nb]. Tile 128 x 128 x 128
//                 (the k-tile is one scale block). The forward and dgrad (kBlockwiseForward / kBlockwiseDgrad) run
//                 it with CUTLASS's consumer loop; kBlockwiseForwardOverlap / kBlockwiseDgradOverlap with EvenEP's
//                 (fp8_overlap_mainloop.cuh: the promotion of one k-tile overlaps the next one's wgmma;
//                 grouped_gemm_fp8 picks by the output's width, Fp8Mainloop). The wgrad (kBlockwiseWgrad) scales per
//                 channel on both sides. SFA (activations, [rows][K/128]) is K-major; SFB (weights, [in/128][out/128])
//                 is N-major in the forward (K = in runs down the rows) and K-major in dgrad.
//   unscaled      CUTLASS's FP8 ptr-array grouped GEMM with fast accumulation (KernelPtrArrayTmaWarpSpecialized-
//                 CooperativeFP8FastAccum), tile 128 x 256 x 128: the speed anchor of the scaled kernel.
// Problem list, order and the error word as in grouped_gemm_cutlass.cuh (GroupOrder).
#pragma once

#include "cuda/kernels/cutlass/fp8_overlap_mainloop.cuh"
#include "cuda/kernels/cutlass/grouped_gemm_cutlass.cuh"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "evenep/detail/fp8.hpp"

namespace evenep::cuda::cutlass_gemm {
namespace {

// The block-scaled kernel: cooperative, 128 x 128 x 128 (the k-tile is one scale block; the per-k-block promotion
// holds a second fp32 accumulator, so 128 x 256 would not fit the registers). A ping-pong 64 x 128 x 128 and clusters
// of two along M were measured slower (H100, 2026-12-07, docs/benchmarks.md).
struct Fp8ScaledTypes {
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
    using Tile = cute::Shape<cute::_128, cute::_128, cute::_128>;
};
// The wide-tile candidate (Fp8Kind::kBlockwise*Wide): 128 x 256 x 128 with EvenEP's piecewise consumer loop, whose
// partials are a quarter of the tile wide (PiecewisePromotionMainloop), so that it fits the registers.
struct Fp8WideTypes {
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
    using Tile = cute::Shape<cute::_128, cute::_256, cute::_128>;
};
// The unscaled anchor: cooperative, 128 x 256 x 128, fast accumulation.
struct Fp8UnscaledTypes {
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum;
    using Tile = cute::Shape<cute::_128, cute::_256, cute::_128>;
};

template <Fp8Kind kKind>
struct Fp8Instance {
    static constexpr bool kScaled = kKind != Fp8Kind::kUnscaled;
    static constexpr bool kWgrad = kKind == Fp8Kind::kBlockwiseWgrad;
    static constexpr bool kDgradScales = kKind == Fp8Kind::kBlockwiseDgrad ||
                                         kKind == Fp8Kind::kBlockwiseDgradOverlap ||
                                         kKind == Fp8Kind::kBlockwiseDgradWide;
    static constexpr bool kWide = kKind == Fp8Kind::kBlockwiseForwardWide || kKind == Fp8Kind::kBlockwiseDgradWide;
    // EvenEP's consumer loop (fp8_overlap_mainloop.cuh) on the *Overlap kinds; CUTLASS's own elsewhere.
    static constexpr bool kOverlap =
        kKind == Fp8Kind::kBlockwiseForwardOverlap || kKind == Fp8Kind::kBlockwiseDgradOverlap;
    using Sched =
        std::conditional_t<kWide, Fp8WideTypes, std::conditional_t<kScaled, Fp8ScaledTypes, Fp8UnscaledTypes>>;
    using ElementAB = cutlass::float_e4m3_t;
    using ElementAcc = float;
    // wgrad: D = C = the fp32 gradient (beta 1 accumulates); forward / dgrad: bf16 D, no C.
    using ElementD = std::conditional_t<kWgrad, float, cutlass::bfloat16_t>;
    using ElementC = std::conditional_t<kWgrad, float, void>;
    using ElementScale = float;
    using LayoutA = cutlass::layout::RowMajor;     // K-major rows
    using LayoutB = cutlass::layout::ColumnMajor;  // K-major weights
    using LayoutD = cutlass::layout::RowMajor;
    using ClusterShape = Cluster1;
    using Tile = typename Sched::Tile;
    using KernelSchedule = typename Sched::Kernel;
    // Forward / dgrad: activations 1 x 128 (K-major [rows][K/128]), weights 128 x 128 ([in/128][out/128]: N-major in
    // the forward, K-major in dgrad). Wgrad: one scale per channel and 128-row block on both sides, MN-major
    // ([blocks][in] and [blocks][out], the wgrad cols layout).
    using ScaleConfig =
        cutlass::detail::Sm90BlockwiseScaleConfig<1,
                                                  kWgrad ? 1 : 128,
                                                  128,
                                                  kWgrad ? cute::GMMA::Major::MN : cute::GMMA::Major::K,
                                                  kDgradScales ? cute::GMMA::Major::K : cute::GMMA::Major::MN>;
    using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
    using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
    static constexpr int kAlignAB = 16;                                      // 16 bytes of e4m3
    static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));  // 16 bytes
    static constexpr int kAlignC = kAlignD;                                  // wgrad: C is D

    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90,
        cutlass::arch::OpClassTensorOp,
        Tile,
        ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto,
        ElementAcc,
        ElementAcc,
        ElementC,
        LayoutD*,
        kAlignC,
        ElementD,
        LayoutD*,
        kAlignD,
        cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
        cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAcc, ElementC, ElementAcc>>::CollectiveOp;
    using GmemA = std::conditional_t<kScaled, cute::tuple<LayoutA*, LayoutSFA*>, LayoutA*>;
    using GmemB = std::conditional_t<kScaled, cute::tuple<LayoutB*, LayoutSFB*>, LayoutB*>;
    using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90,
        cutlass::arch::OpClassTensorOp,
        ElementAB,
        GmemA,
        kAlignAB,
        ElementAB,
        GmemB,
        kAlignAB,
        ElementAcc,
        Tile,
        ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        KernelSchedule>::CollectiveOp;
    using Mainloop =
        std::conditional_t<kWide,
                           PiecewisePromotionMainloop<CutlassMainloop, 64>,
                           std::conditional_t<kOverlap, OverlappedPromotionMainloop<CutlassMainloop>, CutlassMainloop>>;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideC = typename Kernel::InternalStrideC;
    using StrideD = typename Kernel::InternalStrideD;

    struct Tables : GroupTables<ElementAB, ElementC, ElementD, StrideA, StrideB, StrideC, StrideD> {
        const ElementScale** sfa;
        const ElementScale** sfb;
        LayoutSFA* layout_sfa;
        LayoutSFB* layout_sfb;
        uint8_t* cutlass_workspace;
    };
    // workspace may be null (sizing only).
    static Tables carve(void* workspace, int G, size_t* bytes = nullptr) {
        TableCarver carver(workspace);
        Tables t{};
        t.take(carver, G);
        t.sfa = carver.take<const ElementScale*>(G);
        t.sfb = carver.take<const ElementScale*>(G);
        t.layout_sfa = carver.take<LayoutSFA>(G);
        t.layout_sfb = carver.take<LayoutSFB>(G);
        t.cutlass_workspace = carver.end();
        if (bytes != nullptr) *bytes = carver.bytes();
        return t;
    }

    static typename Gemm::Arguments arguments(
        const Tables& t, int G, float beta, int device, int sm_count, bool along_n = false) {
        typename Gemm::Arguments args{};
        set_raster_order(args, along_n);
        args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
        args.problem_shape = {G, t.shapes, nullptr};
        if constexpr (kScaled) {
            args.mainloop = {t.a, t.sa, t.b, t.sb, t.sfa, t.layout_sfa, t.sfb, t.layout_sfb};
        } else {
            args.mainloop = {t.a, t.sa, t.b, t.sb};
        }
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

template <Fp8Kind kKind>
struct Fp8PrepareParams {
    using I = Fp8Instance<kKind>;
    GroupOrder order;
    const uint8_t* x;
    const float* x_scales;
    const float* const* weight_scales;
    uint16_t* y;
    int n_dim, k_dim;
    const uint8_t* dy;  // wgrad: dy's cols cast, x the x's; n_dim = out, k_dim = in
    const float* dy_scales;
    typename I::StrideA sa;
    typename I::StrideB sb;
    typename I::StrideC sc;
    typename I::StrideD sd;
    typename I::Tables t;
    int32_t* error_word;
};

template <Fp8Kind kKind>
__global__ void __launch_bounds__(1024) fp8_prepare_kernel(Fp8PrepareParams<kKind> p) {
    using I = Fp8Instance<kKind>;
    if (threadIdx.x == 0) *p.error_word = 0;
    __syncthreads();
    const GroupOrder& o = p.order;
    const int k_scales = p.k_dim / 128;
    for (int g = threadIdx.x; g < o.G; g += blockDim.x) {
        o.record_rejected(g, p.error_word);
        const int r = o.valid_rows(g);
        const int pos = o.position(g);
        const int64_t begin = o.begin(g);
        const auto* a = reinterpret_cast<const typename I::ElementAB*>(p.x);
        p.t.sa[pos] = p.sa;
        p.t.sb[pos] = p.sb;
        p.t.sc[pos] = p.sc;
        p.t.sd[pos] = p.sd;
        if constexpr (I::kWgrad) {
            // The operands' columns of the group start at byte `begin` of each row: TMA needs it 16-byte aligned.
            const bool aligned = begin % 16 == 0;
            if (r > 0 && !aligned) atomicMax(p.error_word, o.G - g);
            const int rw = aligned ? r : 0;
            auto* grad = rw > 0 ? static_cast<float*>(const_cast<void*>(o.ptrs[g])) : nullptr;
            const int64_t block = fp8_cols_block(begin, g);
            p.t.shapes[pos] = ProblemMnk{rw > 0 ? p.k_dim : 0, p.n_dim, rw};
            p.t.a[pos] = a + begin;
            p.t.b[pos] = reinterpret_cast<const typename I::ElementAB*>(p.dy) + begin;
            p.t.c[pos] = grad;
            p.t.d[pos] = grad;
            p.t.sfa[pos] = p.x_scales + block * p.k_dim;
            p.t.sfb[pos] = p.dy_scales + block * p.n_dim;
            const cute::Shape<int, int, int, int> mnkl{p.k_dim, p.n_dim, rw > 0 ? rw : 1, 1};
            p.t.layout_sfa[pos] = I::ScaleConfig::tile_atom_to_shape_SFA(mnkl);
            p.t.layout_sfb[pos] = I::ScaleConfig::tile_atom_to_shape_SFB(mnkl);
            continue;
        }
        p.t.shapes[pos] = ProblemMnk{r, p.n_dim, p.k_dim};
        p.t.a[pos] = a + begin * p.k_dim;
        p.t.b[pos] = r > 0 ? static_cast<const typename I::ElementAB*>(o.ptrs[g]) : a;
        p.t.c[pos] = nullptr;
        p.t.d[pos] = reinterpret_cast<typename I::ElementD*>(p.y) + begin * p.n_dim;
        if constexpr (I::kScaled) {
            p.t.sfa[pos] = p.x_scales + begin * k_scales;
            p.t.sfb[pos] = r > 0 ? p.weight_scales[g] : p.x_scales;
            const cute::Shape<int, int, int, int> mnkl{r > 0 ? r : 1, p.n_dim, p.k_dim, 1};
            p.t.layout_sfa[pos] = I::ScaleConfig::tile_atom_to_shape_SFA(mnkl);
            p.t.layout_sfb[pos] = I::ScaleConfig::tile_atom_to_shape_SFB(mnkl);
        }
    }
}

}  // namespace

template <Fp8Kind kKind>
size_t fp8_instance_workspace_bytes(int num_groups, int sm_count) {
    using I = Fp8Instance<kKind>;
    size_t tables = 0;
    const typename I::Tables t = I::carve(nullptr, num_groups, &tables);
    return tables + I::Gemm::get_workspace_size(I::arguments(t, num_groups, 0.0f, 0, sm_count));
}

template <Fp8Kind kKind>
void fp8_instance_launch(const Fp8LaunchArgs& a, int sm_count, cudaStream_t stream) {
    using I = Fp8Instance<kKind>;
    const int G = a.num_groups;
    const bool fwd = a.op == Op::kForward;
    // wgrad: M = in (k_dim below), N = out; the inner dimension is the group's rows.
    const int k = fwd || I::kWgrad ? a.in_dim : a.out_dim, n = fwd || I::kWgrad ? a.out_dim : a.in_dim;
    const typename I::Tables t = I::carve(a.workspace, G);
    Fp8PrepareParams<kKind> p{};
    p.order = make_group_order(a.cu, a.ptrs, G, k, I::kWgrad, a.load_aware, a.cost);
    p.x = a.x;
    p.x_scales = a.x_scales;
    p.weight_scales = a.weight_scales;
    p.y = a.y;
    p.n_dim = n;
    p.k_dim = k;
    p.dy = a.dy;
    p.dy_scales = a.dy_scales;
    if constexpr (I::kWgrad) {
        // K-major A = x cols [in][ld], K-major B = dy cols [out][ld], row-major C = D = dW [in][out].
        const int ld = static_cast<int>(fp8_cols_ld(a.capacity));
        p.sa = cutlass::make_cute_packed_stride(typename I::StrideA{}, {k, ld, 1});
        p.sb = cutlass::make_cute_packed_stride(typename I::StrideB{}, {n, ld, 1});
        p.sc = cutlass::make_cute_packed_stride(typename I::StrideC{}, {k, n, 1});
        p.sd = cutlass::make_cute_packed_stride(typename I::StrideD{}, {k, n, 1});
    } else {
        // K-major A [rows][k], K-major B ([n][k] rows of k), row-major D [rows][n] (the group's rows do not enter).
        p.sa = cutlass::make_cute_packed_stride(typename I::StrideA{}, {1, k, 1});
        p.sb = cutlass::make_cute_packed_stride(typename I::StrideB{}, {n, k, 1});
        p.sd = cutlass::make_cute_packed_stride(typename I::StrideD{}, {1, n, 1});
    }
    p.t = t;
    p.error_word = gemm_error_word(a.workspace, G);
    fp8_prepare_kernel<kKind><<<1, 1024, 0, stream>>>(p);
    EVENEP_CUDA_CHECK(cudaGetLastError());
    const float beta = I::kWgrad && a.accumulate ? 1.0f : 0.0f;
    run_gemm<typename I::Gemm>(I::arguments(t, G, beta, current_device(), sm_count, a.raster_along_n),
                               t.cutlass_workspace, I::kWgrad ? "grouped_gemm_wgrad_fp8" : "grouped_gemm_fp8", stream);
}

}  // namespace evenep::cuda::cutlass_gemm
