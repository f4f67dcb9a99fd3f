// Single-GPU tests of the NCCL team (evenep/cuda/nccl_team.hpp) with a one-rank communicator, of its bootstrap and
// of the process launcher. Skipped without the NCCL team (EVENEP_NCCL=OFF) or, where a GPU is needed, without one.
//
// Cases:
//   NcclTeamSingleTest.BuildAndRuntimeVersion         the loaded NCCL is >= 2.28 (the device API)
//   NcclTeamSingleTest.OneRankWindowSelfPointerBarrier  a one-rank communicator: window registration (main window
//       and a second one, zeroed), device communicator, the self LSA pointer aliases the local buffer (bytes written
//       through one are read through the other), the team view (rank_begin 0, one launch rank, system scope,
//       inbox flags), 50 barrier rounds on both channels without mismatch; free_window deregisters the second
//       window (the main one is refused) and 20 windows of a quarter of the free memory, freed in turn, all fit
//   NcclTeamSingleTest.OneRankEpMatchesOracle  NcclEp with R = 1: plan, dispatch (rows, weights, chains) and combine
//       (pull and push, with and without weights) equal the CPU oracle, masked entries included
//   NcclBootstrapTest.ReadsTorchrunEnvironment   RANK / WORLD_SIZE / LOCAL_RANK / EVENEP_NCCL_ID are read; Open MPI
//       names are the fallback
//   NcclBootstrapTest.RejectsBadValues           a malformed RANK, a rank outside the world, a short id and a group
//       without an id each throw naming the variable
//   NcclBootstrapTest.IdFileRendezvous           rank 0 writes EVENEP_NCCL_ID_FILE, rank 1 reads the same id
//   NcclLaunchTest.PropagatesEnvironmentAndFailures  children see RANK, WORLD_SIZE, LOCAL_RANK, the id and
//       NCCL_NVLS_ENABLE=0; a failing rank's exit code comes back and a sleeping rank is killed within seconds
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#pragma nv_diag_suppress 1675  // tests/common headers carry `#pragma GCC optimize` for the host compiler

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "common/plan_testing.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/cuda/nccl_ep.hpp"
#include "evenep/cuda/nccl_team.hpp"
#include "evenep/error.hpp"
#include "gpu_testing.hpp"

namespace evenep::cuda {
namespace {

using testing::DeviceArray;

#define EVENEP_SKIP_WITHOUT_NCCL()                                                             \
    do {                                                                                       \
        if (!::evenep::cuda::nccl_team_built()) GTEST_SKIP() << "this build has no NCCL team"; \
    } while (0)

// Sets environment variables for the scope of one test and restores them afterwards.
class ScopedEnv {
  public:
    void set(const char* name, const char* value) {
        const char* old = std::getenv(name);
        saved_.push_back({name, old != nullptr, old ? old : ""});
        if (value)
            ::setenv(name, value, 1);
        else
            ::unsetenv(name);
    }
    ~ScopedEnv() {
        for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
            if (it->had)
                ::setenv(it->name.c_str(), it->value.c_str(), 1);
            else
                ::unsetenv(it->name.c_str());
        }
    }

  private:
    struct Saved {
        std::string name;
        bool had;
        std::string value;
    };
    std::vector<Saved> saved_;
};

// Clears every variable the bootstrap reads.
void clear_bootstrap_env(ScopedEnv& env) {
    for (const char* n : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID",
                          "SLURM_NTASKS", "SLURM_LOCALID", "EVENEP_NCCL_ID", "EVENEP_NCCL_ID_FILE"})
        env.set(n, nullptr);
}

NcclBootstrap one_rank() {
    NcclBootstrap b;
    b.rank = 0;
    b.world_size = 1;
    b.local_rank = 0;
    b.unique_id = nccl_new_unique_id();
    return b;
}

TEST(NcclTeamSingleTest, BuildAndRuntimeVersion) {
    EVENEP_SKIP_WITHOUT_NCCL();
    EXPECT_GE(nccl_runtime_version(), kMinNcclVersion) << "the loaded NCCL has no device API";
}

