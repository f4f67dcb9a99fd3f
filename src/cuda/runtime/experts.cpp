// cuda::ExpertPool and cuda::Experts: expert weights, prefetch slots and gradient reduction on any team
// (include/evenep/cuda/experts.hpp).
#include "evenep/cuda/experts.hpp"

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/cuda/fp8_cast.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

size_t region_bytes(size_t bytes) { return detail::align_up(bytes, size_t{256}); }

void check_shape(const ExpertsShape& shape) {
    EVENEP_CHECK(shape.num_projections >= 1 && shape.num_projections <= 3,
                 "experts: num_projections = ", shape.num_projections, " outside [1, 3]");
    EVENEP_CHECK(shape.elems > 0 && shape.elems % 8 == 0, "experts: elements per matrix = ", shape.elems,
                 " must be a positive multiple of 8");
    if (!shape.fp8) {
        EVENEP_CHECK(!shape.ue8m0, "experts: ue8m0 needs fp8");
        return;
    }
    EVENEP_CHECK(shape.with_weights, "experts: fp8 needs with_weights");
    EVENEP_CHECK(shape.hidden >= kFp8Block && shape.hidden % kFp8Block == 0 && shape.ffn >= kFp8Block &&
                     shape.ffn % kFp8Block == 0,
                 "experts: fp8 needs H = ", shape.hidden, " and H' = ", shape.ffn, " positive multiples of ",
                 kFp8Block);
    EVENEP_CHECK(shape.elems == static_cast<int64_t>(shape.hidden) * shape.ffn,
                 "experts: fp8: elements per matrix = ", shape.elems,
                 " but H*H' = ", static_cast<int64_t>(shape.hidden) * shape.ffn);
}

// A [P][n][stride bytes] region's entry (proj, index).
size_t entry_at(size_t region, int n, int proj, int index, size_t stride) {
    return region + (static_cast<size_t>(proj) * n + index) * stride;
}

// A rank's copy of a window as host code addresses it: the first served rank's is Window::local (on the NCCL team
// the allocation itself, peers[] holding its LSA mapping; see Ep::base), every other rank's is its peers[] entry.
char* copy_of(const Window& w, int rank_begin, int rank) { return rank == rank_begin ? w.local : w.peers[rank]; }

}  // namespace

// ---- ExpertPool ----

ExpertPool::ExpertPool(Ep& ep, const ExpertsShape& shape)
    : shape_(shape), R_(ep.config().R), B_(ep.config().num_slots()), rank_begin_(ep.rank_begin()) {
    check_shape(shape);
    const size_t P = shape.num_projections, n = static_cast<size_t>(shape.elems);
    size_t o = 0;
    slots_ = o;
    if (shape.with_weights) o += region_bytes(P * B_ * n * 2);
    slot_grads_ = o;
    if (shape.with_grads) o += region_bytes(P * B_ * n * 4);
    slots8_ = o;
    if (shape.fp8) o += region_bytes(P * B_ * n);
    slot_scales_ = o;
    if (shape.fp8) o += region_bytes(P * B_ * static_cast<size_t>(shape.scale_stride()));
    slots8t_ = o;
    if (shape.fp8) o += region_bytes(P * B_ * n);
    window_ = OwnedWindow(ep.team(), o > 0 ? o : 256);
}

int64_t ExpertsShape::scale_stride() const {
    return fp8 ? detail::align_up(detail::fp8_weight_scales(hidden, ffn) * 4, int64_t{16}) : 0;
}

char* ExpertPool::at(int rank, size_t region, int proj, int index, size_t elem_bytes) const {
    EVENEP_CHECK(rank >= 0 && rank < R_ && proj >= 0 && proj < shape_.num_projections && index >= 0 && index < B_,
                 "expert pool: (rank ", rank, ", projection ", proj, ", slot ", index, ") out of range");
    return copy_of(*window_, rank_begin_, rank) + region +
           (static_cast<size_t>(proj) * B_ + index) * shape_.elems * elem_bytes;
}

