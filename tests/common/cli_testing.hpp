// tests/common/cli_testing.hpp — running the `evenep` CLI from a test: exit code and combined output.
//
// Each test keeps a one-line run_cli(args) that prefixes EVENEP_CLI_PATH, so tests/CMakeLists.txt (which looks for
// that name in the test's source) makes it wait for the CLI to build.
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

// Runs `command` through the shell with stderr folded into stdout.
inline CliRun run_command(const std::string& command) {
    const std::string cmd = command + " 2>&1";
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

// A fresh, empty folder under the system temp folder: <prefix>_<pid>_<name>.
inline std::filesystem::path fresh_temp_dir(const std::string& prefix, const std::string& name) {
    namespace fs = std::filesystem;
    const fs::path d = fs::temp_directory_path() / (prefix + "_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

}  // namespace evenep::testing
