// src/core/validate_checks.hpp — what the plan checker (validate.cpp) and the dst checker (validate_dst.cpp)
// share: the error sink and the quantities check_plan derives from the plan's inputs. Internal to evenep::core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "evenep/plan.hpp"
#include "evenep/routing.hpp"
#include "evenep/validate.hpp"

namespace evenep::validate_detail {

// At most this many messages are stored; the rest are counted and summarised in one last line.
inline constexpr size_t kMaxStoredErrors = 200;

class Sink {
  public:
    explicit Sink(ValidationReport& report) : report_(report) {}
    ~Sink() {
        if (dropped_ > 0) report_.errors.push_back("... and " + std::to_string(dropped_) + " more errors not listed");
    }
    Sink(const Sink&) = delete;
    Sink& operator=(const Sink&) = delete;

    template <typename... Args>
    void fail(Args&&... parts) {
        ++count_;
        if (report_.errors.size() >= kMaxStoredErrors) {
            ++dropped_;
            return;
        }
        std::ostringstream os;
        ((os << std::forward<Args>(parts)), ...);
        report_.errors.push_back(os.str());
    }
    size_t count() const { return count_; }

  private:
    ValidationReport& report_;
    size_t count_ = 0;
    size_t dropped_ = 0;
};

// Everything validate_plan derives from the plan's inputs and its alloc matrix, shared with validate_dst.
struct Expected {
    int R = 0, E = 0, K = 0, S = 0, epn = 0, G = 0, B = 0, tp = 1;
    int64_t nvs = 0;
    bool optimized = false;
    std::vector<int64_t> load;             // [E] T_e
    std::vector<int64_t> q;                // [R]
    std::vector<std::vector<int>> remote;  // [R] remote experts with alloc > 0, ascending
    std::vector<int64_t> keep;             // [E*R] locality keep required by the mode
    std::vector<int64_t> seg_begin;        // [R*E] first row of e's group on r from the plan's cu_seqlens, -1 if none
};

// Checks the plan (validate.cpp); fills `x`. Returns false when the plan cannot be inspected further (bad config or
// array sizes).
bool check_plan(const Plan& p, Sink& sink, Expected& x);

// Checks the copy tree and the copy critical paths (validate_relay.cpp); needs sizes checked.
void check_relays(const Plan& p, Sink& sink);

// Checks every rank's encoded destinations against `routing` (validate_dst.cpp); needs check_plan's `x`.
void check_dst(const Plan& p,
               const Routing& routing,
               const std::vector<std::vector<int32_t>>& dst,
               Sink& sink,
               const Expected& x);

}  // namespace evenep::validate_detail
