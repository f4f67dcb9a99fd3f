// tests/cuda/gpu_combine_testing.hpp — the GPU combine against the CPU oracle, shared by the data-path tests
// (gpu_datapath_test, gpu_fp8_dispatch_test).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "evenep/cpu/oracle.hpp"
#include "evenep/cuda/ep.hpp"
#include "gpu_testing.hpp"

namespace evenep::testing {

// With y[r] ([NvS*H] expert outputs) already in the GPU's receive rows: combine in both modes (pull, push partials)
// with and without apply_weights; out and the gathered weights of every rank equal cpu::combine_group's bit for bit.
inline void expect_combine_equal(cuda::Ep& ep,
                                 GroupIo& io,
                                 const cuda::EpPlan& plan,
                                 const std::vector<cpu::RankTokens>& tokens,
                                 const BufferConfig& bc,
                                 const std::vector<std::vector<Bf16>>& y,
                                 const cpu::OracleOptions& oo,
                                 const std::string& what) {
    const Config& cfg = bc.cfg;
    for (bool apply : {false, true}) {
        const cpu::GroupCombineResult oc = cpu::combine_group(bc, tokens, y, apply, oo);
        for (cuda::CombineMode mode : {cuda::CombineMode::kPull, cuda::CombineMode::kPushPartials}) {
            for (int r = 0; r < cfg.R; ++r) {
                EVENEP_CUDA_CHECK(cudaMemset(io.out[r].get(), 0xff, io.out[r].size() * 2));
                EVENEP_CUDA_CHECK(cudaMemset(io.out_w[r].get(), 0xff, io.out_w[r].size() * 4));
            }
            ep.combine(plan, io.io, apply, mode, nullptr);
            ep.check(nullptr);
            const std::string w =
                what + (mode == cuda::CombineMode::kPull ? " pull" : " push") + (apply ? " weighted" : " unweighted");
            for (int r = 0; r < cfg.R; ++r) {
                const int s = tokens[r].s;
                const std::vector<uint16_t> out = io.out[r].download(static_cast<size_t>(s) * bc.H);
                for (size_t i = 0; i < out.size(); ++i)
                    ASSERT_EQ(out[i], oc.out[r][i].bits)
                        << w << ": out rank " << r << " token " << i / bc.H << " col " << i % bc.H;
                const std::vector<float> ow = io.out_w[r].download(static_cast<size_t>(s) * cfg.K);
                for (size_t i = 0; i < ow.size(); ++i)
                    ASSERT_EQ(ow[i], oc.gathered_w[r][i]) << w << ": gathered w rank " << r << " entry " << i;
            }
        }
    }
}

}  // namespace evenep::testing
