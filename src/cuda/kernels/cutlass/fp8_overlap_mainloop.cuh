// src/cuda/kernels/cutlass/fp8_overlap_mainloop.cuh — EvenEP's consumer loop for CUTLASS's Hopper blockwise-scaled
// FP8 ptr-array mainloop: the same collective (TMA loads, scale loads, shared memory, pipeline, tensor maps: all
// inherited), with mma() replaced so that the promotion of one k-tile's partial sums overlaps the next k-tile's
// wgmma.
//
// Why: CUTLASS's blockwise consumer issues a k-tile's wgmma batch into a partial accumulator, waits for it to finish
// (warpgroup_wait<0>), then adds partial * scale into the fp32 accumulator (64 FFMAs a thread on a 64 x 128
// warpgroup tile) before it issues the next batch; in the cooperative schedule both consumer warpgroups do so in step,
// so the tensor cores idle for every promotion and every pipeline refill. Here two partial accumulators alternate: the
// batch of k-tile t+1 is committed before the partial of k-tile t is promoted (warpgroup_wait<1>), so one wgmma batch
// is always in flight while the CUDA cores scale. Costs 64 more registers a thread (accumulator + two partials = 192
// of the consumer's 232 on a 64 x 128 warpgroup tile).
//
// Same arithmetic as CUTLASS's loop, in the same order: accum += partial_t * (sx[row] * sw), k-tile by k-tile, the
// partial of each k-tile summed by the tensor cores from zero. Supports what the forward and dgrad instantiations use:
// several activation scales per tile along M, one weight scale per tile along N, one scale block per k-tile
// (static_asserts below).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace evenep::cuda::cutlass_gemm {

// The stage ring in shared memory as a consumer thread reads it: A (BLK_M, BLK_K, PIPE) and B (BLK_N, BLK_K, PIPE),
// and the block scales of thread `thread_idx`'s accumulator elements, (MMA, MMA_M, MMA_N, (MMA_K, PIPE)) like C: the
// scales viewed as (BLK_M, BLK_N, (BLK_K, PIPE)) tensors, the activation scales broadcast along N, the weight scales
// along M, then partitioned by Base's TiledMma (broadcast modes stored once), as CUTLASS's own consumer loop does.
template <class Base>
CUTLASS_DEVICE auto smem_views(typename Base::TensorStorage& shared_tensors, int thread_idx) {
    using namespace cute;
    using TileShape = typename Base::TileShape;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    using SmemLayoutSFA = typename Base::SmemLayoutSFA;
    using SmemLayoutSFB = typename Base::SmemLayoutSFB;
    Tensor sSFA =
        make_tensor(make_smem_ptr(shared_tensors.smem_SFA.data()),
                    make_layout(make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                                           make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
                                make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                                            make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
    Tensor sSFB =
        make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()),
                    make_layout(make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                                           make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
                                make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                                            make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));
    typename Base::TiledMma tiled_mma;
    return make_tuple(sA, sB, tiled_mma.get_slice(thread_idx).partition_C(sSFA),
                      tiled_mma.get_slice(thread_idx).partition_C(sSFB));
}

// Thread `thread_idx`'s warpgroup slice of `mma` (a tiled MMA of whole warpgroups), the index uniform in the warp.
template <class Mma>
CUTLASS_DEVICE auto warpgroup_slice(Mma const& mma, int thread_idx) {
    using namespace cute;
    constexpr int kWarpGroups = size(Mma{}) / cutlass::NumThreadsPerWarpGroup;
    const Layout warp_groups = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    return mma.get_slice(warp_groups(__shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0)));
}

// Commits one wgmma batch: the k-blocks of stage `stage` of the A and B fragments into `part`, summed from zero.
template <class Mma, class FragA, class FragB, class Part>
CUTLASS_DEVICE void commit_batch(Mma& mma, FragA const& tCrA, FragB const& tCrB, int stage, Part& part) {
    using namespace cute;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(part);
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), part);
        mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(part);
}

template <class Base>
struct OverlappedPromotionMainloop : Base {
    using typename Base::ElementBlockScale;
    using typename Base::MainloopPipeline;
    using typename Base::Params;
    using typename Base::PipelineState;
    using typename Base::TensorStorage;
    using typename Base::TiledMma;
    using typename Base::TileShape;

    static_assert(Base::ScaleMsPerTile > 1 && Base::ScaleNsPerTile == 1,
                  "OverlappedPromotionMainloop: per-row activation scales, one weight scale per tile along N");
    static_assert(Base::ScaleGranularityK == cute::size<2>(TileShape{}),
                  "OverlappedPromotionMainloop: one scale block per k-tile (a promotion after every k-tile)");

