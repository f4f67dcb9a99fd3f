// tests/multi_gpu/nccl_testing.hpp — running one GoogleTest case as a group of processes, one per GPU.
//
// A multi-GPU test body starts with EVENEP_RUN_AS_GROUP(). In the process ctest starts (the parent) the macro skips
// the test without the NCCL team or with fewer than two GPUs; otherwise it re-runs this binary, filtered to this one
// test, as N ranks through launch_local_group (RANK, WORLD_SIZE, LOCAL_RANK, EVENEP_NCCL_ID set, multicast off) and
// expects every rank to pass; then the parent's body returns. In a rank (EVENEP_MGPU_CHILD=1) the macro does
// nothing and the body runs as that rank: nccl_bootstrap_from_env() gives its bootstrap.
// N is EVENEP_MGPU_RANKS when set, else the number of visible GPUs (at most 8).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "evenep/cuda/nccl_team.hpp"
#include "evenep/plan.hpp"

namespace evenep::testing {

inline bool is_group_child() {
    const char* v = std::getenv("EVENEP_MGPU_CHILD");
    return v != nullptr && std::string(v) == "1";
}

inline int visible_gpus() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

inline int group_ranks() {
    if (const char* v = std::getenv("EVENEP_MGPU_RANKS"); v != nullptr && *v != '\0') return std::atoi(v);
    const int n = visible_gpus();
    return n < 8 ? n : 8;
}

// "" when the group can run, else why it cannot (parent only; a rank always runs).
inline std::string group_skip_reason(int min_ranks = 2) {
    if (is_group_child()) return "";
    if (!cuda::nccl_team_built()) return "this build has no NCCL team (EVENEP_NCCL=OFF)";
    const int n = group_ranks();
    if (n < min_ranks)
        return "needs " + std::to_string(min_ranks) + " GPUs, " + std::to_string(visible_gpus()) + " visible";
    if (n > visible_gpus()) return "EVENEP_MGPU_RANKS = " + std::to_string(n) + " exceeds the visible GPUs";
    return "";
}

// Parent: runs the current test as a group of ranks and records the outcome; returns true. Rank: returns false.
inline bool run_group_from_parent() {
    if (is_group_child()) return false;
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string full = std::string(info->test_suite_name()) + "." + info->name();
    cuda::LaunchOptions lo;
    lo.num_ranks = group_ranks();
    lo.command = {"/proc/self/exe", "--gtest_filter=" + full, "--gtest_brief=1"};
    lo.env = {{"EVENEP_MGPU_CHILD", "1"}};
    lo.timeout = std::chrono::seconds(400);
    const cuda::LaunchResult r = cuda::launch_local_group(lo);
    EXPECT_EQ(r.exit_code, 0) << full << " on " << lo.num_ranks << " ranks: " << r.what;
    return true;
}

#define EVENEP_RUN_AS_GROUP()                                                   \
    do {                                                                        \
        const std::string evenep_why_ = ::evenep::testing::group_skip_reason(); \
        if (!evenep_why_.empty()) GTEST_SKIP() << evenep_why_;                  \
        if (::evenep::testing::run_group_from_parent()) return;                 \
    } while (0)

// FNV-1a over every array of a plan: equal plans give equal hashes (for comparing plans across ranks).
inline int64_t plan_hash(const Plan& p) {
    uint64_t h = 1469598103934665603ull;
    auto add = [&h](const auto& v) {
        for (const auto& x : v) {
            const uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(x));
            for (int i = 0; i < 8; ++i) h = (h ^ ((u >> (8 * i)) & 0xff)) * 1099511628211ull;
        }
    };
    add(p.s), add(p.tpe), add(p.expert_load), add(p.q), add(p.alloc), add(p.local_keep), add(p.seg_row);
    add(p.group_expert), add(p.group_count), add(p.cu_seqlens), add(p.group_slot), add(p.copies);
    add(p.remote_experts), add(p.copies_received), add(p.copies_pushed), add(p.crossing_out);
    return static_cast<int64_t>(h);
}

}  // namespace evenep::testing
