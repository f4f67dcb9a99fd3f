// cuda::MoeLayer's FP8 path (include/evenep/cuda/moe_layer.hpp, docs/fp8.md): the layer's FP8 regions and tables, the
// block-scaled forward and dgrad GEMMs (cuda::grouped_gemm_fp8) and the casts between them (src/cuda/kernels/
// moe_fp8.cu). The CPU twin is the fp8 branch of src/cpu/moe_layer.cpp, step for step.
#include <algorithm>
#include <vector>

#include "cuda/kernels/moe_fp8.hpp"
#include "cuda/kernels/swiglu.hpp"
#include "evenep/buffer.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/expert_ops.hpp"
#include "evenep/cuda/moe_layer.hpp"
#include "evenep/detail/align.hpp"
#include "evenep/detail/buffer_layout.hpp"
#include "evenep/detail/fp8.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {
namespace {

inline constexpr int kProjections = detail::kNumProjections;
// Group tables (and their sources) per projection: codes, scales, transposed codes (the forward's), then the slot
// groups' codes alone (null for the other groups): the sources of the per-step transposes of the prefetched copies,
// which write through the kTransposed table (the transpose skips the groups whose source is null).
enum TableKind { kCodes = 0, kScales, kTransposed, kSlotCodes, kTableKinds };

int proj_in(int proj, int H, int F) { return proj == detail::kProjDown ? F : H; }
int proj_out(int proj, int H, int F) { return proj == detail::kProjDown ? H : F; }

}  // namespace

void MoeLayer::fp8_check_options() const {
    const ExpertsShape& es = experts_.shape();
    const DataPrecision& pr = ep_.options().precision;
    const int H = ep_.hidden(), F = ffn_hidden_;
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, es.fp8 && es.ue8m0 == pr.ue8m0,
                      "moe layer: the Ep dispatches fp8 (ue8m0 ", pr.ue8m0, ") but the experts have fp8 ", es.fp8,
                      ", ue8m0 ", es.ue8m0, " (ExpertsShape::fp8 and ue8m0 must match EpOptions::precision)");
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, H % kFp8Block == 0 && F % kFp8Block == 0,
                      "moe layer: fp8 needs H = ", H, " and H' = ", F, " multiples of ", kFp8Block);
    EVENEP_CHECK_KIND(ErrorKind::kInvalidArgument, grouped_gemm_has_cutlass(),
                      "moe layer: fp8 needs the CUTLASS FP8 grouped GEMM (cuda::grouped_gemm_fp8): a build with "
                      "EVENEP_CUTLASS=ON (CUTLASS headers, CMAKE_CUDA_ARCHITECTURES with 90a) on a compute "
                      "capability 9.0 device (H100/H200); this build or device has none");
}

size_t MoeLayer::fp8_take_regions(size_t o, size_t rows) {
    const int H = ep_.hidden(), F = ffn_hidden_, G = ep_.layout().G, NL = ep_.num_local_ranks(), R = ep_.config().R;
    const size_t wide = static_cast<size_t>(std::max(H, F));
    auto take = [&o](size_t bytes) {
        const size_t at = o;
        o += detail::align_up(bytes, size_t{256});
        return at;
    };
    Fp8Regions& f = fp8_regions_;
    f.codes_a = take(rows * wide);
    f.scales_a = take(rows * wide / kFp8Block * 4);
    if (experts_.shape().with_grads) {
        f.codes_b = take(rows * F);
        f.scales_b = take(rows * F / kFp8Block * 4);
        f.dxu = take(rows * H * 2);
    }
    f.tables = take(static_cast<size_t>(kTableKinds) * kProjections * NL * (G + 1) * sizeof(void*));
    f.sources = take(static_cast<size_t>(kProjections) * kTableKinds * (2 * NL + R) * sizeof(void*));
    f.views = take(static_cast<size_t>(NL) * sizeof(kernels::MoeFp8RankView));
    return o;
}

