// launch_processes (evenep/launch.hpp) and `evenep launch` (issue 35, item 4): every rank in a process group of its
// own; on a rank's failure, the timeout, SIGINT or SIGTERM every group is stopped — grandchildren included — and
// the first failure's code is returned, naming the rank. Ranks are /bin/sh scripts that write the pids of their
// sleeping background children ("grandchildren") into files; a grandchild counts as gone when kill(pid, 0) fails
// or it is a zombie (an orphan that the container's init has not reaped yet).
//
// Cases:
//   LaunchProcesses.SetsRankEnvironment        RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, env replaces,
//                                              env_defaults only where unset; exit 0
//   LaunchProcesses.OwnProcessGroup            each rank leads its own group (pgid == pid != the launcher's)
//   LaunchProcesses.FailureKillsGrandchildren  rank 1 starts a grandchild and exits 3 while rank 0 sleeps: exit 3,
//                                              rank 1 named, both grandchildren gone, well before they would end
//   LaunchProcesses.SuccessfulRankGroupKilled  a rank that exited 0 left a grandchild; another rank then fails: the
//                                              first rank's grandchild is stopped too
//   LaunchProcesses.TermIgnoredGetsKill        a grandchild that ignores SIGTERM is killed after the grace period
//   LaunchProcesses.Timeout                    exit 124, every grandchild gone
//   LaunchProcesses.BadOptions                 0 ranks, an empty command: evenep::Error
//   LaunchCli.FailureOneLine                   `evenep launch` without CUDA: the rank's code, one stderr line naming
//                                              the rank, grandchildren gone
//   LaunchCli.SigintAndSigterm                 SIGINT (Ctrl-C) / SIGTERM to `evenep launch`: exit 130 / 143, one
//                                              line, every rank and grandchild gone
#include "evenep/launch.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_testing.hpp"
#include "evenep/error.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The pid written in `file` (0 when the file is missing or empty).
pid_t read_pid(const fs::path& file) {
    std::ifstream f(file);
    long pid = 0;
    f >> pid;
    return static_cast<pid_t>(pid);
}

// The pid in `file`, waiting up to `wait` for it to be written.
pid_t wait_pid_file(const fs::path& file, std::chrono::milliseconds wait = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
        if (const pid_t pid = read_pid(file); pid > 0) return pid;
        if (std::chrono::steady_clock::now() > deadline) return 0;
        std::this_thread::sleep_for(10ms);
    }
}

// True when `pid` no longer runs: no such process, or a zombie.
bool process_gone(pid_t pid) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const size_t paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// process_gone within `wait` (a killed orphan may take a moment to be reaped).
bool becomes_gone(pid_t pid, std::chrono::milliseconds wait = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!process_gone(pid)) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(10ms);
    }
    return true;
}

