// The multi-process benchmark (perf/cuda/multi.hpp; formulas in docs/multi-gpu.md).
#include "perf/cuda/multi.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>

#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/nccl_ep.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/detail/hash.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "perf/cuda/bench.hpp"
#include "perf/cuda/device_buf.hpp"
#include "perf/cuda/nccl_alltoall.hpp"
#include "perf/cuda/timing.hpp"

namespace evenep::perf {
namespace {

using cuda::CombineMode;
using cuda::EpOptions;
using cuda::EpPlan;
using cuda::Experts;
using cuda::ExpertsShape;
using cuda::NcclBootstrap;
using cuda::NcclEp;
using cuda::NcclTeam;
using cuda::NcclWindowView;
using cuda::RankIo;

// Token payload of (rank, token, column): column 0 holds the rank, column 1 the token, the others a finite hash
// (|v| < 2), so a received row names its source.
uint16_t tag_bits(int r, int t, int c) {
    if (c == 0) return static_cast<uint16_t>(r);
    if (c == 1) return static_cast<uint16_t>(t);
    return static_cast<uint16_t>(
        detail::hash64((static_cast<uint64_t>(r) << 40) ^ (static_cast<uint64_t>(t) << 16) ^ static_cast<uint64_t>(c)) & 0x3FFF);
}

bool want(const MultiBenchConfig& c, const std::string& op) {
    return c.ops.empty() || std::find(c.ops.begin(), c.ops.end(), op) != c.ops.end();
}

// Every rank's tokens on the check columns (x is tag_bits, so every rank can build all of them) for the CPU oracle.
std::vector<cpu::RankTokens> oracle_tokens(const Routing& routing,
                                           const std::vector<std::vector<float>>& weights,
                                           const std::vector<int>& cols) {
    const size_t C = cols.size();
    std::vector<cpu::RankTokens> tokens(static_cast<size_t>(routing.R));
    for (int r = 0; r < routing.R; ++r) {
        cpu::RankTokens& tk = tokens[r];
        tk.s = routing.s[r];
        tk.x.resize(static_cast<size_t>(tk.s) * C);
        for (int t = 0; t < tk.s; ++t)
            for (size_t j = 0; j < C; ++j) tk.x[static_cast<size_t>(t) * C + j] = Bf16{tag_bits(r, t, cols[j])};
        tk.topk_idx = routing.topk_idx[r];
        tk.topk_w = weights[r];
    }
    return tokens;
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
    auto timed = [&](const std::function<void()>& op) { return time_team(team, op, sa, mc.warmup, mc.iters); };

    MultiBenchResult res;
    res.R = R;
    res.nccl_version = cuda::nccl_runtime_version();
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
        row.bytes = team_max(team, bytes);
        row.link_bytes = team_max(team, link);
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
        const cuda::OwnedWindow window(team, bytes);  // freed at the end of the anchors
        const cuda::Window& w = *window;
        DeviceArray<char> src(bytes);
        cuda::launch_fill_random_bf16(reinterpret_cast<uint16_t*>(src.get()), bytes / 2, 77 + me, sa);
        int num_sms = 0, dev = 0;
        EVENEP_CUDA_CHECK(cudaGetDevice(&dev));
        EVENEP_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
        char* peer = w.peers[(me + 1) % R];
        for (int blocks : {4 * num_sms, 4 * mc.sm_budget}) {
            const Stats st = timed([&] { cuda::launch_copy_vec16(peer, src.get(), bytes, blocks, sa); });
            res.p2p_gbps = std::max(res.p2p_gbps, static_cast<double>(bytes) / (st.median_us * 1e3));
            add_row(blocks == 4 * num_sms ? "p2p_copy" : "p2p_copy_budget", 0, st, static_cast<double>(bytes),
                    static_cast<double>(bytes), -1, blocks, "every rank writes its next peer's window at once");
        }
        const Stats st = timed([&] { cuda::launch_copy_vec16(w.local, src.get(), bytes, 4 * num_sms, sa); });
        res.hbm_gbps = 2.0 * static_cast<double>(bytes) / (st.median_us * 1e3);
        add_row("hbm_copy", 0, st, 2.0 * static_cast<double>(bytes), 0, -1, 4 * num_sms, "local copy, read + write");
        for (MultiBenchRow& r : res.rows) r.frac_p2p = res.p2p_gbps > 0 ? r.gbps / res.p2p_gbps : 0;
    }