void MoeLayer::fp8_init() {
    const int NL = ep_.num_local_ranks(), L0 = ep_.rank_begin(), R = ep_.config().R, B = ep_.config().num_slots();
    const size_t per = 2 * static_cast<size_t>(NL) + R;
    std::vector<const void*> sources(kProjections * kTableKinds * per, nullptr);
    for (int p = 0; p < kProjections; ++p) {
        auto kind = [&](TableKind k) { return sources.data() + (static_cast<size_t>(p) * kTableKinds + k) * per; };
        for (int i = 0; i < NL; ++i) {  // homes | slots | peers; the slot kinds have slots only
            kind(kCodes)[i] = experts_.weight8(L0 + i, p, 0);
            kind(kScales)[i] = experts_.weight_scale(L0 + i, p, 0);
            kind(kTransposed)[i] = experts_.weight8t(L0 + i, p, 0);
            if (B == 0) continue;
            kind(kCodes)[NL + i] = kind(kSlotCodes)[NL + i] = experts_.slot8(L0 + i, p, 0);
            kind(kScales)[NL + i] = experts_.slot_scale(L0 + i, p, 0);
            kind(kTransposed)[NL + i] = experts_.slot8t(L0 + i, p, 0);
        }
        for (int r = 0; r < R; ++r) {
            kind(kCodes)[2 * NL + r] = experts_.weight8(r, p, 0);
            kind(kScales)[2 * NL + r] = experts_.weight_scale(r, p, 0);
            kind(kTransposed)[2 * NL + r] = experts_.weight8t(r, p, 0);
        }
    }
    std::vector<kernels::MoeFp8RankView> views(NL);
    for (int i = 0; i < NL; ++i) views[i] = {ep_.recv_x8(L0 + i), ep_.recv_scale(L0 + i)};
    EVENEP_CUDA_CHECK(cudaMemcpy(arena_.get() + fp8_regions_.sources, sources.data(), sources.size() * sizeof(void*),
                                 cudaMemcpyHostToDevice));
    EVENEP_CUDA_CHECK(cudaMemcpy(arena_.get() + fp8_regions_.views, views.data(),
                                 views.size() * sizeof(kernels::MoeFp8RankView), cudaMemcpyHostToDevice));
}

uint8_t* MoeLayer::codes_at(size_t region, int rank, int dim) const {
    const size_t i = static_cast<size_t>(rank - ep_.rank_begin());
    return reinterpret_cast<uint8_t*>(arena_.get() + region) + i * ep_.layout().nvs * dim;
}

float* MoeLayer::scales_at(size_t region, int rank, int dim) const {
    const size_t i = static_cast<size_t>(rank - ep_.rank_begin());
    return reinterpret_cast<float*>(arena_.get() + region) + i * ep_.layout().nvs * (dim / kFp8Block);
}

// Per projection: the tables of the resident plan (build_group_table over the homes' casts, the slots and the peers'
// casts, as build_tables does for bf16) of every kind, then the transposes of the slot groups with rows (the copies
// prefetched this step; the homes' and peers' transposed codes come from their weight cast). Needs the plan tensor
// build_tables packed.
void MoeLayer::fp8_build_tables(const kernels::MoeKernelParams& kp, cudaStream_t stream) {
    const Config& cfg = ep_.config();
    const int NL = ep_.num_local_ranks(), G = ep_.layout().G, H = ep_.hidden(), F = ffn_hidden_;
    const size_t per = 2 * static_cast<size_t>(NL) + cfg.R;
    const size_t kind_stride = static_cast<size_t>(kProjections) * NL * (G + 1);
    char* arena = arena_.get();
    auto** tables = reinterpret_cast<const void**>(arena + fp8_regions_.tables);
    const auto* sources = reinterpret_cast<const void* const*>(arena + fp8_regions_.sources);
    const ExpertsShape& es = experts_.shape();
    for (int proj = 0; proj < kProjections; ++proj) {
        const size_t at = table_index(ep_.rank_begin(), proj);
        for (int kind = 0; kind < kTableKinds; ++kind) {
            if (cfg.num_slots() == 0 && kind == kSlotCodes) continue;
            const void* const* s = sources + (static_cast<size_t>(proj) * kTableKinds + kind) * per;
            GroupTableArgs a;
            a.plan = PlanRows{plan_rows_, NL, plan_layout_};
            a.nvs = ep_.layout().nvs;
            a.expert_base = ep_.rank_begin() * cfg.epn();
            a.num_home = cfg.epn();
            a.mat_bytes = kind == kScales ? es.scale_stride() : es.elems;
            a.table = tables + kind * kind_stride + at;
            a.homes = s;
            a.row_slots = s + NL;
            a.peers = s + 2 * NL;
            a.num_peers = cfg.R;
            build_group_table(a, stream);
        }
        if (cfg.num_slots() > 0)
            kernels::launch_moe_fp8_transpose_groups(
                kp, reinterpret_cast<const uint8_t* const*>(tables + kSlotCodes * kind_stride + at),
                reinterpret_cast<const uint8_t* const*>(tables + kTransposed * kind_stride + at), proj_in(proj, H, F),
                proj_out(proj, H, F), stream);
    }
}

