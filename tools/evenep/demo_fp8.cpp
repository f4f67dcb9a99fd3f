// `evenep demo --fp8`: the FP8 layer step beside the bf16 one, against the dense float64 reference (demo_fp8.hpp).
#include "demo_fp8.hpp"

#include <fmt/format.h>

#include <span>
#include <string_view>

#include "common.hpp"

namespace evenep::cli {

Fp8DemoResult run_fp8_demo(const cpu::MoeProblem& problem,
                           const DataPrecision& precision,
                           const cpu::MoeRunOptions& options,
                           const cpu::MoeResult& bf16,
                           const cpu::DenseResult& dense,
                           const LayerRunner& run,
                           const char* backend,
                           nlohmann::json& j) {
    cpu::MoeProblem p8 = problem;
    p8.cfg.precision = precision;
    p8.cfg.validate();
    const double t0 = now_seconds();
    const cpu::MoeResult f8 = run(p8, options);
    const double fp8_seconds = now_seconds() - t0;
    const double t1 = now_seconds();
    Fp8DemoResult res;
    res.ref_f64 = cpu::dense_moe_forward_f64(problem);
    const double f64_seconds = now_seconds() - t1;
    const cpu::ErrorStats e8 = cpu::compare(f8.out, res.ref_f64), e16 = cpu::compare(bf16.out, res.ref_f64);
    const cpu::Fp8Tolerance tol = cpu::kFp8LayerTolerance;
    const bool ok8 = !e8.nonfinite && e8.rel() <= tol.max_rel && e8.mean_rel() <= tol.mean_rel;
    const bool same_plan = f8.plan.alloc == bf16.plan.alloc && f8.dst == bf16.dst;

    fmt::print(
        "FP8 path on the {} (e4m3, 1x128 activation / 128x128 weight scales{}{}) vs the dense float64 "
        "reference\n",
        backend, precision.ue8m0 ? ", UE8M0" : ", fp32 scales", precision.bf16_partials ? ", bf16 partials" : "");
    fmt::print("(rel = max|err| / max|ref|, mean = mean|err| / mean|ref|; bounds in docs/fp8.md)\n");
    fmt::print("{:<27} {:>10} {:>10} {:>17}\n", "forward output", "rel", "mean", "tolerance");
    fmt::print("{:<27} {:>10.3e} {:>10.3e}\n", "bf16 path", e16.rel(), e16.mean_rel());
    fmt::print("{:<27} {:>10.3e} {:>10.3e} {:>8.2f} / {:<6.2f}  {}\n", "fp8 path", e8.rel(), e8.mean_rel(), tol.max_rel,
               tol.mean_rel, ok8 ? "PASS" : "FAIL");
    bool grads_ok = true;
    nlohmann::json jg = nlohmann::json::object();
    if (!dense.grad_x.empty()) {
        const cpu::ErrorStats gx = cpu::compare(f8.grad_x, dense.grad_x);
        const cpu::ErrorStats gw =
            cpu::compare(std::span<const float>(f8.grad_w_down), std::span<const float>(dense.grad_w_down));
        grads_ok = !gx.nonfinite && !gw.nonfinite && gx.rel() <= tol.max_rel && gw.rel() <= tol.max_rel;
        fmt::print("{:<27} {:>10.3e} {:>10.3e} {:>8.2f}           {}\n", "fp8 grad x (vs fp32 ref)", gx.rel(),
                   gx.mean_rel(), tol.max_rel, gx.rel() <= tol.max_rel ? "PASS" : "FAIL");
        fmt::print("{:<27} {:>10.3e} {:>10.3e} {:>8.2f}           {}\n", "fp8 grad W_down (wgrad)", gw.rel(),
                   gw.mean_rel(), tol.max_rel, gw.rel() <= tol.max_rel ? "PASS" : "FAIL");
        jg = {{"grad_x_rel", gx.rel()}, {"grad_w_down_rel", gw.rel()}};
    }
    fmt::print("{:<27} {}\n", "fp8 plan = bf16 plan", same_plan ? "PASS" : "FAIL");

    const TrafficReport& a = bf16.traffic;
    const TrafficReport& b = f8.traffic;
    const struct {
        const char* name;
        const PhaseTraffic* bf;
        const PhaseTraffic* f8;
    } rows[] = {{"dispatch (fwd)", &a.dispatch, &b.dispatch},
                {"prefetch_weight", &a.prefetch, &b.prefetch},
                {"combine (fwd)", &a.combine, &b.combine}};
    fmt::print("bytes across rank boundaries, {:<9} {:>12} {:>12} {:>7}\n",
               std::string_view(backend) == "CPU" ? "counted" : "modelled", "bf16", "fp8", "ratio");
    nlohmann::json jt;
    for (const auto& r : rows) {
        const double ratio = r.bf->bytes > 0 ? static_cast<double>(r.f8->bytes) / static_cast<double>(r.bf->bytes) : 0;
        fmt::print("  {:<37} {:>12} {:>12} {:>7.3f}\n", r.name, human_bytes(static_cast<double>(r.bf->bytes)),
                   human_bytes(static_cast<double>(r.f8->bytes)), ratio);
        jt[r.name] = {{"bf16", r.bf->bytes}, {"fp8", r.f8->bytes}};
    }
    fmt::print("  time: FP8 step (wall) {:.1f} ms | float64 reference {:.1f} ms\n\n", fp8_seconds * 1e3,
               f64_seconds * 1e3);

    res.pass = ok8 && grads_ok && same_plan;
    res.out = f8.out;
    j["fp8"] = {{"backend", backend},
                {"ue8m0", precision.ue8m0},
                {"bf16_partials", precision.bf16_partials},
                {"fp8_rel", e8.rel()},
                {"fp8_mean_rel", e8.mean_rel()},
                {"bf16_rel", e16.rel()},
                {"bf16_mean_rel", e16.mean_rel()},
                {"tolerance", {{"max_rel", tol.max_rel}, {"mean_rel", tol.mean_rel}}},
                {"gradients", jg},
                {"same_plan", same_plan},
                {"bytes", jt},
                {"pass", res.pass}};
    return res;
}

}  // namespace evenep::cli
