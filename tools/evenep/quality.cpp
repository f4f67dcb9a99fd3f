// placeholder: filled in by its owner
#include "commands.hpp"
namespace evenep::cli {
void register_quality(CLI::App& app) { app.add_subcommand("quality", "(not implemented yet)"); }
}  // namespace evenep::cli
