// evenep — the command-line tool: plan, demo, bench, quality, launch, simulate, pipeline, slack, workloads.
//
// Exit codes: 0 success, 1 a failed check or a runtime failure, 2 bad input (flags, files, a run that would not
// fit the machine). Every error is one line on stderr starting with "evenep: error: ".
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "evenep/error.hpp"

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
        "Exit codes: 0 success, 1 a failed check, 2 bad input; errors are one line 'evenep: error: ...'."};
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
    return 0;
}
