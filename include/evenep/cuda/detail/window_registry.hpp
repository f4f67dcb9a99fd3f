// evenep/cuda/detail/window_registry.hpp — the symmetric windows a device team holds (not a contract): the
// bookkeeping behind Team::alloc_window / free_window of both teams. Host-only C++ without CUDA, so that it is
// tested on the CPU (tests/unit/window_registry_test.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "evenep/error.hpp"

namespace evenep::detail {

// Entries in allocation order; [0] is the team's main window (freed only with the team). `Entry` is the team's
// record of one window (the local team: the Window itself; the NCCL team: the allocation, its registration and
// the Window handed out). A window is identified by the address of the Window the team handed out.
template <typename Entry>
class WindowRegistry {
  public:
    // Takes `entry` (appended) and returns it. The entry is held from here on, so a team that fails half way through
    // allocating its memory still releases what was allocated (release_all).
    Entry& add(std::unique_ptr<Entry> entry) {
        entries_.push_back(std::move(entry));
        return *entries_.back();
    }

    // Removes and returns the entry whose handed-out Window is at `handle` (`handle_of(entry)` gives that address);
    // the caller releases its memory. Throws Error(kInvalidArgument) naming `team` for the main window or for an
    // address not held here (freed already, or another team's window).
    template <typename HandleOf>
    std::unique_ptr<Entry> take(const void* handle, HandleOf handle_of, const char* team) {
        EVENEP_CHECK(entries_.empty() || handle != handle_of(*entries_.front()), team,
                     ": free_window of the main window (it is freed with the team)");
        for (size_t i = 1; i < entries_.size(); ++i) {
            if (handle_of(*entries_[i]) != handle) continue;
            std::unique_ptr<Entry> e = std::move(entries_[i]);
            entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
            return e;
        }
        EVENEP_CHECK(false, team, ": free_window of a window this team does not hold (", handle,
                     "): freed already, or another team's");
        return nullptr;  // not reached
    }

    // Calls release(entry) for every entry, newest first (the main window last), then holds none.
    template <typename Release>
    void release_all(Release release) noexcept {
        for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) release(**it);
        entries_.clear();
    }

    size_t size() const { return entries_.size(); }  // including the main window
    bool empty() const { return entries_.empty(); }
    const Entry& front() const { return *entries_.front(); }

  private:
    std::vector<std::unique_ptr<Entry>> entries_;
};

}  // namespace evenep::detail