    // The consumer side (the kernel's two MMA warpgroups). Releases the stages of k-tiles 0 .. k_tile_count - 2, as
    // CUTLASS's loop does; the inherited mma_tail releases the last one.
    template <class FrgTensorC>
    CUTLASS_DEVICE void mma(MainloopPipeline pipeline,
                            PipelineState smem_pipe_read,
                            FrgTensorC& accum,
                            int k_tile_count,
                            int thread_idx,
                            TensorStorage& shared_tensors,
                            Params const& /*mainloop_params*/) {
        using namespace cute;
        static_assert(is_rmem<FrgTensorC>::value, "the accumulator must live in registers");

        auto [sA, sB, tCsSFA, tCsSFB] = smem_views<Base>(shared_tensors, thread_idx);
        TiledMma tiled_mma;
        auto thread_mma = warpgroup_slice(tiled_mma, thread_idx);
        Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
        Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)

        // Two partial accumulators and their combined scales sx[row] * sw, alternating between k-tiles.
        Tensor part0 = make_fragment_like(accum);
        Tensor part1 = make_fragment_like(accum);
        Tensor scale0 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));  // broadcast along N
        Tensor scale1 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
        Tensor scale_w = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

        clear(accum);
        warpgroup_fence_operand(accum);
        if (k_tile_count <= 0) return;
        PipelineState smem_pipe_release = smem_pipe_read;

        // Waits for k-tile `smem_pipe_read`, reads its scales and commits its wgmma batch into `part`.
        auto issue = [&](auto& part, auto& scale) {
            pipeline.consumer_wait(smem_pipe_read);
            const int stage = smem_pipe_read.index();
            copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), scale);
            copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), scale_w);
            commit_batch(tiled_mma, tCrA, tCrB, stage, part);
            const ElementBlockScale sw = scale_w(_0{});
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(filter_zeros(scale)); ++i) filter_zeros(scale)(i) = filter_zeros(scale)(i) * sw;
            ++smem_pipe_read;
        };
        // After the next batch is committed: waits for the previous one, frees its stage and promotes its partial.
        auto promote = [&](auto& part, auto const& scale, auto wait) {
            warpgroup_wait<decltype(wait)::value>();
            warpgroup_fence_operand(part);
            if constexpr (decltype(wait)::value == 1) {
                pipeline.consumer_release(smem_pipe_release);
                ++smem_pipe_release;
            }
            warpgroup_fence_operand(accum);
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < size(accum); ++i) accum(i) += part(i) * scale(i);
            warpgroup_fence_operand(accum);
        };

        issue(part0, scale0);
        int left = k_tile_count - 1;
        CUTLASS_PRAGMA_NO_UNROLL
        for (; left >= 2; left -= 2) {
            issue(part1, scale1);
            promote(part0, scale0, Int<1>{});
            issue(part0, scale0);
            promote(part1, scale1, Int<1>{});
        }
        if (left == 1) {
            issue(part1, scale1);
            promote(part0, scale0, Int<1>{});
            promote(part1, scale1, Int<0>{});
        } else {
            promote(part0, scale0, Int<0>{});
        }
    }
};

// The same overlap on a wide tile (a tuning candidate, Fp8Kind::kBlockwise*Wide): the tile's N is cut into pieces of
// kPieceN columns, and the wgmma batch of each (k-tile, piece) goes into one of two piece-sized partial accumulators,
// the next piece's batch committed before the previous piece is promoted (at a k-tile's first piece the wait also
// covers the new batch: see k_tile below). On a 128 x 256 tile with 64-column pieces
// the accumulator and the two partials take 128 + 2 x 32 registers a thread, as the 128 x 128 tile's loop above, so
// that the tile reads 1.5 bytes of operands per 256 multiply-adds instead of 2 (the block-scaled kernel is held by L2
// traffic at 128 x 128: docs/fp8.md section 3). The per-element arithmetic is the loop above's: accum += partial_t *
// (sx[row] * sw[column block]), k-tile by k-tile. Needs the weight-scale block to hold whole pieces.
template <class Base, int kPieceN>
struct PiecewisePromotionMainloop : Base {
    using typename Base::ElementA;
    using typename Base::ElementAccumulator;
    using typename Base::ElementB;
    using typename Base::ElementBlockScale;
    using typename Base::MainloopPipeline;
    using typename Base::Params;
    using typename Base::PipelineState;
    using typename Base::TensorStorage;
    using typename Base::TiledMma;
    using typename Base::TileShape;

    static constexpr int kTileN = cute::size<1>(TileShape{});
    static constexpr int kPieces = kTileN / kPieceN;
    static_assert(kTileN % kPieceN == 0 && kPieces % 2 == 0,
                  "PiecewisePromotionMainloop: an even number of pieces along the tile's N");
    static_assert(Base::ScaleGranularityN % kPieceN == 0,
                  "PiecewisePromotionMainloop: a piece must lie in one weight-scale block");
    static_assert(Base::ScaleMsPerTile > 1, "PiecewisePromotionMainloop: per-row activation scales");
    static_assert(Base::ScaleGranularityK == cute::size<2>(TileShape{}),
                  "PiecewisePromotionMainloop: one scale block per k-tile (a promotion after every k-tile)");
    static constexpr int kWarpGroups = cute::size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    // A warpgroup's 64 x kPieceN wgmma, the warpgroups stacked along M as in TiledMma.
    using PieceMma = decltype(cute::make_tiled_mma(
        cute::GMMA::ss_op_selector<ElementA,
                                   ElementB,
                                   ElementAccumulator,
                                   cute::Shape<cute::_64, cute::Int<kPieceN>, cute::_128>>(),
        cute::Layout<cute::Shape<cute::Int<kWarpGroups>, cute::_1, cute::_1>>{}));