void MoeLayer::fp8_gemm(
    int rank, int proj, GemmOp op, const uint8_t* x, const float* xs, uint16_t* y, cudaStream_t stream) {
    const int NL = ep_.num_local_ranks(), G = ep_.layout().G;
    const size_t kind_stride = static_cast<size_t>(kProjections) * NL * (G + 1);
    auto** tables = reinterpret_cast<const void**>(arena_.get() + fp8_regions_.tables);
    const size_t at = table_index(rank, proj);
    GroupedGemmFp8Args a;
    a.x = x;
    a.x_scales = xs;
    a.cu_seqlens = ep_.cu_seqlens(rank);
    // The forward reads W^T (K-major), dgrad W as it is; both the same 128 x 128 scales.
    a.weights = reinterpret_cast<const uint8_t* const*>(tables + (op == GemmOp::kForward ? kTransposed : kCodes) *
                                                                        kind_stride + at);
    a.weight_scales = reinterpret_cast<const float* const*>(tables + kScales * kind_stride + at);
    a.y = y;
    a.num_groups = G;
    a.in_dim = proj_in(proj, ep_.hidden(), ffn_hidden_);
    a.out_dim = proj_out(proj, ep_.hidden(), ffn_hidden_);
    a.op = op;
    a.schedule = options_.schedule;
    a.block_scaled = true;
    a.workspace = gemm_workspace_;
    a.rows_capacity = ep_.layout().nvs;
    grouped_gemm_fp8(a, stream);
}

// g, u = FP8 GEMMs of the received codes; h = swiglu (bf16); y = FP8 GEMM of h cast 1 x 128; then y into the receive
// buffer and x = bf16(float(q)*s) saved for the bf16 wgrad (one pass).
void MoeLayer::fp8_forward_experts(const kernels::MoeKernelParams& p, cudaStream_t stream) {
    const int L0 = ep_.rank_begin(), NL = ep_.num_local_ranks(), H = ep_.hidden(), F = ffn_hidden_;
    const bool ue8m0 = ep_.options().precision.ue8m0;
    const Fp8Regions& f = fp8_regions_;
    fp8_build_tables(p, stream);
    for (int r = L0; r < L0 + NL; ++r) {
        fp8_gemm(r, detail::kProjGate, GemmOp::kForward, ep_.recv_x8(r), ep_.recv_scale(r), bf16_at(regions_.g, r, F),
                 stream);
        fp8_gemm(r, detail::kProjUp, GemmOp::kForward, ep_.recv_x8(r), ep_.recv_scale(r), bf16_at(regions_.u, r, F),
                 stream);
    }
    kernels::launch_swiglu_forward(p, stream);
    kernels::launch_moe_fp8_cast_rows(p, p.h, F, ue8m0, codes_at(f.codes_a, L0, F), scales_at(f.scales_a, L0, F),
                                      stream);
    for (int r = L0; r < L0 + NL; ++r)
        fp8_gemm(r, detail::kProjDown, GemmOp::kForward, codes_at(f.codes_a, r, F), scales_at(f.scales_a, r, F),
                 bf16_at(regions_.y, r, H), stream);
    kernels::launch_moe_fp8_place_output(p, reinterpret_cast<const kernels::MoeFp8RankView*>(arena_.get() + f.views),
                                         stream);
}

