#include "common.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "demo_cuda.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"

namespace evenep::cli {
namespace {

// --- value checks (CLI11 validators: an empty return means the value is fine) ---

// A value as it appears in a message: quoted, control bytes escaped, long values cut.
std::string quote_value(std::string_view v) {
    std::string out = "'";
    for (size_t i = 0; i < v.size() && i < 64; ++i) {
        const unsigned char c = static_cast<unsigned char>(v[i]);
        out += (c < 0x20 || c >= 0x7f) ? fmt::format("\\x{:02x}", c) : std::string(1, static_cast<char>(c));
    }
    return out + (v.size() > 64 ? "...'" : "'");
}

// Reads a decimal integer (optional '-' when `allow_sign`, leading zeros read as decimal) into *out; the error
// text when it is not one or lies outside [lo, hi]. Rewrites `s` to its canonical form, so CLI11's own
// conversion (which would read "0100" as octal) sees plain decimal.
template <typename T>
std::string check_integer(std::string& s, T lo, T hi) {
    const std::string range = fmt::format("[{}, {}]", lo, hi);
    if (s.empty()) return fmt::format("empty value; expected a decimal integer in {}", range);
    const bool negative = s[0] == '-';
    const std::string_view digits = std::string_view(s).substr(negative ? 1 : 0);
    const bool all_digits =
        !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!all_digits) return fmt::format("value {} is not a decimal integer in {}", quote_value(s), range);
    uint64_t magnitude = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
    bool in_range = ec == std::errc() && ptr == digits.data() + digits.size();
    if (in_range && negative && magnitude != 0) {
        if constexpr (std::is_unsigned_v<T>) {
            in_range = false;
        } else {
            in_range = magnitude <= (uint64_t{1} << 63) && -static_cast<int64_t>(magnitude - 1) - 1 >= lo;
        }
    } else if (in_range) {
        in_range = magnitude <= static_cast<uint64_t>(hi) && (lo <= 0 || magnitude >= static_cast<uint64_t>(lo));
    }
    if (!in_range) return fmt::format("value {} is outside {}", quote_value(s), range);
    s = negative && magnitude != 0 ? "-" + std::to_string(magnitude) : std::to_string(magnitude);
    return {};
}

// "[lo, hi]", or "[lo, inf)" when only finite values bound it above.
std::string real_range(double lo, double hi) {
    return std::isinf(hi) ? fmt::format("[{:g}, inf)", lo) : fmt::format("[{:g}, {:g}]", lo, hi);
}

std::string check_real(const std::string& s, double lo, double hi) {
    const std::string range = real_range(lo, hi);
    if (s.empty()) return fmt::format("empty value; expected a number in {}", range);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || std::isspace(static_cast<unsigned char>(s[0])))
        return fmt::format("value {} is not a number", quote_value(s));
    if (!std::isfinite(v) || errno == ERANGE) return fmt::format("value {} is not a finite number", quote_value(s));
    if (v < lo || v > hi) return fmt::format("value {} is outside {}", quote_value(s), range);
    return {};
}

// The library's check of a path as a CLI11 validator: "" when fine, else the message without its leading flag
// name (CLI11 puts "--flag: " in front).
template <typename F>
std::string message_of(const std::string& flag, F&& check) {
    try {
        check();
    } catch (const Error& e) {
        const std::string what = e.what();
        for (const std::string& prefix : {flag + ": ", flag + " "})
            if (what.rfind(prefix, 0) == 0) return what.substr(prefix.size());
        return what;
    }
    return {};
}

// Which subcommand options are paths, and whether the command writes them (see set_run).
struct FileOption {
    const CLI::App* cmd;
    const CLI::Option* opt;
    bool output;
};
std::vector<FileOption>& file_options() {
    static std::vector<FileOption> options;
    return options;
}

CLI::Option* remember(CLI::App& cmd, CLI::Option* o, bool output) {
    file_options().push_back({&cmd, o, output});
    return o;
}

CLI::Option* with_check(CLI::Option* o, std::function<std::string(std::string&)> f, const std::string& desc) {
    o->transform(CLI::Validator(std::move(f), desc));
    return o;
}

}  // namespace

