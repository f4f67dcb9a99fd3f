// placeholder: filled in by its owner
#include "commands.hpp"
namespace evenep::cli {
void register_bench(CLI::App& app) { app.add_subcommand("bench", "(not implemented yet)"); }
}  // namespace evenep::cli