TEST(NcclTeamSingleTest, OneRankWindowSelfPointerBarrier) {
    EVENEP_SKIP_WITHOUT_NCCL();
    EVENEP_SKIP_WITHOUT_DEVICE();
    NcclTeam team(one_rank(), 1000);
    EXPECT_EQ(team.rank(), 0);
    EXPECT_EQ(team.size(), 1);
    EXPECT_GE(team.bytes_per_rank(), 1000u);
    ASSERT_NE(team.base(), nullptr);
    ASSERT_NE(team.peer_base(0), nullptr);
    EXPECT_EQ(team.main_window().peers.size(), 1u);
    // The self LSA mapping aliases the local buffer.
    std::vector<uint32_t> pattern(250);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = 0xA5000000u + static_cast<uint32_t>(i);
    EVENEP_CUDA_CHECK(cudaMemcpy(team.base(), pattern.data(), 1000, cudaMemcpyHostToDevice));
    std::vector<uint32_t> back(250, 0);
    EVENEP_CUDA_CHECK(cudaMemcpy(back.data(), team.peer_base(0), 1000, cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, pattern) << "bytes written through the local pointer must be read through the self LSA pointer";
    // The view the kernels get.
    for (int c = 0; c < kNcclTeamChannels; ++c) {
        const TeamView& v = team.view(c);
        EXPECT_EQ(v.num_ranks, 1);
        EXPECT_EQ(v.rank_begin, 0);
        EXPECT_EQ(v.launch_ranks, 1);
        EXPECT_EQ(v.system_scope, 1);
        EXPECT_NE(v.inbox, nullptr);
    }
    EXPECT_NE(team.view(0).local_gen, team.view(1).local_gen) << "channels need separate barrier state";
    EXPECT_THROW(team.view(kNcclTeamChannels), Error);
    // A second window: registered, zeroed, self pointer.
    const NcclWindowView& w = team.alloc_window(1 << 20);
    ASSERT_NE(w.local, nullptr);
    ASSERT_EQ(w.peers.size(), 1u);
    ASSERT_NE(w.peers[0], nullptr);
    std::vector<uint8_t> zeros(w.bytes, 1);
    EVENEP_CUDA_CHECK(cudaMemcpy(zeros.data(), w.peers[0], w.bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(zeros.begin(), zeros.end(), 0), static_cast<std::ptrdiff_t>(w.bytes));
    // Freed (deregistered) again; the main window cannot be; 20 windows of a quarter of the free memory each, freed
    // in turn by OwnedWindow, all fit.
    EXPECT_EQ(team.num_windows(), 1u);
    team.free_window(w);
    EXPECT_EQ(team.num_windows(), 0u);
    EXPECT_THROW(team.free_window(team.main_window()), Error);
    {
        size_t free_bytes = 0, total_bytes = 0;
        EVENEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        for (int i = 0; i < 20; ++i) {
            const OwnedWindow big(team, free_bytes / 4);
            ASSERT_EQ(team.num_windows(), 1u) << "round " << i;
        }
        EXPECT_EQ(team.num_windows(), 0u);
    }
    // Barrier rounds on both channels (the barrier test writes through the peer table and checks after the barrier).
    for (int c = 0; c < kNcclTeamChannels; ++c) {
        DeviceArray<int32_t> errors(1);
        launch_barrier_test(team.view(c), 0, 50, 2, errors.get(), nullptr);
        team.check(nullptr);
        EXPECT_EQ(errors.download()[0], 0) << "channel " << c;
    }
    team.host_barrier();
    const std::vector<int64_t> g = team.all_gather(std::vector<int64_t>{41, 42});
    EXPECT_EQ(g, (std::vector<int64_t>{41, 42}));
    team.recover();
}

TEST(NcclTeamSingleTest, OneRankEpMatchesOracle) {
    EVENEP_SKIP_WITHOUT_NCCL();
    EVENEP_SKIP_WITHOUT_DEVICE();
    const BufferConfig bc = testing::buffer_config(1, 4, 2, 40, 4, 16);
    const Config& cfg = bc.cfg;
    const Routing routing = make_adversarial(RoutingSpec{1, 4, 2, 40, 3}, Adversarial::kMasked);
    const auto tokens = testing::random_tokens(bc, routing, 9);
    const cpu::GroupDispatchResult od = cpu::dispatch_group(bc, tokens);
    NcclEp ep(cfg, bc.H, one_rank());
    DeviceArray<uint16_t> x(static_cast<size_t>(cfg.S) * bc.H), out(static_cast<size_t>(cfg.S) * bc.H);
    DeviceArray<int32_t> idx(static_cast<size_t>(cfg.S) * cfg.K);
    DeviceArray<float> w(static_cast<size_t>(cfg.S) * cfg.K), out_w(static_cast<size_t>(cfg.S) * cfg.K);
    x.upload(testing::bits_of(tokens[0].x));
    idx.upload(tokens[0].topk_idx);
    w.upload(tokens[0].topk_w);
    const RankIo io{x.get(), idx.get(), w.get(), out.get(), out_w.get()};
    const EpPlan plan = ep.plan({&io, 1}, routing.s, nullptr);
    ep.dispatch(plan, {&io, 1}, nullptr);
    ep.check(nullptr);
    ASSERT_EQ(testing::plan_diff(ep.download_plan(plan, 0), od.plan), "");
    ASSERT_EQ(ep.download_dst(plan, 0), od.dst[0]);
    const int64_t rows = od.plan.rows_used(0);
    const std::vector<uint16_t> want_x = testing::bits_of(od.recv_x[0]);
    EXPECT_EQ(ep.download_recv_x(0, rows), std::vector<uint16_t>(want_x.begin(), want_x.begin() + rows * bc.H));
    EXPECT_EQ(ep.download_recv_w(0, rows), std::vector<float>(od.recv_w[0].begin(), od.recv_w[0].begin() + rows));
    EXPECT_EQ(ep.download_recv_next(0, rows),
              std::vector<int32_t>(od.recv_next[0].begin(), od.recv_next[0].begin() + rows));
    EXPECT_EQ(ep.download_recv_ret(0, rows),
              std::vector<int32_t>(od.recv_ret[0].begin(), od.recv_ret[0].begin() + rows));
    for (bool apply : {false, true}) {
        const cpu::GroupCombineResult oc = cpu::combine_group(bc, tokens, {od.recv_x[0]}, apply);
        for (CombineMode mode : {CombineMode::kPull, CombineMode::kPushPartials}) {
            EVENEP_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.size() * 2));
            ep.combine(plan, {&io, 1}, apply, mode, nullptr);
            ep.check(nullptr);
            const std::vector<uint16_t> got = out.download(static_cast<size_t>(tokens[0].s) * bc.H);
            EXPECT_EQ(got, testing::bits_of(oc.out[0]))
                << (apply ? "weighted " : "unweighted ") << (mode == CombineMode::kPull ? "pull" : "push");
        }
    }
}

