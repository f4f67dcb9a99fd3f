// evenep/cpu/local_team.hpp — the local CPU team: R virtual ranks as threads of one process (SPEC §5).
//
// A LocalTeamGroup owns the shared state of the group (barrier, symmetric-window registry, memory). team(r)
// is rank r's Team handle; use it from one thread only (run_ranks starts one std::thread per rank).
//
// Barrier: a mutex/condition-variable generation barrier. Arrivals are counted per generation; the last
// arrival completes it. A waiter that times out aborts its generation: every rank waiting in it throws
// Error(kTimeout) naming the phase and the ranks that never arrived, and the barrier starts a fresh generation,
// so the next collective call of all ranks works. Ranks that arrive with different phase names in one
// generation all throw Error(kRuntime) (a desynchronised group: they are in different collective calls).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "evenep/team.hpp"

namespace evenep::cpu {

inline constexpr std::chrono::milliseconds kDefaultBarrierTimeout{120000};

class LocalTeamGroup {
  public:
    explicit LocalTeamGroup(int size, std::chrono::milliseconds barrier_timeout = kDefaultBarrierTimeout);
    ~LocalTeamGroup();
    LocalTeamGroup(const LocalTeamGroup&) = delete;
    LocalTeamGroup& operator=(const LocalTeamGroup&) = delete;

    int size() const;
    Team& team(int rank);
    // Takes effect for barriers entered after the call.
    void set_barrier_timeout(std::chrono::milliseconds timeout);
    std::chrono::milliseconds barrier_timeout() const;

    struct State;  // implementation (src/cpu/local_team.cpp)

  private:
    std::unique_ptr<State> state_;
};

// Runs fn(team(r)) for every rank r on its own std::thread and joins them all. Returns one exception_ptr per
// rank (null where fn returned normally). When a thread cannot be started (thread or memory limit), no rank runs
// fn: the started threads are joined and Error(kInvalidArgument) names the rank that could not start.
std::vector<std::exception_ptr> run_ranks(LocalTeamGroup& group, const std::function<void(Team&)>& fn);
// Same, then rethrows the exception of the lowest failing rank (a bad-input error rather than the timeouts it
// may have caused on other ranks when there is one).
void run_ranks_or_throw(LocalTeamGroup& group, const std::function<void(Team&)>& fn);

}  // namespace evenep::cpu