// The process whose pid `pid_file` holds was started and is gone (within becomes_gone's wait).
void expect_gone(const fs::path& pid_file, const std::string& what) {
    const pid_t pid = read_pid(pid_file);
    ASSERT_GT(pid, 0) << what << ": no pid in " << pid_file;
    EXPECT_TRUE(becomes_gone(pid)) << what << " (pid " << pid << ") survived";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

LaunchOptions sh(int num_ranks, const std::string& script) {
    LaunchOptions lo;
    lo.num_ranks = num_ranks;
    lo.command = {"/bin/sh", "-c", script};
    lo.kill_grace = 2s;
    return lo;
}

TEST(LaunchProcesses, SetsRankEnvironment) {
    ::setenv("EVENEP_LAUNCH_TEST_PRESET", "mine", 1);
    LaunchOptions lo = sh(3,
                          "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_WORLD_SIZE\" = 3 && "
                          "test \"$LOCAL_RANK\" = \"$RANK\" && test \"$RANK\" -lt 3 && test \"$EXTRA\" = yes && "
                          "test \"$EVENEP_LAUNCH_TEST_PRESET\" = mine && test \"$DEFAULTED\" = d");
    lo.env = {{"EXTRA", "yes"}};
    lo.env_defaults = {{"EVENEP_LAUNCH_TEST_PRESET", "default"}, {"DEFAULTED", "d"}};
    const LaunchResult r = launch_processes(lo);
    ::unsetenv("EVENEP_LAUNCH_TEST_PRESET");
    EXPECT_EQ(r.exit_code, 0) << r.what;
    EXPECT_EQ(r.failed_rank, -1);
    EXPECT_EQ(r.what, "");
}

TEST(LaunchProcesses, OwnProcessGroup) {
    const fs::path dir = testing::temp_dir("launch", "pgrp");
    // ps-free: the shell's $$ is the rank's pid; /proc/self/stat field 5 of a child of the shell is its pgid.
    const LaunchResult r = launch_processes(sh(
        2, "cut -d' ' -f5 /proc/self/stat > " + dir.string() + "/pgid$RANK; echo $$ > " + dir.string() + "/pid$RANK"));
    ASSERT_EQ(r.exit_code, 0) << r.what;
    for (int rank = 0; rank < 2; ++rank) {
        const pid_t pid = read_pid(dir / ("pid" + std::to_string(rank)));
        const pid_t pgid = read_pid(dir / ("pgid" + std::to_string(rank)));
        EXPECT_GT(pid, 0);
        EXPECT_EQ(pgid, pid) << "rank " << rank << " must lead its own process group";
        EXPECT_NE(pgid, ::getpgrp());
    }
}

TEST(LaunchProcesses, FailureKillsGrandchildren) {
    const fs::path dir = testing::temp_dir("launch", "failure");
    const std::string g0 = (dir / "g0").string(), g1 = (dir / "g1").string();
    // Rank 0 starts a grandchild and waits; rank 1 waits for that, starts its own and fails.
    LaunchOptions lo = sh(2, "if [ \"$RANK\" = 0 ]; then sleep 60 & echo $! > " + g0 + "; wait; else while [ ! -s " +
                                 g0 + " ]; do sleep 0.02; done; sleep 60 & echo $! > " + g1 + "; exit 3; fi");
    const auto t0 = std::chrono::steady_clock::now();
    const LaunchResult r = launch_processes(lo);
    EXPECT_LT(seconds_since(t0), 30.0);
    EXPECT_EQ(r.exit_code, 3) << r.what;
    EXPECT_EQ(r.failed_rank, 1) << r.what;
    EXPECT_NE(r.what.find("rank 1"), std::string::npos) << r.what;
    EXPECT_NE(r.what.find("exited with code 3"), std::string::npos) << r.what;
    expect_gone(g0, "the grandchild of rank 0");
    expect_gone(g1, "the grandchild of the failing rank 1");
}

TEST(LaunchProcesses, SuccessfulRankGroupKilled) {
    const fs::path dir = testing::temp_dir("launch", "success_then_failure");
    const std::string g0 = (dir / "g0").string();
    // Rank 0 leaves a grandchild behind and exits 0; rank 1 fails once rank 0 is done.
    const LaunchResult r = launch_processes(sh(2, "if [ \"$RANK\" = 0 ]; then sleep 60 & echo $! > " + g0 +
                                                      "; exit 0; else while [ ! -s " + g0 +
                                                      " ]; do sleep 0.02; done; sleep 0.3; exit 4; fi"));
    EXPECT_EQ(r.exit_code, 4) << r.what;
    EXPECT_EQ(r.failed_rank, 1) << r.what;
    expect_gone(g0, "the grandchild of the rank that exited 0");
}

TEST(LaunchProcesses, TermIgnoredGetsKill) {
    const fs::path dir = testing::temp_dir("launch", "term_ignored");
    const std::string g0 = (dir / "g0").string();
    LaunchOptions lo = sh(1, "sh -c 'trap \"\" TERM; echo $$ > " + g0 + "; exec sleep 60' & while [ ! -s " + g0 +
                                 " ]; do sleep 0.02; done; exit 7");
    lo.kill_grace = 500ms;
    const auto t0 = std::chrono::steady_clock::now();
    const LaunchResult r = launch_processes(lo);
    EXPECT_LT(seconds_since(t0), 20.0);
    EXPECT_EQ(r.exit_code, 7) << r.what;
    expect_gone(g0, "a grandchild ignoring SIGTERM (SIGKILL after the grace period)");
}

TEST(LaunchProcesses, Timeout) {
    const fs::path dir = testing::temp_dir("launch", "timeout");
    LaunchOptions lo = sh(2, "sleep 60 & echo $! > " + dir.string() + "/g$RANK; wait");
    lo.timeout = 1500ms;
    const LaunchResult r = launch_processes(lo);
    EXPECT_EQ(r.exit_code, 124) << r.what;
    EXPECT_EQ(r.failed_rank, -1);
    EXPECT_NE(r.what.find("timeout"), std::string::npos) << r.what;
    for (int rank = 0; rank < 2; ++rank) expect_gone(dir / ("g" + std::to_string(rank)), "a grandchild");
}

TEST(LaunchProcesses, BadOptions) {
    EXPECT_THROW(launch_processes(sh(0, "true")), Error);
    EXPECT_THROW(launch_processes(sh(kMaxLaunchRanks + 1, "true")), Error);
    LaunchOptions empty;
    EXPECT_THROW(launch_processes(empty), Error);
}

// The lines of `s` (no trailing empty line).
std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream is(s);
    for (std::string l; std::getline(is, l);) out.push_back(l);
    return out;
}

