// evenep/cuda/experts.hpp — expert weights, prefetch slots and gradient reduction (SPEC §4.4), on any team.
//
// Per rank one copy of a symmetric window (peers reach it through a device pointer table), with up to four
// regions, each [P][n][elems] with P projections of `elems` elements per expert (gate, up and down all have H*H'
// elements):
//   weights     [P][epn][elems] bf16   the layer's local experts (global expert e = rank*epn + local index)
//   slots       [P][B][elems]   bf16   prefetch slots      } in the ExpertPool's window, shared by the layers
//   slot_grads  [P][B][elems]   fp32   reduce buffer: weight gradients of the slots }
//   grads       [P][epn][elems] fp32   the local experts' gradients
// with_weights allocates weights + slots (prefetch), with_grads slot_grads + grads (reduce_grad); benchmarks at
// large shapes allocate one pair at a time (freed before the next) and as many projections as fit.
// FP8 (ExpertsShape::fp8, with_weights; H and H' multiples of 128; docs/fp8.md), six more regions:
//   weights8 / slots8       [P][n][elems]  e4m3  the e4m3 cast of each matrix (row-major like the bf16 one)
//   weights8t / slots8t     [P][n][elems]  e4m3  the same codes transposed, [out, in]: the forward GEMM's K-major
//                           operand (weights8t written by the cast; slots8t filled by the layer, cuda::MoeLayer)
//   weight_scales / slot_scales [P][n][sstride]  fp32 one scale per 128 x 128 block, row-major over (in block, out
//                           block); sstride = the (in/128)*(out/128) scales padded to 16 bytes
// and prefetch_weight first casts every local expert of each served rank (fp8.cu's batched weight cast, one launch
// per rank and projection writing weights8 and weights8t; the functions of evenep/detail/fp8.hpp: bitwise the CPU
// pool's ExpertWeights::cast_fp8), then copies the e4m3 codes and the scales into the slots of every copy (two
// prefetch launches, relays alike). With fp8 the bf16 slots are not filled: the FP8 GEMMs read only codes.
//
//   prefetch_weight(ep, plan)  for every slot b of every rank r with e = copies[r][b] >= 0: slots(r)[p][b] =
//                        weights of e on home(e). Owner push: each (expert, projection) tile is read from HBM once and
//                        written to every slot that holds the expert. Slots with copies = -1 are untouched. Ends with a
//                        team barrier (kPrefetchDone): every copy is visible on every rank.
//   reduce_grad(ep, plan)  team barrier (kReduceReady); every home rank h adds, for each rank r ascending and slot b
//                        ascending with home(copies[r][b]) == h, rank r's slot gradient to its local fp32 gradient of
//                        that expert (g = g + slot, fp32, in that order: deterministic) and zeroes the consumed slot;
//                        team barrier (kReduceDone). Unused slots are untouched. The CPU backend's order exactly.
// Both read the copies table from each rank's copy of the given plan in `ep` (made resident first), are collective
// on the NCCL team and graph capturable. Where this process serves every rank (the local team) and the plan has no
// relayed copy tree, they are the PyTorch ops' functions, one kernel per projection and region without a barrier
// (cuda::prefetch_copies / reduce_copies, evenep/cuda/expert_ops.hpp: the same slots and the same sums, bit for bit);
// otherwise one cooperative kernel over the ranks this process serves on the team channel `channel` (default 1, so
// that prefetch_weight may run beside dispatch on another stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "evenep/cuda/ep.hpp"

namespace evenep::cuda {

struct ExpertsShape {
    int num_projections = 3;  // 1..3
    int64_t elems = 0;        // elements of one projection of one expert (H*H')
    bool with_weights = true;
    bool with_grads = true;
    // FP8 weight copies (see the file comment): projection p is [in, out] = detail::proj_in_dim / proj_out_dim of
    // (hidden, ffn), so elems = hidden * ffn; both multiples of 128.
    bool fp8 = false;
    bool ue8m0 = false;  // with fp8: power-of-two scales
    int hidden = 0, ffn = 0;
    int64_t scale_stride() const;  // bytes of one matrix's scales, padded to 16 (fp8), else 0
};

struct ExpertsView;  // evenep/cuda/detail/launchers.hpp
class Experts;

// The prefetch slots and the reduce buffer (slots, slot_grads), shared by every layer of an Ep as cpu::ExpertPool
// is: one symmetric window of the team. Records which layer and plan its slots hold, so a layer's backward
// prefetches again only when another layer (or another plan) used the slots in between.
class ExpertPool {
  public:
    // Collective. Sized for ep's configuration (R, B) and `shape` (with_weights: slots; with_grads: slot_grads).
    // The window is freed with the pool (collective), which must not outlive ep's team.
    ExpertPool(Ep& ep, const ExpertsShape& shape);
    ExpertPool(const ExpertPool&) = delete;
    ExpertPool& operator=(const ExpertPool&) = delete;

    const ExpertsShape& shape() const { return shape_; }
    uint16_t* slot(int rank, int proj, int slot) const;  // [elems] bf16 (device pointer)
    float* slot_grad(int rank, int proj, int slot) const;
    uint8_t* slot8(int rank, int proj, int slot) const;     // [elems] e4m3 codes (shape.fp8)
    uint8_t* slot8t(int rank, int proj, int slot) const;    // [elems] their transpose (shape.fp8; the layer fills it)
    float* slot_scale(int rank, int proj, int slot) const;  // [in/128 * out/128] scales (shape.fp8)
    const Window& window() const { return *window_; }
    size_t slots_offset() const { return slots_; }
    size_t slot_grads_offset() const { return slot_grads_; }
    size_t slots8_offset() const { return slots8_; }
    size_t slot_scales_offset() const { return slot_scales_; }
    // True when the slots hold `experts`' weights as prefetched for `plan` (the last prefetch_weight into them).
    bool holds(const Experts& experts, const EpPlan& plan) const;

