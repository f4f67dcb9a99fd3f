// Image mixes, image assignment (LPT and exact) and dynamic context parallelism (include/evenep/pipeline.hpp,
// docs/pipeline.md "Dynamic context parallelism").
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/pipeline.hpp"
#include "evenep/routing.hpp"

namespace evenep::pipeline {
namespace {

inline constexpr int64_t kUniformPatches = 1024;
inline constexpr int64_t kMixedMinPatches = 256;
inline constexpr int64_t kMixedMaxPatches = 4096;
inline constexpr int64_t kVeryLargePatches = 16384;
inline constexpr double kVeryLargeShare = 0.05;
inline constexpr int64_t kPatchGranule = 16;  // sizes are rounded to a multiple of this

int64_t mixed_size(Rng& rng) {
    const double lo = std::log(static_cast<double>(kMixedMinPatches));
    const double hi = std::log(static_cast<double>(kMixedMaxPatches));
    const double n = std::exp(lo + (hi - lo) * rng.uniform());
    return std::max<int64_t>(kPatchGranule, std::llround(n / kPatchGranule) * kPatchGranule);
}

}  // namespace

std::vector<std::string> mix_names() { return {"uniform", "mixed", "heavy"}; }

std::vector<std::vector<int64_t>> make_mix(const std::string& name, int m, int images_per_mb, uint64_t seed) {
    EVENEP_CHECK(m >= 1, "pipeline: mix: m = ", m, " must be >= 1");
    EVENEP_CHECK(images_per_mb >= 1, "pipeline: mix: images per micro-batch = ", images_per_mb, " must be >= 1");
    const std::vector<std::string> names = mix_names();
    EVENEP_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "pipeline: unknown image mix '", name,
                 "' (expected uniform, mixed or heavy)");
    Rng rng(derive_seed(seed, 14));
    std::vector<std::vector<int64_t>> out(m, std::vector<int64_t>(images_per_mb, kUniformPatches));
    if (name == "uniform") return out;
    for (auto& row : out)
        for (int64_t& n : row) n = mixed_size(rng);
    if (name == "heavy") {
        // Exactly round(5%) of the images (at least one) become very large, at random positions.
        const int total = m * images_per_mb;
        const int num_large = std::max(1, static_cast<int>(std::lround(kVeryLargeShare * total)));
        std::vector<int> idx(total);
        std::iota(idx.begin(), idx.end(), 0);
        for (int i = total - 1; i > 0; --i)
            std::swap(idx[i], idx[static_cast<int>(rng.next_u64() % static_cast<uint64_t>(i + 1))]);
        for (int j = 0; j < num_large; ++j) out[idx[j] / images_per_mb][idx[j] % images_per_mb] = kVeryLargePatches;
    }
    return out;
}

std::vector<int> assign_images(std::span<const double> cost, int num_bins, AssignMethod method) {
    EVENEP_CHECK(num_bins >= 1, "pipeline: assign: ", num_bins, " bins, need >= 1");
    const int n = static_cast<int>(cost.size());
    for (int i = 0; i < n; ++i)
        EVENEP_CHECK(std::isfinite(cost[i]) && cost[i] >= 0, "pipeline: assign: cost of image ", i, " = ", cost[i],
                     " must be >= 0");
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost[a] > cost[b]; });
    std::vector<int> bin_of(n, 0);
    std::vector<double> load(num_bins, 0);
    for (int i : order) {
        const int b = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        bin_of[i] = b;
        load[b] += cost[i];
    }
    if (method == AssignMethod::kLpt) return bin_of;
    EVENEP_CHECK(n <= kMaxExactImages, "pipeline: assign: the exact method takes at most ", kMaxExactImages,
                 " images, got ", n);
    // Branch and bound from the LPT answer: largest first, skip bins whose load equals an earlier bin's.
    double best = *std::max_element(load.begin(), load.end());
    const double total = std::accumulate(cost.begin(), cost.end(), 0.0);
    const double lower = std::max(total / num_bins, n > 0 ? cost[order[0]] : 0.0);
    std::vector<int> cur(n, 0);
    std::fill(load.begin(), load.end(), 0.0);
    std::function<void(int, double)> search = [&](int j, double mx) {
        if (mx >= best - 1e-12 || best <= lower + 1e-12) return;
        if (j == n) {
            best = mx;
            bin_of = cur;
            return;
        }
        const int i = order[j];
        for (int b = 0; b < num_bins; ++b) {
            bool seen = false;
            for (int b2 = 0; b2 < b && !seen; ++b2) seen = load[b2] == load[b];
            if (seen) continue;
            load[b] += cost[i];
            cur[i] = b;
            search(j + 1, std::max(mx, load[b]));
            load[b] -= cost[i];
        }
    };
    search(0, 0.0);
    return bin_of;
}

