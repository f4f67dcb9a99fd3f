// The host part of one `evenep bench layer` point (perf::cuda::prepare_layer_point): which systems exist, which ranks
// are timed with which groups, and which systems share a timed compute. No GPU is touched (CUDA builds only: the
// function lives in the CUDA part of evenep::perf).
//
// Cases:
//   LayerPrepare.SystemsAndGroups     evenep, conventional, then one eplb per (redundant count, sync model): every
//                                     rank of every timed system has groups whose rows cover its rows (padded to
//                                     tp), untimed EPLB variants share their placement's first system, the slot
//                                     counts and sync names are as asked
//   LayerPrepare.RedundantMinusOneIsEpn  -1 resolves to epn: the same groups and rows as asking for epn
//   LayerPrepare.EmptyListsThrow      no sync model or no redundant count: evenep::Error
//   LayerPrepare.Fp8SystemBesideEvenep  with fp8: evenep_fp8 right after evenep, the same rows and groups, timed
//                                     itself; its modelled dispatch and prefetch carry the FP8 bytes (rows of
//                                     H + H/32 bytes, copies of half the bytes plus the scales), the other phases equal
//   LayerPrepare.MicroBatchesBelowOneThrow  micro_batches 0 and -3: evenep::Error naming the value; 1 and 4 accepted
//   LayerPrepare.AmortisedForward     amortised_forward_ms: M = 1 is the median of the whole forward (the cast once),
//                                     M = 4 takes 3/4 of each iteration's cast off before the median, bad sizes or
//                                     M < 1 throw
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/routing.hpp"

#if defined(EVENEP_HAVE_CUDA)
#include "perf/cuda/layer_bench.hpp"
#include "perf/cuda/rank_compute.hpp"