CLI::Option* add_int(CLI::App& cmd, const std::string& name, int& value, const std::string& help, int lo, int hi) {
    return with_check(
        cmd.add_option(name, value, help)->capture_default_str(),
        [lo, hi](std::string& s) { return check_integer<int64_t>(s, lo, hi); }, fmt::format("[{}, {}]", lo, hi));
}

CLI::Option* add_ints(
    CLI::App& cmd, const std::string& name, std::vector<int>& values, const std::string& help, int lo, int hi) {
    return with_check(
        cmd.add_option(name, values, help)->capture_default_str(),
        [lo, hi](std::string& s) { return check_integer<int64_t>(s, lo, hi); }, fmt::format("[{}, {}]", lo, hi));
}

CLI::Option* add_u64(CLI::App& cmd, const std::string& name, uint64_t& value, const std::string& help) {
    return with_check(
        cmd.add_option(name, value, help)->capture_default_str(),
        [](std::string& s) { return check_integer<uint64_t>(s, 0, std::numeric_limits<uint64_t>::max()); }, "decimal");
}

CLI::Option* add_real(
    CLI::App& cmd, const std::string& name, double& value, const std::string& help, double lo, double hi) {
    return with_check(
        cmd.add_option(name, value, help), [lo, hi](std::string& s) { return check_real(s, lo, hi); },
        real_range(lo, hi));
}

CLI::Option* add_reals(CLI::App& cmd,
                       const std::string& name,
                       std::vector<double>& values,
                       const std::string& help,
                       double lo,
                       double hi) {
    return with_check(
        cmd.add_option(name, values, help)->capture_default_str(),
        [lo, hi](std::string& s) { return check_real(s, lo, hi); }, real_range(lo, hi));
}

CLI::Option* add_input_file(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help) {
    return remember(cmd,
                    with_check(
                        cmd.add_option(name, path, help),
                        [name](std::string& p) { return message_of(name, [&] { check_input_file(p, name); }); }, "FILE"),
                    false);
}

CLI::Option* add_input_files(
    CLI::App& cmd, const std::string& name, std::vector<std::string>& paths, const std::string& help) {
    return remember(cmd,
                    with_check(
                        cmd.add_option(name, paths, help),
                        [name](std::string& p) { return message_of(name, [&] { check_input_file(p, name); }); }, "FILE"),
                    false);
}

CLI::Option* add_output_file(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help) {
    return remember(cmd,
                    with_check(
                        cmd.add_option(name, path, help),
                        [name](std::string& p) { return message_of(name, [&] { check_output_file(p, name); }); }, "FILE"),
                    true);
}

CLI::Option* add_output_dir(CLI::App& cmd, const std::string& name, std::string& path, const std::string& help) {
    return remember(cmd,
                    with_check(
                        cmd.add_option(name, path, help),
                        [name](std::string& p) { return message_of(name, [&] { AtomicDir(p, name); }); }, "DIR"),
                    true);
}

CLI::Option* add_string(CLI::App& cmd, const std::string& name, std::string& value, const std::string& help) {
    return with_check(
        cmd.add_option(name, value, help),
        [](std::string& s) { return s.empty() ? std::string("empty value") : std::string(); }, "");
}

void set_run(CLI::App* cmd, std::function<void()> run) {
    cmd->callback([cmd, run = std::move(run)] {
        std::vector<FileUse> files;
        for (const FileOption& f : file_options()) {
            if (f.cmd != cmd) continue;
            for (const std::string& path : f.opt->results()) files.push_back({f.opt->get_name(), path, f.output});
        }
        check_distinct_files(files);
        run();
    });
}

// --- outputs ---

OutputFile::OutputFile(std::string flag, std::string path) : path_(std::move(path)) {
    if (!path_.empty()) file_.emplace(path_, std::move(flag));
}

void OutputFile::write(std::string_view text) {
    if (file_) file_->write(text);
}

void OutputFile::close() {
    if (file_) file_->commit();
}

OutputDir::OutputDir(std::string flag, std::string path) {
    if (!path.empty()) dir_ = std::make_unique<AtomicDir>(std::move(path), std::move(flag));
}

void OutputDir::close() {
    if (dir_) dir_->commit();
}

// --- routing input ---

