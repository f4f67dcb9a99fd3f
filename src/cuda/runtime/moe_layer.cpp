// cuda::MoeLayer: one SwiGLU MoE layer forward and backward for every rank an Ep serves, on either team
// (include/evenep/cuda/moe_layer.hpp). The GEMMs are the grouped GEMM (evenep/cuda/grouped_gemm.hpp), one call
// per rank and projection; the elementwise steps are src/cuda/kernels/swiglu.cu, one launch for the served ranks.
#include "evenep/cuda/moe_layer.hpp"

#include <algorithm>

#include "cuda/kernels/swiglu.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

using kernels::MoeKernelParams;
using kernels::MoeRankView;

inline constexpr size_t kRegionAlign = 256;
inline constexpr int kProjections = detail::kNumProjections;

size_t aligned(size_t bytes) { return detail::align_up(bytes, kRegionAlign); }

}  // namespace

MoeLayer::MoeLayer(Ep& ep, Experts& experts, int ffn_hidden, const MoeLayerOptions& options)
    : ep_(ep), experts_(experts), ffn_hidden_(ffn_hidden), options_(options) {
    const Config& cfg = ep.config();
    const int R = cfg.R, H = ep.hidden(), F = ffn_hidden, G = ep.layout().G, epn = cfg.epn(), B = cfg.num_slots();
    const int NL = ep.num_local_ranks(), L0 = ep.rank_begin();
    const int64_t nvs = ep.layout().nvs;
    const ExpertsShape& es = experts.shape();
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, F > 0 && F % 8 == 0, "moe layer: H' = ", F,
                      " must be a positive multiple of 8");
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument,
                      es.num_projections == kProjections && es.with_weights && es.elems == static_cast<int64_t>(H) * F,
                      "moe layer: experts hold ", es.num_projections, " projections of ", es.elems,
                      " elements (weights ", es.with_weights ? "yes" : "no",
                      "); the layer needs 3 of H*H' = ", static_cast<int64_t>(H) * F, " with weights");
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, G <= kMaxGemmGroups, "moe layer: G = ", G, " groups exceed ",
                      kMaxGemmGroups);
    fp8_ = ep.options().precision.fp8;
    if (fp8_) fp8_check_options();
    training_ = es.with_grads && B == epn;
    // The auto policy predicts this layer's step (docs/auto.md): its GEMM and weight sizes, and its precision.
    if (cfg.policy == PlannerPolicy::kAuto) ep.set_auto_model(detail::layer_auto_cost_model(H, F, cfg.tp, fp8_));

    // Regions of the one allocation, each [num_local][NvS][dim].
    const size_t rows = static_cast<size_t>(NL) * static_cast<size_t>(nvs);
    Regions& g = regions_;
    size_t o = 0;
    auto take = [&o](size_t bytes) {
        const size_t at = o;
        o += aligned(bytes);
        return at;
    };
    g.x = take(rows * H * 2);
    g.g = take(rows * F * 2);
    g.u = take(rows * F * 2);
    g.h = take(rows * F * 2);
    g.y = take(rows * H * 2);
    if (es.with_grads) {
        g.f32a_dim = static_cast<size_t>(std::max(F, H));
        g.f32b_dim = static_cast<size_t>(H);
        g.dy = take(rows * H * 2);
        g.dg = take(rows * F * 2);
        g.du = take(rows * F * 2);
        g.f32a = take(rows * g.f32a_dim * 4);
        g.f32b = take(rows * g.f32b_dim * 4);
    }
    // Grouped GEMM tables [3][num_local][G+1] (cuda::build_group_table's rows: G groups, then the gap), their
    // sources per projection (homes [num_local], slots [num_local], gradient homes and slots, peers [R]) and the
    // plan tensor they are built from.
    const size_t num_tables = static_cast<size_t>(kProjections) * NL * (G + 1);
    const size_t sources_per_proj = 4 * static_cast<size_t>(NL) + R;
    g.tables = take(2 * num_tables * sizeof(void*));
    g.sources = take(kProjections * sources_per_proj * sizeof(void*));
    plan_layout_ = PlanRowLayout::make(cfg);
    g.plan_rows = take(static_cast<size_t>(NL) * plan_layout_.width * sizeof(int32_t));
    g.workspace = take(grouped_gemm_workspace_bytes(G));
    g.views = take(static_cast<size_t>(R) * sizeof(MoeRankView));
    if (fp8_) o = fp8_take_regions(o, rows);
    g.total = o;

    // Every served rank's fixed pointers: receive buffer and its own plan copy's group ends. The tables' sources:
    // the served ranks' expert regions and every rank's weights (peer addresses: kPeer groups read them).
    std::vector<MoeRankView> views(R);
    std::vector<const void*> sources(kProjections * sources_per_proj, nullptr);
    for (int r = L0; r < L0 + NL; ++r) {
        MoeRankView& v = views[r];
        v.recv_x = ep.recv_x(r);
        v.recv_w = ep.recv_w(r);
        v.cu_seqlens = ep.cu_seqlens(r);
    }
    for (int p = 0; p < kProjections; ++p) {
        const void** s = sources.data() + p * sources_per_proj;  // homes | slots | grad homes | grad slots | peers
        for (int i = 0; i < NL; ++i) {
            const int r = L0 + i;
            s[i] = experts.weight(r, p, 0);
            s[NL + i] = B > 0 ? experts.slot(r, p, 0) : nullptr;
            s[2 * NL + i] = es.with_grads ? experts.grad(r, p, 0) : nullptr;
            s[3 * NL + i] = es.with_grads && B > 0 ? experts.slot_grad(r, p, 0) : nullptr;
        }
        for (int r = 0; r < R; ++r) s[4 * NL + r] = experts.weight(r, p, 0);
    }

    int device = 0, num_sms = 0;
    EVENEP_CUDA_CHECK(cudaGetDevice(&device));
    EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    arena_ = DeviceArray<char>(g.total);
    try {
        EVENEP_CUDA_CHECK(cudaMemcpy(arena_.get() + g.views, views.data(), views.size() * sizeof(MoeRankView),
                                     cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(arena_.get() + g.sources, sources.data(), sources.size() * sizeof(void*),
                                     cudaMemcpyHostToDevice));
        if (fp8_) fp8_init();
        if (options_.timing)
            for (cudaEvent_t& e : events_) EVENEP_CUDA_CHECK(cudaEventCreate(&e));
        // The rank table is read by kernels on any stream, also non-blocking ones: complete the upload here.
        EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    } catch (...) {
        for (cudaEvent_t e : events_)
            if (e != nullptr) cudaEventDestroy(e);
        throw;
    }
    char* arena = arena_.get();
    weight_tables_ = reinterpret_cast<const uint16_t**>(arena + g.tables);
    grad_tables_ = reinterpret_cast<float**>(arena + g.tables + num_tables * sizeof(void*));
    table_sources_ = reinterpret_cast<const void* const*>(arena + g.sources);
    plan_rows_ = reinterpret_cast<int32_t*>(arena + g.plan_rows);
    gemm_workspace_ = arena + g.workspace;
    rank_views_ = arena + g.views;
    allocated_bytes_ = g.total;
    // Elementwise launches: about four blocks per SM over all ranks, never more than a rank's work needs.
    const int64_t max_vec = nvs * std::max(H, F) / 8;
    const int64_t needed = std::max<int64_t>(1, (max_vec + 255) / 256);
    blocks_per_rank_ =
        static_cast<int>(std::clamp<int64_t>((4 * static_cast<int64_t>(num_sms) + NL - 1) / NL, 1, needed));
}

