// The planner benchmark rows (perf/cuda/bench.hpp): plan_fused (all ranks: Ep::plan with its default cluster planner)
// and plan_fused_block (the same with the one-block planner, one launch), plan_rank (one rank's planner alone),
// plan_rank_warm (its second pass in one launch) and plan_rank_serial (the sequential reference). The phase breakdown
// comes from the planner's %globaltimer stamps (EpLayout::plan.timing, evenep/detail/plan_stamps.hpp), in builds with
// EVENEP_PLANNER_STAMPS=ON.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "evenep/cuda/detail/ep_hooks.hpp"
#include "evenep/cuda/detail/launchers.hpp"
#include "evenep/detail/plan_stamps.hpp"
#include "evenep/plan_tensor.hpp"
#include "perf/cuda/device_buf.hpp"
#include "perf/cuda/point.hpp"

namespace evenep::perf {
namespace {

using namespace detail;  // the stamp names (kStamp*)

constexpr const char* kNoStamps = "phase stamps not compiled in (configure with -DEVENEP_PLANNER_STAMPS=ON)";

std::vector<int64_t> plan_stamps(cuda::DeviceEp& ep) {
    return download(reinterpret_cast<const int64_t*>(ep.base(0) + ep.layout().plan.timing), kNumPlanStamps);
}

// Microseconds between two stamps (%globaltimer words).
double plan_stamp_us(const std::vector<int64_t>& ts, int a, int b) { return static_cast<double>(ts[b] - ts[a]) / 1e3; }
// How phase 4a (the moved experts' route rows) and 4b (the layouts) ran, for the labels of stamps 5-6 and 6-7.
enum class FinishForm {
    kInTurn,      // 4a then 4b on block 0's warps
    kSideBySide,  // together on block 0 (cuda::plan_finish_route_warps): 5-6 is empty, 6-7 both
    kCluster,     // on all eight blocks of the cluster: 5-6 is the hand-off (cluster barrier C), 6-7 both
};
FinishForm finish_form(const cuda::EpLayout& L, bool spread) {
    if (spread) return FinishForm::kCluster;
    const int lw = static_cast<int>(cuda::PlanScratchLayout::make(L.R, L.E).layout_warps);
    return cuda::plan_finish_route_warps(L.R, lw) > 0 ? FinishForm::kSideBySide : FinishForm::kInTurn;
}
// The block planner's stamps (plan_block.cuh): the phase boundaries, when phase 2's roles finished, the SM clock.
std::string plan_phase_text(const std::vector<int64_t>& ts, FinishForm form) {
    if (!kPlannerStamps) return kNoStamps;
    static constexpr const char* k56[] = {", moved rows ", ", (4a beside 4b) ", ", hand-off "};
    static constexpr const char* k67[] = {", layout ", ", moved rows+layout ", ", moved rows+layout (8 blocks) "};
    const int f = static_cast<int>(form);
    auto us = [&](int a, int b) { return ts[b] > 0 ? plan_stamp_us(ts, a, b) : 0.0; };
    auto phase = [&](int i, int j) { return us(kStampPhase + i, kStampPhase + j); };
    auto role = [&](int word) { return us(kStampPhase + 2, word); };  // after phase 2 starts
    const double ns = static_cast<double>(ts[kStampTimerEnd] - ts[kStampTimerBegin]);
    std::ostringstream os;
    os.precision(3);
    os << "phases us: loads " << phase(0, 1) << ", init " << phase(1, 2) << ", transfers+fills+paths+split+home rows "
       << phase(2, 3) << ", lists " << phase(3, 4) << ", costs " << phase(4, 5) << k56[f] << phase(5, 6) << k67[f]
       << phase(6, 7) << ", copies+costs " << phase(7, 8) << "; total " << phase(0, 8) << "; fill iterations "
       << ts[kStampFillIterations] << "/" << ts[kStampFillIterations + 1] << ", split pieces (max donor) "
       << ts[kStampSplitPieces] << "; phase 2 roles done at +us: transfers " << role(kStampTransfersDone) << ", split "
       << role(kStampSplitDone) << ", home rows " << role(kStampHomeRowsDone) << ", fills " << role(kStampFillDone)
       << "/" << role(kStampFillDone + 1) << "/" << role(kStampFillDone + 2) << "/" << role(kStampFillDone + 3)
       << ", paths " << role(kStampPathsDone) << "; SM clock "
       << (ns > 0 ? static_cast<double>(ts[kStampClockEnd] - ts[kStampClockBegin]) / ns : 0.0) << " GHz";
    return os.str();
}

}  // namespace

void bench_plan(Point& p) {
    const BenchConfig& bc = p.bc;
    cuda::DeviceEp& ep = *p.ep;
    const Plan& plan = p.plan;
    const int R = bc.R;
    cudaStream_t stream = p.stream;
    // The planner occupies one SM for tens of microseconds: right after the host-side routing generation the
    // GPU is idle and its clocks are low. A few milliseconds of copies first bring the clocks up, as they are
    // in a training step (the planner runs between the router and the dispatch).
    {
        const size_t warm_bytes = size_t{256} << 20;
        DeviceArray<char> a(warm_bytes), b(warm_bytes);
        for (int i = 0; i < 40; ++i) cuda::launch_copy_vec16(b.get(), a.get(), warm_bytes, 4 * 132, stream);
    }
    // 1 when a rank's plan differs from the CPU planner's.
    auto plan_wrong = [&](const Plan& gp) -> int64_t {
        return gp.alloc != plan.alloc || gp.cu_seqlens != plan.cu_seqlens || gp.copies != plan.copies ||
               gp.seg_row != plan.seg_row || gp.group_expert != plan.group_expert ||
               gp.cost.crossing_rows != plan.cost.crossing_rows;
    };
    // Without the fused plan (R co-resident blocks do not fit) every rank planned alone (Point): those plans against
    // the CPU planner's. (The fused rows below check their own plans and destinations.)
    int64_t wrong = -1;
    if (bc.check && !p.fused) {
        wrong = 0;
        for (int r = 0; r < R; ++r) wrong += plan_wrong(ep.download_plan(p.ep_plan, r));
    }
    // The fused path (histogram, all-gather, plan and dst of every rank: Ep::plan) with the cluster planner (three
    // launches, Ep's default) and with the one-block planner (one cooperative launch), side by side, each checked.
    // With `rows`, each rank's call also writes its row of the plan tensor (RankIo::plan), as evenep.Buffer.plan
    // does (python -m evenep.bench compares its plan op with that row); the rows are checked against the CPU plan's.
    const int64_t width = plan_row_width(p.cfg);
    DeviceArray<int32_t> plan_rows(static_cast<size_t>(R * width));
    std::vector<cuda::RankIo> io_rows = p.io;
    for (int r = 0; r < R; ++r) io_rows[r].plan = plan_rows.get() + r * width;
    auto fused_row = [&](cuda::PlannerKernel kernel, const std::string& name, const std::string& what, bool rows) {
        if (!cuda::plan_fits_co_resident(ep.view(ep.options().channel), ep.layout(), kernel)) return;
        const std::vector<cuda::RankIo>& io = rows ? io_rows : p.io;
        auto call = [&] { return cuda::plan_with_kernel(ep, io, p.routing.s, stream, kernel); };
        int64_t wrong_fused = -1;
        if (bc.check) {
            const cuda::EpPlan checked = call();
            ep.check(stream);
            wrong_fused = 0;
            for (int r = 0; r < R; ++r) {
                wrong_fused += plan_wrong(ep.download_plan(checked, r));
                const std::vector<int32_t> gd = ep.download_dst(checked, r);
                for (size_t i = 0; i < gd.size(); ++i) wrong_fused += gd[i] != p.dst[r][i];
            }
            if (rows) {
                const std::vector<int32_t> got = download(plan_rows.get(), plan_rows.size());
                std::vector<int32_t> want(static_cast<size_t>(width));
                for (int r = 0; r < R; ++r) {
                    pack_plan_row(plan, r, want);
                    wrong_fused += !std::equal(want.begin(), want.end(), got.begin() + r * width);
                }
            }
        }
        const Stats fused = time_op([&] { call(); }, stream, bc.warmup, bc.iters);
        const std::optional<Stats> fused_graph = p.graph_stats([&] { call(); });
        const std::vector<int64_t> tf = plan_stamps(ep);
        auto us = [&](int a, int b) { return plan_stamp_us(tf, a, b); };
        std::ostringstream fused_note;
        fused_note << "histogram + all-gather + plan + dst, all ranks, " << what << "; ";
        if (kPlannerStamps) {
            fused_note << "rank 0 block 0 us: histogram " << us(kStampFusedBegin, kStampFusedHistogramDone)
                       << ", gather " << us(kStampFusedHistogramDone, kStampFusedGatherDone) << ", plan "
                       << us(kStampFusedGatherDone, kStampFusedPlanDone) << ", dst "
                       << us(kStampFusedPlanDone, kStampFusedEnd) << " (route staging "
                       << us(kStampFusedPlanDone, kStampFusedStagingDone) << ", walk "
                       << us(kStampFusedStagingDone, kStampFusedWalkDone) << ", dedup "
                       << us(kStampFusedWalkDone, kStampFusedEnd) << ")";
        } else {
            fused_note << kNoStamps;
        }
        p.add(name, fused, 0, ep.last_blocks_per_rank(), wrong_fused, fused_note.str());
        p.add_graph(name, fused_graph, 0, ep.last_blocks_per_rank(), -1, "histogram + all-gather + plan + dst");
    };
    const std::string fused_what = cuda::plan_on_clusters(ep.view(ep.options().channel), ep.layout())
                                         ? "three launches (each rank's plan on a cluster of 8 blocks)"
                                         : "one launch (the one-block planner: this shape does not fit the cluster, "
                                           "or its ranks' clusters do not all fit the device at once)";
    fused_row(cuda::PlannerKernel::kCluster, "plan_fused", fused_what, false);
    fused_row(cuda::PlannerKernel::kCluster, "plan_fused_rows", fused_what + ", writing the plan tensor's rows", true);
    fused_row(cuda::PlannerKernel::kParallel, "plan_fused_block", "one launch (each rank's plan on one block)", false);
    // One rank's planner alone: gathered histogram -> its plan (rank 0's copy).
    const std::vector<int32_t> tpe = p.routing.tpe();
    EVENEP_CUDA_CHECK(cudaMemcpy(ep.base(0) + ep.layout().tpe, tpe.data(), tpe.size() * 4, cudaMemcpyHostToDevice));
    const bool locality = bc.mode == PlannerMode::kOptimized;
    // kBatch back-to-back launches per timed iteration (divided by kBatch): launch latency stays out.
    constexpr int kBatch = 10;
    const bool on_cluster = cuda::plan_cluster_fits(ep.layout());  // kCluster plans on a cluster at this shape
    // One rank's plan with `kernel`: the plan_rank row (and its graph replay), checked against the CPU plan.
    // early: the cluster launches are programmatic dependent launches (as in Ep::plan): each is scheduled while the
    // previous one runs and waits for its end in its first instruction.
    auto rank_row = [&](cuda::PlannerKernel kernel, const std::string& name, const std::string& what, bool early) {
        auto launches = [&] {
            for (int i = 0; i < kBatch; ++i)
                cuda::launch_plan_only(ep.view(0), ep.layout(), p.routing.s,
                                       {.plan = {.locality = locality, .kernel = kernel}, .early = early}, stream);
        };
        const Stats one = per_call(time_op(launches, stream, bc.warmup, bc.iters), kBatch);
        // The same kBatch launches replayed as one CUDA graph: the host's launch cost (a 4 KiB parameter block per
        // launch) stays out, what remains is the kernel plus the GPU's gap between two kernels (about 1 us).
        const std::optional<Stats> one_graph = p.graph_stats(launches);
        const std::vector<int64_t> ts = plan_stamps(ep);
        std::ostringstream phases;
        phases << "one rank: gathered tpe -> plan, " << what << " (mean of " << kBatch << " back-to-back launches); "
               << plan_phase_text(ts, finish_form(ep.layout(), kernel == cuda::PlannerKernel::kCluster && on_cluster &&
                                                                   R >= cuda::kPlanClusterFinishMinRanks));
        int64_t wrong_one = -1;
        if (bc.check) {
            const cuda::EpPlan one_rank = cuda::plan_from_tpe(ep, p.routing.tpe(), p.routing.s, stream, 0, 1, kernel);
            const Plan gp = ep.download_plan(one_rank, 0);
            wrong_one = (gp.alloc != plan.alloc) + (gp.cu_seqlens != plan.cu_seqlens) + (gp.copies != plan.copies) +
                        (gp.rest_prefix != plan.rest_prefix) + (gp.cap_prefix != plan.cap_prefix);
        }
        if (!p.fused && kernel == cuda::PlannerKernel::kParallel) {
            phases << "; the fused plan did not run (" << R << " co-resident blocks do not fit): every rank planned "
                   << "alone, " << wrong << " of " << R << " plans wrong";
            if (wrong_one >= 0 && wrong >= 0) wrong_one += wrong;
        }
        p.add(name, one, 0, 1, wrong_one, phases.str());
        if (one_graph)
            p.add_graph(name, per_call(*one_graph, kBatch), 0, 1, -1,
                        "one rank: gathered tpe -> plan, " + std::to_string(kBatch) + " launches per replay");
    };
    rank_row(cuda::PlannerKernel::kParallel, "plan_rank", "one block of 512 threads", false);
    const std::string cluster_what =
        on_cluster
            ? "a cluster of 8 blocks (fills and home rows on blocks of their own)"
            : "the one-block planner (this shape does not fit the cluster: block 0's state exceeds shared memory, "
              "E > 1024 or R > 128)";
    rank_row(cuda::PlannerKernel::kCluster, "plan_rank_cluster",
             cluster_what + (on_cluster ? ", early launches (each scheduled while the previous plan runs)" : ""), true);
    if (on_cluster)
        rank_row(cuda::PlannerKernel::kCluster, "plan_rank_cluster_serialized",
                 cluster_what + ", each launch scheduled after the previous one ended", false);
    if (kPlannerStamps) {
        // The same plan twice in one launch: the second pass's stamps (warm instruction and data caches).
        cuda::launch_plan_only(ep.view(0), ep.layout(), p.routing.s,
                               {.plan = {.locality = locality, .kernel = cuda::PlannerKernel::kParallel}, .repeat = 2},
                               stream);
        EVENEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<int64_t> tw = plan_stamps(ep);
        Stats warm;
        warm.min_us = warm.median_us = warm.mean_us = warm.max_us = warm.p50_us =
            plan_stamp_us(tw, kStampPhase, kStampPhase + 8);
        std::ostringstream wn;
        wn << "second plan in one launch (warm caches), from its stamps; "
           << plan_phase_text(tw, finish_form(ep.layout(), false));
        p.add("plan_rank_warm", warm, 0, 1, -1, wn.str());
    }
    if (static_cast<int64_t>(R) * bc.E <= 8 * 1024) {  // the sequential reference is slow on one GPU thread
        const Stats serial = time_op(
            [&] {
                cuda::launch_plan_only(ep.view(0), ep.layout(), p.routing.s,
                                       {.plan = {.locality = locality, .kernel = cuda::PlannerKernel::kSerial}},
                                       stream);
            },
            stream, 1, std::min(bc.iters, 3));
        p.add("plan_rank_serial", serial, 0, 1, -1, "plan_core.hpp's sequential code on one GPU thread (reference)");
    }
    // Restore every rank's plan (and dst with the fused kernel).
    p.ep_plan = p.fused ? ep.plan(p.io, p.routing.s, stream) : cuda::plan_from_tpe(ep, tpe, p.routing.s, stream, 0, R);
    ep.check(stream);
}

}  // namespace evenep::perf
