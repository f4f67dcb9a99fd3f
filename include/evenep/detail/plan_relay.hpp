// evenep/detail/plan_relay.hpp — relayed prefetch: the copy tree of every copied expert and its round schedule,
// computed from a finished plan's copies[R*B] (a deterministic post-pass, shared by the CPU planner and the GPU
// planner, which call plan_relays after the plan is complete; docs/relayed-prefetch.md).
//
// Model. A copy of expert e (home h = e / epn) held in slot (r, b) arrives in a round t >= 1 from relay_src[r*B+b]:
// h itself (a direct push) or a rank that holds e in a slot of its own and received it in an earlier round (a
// relay). In one round every rank sends at most one expert weight and receives at most one (one send and one
// receive port: NVLink and IB are full duplex). The copy critical path is the number of rounds of the schedule.
//   direct  every copy from its home. The rounds are a proper colouring of the bipartite multigraph
//           (sender ports, receiver ports) with Delta = max_r max(pushed_r, received_r) colours (König's edge
//           colouring theorem, alternating-path construction), so the direct critical path is exactly Delta.
//   relayed greedy list scheduling, round by round: receivers with the most pending copies first; each takes the
//           pending copy with a free sender whose expert is most urgent (still only at a home with the most such
//           experts, then the most pending receivers); the sender is a free relay (a rank that received the
//           expert in an earlier round) with the fewest sends so far, then the lowest rank, else the home. Kept
//           only when it needs fewer rounds than Delta; else the direct schedule.
// Without relays (the default) the copies are direct and left unscheduled (relay_round 0): their critical path is
// Delta by the theorem, and the planner does not pay for the colouring.
// Lower bound of any tree: max(copies received by one rank, distinct experts one home must send at least once,
// ceil(log2(copies of one expert + 1))) (plan_relay_lower_bound).
//
// Nothing here allocates or throws; the callers size `work` with plan_relay_work_size.
#pragma once

#include <cstdint>

#include "evenep/detail/host_device.hpp"