    template <class FrgTensorC>
    CUTLASS_DEVICE void mma(MainloopPipeline pipeline,
                            PipelineState smem_pipe_read,
                            FrgTensorC& accum,
                            int k_tile_count,
                            int thread_idx,
                            TensorStorage& shared_tensors,
                            Params const& /*mainloop_params*/) {
        using namespace cute;
        static_assert(is_rmem<FrgTensorC>::value, "the accumulator must live in registers");

        auto [sA, sB, tCsSFA, tCsSFB] = smem_views<Base>(shared_tensors, thread_idx);
        Tensor sBp = flat_divide(sB, Shape<Int<kPieceN>>{});  // (kPieceN, kPieces, BLK_K, PIPE)
        PieceMma piece_mma;
        auto thread_piece = warpgroup_slice(piece_mma, thread_idx);
        Tensor tCrA = thread_piece.make_fragment_A(thread_piece.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)

        // Two piece-sized partials; piece q of the tile is accum(q * kPieceVals + j), j < kPieceVals (the wgmma
        // accumulator orders a thread's values by 8-column group last, so a piece's are contiguous).
        Tensor part0 = partition_fragment_C(piece_mma, Shape<Int<size<0>(TileShape{})>, Int<kPieceN>>{});
        Tensor part1 = make_fragment_like(part0);
        constexpr int kPieceVals = decltype(size(part0))::value;
        static_assert(decltype(size(accum))::value == kPieces * kPieceVals,
                      "PiecewisePromotionMainloop: the accumulator must be the pieces' partials side by side");
        Tensor sfa = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
        Tensor sfb = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

        clear(accum);
        warpgroup_fence_operand(accum);
        if (k_tile_count <= 0) return;
        PipelineState smem_pipe_release = smem_pipe_read;

        // Commits piece q of the current k-tile (stage) into `part`.
        auto issue = [&](auto& part, int stage, auto q) {
            commit_batch(piece_mma, tCrA, thread_piece.make_fragment_B(thread_piece.partition_B(sBp(_, q, _, _))), stage,
                         part);
        };
        // Waits for every batch but the last committed one, then adds piece q's partial times its scales.
        auto promote = [&](auto& part, auto q, auto wait) {
            warpgroup_wait<decltype(wait)::value>();
            warpgroup_fence_operand(part);
            warpgroup_fence_operand(accum);
            constexpr int base = decltype(q)::value * kPieceVals;
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < kPieceVals; ++j) accum(base + j) += part(j) * (sfa(base + j) * sfb(base + j));
            warpgroup_fence_operand(accum);
        };

        // One k-tile: its pieces in turn, each committed before the previous piece (for piece 0: the last of the
        // previous k-tile, `first` false) is promoted. The first k-tile is peeled off, so that the loop body is the
        // same on every trip.
        auto k_tile = [&](auto first) {
            pipeline.consumer_wait(smem_pipe_read);
            const int stage = smem_pipe_read.index();
            issue(part0, stage, Int<0>{});
            // The last piece of the previous k-tile, then its stage is free. It waits for piece 0 too (wait<0>): with
            // a batch in flight across the loop's back edge ptxas serialises every wgmma of the loop (C7514).
            if constexpr (!decltype(first)::value) {
                promote(part1, Int<kPieces - 1>{}, Int<0>{});
                pipeline.consumer_release(smem_pipe_release);
                ++smem_pipe_release;
            }
            copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), sfa);
            copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), sfb);
            for_each(make_int_sequence<kPieces - 1>{}, [&](auto p) {  // pieces 1 .. kPieces-1
                constexpr int q = decltype(p)::value + 1;
                if constexpr (q % 2 == 1) {
                    issue(part1, stage, Int<q>{});
                    promote(part0, Int<q - 1>{}, Int<1>{});
                } else {
                    issue(part0, stage, Int<q>{});
                    promote(part1, Int<q - 1>{}, Int<1>{});
                }
            });
            ++smem_pipe_read;
        };
        k_tile(cute::true_type{});
        CUTLASS_PRAGMA_NO_UNROLL
        for (int t = 1; t < k_tile_count; ++t) k_tile(cute::false_type{});
        promote(part1, Int<kPieces - 1>{}, Int<0>{});
    }
};

}  // namespace evenep::cuda::cutlass_gemm