uint16_t* ExpertPool::slot(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.with_weights, "expert pool: allocated without weights");
    return reinterpret_cast<uint16_t*>(at(rank, slots_, proj, slot, 2));
}

float* ExpertPool::slot_grad(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.with_grads, "expert pool: allocated without gradients");
    return reinterpret_cast<float*>(at(rank, slot_grads_, proj, slot, 4));
}

uint8_t* ExpertPool::slot8(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.fp8, "expert pool: allocated without fp8");
    return reinterpret_cast<uint8_t*>(at(rank, slots8_, proj, slot, 1));
}

uint8_t* ExpertPool::slot8t(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.fp8, "expert pool: allocated without fp8");
    return reinterpret_cast<uint8_t*>(at(rank, slots8t_, proj, slot, 1));
}

float* ExpertPool::slot_scale(int rank, int proj, int slot) const {
    EVENEP_CHECK(shape_.fp8, "expert pool: allocated without fp8");
    at(rank, slot_scales_, proj, slot, 1);  // range check
    return reinterpret_cast<float*>(copy_of(*window_, rank_begin_, rank) +
                                    entry_at(slot_scales_, B_, proj, slot, shape_.scale_stride()));
}

bool ExpertPool::holds(const Experts& experts, const EpPlan& plan) const {
    return plan.valid() && filled_by_ == &experts && filled_plan_ == plan.id();
}

// ---- Experts ----

Experts::Experts(Ep& ep, const ExpertsShape& shape)
    : shape_(shape),
      R_(ep.config().R),
      epn_(ep.config().epn()),
      B_(ep.config().num_slots()),
      rank_begin_(ep.rank_begin()) {
    check_shape(shape);
    own_pool_ = std::make_unique<ExpertPool>(ep, shape);
    pool_ = own_pool_.get();
    init(ep);
}

Experts::Experts(Ep& ep, ExpertPool& pool, const ExpertsShape& shape)
    : shape_(shape),
      R_(ep.config().R),
      epn_(ep.config().epn()),
      B_(ep.config().num_slots()),
      rank_begin_(ep.rank_begin()),
      pool_(&pool) {
    check_shape(shape);
    const ExpertsShape& ps = pool.shape();
    EVENEP_CHECK(ps.num_projections == shape.num_projections && ps.elems == shape.elems &&
                     ps.with_weights == shape.with_weights && ps.with_grads == shape.with_grads && pool.R_ == R_ &&
                     pool.B_ == B_ && ps.fp8 == shape.fp8 && ps.ue8m0 == shape.ue8m0 &&
                     ps.scale_stride() == shape.scale_stride(),
                 "experts: the pool holds ", ps.num_projections, " projections of ", ps.elems,
                 " elements for R = ", pool.R_, ", B = ", pool.B_, "; the layer needs ", shape.num_projections, " of ",
                 shape.elems, " for R = ", R_, ", B = ", B_, " (fp8 ", ps.fp8, " vs ", shape.fp8, ")");
    init(ep);
}

// The layer's window: weights [P][epn][elems] bf16, grads [P][epn][elems] fp32; slots in the pool's window.
void Experts::init(Ep& ep) {
    const size_t P = shape_.num_projections, n = static_cast<size_t>(shape_.elems);
    size_t o = 0;
    off_.weights = o;
    if (shape_.with_weights) o += region_bytes(P * epn_ * n * 2);
    off_.grads = o;
    if (shape_.with_grads) o += region_bytes(P * epn_ * n * 4);
    off_.weights8 = o;
    if (shape_.fp8) o += region_bytes(P * epn_ * n);
    off_.weight_scales = o;
    if (shape_.fp8) o += region_bytes(P * epn_ * static_cast<size_t>(shape_.scale_stride()));
    off_.weights8t = o;
    if (shape_.fp8) o += region_bytes(P * epn_ * n);
    off_.total = o > 0 ? o : 256;
    off_.slots = pool_->slots_offset();
    off_.slot_grads = pool_->slot_grads_offset();
    off_.slots8 = pool_->slots8_offset();
    off_.slot_scales = pool_->slot_scales_offset();
    window_ = OwnedWindow(ep.team(), off_.total);
}

