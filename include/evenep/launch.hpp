// evenep/launch.hpp — starting N local processes as one group of ranks (`evenep launch`, the multi-GPU tests).
//
// Host only, no CUDA: every child is started with fork + execvpe in a process group of its own, so that stopping a
// rank stops everything it started (a shell's background jobs, a torch data-loader worker). The NCCL flavour,
// cuda::launch_local_group (evenep/cuda/nccl_team.hpp), adds the NCCL unique id and calls this.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace evenep {

inline constexpr int kMaxLaunchRanks = 4096;

struct LaunchOptions {
    int num_ranks = 1;
    std::vector<std::string> command;                               // argv of every rank (execvp: PATH is searched)
    std::vector<std::pair<std::string, std::string>> env;           // extra variables of every rank (replace)
    std::vector<std::pair<std::string, std::string>> env_defaults;  // variables set only where the caller has none
    std::chrono::milliseconds timeout{0};                           // 0: none; else every rank is killed after it
    std::chrono::milliseconds kill_grace{5000};                     // SIGTERM -> SIGKILL delay when killing ranks
};

struct LaunchResult {
    int exit_code = 0;     // 0 when every rank exited 0; else the first failure's exit code (128 + signal for a
                           // signal, 124 for the timeout, 127 when the command could not be started, 130/143 when
                           // the launcher itself got SIGINT/SIGTERM)
    int failed_rank = -1;  // the rank that failed first (-1: none, or the timeout, or a signal to the launcher)
    std::string what;      // one line describing the first failure ("" when none)
};

// Starts `num_ranks` children with RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set (plus `env`, and
// `env_defaults` where unset), each the leader of its own process group, and waits for all of them.
// On the first failing rank, on the timeout, or on SIGINT or SIGTERM to the calling process (handled for the
// duration of the call, the previous handlers restored on return) it terminates every rank's process group —
// grandchildren included, also those of ranks that already exited 0 — with SIGTERM, waits up to kill_grace for the
// groups to empty, then sends SIGKILL to what is left, reaps the ranks and returns the first failure.
// Children get SIGTERM if the launching thread dies (PR_SET_PDEATHSIG; their own children do not).
// NOTE: a rank is not in the terminal's foreground group: Ctrl-C reaches the launcher only (which then stops every
// rank), and a rank that reads the terminal is stopped (SIGTTIN); give ranks their input through files or pipes.
// Throws evenep::Error(kInvalidArgument) for num_ranks outside [1, kMaxLaunchRanks] or an empty command.
LaunchResult launch_processes(const LaunchOptions& options);

}  // namespace evenep
