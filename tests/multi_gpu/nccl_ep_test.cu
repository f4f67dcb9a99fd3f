// Multi-GPU tests of the NCCL team and the data path over it: one process per GPU (tests/multi_gpu/nccl_testing.hpp
// re-runs each case as N ranks; N = the visible GPUs, at most 8, or EVENEP_MGPU_RANKS). Every rank compares its own
// part with the CPU oracle (evenep/cpu/oracle.hpp) and the CPU planner, bit for bit.
//
// Cases:
//   NcclTeamGroupTest.BarrierOrdersWritesOnBothChannels  100 rounds per channel of "write my word into every peer's
//       board, team barrier, check every peer's word for me": no mismatch on any rank (LSA peer pointers, flags in
//       the symmetric window, system-scope release/acquire)
//   NcclTeamGroupTest.StalledRankTimesOutNamingIt  rank R-1 starts its barrier kernel 3 s late (timeout 400 ms): every
//       other rank's check() throws Error(kTimeout) naming "missing rank R-1", none hangs; after recover() on every
//       rank clean rounds pass
//   NcclTeamGroupTest.MissingArrivalTimesOutNamingIt  rank R-1 never arrives (injected fault): the same error on the
//       others; usable after recover()
//   NcclEpGroupTest.MatchesOracle/<shape>  for every routing of testing::test_routings (lognormal, round robin and
//       every adversarial kind: single hot expert, one hot rank, all remote, same remote rank, Theorem 2, masked,
//       unequal s_r) and both planner modes: the plan equals the CPU planner's and is identical on every rank (hash
//       all-gathered), dst equals compute_dst, receive rows / weights / chain metadata equal the oracle's; after an
//       expert placeholder (y = bf16(0.75 x) in place) combine in both modes, with and without weights, equals the
//       oracle's out and gathered weights. Shapes: E=4R K=4 S=96 tp=8 H=40; E=4R K=6 S=48 tp=128 H=24.
//   NcclEpGroupTest.PrefetchAndReduceMatchDefinition  prefetch_weight fills every slot with its expert's home weights
//       (unused slots keep a sentinel); reduce_grad adds the slot gradients in ascending (rank, slot) fp32 order into
//       the home gradients and zeroes consumed slots (two projections, 3 tiles + a partial one)
//   NcclEpGroupTest.PrefetchOnChannelOneBesideDispatch  prefetch_weight on channel 1 and another stream while
//       dispatch runs on channel 0: both results equal the sequential ones
//   NcclEpGroupTest.AllToAllBaselineMatchesDefinition  the NCCL all-to-all baseline: rows received equal the entries
//       homed on the rank, combine gives bf16(sum_k w_k x) in fp32 k order on every token (seed 7)
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#pragma nv_diag_suppress 1675  // tests/common headers carry `#pragma GCC optimize` for the host compiler

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
#include "cuda/gpu_testing.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/device_array.hpp"
#include "evenep/cuda/experts.hpp"
#include "evenep/cuda/nccl_ep.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/detail/bf16.hpp"
#include "evenep/error.hpp"
#include "multi_gpu/nccl_testing.hpp"
#include "perf/cuda/nccl_alltoall.hpp"