char* Experts::at(int rank, size_t region, int n, int proj, int index, size_t elem_bytes) const {
    EVENEP_CHECK(rank >= 0 && rank < R_ && proj >= 0 && proj < shape_.num_projections && index >= 0 && index < n,
                 "experts: (rank ", rank, ", projection ", proj, ", index ", index, ") out of range");
    return copy_of(*window_, rank_begin_, rank) + region +
           (static_cast<size_t>(proj) * n + index) * shape_.elems * elem_bytes;
}

uint16_t* Experts::weight(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.with_weights, "experts: allocated without weights");
    return reinterpret_cast<uint16_t*>(at(rank, off_.weights, epn_, proj, local_expert, 2));
}
float* Experts::grad(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.with_grads, "experts: allocated without gradients");
    return reinterpret_cast<float*>(at(rank, off_.grads, epn_, proj, local_expert, 4));
}

uint8_t* Experts::weight8(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.fp8, "experts: allocated without fp8");
    return reinterpret_cast<uint8_t*>(at(rank, off_.weights8, epn_, proj, local_expert, 1));
}
uint8_t* Experts::weight8t(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.fp8, "experts: allocated without fp8");
    return reinterpret_cast<uint8_t*>(at(rank, off_.weights8t, epn_, proj, local_expert, 1));
}
float* Experts::weight_scale(int rank, int proj, int local_expert) const {
    EVENEP_CHECK(shape_.fp8, "experts: allocated without fp8");
    at(rank, off_.weight_scales, epn_, proj, local_expert, 1);  // range check
    return reinterpret_cast<float*>(copy_of(*window_, rank_begin_, rank) +
                                    entry_at(off_.weight_scales, epn_, proj, local_expert, shape_.scale_stride()));
}

ExpertsView Experts::kernel_view() const {
    ExpertsView v{};
    v.bases = window_->d_peers;
    v.pool_bases = pool_->window().d_peers;
    v.weights = off_.weights;
    v.slots = off_.slots;
    v.slot_grads = off_.slot_grads;
    v.grads = off_.grads;
    v.num_projections = shape_.num_projections;
    v.elems = shape_.elems;
    return v;
}

namespace {

// Every rank in this process and no relayed copy tree: the copies move through cuda::prefetch_copies /
// reduce_copies (the PyTorch ops' functions) over the windows, one launch per projection and region.
bool pulls_locally(const Ep& ep) { return ep.num_local_ranks() == ep.config().R && !ep.options().relay; }

// Projection p of a view's region pair: homes (bases, `home`) and slots (pool bases, `slot`), matrices of `bytes`.
ExpertCopies local_copies(const Ep& ep, const ExpertsView& v, size_t home, size_t slot, int p, int64_t bytes) {
    const Config& cfg = ep.config();
    ExpertCopies c;
    c.copies = reinterpret_cast<const int32_t*>(ep.base(ep.rank_begin()) + ep.layout().plan.copies);
    c.copies_stride = cfg.num_slots();
    c.R = cfg.R;
    c.B = cfg.num_slots();
    c.E = cfg.E;
    c.epn = cfg.epn();
    c.mat_bytes = bytes;
    c.home.bases = v.bases;
    c.home.offset = home + static_cast<size_t>(p) * c.epn * bytes;
    c.slots.bases = v.pool_bases;
    c.slots.offset = slot + static_cast<size_t>(p) * c.B * bytes;
    return c;
}

}  // namespace