MoeLayer::~MoeLayer() {
    for (cudaEvent_t e : events_)
        if (e != nullptr) cudaEventDestroy(e);
}

uint16_t* MoeLayer::bf16_at(size_t region, int rank, int dim) const {
    const size_t i = static_cast<size_t>(rank - ep_.rank_begin());
    return reinterpret_cast<uint16_t*>(arena_.get() + region) + i * ep_.layout().nvs * dim;
}

float* MoeLayer::f32_at(size_t region, int rank, size_t dim) const {
    const size_t i = static_cast<size_t>(rank - ep_.rank_begin());
    return reinterpret_cast<float*>(arena_.get() + region) + i * ep_.layout().nvs * dim;
}

const uint16_t* MoeLayer::saved_x(int rank) const { return bf16_at(regions_.x, rank, ep_.hidden()); }
const uint16_t* MoeLayer::saved_h(int rank) const { return bf16_at(regions_.h, rank, ffn_hidden_); }
const uint16_t* MoeLayer::saved_y(int rank) const { return bf16_at(regions_.y, rank, ep_.hidden()); }

kernels::MoeKernelParams MoeLayer::kernel_params() const {
    const Config& cfg = ep_.config();
    MoeKernelParams p;
    p.ranks = static_cast<const MoeRankView*>(rank_views_);
    p.R = cfg.R;
    p.rank_begin = ep_.rank_begin();
    p.num_local = ep_.num_local_ranks();
    p.G = ep_.layout().G;
    p.epn = cfg.epn();
    p.B = cfg.num_slots();
    p.H = ep_.hidden();
    p.F = ffn_hidden_;
    p.nvs = ep_.layout().nvs;
    p.elems = experts_.shape().elems;
    p.x = bf16_at(regions_.x, p.rank_begin, p.H);
    p.g = bf16_at(regions_.g, p.rank_begin, p.F);
    p.u = bf16_at(regions_.u, p.rank_begin, p.F);
    p.h = bf16_at(regions_.h, p.rank_begin, p.F);
    p.y = bf16_at(regions_.y, p.rank_begin, p.H);
    if (experts_.shape().with_grads) {
        p.dy = bf16_at(regions_.dy, p.rank_begin, p.H);
        p.dg = bf16_at(regions_.dg, p.rank_begin, p.F);
        p.du = bf16_at(regions_.du, p.rank_begin, p.F);
        p.f32a = f32_at(regions_.f32a, p.rank_begin, regions_.f32a_dim);
        p.f32b = f32_at(regions_.f32b, p.rank_begin, regions_.f32b_dim);
        p.f32a_dim = static_cast<int64_t>(regions_.f32a_dim);
        p.f32b_dim = static_cast<int64_t>(regions_.f32b_dim);
    }
    p.blocks_per_rank = blocks_per_rank_;
    return p;
}

