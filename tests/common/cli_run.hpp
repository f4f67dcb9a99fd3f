// tests/common/cli_run.hpp — runs the evenep CLI binary (EVENEP_CLI_PATH, defined by tests/CMakeLists.txt) from a
// test and returns its exit code, stdout and stderr (separately) and its wall time.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace evenep::cli_test {

struct CliRun {
    int exit_code = -1;  // -1: killed by a signal or not started
    std::string output;  // stdout, plus stderr when run with merge_stderr
    std::string error;   // stderr (empty with merge_stderr)
    double seconds = 0;
};

// Runs `evenep <args>` through the shell (args are shell words), killed after `timeout_s` seconds (exit code 124);
// `shell_prefix` runs first in the same shell (e.g. "ulimit -v 1000000;").
inline CliRun run_cli(const std::string& args,
                      bool merge_stderr = true,
                      int timeout_s = 600,
                      const std::string& shell_prefix = "") {
    const std::string err_file = ::testing::TempDir() + "evenep_cli_stderr_" + std::to_string(getpid()) + ".txt";
    const std::string cmd = shell_prefix + " timeout " + std::to_string(timeout_s) + " " +
                            std::string(EVENEP_CLI_PATH) + " " + args + (merge_stderr ? " 2>&1" : " 2>" + err_file);
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

}  // namespace evenep::cli_test