namespace evenep::cuda {
namespace {

template <typename... Args>
std::string cat(const Args&... args) {
    std::ostringstream os;
    ((os << args), ...);
    return os.str();
}

std::vector<uint16_t> bits_of(const std::vector<Bf16>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
    return b;
}

// ---- Team ----

int barrier_rounds(NcclTeam& team, int channel, int rounds) {
    DeviceArray<int32_t> errors(team.size());
    launch_barrier_test(team.view(channel), 0, rounds, 2, errors.get(), nullptr);
    team.check(nullptr);
    int total = 0;
    for (int32_t e : errors.download(team.size())) total += e;
    return total;
}

TEST(NcclTeamGroupTest, BarrierOrdersWritesOnBothChannels) {
    EVENEP_RUN_AS_GROUP();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    NcclTeam team(boot, 4 * static_cast<size_t>(boot.world_size) * kNcclTeamChannels);
    ASSERT_EQ(team.size(), boot.world_size);
    for (int p = 0; p < team.size(); ++p) ASSERT_NE(team.peer_base(p), nullptr) << "no LSA pointer for rank " << p;
    EXPECT_EQ(barrier_rounds(team, 0, 100), 0) << "rank " << boot.rank << " channel 0";
    EXPECT_EQ(barrier_rounds(team, 1, 100), 0) << "rank " << boot.rank << " channel 1";
}

void expect_timeout_names(NcclTeam& team, int missing, const std::string& what) {
    DeviceArray<int32_t> errors(team.size());
    launch_barrier_test(team.view(), 0, 3, 2, errors.get(), nullptr);
    try {
        team.check(nullptr);
        ADD_FAILURE() << what << ": rank " << team.rank() << " expected a barrier timeout";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
        const std::string msg = e.what();
        EXPECT_NE(msg.find(cat("missing rank ", missing)), std::string::npos) << msg;
        EXPECT_NE(msg.find(cat("rank ", team.rank(), " waited")), std::string::npos) << msg;
        std::printf("rank %d got the expected error: %s\n", team.rank(), msg.c_str());
    }
}

TEST(NcclTeamGroupTest, StalledRankTimesOutNamingIt) {
    EVENEP_RUN_AS_GROUP();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    TeamOptions opt;
    opt.timeout_ms = 400;
    NcclTeam team(boot, 4 * static_cast<size_t>(boot.world_size), opt);
    const int stalled = boot.world_size - 1;
    if (boot.rank == stalled) {
        std::this_thread::sleep_for(std::chrono::seconds(3));  // everybody else gives up meanwhile
        DeviceArray<int32_t> errors(team.size());
        launch_barrier_test(team.view(), 0, 1, 2, errors.get(), nullptr);
        try {
            team.check(nullptr);  // its peers arrived long ago (their arrivals wait in its flags): it may pass or not
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
        }
    } else {
        const auto t0 = std::chrono::steady_clock::now();
        expect_timeout_names(team, stalled, "stalled rank");
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(s, 2.5) << "the timeout must fire long before the stalled rank arrives";
    }
    team.recover();
    team.set_timeout_ms(10000);
    EXPECT_EQ(barrier_rounds(team, 0, 20), 0) << "rank " << boot.rank << ": the team must be usable after recover()";
}

TEST(NcclTeamGroupTest, MissingArrivalTimesOutNamingIt) {
    EVENEP_RUN_AS_GROUP();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    NcclTeam team(boot, 4 * static_cast<size_t>(boot.world_size));
    team.set_timeout_ms(300);
    const int missing = boot.world_size - 1;
    team.inject_fault(missing, Phase::kTest);
    if (boot.rank == missing) {
        DeviceArray<int32_t> errors(team.size());
        launch_barrier_test(team.view(), 0, 3, 2, errors.get(), nullptr);
        team.check(nullptr);  // the faulty rank itself returns at once without an error
    } else {
        expect_timeout_names(team, missing, "injected missing arrival");
    }
    team.recover();
    team.inject_fault(-1, Phase::kNone);
    team.set_timeout_ms(10000);
    EXPECT_EQ(barrier_rounds(team, 0, 20), 0) << "rank " << boot.rank << ": the team must be usable after recover()";
}

// ---- Data path ----

// The expert placeholder: y = bf16(0.75 * x), in place.
__global__ void scale_rows_kernel(uint16_t* y, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] = float_to_bf16(__fmul_rn(bf16_to_float(Bf16{y[i]}), 0.75f)).bits;
}

std::vector<Bf16> scale_rows_host(const std::vector<Bf16>& x) {
    std::vector<Bf16> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(bf16_to_float(x[i]) * 0.75f);
    return y;
}

int64_t s_total_of(const Routing& routing) {
    int64_t total = 0;
    bool equal = true;
    for (int s : routing.s) total += s, equal = equal && s == routing.s[0];
    return equal ? -1 : total;
}

// This rank's device inputs and outputs, sized for S tokens.
struct RankBuffers {
    DeviceArray<uint16_t> x, out;
    DeviceArray<int32_t> idx;
    DeviceArray<float> w, out_w;
    RankBuffers(int S, int K, int H)
        : x(static_cast<size_t>(S) * H),
          out(static_cast<size_t>(S) * H),
          idx(static_cast<size_t>(S) * K),
          w(static_cast<size_t>(S) * K),
          out_w(static_cast<size_t>(S) * K) {}
    RankIo io() const { return RankIo{x.get(), idx.get(), w.get(), out.get(), out_w.get()}; }
    void upload(const cpu::RankTokens& t) {
        x.upload(bits_of(t.x));
        idx.upload(t.topk_idx);
        w.upload(t.topk_w);
    }
};

// Counts elements of got[0, n) that differ bitwise from want; `first` receives the first such index.
template <typename T>
int64_t count_diff(const std::vector<T>& got, const std::vector<T>& want, size_t n, size_t* first) {
    int64_t bad = 0;
    *first = n;
    for (size_t i = 0; i < n; ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
            if (bad++ == 0) *first = i;
        }
    return bad;
}

// Compares this rank's plan, dst and receive buffer after dispatch with the oracle's (EXPECTs: every rank keeps
// making the same collective calls after a mismatch).
void expect_dispatch_equal(NcclEp& ep,
                           const EpPlan& ep_plan,
                           const cpu::GroupDispatchResult& od,
                           const std::string& what) {
    const int r = ep.rank(), H = ep.hidden();
    const Plan plan = ep.download_plan(ep_plan, r);
    EXPECT_EQ(testing::plan_diff(plan, od.plan), "") << what << ": rank " << r << " plan vs the CPU planner";
    const std::vector<int64_t> hashes = ep.team().all_gather(std::vector<int64_t>{testing::plan_hash(plan)});
    for (size_t p = 1; p < hashes.size(); ++p)
        EXPECT_EQ(hashes[p], hashes[0]) << what << ": rank " << p << "'s plan differs from rank 0's";
    EXPECT_EQ(ep.download_dst(ep_plan, r), od.dst[r]) << what << ": dst of rank " << r;
    const int64_t rows = od.plan.rows_used(r);
    size_t first = 0;
    const std::vector<uint16_t> x = ep.download_recv_x(r, rows);
    const int64_t bad_x = count_diff(x, bits_of(od.recv_x[r]), static_cast<size_t>(rows) * H, &first);
    EXPECT_EQ(bad_x, 0) << what << ": rank " << r << " recv_x row " << first / H << " col " << first % H
                        << " (expected "
                        << (bad_x ? testing::describe_row(od.recv_x[r].data() + (first / H) * H) : std::string())
                        << ")";
    const int64_t bad_w = count_diff(ep.download_recv_w(r, rows), od.recv_w[r], rows, &first);
    EXPECT_EQ(bad_w, 0) << what << ": rank " << r << " recv_w row " << first;
    const int64_t bad_n = count_diff(ep.download_recv_next(r, rows), od.recv_next[r], rows, &first);
    EXPECT_EQ(bad_n, 0) << what << ": rank " << r << " recv_next row " << first;
    const int64_t bad_r = count_diff(ep.download_recv_ret(r, rows), od.recv_ret[r], rows, &first);
    EXPECT_EQ(bad_r, 0) << what << ": rank " << r << " recv_ret row " << first;
}

void expect_combine_equal(NcclEp& ep,
                          const EpPlan& plan,
                          RankBuffers& b,
                          const std::vector<cpu::RankTokens>& tokens,
                          const BufferConfig& bc,
                          const std::vector<std::vector<Bf16>>& y,
                          const cpu::OracleOptions& oo,
                          const std::string& what) {
    const int r = ep.rank(), K = bc.cfg.K, s = tokens[r].s;
    for (bool apply : {false, true}) {
        const cpu::GroupCombineResult oc = cpu::combine_group(bc, tokens, y, apply, oo);
        for (CombineMode mode : {CombineMode::kPull, CombineMode::kPushPartials}) {
            EVENEP_CUDA_CHECK(cudaMemset(b.out.get(), 0xff, b.out.size() * 2));
            EVENEP_CUDA_CHECK(cudaMemset(b.out_w.get(), 0xff, b.out_w.size() * 4));
            const RankIo io = b.io();
            ep.combine(plan, {&io, 1}, apply, mode, nullptr);
            ep.check(nullptr);
            const std::string w =
                cat(what, mode == CombineMode::kPull ? " pull" : " push", apply ? " weighted" : " unweighted");
            size_t first = 0;
            const int64_t bad = count_diff(b.out.download(static_cast<size_t>(s) * bc.H), bits_of(oc.out[r]),
                                           static_cast<size_t>(s) * bc.H, &first);
            EXPECT_EQ(bad, 0) << w << ": out rank " << r << " token " << first / bc.H << " col " << first % bc.H;
            const int64_t bad_w = count_diff(b.out_w.download(static_cast<size_t>(s) * K), oc.gathered_w[r],
                                             static_cast<size_t>(s) * K, &first);
            EXPECT_EQ(bad_w, 0) << w << ": gathered w rank " << r << " entry " << first;
        }
    }
}

struct EpShape {
    int experts_per_rank, K, S, tp, H;
    const char* name;
};

class NcclEpGroupTest : public ::testing::TestWithParam<EpShape> {};

TEST_P(NcclEpGroupTest, MatchesOracle) {
    EVENEP_RUN_AS_GROUP();
    const EpShape sh = GetParam();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    const int R = boot.world_size;
    const BufferConfig bc = testing::buffer_config(R, sh.experts_per_rank * R, sh.K, sh.S, sh.tp, sh.H);
    const auto routings = testing::test_routings(bc.cfg, 3);
    for (PlannerMode mode : {PlannerMode::kOptimized, PlannerMode::kReference}) {
        EpOptions opt;
        opt.mode = mode;
        opt.team.timeout_ms = 20000;
        NcclEp ep(bc.cfg, bc.H, boot, opt);
        RankBuffers b(bc.cfg.S, bc.cfg.K, bc.H);
        const RankIo io = b.io();
        for (const auto& nr : routings) {
            const std::string what = cat(sh.name, " R", R, " ", nr.name, " ", to_string(mode));
            const auto tokens = testing::random_tokens(bc, nr.routing, 11);
            cpu::OracleOptions oo;
            oo.mode = mode;
            oo.s_total = s_total_of(nr.routing);
            const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens, oo);
            b.upload(tokens[boot.rank]);
            const EpPlan plan = ep.plan({&io, 1}, nr.routing.s, nullptr, oo.s_total);
            ep.dispatch(plan, {&io, 1}, nullptr);
            ep.check(nullptr);
            expect_dispatch_equal(ep, plan, od, what);
            scale_rows_kernel<<<64, 256>>>(ep.recv_x(ep.rank()), ep.layout().nvs * ep.hidden());
            EVENEP_CUDA_CHECK(cudaGetLastError());
            std::vector<std::vector<Bf16>> y(R);
            for (int r = 0; r < R; ++r) y[r] = scale_rows_host(od.recv_x[r]);
            expect_combine_equal(ep, plan, b, tokens, bc, y, oo, what);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes,
                         NcclEpGroupTest,
                         ::testing::Values(EpShape{4, 4, 96, 8, 40, "E4R_K4_tp8"},
                                           EpShape{4, 6, 48, 128, 24, "E4R_K6_tp128"}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Experts ----

std::vector<float> host_floats(size_t n, uint64_t seed) { return testing::random_floats(n, seed); }
std::vector<uint16_t> host_bf16(size_t n, uint64_t seed) { return testing::random_bf16_bits(n, seed); }

using testing::get;  // synchronous copies of library-owned regions (tests/cuda/gpu_testing.hpp)
using testing::put;

inline constexpr uint16_t kSlotSentinel = 0x7FC1;
inline constexpr int kProjections = 2;
inline constexpr int64_t kElems = 3 * 16384 + 8 * 37;  // 3 bf16 tiles of 32 KiB and a partial one

uint64_t weight_seed(int r, int p, int g) { return 1000 + (r * 3 + p) * 97 + g; }
uint64_t grad_seed(int r, int p, int g) { return 5000 + (r * 3 + p) * 97 + g; }
uint64_t slot_grad_seed(int r, int p, int b) { return 9000 + (r * 3 + p) * 97 + b; }

struct ExpertsGroup {
    Config cfg;
    std::unique_ptr<NcclEp> ep;
    std::unique_ptr<RankBuffers> io;
    std::unique_ptr<Experts> ex;
    Routing routing;
    RankIo rank_io;
    EpPlan ep_plan;
    Plan plan;

    explicit ExpertsGroup(const NcclBootstrap& boot) {
        cfg.R = boot.world_size;
        cfg.E = 4 * cfg.R;
        cfg.K = 4;
        cfg.S = 64;
        cfg.tp = 8;
        EpOptions opt;
        opt.team.timeout_ms = 20000;
        ep = std::make_unique<NcclEp>(cfg, 8, boot, opt);
        io = std::make_unique<RankBuffers>(cfg.S, cfg.K, 8);
        testing::RoutingOptions ro;
        ro.skew = 3.0;
        routing = testing::random_routing(cfg, 99, ro);
        io->idx.upload(routing.topk_idx[boot.rank]);
        rank_io = io->io();
        ep_plan = ep->plan({&rank_io, 1}, routing.s, nullptr);
        ep->check(nullptr);
        plan = ep->download_plan(ep_plan, boot.rank);
        ExpertsShape es;
        es.num_projections = kProjections;
        es.elems = kElems;
        ex = std::make_unique<Experts>(*ep, es);
    }

    // Every rank's inputs are a function of (rank, projection, index): this rank uploads its own.
    void upload_inputs() {
        const int me = ep->rank(), epn = cfg.epn(), B = cfg.num_slots();
        for (int p = 0; p < kProjections; ++p) {
            for (int g = 0; g < epn; ++g) {
                put(ex->weight(me, p, g), host_bf16(kElems, weight_seed(me, p, g)));
                put(ex->grad(me, p, g), host_floats(kElems, grad_seed(me, p, g)));
            }
            for (int b = 0; b < B; ++b) {
                put(ex->slot(me, p, b), std::vector<uint16_t>(kElems, kSlotSentinel));
                put(ex->slot_grad(me, p, b), host_floats(kElems, slot_grad_seed(me, p, b)));
            }
        }
        ep->team().host_barrier();
    }

    void expect_slots(const std::string& what) const {
        const int me = ep->rank(), epn = cfg.epn(), B = cfg.num_slots();
        for (int b = 0; b < B; ++b) {
            const int32_t e = plan.copies[static_cast<size_t>(me) * B + b];
            for (int p = 0; p < kProjections; ++p) {
                const std::vector<uint16_t> want = e >= 0 ? host_bf16(kElems, weight_seed(e / epn, p, e % epn))
                                                          : std::vector<uint16_t>(kElems, kSlotSentinel);
                EXPECT_EQ(get(ex->slot(me, p, b), kElems), want)
                    << what << ": slot " << b << " of rank " << me << " (expert " << e << ") projection " << p;
            }
        }
    }
};

TEST(NcclExpertsGroupTest, PrefetchAndReduceMatchDefinition) {
    EVENEP_RUN_AS_GROUP();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    ExpertsGroup g(boot);
    const int R = g.cfg.R, me = boot.rank, epn = g.cfg.epn(), B = g.cfg.num_slots();
    int num_copies = 0;
    for (int32_t e : g.plan.copies) num_copies += e >= 0;
    ASSERT_GT(num_copies, 0) << "the skewed routing must produce copies";
    g.upload_inputs();
    g.ex->prefetch_weight(*g.ep, g.ep_plan, nullptr);
    g.ep->check(nullptr);
    g.expect_slots("prefetch");
    g.ex->reduce_grad(*g.ep, g.ep_plan, nullptr);
    g.ep->check(nullptr);
    // Expected gradients of this rank's experts: g + slot(r0, b0) + slot(r1, b1) + ... in (rank, slot) order.
    for (int p = 0; p < kProjections; ++p) {
        for (int lg = 0; lg < epn; ++lg) {
            std::vector<float> want = host_floats(kElems, grad_seed(me, p, lg));
            for (int r = 0; r < R; ++r)
                for (int b = 0; b < B; ++b) {
                    if (g.plan.copies[static_cast<size_t>(r) * B + b] != me * epn + lg) continue;
                    const std::vector<float> sg = host_floats(kElems, slot_grad_seed(r, p, b));
                    for (int64_t i = 0; i < kElems; ++i) want[i] = want[i] + sg[i];
                }
            const std::vector<float> got = get(g.ex->grad(me, p, lg), kElems);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), kElems * 4), 0)
                << "gradient of expert " << me * epn + lg << " projection " << p;
        }
        for (int b = 0; b < B; ++b) {
            const bool used = g.plan.copies[static_cast<size_t>(me) * B + b] >= 0;
            const std::vector<float> want =
                used ? std::vector<float>(kElems, 0.0f) : host_floats(kElems, slot_grad_seed(me, p, b));
            const std::vector<float> got = get(g.ex->slot_grad(me, p, b), kElems);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), kElems * 4), 0)
                << "slot gradient " << b << " of rank " << me << " projection " << p << (used ? " (consumed)" : "");
        }
    }
}

