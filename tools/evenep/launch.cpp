// `evenep launch -n N [--timeout SECONDS] -- command args...`: one process per GPU on this host (SPEC §5).
//
// Creates the NCCL unique id, starts N copies of the command with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
// EVENEP_NCCL_ID set (NVLink multicast off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
// NVSHMEM_DISABLE_NVLS=1 where unset), waits for all of them, and on the first failure terminates the rest and exits
// with that rank's exit code. Registered by register_launch (called from main.cpp).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#if defined(EVENEP_HAVE_CUDA)
#include "evenep/cuda/nccl_team.hpp"
#endif

namespace evenep::cli {
namespace {

struct LaunchCliOptions {
    int num_ranks = 0;
    double timeout_s = 0;
    std::vector<std::string> command;
};

}  // namespace

void register_launch(CLI::App& app) {
    auto opt = std::make_shared<LaunchCliOptions>();
    CLI::App* cmd = app.add_subcommand(
        "launch",
        "Run a command as N ranks, one process per GPU: creates the NCCL unique id and sets RANK, WORLD_SIZE, "
        "LOCAL_RANK and EVENEP_NCCL_ID (e.g. evenep launch -n 8 -- evenep bench multi)");
    cmd->add_option("-n,--nproc", opt->num_ranks, "number of ranks (processes, one GPU each)")->required();
    cmd->add_option("--timeout", opt->timeout_s, "kill every rank after this many seconds (0: none)")
        ->capture_default_str();
    cmd->add_option("command", opt->command, "the command every rank runs (after --)")->required();
    cmd->callback([opt] {
#if defined(EVENEP_HAVE_CUDA)
        cuda::LaunchOptions lo;
        lo.num_ranks = opt->num_ranks;
        lo.command = opt->command;
        lo.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt->timeout_s * 1000));
        const cuda::LaunchResult r = cuda::launch_local_group(lo);
        if (r.exit_code != 0) {
            std::fprintf(stderr, "evenep: %s\n", r.what.c_str());
            std::fflush(stdout);
            std::exit(r.exit_code);  // the failing rank's exit code, as torchrun does
        }
#else
        EVENEP_CHECK_KIND(ErrorKind::kRuntime, false, "launch: needs a CUDA build with the NCCL team");
#endif
    });
}

}  // namespace evenep::cli
