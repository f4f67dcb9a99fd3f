// Group-level MoE runner, problem generator, dense fp32 reference and error statistics
// (evenep/cpu/moe_layer.hpp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <thread>

#include "evenep/cpu/grouped_gemm.hpp"
#include "evenep/cpu/moe_layer.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/error.hpp"

namespace evenep::cpu {
namespace {

// Hash of element `index` of tensor `tensor` of problem `seed`.
uint64_t tensor_hash(uint64_t seed, uint64_t tensor, uint64_t index) {
    using detail::hash64;
    return hash64(seed ^ hash64(tensor * 0xD1B54A32D192ED03ull + hash64(index)));
}

enum Tensor : uint64_t { kTensorX = 1, kTensorGradOut, kTensorW, kTensorGate, kTensorUp, kTensorDown };

void check_problem(const MoeProblem& p) {
    p.cfg.validate();
    const Config& c = p.cfg.cfg;
    const size_t R = c.R, H = p.cfg.H, K = c.K, E = c.E, F = p.cfg.ffn_hidden;
    EVENEP_CHECK(
        p.s.size() == R && p.x.size() == R && p.topk_idx.size() == R && p.topk_w.size() == R && p.grad_out.size() == R,
        "moe problem: per-rank arrays must have R = ", R, " entries");
    for (size_t r = 0; r < R; ++r) {
        const size_t s = static_cast<size_t>(p.s[r]);
        EVENEP_CHECK(p.x[r].size() == s * H && p.topk_idx[r].size() == s * K && p.topk_w[r].size() == s * K &&
                         p.grad_out[r].size() == s * H,
                     "moe problem: rank ", r, ": array sizes do not match s = ", s);
    }
    EVENEP_CHECK(p.w_gate.size() == E * H * F && p.w_up.size() == E * H * F && p.w_down.size() == E * F * H,
                 "moe problem: expert weights must hold E*H*H' = ", E * H * F, " values each");
}

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

static_assert(MoeRunOptions{}.barrier_timeout == kDefaultBarrierTimeout, "evenep/moe.hpp's default timeout");

MoeProblem make_moe_problem(const BufferConfig& cfg,
                            std::vector<std::vector<int32_t>> topk_idx,
                            std::vector<int32_t> s,
                            uint64_t seed) {
    cfg.validate();
    const Config& c = cfg.cfg;
    const int R = c.R, K = c.K, H = cfg.H, F = cfg.ffn_hidden, E = c.E;
    EVENEP_CHECK(topk_idx.size() == static_cast<size_t>(R) && s.size() == static_cast<size_t>(R),
                 "moe problem: routing has ", topk_idx.size(), " ranks, expected R = ", R);
    MoeProblem p;
    p.cfg = cfg;
    p.s = std::move(s);
    p.topk_idx = std::move(topk_idx);
    p.x.resize(R);
    p.topk_w.resize(R);
    p.grad_out.resize(R);
    for (int r = 0; r < R; ++r) {
        const size_t sr = static_cast<size_t>(p.s[r]);
        EVENEP_CHECK(p.topk_idx[r].size() == sr * K, "moe problem: rank ", r, ": topk_idx has ", p.topk_idx[r].size(),
                     " ids, expected s*K = ", sr * K);
        p.x[r].resize(sr * H);
        p.grad_out[r].resize(sr * H);
        for (size_t i = 0; i < sr * H; ++i) {
            // Index by (rank, token) position in an [R, S, H] array: independent of the other ranks' s.
            const uint64_t idx = (static_cast<uint64_t>(r) * c.S) * H + i;
            p.x[r][i] = detail::random_bf16(tensor_hash(seed, kTensorX, idx), 1.0f);
            p.grad_out[r][i] = detail::random_bf16(tensor_hash(seed, kTensorGradOut, idx), 1.0f);
        }
        p.topk_w[r].assign(sr * K, 0.0f);
        for (size_t t = 0; t < sr; ++t) {
            float sum = 0.0f;
            for (int k = 0; k < K; ++k) {
                if (p.topk_idx[r][t * K + k] < 0) continue;
                const uint64_t idx = (static_cast<uint64_t>(r) * c.S + t) * K + k;
                const float v = 0.05f + detail::unit_float(tensor_hash(seed, kTensorW, idx));
                p.topk_w[r][t * K + k] = v;
                sum += v;
            }
            for (int k = 0; k < K; ++k) p.topk_w[r][t * K + k] = sum > 0 ? p.topk_w[r][t * K + k] / sum : 0.0f;
        }
    }
    const size_t n = static_cast<size_t>(E) * H * F;
    const float a_in_h = std::sqrt(3.0f / static_cast<float>(H)), a_in_f = std::sqrt(3.0f / static_cast<float>(F));
    p.w_gate.resize(n);
    p.w_up.resize(n);
    p.w_down.resize(n);
    for (size_t i = 0; i < n; ++i) {
        p.w_gate[i] = detail::random_bf16(tensor_hash(seed, kTensorGate, i), a_in_h);
        p.w_up[i] = detail::random_bf16(tensor_hash(seed, kTensorUp, i), a_in_h);
        p.w_down[i] = detail::random_bf16(tensor_hash(seed, kTensorDown, i), a_in_f);
    }
    return p;
}

MoeResult run_moe_layer(const MoeProblem& p, const MoeRunOptions& opt) {
    check_problem(p);
    EVENEP_CHECK(opt.num_layers >= 1, "moe run: num_layers = ", opt.num_layers, " must be >= 1");
    const BufferConfig& cfg = p.cfg;
    const Config& c = cfg.cfg;
    const int R = c.R, K = c.K, epn = c.epn();
    const int64_t H = cfg.H, F = cfg.ffn_hidden, n = H * F;
    MoeResult res;
    res.out.resize(R);
    res.dst.resize(R);
    res.sizes = buffer_sizes(cfg);
    if (opt.backward) {
        res.grad_x.resize(R);
        res.grad_topk_w.resize(R);
        res.grad_w_gate.assign(static_cast<size_t>(c.E * n), 0.0f);
        res.grad_w_up.assign(static_cast<size_t>(c.E * n), 0.0f);
        res.grad_w_down.assign(static_cast<size_t>(c.E * n), 0.0f);
    }
    std::vector<LayerTimes> times(R);
    std::vector<TrafficReport> traffic(R);
    LocalTeamGroup group(R, opt.barrier_timeout);
    run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        Buffer buffer(team, cfg, opt.mode);
        ExpertPool pool(team, cfg);
        std::vector<std::unique_ptr<ExpertWeights>> weights;
        std::vector<std::unique_ptr<MoeLayer>> layers;
        const std::vector<Bf16>* src[detail::kNumProjections] = {&p.w_gate, &p.w_up, &p.w_down};
        for (int l = 0; l < opt.num_layers; ++l) {
            weights.push_back(std::make_unique<ExpertWeights>(team, cfg));
            for (int proj = 0; proj < detail::kNumProjections; ++proj)
                for (int le = 0; le < epn; ++le) {
                    const auto w = weights.back()->weight(proj, le);
                    const auto first = src[proj]->begin() + static_cast<int64_t>(r * epn + le) * n;
                    std::copy(first, first + n, w.begin());
                }
            layers.push_back(std::make_unique<MoeLayer>(buffer, pool, *weights.back()));
        }
        const size_t s = static_cast<size_t>(p.s[r]);
        DispatchArgs args;
        args.s = p.s[r];
        args.x = p.x[r];
        args.topk_idx = p.topk_idx[r];
        args.topk_w = p.topk_w[r];
        args.s_total = 0;
        for (int v : p.s) args.s_total += v;
        std::vector<Bf16> scratch_out(s * H), scratch_gx(s * H);
        std::vector<float> scratch_gw(s * K);
        res.out[r].resize(s * H);
        for (int l = 0; l < opt.num_layers; ++l) layers[l]->forward(args, l == 0 ? res.out[r] : scratch_out);
        if (opt.backward) {
            res.grad_x[r].resize(s * H);
            res.grad_topk_w[r].resize(s * K);
            for (int l = opt.num_layers - 1; l >= 0; --l) {
                if (l == 0)
                    layers[l]->backward(p.grad_out[r], res.grad_x[r], res.grad_topk_w[r]);
                else
                    layers[l]->backward(p.grad_out[r], scratch_gx, scratch_gw);
            }
            std::vector<float>* dst[detail::kNumProjections] = {&res.grad_w_gate, &res.grad_w_up, &res.grad_w_down};
            for (int proj = 0; proj < detail::kNumProjections; ++proj)
                for (int le = 0; le < epn; ++le) {
                    const auto gsrc = weights[0]->grad(proj, le);
                    std::copy(gsrc.begin(), gsrc.end(), dst[proj]->begin() + static_cast<int64_t>(r * epn + le) * n);
                }
        }
        times[r] = layers[0]->times();
        traffic[r] = layers[0]->traffic();
        res.dst[r] = layers[0]->handle().dst;
        if (r == 0) res.plan = layers[0]->handle().plan;
    });
    res.traffic = TrafficReport(R);
    for (int r = 0; r < R; ++r) {
        res.times.max_with(times[r]);
        PhaseTraffic* mine[] = {&res.traffic.gather,           &res.traffic.dispatch,          &res.traffic.combine,
                                &res.traffic.combine_backward, &res.traffic.dispatch_backward, &res.traffic.prefetch,
                                &res.traffic.reduce_grad};
        const PhaseTraffic* theirs[] = {
            &traffic[r].gather,           &traffic[r].dispatch,          &traffic[r].combine,
            &traffic[r].combine_backward, &traffic[r].dispatch_backward, &traffic[r].prefetch,
            &traffic[r].reduce_grad};
        for (size_t i = 0; i < std::size(mine); ++i) mine[i]->add(*theirs[i]);
    }
    res.traffic.max_rank_entries = traffic[0].max_rank_entries;
    res.traffic.total_entries = traffic[0].total_entries;
    return res;
}

