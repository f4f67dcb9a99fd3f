// A consumer of the installed EvenEP: plans one step of a skewed routing, validates the plan and its encoded
// destinations (evenep::core), then dispatches the same tokens on the CPU backend (evenep::cpu) and checks that it
// planned the same quotas and wrote valid destinations. Prints one line and exits 0 when all of it holds.
#include <cstdio>
#include <vector>

#include "evenep/buffer.hpp"
#include "evenep/cpu/oracle.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

int main() {
    using namespace evenep;
    const RoutingSpec spec{.R = 4, .E = 16, .K = 2, .S = 64, .seed = 7};
    const Routing routing = make_lognormal(spec, 1.0);
    const Config cfg{.R = spec.R, .E = spec.E, .K = spec.K, .S = spec.S, .B = -1, .tp = 8};

    const Plan plan = make_plan(cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
    std::vector<std::vector<int32_t>> dst(cfg.R);
    for (int r = 0; r < cfg.R; ++r) {
        dst[r].resize(routing.topk_idx[r].size());
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
    for (const ValidationReport& report : {validate_plan(plan), validate_dst(plan, routing, dst)}) {
        if (!report.ok()) {
            std::fprintf(stderr, "evenep_consumer: invalid plan: %s\n", report.summary().c_str());
            return 1;
        }
    }

    const BufferConfig buffer{.cfg = cfg, .H = 16, .ffn_hidden = 16};
    std::vector<cpu::RankTokens> tokens(cfg.R);
    for (int r = 0; r < cfg.R; ++r) {
        const int s = routing.s[r];
        tokens[r] = {.s = s,
                     .x = std::vector<Bf16>(static_cast<size_t>(s) * buffer.H, float_to_bf16(1.0f)),
                     .topk_idx = routing.topk_idx[r],
                     .topk_w = std::vector<float>(routing.topk_idx[r].size(), 0.5f)};
    }
    const cpu::GroupDispatchResult dispatched = cpu::dispatch_group(buffer, tokens);
    if (dispatched.plan.q != plan.q || !validate_dst(dispatched.plan, routing, dispatched.dst).ok()) {
        std::fprintf(stderr, "evenep_consumer: the CPU backend's dispatch differs from the plan\n");
        return 1;
    }
    std::printf("evenep_consumer: R=%d E=%d K=%d: plan valid, CPU dispatch consistent\n", cfg.R, cfg.E, cfg.K);
    return 0;
}
