// evenep — the command-line tool: plan, demo, bench, quality, pipeline.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "evenep/error.hpp"

int main(int argc, char** argv) {
    CLI::App app{
        "EvenEP: expert-parallel communication with perfect load balance through planned redundant expert copies.\n"
        "Every rank computes exactly the same number of (token, expert) entries whatever the routing."};
    app.require_subcommand(1);
    evenep::cli::register_plan(app);
    evenep::cli::register_quality(app);
    evenep::cli::register_demo(app);
    evenep::cli::register_bench(app);
    evenep::cli::register_launch(app);
    evenep::cli::register_pipeline(app);
    evenep::cli::register_bench_multi(*app.get_subcommand("bench"));
    evenep::cli::register_bench_gemm(*app.get_subcommand("bench"));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    } catch (const evenep::Error& e) {
        std::fprintf(stderr, "evenep: error: %s\n", e.what());
        return e.kind() == evenep::ErrorKind::kInvalidArgument ? 2 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "evenep: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
