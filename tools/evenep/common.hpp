// tools/evenep/common.hpp — helpers shared by the CLI subcommands: checked option values, outputs checked before
// the run and written atomically after it, resource estimates, routing options, bars, timing.
//
// Every numeric and path flag of every subcommand is added through the add_* functions below, so one set of
// rules holds everywhere: no empty values, integers in decimal only (a leading zero is still decimal, never
// octal or hex; no sign where negative values mean nothing, seeds included), stated ranges, no NaN/inf, input files
// must be regular files within a size limit (a named pipe is refused before it is opened), output targets are
// checked before the run and written atomically at its end (evenep/files.hpp). A violation is a CLI11
// ValidationError ("--H: value '-1' is outside [1, 262144]") that main prints as one line with exit code 2.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "evenep/config.hpp"
#include "evenep/files.hpp"
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
// An int list option, every entry in [lo, hi], decimal only.
CLI::Option* add_ints(
    CLI::App& cmd, const std::string& name, std::vector<int>& values, const std::string& help, int lo, int hi);
// A uint64 option (seeds), decimal only, no sign.
CLI::Option* add_u64(CLI::App& cmd, const std::string& name, uint64_t& value, const std::string& help);
// A finite real option in [lo, hi]; the vector form checks every entry.
CLI::Option* add_real(
    CLI::App& cmd, const std::string& name, double& value, const std::string& help, double lo, double hi);
CLI::Option* add_reals(
    CLI::App& cmd, const std::string& name, std::vector<double>& values, const std::string& help, double lo, double hi);
// A path read by the command: checked at parse time by evenep::check_input_file (a readable regular file within
// kMaxInputFileBytes; FIFOs, devices, sockets and directories are refused before anything is opened). The vector
// form checks every entry.
CLI::Option* add_input_file(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help);
CLI::Option* add_input_files(
    CLI::App& cmd, const std::string& name, std::vector<std::string>& paths, const std::string& help);
// A file written by the command: checked at parse time by evenep::check_output_file (its directory exists and is
// writable; a directory, FIFO, socket or block device is refused; /dev/null and other character devices are
// written in place). Nothing is created until the command writes through OutputFile at the end.
CLI::Option* add_output_file(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help);
// A folder written by the command (--dump): checked by OutputDir when the command starts, created at the end.
CLI::Option* add_output_dir(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help);
// A non-empty string (e.g. a name checked elsewhere).
CLI::Option* add_string(CLI::App& cmd, const std::string& name, std::string& value, const std::string& help);

// Sets `run` as the subcommand's callback, preceded by the checks that need every option: no output may name the
// same file as an input or another output of the command (evenep::check_distinct_files over every option added by
// add_input_file(s) / add_output_file / add_output_dir). Every subcommand registers its callback through this.
void set_run(CLI::App* cmd, std::function<void()> run);

// An output file of a subcommand: inactive without a path (write/close do nothing), else an evenep::AtomicFile.
// Constructing it checks the target and opens nothing. write() goes to a temporary file beside the target, and
// close() publishes it whole. If the run throws before close(), or is interrupted (main installs
// evenep::install_interrupt_cleanup), the temporary is removed and the old file stays as it was. Errors name the flag
// and the path (exit code 2).
class OutputFile {
  public:
    OutputFile() = default;
    OutputFile(std::string flag, std::string path);

    bool active() const { return file_.has_value(); }
    const std::string& path() const { return path_; }
    void write(std::string_view text);
    void close();

  private:
    std::string path_;
    std::optional<AtomicFile> file_;
};

// A folder of output files (--dump, --npy-dir): inactive without a path, else an evenep::AtomicDir. file(name) is
// where to write `name`; close() publishes the folder.
class OutputDir {
  public:
    OutputDir() = default;
    OutputDir(std::string flag, std::string path);

    bool active() const { return dir_ != nullptr; }
    std::string file(const std::string& name) { return dir_->file(name); }
    void close();

  private:
    std::unique_ptr<AtomicDir> dir_;
};

// --- routing input -----------------------------------------------------------------------------------------------

// Where the routing of a command comes from: a generated config, a tpe JSON file or a routing .npy file.
struct RoutingOptions {
    int R = 8, E = 384, K = 8, S = 8192;
    int B = -1, tp = 128;
    double slack = 0;  // imbalance budget ε (Config::slack)
    std::string policy;  // --policy auto|exact|slack (empty: not given; apply_policy)
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
    CLI::Option* opt_slack = nullptr;

    // Adds --R --E --K --S --B --tp --slack --maxvio --sigma --adversarial --seed --tpe --routing --planner
    // --max-memory --max-time, with the conflicts between them (--tpe and --routing exclude the generator flags).
    void add_to(CLI::App& cmd);
    bool sigma_given() const { return opt_sigma != nullptr && opt_sigma->count() > 0; }
};

// --policy auto|exact|slack beside --slack (docs/auto.md): adds the option to `cmd`.
CLI::Option* add_policy_option(CLI::App& cmd, std::string& policy);
// The planner policy and budget of --policy `policy` and --slack `slack` (slack_given: --slack was on the command
// line): not given = the fixed budget --slack (today's rule); exact = budget 0 (refuses --slack > 0); slack = the
// fixed budget --slack (refuses a zero budget); auto = kAuto with the largest budget --slack, kAutoDefaultSlack
// without --slack. Throws evenep::Error naming the flags.
PlannerPolicy apply_policy(const std::string& policy, bool slack_given, double& slack);

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
// Refuses a target maxvio that lognormal routing of `spec`'s shape cannot reach, the same way in every subcommand
// that takes --maxvio (plan, demo, slack, simulate, bench plan, bench layer), for targets the user gave (a default
// target is drawn as close as the shape allows, and plan and demo say so): above E/K - 1 (every token picks K distinct experts), or outside
// the range the sigma bracket [1e-5, 10] of make_target_maxvio reaches on routing_near_maxvio's probe (2 draws of it).
// The error names `flag`, the value and the reachable range (exit code 2); nothing is clamped. The list form checks
// every target against one pair of draws.
void check_maxvio_reachable(const RoutingSpec& spec, const std::vector<double>& targets,
                            std::string_view flag = "--maxvio");
// A horizontal bar of `width` cells for value/max with eighth-block resolution.
std::string bar(double value, double max_value, int width);
// Human-readable bytes (KiB, MiB, GiB).
std::string human_bytes(double bytes);
// Monotonic seconds.
double now_seconds();
// Median of a copy of v (0 when empty).
double median(std::vector<double> v);

}  // namespace evenep::cli