void MoeLayer::record(Event e, cudaStream_t stream) {
    if (options_.timing) EVENEP_CUDA_CHECK(cudaEventRecord(events_[e], stream));
}

size_t MoeLayer::table_index(int rank, int proj) const {
    const int G = ep_.layout().G;
    return (static_cast<size_t>(proj) * ep_.num_local_ranks() + (rank - ep_.rank_begin())) * (G + 1);
}

// The grouped GEMM's weight and gradient tables of the resident plan, by the library's cuda::build_group_table
// (the PyTorch ops' tables): from the plan tensor the planner wrote (forward), per projection one launch over the
// served ranks for the weights (homes, slots, peers) and, with gradients, one for the gradients (kPeer groups: null).
void MoeLayer::build_tables(cudaStream_t stream) {
    const Config& cfg = ep_.config();
    const int NL = ep_.num_local_ranks();
    const size_t per_proj = 4 * static_cast<size_t>(NL) + cfg.R;
    for (int proj = 0; proj < kProjections; ++proj) {
        const void* const* s = table_sources_ + proj * per_proj;
        GroupTableArgs a;
        a.plan = PlanRows{plan_rows_, NL, plan_layout_};
        a.nvs = ep_.layout().nvs;
        a.expert_base = ep_.rank_begin() * cfg.epn();
        a.num_home = cfg.epn();
        a.mat_bytes = experts_.shape().elems * 2;
        a.table = reinterpret_cast<const void**>(weight_tables_) + table_index(ep_.rank_begin(), proj);
        a.homes = s;
        a.row_slots = s + NL;
        a.peers = s + 4 * NL;
        a.num_peers = cfg.R;
        build_group_table(a, stream);
        if (!experts_.shape().with_grads) continue;  // the gradient tables stay null (zeroed arena)
        a.mat_bytes = experts_.shape().elems * 4;
        a.table = static_cast<const void**>(static_cast<void*>(grad_tables_)) + table_index(ep_.rank_begin(), proj);
        a.homes = s + 2 * NL;
        a.row_slots = s + 3 * NL;
        a.peers = nullptr;
        a.num_peers = 0;
        build_group_table(a, stream);
    }
}

void MoeLayer::gemm(int rank, int proj, GemmOp op, const uint16_t* x, void* y, bool y_fp32, cudaStream_t stream) {
    const int H = ep_.hidden(), F = ffn_hidden_, G = ep_.layout().G;
    GroupedGemmArgs a;
    a.x = x;
    a.cu_seqlens = ep_.cu_seqlens(rank);
    a.weights = weight_tables_ + table_index(rank, proj);
    a.y = y;
    a.y_fp32 = y_fp32;
    a.num_groups = G;
    a.in_dim = proj == detail::kProjDown ? F : H;  // W_gate, W_up: [H, H']; W_down: [H', H]
    a.out_dim = proj == detail::kProjDown ? H : F;
    a.op = op;
    a.schedule = options_.schedule;
    a.workspace = gemm_workspace_;
    a.rows_capacity = ep_.layout().nvs;
    grouped_gemm(a, stream);
}