    // ---- Inputs of this rank (sized for S tokens). ----
    DeviceArray<uint16_t> x(static_cast<size_t>(S) * H), out(static_cast<size_t>(S) * H);
    DeviceArray<int32_t> idx(static_cast<size_t>(S) * K);
    DeviceArray<float> w(static_cast<size_t>(S) * K), out_w(static_cast<size_t>(S) * K);
    {
        std::vector<uint16_t> hx(static_cast<size_t>(S) * H);
        for (int t = 0; t < S; ++t)
            for (int c = 0; c < H; ++c) hx[static_cast<size_t>(t) * H + c] = tag_bits(me, t, c);
        EVENEP_CUDA_CHECK(cudaMemcpy(x.get(), hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    }
    const RankIo io{x.get(), idx.get(), w.get(), out.get(), out_w.get()};
    const std::span<const RankIo> ios(&io, 1);
    EpPlan ep_plan;
    if (ex) {
        const int epn = cfg.epn();
        for (int p = 0; p < mc.projections; ++p)
            for (int g = 0; g < epn; ++g)
                cuda::launch_fill_random_bf16(ex->weight(me, p, g), static_cast<size_t>(es.elems),
                                              1000 + static_cast<uint64_t>(me) * 1000 + p * 100 + g, sa);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(sa));
        team.host_barrier();
    }

    for (double target : mc.maxvios) {
        const Routing routing = make_target_maxvio(RoutingSpec{R, cfg.E, K, S, mc.seed}, target);
        const double maxvio = routing.maxvio();
        const auto weights = make_route_weights(routing, mc.seed);
        EVENEP_CUDA_CHECK(cudaMemcpy(idx.get(), routing.topk_idx[me].data(), routing.topk_idx[me].size() * 4,
                                     cudaMemcpyHostToDevice));
        EVENEP_CUDA_CHECK(cudaMemcpy(w.get(), weights[me].data(), weights[me].size() * 4, cudaMemcpyHostToDevice));
        const int s = routing.s[me];
        const std::vector<int32_t> tpe = routing.tpe();
        const Plan cpu_plan = make_plan(cfg, mc.mode, tpe, routing.s);
        // --check: the CPU oracle (evenep/cpu/oracle.hpp) on kCheckColumns columns of every rank's tokens.
        const std::vector<int> cols = check_columns(H);
        const size_t C = cols.size();
        std::vector<cpu::RankTokens> tokens;
        if (mc.check) tokens = oracle_tokens(routing, weights, cols);
        BufferConfig oracle_cfg;
        oracle_cfg.cfg = cfg;
        oracle_cfg.H = kCheckColumns;
        oracle_cfg.ffn_hidden = 8;
        cpu::OracleOptions oracle;
        oracle.mode = mc.mode;

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
            plan_wrong = team_sum(team, bad);
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
            const Stats st = timed([&] { ep.plan(ios, routing.s, sa); });
            add_row("plan", maxvio, st, 4.0 * R * cfg.E, 4.0 * (R - 1) * cfg.E, plan_wrong, ep.last_blocks_per_rank(),
                    "histogram + all-gather + plan + dst");
        }
        if (want(mc, "dispatch")) {
            const Stats st = timed([&] { ep.dispatch(ep_plan, ios, sa); });
            int64_t wrong = -1;
            if (mc.check) {
                // Every used row of this rank (payload, duplicates, zeroed padding) and its weight, as the CPU
                // oracle's on the check columns.
                const cpu::GroupDispatchResult want_d = cpu::dispatch_group(oracle_cfg, tokens, oracle);
                const int64_t rows = cpu_plan.rows_used(me);
                const std::vector<Bf16> got = download_columns(ep.recv_x(me), rows, H, cols);
                const std::vector<float> gw = ep.download_recv_w(me, rows);
                int64_t bad = 0;
                for (int64_t row = 0; row < rows; ++row)
                    bad +=
                        std::memcmp(got.data() + row * C, want_d.recv_x[me].data() + row * C, C * sizeof(Bf16)) != 0 ||
                        std::memcmp(&gw[row], &want_d.recv_w[me][row], sizeof(float)) != 0;
                wrong = team_sum(team, bad);
            }
            add_row("dispatch", maxvio, st, q_me * (row_bytes + 4), remote_payloads * row_bytes + remote_entries * 12.0,
                    wrong, ep.last_blocks_per_rank(), note.str());
        }
        for (CombineMode mode : {CombineMode::kPull, CombineMode::kPushPartials}) {
            if (!want(mc, "combine")) break;
            const Stats st = timed([&] { ep.combine(ep_plan, ios, false, mode, sa); });
            int64_t wrong = -1;
            if (mc.check) {
                // The receive buffer still holds the dispatched rows (y = x): the oracle combines x itself.
                EVENEP_CUDA_CHECK(cudaMemset(out.get(), 0xff, static_cast<size_t>(s) * H * 2));
                ep.combine(ep_plan, ios, false, mode, sa);
                ep.check(sa);
                // Columns 0 and 1 hold the source's (rank, token) bits, not values: compared from column 2 on.
                const cpu::GroupCombineResult want_c = cpu::combine_group(oracle_cfg, tokens, {}, false, oracle);
                const std::vector<Bf16> got = download_columns(out.get(), s, H, cols);
                int64_t bad = 0;
                for (int t = 0; t < s; ++t)
                    bad += std::memcmp(got.data() + static_cast<size_t>(t) * C + 2,
                                       want_c.out[me].data() + static_cast<size_t>(t) * C + 2,
                                       (C - 2) * sizeof(Bf16)) != 0;
                wrong = team_sum(team, bad);
            }
            const bool pull = mode == CombineMode::kPull;
            add_row(pull ? "combine_pull" : "combine_push", maxvio, st, entries * row_bytes,
                    pull ? remote_entries * row_bytes : static_cast<double>(push_link), wrong,
                    ep.last_blocks_per_rank(), pull ? "reads each entry row" : "pre-summed partials per rank");
        }
        const double copy_bytes = 2.0 * static_cast<double>(es.elems) * mc.projections;
        if (ex && want(mc, "prefetch")) {
            const Stats st = timed([&] { ex->prefetch_weight(ep, ep_plan, sa); });
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
                wrong = team_sum(team, bad);
            }
            add_row("prefetch", maxvio, st, copies_pushed * copy_bytes, copies_pushed * copy_bytes, wrong,
                    ex->last_blocks_per_rank(), "owner push; " + std::to_string(copies_held) + " slots filled here");
        }
        if (ex && want(mc, "reduce")) {
            const Stats st = timed([&] { ex->reduce_grad(ep, ep_plan, sa); });
            add_row("reduce", maxvio, st, copies_pushed * 2.0 * copy_bytes, copies_pushed * 4.0 * copy_bytes, -1,
                    ex->last_blocks_per_rank(), "home pulls fp32 slot gradients (link: read + zeroing)");
        }
        if (ex && want(mc, "total")) {
            const Stats st = timed([&] {
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
            const Stats sd = timed([&] { a2a->dispatch(io, s, sa); });
            const double recv = static_cast<double>(a2a->rows_received()) * row_bytes;
            const double sent_remote = static_cast<double>(a2a->rows_sent_remote()) * row_bytes;
            add_row("a2a_dispatch", maxvio, sd, recv, sent_remote, -1, 0,
                    "counts exchanged + host sync, permute, ncclSend/ncclRecv group; received rows " +
                        std::to_string(a2a->rows_received()));
            const Stats sc = timed([&] { a2a->combine(io, s, false, sa); });
            add_row("a2a_combine", maxvio, sc, recv, sent_remote, -1, 0, "reverse ncclSend/ncclRecv, unpermute");
        }
    }
    cudaEventDestroy(ev_plan);
    cudaEventDestroy(ev_b);
    cudaStreamDestroy(sa);
    cudaStreamDestroy(sb);
    return res;
}

}  // namespace evenep::perf
