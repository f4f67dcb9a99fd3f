// GPU tests of the local device team (evenep/cuda/team.hpp): barrier ordering and timeouts.
//
// Cases:
//   BarrierTest.OrdersWritesAcrossRanks/R{1,2,8,32}_budget{1,4}  every rank writes into every peer's board before a
//       team barrier; after it every rank sees every peer's word of the current round (50 rounds)
//   BarrierTest.TimeoutReportsMissingRank    rank 2 never arrives: check() throws Error(kTimeout) naming rank 2 and the
//       phase; check() keeps reporting it until recover(); the team is usable afterwards (a clean run passes)
//   BarrierChannelTest.EveryChannelSynchronises  both channels of the local team order writes; channel 2 is refused
//   DeviceErrorFormatTest.NamesRankPeerPhase  the one formatter of both teams (host only)
//   BarrierTest.RankLocalSkipStillNamesPeer  the faulty rank is the last one: the message names it, not a local wait
//   BarrierDeathTest.TimeoutTrapsAndHostNamesRank  TimeoutAction::kTrap: the kernel traps; the host still reads the
//       record from mapped memory and names the missing rank
//   WindowTest.AllocFreeLoopDoesNotExhaustMemory  40 windows of a quarter of the free device memory each (10x the
//       memory), allocated and freed in turn (explicit free_window and OwnedWindow): every allocation succeeds, the
//       team holds no window afterwards and the free memory is back to where it started
//   WindowTest.FreeRefusesMainAndFreedWindows  free_window of the main window or of a freed window throws
//       kInvalidArgument; the team stays usable (barrier rounds pass)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/team.hpp"
#include "evenep/error.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::DeviceArray;

// Runs `rounds` barrier rounds on a fresh team; returns the total mismatch count.
int run_rounds(LocalTeam& team, int rounds, int sm_budget) {
    DeviceArray<int32_t> errors(team.size());
    launch_barrier_test(team.view(), 0, rounds, sm_budget, errors.get(), nullptr);
    team.check(nullptr);
    int total = 0;
    for (int32_t e : errors.download()) total += e;
    return total;
}

class BarrierTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(BarrierTest, OrdersWritesAcrossRanks) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    const auto [R, budget] = GetParam();
    LocalTeam team(R, 4 * static_cast<size_t>(R));
    EXPECT_EQ(run_rounds(team, 50, budget), 0) << "R=" << R << " budget=" << budget;
}

INSTANTIATE_TEST_SUITE_P(Ranks,
                         BarrierTest,
                         ::testing::Combine(::testing::Values(1, 2, 8, 32), ::testing::Values(1, 4)),
                         [](const auto& info) {
                             return "R" + std::to_string(std::get<0>(info.param)) + "_budget" +
                                    std::to_string(std::get<1>(info.param));
                         });

TEST(BarrierTimeoutTest, TimeoutReportsMissingRank) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    TeamOptions opt;
    opt.timeout_ms = 100;
    LocalTeam team(4, 16, opt);
    team.inject_fault(2, Phase::kTest);
    DeviceArray<int32_t> errors(4);
    launch_barrier_test(team.view(), 0, 3, 2, errors.get(), nullptr);
    try {
        team.check(nullptr);
        FAIL() << "expected a barrier timeout";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
        const std::string msg = e.what();
        EXPECT_NE(msg.find("missing rank 2"), std::string::npos) << msg;
        EXPECT_NE(msg.find("phase 'test'"), std::string::npos) << msg;
    }
    // check() leaves the error state (Team::check): it reports the failure again until recover().
    EXPECT_THROW(team.check(nullptr), Error);
    team.inject_fault(-1, Phase::kNone);
    team.recover();
    EXPECT_EQ(team.pending_error(), "");
    EXPECT_EQ(run_rounds(team, 10, 2), 0) << "the team must be usable after recover()";
}

TEST(BarrierChannelTest, EveryChannelSynchronises) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    LocalTeam team(4, 64);
    for (int channel = 0; channel < kTeamChannels; ++channel) {
        DeviceArray<int32_t> errors(4);
        launch_barrier_test(team.view(channel), 0, 20, 2, errors.get(), nullptr);
        team.check(nullptr);
        for (int32_t e : errors.download()) EXPECT_EQ(e, 0) << "channel " << channel;
    }
    EXPECT_THROW(team.view(kTeamChannels), Error);
}