// After launch_moe_grad_rows (dy, dw): dWd (bf16); dh = FP8 dgrad of dy cast 1 x 128 (bf16 out, into dg's rows, then
// widened to fp32 for the swiglu backward); dWg, dWu (bf16); dx partials = FP8 dgrads of dg and du cast 1 x 128 (bf16
// out: dy's rows, free by then, and dxu), summed into the receive buffer (launch_moe_fp8_sum_dx).
void MoeLayer::fp8_backward_experts(const kernels::MoeKernelParams& p, cudaStream_t stream) {
    const int L0 = ep_.rank_begin(), NL = ep_.num_local_ranks(), H = ep_.hidden(), F = ffn_hidden_;
    const bool ue8m0 = ep_.options().precision.ue8m0;
    const Fp8Regions& f = fp8_regions_;
    for (int r = L0; r < L0 + NL; ++r)
        wgrad(r, detail::kProjDown, bf16_at(regions_.h, r, F), bf16_at(regions_.dy, r, H), stream);  // dWd += h^T dy
    kernels::launch_moe_fp8_cast_rows(p, p.dy, H, ue8m0, codes_at(f.codes_a, L0, H), scales_at(f.scales_a, L0, H),
                                      stream);
    for (int r = L0; r < L0 + NL; ++r)  // dh = dy Wd^T
        fp8_gemm(r, detail::kProjDown, GemmOp::kDgrad, codes_at(f.codes_a, r, H), scales_at(f.scales_a, r, H),
                 bf16_at(regions_.dg, r, F), stream);
    kernels::launch_moe_widen(p, p.dg, F, p.f32a, p.f32a_dim, stream);
    kernels::launch_swiglu_backward(p, stream);
    for (int r = L0; r < L0 + NL; ++r) {
        wgrad(r, detail::kProjGate, bf16_at(regions_.x, r, H), bf16_at(regions_.dg, r, F), stream);  // dWg += x^T dg
        wgrad(r, detail::kProjUp, bf16_at(regions_.x, r, H), bf16_at(regions_.du, r, F), stream);    // dWu += x^T du
    }
    kernels::launch_moe_fp8_cast_rows(p, p.dg, F, ue8m0, codes_at(f.codes_a, L0, F), scales_at(f.scales_a, L0, F),
                                      stream);
    kernels::launch_moe_fp8_cast_rows(p, p.du, F, ue8m0, codes_at(f.codes_b, L0, F), scales_at(f.scales_b, L0, F),
                                      stream);
    uint16_t* dxu = reinterpret_cast<uint16_t*>(arena_.get() + f.dxu);
    for (int r = L0; r < L0 + NL; ++r) {
        fp8_gemm(r, detail::kProjGate, GemmOp::kDgrad, codes_at(f.codes_a, r, F), scales_at(f.scales_a, r, F),
                 bf16_at(regions_.dy, r, H), stream);  // dg Wg^T
        fp8_gemm(r, detail::kProjUp, GemmOp::kDgrad, codes_at(f.codes_b, r, F), scales_at(f.scales_b, r, F),
                 dxu + static_cast<size_t>(r - L0) * ep_.layout().nvs * H, stream);  // du Wu^T
    }
    kernels::launch_moe_fp8_sum_dx(p, p.dy, dxu, stream);
}

TrafficReport fp8_traffic(
    const TrafficReport& bf16, const Plan& plan, const std::vector<std::vector<int32_t>>& dst, int H, int ffn_hidden) {
    EVENEP_CHECK(H % kFp8Block == 0 && ffn_hidden % kFp8Block == 0, "fp8 traffic: H = ", H, " and H' = ", ffn_hidden,
                 " must be multiples of ", kFp8Block);
    TrafficReport t = bf16;
    // A dispatched row is H + H/32 bytes: the bf16 model's 2 H'' bytes with H'' = 33 H / 64 (an integer).
    t.dispatch = evenep_traffic(plan, dst, 33 * H / 64, ffn_hidden, /*training=*/false).dispatch;
    const int64_t elems = static_cast<int64_t>(H) * ffn_hidden;
    const int64_t bf16_copy = int64_t{kProjections} * elems * 2;
    const int64_t fp8_copy = int64_t{kProjections} * (elems + 4 * (elems / (kFp8Block * kFp8Block)));
    auto scale = [&](int64_t b) { return b / bf16_copy * fp8_copy; };  // prefetch moves whole copies only
    t.prefetch.bytes = scale(t.prefetch.bytes);
    for (int64_t& b : t.prefetch.send_bytes) b = scale(b);
    for (int64_t& b : t.prefetch.recv_bytes) b = scale(b);
    return t;
}

}  // namespace evenep::cuda
