// One MoE layer (SwiGLU experts) forward and backward through the EP path, and its group-level runner
// (evenep/cpu/moe_layer.hpp).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "evenep/cpu/moe_layer.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/detail/row_grad.hpp"
#include "evenep/error.hpp"

namespace evenep::cpu {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
float silu(float g) { return g * sigmoid(g); }
float silu_grad(float g) {
    const float s = sigmoid(g);
    return s * (1.0f + g * (1.0f - s));
}

// Calls fn(row) for every used row of this rank's groups, in row order.
template <typename F>
void for_each_used_row(const DispatchHandle& h, F&& fn) {
    const auto cu = h.cu_seqlens();
    const auto count = h.group_count();
    for (size_t g = 0; g < cu.size(); ++g) {
        const int32_t begin = g == 0 ? 0 : cu[g - 1];
        for (int32_t row = begin; row < begin + count[g]; ++row) fn(row);
    }
}

// FP8 operand of the rows [0, rows) of `in` ([rows, dim] bf16): the 1 x 128 cast (evenep/detail/fp8.hpp).
struct Fp8Rows {
    std::vector<Fp8E4m3> codes;
    std::vector<float> scales;
    Fp8Rows(std::span<const Bf16> in, int64_t rows, int64_t dim, bool ue8m0)
        : codes(static_cast<size_t>(rows * dim)), scales(static_cast<size_t>(rows * dim / kFp8Block)) {
        quantize_rows_fp8(in, rows, dim, ue8m0, codes, scales);
    }
};

void fp8_tables(const ExpertPool& pool,
                const DispatchHandle& h,
                const ExpertWeights& w,
                std::vector<Fp8Weight> (&out)[detail::kNumProjections]) {
    for (int p = 0; p < detail::kNumProjections; ++p) pool.weight_table_fp8(h.plan, w, p, out[p]);
}

}  // namespace

MoeLayer::MoeLayer(Buffer& buffer, ExpertPool& pool, ExpertWeights& weights)
    : buffer_(buffer), pool_(pool), weights_(weights), traffic_(buffer.config().cfg.R) {
    const BufferConfig& c = buffer.config();
    EVENEP_CHECK(pool.rank() == buffer.rank() && weights.rank() == buffer.rank(), "moe layer: buffer of rank ",
                 buffer.rank(), ", pool of rank ", pool.rank(), ", weights of rank ", weights.rank());
    EVENEP_CHECK(weights.config().H == c.H && weights.config().ffn_hidden == c.ffn_hidden &&
                     weights.config().cfg.E == c.cfg.E && weights.config().cfg.R == c.cfg.R,
                 "moe layer: weights are ", weights.config().to_string(), ", the buffer ", c.to_string());
    EVENEP_CHECK(weights.config().precision == c.precision, "moe layer: weights are ", weights.config().to_string(),
                 ", the buffer ", c.to_string(), " (precision differs)");
    // The auto policy predicts this layer's step (docs/auto.md), as cuda::MoeLayer sets its Ep's: the oracle and the
    // GPU layer plan the same plans.
    if (c.cfg.policy == PlannerPolicy::kAuto) buffer.set_auto_model(layer_auto_cost_model(c));
    const size_t nvs = static_cast<size_t>(c.cfg.recv_rows());
    x_rows_.resize(nvs * c.H);
    g_rows_.resize(nvs * c.ffn_hidden);
    u_rows_.resize(nvs * c.ffn_hidden);
    h_rows_.resize(nvs * c.ffn_hidden);
    y_rows_.resize(nvs * c.H);
}