// The one formatter of both teams (no device needed).
TEST(DeviceErrorFormatTest, NamesRankPeerPhase) {
    DeviceErrorRecord rec{};
    rec.set = 1;
    rec.kind = static_cast<int32_t>(DeviceErrorKind::kBarrierTimeout);
    rec.rank = 0;
    rec.peer = 3;
    rec.phase = static_cast<int32_t>(Phase::kDispatchSent);
    rec.waited_ms = 100;
    EXPECT_EQ(format_device_error(rec, "; NCCL team"),
              "barrier timeout: rank 0 waited 100 ms at phase 'dispatch/sent' for peer rank 3, which never arrived "
              "(missing rank 3; NCCL team)");
    rec.kind = static_cast<int32_t>(DeviceErrorKind::kBadExpertId);
    rec.rank = 1, rec.token = 3, rec.k = 2, rec.value = 99, rec.aux = 8;
    EXPECT_EQ(format_device_error(rec),
              "routing: rank 1, token 3, k 2: expert id 99 outside [0, E = 8) (use -1 to mask)");
}

TEST(BarrierTimeoutTest, RankLocalSkipStillNamesPeer) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    TeamOptions opt;
    opt.timeout_ms = 100;
    LocalTeam team(8, 32, opt);
    team.inject_fault(7, Phase::kTest);
    DeviceArray<int32_t> errors(8);
    launch_barrier_test(team.view(), 0, 1, 4, errors.get(), nullptr);
    try {
        team.check(nullptr);
        FAIL() << "expected a barrier timeout";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
        EXPECT_NE(std::string(e.what()).find("missing rank 7"), std::string::npos) << e.what();
    }
}

// The statement of the death test: trap, then report what the host read and abort.
void trap_and_report() {
    TeamOptions opt;
    opt.timeout_ms = 50;
    opt.on_timeout = TimeoutAction::kTrap;
    LocalTeam team(4, 16, opt);
    team.inject_fault(1, Phase::kTest);
    DeviceArray<int32_t> errors(4);
    launch_barrier_test(team.view(), 0, 1, 1, errors.get(), nullptr);
    try {
        team.check(nullptr);
    } catch (const Error& e) {
        std::fprintf(stderr, "caught: %s\n", e.what());
        std::fflush(stderr);
    }
    std::abort();
}

TEST(BarrierDeathTest, TimeoutTrapsAndHostNamesRank) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(trap_and_report(), "caught: barrier timeout.*missing rank 1.*device trapped");
}

size_t free_device_bytes() {
    EVENEP_CUDA_CHECK(cudaDeviceSynchronize());
    size_t free_bytes = 0, total_bytes = 0;
    EVENEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
}

TEST(WindowTest, AllocFreeLoopDoesNotExhaustMemory) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    constexpr int R = 4;
    LocalTeam team(R, 256);
    const size_t before = free_device_bytes();
    const size_t per_rank = before / 4 / R / 256 * 256;  // one window: a quarter of the free memory
    for (int i = 0; i < 40; ++i) {
        if (i % 2 == 0) {
            const Window& w = team.alloc_window(per_rank);
            ASSERT_EQ(w.peers.size(), static_cast<size_t>(R));
            ASSERT_EQ(team.num_windows(), 1u);
            team.free_window(w);
        } else {
            OwnedWindow w(team, per_rank);
            ASSERT_TRUE(w) << "round " << i;
            ASSERT_EQ(team.num_windows(), 1u);
        }
        ASSERT_EQ(team.num_windows(), 0u) << "round " << i;
    }
    const size_t after = free_device_bytes();
    EXPECT_LE(before - std::min(before, after), size_t{64} << 20)
        << "free memory before " << before << " bytes, after " << after;
}

TEST(WindowTest, FreeRefusesMainAndFreedWindows) {
    EVENEP_SKIP_WITHOUT_DEVICE();
    LocalTeam team(2, 4 * 2);
    auto expect_invalid = [&](const Window& w, const char* what) {
        try {
            team.free_window(w);
            ADD_FAILURE() << "free_window of " << what << " was accepted";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << what;
        }
    };
    expect_invalid(team.main_window(), "the main window");
    OwnedWindow w(team, 1024);
    const Window* freed = w.get();
    w.reset();
    EXPECT_FALSE(w);
    expect_invalid(*freed, "a freed window");  // NOTE: only its address is compared; nothing is read
    EXPECT_EQ(team.num_windows(), 0u);
    EXPECT_EQ(run_rounds(team, 10, 1), 0);
}

}  // namespace
}  // namespace evenep::cuda
