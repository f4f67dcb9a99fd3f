// placeholder: filled in by the CUDA backend's owner
#include "commands.hpp"
namespace evenep::cli {
void register_bench_cuda(CLI::App& bench) { (void)bench; }
}  // namespace evenep::cli
