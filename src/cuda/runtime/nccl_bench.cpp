// The multi-process benchmark (include/evenep/cuda/nccl_bench.hpp; formulas in docs/multi-gpu.md).
#include "evenep/cuda/nccl_bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <sstream>

#include "evenep/cuda/bench.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/nccl_ep.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep::cuda {
namespace {

uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Token payload of (rank, token, column): column 0 holds the rank, column 1 the token, the others a finite hash
// (|v| < 2), so a received row names its source.
uint16_t tag_bits(int r, int t, int c) {
    if (c == 0) return static_cast<uint16_t>(r);
    if (c == 1) return static_cast<uint16_t>(t);
    return static_cast<uint16_t>(
        mix64((static_cast<uint64_t>(r) << 40) ^ (static_cast<uint64_t>(t) << 16) ^ static_cast<uint64_t>(c)) & 0x3FFF);
}

struct Stats {
    double median_us = 0, min_us = 0, max_us = 0;
};

class Bench {
  public:
    Bench(NcclTeam& team, cudaStream_t stream, int warmup, int iters)
        : team_(team), stream_(stream), warmup_(warmup), iters_(iters) {}

    // Times `op` on the stream: each iteration a device-side team barrier (all ranks start together), then an
    // event pair around `op`. Returns the slowest rank's median and the extremes over ranks.
    Stats time(const std::function<void()>& op) {
        for (int i = 0; i < warmup_; ++i) {
            team_.device_barrier(stream_);
            op();
        }
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream_));
        std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(iters_));
        for (cudaEvent_t& e : ev) EVENEP_CUDA_CHECK(cudaEventCreate(&e));
        for (int i = 0; i < iters_; ++i) {
            team_.device_barrier(stream_);
            EVENEP_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream_));
            op();
            EVENEP_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream_));
        }
        team_.check(stream_);
        std::vector<double> us(iters_);
        for (int i = 0; i < iters_; ++i) {
            float ms = 0;
            EVENEP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
            us[i] = 1000.0 * ms;
        }
        for (cudaEvent_t& e : ev) cudaEventDestroy(e);
        std::sort(us.begin(), us.end());
        const double median = iters_ % 2 ? us[iters_ / 2] : 0.5 * (us[iters_ / 2 - 1] + us[iters_ / 2]);
        const std::vector<int64_t> all = team_.all_gather(std::vector<int64_t>{static_cast<int64_t>(median * 1000),
                                                                               static_cast<int64_t>(us.front() * 1000),
                                                                               static_cast<int64_t>(us.back() * 1000)});
        Stats s;
        s.min_us = 1e300;
        for (size_t r = 0; r < all.size() / 3; ++r) {
            s.median_us = std::max(s.median_us, all[3 * r] / 1000.0);
            s.min_us = std::min(s.min_us, all[3 * r + 1] / 1000.0);
            s.max_us = std::max(s.max_us, all[3 * r + 2] / 1000.0);
        }
        return s;
    }

    double max_over_ranks(double v) {
        const std::vector<int64_t> all = team_.all_gather(std::vector<int64_t>{static_cast<int64_t>(v)});
        return static_cast<double>(*std::max_element(all.begin(), all.end()));
    }
    int64_t sum_over_ranks(int64_t v) {
        const std::vector<int64_t> all = team_.all_gather(std::vector<int64_t>{v});
        return std::accumulate(all.begin(), all.end(), int64_t{0});
    }

  private:
    NcclTeam& team_;
    cudaStream_t stream_;
    int warmup_, iters_;
};

template <typename T>
struct DevBuf {
    T* p = nullptr;
    explicit DevBuf(size_t n) {
        EVENEP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), sizeof(T) * (n ? n : 1)));
        EVENEP_CUDA_CHECK(cudaMemset(p, 0, sizeof(T) * (n ? n : 1)));
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
};

bool want(const MultiBenchConfig& c, const std::string& op) {
    return c.ops.empty() || std::find(c.ops.begin(), c.ops.end(), op) != c.ops.end();
}

