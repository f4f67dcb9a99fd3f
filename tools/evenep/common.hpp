// tools/evenep/common.hpp — helpers shared by the CLI subcommands: checked option values, outputs opened before
// the run, resource estimates, routing options, bars, timing.
//
// Every numeric and path flag of every subcommand is added through the add_* functions below, so one set of
// rules holds everywhere: no empty values, integers in decimal only (a leading zero is still decimal, never
// octal or hex), stated ranges, no NaN/inf, input files must be regular files (a named pipe is refused before it
// is opened), output targets are opened before the run and checked when closed. A violation is a CLI11
// ValidationError ("--H: value '-1' is outside [1, 262144]") that main prints as one line with exit code 2.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "evenep/config.hpp"
#include "estimate.hpp"
#include "evenep/routing.hpp"

namespace evenep::cli {

// Limits shared by the subcommands that take them.
inline constexpr int kMaxRanks = 1 << 16;
inline constexpr int kMaxExperts = 1 << 20;
// H and H' up to 2^18 keep every byte count of a step (copies x 3*H*H' x 4 bytes, summed) inside int64.
inline constexpr int kMaxHidden = 1 << 18;
inline constexpr int kMaxTokenPad = 1 << 30;

// --- checked option values ---------------------------------------------------------------------------------------

// An int option in [lo, hi], decimal only.
CLI::Option* add_int(CLI::App& cmd, const std::string& name, int& value, const std::string& help, int lo, int hi);
// A uint64 option (seeds), decimal only, no sign.
CLI::Option* add_u64(CLI::App& cmd, const std::string& name, uint64_t& value, const std::string& help);
// A finite real option in [lo, hi]; the vector form checks every entry.
CLI::Option* add_real(
    CLI::App& cmd, const std::string& name, double& value, const std::string& help, double lo, double hi);
CLI::Option* add_reals(
    CLI::App& cmd, const std::string& name, std::vector<double>& values, const std::string& help, double lo, double hi);
// A path read by the command: it must exist and be a regular file.
CLI::Option* add_input_file(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help);
// A file written by the command: refused when it is a directory, a socket, a block device or a named pipe without
// a reader (opening that would block); regular files and character devices (/dev/null) are accepted.
CLI::Option* add_output_file(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help);
// A directory written by the command (created when missing; checked before the run by OutputDir below).
CLI::Option* add_output_dir(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help);
// A non-empty string (e.g. a name checked elsewhere).
CLI::Option* add_string(CLI::App& cmd, const std::string& name, std::string& value, const std::string& help);

// An output file opened (created, truncated) when constructed, i.e. before the run, so a bad target fails in
// seconds; close() writes nothing more but checks that every write and the close succeeded (a full disk or
// /dev/full is an error, not a silently lost file). Errors name the flag and the path (exit code 2).
class OutputFile {
  public:
    OutputFile() = default;  // inactive: write/close do nothing
    OutputFile(std::string flag, std::string path);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    bool active() const { return fd_ >= 0; }
    const std::string& path() const { return path_; }
    void write(std::string_view text);
    void close();

  private:
    [[noreturn]] void fail(const char* what, int err);
    std::string flag_, path_;
    int fd_ = -1;
};

// Creates `dir` (with parents) and checks it is a writable directory; the flag is named in the error.
void prepare_output_dir(const std::string& flag, const std::string& dir);

// --- routing input -----------------------------------------------------------------------------------------------

// Where the routing of a command comes from: a generated config, a tpe JSON file or a routing .npy file.
struct RoutingOptions {
    int R = 8, E = 384, K = 8, S = 8192;
    int B = -1, tp = 128;
    double slack = 0;  // imbalance budget ε (Config::slack)
    double maxvio = 1.0;
    double sigma = 0;         // used when --sigma is given
    std::string adversarial;  // one of to_string(Adversarial) names
    uint64_t seed = 1;
    std::string tpe_file;      // --tpe FILE.json
    std::string routing_file;  // --routing FILE.npy
    std::string planner = "optimized";
    ResourceLimits limits;
    // Which flags were given (set by add_to).
    CLI::Option* opt_E = nullptr;
    CLI::Option* opt_sigma = nullptr;
    CLI::Option* opt_maxvio = nullptr;

    // Adds --R --E --K --S --B --tp --slack --maxvio --sigma --adversarial --seed --tpe --routing --planner
    // --max-memory --max-time, with the conflicts between them (--tpe and --routing exclude the generator flags).
    void add_to(CLI::App& cmd);
    bool sigma_given() const { return opt_sigma != nullptr && opt_sigma->count() > 0; }
};

// The resolved input: the configuration, per-rank s and histograms, and the routing when known.
struct RoutingInput {
    Config cfg;
    PlannerMode mode = PlannerMode::kOptimized;
    std::vector<int32_t> s;          // [R]
    std::vector<int32_t> tpe;        // [R*E]
    std::optional<Routing> routing;  // absent with --tpe
    std::string description;         // e.g. "lognormal sigma=0.81 (target maxvio 1), seed 1"
    double sigma_used = -1;
};

// The estimate of a command's run past its input, from the configuration (`has_routing`: every token's expert
// ids are known, not only the histograms of --tpe).
using RunEstimate = std::function<Estimate(const Config& cfg, bool has_routing)>;

// Builds the input; throws evenep::Error (exit 2) naming the bad flag or file content. The run's estimate (the
// generator's routing and time, the histograms, and `run_estimate`) is checked against opt.limits under the name
// `command` before anything of its size is allocated: before the routing is drawn, and right after a --routing
// or --tpe file is read (a --routing file's size is checked before it is read). A target maxvio that no lognormal
// sigma in [1e-5, 10] reaches is refused with the reachable range.
RoutingInput resolve_routing(const RoutingOptions& opt, std::string_view command, const RunEstimate& run_estimate);

// Throws Error(kInvalidArgument) "<command>: no CUDA device is usable (...)" when this build has no CUDA backend
// or no device is usable: the first line of every GPU command, as `demo --backend cuda` does.
void require_cuda_device(std::string_view command);


// Lognormal routing with maxvio close to `target` at the full size: sigma is bisected (make_target_maxvio) on a smaller
// token count with the same popularity vector, keeping ~512K entries, then the routing is drawn once at full size
// (its achieved maxvio differs from the probe's by sampling noise). `sigma_out`, if given, receives sigma, so that
// make_lognormal(spec, sigma) (or `evenep plan --sigma`) reproduces the routing.
Routing routing_near_maxvio(const RoutingSpec& spec, double target, double* sigma_out = nullptr);
// A horizontal bar of `width` cells for value/max with eighth-block resolution.
std::string bar(double value, double max_value, int width);
// Human-readable bytes (KiB, MiB, GiB).
std::string human_bytes(double bytes);
// Monotonic seconds.
double now_seconds();
// Median of a copy of v (0 when empty).
double median(std::vector<double> v);

}  // namespace evenep::cli
