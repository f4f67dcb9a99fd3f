// launch_processes: N local ranks, each in its own process group (include/evenep/launch.hpp).
//
// The environment of every child is built in the parent before fork (execvpe gets it whole), so the child only
// calls async-signal-safe functions between fork and exec. SIGINT and SIGTERM to the launcher only set a flag; the
// wait loop (5 ms polls) sees it and stops every group.
#include "evenep/launch.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "evenep/error.hpp"

extern char** environ;

namespace evenep {
namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

volatile sig_atomic_t g_launch_signal = 0;  // the SIGINT/SIGTERM the launcher got (0: none)

extern "C" void record_launch_signal(int sig) {
    if (g_launch_signal == 0) g_launch_signal = sig;
}

// Handles SIGINT and SIGTERM (recording them in g_launch_signal) while alive, except one the process ignores (a
// launcher started in the background of a script keeps ignoring SIGINT); restores the previous dispositions.
class ScopedSignalCatch {
  public:
    ScopedSignalCatch() {
        g_launch_signal = 0;
        struct sigaction sa {};
        sa.sa_handler = record_launch_signal;
        sigemptyset(&sa.sa_mask);
        for (int i = 0; i < 2; ++i) {
            ::sigaction(kSignals[i], nullptr, &old_[i]);
            if (old_[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &sa, nullptr);
        }
    }
    ~ScopedSignalCatch() { restore(); }
    ScopedSignalCatch(const ScopedSignalCatch&) = delete;
    ScopedSignalCatch& operator=(const ScopedSignalCatch&) = delete;

    // The previous dispositions back (async-signal-safe: also called in a child between fork and exec).
    void restore() const {
        for (int i = 0; i < 2; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    }
    // SIGINT and SIGTERM blocked (true) or unblocked (false) in the calling thread.
    static void block(bool on) {
        sigset_t set;
        sigemptyset(&set);
        for (int sig : kSignals) sigaddset(&set, sig);
        ::pthread_sigmask(on ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
    }

  private:
    static constexpr int kSignals[2] = {SIGINT, SIGTERM};
    struct sigaction old_[2]{};
};

struct Child {
    pid_t pid = -1;  // also the id of its process group
    bool done = false;
    int code = 0;
};

// KEY=VALUE entries: the current environment with `set` applied (replaced or appended) and `defaults` appended
// where the key is not present.
std::vector<std::string> make_env(const Env& set, const Env& defaults) {
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

// Reaps `c` if it has ended; returns true when it has (now or before). `status` receives the wait status.
bool reap(Child& c, int* status, bool block = false) {
    if (c.done) return true;
    if (::waitpid(c.pid, status, block ? 0 : WNOHANG) != c.pid) return false;
    c.done = true;
    c.code = decode_status(*status);
    return true;
}

// True while the process group `pgid` has a member (a zombie counts until its parent reaps it).
bool group_alive(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno == EPERM; }

// SIGTERM to every rank's group (finished ranks too: their children may live on), up to `grace` for the ranks to
// end and the groups to empty, then SIGKILL to every group still populated; every rank is reaped on return.
void kill_groups(std::vector<Child>& children, std::chrono::milliseconds grace) {
    for (const Child& c : children) ::kill(-c.pid, SIGTERM);
    const auto deadline = Clock::now() + grace;
    for (;;) {
        bool all_gone = true;
        for (Child& c : children) {
            int status = 0;
            reap(c, &status);
            all_gone = all_gone && c.done && !group_alive(c.pid);
        }
        if (all_gone || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (Child& c : children) {
        ::kill(-c.pid, SIGKILL);
        int status = 0;
        reap(c, &status, /*block=*/true);
    }
}

std::string signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal " + std::to_string(sig);
}

}  // namespace

LaunchResult launch_processes(const LaunchOptions& options) {
    const int n = options.num_ranks;
    EVENEP_CHECK(n >= 1 && n <= kMaxLaunchRanks, "launch: number of ranks ", n, " outside [1, ", kMaxLaunchRanks, "]");
    EVENEP_CHECK(!options.command.empty() && !options.command.front().empty(),
                 "launch: no command given (evenep launch -n N -- command args...)");

    // argv and envp of every rank, built before any fork.
    std::vector<char*> argv;
    for (const std::string& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::vector<std::string>> envs;
    std::vector<std::vector<char*>> envps;
    for (int r = 0; r < n; ++r) {
        Env set = options.env;
        set.emplace_back("RANK", std::to_string(r));
        set.emplace_back("WORLD_SIZE", std::to_string(n));
        set.emplace_back("LOCAL_RANK", std::to_string(r));
        set.emplace_back("LOCAL_WORLD_SIZE", std::to_string(n));
        envs.push_back(make_env(set, options.env_defaults));
    }
    for (auto& e : envs) {
        std::vector<char*> p;
        for (std::string& kv : e) p.push_back(kv.data());
        p.push_back(nullptr);
        envps.push_back(std::move(p));
    }

    const ScopedSignalCatch catch_signals;
    const pid_t parent = ::getpid();
    std::vector<Child> children;
    children.reserve(n);
    for (int r = 0; r < n; ++r) {
        // SIGINT/SIGTERM stay blocked across fork, so that the child never runs the launcher's handler: it restores
        // the previous dispositions first, then unblocks (a signal sent meanwhile then acts as it would on exec).
        ScopedSignalCatch::block(true);
        const pid_t pid = ::fork();
        if (pid == 0) {
            // Child: a process group of its own, die with the launcher, exec. Only async-signal-safe calls here.
            catch_signals.restore();
            ScopedSignalCatch::block(false);
            ::setpgid(0, 0);
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) ::_exit(125);
            ::execvpe(argv[0], argv.data(), envps[r].data());
            const char msg[] = "evenep launch: cannot execute the command\n";
            [[maybe_unused]] const ssize_t w = ::write(2, msg, sizeof(msg) - 1);
            ::_exit(127);
        }
        const int fork_errno = errno;
        ScopedSignalCatch::block(false);
        if (pid < 0) {
            kill_groups(children, options.kill_grace);
            return LaunchResult{1, r,
                                "launch: fork of rank " + std::to_string(r) + " failed: " + std::strerror(fork_errno)};
        }
        // Also here, so that the group exists before the parent may signal it (EACCES once the child has exec'd:
        // then the child has done it).
        ::setpgid(pid, pid);
        children.push_back(Child{pid});
    }

    const auto start = Clock::now();
    LaunchResult result;
    for (int remaining = n; remaining > 0;) {
        bool progressed = false;
        for (int r = 0; r < n; ++r) {
            Child& c = children[r];
            int status = 0;
            if (c.done || !reap(c, &status)) continue;
            --remaining;
            progressed = true;
            if (c.code != 0) {
                result.exit_code = c.code;
                result.failed_rank = r;
                result.what = "launch: rank " + std::to_string(r) + " (pid " + std::to_string(c.pid) + ") " +
                              (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                   : "exited with code " + std::to_string(c.code)) +
                              "; terminated every rank";
                kill_groups(children, options.kill_grace);
                return result;
            }
        }
        if (const int sig = g_launch_signal; sig != 0) {
            kill_groups(children, options.kill_grace);
            return LaunchResult{128 + sig, -1,
                                "launch: interrupted by " + signal_name(sig) + "; terminated every rank"};
        }
        if (options.timeout.count() > 0 && Clock::now() - start > options.timeout) {
            kill_groups(children, options.kill_grace);
            return LaunchResult{124, -1,
                                "launch: the ranks ran past the timeout of " + std::to_string(options.timeout.count()) +
                                    " ms; terminated every rank"};
        }
        if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return result;
}

}  // namespace evenep