namespace {

void add_generation_estimate(const RoutingOptions& opt, Estimate& e) {
    if (!opt.adversarial.empty()) {
        // The adversarial kinds build the routing in one pass (kMasked, kUnequalS: one lognormal draw first).
        add_lognormal_estimate(opt.R, opt.E, opt.K, opt.S, 1, e);
        return;
    }
    add_lognormal_estimate(opt.R, opt.E, opt.K, opt.S,
                           opt.sigma_given() ? 1 : target_maxvio_draws(opt.R, opt.E, opt.K, opt.S, opt.maxvio), e);
}

// The resolved input every command holds: the per-rank histograms tpe [R*E] int32.
void add_input_estimate(const Config& c, Estimate& e) {
    const double pairs = static_cast<double>(c.R) * c.E;
    e.add_bytes(4 * pairs, fmt::format("histograms of R*E = {:.3g} (rank, expert) pairs", pairs));
}

// Refuses a target maxvio the lognormal family cannot reach (judged from the routings at the two ends of the
// sigma bracket [1e-5, 10] of make_target_maxvio) when the user gave it; returns a note for the description when
// it is the default target ("" when reached).
std::string check_maxvio_reached(const RoutingSpec& spec, double target, const Routing& got, bool given) {
    const double tol = std::max(0.02 * target, 0.005);  // make_target_maxvio's tolerance
    if (std::abs(got.maxvio() - target) <= tol) return {};
    const double lo = make_lognormal(spec, 1e-5).maxvio(), hi = make_lognormal(spec, 10).maxvio();
    if (target >= lo - tol && target <= hi + tol) return {};
    if (!given)
        return fmt::format("; default target maxvio {:g} not reachable here (range [{:.3g}, {:.3g}]), closest used",
                           target, lo, hi);
    EVENEP_CHECK(false, "--maxvio = ", target, " is not reachable for R=", spec.R, " E=", spec.E, " K=", spec.K,
                 " S=", spec.S, " seed ", spec.seed, ": lognormal routing reaches maxvio in [",
                 fmt::format("{:.3g}, {:.3g}", lo, hi),
                 "] (sigma in [1e-5, 10]); give a target in that range or --sigma");
    return {};
}

}  // namespace

void RoutingOptions::add_to(CLI::App& cmd) {
    CLI::Option* o_R = add_int(cmd, "--R", R, "EP group size (ranks)", 1, kMaxRanks);
    opt_E = add_int(cmd, "--E", E, "routed experts in the group (E % R == 0)", 1, kMaxExperts);
    CLI::Option* o_K = add_int(cmd, "--K", K, "top-k experts per token", 1, 32);
    CLI::Option* o_S = add_int(cmd, "--S", S, "token capacity per rank (every rank passes S tokens)", 1,
                               std::numeric_limits<int>::max());
    add_int(cmd, "--B", B, "prefetch slots per rank (-1 = epn; < epn only for inference)", -1, kMaxExperts);
    add_int(cmd, "--tp", tp, "token padding of every non-empty expert segment", 1, kMaxTokenPad);
    opt_slack = add_real(cmd, "--slack", slack,
                         "imbalance budget eps: a rank may compute up to ceil((1+eps)*q_r) entries when that saves "
                         "copies (0 = exact balance; docs/slack.md); with --policy auto the largest budget",
                         0, 1)
                    ->capture_default_str();
    add_policy_option(cmd, policy);
    CLI::Option* o_maxvio = opt_maxvio =
        add_real(cmd, "--maxvio", maxvio,
                 "generate lognormal routing with this max violation (max/mean - 1); refused when unreachable", 0,
                 std::numeric_limits<double>::infinity())
            ->capture_default_str();
    opt_sigma = add_real(cmd, "--sigma", sigma,
                         "generate lognormal routing with this popularity sigma instead of --maxvio", 0, 1000);
    std::vector<std::string> names;
    for (Adversarial a : all_adversarial()) names.push_back(to_string(a));
    CLI::Option* o_adv =
        add_string(cmd, "--adversarial", adversarial, "generate an adversarial routing")->check(CLI::IsMember(names));
    CLI::Option* o_seed = add_u64(cmd, "--seed", seed, "seed of the routing generator (and of demo's data)");
    CLI::Option* o_tpe = add_input_file(cmd, "--tpe", tpe_file,
                                        "read histograms from a JSON file {R,E,K,S,s,tpe} instead of generating");
    CLI::Option* o_routing = add_input_file(cmd, "--routing", routing_file,
                                            "read topk_idx from an int32 [R,S,K] .npy (-1 = masked); needs --E");
    add_string(cmd, "--planner", planner, "planner mode")
        ->check(CLI::IsMember({"reference", "optimized"}))
        ->capture_default_str();
    limits.add_to(cmd);
    o_maxvio->excludes(opt_sigma);
    o_adv->excludes(o_maxvio)->excludes(opt_sigma);
    for (CLI::Option* gen : {o_R, opt_E, o_K, o_S, o_maxvio, opt_sigma, o_adv, o_seed, o_routing}) o_tpe->excludes(gen);
    for (CLI::Option* gen : {o_R, o_K, o_S, o_maxvio, opt_sigma, o_adv}) o_routing->excludes(gen);
}