DenseResult dense_moe_reference(const MoeProblem& p, bool backward, int num_threads) {
    check_problem(p);
    const Config& c = p.cfg.cfg;
    const int R = c.R, K = c.K, E = c.E;
    const int64_t H = p.cfg.H, F = p.cfg.ffn_hidden, n = H * F;
    // Entries of every expert in (rank, token, k) order; per entry results stored by flat entry index.
    std::vector<int64_t> rank_base(R + 1, 0);
    for (int r = 0; r < R; ++r) rank_base[r + 1] = rank_base[r] + static_cast<int64_t>(p.s[r]) * K;
    const int64_t num_entries = rank_base[R];
    std::vector<std::vector<int64_t>> by_expert(E);
    for (int r = 0; r < R; ++r)
        for (int64_t i = 0; i < static_cast<int64_t>(p.s[r]) * K; ++i) {
            const int32_t e = p.topk_idx[r][i];
            if (e < 0) continue;
            EVENEP_CHECK(e < E, "dense reference: rank ", r, ", entry ", i, ": expert id ", e, " >= E = ", E);
            by_expert[e].push_back(rank_base[r] + i);
        }
    std::vector<float> y_entry(static_cast<size_t>(num_entries * H), 0.0f);
    std::vector<float> dx_entry(backward ? static_cast<size_t>(num_entries * H) : 0, 0.0f);
    std::vector<float> dw_entry(backward ? static_cast<size_t>(num_entries) : 0, 0.0f);
    DenseResult res;
    if (backward) {
        res.grad_w_gate.assign(static_cast<size_t>(E * n), 0.0f);
        res.grad_w_up.assign(static_cast<size_t>(E * n), 0.0f);
        res.grad_w_down.assign(static_cast<size_t>(E * n), 0.0f);
    }
    auto locate = [&](int64_t flat, int& r, int64_t& t, int& k) {
        r = static_cast<int>(std::upper_bound(rank_base.begin(), rank_base.end(), flat) - rank_base.begin()) - 1;
        const int64_t local = flat - rank_base[r];
        t = local / K;
        k = static_cast<int>(local % K);
    };
    auto run_expert = [&](int e) {
        const auto& list = by_expert[e];
        const int64_t m = static_cast<int64_t>(list.size());
        if (m == 0) return;
        std::vector<float> wg(n), wu(n), wd(n);
        for (int64_t i = 0; i < n; ++i) {
            wg[i] = bf16_to_float(p.w_gate[e * n + i]);
            wu[i] = bf16_to_float(p.w_up[e * n + i]);
            wd[i] = bf16_to_float(p.w_down[e * n + i]);
        }
        std::vector<float> x(m * H), g(m * F), u(m * F), h(m * F), y(m * H);
        for (int64_t j = 0; j < m; ++j) {
            int r, k;
            int64_t t;
            locate(list[j], r, t, k);
            for (int64_t i = 0; i < H; ++i) x[j * H + i] = bf16_to_float(p.x[r][t * H + i]);
        }
        gemm_f32(x.data(), wg.data(), g.data(), m, H, F, false);
        gemm_f32(x.data(), wu.data(), u.data(), m, H, F, false);
        for (int64_t i = 0; i < m * F; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
        gemm_f32(h.data(), wd.data(), y.data(), m, F, H, false);
        for (int64_t j = 0; j < m; ++j) std::copy(&y[j * H], &y[(j + 1) * H], &y_entry[list[j] * H]);
        if (!backward) return;
        std::vector<float> go(m * H), dy(m * H), dh(m * F), dg(m * F), du(m * F), dx(m * H);
        for (int64_t j = 0; j < m; ++j) {
            int r, k;
            int64_t t;
            locate(list[j], r, t, k);
            const float w = p.topk_w[r][t * K + k];
            float dot = 0.0f;
            for (int64_t i = 0; i < H; ++i) {
                const float gr = bf16_to_float(p.grad_out[r][t * H + i]);
                go[j * H + i] = gr;
                dot += gr * y[j * H + i];
                dy[j * H + i] = w * gr;
            }
            dw_entry[list[j]] = dot;
        }
        // Transposed weights for the data gradients: wdT [H, F], wgT/wuT [F, H].
        std::vector<float> wdT(n), wgT(n), wuT(n);
        for (int64_t a = 0; a < F; ++a)
            for (int64_t b = 0; b < H; ++b) {
                wdT[b * F + a] = wd[a * H + b];
                wgT[a * H + b] = wg[b * F + a];
                wuT[a * H + b] = wu[b * F + a];
            }
        gemm_tn_accumulate_f32(h.data(), dy.data(), &res.grad_w_down[e * n], m, F, H);
        gemm_f32(dy.data(), wdT.data(), dh.data(), m, H, F, false);
        for (int64_t i = 0; i < m * F; ++i) {
            const float s = sigmoid(g[i]);
            dg[i] = dh[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
            du[i] = dh[i] * g[i] * s;
        }
        gemm_tn_accumulate_f32(x.data(), dg.data(), &res.grad_w_gate[e * n], m, H, F);
        gemm_tn_accumulate_f32(x.data(), du.data(), &res.grad_w_up[e * n], m, H, F);
        gemm_f32(dg.data(), wgT.data(), dx.data(), m, F, H, false);
        gemm_f32(du.data(), wuT.data(), dx.data(), m, F, H, true);
        for (int64_t j = 0; j < m; ++j) std::copy(&dx[j * H], &dx[(j + 1) * H], &dx_entry[list[j] * H]);
    };
    std::atomic<int> next{0};
    auto worker = [&] {
        for (int e = next.fetch_add(1); e < E; e = next.fetch_add(1)) run_expert(e);
    };
    const int threads = std::max(1, std::min(num_threads, E));
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();

    // Per token, sum over k ascending.
    res.out.resize(R);
    if (backward) {
        res.grad_x.resize(R);
        res.grad_topk_w.resize(R);
    }
    for (int r = 0; r < R; ++r) {
        const int64_t s = p.s[r];
        res.out[r].assign(s * H, 0.0f);
        if (backward) {
            res.grad_x[r].assign(s * H, 0.0f);
            res.grad_topk_w[r].assign(s * K, 0.0f);
        }
        for (int64_t t = 0; t < s; ++t)
            for (int k = 0; k < K; ++k) {
                const int64_t flat = rank_base[r] + t * K + k;
                if (p.topk_idx[r][t * K + k] < 0) continue;
                const float w = p.topk_w[r][t * K + k];
                for (int64_t i = 0; i < H; ++i) res.out[r][t * H + i] += w * y_entry[flat * H + i];
                if (backward) {
                    for (int64_t i = 0; i < H; ++i) res.grad_x[r][t * H + i] += dx_entry[flat * H + i];
                    res.grad_topk_w[r][t * K + k] = dw_entry[flat];
                }
            }
    }
    return res;
}

std::vector<std::vector<float>> dense_moe_forward_f64(const MoeProblem& p) {
    check_problem(p);
    const Config& c = p.cfg.cfg;
    const int R = c.R, K = c.K, E = c.E;
    const int64_t H = p.cfg.H, F = p.cfg.ffn_hidden, n = H * F;
    std::vector<std::vector<double>> acc(R);
    for (int r = 0; r < R; ++r) acc[r].assign(static_cast<size_t>(p.s[r]) * H, 0.0);
    std::vector<double> wg(n), wu(n), wd(n), x(H), g(F), u(F), y(H);
    for (int e = 0; e < E; ++e) {
        bool used = false;
        for (int r = 0; r < R; ++r)
            for (int32_t id : p.topk_idx[r]) used = used || id == e;
        if (!used) continue;
        for (int64_t i = 0; i < n; ++i) {
            wg[i] = bf16_to_float(p.w_gate[e * n + i]);
            wu[i] = bf16_to_float(p.w_up[e * n + i]);
            wd[i] = bf16_to_float(p.w_down[e * n + i]);
        }
        for (int r = 0; r < R; ++r)
            for (int64_t t = 0; t < p.s[r]; ++t)
                for (int k = 0; k < K; ++k) {
                    if (p.topk_idx[r][t * K + k] != e) continue;
                    for (int64_t i = 0; i < H; ++i) x[i] = bf16_to_float(p.x[r][t * H + i]);
                    std::fill(g.begin(), g.end(), 0.0);
                    std::fill(u.begin(), u.end(), 0.0);
                    for (int64_t i = 0; i < H; ++i)
                        for (int64_t o = 0; o < F; ++o) {
                            g[o] += x[i] * wg[i * F + o];
                            u[o] += x[i] * wu[i * F + o];
                        }
                    std::fill(y.begin(), y.end(), 0.0);
                    for (int64_t o = 0; o < F; ++o) {
                        const double h = g[o] / (1.0 + std::exp(-g[o])) * u[o];
                        for (int64_t i = 0; i < H; ++i) y[i] += h * wd[o * H + i];
                    }
                    const double w = p.topk_w[r][t * K + k];
                    for (int64_t i = 0; i < H; ++i) acc[r][t * H + i] += w * y[i];
                }
    }
    std::vector<std::vector<float>> out(R);
    for (int r = 0; r < R; ++r) out[r].assign(acc[r].begin(), acc[r].end());
    return out;
}

double ErrorStats::rel() const { return max_abs / std::max(max_ref, 1e-30); }
double ErrorStats::mean_rel() const { return sum_abs / std::max(sum_ref, 1e-30); }

ErrorStats compare(std::span<const float> got, std::span<const float> ref) {
    EVENEP_CHECK(got.size() == ref.size(), "compare: sizes ", got.size(), " and ", ref.size(), " differ");
    ErrorStats st;
    for (size_t i = 0; i < got.size(); ++i) {
        const double g = got[i], r = ref[i];
        if (std::isfinite(r) && !std::isfinite(g)) st.nonfinite = true;
        st.max_abs = std::max(st.max_abs, std::abs(g - r));
        st.max_ref = std::max(st.max_ref, std::abs(r));
        st.sum_abs += std::abs(g - r);
        st.sum_ref += std::abs(r);
    }
    if (st.nonfinite) st.max_abs = std::numeric_limits<double>::infinity();
    return st;
}

ErrorStats compare(std::span<const Bf16> got, std::span<const float> ref) {
    std::vector<float> g(got.size());
    for (size_t i = 0; i < got.size(); ++i) g[i] = bf16_to_float(got[i]);
    return compare(std::span<const float>(g), ref);
}

namespace {
template <typename T>
ErrorStats compare_ranks(const std::vector<std::vector<T>>& got, const std::vector<std::vector<float>>& ref) {
    EVENEP_CHECK(got.size() == ref.size(), "compare: ", got.size(), " and ", ref.size(), " ranks");
    ErrorStats all;
    for (size_t r = 0; r < got.size(); ++r) {
        const ErrorStats st = compare(std::span<const T>(got[r]), std::span<const float>(ref[r]));
        all.max_abs = std::max(all.max_abs, st.max_abs);
        all.max_ref = std::max(all.max_ref, st.max_ref);
        all.sum_abs += st.sum_abs;
        all.sum_ref += st.sum_ref;
        all.nonfinite = all.nonfinite || st.nonfinite;
    }
    return all;
}
}  // namespace

ErrorStats compare(const std::vector<std::vector<Bf16>>& got, const std::vector<std::vector<float>>& ref) {
    return compare_ranks(got, ref);
}
ErrorStats compare(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref) {
    return compare_ranks(got, ref);
}

Tolerances default_tolerances() {
    Tolerances t;
    t.out = 2e-2;
    t.grad_x = 2e-2;
    t.grad_topk_w = 2e-2;
    t.grad_w = 2e-2;
    return t;
}

}  // namespace evenep::cpu
