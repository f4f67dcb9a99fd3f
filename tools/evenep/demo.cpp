// placeholder: filled in by its owner
#include "commands.hpp"
namespace evenep::cli {
void register_demo(CLI::App& app) { app.add_subcommand("demo", "(not implemented yet)"); }
}  // namespace evenep::cli