  private:
    friend class Experts;
    char* at(int rank, size_t region, int proj, int index, size_t elem_bytes) const;
    ExpertsShape shape_;
    int R_, B_, rank_begin_;
    size_t slots_ = 0, slot_grads_ = 0, slots8_ = 0, slot_scales_ = 0, slots8t_ = 0;
    OwnedWindow window_;
    const Experts* filled_by_ = nullptr;  // the last prefetch_weight's layer and plan
    uint64_t filled_plan_ = 0;
};

// One layer's expert weights and gradients (weights, grads) in a symmetric window of ep's team, with the slots and
// reduce buffer of an ExpertPool (works on either team).
class Experts {
  public:
    // Collective. Sized for ep's configuration (R, epn, B). Everything starts at zero. Without a pool the layer
    // gets a pool of its own; with one, `pool` (same shape, same Ep) must outlive the layer. The windows are freed
    // with the layer (collective; the layer's own pool after the layer's window), which must not outlive ep's team.
    Experts(Ep& ep, const ExpertsShape& shape);
    Experts(Ep& ep, ExpertPool& pool, const ExpertsShape& shape);
    ~Experts() = default;
    Experts(const Experts&) = delete;
    Experts& operator=(const Experts&) = delete;

    const ExpertsShape& shape() const { return shape_; }
    ExpertPool& pool() const { return *pool_; }
    // Device pointers to one [elems] matrix of rank `rank` (any rank for addresses; host copies only for served
    // ranks).
    uint16_t* weight(int rank, int proj, int local_expert) const;
    uint16_t* slot(int rank, int proj, int slot) const { return pool_->slot(rank, proj, slot); }
    float* slot_grad(int rank, int proj, int slot) const { return pool_->slot_grad(rank, proj, slot); }
    float* grad(int rank, int proj, int local_expert) const;
    uint8_t* weight8(int rank, int proj, int local_expert) const;     // [elems] e4m3 cast (shape.fp8)
    uint8_t* weight8t(int rank, int proj, int local_expert) const;    // the cast transposed, [out, in] (shape.fp8)
    float* weight_scale(int rank, int proj, int local_expert) const;  // its 128 x 128 block scales (shape.fp8)
    uint8_t* slot8(int rank, int proj, int slot) const { return pool_->slot8(rank, proj, slot); }
    uint8_t* slot8t(int rank, int proj, int slot) const { return pool_->slot8t(rank, proj, slot); }
    float* slot_scale(int rank, int proj, int slot) const { return pool_->slot_scale(rank, proj, slot); }

    void prefetch_weight(Ep& ep, const EpPlan& plan, cudaStream_t stream, int channel = 1);
    void reduce_grad(Ep& ep, const EpPlan& plan, cudaStream_t stream, int channel = 1);
    // FP8 (shape.fp8): by default every prefetch_weight casts the home's bf16 weights again (right whatever writes
    // them). With reuse_fp8_cast(true) it casts only when the weights changed since its last cast: the first
    // prefetch_weight, and the first after each weights_changed() — so the micro-batches of one optimizer step
    // share one cast (TransformerEngine's is_first_microbatch). With reuse on, call weights_changed() after every
    // write to the bf16 weights (an optimizer step, an upload): a write without it leaves stale casts in use.
    // Host state only (no synchronisation); without fp8 both are no-ops.
    void reuse_fp8_cast(bool reuse) { reuse_fp8_cast_ = reuse; }
    void weights_changed() { fp8_cast_current_ = false; }
    bool fp8_cast_current() const { return fp8_cast_current_; }  // a reused prefetch_weight would not cast
    int last_blocks_per_rank() const { return last_blocks_; }  // of the cooperative kernel (0: the local functions)

    // Region offsets inside one rank's copy of the layer's window (weights, grads) and of the pool's window
    // (slots, slot_grads), bytes.
    struct Offsets {
        size_t weights, slots, slot_grads, grads, total;
        size_t weights8 = 0, weight_scales = 0, slots8 = 0, slot_scales = 0, weights8t = 0;  // shape.fp8
    };
    const Offsets& offsets() const { return off_; }
    const Window& window() const { return *window_; }

  private:
    void init(Ep& ep);
    // Copies the slots of the regions of `view` (per projection: weights -> slots) for the resident plan.
    void copy_to_slots(Ep& ep, const ExpertsView& view, cudaStream_t stream, int channel);
    char* at(int rank, size_t region, int n, int proj, int index, size_t elem_bytes) const;
    ExpertsView kernel_view() const;

    ExpertsShape shape_;
    int R_, epn_, B_, rank_begin_;
    std::unique_ptr<ExpertPool> own_pool_;
    ExpertPool* pool_ = nullptr;
    Offsets off_{};
    OwnedWindow window_;  // after own_pool_: freed before it
    int last_blocks_ = 0;
    bool reuse_fp8_cast_ = false;
    bool fp8_cast_current_ = false;  // the e4m3 casts are of the current bf16 weights (a cast since weights_changed)
};

}  // namespace evenep::cuda