namespace evenep::detail {

struct RelayDims {
    int R;
    int E;
    int epn;
    int B;  // prefetch slots per rank
};

struct RelayPaths {
    int32_t critical_path;         // rounds of the schedule written (relayed or direct)
    int32_t direct_critical_path;  // Delta: rounds of direct pushes
};

// int32 words of `work` that plan_relays and plan_relay_lower_bound need.
EVENEP_HOST_DEVICE constexpr int64_t plan_relay_work_size(int R, int E, int B) {
    const int64_t r = R, n = int64_t{R} * B;
    const int64_t greedy = 6 * r + 2 * int64_t{E} + 1 + n;
    const int64_t direct = 2 * r + 2 * r * n + n;
    return (greedy > direct ? greedy : direct) + int64_t{E} + r;
}

// Delta of direct pushes: max over ranks of copies pushed and copies received.
EVENEP_HOST_DEVICE inline int32_t plan_direct_critical_path(const RelayDims& d, const int32_t* copies, int32_t* work) {
    int32_t* sends = work;
    int32_t* recvs = work + d.R;
    for (int r = 0; r < d.R; ++r) sends[r] = recvs[r] = 0;
    for (int i = 0; i < d.R * d.B; ++i)
        if (copies[i] >= 0) ++sends[copies[i] / d.epn], ++recvs[i / d.B];
    int32_t delta = 0;
    for (int r = 0; r < d.R; ++r) {
        delta = sends[r] > delta ? sends[r] : delta;
        delta = recvs[r] > delta ? recvs[r] : delta;
    }
    return delta;
}

// Direct pushes in Delta rounds: edge i (slot i = r*B + b, sender home(copies[i]), receiver r) in ascending i takes
// the lowest colour a free at its sender; when a is taken at the receiver, the a/b path from the receiver (b: its
// lowest free colour) is flipped first. Returns Delta.
EVENEP_HOST_DEVICE inline int32_t plan_relay_direct(const RelayDims& d,
                                                    const int32_t* copies,
                                                    int32_t* src,
                                                    int32_t* round,
                                                    int32_t* work) {
    const int R = d.R, B = d.B, N = d.R * d.B;
    const int32_t C = plan_direct_critical_path(d, copies, work);
    for (int i = 0; i < N; ++i) {
        src[i] = copies[i] >= 0 ? copies[i] / d.epn : -1;
        round[i] = 0;
    }
    if (C == 0) return 0;
    int32_t* scol = work + 2 * R;                // [R*C] slot sent by rank u with colour c, -1: free
    int32_t* rcol = scol + int64_t{R} * C;       // [R*C] slot received by rank v with colour c
    int32_t* path = rcol + int64_t{R} * C;       // [N]
    for (int64_t k = 0; k < 2 * int64_t{R} * C; ++k) scol[k] = -1;
    for (int i = 0; i < N; ++i) {
        if (copies[i] < 0) continue;
        const int u = src[i], v = i / B;
        int a = 0, b = 0;
        while (scol[int64_t{u} * C + a] >= 0) ++a;
        while (rcol[int64_t{v} * C + b] >= 0) ++b;
        if (rcol[int64_t{v} * C + a] >= 0) {
            // The a/b path from v: colour a at receivers, b at senders. It never reaches u (u has a free).
            int n = 0;
            for (int x = v, e = rcol[int64_t{v} * C + a]; e >= 0;) {
                path[n++] = e;
                const int w = src[e];
                const int f = scol[int64_t{w} * C + b];
                if (f < 0) break;
                path[n++] = f;
                x = f / B;
                e = rcol[int64_t{x} * C + a];
            }
            for (int k = 0; k < n; ++k) {
                const int e = path[k], c = round[e] - 1;
                scol[int64_t{src[e]} * C + c] = -1;
                rcol[int64_t{e / B} * C + c] = -1;
            }
            for (int k = 0; k < n; ++k) {
                const int e = path[k], c = round[e] - 1 == a ? b : a;
                scol[int64_t{src[e]} * C + c] = e;
                rcol[int64_t{e / B} * C + c] = e;
                round[e] = c + 1;
            }
        }
        scol[int64_t{u} * C + a] = i;
        rcol[int64_t{v} * C + a] = i;
        round[i] = a + 1;
    }
    return C;
}

// The greedy relayed schedule (see the header comment). Returns its number of rounds.
EVENEP_HOST_DEVICE inline int32_t plan_relay_greedy(const RelayDims& d,
                                                    const int32_t* copies,
                                                    int32_t* src,
                                                    int32_t* round,
                                                    int32_t* work) {
    const int R = d.R, E = d.E, B = d.B, N = d.R * d.B;
    int32_t* pend_r = work;           // [R] copies rank r still has to receive
    int32_t* num_sent = work + R;     // [R] sends assigned to rank r so far
    int32_t* busy_s = work + 2 * R;   // [R] last round rank r sends in
    int32_t* busy_r = work + 3 * R;   // [R] last round rank r receives in
    int32_t* order = work + 4 * R;    // [R] receivers of this round, by pending copies (descending), then rank
    int32_t* unsent = work + 5 * R;   // [R] experts of home h with copies none of which has arrived yet
    int32_t* pend_e = work + 6 * R;   // [E] receivers expert e still has
    int32_t* first = pend_e + E;      // [E+1] expert e's slots are list[first[e], first[e+1])
    int32_t* list = first + E + 1;    // [N] slots by expert, ascending slot within an expert
    for (int r = 0; r < R; ++r) pend_r[r] = num_sent[r] = busy_s[r] = busy_r[r] = unsent[r] = 0;
    for (int e = 0; e <= E; ++e) first[e] = 0;
    int remaining = 0;
    for (int i = 0; i < N; ++i) {
        src[i] = -1;
        round[i] = 0;
        if (copies[i] < 0) continue;
        ++first[copies[i] + 1];
        ++pend_r[i / B];
        ++remaining;
    }
    for (int e = 0; e < E; ++e) first[e + 1] += first[e];
    for (int e = 0; e < E; ++e) pend_e[e] = 0;
    for (int i = 0; i < N; ++i)  // ascending slots; pend_e ends as each expert's number of receivers
        if (copies[i] >= 0) list[first[copies[i]] + pend_e[copies[i]]++] = i;
    for (int e = 0; e < E; ++e)
        if (pend_e[e] > 0) ++unsent[e / d.epn];
    int32_t t = 0;
    while (remaining > 0 && t < N + 1) {
        ++t;
        int num = 0;
        for (int r = 0; r < R; ++r) {
            if (pend_r[r] == 0) continue;
            int k = num++;
            while (k > 0 && pend_r[order[k - 1]] < pend_r[r]) {  // stable: equal counts keep rank order
                order[k] = order[k - 1];
                --k;
            }
            order[k] = r;
        }
        for (int k = 0; k < num; ++k) {
            const int v = order[k];
            int best = -1, best_sender = -1;
            for (int b = 0; b < B; ++b) {
                const int i = v * B + b;
                const int32_t e = copies[i];
                if (e < 0 || round[i] != 0) continue;
                // Urgency: the expert's home still has to send many distinct experts (its port is the scarce
                // one), then the expert has many receivers left (its tree has to double more).
                const int h = e / d.epn;
                const bool out = pend_e[e] < first[e + 1] - first[e];  // a copy has arrived: relays exist
                if (best >= 0) {
                    const int32_t eb = copies[best];
                    const bool out_b = pend_e[eb] < first[eb + 1] - first[eb];
                    const int32_t ub = out_b ? 0 : unsent[eb / d.epn], ue = out ? 0 : unsent[h];
                    if (ub > ue || (ub == ue && pend_e[eb] >= pend_e[e])) continue;
                }
                // The sender: a free relay (an earlier receiver) with the fewest sends, then the lowest rank; the
                // home only when no relay is free.
                int s = -1;
                for (int j = first[e]; j < first[e + 1]; ++j) {
                    const int slot = list[j], w = slot / B;
                    if (round[slot] == 0 || round[slot] >= t || busy_s[w] == t) continue;
                    if (s < 0 || num_sent[w] < num_sent[s] || (num_sent[w] == num_sent[s] && w < s)) s = w;
                }
                if (s < 0 && busy_s[h] != t) s = h;
                if (s < 0) continue;
                best = i;
                best_sender = s;
            }
            if (best < 0) continue;
            src[best] = best_sender;
            round[best] = t;
            busy_s[best_sender] = t;
            busy_r[v] = t;
            ++num_sent[best_sender];
            if (pend_e[copies[best]] == first[copies[best] + 1] - first[copies[best]]) --unsent[copies[best] / d.epn];
            --pend_r[v];
            --pend_e[copies[best]];
            --remaining;
        }
    }
    return t;
}

// Lower bound of the copy critical path of any tree over these copies (see the header comment).
EVENEP_HOST_DEVICE inline int32_t plan_relay_lower_bound(const RelayDims& d, const int32_t* copies, int32_t* work) {
    int32_t* count = work;          // [E] copies of expert e
    int32_t* distinct = work + d.E;  // [R] experts of home h with at least one copy
    int32_t* recvs = distinct + d.R;  // [R]
    for (int e = 0; e < d.E; ++e) count[e] = 0;
    for (int r = 0; r < d.R; ++r) distinct[r] = recvs[r] = 0;
    for (int i = 0; i < d.R * d.B; ++i)
        if (copies[i] >= 0) ++count[copies[i]], ++recvs[i / d.B];
    int32_t lb = 0;
    for (int e = 0; e < d.E; ++e) {
        if (count[e] == 0) continue;
        ++distinct[e / d.epn];
        int32_t depth = 0;
        while ((int64_t{1} << depth) < int64_t{count[e]} + 1) ++depth;  // ceil(log2(count + 1))
        lb = depth > lb ? depth : lb;
    }
    for (int r = 0; r < d.R; ++r) {
        lb = distinct[r] > lb ? distinct[r] : lb;
        lb = recvs[r] > lb ? recvs[r] : lb;
    }
    return lb;
}

// The post-pass: fills relay_src[R*B] and relay_round[R*B] (-1 / 0 for an empty slot) from copies[R*B].
// Without `relay`: every copy from its home, unscheduled (relay_round 0 everywhere: any Delta-round colouring serves;
// O(R*B), cheap enough for the GPU planner's budget). With `relay`: the greedy relayed schedule when it has fewer
// rounds than Delta, else the Delta-round direct schedule (plan_relay_direct), rounds filled in both cases.
EVENEP_HOST_DEVICE inline RelayPaths plan_relays(
    const RelayDims& d, const int32_t* copies, int32_t* relay_src, int32_t* relay_round, int32_t* work, bool relay) {
    const int32_t delta = plan_direct_critical_path(d, copies, work);
    if (!relay) {
        for (int i = 0; i < d.R * d.B; ++i) {
            relay_src[i] = copies[i] >= 0 ? copies[i] / d.epn : -1;
            relay_round[i] = 0;
        }
        return RelayPaths{delta, delta};
    }
    if (delta >= 2) {
        const int32_t rounds = plan_relay_greedy(d, copies, relay_src, relay_round, work);
        if (rounds < delta) return RelayPaths{rounds, delta};
    }
    const int32_t rounds = plan_relay_direct(d, copies, relay_src, relay_round, work);
    return RelayPaths{rounds, rounds};
}

// The slot of rank `rank` that holds expert `e`, or -1 (a rank holds an expert in at most one slot).
EVENEP_HOST_DEVICE inline int relay_slot_of(const int32_t* copies, int B, int rank, int32_t e) {
    for (int b = 0; b < B; ++b)
        if (copies[rank * B + b] == e) return b;
    return -1;
}

// Depth of slot i in its expert's tree: 1 for a direct push, else 1 + the depth of its source's slot. 0: empty or
// broken (a source that does not hold the expert, or a chain longer than R).
EVENEP_HOST_DEVICE inline int relay_level(const RelayDims& d, const int32_t* copies, const int32_t* relay_src, int i) {
    const int32_t e = copies[i];
    if (e < 0) return 0;
    const int home = e / d.epn;
    for (int level = 1; level <= d.R; ++level) {
        const int s = relay_src[i];
        if (s == home) return level;
        if (s < 0 || s >= d.R) return 0;
        const int b = relay_slot_of(copies, d.B, s, e);
        if (b < 0) return 0;
        i = s * d.B + b;
    }
    return 0;
}

}  // namespace evenep::detail