namespace {

// One image's two ways of running in a group split into sub-groups of g ranks: whole on one rank, or split over
// all g ranks of one sub-group (then it adds compute/g + comm to each of them; a sub-group runs its split images
// first, all ranks together, so per-rank sums are the exact finish times).
struct ImageCost {
    double whole, split_compute, split_comm;
};

struct Packing {
    std::vector<double> compute, comm;  // [C]
    std::vector<int> sub_group_of;      // [images]
    std::vector<int> rank_of;           // [images] -1 when split
    double max_time() const {
        double mx = 0;
        for (size_t k = 0; k < compute.size(); ++k) mx = std::max(mx, compute[k] + comm[k]);
        return mx;
    }
};

// Applies (sign = +1) or removes (-1) image i placed as `choice`: choice < C whole on rank `choice`, else split
// over sub-group choice - C.
void apply(Packing& pk, const ImageCost& c, int C, int g, int i, int choice, double sign) {
    if (choice < C) {
        pk.compute[choice] += sign * c.whole;
        pk.sub_group_of[i] = choice / g;
        pk.rank_of[i] = choice;
        return;
    }
    const int b = choice - C;
    for (int t = 0; t < g; ++t) {
        pk.compute[b * g + t] += sign * c.split_compute;
        pk.comm[b * g + t] += sign * c.split_comm;
    }
    pk.sub_group_of[i] = b;
    pk.rank_of[i] = -1;
}

Packing pack(const std::vector<ImageCost>& cost, int C, int g, AssignMethod method) {
    const int n = static_cast<int>(cost.size());
    const int choices = g == 1 ? C : C + C / g;  // g = 1: splitting is the same as whole
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost[a].whole > cost[b].whole; });
    // Greedy: split the k largest images (LPT over the sub-groups), then every other image whole (LPT over the
    // ranks); the k with the smallest max per-rank time wins, ties to the fewest splits (least communication).
    const auto greedy = [&](int k) {
        Packing p{std::vector<double>(C, 0), std::vector<double>(C, 0), std::vector<int>(n, 0), std::vector<int>(n, 0)};
        for (int j = 0; j < n; ++j) {
            const int i = order[j];
            int best = -1;
            double best_load = 0;
            if (j < k) {
                for (int b = 0; b < C / g; ++b)
                    if (const double l = p.compute[b * g] + p.comm[b * g]; best < 0 || l < best_load) {
                        best = C + b;
                        best_load = l;
                    }
            } else {
                for (int r = 0; r < C; ++r)
                    if (const double l = p.compute[r] + p.comm[r]; best < 0 || l < best_load) {
                        best = r;
                        best_load = l;
                    }
            }
            apply(p, cost[i], C, g, i, best, 1.0);
        }
        return p;
    };
    Packing pk = greedy(0);
    double pk_max = pk.max_time();
    for (int k = 1; g > 1 && k <= n; ++k) {
        Packing p = greedy(k);
        if (const double mx = p.max_time(); mx < pk_max * (1 - 1e-9)) {
            pk = std::move(p);
            pk_max = mx;
        }
    }
    if (method == AssignMethod::kLpt) return pk;
    EVENEP_CHECK(n <= kMaxExactImages, "pipeline: dynamic CP: the exact method takes at most ", kMaxExactImages,
                 " images, got ", n);
    // Branch and bound from the greedy packing over every choice of every image, largest first.
    Packing best = pk;
    double best_max = pk.max_time();
    Packing cur{std::vector<double>(C, 0), std::vector<double>(C, 0), std::vector<int>(n, 0), std::vector<int>(n, 0)};
    std::function<void(int)> search = [&](int j) {
        if (cur.max_time() >= best_max * (1 - 1e-12)) return;
        if (j == n) {
            best = cur;
            best_max = cur.max_time();
            return;
        }
        const int i = order[j];
        for (int ch = 0; ch < choices; ++ch) {
            // Symmetry: ranks of one sub-group with equal loads are interchangeable.
            if (ch < C && ch % g != 0 && cur.compute[ch] == cur.compute[ch - 1] && cur.comm[ch] == cur.comm[ch - 1])
                continue;
            apply(cur, cost[i], C, g, i, ch, 1.0);
            search(j + 1);
            apply(cur, cost[i], C, g, i, ch, -1.0);
        }
    };
    search(0);
    return best;
}

}  // namespace

CpGroupResult dynamic_cp_group(const VitCostModel& model, std::span<const int64_t> patches, int C,
                               AssignMethod method, int fixed_g) {
    EVENEP_CHECK(C >= 1, "pipeline: CP group size C = ", C, " must be >= 1");
    EVENEP_CHECK(fixed_g == 0 || (fixed_g >= 1 && C % fixed_g == 0), "pipeline: sub-group size ", fixed_g,
                 " must divide C = ", C);
    for (size_t i = 0; i < patches.size(); ++i)
        EVENEP_CHECK(patches[i] >= 1, "pipeline: image ", i, " has ", patches[i], " patches, need >= 1");
    CpGroupResult best;
    double best_max = 0, best_comm = 0;
    for (int g = 1; g <= C; ++g) {
        if (C % g != 0 || (fixed_g > 0 && g != fixed_g)) continue;
        std::vector<ImageCost> cost(patches.size());
        for (size_t i = 0; i < patches.size(); ++i)
            cost[i] = {model.compute(patches[i]), model.compute_split(patches[i], g), model.comm_split(patches[i], g)};
        Packing pk;
        if (fixed_g > 1) {  // naive CP: every image split over its sub-group
            for (ImageCost& c : cost) c.whole = std::numeric_limits<double>::infinity();
            pk = pack(cost, C, g, AssignMethod::kLpt);
        } else {
            pk = pack(cost, C, g, method);
        }
        double total_comm = 0;
        for (double c : pk.comm) total_comm += c;
        const double mx = pk.max_time();
        // Relative tolerance so a g that only ties on the busiest rank does not buy communication.
        const bool better = best.compute.empty() || mx < best_max * (1 - 1e-9) ||
                            (mx <= best_max * (1 + 1e-9) && total_comm < best_comm);
        if (better) {
            best = {C, g, pk.compute, pk.comm, pk.sub_group_of, pk.rank_of};
            best_max = mx;
            best_comm = total_comm;
        }
    }
    return best;
}