void MoeLayer::forward(const DispatchArgs& args, std::span<Bf16> out) {
    const BufferConfig& c = buffer_.config();
    const int64_t H = c.H, F = c.ffn_hidden, nvs = c.cfg.recv_rows();
    const bool fp8 = c.precision.fp8, ue8m0 = c.precision.ue8m0;
    times_ = LayerTimes{};
    traffic_ = TrafficReport(c.cfg.R);
    has_forward_ = false;

    auto t0 = Clock::now();
    handle_ = buffer_.dispatch(args);
    times_.dispatch = seconds_since(t0);
    times_.plan = buffer_.last_plan_seconds();
    traffic_.gather = buffer_.last_gather_traffic();
    traffic_.dispatch = buffer_.last_traffic();
    traffic_.max_rank_entries = *std::max_element(handle_.plan.q.begin(), handle_.plan.q.end());
    traffic_.total_entries = handle_.plan.total_entries();

    t0 = Clock::now();
    if (fp8) weights_.cast_fp8();  // before the prefetch's start barrier: copies read the casts
    pool_.prefetch_weight(handle_.plan, weights_);
    times_.prefetch = seconds_since(t0);
    traffic_.prefetch = pool_.last_traffic();

    // Expert computation on this rank's receive buffer (zero-copy input; the rows are saved for backward).
    t0 = Clock::now();
    const int32_t rows = handle_.rows_used();
    const GroupedGemmShape hf{handle_.cu_seqlens(), handle_.group_count(), static_cast<int>(H), static_cast<int>(F)};
    const GroupedGemmShape fh{handle_.cu_seqlens(), handle_.group_count(), static_cast<int>(F), static_cast<int>(H)};
    std::vector<float> gf(static_cast<size_t>(nvs * F)), uf(static_cast<size_t>(nvs * F));
    std::vector<const Bf16*> wg, wu, wd;
    std::vector<Fp8Weight> w8[detail::kNumProjections];
    if (fp8) {
        // The e4m3 rows feed the GEMMs; their bf16 dequantisation bf16(float(q) * s) is saved for the bf16 wgrad.
        const auto x8 = buffer_.recv_x8();
        const auto xs = buffer_.recv_scale();
        for (int64_t i = 0; i < static_cast<int64_t>(rows) * H; ++i)
            x_rows_[i] = float_to_bf16(fp8_dequantize(x8[i], xs[i / kFp8Block]));
        fp8_tables(pool_, handle_, weights_, w8);
        grouped_gemm_fp8(hf, w8[detail::kProjGate], false, x8, xs, gf, false);
        grouped_gemm_fp8(hf, w8[detail::kProjUp], false, x8, xs, uf, false);
    } else {
        const auto recv = buffer_.recv_x();
        std::copy(recv.begin(), recv.begin() + static_cast<int64_t>(rows) * H, x_rows_.begin());
        pool_.weight_table(handle_.plan, weights_, detail::kProjGate, wg);
        pool_.weight_table(handle_.plan, weights_, detail::kProjUp, wu);
        pool_.weight_table(handle_.plan, weights_, detail::kProjDown, wd);
        grouped_gemm(hf, wg, false, x_rows_, gf, false);
        grouped_gemm(hf, wu, false, x_rows_, uf, false);
    }
    for_each_used_row(handle_, [&](int32_t row) {
        for (int64_t i = row * F; i < (row + 1) * F; ++i) {
            const Bf16 g = float_to_bf16(gf[i]), u = float_to_bf16(uf[i]);
            g_rows_[i] = g;
            u_rows_[i] = u;
            h_rows_[i] = float_to_bf16(silu(bf16_to_float(g)) * bf16_to_float(u));
        }
    });
    std::vector<float> yf(static_cast<size_t>(nvs * H));
    if (fp8) {
        const Fp8Rows h8(h_rows_, rows, F, ue8m0);
        grouped_gemm_fp8(fh, w8[detail::kProjDown], false, h8.codes, h8.scales, yf, false);
    } else {
        grouped_gemm(fh, wd, false, h_rows_, yf, false);
    }
    for_each_used_row(handle_, [&](int32_t row) {
        for (int64_t i = row * H; i < (row + 1) * H; ++i) y_rows_[i] = float_to_bf16(yf[i]);
    });
    times_.expert_forward = seconds_since(t0);

    t0 = Clock::now();
    CombineArgs ca;
    ca.y = y_rows_;
    ca.apply_weights = true;
    ca.out = out;
    buffer_.combine(handle_, ca);
    times_.combine = seconds_since(t0);
    traffic_.combine = buffer_.last_traffic();
    has_forward_ = true;
}

