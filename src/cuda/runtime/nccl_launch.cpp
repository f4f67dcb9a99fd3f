// launch_local_group: one process per GPU on this host (include/evenep/cuda/nccl_team.hpp).
//
// The environment of every child is built in the parent before fork (execvpe gets it whole), so the child only
// calls async-signal-safe functions between fork and exec.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "evenep/cuda/nccl_team.hpp"
#include "evenep/error.hpp"

extern char** environ;

namespace evenep::cuda {
namespace {

struct Child {
    pid_t pid = -1;
    bool done = false;
    int code = 0;
};

// KEY=VALUE entries: the current environment with `set` applied (replaced or appended) and `defaults` appended
// where the key is not present.
std::vector<std::string> make_env(const std::vector<std::pair<std::string, std::string>>& set,
                                  const std::vector<std::pair<std::string, std::string>>& defaults) {
    std::vector<std::string> out;
    auto key_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
    auto is_set = [&](const std::string& key) {
        for (const auto& [k, v] : set)
            if (k == key) return true;
        return false;
    };
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        const std::string kv = *e;
        if (!is_set(key_of(kv))) out.push_back(kv);
    }
    for (const auto& [k, v] : set) out.push_back(k + "=" + v);
    for (const auto& [k, v] : defaults) {
        bool present = false;
        for (const std::string& kv : out) present = present || key_of(kv) == k;
        if (!present) out.push_back(k + "=" + v);
    }
    return out;
}

int decode_status(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

void kill_all(std::vector<Child>& children, std::chrono::milliseconds grace) {
    for (Child& c : children)
        if (!c.done) ::kill(c.pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
        bool all_done = true;
        for (Child& c : children) {
            if (c.done) continue;
            int status = 0;
            if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
                c.done = true;
                c.code = decode_status(status);
            } else {
                all_done = false;
            }
        }
        if (all_done) return;
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (Child& c : children) {
        if (c.done) continue;
        ::kill(c.pid, SIGKILL);
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        c.done = true;
        c.code = decode_status(status);
    }
}

}  // namespace

LaunchResult launch_local_group(const LaunchOptions& options) {
    const int n = options.num_ranks;
    EVENEP_CHECK(n >= 1 && n <= kMaxVirtualRanks, "launch: number of ranks ", n, " outside [1, ", kMaxVirtualRanks,
                 "]");
    EVENEP_CHECK(!options.command.empty(), "launch: no command given (evenep launch -n N -- command args...)");
    const std::string id = nccl_new_unique_id();
    const std::vector<std::pair<std::string, std::string>> defaults = {
        {"NCCL_NVLS_ENABLE", "0"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}, {"NVSHMEM_DISABLE_NVLS", "1"}};

    // argv and envp of every rank, built before any fork.
    std::vector<char*> argv;
    for (const std::string& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::vector<std::string>> envs;
    std::vector<std::vector<char*>> envps;
    for (int r = 0; r < n; ++r) {
        std::vector<std::pair<std::string, std::string>> set = options.env;
        set.emplace_back("RANK", std::to_string(r));
        set.emplace_back("WORLD_SIZE", std::to_string(n));
        set.emplace_back("LOCAL_RANK", std::to_string(r));
        set.emplace_back("LOCAL_WORLD_SIZE", std::to_string(n));
        set.emplace_back("EVENEP_NCCL_ID", id);
        envs.push_back(make_env(set, defaults));
    }
    for (auto& e : envs) {
        std::vector<char*> p;
        for (std::string& kv : e) p.push_back(kv.data());
        p.push_back(nullptr);
        envps.push_back(std::move(p));
    }

    const pid_t parent = ::getpid();
    std::vector<Child> children(n);
    LaunchResult result;
    for (int r = 0; r < n; ++r) {
        const pid_t pid = ::fork();
        if (pid < 0) {
            result =
                LaunchResult{1, r, "launch: fork of rank " + std::to_string(r) + " failed: " + std::strerror(errno)};
            children.resize(r);
            kill_all(children, options.kill_grace);
            return result;
        }
        if (pid == 0) {
            // Child: die with the launcher; exec the command. Only async-signal-safe calls here.
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) ::_exit(125);
            ::execvpe(argv[0], argv.data(), envps[r].data());
            const char msg[] = "evenep launch: cannot execute the command\n";
            [[maybe_unused]] const ssize_t w = ::write(2, msg, sizeof(msg) - 1);
            ::_exit(127);
        }
        children[r].pid = pid;
    }

    const auto start = std::chrono::steady_clock::now();
    int remaining = n;
    while (remaining > 0) {
        bool progressed = false;
        for (int r = 0; r < n; ++r) {
            Child& c = children[r];
            if (c.done) continue;
            int status = 0;
            if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
            c.done = true;
            c.code = decode_status(status);
            --remaining;
            progressed = true;
            if (c.code != 0 && result.failed_rank < 0) {
                result.exit_code = c.code;
                result.failed_rank = r;
                result.what = "launch: rank " + std::to_string(r) + " (pid " + std::to_string(c.pid) + ") " +
                              (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                   : "exited with code " + std::to_string(c.code)) +
                              "; terminating the other ranks";
                kill_all(children, options.kill_grace);
                return result;
            }
        }
        if (options.timeout.count() > 0 && std::chrono::steady_clock::now() - start > options.timeout) {
            result = LaunchResult{124, -1,
                                  "launch: the ranks ran past the timeout of " +
                                      std::to_string(options.timeout.count()) + " ms; killed all ranks"};
            kill_all(children, options.kill_grace);
            return result;
        }
        if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return result;
}

}  // namespace evenep::cuda