TEST(LaunchCli, FailureOneLine) {
    const fs::path dir = testing::temp_dir("launch", "cli_failure");
    const std::string g1 = (dir / "g1").string();
    const testing::CliRun run =
        testing::run_cli("launch -n 2 --grace 1 -- /bin/sh -c 'if [ \"$RANK\" = 1 ]; then sleep 60 & echo $! > " + g1 +
                             "; exit 5; else sleep 60; fi'",
                         /*merge_stderr=*/false, 60);
    EXPECT_EQ(run.exit_code, 5) << run.error;
    const std::vector<std::string> lines = lines_of(run.error);
    ASSERT_EQ(lines.size(), 1u) << run.error;
    EXPECT_NE(lines[0].find("rank 1"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find("code 5"), std::string::npos) << lines[0];
    EXPECT_LT(run.seconds, 30.0);
    expect_gone(g1, "the grandchild of the failing rank");
}

// Starts `evenep launch -n 2 -- sh` (every rank and its grandchild write their pids), sends `sig` to the launcher
// once all four pids are known, and checks the exit code, the single stderr line and that all four are gone.
void expect_signal_stops_everything(int sig, int expected_code, const std::string& name) {
    const fs::path dir = testing::temp_dir("launch", "cli_" + name);
    const fs::path err = dir / "stderr";
    const std::string script =
        "echo $$ > " + dir.string() + "/r$RANK; sleep 60 & echo $! > " + dir.string() + "/g$RANK; wait";
    const pid_t launcher = ::fork();
    ASSERT_GE(launcher, 0);
    if (launcher == 0) {
        std::FILE* f = std::freopen(err.c_str(), "w", stderr);
        if (f == nullptr) ::_exit(99);
        ::execl(EVENEP_CLI_PATH, EVENEP_CLI_PATH, "launch", "-n", "2", "--grace", "2", "--", "/bin/sh", "-c",
                script.c_str(), static_cast<char*>(nullptr));
        ::_exit(98);
    }
    std::vector<pid_t> pids;
    for (const char* kind : {"r", "g"})
        for (int rank = 0; rank < 2; ++rank) pids.push_back(wait_pid_file(dir / (kind + std::to_string(rank))));
    for (pid_t pid : pids) EXPECT_GT(pid, 0);
    ASSERT_EQ(::kill(launcher, sig), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
    ASSERT_TRUE(WIFEXITED(status)) << "evenep launch died of a signal instead of stopping the ranks";
    EXPECT_EQ(WEXITSTATUS(status), expected_code);
    std::ifstream f(err);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::vector<std::string> lines = lines_of(ss.str());
    ASSERT_EQ(lines.size(), 1u) << ss.str();
    EXPECT_NE(lines[0].find(name), std::string::npos) << lines[0];
    for (pid_t pid : pids) {
        if (pid > 0) {
            EXPECT_TRUE(becomes_gone(pid)) << name << ": process " << pid << " survived";
        }
    }
}

TEST(LaunchCli, SigintAndSigterm) {
    expect_signal_stops_everything(SIGINT, 130, "SIGINT");
    expect_signal_stops_everything(SIGTERM, 143, "SIGTERM");
}

}  // namespace
}  // namespace evenep