void MoeLayer::backward(std::span<const Bf16> grad_out, std::span<Bf16> grad_x, std::span<float> grad_topk_w) {
    const BufferConfig& c = buffer_.config();
    const int64_t H = c.H, F = c.ffn_hidden, nvs = c.cfg.recv_rows();
    const bool fp8 = c.precision.fp8, ue8m0 = c.precision.ue8m0;
    const int32_t rows = handle_.rows_used();
    // Same decision on every rank (same config and call sequence), so no rank is left at a barrier.
    EVENEP_CHECK(has_forward_, "moe layer: rank ", buffer_.rank(), ": backward without a forward");
    EVENEP_CHECK(c.cfg.num_slots() == c.cfg.epn(), "moe layer: training needs B = epn (B = ", c.cfg.num_slots(),
                 ", epn = ", c.cfg.epn(), ")");

    auto t0 = Clock::now();
    buffer_.combine_backward(handle_, grad_out);
    times_.combine_backward = seconds_since(t0);
    traffic_.combine_backward = buffer_.last_traffic();

    // Other layers may have used the shared pool since forward: prefetch again (copies only what changed).
    t0 = Clock::now();
    if (fp8) weights_.cast_fp8();  // a no-op unless the weights changed since forward
    pool_.prefetch_weight(handle_.plan, weights_);
    times_.prefetch += seconds_since(t0);
    traffic_.prefetch.add(pool_.last_traffic());

    t0 = Clock::now();
    const auto grad_rows = buffer_.recv_x();  // grad_out of each row's token
    const auto w_rows = buffer_.recv_w();     // route weight of each row's entry
    std::vector<Bf16> dy(static_cast<size_t>(nvs * H)), dg(static_cast<size_t>(nvs * F)),
        du(static_cast<size_t>(nvs * F));
    std::vector<float> dw(static_cast<size_t>(nvs), 0.0f);
    // dy = bf16(w * grad_row), dw = <grad_row, y> in the CUDA layer's summation order (evenep/detail/row_grad.hpp).
    for_each_used_row(handle_, [&](int32_t row) {
        dw[row] = detail::row_grad(grad_rows.data() + row * H, y_rows_.data() + row * H, w_rows[row],
                                   dy.data() + row * H, H);
    });
    std::vector<const Bf16*> wg, wu, wd;
    std::vector<Fp8Weight> w8[detail::kNumProjections];
    std::vector<float*> gg, gu, gd;
    if (fp8) {
        fp8_tables(pool_, handle_, weights_, w8);
    } else {
        pool_.weight_table(handle_.plan, weights_, detail::kProjGate, wg);
        pool_.weight_table(handle_.plan, weights_, detail::kProjUp, wu);
        pool_.weight_table(handle_.plan, weights_, detail::kProjDown, wd);
    }
    pool_.grad_table(handle_.plan, weights_, detail::kProjGate, gg);
    pool_.grad_table(handle_.plan, weights_, detail::kProjUp, gu);
    pool_.grad_table(handle_.plan, weights_, detail::kProjDown, gd);
    const auto cu = handle_.cu_seqlens();
    const auto cnt = handle_.group_count();
    const GroupedGemmShape hf{cu, cnt, static_cast<int>(H), static_cast<int>(F)};
    const GroupedGemmShape fh{cu, cnt, static_cast<int>(F), static_cast<int>(H)};
    grouped_gemm_wgrad(fh, h_rows_, dy, gd);  // dWd += h^T · dy
    std::vector<float> dh(static_cast<size_t>(nvs * F));
    if (fp8) {
        const Fp8Rows dy8(dy, rows, H, ue8m0);
        grouped_gemm_fp8(hf, w8[detail::kProjDown], true, dy8.codes, dy8.scales, dh, false);
    } else {
        grouped_gemm(hf, wd, true, dy, dh, false);  // dh = dy · Wd^T
    }
    for_each_used_row(handle_, [&](int32_t row) {
        for (int64_t i = row * F; i < (row + 1) * F; ++i) {
            const float g = bf16_to_float(g_rows_[i]), u = bf16_to_float(u_rows_[i]);
            dg[i] = float_to_bf16(dh[i] * u * silu_grad(g));
            du[i] = float_to_bf16(dh[i] * silu(g));
        }
    });
    grouped_gemm_wgrad(hf, x_rows_, dg, gg);  // dWg += x^T · dg
    grouped_gemm_wgrad(hf, x_rows_, du, gu);  // dWu += x^T · du
    std::vector<float> dxf(static_cast<size_t>(nvs * H));
    if (fp8) {
        const Fp8Rows dg8(dg, rows, F, ue8m0), du8(du, rows, F, ue8m0);
        grouped_gemm_fp8(fh, w8[detail::kProjGate], true, dg8.codes, dg8.scales, dxf, false);
        grouped_gemm_fp8(fh, w8[detail::kProjUp], true, du8.codes, du8.scales, dxf, true);
    } else {
        grouped_gemm(fh, wg, true, dg, dxf, false);  // dx = dg · Wg^T
        grouped_gemm(fh, wu, true, du, dxf, true);   //    + du · Wu^T
    }
    // The input gradient rows go into the receive buffer in place (zero-copy for dispatch_backward).
    const auto dx_rows = buffer_.recv_x();
    for_each_used_row(handle_, [&](int32_t row) {
        for (int64_t i = row * H; i < (row + 1) * H; ++i) dx_rows[i] = float_to_bf16(dxf[i]);
    });
    times_.expert_backward = seconds_since(t0);

    t0 = Clock::now();
    buffer_.dispatch_backward(handle_, {}, dw, grad_x, grad_topk_w);
    times_.dispatch_backward = seconds_since(t0);
    traffic_.dispatch_backward = buffer_.last_traffic();

    t0 = Clock::now();
    pool_.reduce_grad(handle_.plan, weights_);
    times_.reduce_grad = seconds_since(t0);
    traffic_.reduce_grad = pool_.last_traffic();
}

}  // namespace evenep::cpu
