// Test and benchmark hooks of cuda::Ep (src/include/evenep/cuda/detail/ep_hooks.hpp).
#include "evenep/cuda/detail/ep_hooks.hpp"

#include "evenep/cuda/check.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/error.hpp"

namespace evenep::cuda {

// The friend of Ep that the hooks go through.
struct EpHooks {
    static EpPlan plan_from_tpe(Ep& ep,
                                std::span<const int32_t> tpe,
                                std::span<const int32_t> s,
                                cudaStream_t stream,
                                int first,
                                int num,
                                std::optional<PlannerKernel> kernel) {
        const Config& cfg = ep.config();
        const size_t RE = static_cast<size_t>(cfg.R) * cfg.E;
        EVENEP_CHECK(tpe.size() == RE, "plan: tpe has ", tpe.size(), " values, expected R*E = ", RE);
        EVENEP_CHECK(static_cast<int>(s.size()) == cfg.R, "plan: s has ", s.size(), " values, expected R = ", cfg.R);
        for (int r = 0; r < cfg.R; ++r) {
            int64_t row = 0;
            for (int e = 0; e < cfg.E; ++e) {
                const int32_t v = tpe[static_cast<size_t>(r) * cfg.E + e];
                EVENEP_CHECK(v >= 0, "plan: rank ", r, ": tpe[", e, "] = ", v, " is negative");
                row += v;
            }
            EVENEP_CHECK(s[r] >= 1 && s[r] <= cfg.S, "plan: rank ", r, ": s = ", s[r], " outside [1, S = ", cfg.S, "]");
            EVENEP_CHECK(row <= static_cast<int64_t>(s[r]) * cfg.K, "plan: rank ", r, ": ", row,
                         " routed entries exceed s*K = ", static_cast<int64_t>(s[r]) * cfg.K);
        }
        if (first < 0) first = ep.rank_begin();
        if (num < 0) num = ep.rank_begin() + ep.num_local_ranks() - first;
        EVENEP_CHECK(num >= 1 && ep.team().serves(first) && ep.team().serves(first + num - 1), "plan: ranks [", first,
                     ", ", first + num, ") are not all served by this process");
        EpPlan plan = ep.new_resident_plan(s, -1, stream);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int r = first; r < first + num; ++r)
            EVENEP_CUDA_CHECK(cudaMemcpy(ep.base(r) + ep.layout().tpe, tpe.data(), RE * 4, cudaMemcpyHostToDevice));
        const EpOptions& o = ep.options();
        PlanOnlyOptions options{.plan = plan_options(o), .rank_begin = first, .num_ranks = num};
        if (kernel) options.plan.kernel = *kernel;
        launch_plan_only(ep.view(o.channel), ep.layout(), s, options, stream);
        return plan;
    }
    static EpPlan plan_with_kernel(
        Ep& ep, std::span<const RankIo> io, std::span<const int32_t> s, cudaStream_t stream, PlannerKernel kernel) {
        const PlannerKernel own = ep.options_.planner_kernel;
        ep.options_.planner_kernel = kernel;
        try {
            EpPlan plan = ep.plan(io, s, stream);
            ep.options_.planner_kernel = own;
            return plan;
        } catch (...) {
            ep.options_.planner_kernel = own;
            throw;
        }
    }
};

EpPlan plan_from_tpe(Ep& ep,
                     std::span<const int32_t> tpe,
                     std::span<const int32_t> s,
                     cudaStream_t stream,
                     int rank_begin,
                     int num,
                     std::optional<PlannerKernel> kernel) {
    return EpHooks::plan_from_tpe(ep, tpe, s, stream, rank_begin, num, kernel);
}

EpPlan plan_with_kernel(
    Ep& ep, std::span<const RankIo> io, std::span<const int32_t> s, cudaStream_t stream, PlannerKernel kernel) {
    return EpHooks::plan_with_kernel(ep, io, s, stream, kernel);
}

}  // namespace evenep::cuda
