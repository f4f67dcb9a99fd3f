// evenep/team.hpp — the transport interface every backend is written against (SPEC §5).
//
// A Team is one rank's handle on its EP group: its rank and size, collectively allocated symmetric windows
// (the same number of bytes on every rank, each rank addressing every peer's copy directly), and a barrier
// with a timeout that reports which peer never arrived. Implementation: the local CPU team (R threads of one
// process, evenep/cpu/local_team.hpp). The GPU teams have their own device interface, cuda::Team
// (evenep/cuda/team.hpp: R virtual ranks on one GPU; evenep/cuda/nccl_team.hpp: one process per GPU over NCCL).
//
// Threading: a Team object belongs to one rank and is used from that rank's thread only. Collective calls
// (alloc_symmetric, barrier) must be made by every rank of the group in the same order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace evenep {

// One rank's part of a symmetric window. `local` is this rank's copy (bytes, zero-initialised, 256-byte
// aligned); peer copies are reached through Team::peer_base.
struct SymmetricWindow {
    int id = -1;
    size_t bytes = 0;
    std::byte* local = nullptr;
    std::string name;
};

class Team {
  public:
    virtual ~Team() = default;

    virtual int rank() const = 0;
    virtual int size() const = 0;

    // Collective: every rank allocates `bytes` (the same on all ranks; throws evenep::Error naming the rank
    // whose size differs). The memory stays valid until every rank has called free_symmetric (or the team's
    // group is destroyed).
    virtual SymmetricWindow alloc_symmetric(size_t bytes, std::string_view name) = 0;
    // Not collective: this rank will not touch the window any more (peers' copies included).
    virtual void free_symmetric(SymmetricWindow& window) = 0;
    // Base address of `peer`'s copy of `window` (peer == rank() gives window.local).
    virtual std::byte* peer_base(const SymmetricWindow& window, int peer) const = 0;

    // Barrier of all ranks, also exchanging one status bit per rank: returns the lowest rank that passed
    // ok = false, or -1 when every rank passed ok = true. Memory written by any rank before its arrival
    // (local or peer copies) is visible to every rank after the barrier returns (acquire/release).
    // Throws Error(ErrorKind::kTimeout) naming the phase and the rank(s) that did not arrive within
    // barrier_timeout(); the barrier is then reset, so the group stays usable for the next collective call
    // (every rank that was waiting throws the same error).
    virtual int barrier(std::string_view phase, bool ok = true) = 0;
    virtual std::chrono::milliseconds barrier_timeout() const = 0;

    template <typename T>
    T* peer_ptr(const SymmetricWindow& window, int peer, int64_t offset_bytes) const {
        return reinterpret_cast<T*>(peer_base(window, peer) + offset_bytes);
    }
};

}  // namespace evenep
