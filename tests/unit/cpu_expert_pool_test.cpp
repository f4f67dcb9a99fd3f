// Expert weights, prefetch slots and gradient reduction on the CPU (SPEC §4.4).
//
// Cases:
//   CpuExpertPool.PrefetchContentsExact        every slot named in copies[][] holds its expert's three matrices
//                                              bit for bit; slots with copies = -1 keep their old contents.
//   CpuExpertPool.PrefetchSkipsUnchangedCopies a second prefetch of the same layer moves nothing; another layer
//                                              is copied; after one home rank changes its weights, exactly the
//                                              slots holding that rank's experts are copied again.
//   CpuExpertPool.ReduceGradAffineExact        slot gradients = small integers a(r, b, proj, i): home gradients
//                                              equal their exact sums, consumed slots are zero, unused untouched.
//   CpuExpertPool.ReduceGradDeterministic      random fp32 slot gradients: equal to a sequential (rank, slot)
//                                              ascending sum, bit for bit, and to a repeated run.
//   CpuExpertPool.TablesBLessThanEpn           B = 1 < epn, Theorem 2 routing: overflow groups read the home rank's
//   weights (peer
//                                              pointers); the gradient table refuses them.
//   CpuExpertPool.TrafficMatchesModel          prefetch and reduce_grad traffic equal the model.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "common/cpu_testing.hpp"
#include "evenep/cpu/buffer.hpp"
#include "evenep/cpu/expert_pool.hpp"
#include "evenep/cpu/local_team.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

using namespace std::chrono_literals;

// A plan with copies: a skewed routing on R = 4, E = 16.
Plan skewed_plan(const BufferConfig& cfg,
                 uint64_t seed,
                 PlannerMode mode = PlannerMode::kOptimized,
                 Adversarial kind = Adversarial::kSingleHotExpert) {
    const Config& c = cfg.cfg;
    const Routing routing = make_adversarial({c.R, c.E, c.K, c.S, seed}, kind);
    return make_plan(c, mode, routing.tpe(), routing.s);
}

// Weight tag of element i of projection p of global expert e: finite bits, unique per (e, p, i) mostly.
Bf16 wtag(int e, int p, int64_t i) { return Bf16{static_cast<uint16_t>((e * 977 + p * 131 + i * 7) & 0x3FFF)}; }

void fill_layer(cpu::ExpertWeights& layer, int rank, int salt = 0) {
    const int epn = layer.epn();
    for (int p = 0; p < detail::kNumProjections; ++p)
        for (int le = 0; le < epn; ++le) {
            auto w = layer.weight(p, le);
            for (size_t i = 0; i < w.size(); ++i) w[i] = wtag(rank * epn + le + salt, p, static_cast<int64_t>(i));
        }
}

TEST(CpuExpertPool, PrefetchContentsExact) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 2, 32, 4, 16, 8);
    const Plan plan = skewed_plan(cfg, 3);
    ASSERT_GT(plan.cost.total_copies, 0);
    const int B = cfg.cfg.num_slots();
    cpu::LocalTeamGroup group(4, 20000ms);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        cpu::ExpertWeights layer(team, cfg);
        cpu::ExpertPool pool(team, cfg);
        fill_layer(layer, r);
        for (int p = 0; p < detail::kNumProjections; ++p)
            for (int b = 0; b < B; ++b)
                std::fill(pool.slot_weight(p, b).begin(), pool.slot_weight(p, b).end(), Bf16{0x1111});
        pool.prefetch_weight(plan, layer);
        for (int b = 0; b < B; ++b) {
            const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
            for (int p = 0; p < detail::kNumProjections; ++p) {
                const auto slot = pool.slot_weight(p, b);
                for (size_t i = 0; i < slot.size(); ++i) {
                    const Bf16 expect = e < 0 ? Bf16{0x1111} : wtag(e, p, static_cast<int64_t>(i));
                    ASSERT_EQ(slot[i], expect)
                        << "rank " << r << " slot " << b << " (expert " << e << ") proj " << p << " element " << i;
                }
            }
        }
        team.barrier("checked");
    });
}

