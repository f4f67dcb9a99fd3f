// tests/common/cli_testing.hpp — running the `evenep` CLI (EVENEP_CLI_PATH, defined by tests/CMakeLists.txt, which
// also makes every test that includes this header wait for the CLI to build) or any command from a test: exit code,
// stdout and stderr (together or apart), wall time; and a scratch directory per test process.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace evenep::testing {

struct CliRun {
    int exit_code = -1;  // -1: killed by a signal or not started; 124: ended by the timeout
    std::string output;  // stdout, plus stderr when run with merge_stderr
    std::string error;   // stderr (empty with merge_stderr)
    double seconds = 0;
};

// Runs `command` through the shell, killed after `timeout_s` seconds (exit code 124); `shell_prefix` runs first in
// the same shell (e.g. "ulimit -v 1000000;").
inline CliRun run_command(const std::string& command,
                          bool merge_stderr = true,
                          int timeout_s = 600,
                          const std::string& shell_prefix = "") {
    const std::string err_file = ::testing::TempDir() + "evenep_cli_stderr_" + std::to_string(getpid()) + ".txt";
    const std::string cmd = shell_prefix + " timeout " + std::to_string(timeout_s) + " " + command +
                            (merge_stderr ? " 2>&1" : " 2>" + err_file);
    CliRun run;
    const auto t0 = std::chrono::steady_clock::now();
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return run;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) run.output.append(buf, n);
    const int status = pclose(p);
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (!merge_stderr) {
        std::ifstream f(err_file, std::ios::binary);
        std::ostringstream os;
        os << f.rdbuf();
        run.error = os.str();
        std::remove(err_file.c_str());
    }
    return run;
}

// `evenep ARGS` (args are shell words).
inline CliRun run_cli(const std::string& args,
                      bool merge_stderr = true,
                      int timeout_s = 600,
                      const std::string& shell_prefix = "") {
    return run_command(std::string(EVENEP_CLI_PATH) + " " + args, merge_stderr, timeout_s, shell_prefix);
}

// An empty directory <tmp>/<prefix>_<pid>_<name>.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& name) {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(getpid()) + "_" + name);
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
}

}  // namespace evenep::testing