namespace evenep::perf::cuda {
namespace {

LayerBenchConfig small_config() {
    LayerBenchConfig c;
    c.shape = "test";
    c.R = 4, c.E = 16, c.K = 2, c.S = 256, c.H = 64, c.ffn_hidden = 32, c.tp = 8;
    c.sigma = 1.0;
    c.seed = 3;
    return c;
}

Routing routing_of(const LayerBenchConfig& c) {
    return make_lognormal(RoutingSpec{.R = c.R, .E = c.E, .K = c.K, .S = c.S, .seed = c.seed}, c.sigma);
}

int64_t padded(int64_t rows, int tp) { return (rows + tp - 1) / tp * tp; }

TEST(LayerPrepare, SystemsAndGroups) {
    LayerBenchConfig c = small_config();
    c.redundant = {1, 2};
    c.eplb_syncs = {EplbSync::kRing, EplbSync::kStar, EplbSync::kNone};
    const Routing routing = routing_of(c);
    const LayerPointWork w = prepare_layer_point(c, routing);
    ASSERT_EQ(w.systems.size(), 2u + 2u * 3u);
    ASSERT_EQ(w.timed_ranks.size(), w.systems.size());
    ASSERT_EQ(w.groups.size(), w.systems.size());
    ASSERT_EQ(w.compute_as.size(), w.systems.size());
    EXPECT_EQ(w.systems[0].system, "evenep");
    EXPECT_EQ(w.systems[1].system, "conventional");
    const char* syncs[] = {"ring", "star", "none"};
    for (size_t s = 2; s < w.systems.size(); ++s) {
        const size_t placement = (s - 2) / 3, variant = (s - 2) % 3;
        EXPECT_EQ(w.systems[s].system, "eplb");
        EXPECT_EQ(w.systems[s].replica_sync, syncs[variant]);
        EXPECT_EQ(w.systems[s].redundant_slots, c.redundant[placement]);
        EXPECT_EQ(w.compute_as[s], variant == 0 ? -1 : static_cast<int>(2 + 3 * placement)) << s;
        if (variant != 0) {
            EXPECT_TRUE(w.timed_ranks[s].empty()) << s;
        }
        EXPECT_EQ(w.systems[s].rows, w.systems[2 + 3 * placement].rows) << s;
    }
    EXPECT_EQ(w.compute_as[0], -1);
    EXPECT_EQ(w.compute_as[1], -1);
    // Every timed system times every rank; the groups of a rank cover its rows, each group padded to tp.
    const int64_t entries = static_cast<int64_t>(c.R) * c.S * c.K;
    for (size_t s = 0; s < w.systems.size(); ++s) {
        if (w.compute_as[s] >= 0) continue;
        const SystemStep& st = w.systems[s];
        ASSERT_EQ(w.timed_ranks[s].size(), static_cast<size_t>(c.R)) << s;
        ASSERT_EQ(st.rows.size(), static_cast<size_t>(c.R)) << s;
        EXPECT_EQ(std::accumulate(st.rows.begin(), st.rows.end(), int64_t{0}), entries) << s;
        for (int r = 0; r < c.R; ++r) {
            EXPECT_EQ(w.timed_ranks[s][r], r);
            const auto& g = w.groups[s][r];
            const int64_t sum = std::accumulate(g.begin(), g.end(), int64_t{0});
            EXPECT_GE(sum, st.rows[r]) << "system " << s << " rank " << r;
            EXPECT_LE(sum, st.rows[r] + static_cast<int64_t>(g.size()) * (c.tp - 1)) << "system " << s << " rank " << r;
            for (int64_t x : g) EXPECT_EQ(x, padded(x, c.tp)) << "system " << s << " rank " << r;
            if (st.system == "eplb") {
                EXPECT_EQ(g.size(), static_cast<size_t>(c.E / c.R + st.redundant_slots));
            }
        }
    }
    EXPECT_GE(w.max_groups, c.E / c.R + 2);
}

TEST(LayerPrepare, RedundantMinusOneIsEpn) {
    LayerBenchConfig c = small_config();
    c.eplb_syncs = {EplbSync::kRing};
    const Routing routing = routing_of(c);
    c.redundant = {-1};
    const LayerPointWork a = prepare_layer_point(c, routing);
    c.redundant = {c.E / c.R};
    const LayerPointWork b = prepare_layer_point(c, routing);
    ASSERT_EQ(a.systems.size(), 3u);
    ASSERT_EQ(b.systems.size(), 3u);
    EXPECT_EQ(a.systems[2].redundant_slots, c.E / c.R);
    EXPECT_EQ(a.systems[2].rows, b.systems[2].rows);
    EXPECT_EQ(a.groups[2], b.groups[2]);
}

TEST(LayerPrepare, EmptyListsThrow) {
    LayerBenchConfig c = small_config();
    const Routing routing = routing_of(c);
    c.eplb_syncs.clear();
    EXPECT_THROW(prepare_layer_point(c, routing), Error);
    c = small_config();
    c.redundant.clear();
    EXPECT_THROW(prepare_layer_point(c, routing), Error);
}

TEST(LayerPrepare, Fp8SystemBesideEvenep) {
    LayerBenchConfig c = small_config();
    c.H = 256, c.ffn_hidden = 128;
    c.eplb_syncs = {EplbSync::kRing};
    c.fp8 = true;
    const Routing routing = routing_of(c);
    const LayerPointWork w = prepare_layer_point(c, routing);
    ASSERT_EQ(w.systems.size(), 4u);
    const SystemStep &ev = w.systems[0], &f8 = w.systems[1];
    EXPECT_EQ(ev.system, "evenep");
    EXPECT_FALSE(ev.fp8);
    EXPECT_EQ(f8.system, "evenep_fp8");
    EXPECT_TRUE(f8.fp8);
    EXPECT_EQ(w.systems[2].system, "conventional");
    EXPECT_EQ(f8.rows, ev.rows);
    EXPECT_EQ(w.groups[1], w.groups[0]);
    EXPECT_EQ(w.timed_ranks[1], w.timed_ranks[0]);
    EXPECT_EQ(w.compute_as[1], -1);
    // Dispatch: between the row payload's 0.516 and 1 (the 12-byte entry records do not shrink); prefetch 0.5x + the
    // scales; combine and the backward phases unchanged.
    ASSERT_GT(ev.comm.dispatch, 0);
    EXPECT_LT(f8.comm.dispatch, 0.6 * ev.comm.dispatch);
    EXPECT_GT(f8.comm.dispatch, 0.5 * ev.comm.dispatch);
    ASSERT_GT(ev.comm.prefetch, 0);
    EXPECT_NEAR(f8.comm.prefetch / ev.comm.prefetch, 0.5 * (1 + 1.0 / 4096), 1e-9);
    EXPECT_EQ(f8.comm.combine, ev.comm.combine);
    EXPECT_EQ(f8.comm.combine_backward, ev.comm.combine_backward);
    EXPECT_EQ(f8.comm.dispatch_backward, ev.comm.dispatch_backward);
    EXPECT_EQ(f8.comm.reduce_grad, ev.comm.reduce_grad);
    EXPECT_LT(f8.max_rank_link_bytes, ev.max_rank_link_bytes);
}

TEST(LayerPrepare, MicroBatchesBelowOneThrow) {
    LayerBenchConfig c = small_config();
    const Routing routing = routing_of(c);
    for (const int m : {0, -3}) {
        c.micro_batches = m;
        try {
            prepare_layer_point(c, routing);
            ADD_FAILURE() << "micro_batches = " << m << " accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("micro_batches = " + std::to_string(m)), std::string::npos)
                << e.what();
        }
    }
    for (const int m : {1, 4}) {
        c.micro_batches = m;
        EXPECT_NO_THROW(prepare_layer_point(c, routing)) << m;
    }
}

TEST(LayerPrepare, AmortisedForward) {
    // Three iterations: whole forward (cast included) and the cast alone, ms.
    const std::vector<double> whole = {10, 12, 11}, cast = {4, 8, 2};
    EXPECT_EQ(amortised_forward_ms(whole, cast, 1), 11);  // the median of whole, untouched
    // M = 4: 10 - 3, 12 - 6, 11 - 1.5 = 7, 6, 9.5 -> median 7
    EXPECT_DOUBLE_EQ(amortised_forward_ms(whole, cast, 4), 7);
    // Even count: the upper median (time()'s convention).
    EXPECT_EQ(amortised_forward_ms(std::vector<double>{1, 3}, std::vector<double>{0, 0}, 2), 3);
    EXPECT_THROW(amortised_forward_ms(whole, cast, 0), Error);
    EXPECT_THROW(amortised_forward_ms(whole, std::vector<double>{1, 2}, 1), Error);
    EXPECT_THROW(amortised_forward_ms(std::vector<double>{}, std::vector<double>{}, 1), Error);
}

}  // namespace
}  // namespace evenep::perf::cuda

#else

TEST(LayerPrepare, NeedsCudaBuild) { GTEST_SKIP() << "prepare_layer_point is in the CUDA part of evenep::perf"; }

#endif