CLI::Option* add_policy_option(CLI::App& cmd, std::string& policy) {
    return add_string(cmd, "--policy", policy,
                      fmt::format("planner policy: exact, slack (budget --slack) or auto (per step in [0, --slack], "
                                  "--slack default {:g}; docs/auto.md); default: slack if --slack > 0, else exact",
                                  kAutoDefaultSlack))
        ->check(CLI::IsMember({"auto", "exact", "slack"}));
}

PlannerPolicy apply_policy(const std::string& policy, bool slack_given, double& slack) {
    Config c;
    apply_planner_policy(c, policy, slack_given ? slack : -1.0, "--policy", "--slack");
    slack = c.slack;
    return c.policy;
}

RoutingInput resolve_routing(const RoutingOptions& opt_in, std::string_view command, const RunEstimate& run_estimate) {
    RoutingInput in;
    RoutingOptions opt = opt_in;
    const PlannerPolicy policy =
        apply_policy(opt.policy, opt.opt_slack != nullptr && opt.opt_slack->count() > 0, opt.slack);
    // The configuration of a shape with the flags' slots, budget and policy.
    const auto config_of = [&](int R, int E, int K, int S) {
        return Config{.R = R, .E = E, .K = K, .S = S, .B = opt.B, .tp = opt.tp, .slack = opt.slack, .policy = policy};
    };
    in.mode = parse_planner_mode(opt.planner);
    EVENEP_CHECK(opt.tpe_file.empty() || opt.routing_file.empty(), "--tpe and --routing are mutually exclusive");
    if (!opt.tpe_file.empty()) {
        TpeFile f = read_tpe_json(opt.tpe_file);
        in.cfg = config_of(f.R, f.E, f.K, f.S);
        in.cfg.validate();
        Estimate e;
        add_input_estimate(in.cfg, e);
        e.add(run_estimate(in.cfg, false));
        check_estimate(command, e, opt.limits);
        in.s = f.s;
        in.tpe = f.tpe;
        in.description = fmt::format("histograms from {}", opt.tpe_file);
        return in;
    }
    Routing routing;
    if (!opt.routing_file.empty()) {
        EVENEP_CHECK(opt.opt_E == nullptr || opt.opt_E->count() > 0, "--routing '", opt.routing_file,
                     "' needs --E: a routing file holds expert ids, not the number of experts");
        std::error_code ec;
        const double file_bytes = static_cast<double>(std::filesystem::file_size(opt.routing_file, ec));
        Estimate e;
        e.add_bytes(3 * file_bytes, fmt::format("reading '{}' ({})", opt.routing_file, human_bytes(file_bytes)));
        check_estimate("--routing", e, opt.limits);
        routing = read_routing_npy(opt.routing_file, opt.E);
        in.description = fmt::format("routing from {}", opt.routing_file);
        const Config cfg = config_of(routing.R, routing.E, routing.K, routing.S);
        cfg.validate();
        Estimate run;
        run.add_bytes(file_bytes, fmt::format("the routing of '{}'", opt.routing_file));
        add_input_estimate(cfg, run);
        run.add(run_estimate(cfg, true));
        check_estimate(command, run, opt.limits);
    } else {
        const Config probe = config_of(opt.R, opt.E, opt.K, opt.S);
        probe.validate();
        // The whole run's estimate, checked before the routing is drawn.
        Estimate e;
        add_generation_estimate(opt, e);
        add_input_estimate(probe, e);
        e.add(run_estimate(probe, true));
        check_estimate(command, e, opt.limits);
        RoutingSpec spec{.R = opt.R, .E = opt.E, .K = opt.K, .S = opt.S, .seed = opt.seed};
        if (!opt.adversarial.empty()) {
            Adversarial kind = Adversarial::kSingleHotExpert;
            for (Adversarial a : all_adversarial())
                if (to_string(a) == opt.adversarial) kind = a;
            routing = make_adversarial(spec, kind);
            in.description = fmt::format("adversarial '{}', seed {}", opt.adversarial, opt.seed);
        } else if (opt.sigma_given()) {
            routing = make_lognormal(spec, opt.sigma);
            in.sigma_used = opt.sigma;
            in.description = fmt::format("lognormal sigma={:.4g}, seed {}", opt.sigma, opt.seed);
        } else {
            // The rule of every subcommand (a given target must be reachable); the default target gets a note instead.
            const bool given = opt.opt_maxvio == nullptr || opt.opt_maxvio->count() > 0;
            if (given) check_maxvio_reachable(spec, {opt.maxvio});
            routing = make_target_maxvio(spec, opt.maxvio, &in.sigma_used);
            const std::string note = check_maxvio_reached(spec, opt.maxvio, routing, given);
            in.description = fmt::format("lognormal sigma={:.4g} (target maxvio {:g}), seed {}{}", in.sigma_used,
                                         opt.maxvio, opt.seed, note);
        }
    }
    in.cfg = config_of(routing.R, routing.E, routing.K, routing.S);
    in.cfg.validate();
    in.s = routing.s;
    in.tpe = routing.tpe();
    in.routing = std::move(routing);
    return in;
}