TEST(NcclBootstrapTest, ReadsTorchrunEnvironment) {
    ScopedEnv env;
    clear_bootstrap_env(env);
    const std::string id(2 * kNcclUniqueIdBytes, 'b');
    env.set("RANK", "3");
    env.set("WORLD_SIZE", "8");
    env.set("LOCAL_RANK", "1");
    env.set("EVENEP_NCCL_ID", id.c_str());
    NcclBootstrap b = nccl_bootstrap_from_env();
    EXPECT_EQ(b.rank, 3);
    EXPECT_EQ(b.world_size, 8);
    EXPECT_EQ(b.local_rank, 1);
    EXPECT_EQ(b.unique_id, id);
    env.set("RANK", nullptr);
    env.set("WORLD_SIZE", nullptr);
    env.set("LOCAL_RANK", nullptr);
    env.set("OMPI_COMM_WORLD_RANK", "2");
    env.set("OMPI_COMM_WORLD_SIZE", "4");
    b = nccl_bootstrap_from_env();
    EXPECT_EQ(b.rank, 2);
    EXPECT_EQ(b.world_size, 4);
    EXPECT_EQ(b.local_rank, 2) << "the local rank defaults to the rank";
}

template <typename F>
void expect_error_naming(F&& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "expected an evenep::Error naming " << needle;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(NcclBootstrapTest, RejectsBadValues) {
    ScopedEnv env;
    clear_bootstrap_env(env);
    env.set("RANK", "x1");
    expect_error_naming([] { nccl_bootstrap_from_env(); }, "RANK");
    env.set("RANK", "4");
    env.set("WORLD_SIZE", "4");
    expect_error_naming([] { nccl_bootstrap_from_env(); }, "rank 4 outside");
    env.set("RANK", "1");
    env.set("EVENEP_NCCL_ID", "abc");
    expect_error_naming([] { nccl_bootstrap_from_env(); }, "EVENEP_NCCL_ID");
    env.set("EVENEP_NCCL_ID", nullptr);
    expect_error_naming([] { nccl_bootstrap_from_env(); }, "EVENEP_NCCL_ID_FILE");
}

TEST(NcclBootstrapTest, IdFileRendezvous) {
    EVENEP_SKIP_WITHOUT_NCCL();
    ScopedEnv env;
    clear_bootstrap_env(env);
    const std::string path = "/tmp/evenep_nccl_id_test_" + std::to_string(::getpid());
    std::remove(path.c_str());
    env.set("EVENEP_NCCL_ID_FILE", path.c_str());
    env.set("WORLD_SIZE", "2");
    env.set("RANK", "0");
    const NcclBootstrap b0 = nccl_bootstrap_from_env();
    env.set("RANK", "1");
    const NcclBootstrap b1 = nccl_bootstrap_from_env(std::chrono::milliseconds(2000));
    EXPECT_EQ(b0.unique_id.size(), 2u * kNcclUniqueIdBytes);
    EXPECT_EQ(b1.unique_id, b0.unique_id);
    std::remove(path.c_str());
    env.set("EVENEP_NCCL_ID_FILE", (path + ".missing").c_str());
    try {
        nccl_bootstrap_from_env(std::chrono::milliseconds(50));
        ADD_FAILURE() << "expected a timeout waiting for the id file";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
    }
}

TEST(NcclLaunchTest, PropagatesEnvironmentAndFailures) {
    EVENEP_SKIP_WITHOUT_NCCL();
    ScopedEnv env;
    env.set("NCCL_NVLS_ENABLE", nullptr);
    LaunchOptions lo;
    lo.num_ranks = 3;
    lo.command = {"/bin/sh", "-c",
                  "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && test \"$RANK\" -lt 3 && "
                  "test ${#EVENEP_NCCL_ID} = 256 && test \"$NCCL_NVLS_ENABLE\" = 0 && "
                  "test \"$TORCH_SYMM_MEM_DISABLE_MULTICAST\" = 1 && test \"$EXTRA\" = yes"};
    lo.env = {{"EXTRA", "yes"}};
    const LaunchResult ok = launch_local_group(lo);
    EXPECT_EQ(ok.exit_code, 0) << ok.what;
    EXPECT_EQ(ok.failed_rank, -1);
    // Rank 1 fails at once; rank 0 would sleep for a minute: it must be killed.
    lo.command = {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 5; else sleep 60; fi"};
    lo.kill_grace = std::chrono::milliseconds(2000);
    const auto t0 = std::chrono::steady_clock::now();
    const LaunchResult bad = launch_local_group(lo);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(bad.exit_code, 5) << bad.what;
    EXPECT_EQ(bad.failed_rank, 1) << bad.what;
    EXPECT_NE(bad.what.find("rank 1"), std::string::npos) << bad.what;
    EXPECT_LT(s, 20.0) << "the sleeping ranks must be terminated";
    // A command that does not exist: 127.
    lo.num_ranks = 1;
    lo.command = {"/nonexistent/evenep-test-binary"};
    EXPECT_EQ(launch_local_group(lo).exit_code, 127);
}

}  // namespace
}  // namespace evenep::cuda