TEST(CpuExpertPool, PrefetchSkipsUnchangedCopies) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 2, 32, 4, 16, 8);
    const Plan plan = skewed_plan(cfg, 3);
    const int B = cfg.cfg.num_slots(), epn = cfg.cfg.epn();
    // The home rank whose weights change in the last step, and how many slots of each rank hold its experts.
    int updated_home = -1;
    for (int32_t e : plan.copies)
        if (e >= 0 && updated_home < 0) updated_home = e / epn;
    ASSERT_GE(updated_home, 0);
    std::vector<int64_t> copies_of_home(4, 0);
    for (int r = 0; r < 4; ++r)
        for (int b = 0; b < B; ++b) {
            const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
            copies_of_home[r] += e >= 0 && e / epn == updated_home ? 1 : 0;
        }
    cpu::LocalTeamGroup group(4, 20000ms);
    std::vector<int64_t> rows(4 * 4, -1);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        cpu::ExpertWeights layer_a(team, cfg), layer_b(team, cfg);
        cpu::ExpertPool pool(team, cfg);
        fill_layer(layer_a, r);
        fill_layer(layer_b, r, 1);
        pool.prefetch_weight(plan, layer_a);
        rows[r * 4 + 0] = pool.last_traffic().rows;
        pool.prefetch_weight(plan, layer_a);
        rows[r * 4 + 1] = pool.last_traffic().rows;
        pool.prefetch_weight(plan, layer_b);
        rows[r * 4 + 2] = pool.last_traffic().rows;
        team.barrier("before the weight update");
        if (r == updated_home) fill_layer(layer_b, r, 2);  // only this home's experts change
        team.barrier("after the weight update");
        pool.prefetch_weight(plan, layer_b);
        rows[r * 4 + 3] = pool.last_traffic().rows;
        // Every slot holds the current weights of its expert.
        for (int b = 0; b < B; ++b) {
            const int32_t e = plan.copies[static_cast<size_t>(r) * B + b];
            if (e >= 0) {
                EXPECT_EQ(pool.slot_weight(0, b)[5], wtag(e + (e / epn == updated_home ? 2 : 1), 0, 5));
            }
        }
        team.barrier("checked");
    });
    for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(rows[r * 4 + 0], plan.copies_received[r]) << "rank " << r;
        EXPECT_EQ(rows[r * 4 + 1], 0) << "rank " << r;
        EXPECT_EQ(rows[r * 4 + 2], plan.copies_received[r]) << "rank " << r;
        EXPECT_EQ(rows[r * 4 + 3], copies_of_home[r]) << "rank " << r;
    }
}

// Slot gradient value of element i: an integer, so every sum is exact in fp32.
float affine(int r, int b, int p, int64_t i) { return static_cast<float>(r * 1000 + b * 100 + p * 10 + (i % 7)); }

TEST(CpuExpertPool, ReduceGradAffineExact) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 2, 32, 4, 16, 8);
    const Plan plan = skewed_plan(cfg, 5);
    const int B = cfg.cfg.num_slots(), epn = cfg.cfg.epn(), R = 4;
    const int64_t n = int64_t{16} * 8;
    cpu::LocalTeamGroup group(R, 20000ms);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank();
        cpu::ExpertWeights layer(team, cfg);
        cpu::ExpertPool pool(team, cfg);
        for (int p = 0; p < detail::kNumProjections; ++p) {
            for (int le = 0; le < epn; ++le) std::fill(layer.grad(p, le).begin(), layer.grad(p, le).end(), 0.5f);
            for (int b = 0; b < B; ++b) {
                const bool used = plan.copies[static_cast<size_t>(r) * B + b] >= 0;
                auto g = pool.slot_grad(p, b);
                for (int64_t i = 0; i < n; ++i) g[i] = used ? affine(r, b, p, i) : -3.0f;  // -3: unused sentinel
            }
        }
        pool.reduce_grad(plan, layer);
        for (int p = 0; p < detail::kNumProjections; ++p) {
            for (int le = 0; le < epn; ++le) {
                const int32_t e = r * epn + le;
                const auto g = layer.grad(p, le);
                for (int64_t i = 0; i < n; ++i) {
                    float expect = 0.5f;
                    for (int q = 0; q < R; ++q)
                        for (int b = 0; b < B; ++b)
                            if (plan.copies[static_cast<size_t>(q) * B + b] == e) expect += affine(q, b, p, i);
                    ASSERT_EQ(g[i], expect) << "rank " << r << " expert " << e << " proj " << p << " element " << i;
                }
            }
            for (int b = 0; b < B; ++b) {
                const bool used = plan.copies[static_cast<size_t>(r) * B + b] >= 0;
                for (float v : pool.slot_grad(p, b)) ASSERT_EQ(v, used ? 0.0f : -3.0f) << "rank " << r << " slot " << b;
            }
        }
    });
}