void MoeLayer::wgrad(int rank, int proj, const uint16_t* x, const uint16_t* dy, cudaStream_t stream) {
    const int H = ep_.hidden(), F = ffn_hidden_, G = ep_.layout().G;
    GroupedWgradArgs a;
    a.x = x;
    a.dy = dy;
    a.cu_seqlens = ep_.cu_seqlens(rank);
    a.grads = grad_tables_ + table_index(rank, proj);
    a.num_groups = G;
    a.in_dim = proj == detail::kProjDown ? F : H;
    a.out_dim = proj == detail::kProjDown ? H : F;
    a.schedule = options_.wgrad_schedule;
    a.workspace = gemm_workspace_;
    grouped_gemm_wgrad(a, stream);
}

MoeForward MoeLayer::forward(std::span<const RankIo> io,
                             std::span<const int32_t> s,
                             int64_t s_total,
                             cudaStream_t stream) {
    const int L0 = ep_.rank_begin(), NL = ep_.num_local_ranks(), H = ep_.hidden(), F = ffn_hidden_;
    // Before anything is written (the plan pointers below index NL entries; the saved forward stays usable).
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, static_cast<int>(io.size()) == NL, "moe layer: forward got ",
                      io.size(), " rank inputs, expected ", NL, " (the ranks this process serves)");
    has_forward_ = has_backward_ = false;
    const MoeKernelParams p = kernel_params();

    record(kFwdStart, stream);
    MoeForward f;
    // The planner also writes the plan tensor the tables are built from (RankIo::plan: no packing launch).
    std::vector<RankIo> pio(io.begin(), io.end());
    for (int i = 0; i < NL; ++i) pio[i].plan = plan_rows_ + i * plan_layout_.width;
    f.plan = ep_.plan(pio, s, stream, s_total);
    for (const RankIo& x : io) f.topk_w.push_back(x.topk_w);
    f.serial = ++forwards_;
    record(kFwdPlanned, stream);
    ep_.dispatch(f.plan, pio, stream);
    record(kFwdDispatched, stream);
    // FP8: also without slots, for the home's weight cast it makes (the local and peer groups read the casts).
    if (ep_.config().num_slots() > 0 || fp8_) experts_.prefetch_weight(ep_, f.plan, stream);
    record(kFwdPrefetched, stream);

    // Expert forward: tables from the new plan, g and u straight from the receive buffer (zero-copy input).
    build_tables(stream);
    if (fp8_) {
        fp8_forward_experts(p, stream);
    } else {
        for (int r = L0; r < L0 + NL; ++r) {
            gemm(r, detail::kProjGate, GemmOp::kForward, ep_.recv_x(r), bf16_at(regions_.g, r, F), false, stream);
            gemm(r, detail::kProjUp, GemmOp::kForward, ep_.recv_x(r), bf16_at(regions_.u, r, F), false, stream);
        }
        kernels::launch_swiglu_forward(p, stream);
        for (int r = L0; r < L0 + NL; ++r)
            gemm(r, detail::kProjDown, GemmOp::kForward, bf16_at(regions_.h, r, F), bf16_at(regions_.y, r, H), false,
                 stream);
        // x saved for the weight gradients, y into the receive buffer for combine (zero-copy output).
        kernels::launch_moe_place_output(p, stream);
    }
    record(kFwdExperts, stream);

    ep_.combine(f.plan, io, true, options_.combine_mode, stream);
    record(kFwdCombined, stream);
    has_forward_ = true;
    return f;
}