TEST(NcclExpertsGroupTest, PrefetchOnChannelOneBesideDispatch) {
    EVENEP_RUN_AS_GROUP();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    ExpertsGroup g(boot);
    const int me = boot.rank;
    // Reference: dispatch, then prefetch, on one stream.
    const BufferConfig bc = testing::buffer_config(g.cfg.R, g.cfg.E, g.cfg.K, g.cfg.S, g.cfg.tp, 8);
    const auto tokens = testing::random_tokens(bc, g.routing, 5);
    g.io->upload(tokens[me]);
    g.upload_inputs();
    g.ep->dispatch(g.ep_plan, {&g.rank_io, 1}, nullptr);
    g.ex->prefetch_weight(*g.ep, g.ep_plan, nullptr);
    g.ep->check(nullptr);
    const int64_t rows = g.plan.rows_used(me);
    const std::vector<uint16_t> ref_rows = g.ep->download_recv_x(me, rows);
    g.expect_slots("sequential prefetch");
    // Poison, then dispatch on channel 0 / stream a and prefetch on channel 1 / stream b at the same time.
    g.upload_inputs();  // slots back to the sentinel (ends with a host barrier)
    EVENEP_CUDA_CHECK(cudaMemset(g.ep->recv_x(me), 0xff, static_cast<size_t>(rows) * 8 * 2));
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t a, b;
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    EVENEP_CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    g.ep->dispatch(g.ep_plan, {&g.rank_io, 1}, a);
    g.ex->prefetch_weight(*g.ep, g.ep_plan, b, 1);
    g.ep->check(a);
    g.ep->check(b);
    EXPECT_EQ(g.ep->download_recv_x(me, rows), ref_rows) << "dispatch beside prefetch, rank " << me;
    g.expect_slots("prefetch beside dispatch");
    EVENEP_CUDA_CHECK(cudaStreamDestroy(a));
    EVENEP_CUDA_CHECK(cudaStreamDestroy(b));
}