void require_cuda_device(std::string_view command) {
    std::string why;
    EVENEP_CHECK(demo_cuda_available(&why), command, ": ", why);
}

namespace {

// The smaller draw routing_near_maxvio bisects sigma on (~512K entries, the full popularity vector).
RoutingSpec probe_of(const RoutingSpec& spec) {
    RoutingSpec probe = spec;
    probe.S = std::min(spec.S, std::max(64, 65536 / std::max(1, spec.R * spec.K) * 8));
    return probe;
}

}  // namespace

void check_maxvio_reachable(const RoutingSpec& spec, const std::vector<double>& targets, std::string_view flag) {
    const auto tolerance = [](double target) { return std::max(0.02 * target, 0.005); };  // make_target_maxvio's
    const double max_reachable = static_cast<double>(spec.E) / spec.K - 1;
    for (double target : targets)
        EVENEP_CHECK(target <= max_reachable + tolerance(target), flag, " = ", target, " is not reachable: with E=",
                     spec.E, " and K=", spec.K, " no routing exceeds maxvio E/K - 1 = ", max_reachable,
                     " (every token picks K distinct experts)");
    if (targets.empty()) return;
    const RoutingSpec probe = probe_of(spec);
    const double lo = make_lognormal(probe, 1e-5).maxvio(), hi = make_lognormal(probe, 10).maxvio();
    for (double target : targets)
        EVENEP_CHECK(target >= lo - tolerance(target) && target <= hi + tolerance(target), flag, " = ", target,
                     " is not reachable for R=", spec.R, " E=", spec.E, " K=", spec.K, " S=", spec.S, " seed ",
                     spec.seed, ": lognormal routing reaches maxvio in [", fmt::format("{:.3g}, {:.3g}", lo, hi),
                     "] (sigma in [1e-5, 10]); give a target in that range");
}

Routing routing_near_maxvio(const RoutingSpec& spec, double target, double* sigma_out) {
    const RoutingSpec probe = probe_of(spec);
    double sigma = 0;
    make_target_maxvio(probe, target, &sigma);
    if (sigma_out) *sigma_out = sigma;
    return make_lognormal(spec, sigma);
}

std::string bar(double value, double max_value, int width) {
    static const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
    if (max_value <= 0 || value <= 0) return std::string();
    const double cells = std::min(1.0, value / max_value) * width;
    const int full = static_cast<int>(cells);
    const int frac = static_cast<int>((cells - full) * 8);
    std::string out;
    for (int i = 0; i < full; ++i) out += "█";
    out += kEighths[frac];
    return out;
}

std::string human_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) {
        bytes /= 1024;
        ++u;
    }
    return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace evenep::cli
