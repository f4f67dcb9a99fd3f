// tests/common/cli_testing.hpp — runs the `evenep` binary built next to the tests (EVENEP_CLI_PATH) and makes a
// scratch directory per test process.
// NOTE: cpu_demo_test.cpp and exact_test.cpp still carry their own copies of these two helpers.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace evenep::testing {

struct CliRun {
    int exit_code = -1;
    std::string output;  // stdout and stderr together
};

// `evenep ARGS 2>&1`; exit_code -1 when the process did not exit normally.
inline CliRun run_cli(const std::string& args) {
    const std::string cmd = std::string(EVENEP_CLI_PATH) + " " + args + " 2>&1";
    CliRun run;
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return run;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) run.output.append(buf, n);
    const int status = pclose(p);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return run;
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