CpStepResult dynamic_cp_step(const VitCostModel& model, std::span<const int64_t> patches, int W, int C, int fixed_g) {
    EVENEP_CHECK(W >= 1 && C >= 1 && W % C == 0, "pipeline: CP group size C = ", C, " must divide W = ", W);
    const int groups = W / C;
    std::vector<double> whole(patches.size());
    for (size_t i = 0; i < patches.size(); ++i) {
        EVENEP_CHECK(patches[i] >= 1, "pipeline: image ", i, " has ", patches[i], " patches, need >= 1");
        whole[i] = model.compute(patches[i]);
    }
    const std::vector<int> group_of = assign_images(whole, groups, AssignMethod::kLpt);
    CpStepResult out;
    out.W = W;
    out.C = C;
    out.rank_time.assign(W, 0);
    double compute = 0, comm = 0;
    for (int j = 0; j < groups; ++j) {
        std::vector<int64_t> mine;
        for (size_t i = 0; i < patches.size(); ++i)
            if (group_of[i] == j) mine.push_back(patches[i]);
        const CpGroupResult r = dynamic_cp_group(model, mine, C, AssignMethod::kLpt, fixed_g);
        out.g_of_group.push_back(r.g);
        for (int k = 0; k < C; ++k) {
            out.rank_time[j * C + k] = r.compute[k] + r.comm[k];
            compute += r.compute[k];
            comm += r.comm[k];
        }
    }
    const double mx = *std::max_element(out.rank_time.begin(), out.rank_time.end());
    const double mean = (compute + comm) / W;
    out.max_over_mean = mean > 0 ? mx / mean : 1.0;
    out.comm_share = compute + comm > 0 ? comm / (compute + comm) : 0.0;
    return out;
}

VitWork vit_work_from_images(const PipelineConfig& cfg, const std::vector<std::vector<int64_t>>& patches,
                             const VitCostModel& model, int cp, double vit_load) {
    cfg.validate();
    EVENEP_CHECK(patches.size() == static_cast<size_t>(cfg.m), "pipeline: images for ", patches.size(),
                 " micro-batches, expected m = ", cfg.m);
    EVENEP_CHECK(cp >= 1, "pipeline: --cp = ", cp, " must be >= 1");
    EVENEP_CHECK(std::isfinite(vit_load) && vit_load >= 0, "pipeline: --vit-load = ", vit_load, " must be >= 0");
    VitWork w;
    w.forward.resize(cfg.m);
    double seconds = 0;
    for (int i = 0; i < cfg.m; ++i) {
        const CpGroupResult r = dynamic_cp_group(model, patches[i], cp);
        for (size_t j = 0; j < patches[i].size(); ++j) {
            const int64_t n = patches[i][j];
            const int g = r.rank_of[j] >= 0 ? 1 : r.g;  // whole, or one piece per rank of its sub-group
            for (int t = 0; t < g; ++t) {
                const double c = model.compute_split(n, g) + model.comm_split(n, g);
                w.forward[i].push_back(c);
                seconds += c * (1 + kVitBackwardRatio);
            }
        }
    }
    // Scale: total ViT work per rank = vit_load * the mean per-rank bubble of the text-only schedule (P = 1 has
    // no bubble: the text work is the reference then).
    const RankOrders text = interleaved_1f1b_order(cfg);
    VitWork none;
    none.forward.resize(cfg.m);
    none.backward.resize(cfg.m);
    const Schedule s = simulate(cfg, none, text);
    double bubble = 0, busy = 0;
    for (int r = 0; r < cfg.P; ++r) {
        bubble += (s.makespan - s.busy[r]) / cfg.P;
        busy += s.busy[r] / cfg.P;
    }
    const double reference = bubble > 0 ? bubble : busy;
    const double scale = seconds > 0 ? vit_load * reference * cfg.P / seconds : 0.0;
    w.backward.resize(cfg.m);
    for (int i = 0; i < cfg.m; ++i)
        for (double& c : w.forward[i]) {
            c *= scale;
            w.backward[i].push_back(c * kVitBackwardRatio);
        }
    return w;
}

}  // namespace evenep::pipeline