// Expected combine output (unweighted, y = the dispatched rows themselves) of token t, column c, in the kernels'
// order: per destination rank in the order of its first k, a partial over its entries (k ascending) from +0;
// then the partials from +0; one bf16 rounding.
uint16_t expected_combine(const std::vector<int32_t>& dst, int K, int64_t nvs, int me, int t, int c) {
    const float v = bf16_to_float(Bf16{tag_bits(me, t, c)});
    int order[32];
    float partial[32];
    int n = 0;
    for (int k = 0; k < K; ++k) {
        const int32_t code = dst[static_cast<size_t>(t) * K + k];
        if (detail::is_masked(code)) continue;
        const int d = static_cast<int>(detail::decode_dst(code) / nvs);
        int j = 0;
        while (j < n && order[j] != d) ++j;
        if (j == n) order[n] = d, partial[n] = 0.0f, ++n;
        partial[j] = partial[j] + v;
    }
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc = acc + partial[j];
    return float_to_bf16(acc).bits;
}

}  // namespace

MultiBenchResult bench_multi(const NcclBootstrap& boot, const MultiBenchConfig& mc) {
    const int R = boot.world_size, me = boot.rank;
    Config cfg;
    cfg.R = R;
    cfg.E = mc.experts_per_rank * R;
    cfg.K = mc.K;
    cfg.S = mc.S;
    cfg.tp = mc.tp;
    cfg.validate();
    EVENEP_CHECK(mc.iters >= 1 && mc.warmup >= 0, "bench multi: iters = ", mc.iters, ", warmup = ", mc.warmup);
    EVENEP_CHECK(mc.projections >= 1 && mc.projections <= 3, "bench multi: projections = ", mc.projections);
    const int H = mc.H, K = cfg.K, S = cfg.S;
    EpOptions opt;
    opt.mode = mc.mode;
    opt.sm_budget = mc.sm_budget;
    opt.team.timeout_ms = 20000;
    NcclEp ep(cfg, H, boot, opt);
    NcclTeam& team = ep.team();
    ExpertsShape es;
    es.num_projections = mc.projections;
    es.elems = static_cast<int64_t>(H) * mc.ffn_hidden;
    const bool experts = want(mc, "prefetch") || want(mc, "reduce") || want(mc, "total");
    std::unique_ptr<Experts> ex;
    if (experts) ex = std::make_unique<Experts>(ep, es);
    std::unique_ptr<NcclAllToAll> a2a;
    if (want(mc, "a2a")) a2a = std::make_unique<NcclAllToAll>(team, cfg, H);

    cudaStream_t sa = nullptr, sb = nullptr;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    cudaEvent_t ev_plan = nullptr, ev_b = nullptr;
    EVENEP_CUDA_CHECK(cudaEventCreateWithFlags(&ev_plan, cudaEventDisableTiming));
    EVENEP_CUDA_CHECK(cudaEventCreateWithFlags(&ev_b, cudaEventDisableTiming));
    Bench bench(team, sa, mc.warmup, mc.iters);

    MultiBenchResult res;
    res.R = R;
    res.nccl_version = nccl_runtime_version();
    res.device = device_summary();
    std::ostringstream shape_os;
    shape_os << "R" << R << " E" << cfg.E << " K" << K << " S" << S << " H" << H;
    const std::string shape = shape_os.str();
    auto add_row = [&](const std::string& op, double maxvio, const Stats& st, double bytes, double link, int64_t wrong,
                       int blocks, const std::string& note) {
        MultiBenchRow row;
        row.op = op;
        row.shape = shape;
        row.maxvio = maxvio;
        row.median_us = st.median_us;
        row.min_us = st.min_us;
        row.max_us = st.max_us;
        row.bytes = bench.max_over_ranks(bytes);
        row.link_bytes = bench.max_over_ranks(link);
        row.gbps = st.median_us > 0 ? row.bytes / (st.median_us * 1e3) : 0;
        row.link_gbps = st.median_us > 0 ? row.link_bytes / (st.median_us * 1e3) : 0;
        row.frac_p2p = res.p2p_gbps > 0 ? row.gbps / res.p2p_gbps : 0;
        row.wrong = wrong;
        row.blocks_per_rank = blocks;
        row.iters = mc.iters;
        row.note = note;
        res.rows.push_back(row);
    };

    // ---- Anchors: every rank writes into its next peer's window at once (NVLink); a local copy (HBM). ----
    {
        const size_t bytes = static_cast<size_t>(mc.copy_mib * (1 << 20)) / 16 * 16;
        const NcclWindowView& w = team.alloc_window(bytes);
        DevBuf<char> src(bytes);
        launch_fill_random_bf16(reinterpret_cast<uint16_t*>(src.p), bytes / 2, 77 + me, sa);
        int num_sms = 0, dev = 0;
        EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
        EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
        char* peer = w.peers[(me + 1) % R];
        for (int blocks : {4 * num_sms, 4 * mc.sm_budget}) {
            const Stats st = bench.time([&] { launch_copy_vec16(peer, src.p, bytes, blocks, sa); });
            res.p2p_gbps = std::max(res.p2p_gbps, static_cast<double>(bytes) / (st.median_us * 1e3));
            add_row(blocks == 4 * num_sms ? "p2p_copy" : "p2p_copy_budget", 0, st, static_cast<double>(bytes),
                    static_cast<double>(bytes), -1, blocks, "every rank writes its next peer's window at once");
        }
        const Stats st = bench.time([&] { launch_copy_vec16(w.local, src.p, bytes, 4 * num_sms, sa); });
        res.hbm_gbps = 2.0 * static_cast<double>(bytes) / (st.median_us * 1e3);
        add_row("hbm_copy", 0, st, 2.0 * static_cast<double>(bytes), 0, -1, 4 * num_sms, "local copy, read + write");
        for (MultiBenchRow& r : res.rows) r.frac_p2p = res.p2p_gbps > 0 ? r.gbps / res.p2p_gbps : 0;
    }

    // ---- Inputs of this rank (sized for S tokens). ----
    DevBuf<uint16_t> x(static_cast<size_t>(S) * H), out(static_cast<size_t>(S) * H);
    DevBuf<int32_t> idx(static_cast<size_t>(S) * K);
    DevBuf<float> w(static_cast<size_t>(S) * K), out_w(static_cast<size_t>(S) * K);
    {
        std::vector<uint16_t> hx(static_cast<size_t>(S) * H);
        for (int t = 0; t < S; ++t)
            for (int c = 0; c < H; ++c) hx[static_cast<size_t>(t) * H + c] = tag_bits(me, t, c);
        EVENEP_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    }
    const RankIo io{x.p, idx.p, w.p, out.p, out_w.p};
    const std::span<const RankIo> ios(&io, 1);
    EpPlan ep_plan;
    if (ex) {
        const int epn = cfg.epn();
        for (int p = 0; p < mc.projections; ++p)
            for (int g = 0; g < epn; ++g)
                launch_fill_random_bf16(ex->weight(me, p, g), static_cast<size_t>(es.elems),
                                        1000 + static_cast<uint64_t>(me) * 1000 + p * 100 + g, sa);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(sa));
        team.host_barrier();
    }

    for (double target : mc.maxvios) {
        const Routing routing = make_target_maxvio(RoutingSpec{R, cfg.E, K, S, mc.seed}, target);
        const double maxvio = routing.maxvio();
        const auto weights = make_route_weights(routing, mc.seed);
        EVENEP_CUDA_CHECK(
            cudaMemcpy(idx.p, routing.topk_idx[me].data(), routing.topk_idx[me].size() * 4, cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(w.p, weights[me].data(), weights[me].size() * 4, cudaMemcpyHostToDevice));
        const int s = routing.s[me];
        const std::vector<int32_t> tpe = routing.tpe();
        const Plan cpu_plan = make_plan(cfg, mc.mode, tpe, routing.s);

        // Plan once (checked), then time it.
        ep_plan = ep.plan(ios, routing.s, sa);
        ep.check(sa);
        const std::vector<int32_t> dst = ep.download_dst(ep_plan, me);
        int64_t plan_wrong = -1;
        if (mc.check) {
            const Plan got = ep.download_plan(ep_plan, me);
            std::vector<int32_t> want_dst(static_cast<size_t>(s) * K);
            compute_dst(cpu_plan, me, routing.topk_idx[me], want_dst);
            int64_t bad = 0;
            auto cmp = [&bad](const auto& a, const auto& b) {
                if (a.size() != b.size()) {
                    bad += static_cast<int64_t>(std::max(a.size(), b.size()));
                    return;
                }
                for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
            };
            cmp(got.q, cpu_plan.q), cmp(got.alloc, cpu_plan.alloc), cmp(got.cu_seqlens, cpu_plan.cu_seqlens);
            cmp(got.group_expert, cpu_plan.group_expert), cmp(got.copies, cpu_plan.copies);
            cmp(got.seg_row, cpu_plan.seg_row), cmp(dst, want_dst);
            plan_wrong = bench.sum_over_ranks(bad);
        }
        const int64_t nvs = ep.layout().nvs;
        // Traffic of this rank's entries, from its encoded destinations.
        int64_t entries = 0, remote_entries = 0, remote_payloads = 0, push_link = 0;
        for (int t = 0; t < s; ++t) {
            int cnt[256] = {0};
            for (int k = 0; k < K; ++k) {
                const int32_t code = dst[static_cast<size_t>(t) * K + k];
                if (detail::is_masked(code)) continue;
                const int d = static_cast<int>(detail::decode_dst(code) / nvs);
                ++entries;
                if (d != me) {
                    ++remote_entries;
                    remote_payloads += detail::is_payload(code);
                    ++cnt[d];
                }
            }
            for (int d = 0; d < R; ++d)
                if (cnt[d] > 0) push_link += (cnt[d] == 1 ? 2 : 4) * static_cast<int64_t>(H);
        }
        const double row_bytes = 2.0 * H;
        const int64_t q_me = cpu_plan.q[me];
        int copies_pushed = 0, copies_held = 0;
        for (int r = 0; r < R; ++r)
            for (int b = 0; b < cfg.num_slots(); ++b) {
                const int32_t e = cpu_plan.copies[static_cast<size_t>(r) * cfg.num_slots() + b];
                if (e < 0) continue;
                copies_pushed += cfg.home(e) == me && r != me;
                copies_held += r == me;
            }
        std::ostringstream note;
        note << "copies " << cpu_plan.cost.total_copies << ", max rank copy traffic "
             << cpu_plan.cost.max_rank_copy_traffic;

        if (want(mc, "plan")) {
            const Stats st = bench.time([&] { ep.plan(ios, routing.s, sa); });
            add_row("plan", maxvio, st, 4.0 * R * cfg.E, 4.0 * (R - 1) * cfg.E, plan_wrong, ep.last_blocks_per_rank(),
                    "histogram + all-gather + plan + dst");
        }
        if (want(mc, "dispatch")) {
            const Stats st = bench.time([&] { ep.dispatch(ep_plan, ios, sa); });
            int64_t wrong = -1;
            if (mc.check) {
                // Every row of this rank names its source (rank, token) as the CPU plan's destinations say.
                std::vector<std::pair<int32_t, int32_t>> src(static_cast<size_t>(nvs), {-1, -1});
                for (int r = 0; r < R; ++r) {
                    std::vector<int32_t> d(static_cast<size_t>(routing.s[r]) * K);
                    compute_dst(cpu_plan, r, routing.topk_idx[r], d);
                    for (size_t i = 0; i < d.size(); ++i) {
                        if (detail::is_masked(d[i])) continue;
                        const int64_t flat = detail::decode_dst(d[i]);
                        if (flat / nvs == me) src[flat % nvs] = {r, static_cast<int32_t>(i / K)};
                    }
                }
                const int64_t rows = cpu_plan.rows_used(me);
                const std::vector<uint16_t> got = ep.download_recv_x(me, rows);
                int64_t bad = 0;
                for (int64_t row = 0; row < rows; ++row) {
                    const uint16_t* g = got.data() + row * H;
                    const auto [r, t] = src[row];
                    bool ok = true;
                    for (int c : {0, 1, 2, H / 2, H - 1}) ok = ok && g[c] == (r < 0 ? uint16_t{0} : tag_bits(r, t, c));
                    bad += !ok;
                }
                wrong = bench.sum_over_ranks(bad);
            }
            add_row("dispatch", maxvio, st, q_me * (row_bytes + 4), remote_payloads * row_bytes + remote_entries * 12.0,
                    wrong, ep.last_blocks_per_rank(), note.str());
        }
        for (CombineMode mode : {CombineMode::kPull, CombineMode::kPushPartials}) {
            if (!want(mc, "combine")) break;
            const Stats st = bench.time([&] { ep.combine(ep_plan, ios, false, mode, sa); });
            int64_t wrong = -1;
            if (mc.check) {
                // The receive buffer still holds the dispatched rows (y = x): sampled tokens and columns.
                EVENEP_CUDA_CHECK(cudaMemset(out.p, 0xff, static_cast<size_t>(s) * H * 2));
                ep.combine(ep_plan, ios, false, mode, sa);
                ep.check(sa);
                std::vector<uint16_t> got(static_cast<size_t>(s) * H);
                EVENEP_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 2, cudaMemcpyDeviceToHost));
                int64_t bad = 0;
                for (int t = 0; t < s; t += std::max(1, s / 97))
                    for (int c : {2, 3, H / 2, H - 1})
                        bad += got[static_cast<size_t>(t) * H + c] != expected_combine(dst, K, nvs, me, t, c);
                wrong = bench.sum_over_ranks(bad);
            }
            const bool pull = mode == CombineMode::kPull;
            add_row(pull ? "combine_pull" : "combine_push", maxvio, st, entries * row_bytes,
                    pull ? remote_entries * row_bytes : static_cast<double>(push_link), wrong,
                    ep.last_blocks_per_rank(), pull ? "reads each entry row" : "pre-summed partials per rank");
        }
        const double copy_bytes = 2.0 * static_cast<double>(es.elems) * mc.projections;
        if (ex && want(mc, "prefetch")) {
            const Stats st = bench.time([&] { ex->prefetch_weight(ep, ep_plan, sa); });
            int64_t wrong = -1;
            if (mc.check) {
                int64_t bad = 0;
                const int B = cfg.num_slots(), epn = cfg.epn();
                const size_t n = 4096, total = static_cast<size_t>(es.elems);
                std::vector<uint16_t> a(n), b(n);
                for (int sl = 0; sl < B; ++sl) {
                    const int32_t e = cpu_plan.copies[static_cast<size_t>(me) * B + sl];
                    if (e < 0) continue;
                    for (int p = 0; p < mc.projections; ++p)
                        for (size_t off : {size_t{0}, total / 2, total - n}) {
                            // The home's weights through this process's mapping of its window.
                            const size_t wofs =
                                ex->offsets().weights + ((static_cast<size_t>(p) * epn + e % epn) * total + off) * 2;
                            EVENEP_CUDA_CHECK(
                                cudaMemcpy(a.data(), ex->slot(me, p, sl) + off, n * 2, cudaMemcpyDefault));
                            EVENEP_CUDA_CHECK(
                                cudaMemcpy(b.data(), ex->window().peers[e / epn] + wofs, n * 2, cudaMemcpyDefault));
                            bad += a != b;
                        }
                }
                wrong = bench.sum_over_ranks(bad);
            }
            add_row("prefetch", maxvio, st, copies_pushed * copy_bytes, copies_pushed * copy_bytes, wrong,
                    ex->last_blocks_per_rank(), "owner push; " + std::to_string(copies_held) + " slots filled here");
        }
        if (ex && want(mc, "reduce")) {
            const Stats st = bench.time([&] { ex->reduce_grad(ep, ep_plan, sa); });
            add_row("reduce", maxvio, st, copies_pushed * 2.0 * copy_bytes, copies_pushed * 4.0 * copy_bytes, -1,
                    ex->last_blocks_per_rank(), "home pulls fp32 slot gradients (link: read + zeroing)");
        }
        if (ex && want(mc, "total")) {
            const Stats st = bench.time([&] {
                const EpPlan tp = ep.plan(ios, routing.s, sa);  // resident: no plan copies between the streams
                EVENEP_CUDA_CHECK(cudaEventRecord(ev_plan, sa));
                EVENEP_CUDA_CHECK(cudaStreamWaitEvent(sb, ev_plan, 0));
                ep.dispatch(tp, ios, sa);
                ex->prefetch_weight(ep, tp, sb, 1);
                EVENEP_CUDA_CHECK(cudaEventRecord(ev_b, sb));
                EVENEP_CUDA_CHECK(cudaStreamWaitEvent(sa, ev_b, 0));
            });
            add_row("total_plan_dispatch_prefetch", maxvio, st, q_me * (row_bytes + 4) + copies_pushed * copy_bytes,
                    remote_payloads * row_bytes + copies_pushed * copy_bytes, -1, ep.last_blocks_per_rank(),
                    "plan, then dispatch beside prefetch_weight (second stream, channel 1)");
        }
        if (a2a) {
            const Stats sd = bench.time([&] { a2a->dispatch(io, s, sa); });
            const double recv = static_cast<double>(a2a->rows_received()) * row_bytes;
            const double sent_remote = static_cast<double>(a2a->rows_sent_remote()) * row_bytes;
            add_row("a2a_dispatch", maxvio, sd, recv, sent_remote, -1, 0,
                    "counts exchanged + host sync, permute, ncclSend/ncclRecv group; received rows " +
                        std::to_string(a2a->rows_received()));
            const Stats sc = bench.time([&] { a2a->combine(io, s, false, sa); });
            add_row("a2a_combine", maxvio, sc, recv, sent_remote, -1, 0, "reverse ncclSend/ncclRecv, unpermute");
        }
    }
    cudaEventDestroy(ev_plan);
    cudaEventDestroy(ev_b);
    cudaStreamDestroy(sa);
    cudaStreamDestroy(sb);
    return res;
}

}  // namespace evenep::cuda
