// `evenep launch -n N [--timeout SECONDS] -- command args...`: one process per GPU on this host (SPEC §5).
//
// Starts N copies of the command with RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set, each in a process group
// of its own (launch_processes, evenep/launch.hpp), and waits for all of them. In a build with the NCCL team it also
// creates the NCCL unique id (EVENEP_NCCL_ID) and turns NVLink multicast off where unset (NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: cuda::launch_local_group). On the first failing rank,
// the timeout, or SIGINT/SIGTERM to the launcher, every rank's group is terminated (SIGTERM, then SIGKILL after
// --grace seconds) and the launcher exits with that failure's code, naming the rank, in one line.
// Registered by register_launch (called from main.cpp).
#include "evenep/launch.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "evenep/error.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include "evenep/cuda/nccl_team.hpp"
#endif

namespace evenep::cli {
namespace {

struct LaunchCliOptions {
    int num_ranks = 0;
    double timeout_s = 0;
    double grace_s = 5;
    std::vector<std::string> command;
};

// Where execvp would find `name` (a path when it holds a '/', else the first match on PATH); throws
// Error(kInvalidArgument) naming the command and the reason, so a typo fails before any rank starts instead of as
// N children exiting 127.
void check_executable(const std::string& name) {
    EVENEP_CHECK(!name.empty(), "launch: empty command");
    const auto usable = [](const std::string& p, int* err) {
        struct stat st {};
        if (::stat(p.c_str(), &st) != 0) return *err = errno, false;
        if (S_ISDIR(st.st_mode)) return *err = EISDIR, false;
        if (::access(p.c_str(), X_OK) != 0) return *err = errno, false;
        return true;
    };
    int err = ENOENT;
    if (name.find('/') != std::string::npos) {
        EVENEP_CHECK(usable(name, &err), "launch: cannot execute '", name, "': ", std::strerror(err));
        return;
    }
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
    for (size_t begin = 0; begin <= dirs.size();) {
        const size_t end = std::min(dirs.find(':', begin), dirs.size());
        const std::string dir = dirs.substr(begin, end - begin);
        if (usable((dir.empty() ? "." : dir) + "/" + name, &err)) return;
        begin = end + 1;
    }
    EVENEP_CHECK(false, "launch: cannot execute '", name, "': not found on PATH");
}

}  // namespace

void register_launch(CLI::App& app) {
    auto opt = std::make_shared<LaunchCliOptions>();
    CLI::App* cmd = app.add_subcommand(
        "launch",
        "Run a command as N ranks, one process per GPU, each in a process group of its own: sets RANK, WORLD_SIZE, "
        "LOCAL_RANK and LOCAL_WORLD_SIZE (and, in a build with the NCCL team, creates the NCCL unique id: "
        "EVENEP_NCCL_ID). On the first failing rank, the timeout, or Ctrl-C/SIGTERM, every rank and everything it "
        "started is terminated (SIGTERM, then SIGKILL after --grace) and launch exits with that rank's code (124: "
        "timeout, 130/143: SIGINT/SIGTERM), naming it. Ranks do not read the terminal (e.g. evenep launch -n 8 -- "
        "evenep bench multi)");
    add_int(*cmd, "-n,--nproc", opt->num_ranks, "number of ranks (processes, one GPU each)", 1, 256)->required();
    add_real(*cmd, "--timeout", opt->timeout_s, "kill every rank after this many seconds (0: none)", 0, 1e9)
        ->capture_default_str();
    add_real(*cmd, "--grace", opt->grace_s, "seconds between SIGTERM and SIGKILL when stopping the ranks", 0, 3600)
        ->capture_default_str();
    cmd->add_option("command", opt->command, "the command every rank runs (after --); must be executable")->required();
    cmd->callback([opt] {
        check_executable(opt->command.front());
        LaunchOptions lo;
        lo.num_ranks = opt->num_ranks;
        lo.command = opt->command;
        lo.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt->timeout_s * 1000));
        lo.kill_grace = std::chrono::milliseconds(static_cast<int64_t>(opt->grace_s * 1000));
#if defined(EVENEP_HAVE_CUDA)
        const LaunchResult r = cuda::nccl_team_built() ? cuda::launch_local_group(lo) : launch_processes(lo);
#else
        const LaunchResult r = launch_processes(lo);
#endif
        if (r.exit_code != 0) {
            std::fflush(stdout);
            std::fprintf(stderr, "evenep: %s\n", r.what.c_str());
            std::exit(r.exit_code);  // the failing rank's exit code, as torchrun does
        }
    });
}

}  // namespace evenep::cli