void MoeLayer::backward(const MoeForward& f, std::span<const BackwardIo> bwd, cudaStream_t stream) {
    const Config& cfg = ep_.config();
    EVENEP_CHECK(has_forward_ && f.plan.valid(), "moe layer: backward without a forward");
    EVENEP_CHECK(f.serial == forwards_, "moe layer: backward of forward ", f.serial, " but the layer saved forward ",
                 forwards_, " (one forward's activations are kept per layer)");
    EVENEP_CHECK(experts_.shape().with_grads, "moe layer: backward needs experts allocated with gradients");
    EVENEP_CHECK(training_, "moe layer: training needs B = epn (B = ", cfg.num_slots(), ", epn = ", cfg.epn(), ")");
    const int L0 = ep_.rank_begin(), NL = ep_.num_local_ranks(), H = ep_.hidden(), F = ffn_hidden_;
    EVENEP_CHECK(static_cast<int>(bwd.size()) == NL, "moe layer: backward got ", bwd.size(), " rank inputs, expected ",
                 NL);
    std::vector<BackwardIo> b(bwd.begin(), bwd.end());
    for (int i = 0; i < NL; ++i) {
        b[i].grad_recv_w = nullptr;  // the layer writes dw into recv_w itself
        b[i].topk_w = f.topk_w[i];
    }
    const MoeKernelParams p = kernel_params();

    record(kBwdStart, stream);
    ep_.combine_backward(f.plan, b, stream);
    // The pool's slots are shared by the layers: fill them again when another layer (or plan) used them since.
    if (cfg.num_slots() > 0 && !experts_.pool().holds(experts_, f.plan)) experts_.prefetch_weight(ep_, f.plan, stream);
    record(kBwdCombined, stream);

    // recv_x: grad_out rows, recv_w: route weights -> dw (in recv_w), dy.
    kernels::launch_moe_grad_rows(p, stream);
    if (fp8_) {
        fp8_backward_experts(p, stream);
    } else {
        for (int r = L0; r < L0 + NL; ++r) {
            const uint16_t* dy = bf16_at(regions_.dy, r, H);
            wgrad(r, detail::kProjDown, bf16_at(regions_.h, r, F), dy, stream);  // dWd += h^T dy
            gemm(r, detail::kProjDown, GemmOp::kDgrad, dy, f32_at(regions_.f32a, r, regions_.f32a_dim), true,
                 stream);  // dh = dy Wd^T
        }
        kernels::launch_swiglu_backward(p, stream);
        for (int r = L0; r < L0 + NL; ++r) {
            const uint16_t* x = bf16_at(regions_.x, r, H);
            const uint16_t* dg = bf16_at(regions_.dg, r, F);
            const uint16_t* du = bf16_at(regions_.du, r, F);
            wgrad(r, detail::kProjGate, x, dg, stream);  // dWg += x^T dg
            wgrad(r, detail::kProjUp, x, du, stream);    // dWu += x^T du
            gemm(r, detail::kProjGate, GemmOp::kDgrad, dg, f32_at(regions_.f32a, r, regions_.f32a_dim), true, stream);
            gemm(r, detail::kProjUp, GemmOp::kDgrad, du, f32_at(regions_.f32b, r, regions_.f32b_dim), true, stream);
        }
        // dx = bf16(dg Wg^T + du Wu^T) into the receive buffer in place (zero-copy input of dispatch_backward).
        kernels::launch_moe_sum_dx(p, stream);
    }
    record(kBwdExperts, stream);

    ep_.dispatch_backward(f.plan, b, options_.combine_mode, stream);
    record(kBwdDispatched, stream);
    experts_.reduce_grad(ep_, f.plan, stream);
    record(kBwdReduced, stream);
    has_backward_ = true;
}

LayerTimes MoeLayer::times() const {
    EVENEP_CHECK(options_.timing, "moe layer: times() needs MoeLayerOptions::timing");
    EVENEP_CHECK(has_forward_, "moe layer: times() before a forward");
    EVENEP_CUDA_CHECK(cudaEventSynchronize(events_[has_backward_ ? kBwdReduced : kFwdCombined]));
    auto span = [this](Event a, Event b) {
        float ms = 0;
        EVENEP_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
        return static_cast<double>(ms) * 1e-3;
    };
    LayerTimes t;
    t.plan = span(kFwdStart, kFwdPlanned);
    t.dispatch = span(kFwdStart, kFwdDispatched);
    t.prefetch = span(kFwdDispatched, kFwdPrefetched);
    t.expert_forward = span(kFwdPrefetched, kFwdExperts);
    t.combine = span(kFwdExperts, kFwdCombined);
    if (has_backward_) {
        t.combine_backward = span(kBwdStart, kBwdCombined);
        t.expert_backward = span(kBwdCombined, kBwdExperts);
        t.dispatch_backward = span(kBwdExperts, kBwdDispatched);
        t.reduce_grad = span(kBwdDispatched, kBwdReduced);
    }
    return t;
}

}  // namespace evenep::cuda
