// The copy tree check of validate_plan (relay_src, relay_round and the copy critical paths; docs/relayed-prefetch.md).
// Like the rest of the validator it never includes the planner's headers: every quantity is recomputed here.
//
// Checked: an empty slot has relay_src -1 and relay_round 0; direct pushes may be left unscheduled (every held slot
// from its home with relay_round 0; critical path Delta); otherwise a held copy arrives in a round >= 1 from another rank
// that is its expert's home or holds the expert in a slot it received in an earlier round (so every chain ends at
// the home and there are no cycles); per round every rank sends at most one copy and receives at most one;
// cost.copy_critical_path is the last round, cost.direct_critical_path = max_r max(pushed_r, received_r), and the
// tree is never slower than direct pushes.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "validate_checks.hpp"

namespace evenep::validate_detail {

void check_relays(const Plan& p, Sink& sink) {
    const int R = p.cfg.R, E = p.cfg.E, B = p.cfg.num_slots(), epn = p.cfg.epn();
    const int32_t max_round = R * B;  // a schedule never needs more rounds than copies
    const auto at = [&](int r, int b) { return static_cast<size_t>(r) * B + b; };
    std::vector<int64_t> pushed(R, 0), received(R, 0);
    int64_t last = 0;
    bool ok = true;
    // Unscheduled direct pushes: every held slot has round 0 (then its source must be the home).
    bool unscheduled = true;
    for (size_t i = 0; i < p.copies.size(); ++i) unscheduled = unscheduled && (p.copies[i] < 0 || p.relay_round[i] == 0);
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) {
            const int32_t e = p.copies[at(r, b)], src = p.relay_src[at(r, b)], t = p.relay_round[at(r, b)];
            if (e < 0) {
                if (src != -1 || t != 0) {
                    sink.fail("relays: rank ", r, " slot ", b, " is empty but relay_src = ", src, ", relay_round = ", t);
                    ok = false;
                }
                continue;
            }
            if (e >= E) {
                ok = false;  // reported by the copies checks
                continue;
            }
            ++received[r];
            ++pushed[e / epn];
            if (unscheduled) {
                if (src != e / epn) {
                    sink.fail("relays: rank ", r, " slot ", b, " (expert ", e, "): unscheduled copy from rank ", src,
                              ", not from its home ", e / epn);
                    ok = false;
                }
                continue;
            }
            if (t < 1 || t > max_round) {
                sink.fail("relays: rank ", r, " slot ", b, " (expert ", e, "): relay_round = ", t, " outside [1, R*B = ",
                          max_round, "]");
                ok = false;
                continue;
            }
            last = std::max<int64_t>(last, t);
            if (src < 0 || src >= R || src == r) {
                sink.fail("relays: rank ", r, " slot ", b, " (expert ", e, "): relay_src = ", src,
                          " is not another rank");
                ok = false;
                continue;
            }
            if (src == e / epn) continue;
            int from = -1;
            for (int c = 0; c < B; ++c)
                if (p.copies[at(src, c)] == e) from = c;
            if (from < 0) {
                sink.fail("relays: rank ", r, " slot ", b, ": relay source rank ", src, " neither homes nor holds expert ",
                          e);
                ok = false;
            } else if (p.relay_round[at(src, from)] >= t) {
                sink.fail("relays: rank ", r, " slot ", b, " (expert ", e, ") arrives in round ", t, " from rank ", src,
                          ", which receives it only in round ", p.relay_round[at(src, from)]);
                ok = false;
            }
        }
    // One send and one receive per rank and round.
    std::vector<int> sends(static_cast<size_t>(R) * (last + 1), 0), recvs(static_cast<size_t>(R) * (last + 1), 0);
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) {
            const int32_t src = p.relay_src[at(r, b)], t = p.relay_round[at(r, b)];
            if (p.copies[at(r, b)] < 0 || t < 1 || t > last || src < 0 || src >= R) continue;
            if (++sends[static_cast<size_t>(src) * (last + 1) + t] == 2)
                sink.fail("relays: rank ", src, " sends more than one copy in round ", t);
            if (++recvs[static_cast<size_t>(r) * (last + 1) + t] == 2)
                sink.fail("relays: rank ", r, " receives more than one copy in round ", t);
        }
    int64_t direct = 0;
    for (int r = 0; r < R; ++r) direct = std::max({direct, pushed[r], received[r]});
    if (p.cost.direct_critical_path != direct)
        sink.fail("cost: direct_critical_path = ", p.cost.direct_critical_path, ", recomputed ", direct);
    if (unscheduled) last = direct;
    if (ok && p.cost.copy_critical_path != last)
        sink.fail("cost: copy_critical_path = ", p.cost.copy_critical_path, ", the copy schedule's last round is ", last);
    if (p.cost.copy_critical_path > direct)
        sink.fail("cost: copy_critical_path = ", p.cost.copy_critical_path, " exceeds direct pushes' ", direct);
}

}  // namespace evenep::validate_detail
