// cuda::Experts: expert weights, prefetch slots and gradient reduction on any team (include/evenep/cuda/experts.hpp).
#include "evenep/cuda/experts.hpp"

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/launchers.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

Experts::Experts(Ep& ep, const ExpertsShape& shape)
    : shape_(shape), R_(ep.config().R), epn_(ep.config().epn()), B_(ep.config().num_slots()) {
    EVENEP_CHECK(shape.num_projections >= 1 && shape.num_projections <= 3,
                 "experts: num_projections = ", shape.num_projections, " outside [1, 3]");
    EVENEP_CHECK(shape.elems > 0 && shape.elems % 8 == 0, "experts: elements per matrix = ", shape.elems,
                 " must be a positive multiple of 8");
    const size_t P = shape.num_projections, n = static_cast<size_t>(shape.elems);
    auto region = [](size_t bytes) { return detail::align_up(bytes, 256); };
    size_t o = 0;
    off_.weights = o;
    if (shape.with_weights) o += region(P * epn_ * n * 2);
    off_.slots = o;
    if (shape.with_weights) o += region(P * B_ * n * 2);
    off_.slot_grads = o;
    if (shape.with_grads) o += region(P * B_ * n * 4);
    off_.grads = o;
    if (shape.with_grads) o += region(P * epn_ * n * 4);
    off_.total = o > 0 ? o : 256;
    window_ = &ep.team().alloc_window(off_.total);
}

char* Experts::at(int rank, size_t region, int n, int proj, int index, size_t elem_bytes) const {
    EVENEP_CHECK(rank >= 0 && rank < R_ && proj >= 0 && proj < shape_.num_projections && index >= 0 && index < n,
                 "experts: (rank ", rank, ", projection ", proj, ", index ", index, ") out of range");
    return window_->peers[rank] + region + (static_cast<size_t>(proj) * n + index) * shape_.elems * elem_bytes;
}

uint16_t* Experts::weight(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.with_weights, "experts: allocated without weights");
    return reinterpret_cast<uint16_t*>(at(rank, off_.weights, epn_, proj, local_expert, 2));
}
uint16_t* Experts::slot(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.with_weights, "experts: allocated without weights");
    return reinterpret_cast<uint16_t*>(at(rank, off_.slots, B_, proj, slot, 2));
}
float* Experts::slot_grad(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.with_grads, "experts: allocated without gradients");
    return reinterpret_cast<float*>(at(rank, off_.slot_grads, B_, proj, slot, 4));
}
float* Experts::grad(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.with_grads, "experts: allocated without gradients");
    return reinterpret_cast<float*>(at(rank, off_.grads, epn_, proj, local_expert, 4));
}

ExpertsView Experts::kernel_view() const {
    return ExpertsView{window_->d_peers, off_.weights,           off_.slots,  off_.slot_grads,
                       off_.grads,       shape_.num_projections, shape_.elems};
}

void Experts::prefetch_weight(Ep& ep, const EpPlan& plan, cudaStream_t stream, int channel) {
    EVENEP_CHECK(shape_.with_weights, "prefetch_weight: experts allocated without weights");
    EVENEP_CHECK(ep.config().R == R_ && ep.config().num_slots() == B_,
                 "prefetch_weight: experts sized for another group");
    ep.use(plan, stream);
    last_blocks_ = launch_prefetch_weight(ep.view(channel), ep.layout(), kernel_view(), ep.options().sm_budget, stream);
}

void Experts::reduce_grad(Ep& ep, const EpPlan& plan, cudaStream_t stream, int channel) {
    EVENEP_CHECK(shape_.with_grads, "reduce_grad: experts allocated without gradients");
    EVENEP_CHECK(ep.config().R == R_ && ep.config().num_slots() == B_, "reduce_grad: experts sized for another group");
    ep.use(plan, stream);
    last_blocks_ = launch_reduce_grad(ep.view(channel), ep.layout(), kernel_view(), ep.options().sm_budget, stream);
}

}  // namespace evenep::cuda
