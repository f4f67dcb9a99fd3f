// The local CPU team (SPEC §5): barrier with status exchange and timeout, symmetric windows.
//
// Cases:
//   CpuTeam.BarrierReturnsLowestBadRank     ranks 2 and 3 pass ok = false: every rank gets 2.
//   CpuTeam.SymmetricWindowsSeePeers        every rank writes into every peer's window; after a barrier all
//                                           values are visible; peer_base(rank) is the local copy.
//   CpuTeam.WindowSizeMismatch              ranks ask for different sizes: every rank throws naming them.
//   CpuTeam.TimeoutNamesMissingRank         rank 2 skips a barrier: the others throw kTimeout naming rank 2 and
//                                           the phase; the next barrier of all ranks works.
//   CpuTeam.PhaseMismatchIsAnError          ranks in different collective calls: kRuntime naming both phases.
//   CpuTeam.DispatchTimeoutThenRecover      rank 3 never enters a dispatch: the others throw kTimeout naming
//                                           rank 3 and the all-gather phase; the next dispatch of all ranks in
//                                           the same buffers gives the oracle's rows.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using namespace std::chrono_literals;

std::string error_of(const std::exception_ptr& p, ErrorKind* kind = nullptr) {
    if (!p) return {};
    try {
        std::rethrow_exception(p);
    } catch (const Error& e) {
        if (kind) *kind = e.kind();
        return e.what();
    } catch (const std::exception& e) {
        return e.what();
    }
}

TEST(CpuTeam, BarrierReturnsLowestBadRank) {
    cpu::LocalTeamGroup group(5, 10000ms);
    std::vector<int> seen(5, -9);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        seen[team.rank()] = team.barrier("status", team.rank() != 2 && team.rank() != 3);
        EXPECT_EQ(team.barrier("all ok"), -1);
    });
    for (int r = 0; r < 5; ++r) EXPECT_EQ(seen[r], 2) << "rank " << r;
}

TEST(CpuTeam, SymmetricWindowsSeePeers) {
    const int R = 4;
    cpu::LocalTeamGroup group(R, 10000ms);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        SymmetricWindow w = team.alloc_symmetric(R * sizeof(int64_t), "test");
        EXPECT_EQ(team.peer_base(w, team.rank()), w.local);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(w.local) % 256, 0u);
        for (int p = 0; p < R; ++p) team.peer_ptr<int64_t>(w, p, 0)[team.rank()] = 100 * team.rank() + p;
        team.barrier("written");
        const int64_t* mine = reinterpret_cast<const int64_t*>(w.local);
        for (int q = 0; q < R; ++q) EXPECT_EQ(mine[q], 100 * q + team.rank()) << "rank " << team.rank();
        team.barrier("read");
        team.free_symmetric(w);
    });
}

TEST(CpuTeam, WindowSizeMismatch) {
    cpu::LocalTeamGroup group(3, 10000ms);
    const auto errors = cpu::run_ranks(group, [&](Team& team) {
        SymmetricWindow w = team.alloc_symmetric(team.rank() == 1 ? 64 : 128, "mismatch");
        team.free_symmetric(w);
    });
    for (int r = 0; r < 3; ++r) {
        const std::string msg = error_of(errors[r]);
        EXPECT_NE(msg.find("rank 0: 128, rank 1: 64, rank 2: 128 bytes"), std::string::npos)
            << "rank " << r << ": " << msg;
    }
}

TEST(CpuTeam, TimeoutNamesMissingRank) {
    cpu::LocalTeamGroup group(4, 300ms);
    const auto errors = cpu::run_ranks(group, [&](Team& team) {
        if (team.rank() != 2) team.barrier("phase A");
    });
    for (int r = 0; r < 4; ++r) {
        if (r == 2) {
            EXPECT_FALSE(errors[r]);
            continue;
        }
        ErrorKind kind = ErrorKind::kInternal;
        const std::string msg = error_of(errors[r], &kind);
        EXPECT_EQ(kind, ErrorKind::kTimeout) << msg;
        EXPECT_NE(msg.find("rank 2 did not arrive"), std::string::npos) << msg;
        EXPECT_NE(msg.find("phase A"), std::string::npos) << msg;
    }
    // The group is usable again.
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        EXPECT_EQ(team.barrier("phase B", team.rank() != 1), 1);
        EXPECT_EQ(team.barrier("phase C"), -1);
    });
}

TEST(CpuTeam, PhaseMismatchIsAnError) {
    cpu::LocalTeamGroup group(2, 10000ms);
    const auto errors = cpu::run_ranks(group, [&](Team& team) {
        team.barrier(team.rank() == 0 ? "combine: start" : "dispatch: histogram all-gather");
    });
    for (int r = 0; r < 2; ++r) {
        ErrorKind kind = ErrorKind::kInternal;
        const std::string msg = error_of(errors[r], &kind);
        EXPECT_EQ(kind, ErrorKind::kRuntime) << msg;
        EXPECT_NE(msg.find("combine: start"), std::string::npos) << msg;
        EXPECT_NE(msg.find("dispatch: histogram all-gather"), std::string::npos) << msg;
    }
}

TEST(CpuTeam, DispatchTimeoutThenRecover) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 4, 13, 4);
    const uint64_t seed = 61;
    const Routing routing = make_lognormal({4, 16, 4, 13, seed}, 1.0);
    const auto tokens = testing::tagged_tokens(cfg, routing, seed);
    const auto expected = cpu::dispatch_group(cfg, tokens);
    cpu::LocalTeamGroup group(4, 20000ms);
    std::vector<std::string> first_error(4);
    std::vector<ErrorKind> first_kind(4, ErrorKind::kInternal);
    std::vector<std::vector<Bf16>> rows(4);
    std::atomic<int> failed_calls{0};
    const auto errors = cpu::run_ranks(group, [&](Team& team) {
        const int r = team.rank();
        cpu::Buffer buffer(team, cfg);
        cpu::DispatchArgs a;
        a.s = tokens[r].s;
        a.x = tokens[r].x;
        a.topk_idx = tokens[r].topk_idx;
        a.topk_w = tokens[r].topk_w;
        team.barrier("buffers ready");
        // Rank 3 never reaches the dispatch's barriers (it waits for the others outside the team).
        if (r != 3) {
            group.set_barrier_timeout(300ms);
            try {
                (void)buffer.dispatch(a);
            } catch (const Error& e) {
                first_error[r] = e.what();
                first_kind[r] = e.kind();
            }
            failed_calls.fetch_add(1);
        } else {
            while (failed_calls.load() < 3) std::this_thread::sleep_for(1ms);
        }
        group.set_barrier_timeout(20000ms);
        team.barrier("after the failed call");
        (void)buffer.dispatch(a);
        rows[r].assign(buffer.recv_x().begin(), buffer.recv_x().end());
    });
    for (int r = 0; r < 4; ++r) EXPECT_FALSE(errors[r]) << "rank " << r << ": " << error_of(errors[r]);
    for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(first_kind[r], ErrorKind::kTimeout) << first_error[r];
        EXPECT_NE(first_error[r].find("rank 3 did not arrive"), std::string::npos) << first_error[r];
        EXPECT_NE(first_error[r].find("dispatch: histogram all-gather"), std::string::npos) << first_error[r];
    }
    for (int r = 0; r < 4; ++r) {
        const int64_t used = static_cast<int64_t>(expected.plan.rows_used(r)) * cfg.H;
        EXPECT_TRUE(std::equal(rows[r].begin(), rows[r].begin() + used, expected.recv_x[r].begin())) << "rank " << r;
    }
}

}  // namespace
}  // namespace evenep
