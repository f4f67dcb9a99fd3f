// placeholder: filled in by its owner
#include "commands.hpp"
namespace evenep::cli {
void register_plan(CLI::App& app) { app.add_subcommand("plan", "(not implemented yet)"); }
}  // namespace evenep::cli