// ---- All-to-all baseline ----

TEST(NcclAllToAllGroupTest, AllToAllBaselineMatchesDefinition) {
    EVENEP_RUN_AS_GROUP();
    const NcclBootstrap boot = nccl_bootstrap_from_env();
    const int R = boot.world_size, me = boot.rank;
    const BufferConfig bc = testing::buffer_config(R, 8 * R, 4, 200, 1, 64);
    const Config& cfg = bc.cfg;
    const Routing routing = make_lognormal(RoutingSpec{R, cfg.E, cfg.K, cfg.S, 7}, 1.5);
    const auto tokens = testing::random_tokens(bc, routing, 7);
    NcclTeam team(boot, 256);
    perf::NcclAllToAll a2a(team, cfg, bc.H);
    RankBuffers b(cfg.S, cfg.K, bc.H);
    b.upload(tokens[me]);
    const int s = routing.s[me];
    a2a.dispatch(b.io(), s, nullptr);
    int64_t homed = 0;
    for (int r = 0; r < R; ++r)
        for (int32_t e : routing.topk_idx[r]) homed += e >= 0 && cfg.home(e) == me;
    EXPECT_EQ(a2a.rows_received(), homed) << "rank " << me;
    a2a.combine(b.io(), s, true, nullptr);
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = b.out.download(static_cast<size_t>(s) * bc.H);
    int64_t bad = 0;
    for (int t = 0; t < s; ++t)
        for (int c = 0; c < bc.H; ++c) {
            float acc = 0.0f;
            for (int k = 0; k < cfg.K; ++k) {
                const size_t i = static_cast<size_t>(t) * cfg.K + k;
                if (tokens[me].topk_idx[i] < 0) continue;
                acc = acc + tokens[me].topk_w[i] * bf16_to_float(tokens[me].x[static_cast<size_t>(t) * bc.H + c]);
            }
            bad += out[static_cast<size_t>(t) * bc.H + c] != float_to_bf16(acc).bits;
        }
    EXPECT_EQ(bad, 0) << "rank " << me << ": baseline combine output";
}

}  // namespace
}  // namespace evenep::cuda
