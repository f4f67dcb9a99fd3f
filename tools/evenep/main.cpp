// evenep — the command-line tool: plan, demo, bench, quality, launch, simulate, pipeline, slack, workloads.
//
// Exit codes: 0 success, 1 a failed check or a runtime failure, 2 bad input (flags, files, a run that would not
// fit the machine, an output that cannot be written, standard output included). Every error is one line on stderr
// starting with "evenep: error: ". A run ended by a signal dies by that signal: 130 in a shell for Ctrl-C (SIGINT),
// 143 for SIGTERM, 141 for SIGPIPE (the reader of standard output went away, e.g. `evenep plan | head -1`); an
// interrupted run first removes its temporary output files and says so in one line.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.hpp"
#include "evenep/error.hpp"
#include "evenep/files.hpp"

namespace {

// One line: newlines and other control characters become spaces, so every error is exactly one line.
std::string one_line(std::string s) {
    for (char& c : s)
        if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    return s;
}

int fail(const std::string& what, int code) {
    std::fprintf(stderr, "evenep: error: %s\n", one_line(what).c_str());
    return code;
}

// The subcommand path of argv ("bench plan") and, when a word where a subcommand is expected names none, that
// word. CLI11 would report it as an unexpected extra argument without saying that a command was meant.
std::string unknown_command(CLI::App& app, int argc, char** argv, std::string* path) {
    CLI::App* cur = &app;
    for (int i = 1; i < argc; ++i) {
        const std::string word = argv[i];
        if (word.empty() || word[0] == '-') return {};
        if (cur->get_subcommands({}).empty()) return {};
        CLI::App* next = nullptr;
        for (CLI::App* sub : cur->get_subcommands({}))
            if (sub->check_name(word)) next = sub;
        if (next == nullptr) {
            std::string names;
            for (CLI::App* sub : cur->get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
            return "unknown command '" + word + "'" + (path->empty() ? "" : " for 'evenep " + *path + "'") +
                   " (expected one of: " + names + ")";
        }
        *path += (path->empty() ? "" : " ") + word;
        cur = next;
    }
    return {};
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "EvenEP: expert-parallel communication with perfect load balance through planned redundant expert copies.\n"
        "Every rank computes exactly the same number of (token, expert) entries whatever the routing.\n"
        "Exit codes: 0 success, 1 a failed check, 2 bad input (an output that cannot be written, standard output\n"
        "included); errors are one line 'evenep: error: ...'. Outputs are written whole or not at all: the old file\n"
        "stays on any error. Ctrl-C exits 130, SIGTERM 143, and 141 (SIGPIPE) when the reader of stdout went away."};
    app.require_subcommand(1);
    evenep::cli::register_plan(app);
    evenep::cli::register_quality(app);
    evenep::cli::register_demo(app);
    evenep::cli::register_bench(app);
    evenep::cli::register_launch(app);
    evenep::cli::register_simulate(app);
    evenep::cli::register_pipeline(app);
    evenep::cli::register_slack(app);
    evenep::cli::register_workloads(app);
    evenep::cli::register_bench_multi(*app.get_subcommand("bench"));
    evenep::cli::register_bench_gemm(*app.get_subcommand("bench"));
    evenep::cli::register_bench_layer(*app.get_subcommand("bench"));
    // Outputs go to temporaries renamed into place at the end; an interrupt removes them (evenep/files.hpp). A closed
    // pipe on stdout ends the run by SIGPIPE even when the parent ignored it, so `| head` behaves the same everywhere.
    evenep::install_interrupt_cleanup();
    std::signal(SIGPIPE, SIG_DFL);
    std::string path;
    const std::string unknown = unknown_command(app, argc, argv, &path);
    if (!unknown.empty()) return fail(unknown, 2);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return fail(std::string(e.what()) + " (see 'evenep " + (path.empty() ? "" : path + " ") + "--help')", 2);
    } catch (const evenep::Error& e) {
        return fail(e.what(), e.kind() == evenep::ErrorKind::kInvalidArgument ? 2 : 1);
    } catch (const std::bad_alloc&) {
        // The estimates (--max-memory) should refuse such a run up front; this is the backstop.
        return fail(
            "out of memory (std::bad_alloc): the sizes given need more memory than this machine has; lower "
            "them",
            2);
    } catch (const std::exception& e) {
        return fail(e.what(), 1);
    }
    // Output printed but never delivered (a full disk behind `> file`, /dev/full) is a failed run, not a success.
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        return fail(std::string("writing to standard output failed: ") +
                        (errno != 0 ? std::strerror(errno) : "an earlier write failed"),
                    2);
    return 0;
}