TEST(CpuExpertPool, ReduceGradDeterministic) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 2, 32, 4, 16, 8);
    const Plan plan = skewed_plan(cfg, 7, PlannerMode::kReference);
    const int B = cfg.cfg.num_slots(), epn = cfg.cfg.epn(), R = 4;
    const int64_t n = int64_t{16} * 8;
    auto slot_value = [](int r, int b, int p, int64_t i) {
        return bf16_to_float(testing::random_bf16(1, (r * 64 + b) * 8 + p + 1000 * static_cast<uint64_t>(i))[0]) *
               1.37e-3f;
    };
    auto run = [&] {
        std::vector<std::vector<float>> out(R);
        cpu::LocalTeamGroup group(R, 20000ms);
        cpu::run_ranks_or_throw(group, [&](Team& team) {
            const int r = team.rank();
            cpu::ExpertWeights layer(team, cfg);
            cpu::ExpertPool pool(team, cfg);
            for (int p = 0; p < detail::kNumProjections; ++p) {
                for (int le = 0; le < epn; ++le) {
                    auto g = layer.grad(p, le);
                    for (int64_t i = 0; i < n; ++i) g[i] = slot_value(r, 99, p, i + le);
                }
                for (int b = 0; b < B; ++b) {
                    auto g = pool.slot_grad(p, b);
                    for (int64_t i = 0; i < n; ++i) g[i] = slot_value(r, b, p, i);
                }
            }
            pool.reduce_grad(plan, layer);
            for (int p = 0; p < detail::kNumProjections; ++p)
                for (int le = 0; le < epn; ++le) {
                    const auto g = layer.grad(p, le);
                    out[r].insert(out[r].end(), g.begin(), g.end());
                }
        });
        return out;
    };
    const auto a = run();
    const auto b = run();
    EXPECT_EQ(a, b);
    // Sequential reference: local value, then (rank, slot) ascending.
    for (int r = 0; r < R; ++r)
        for (int p = 0; p < detail::kNumProjections; ++p)
            for (int le = 0; le < epn; ++le)
                for (int64_t i = 0; i < n; ++i) {
                    float v = slot_value(r, 99, p, i + le);
                    for (int q = 0; q < R; ++q)
                        for (int s = 0; s < B; ++s)
                            if (plan.copies[static_cast<size_t>(q) * B + s] == r * epn + le)
                                v += slot_value(q, s, p, i);
                    ASSERT_EQ(a[r][(static_cast<size_t>(p) * epn + le) * n + i], v)
                        << "rank " << r << " proj " << p << " expert " << le << " element " << i;
                }
}

TEST(CpuExpertPool, TablesBLessThanEpn) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 2, 32, 4, 16, 8, /*B=*/1);
    const Plan plan = skewed_plan(cfg, 3, PlannerMode::kOptimized, Adversarial::kTheorem2);
    int64_t peer_groups = 0;
    for (int r = 0; r < 4; ++r) peer_groups += plan.peer_reads[r];
    ASSERT_GT(peer_groups, 0) << "the routing must overflow B = 1";
    cpu::LocalTeamGroup group(4, 20000ms);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        const int r = team.rank(), G = plan.G(), epn = cfg.cfg.epn();
        cpu::ExpertWeights layer(team, cfg);
        cpu::ExpertPool pool(team, cfg);
        fill_layer(layer, r);
        team.barrier("filled");
        pool.prefetch_weight(plan, layer);
        std::vector<const Bf16*> table;
        pool.weight_table(plan, layer, detail::kProjDown, table);
        for (int g = 0; g < G; ++g) {
            const size_t i = static_cast<size_t>(r) * G + g;
            const int32_t e = plan.group_expert[i];
            if (e < 0) {
                EXPECT_EQ(table[g], nullptr);
                continue;
            }
            ASSERT_NE(table[g], nullptr);
            EXPECT_EQ(table[g][3], wtag(e, detail::kProjDown, 3)) << "rank " << r << " group " << g;
            if (plan.group_source[i] == WeightSource::kPeer) {
                EXPECT_EQ(table[g], layer.peer_weight(detail::kProjDown, e / epn, e % epn));
            }
        }
        std::vector<float*> grads;
        if (plan.peer_reads[r] > 0) {
            EXPECT_THROW(pool.grad_table(plan, layer, detail::kProjDown, grads), Error);
        }
        team.barrier("checked");
    });
}

TEST(CpuExpertPool, TrafficMatchesModel) {
    const BufferConfig cfg = testing::buffer_config(4, 16, 2, 32, 4, 16, 8);
    const Routing routing = make_adversarial({4, 16, 2, 32, 9}, Adversarial::kOneHotRank);
    const Plan plan = make_plan(cfg.cfg, PlannerMode::kOptimized, routing.tpe(), routing.s);
    std::vector<std::vector<int32_t>> dst(4);
    for (int r = 0; r < 4; ++r) {
        dst[r].resize(routing.topk_idx[r].size());
        compute_dst(plan, r, routing.topk_idx[r], dst[r]);
    }
    const TrafficReport model = evenep_traffic(plan, dst, cfg.H, cfg.ffn_hidden, true);
    PhaseTraffic prefetch(4), reduce(4);
    std::mutex mu;
    cpu::LocalTeamGroup group(4, 20000ms);
    cpu::run_ranks_or_throw(group, [&](Team& team) {
        cpu::ExpertWeights layer(team, cfg);
        cpu::ExpertPool pool(team, cfg);
        pool.prefetch_weight(plan, layer);
        const PhaseTraffic p = pool.last_traffic();
        pool.reduce_grad(plan, layer);
        std::lock_guard<std::mutex> lk(mu);
        prefetch.add(p);
        reduce.add(pool.last_traffic());
    });
    EXPECT_GT(model.prefetch.rows, 0);
    EXPECT_EQ(prefetch, model.prefetch);
    EXPECT_EQ(reduce, model.reduce_grad);
}

}  // namespace
}  // namespace evenep