void Experts::copy_to_slots(Ep& ep, const ExpertsView& v, cudaStream_t stream, int channel) {
    if (!pulls_locally(ep)) {
        last_blocks_ = launch_prefetch_weight(ep.view(channel), ep.layout(), v, ep.options().sm_budget, stream);
        return;
    }
    for (int p = 0; p < v.num_projections; ++p)
        prefetch_copies(local_copies(ep, v, v.weights, v.slots, p, v.elems * 2), false, stream);
    last_blocks_ = 0;
}

void Experts::prefetch_weight(Ep& ep, const EpPlan& plan, cudaStream_t stream, int channel) {
    EVENEP_CHECK(shape_.with_weights, "prefetch_weight: experts allocated without weights");
    EVENEP_CHECK(ep.config().R == R_ && ep.config().num_slots() == B_,
                 "prefetch_weight: experts sized for another group");
    ep.use(plan, stream);
    const ExpertsView bf16 = kernel_view();
    if (!shape_.fp8) {
        copy_to_slots(ep, bf16, stream, channel);
    } else {
        // The home's cast of every local expert (per prefetch, or with reuse_fp8_cast once per weight change; one
        // launch per served rank and projection, which also writes the transposed codes), then the codes and the
        // scales through the same copy kernel: a view whose "bf16 elements" are byte pairs of the e4m3 / scale
        // regions. The bf16 slots are not filled: no FP8 GEMM reads them.
        const int H = shape_.hidden, F = shape_.ffn;
        const bool cast = !reuse_fp8_cast_ || !fp8_cast_current_;
        for (int i = 0; cast && i < ep.num_local_ranks(); ++i) {
            const int r = ep.rank_begin() + i;
            for (int p = 0; p < shape_.num_projections; ++p) {
                Fp8WeightCast c;
                c.w = reinterpret_cast<const Bf16*>(weight(r, p, 0));
                c.w_stride = c.codes_stride = shape_.elems;
                c.count = epn_;
                c.in = detail::proj_in_dim(p, H, F);
                c.out = detail::proj_out_dim(p, H, F);
                c.ue8m0 = shape_.ue8m0;
                c.codes = reinterpret_cast<Fp8E4m3*>(weight8(r, p, 0));
                c.transposed = reinterpret_cast<Fp8E4m3*>(weight8t(r, p, 0));
                c.scales = weight_scale(r, p, 0);
                c.scale_stride = shape_.scale_stride() / 4;
                launch_fp8_cast_weights(c, stream);
            }
        }
        fp8_cast_current_ = true;
        ExpertsView codes = bf16;
        codes.weights = off_.weights8;
        codes.slots = off_.slots8;
        codes.elems = shape_.elems / 2;
        copy_to_slots(ep, codes, stream, channel);
        const int codes_blocks = last_blocks_;
        ExpertsView scales = bf16;
        scales.weights = off_.weight_scales;
        scales.slots = off_.slot_scales;
        scales.elems = shape_.scale_stride() / 2;
        copy_to_slots(ep, scales, stream, channel);
        last_blocks_ = codes_blocks;
    }
    pool_->filled_by_ = this;
    pool_->filled_plan_ = plan.id();
}

void Experts::reduce_grad(Ep& ep, const EpPlan& plan, cudaStream_t stream, int channel) {
    EVENEP_CHECK(shape_.with_grads, "reduce_grad: experts allocated without gradients");
    EVENEP_CHECK(ep.config().R == R_ && ep.config().num_slots() == B_, "reduce_grad: experts sized for another group");
    ep.use(plan, stream);
    const ExpertsView v = kernel_view();
    if (!pulls_locally(ep)) {
        last_blocks_ = launch_reduce_grad(ep.view(channel), ep.layout(), v, ep.options().sm_budget, stream);
        return;
    }
    for (int p = 0; p < v.num_projections; ++p)
        reduce_copies(local_copies(ep, v, v.grads, v.slot_grads, p, v.elems * 4), /*accumulate=*/true,
                      /*zero_consumed=*/true, stream);
    last_blocks_ = 0;
}

}  // namespace evenep::cuda
