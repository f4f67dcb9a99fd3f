// Issue 35 over the built CLI (EVENEP_CLI_PATH), one table row per probe: argv -> exit code, exactly one stderr
// line "evenep: error: ..." holding a given substring, and every pre-seeded file byte-identical afterwards when the
// run fails (a success row checks what it wrote instead). Each run is started directly (no shell), with a 10 s
// timeout, so a hang (a FIFO opened for reading) fails its row instead of the whole test; after every row the scratch
// folder holds no leftover temporary (".tmp-").
//
// Cases (CliFiles/Probe.Row/<name>):
//   data lost:   *_bad_option_keeps_json for plan, demo, pipeline, quality, slack, simulate and bench plan (a flag
//                refused after parsing leaves the old --json as it was); out_is_tpe, out_is_tpe_dot,
//                out_is_tpe_symlink, out_is_tpe_hardlink, out_is_routing, out_is_images, svg_is_costs,
//                out_is_gpu_json (an output naming an input, however spelt); two_outputs, two_outputs_dot;
//                json_dev_full, json_disk_full (a regular file whose write fails half way: RLIMIT_FSIZE),
//                stdout_dev_full (exit 2), stdout_closed_pipe (141: SIGPIPE, no line),
//                sigint_mid_run, sigterm_mid_run (130/143; the temporary removed, one line naming the path);
//                json_is_dir, dump_is_fifo
//   hangs:       fifo_<flag> for every input flag (plan --tpe/--routing, demo --routing, pipeline --images/--costs,
//                simulate --gpu-json, bench dispatch --routing) and every output flag (--json of every
//                subcommand, pipeline --svg, demo --dump): refused, never opened
//   inputs:      dir_<flag> (a directory given as an input file), dev_tpe, dev_routing (devices), big_tpe,
//                big_routing (a sparse file over the stated size limit), dup_key_tpe, dup_key_costs,
//                dup_key_images, dup_key_gpu_json (a JSON key given twice, named), bad_row_gpu_json (a row of the
//                wrong type: one line, exit 2, not a raw library exception)
//   same rule:   maxvio_unreachable_{plan,slack,simulate,bench_plan} (above E/K - 1) and
//                maxvio_below_{plan,slack,simulate} (below the reachable range): refused alike, never clamped;
//                empty_<flag> for every path flag; seed_negative_<command>; pipeline_vit_load_zero
//   successes:   ok_plan_json (the old file replaced whole), ok_json_dev_null, ok_dump_keeps_other_files (a --dump
//                into an existing folder adds its files and keeps the others), ok_dump_new_nested (parents created)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_testing.hpp"
#include "evenep/exact.hpp"
#include "evenep/io.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;

enum class Stdout { kFile, kDevFull, kClosedPipe };

struct Row {
    Row(std::string n, std::string a, int code, std::string line, std::vector<std::string> k = {},
        Stdout o = Stdout::kFile, int sig = 0, std::map<std::string, std::string> a2 = {})
        : name(std::move(n)), args(std::move(a)), exit_code(code), needle(std::move(line)), kept(std::move(k)),
          out(o), signal(sig), after(std::move(a2)) {}
    std::string name;
    std::string args;     // split on spaces; "{d}" is the scratch folder, "''" an empty argument
    int exit_code = 2;    // 128 + n for death by signal n (as a shell reports it)
    std::string needle;   // in the one stderr line; "" for a success row
    std::vector<std::string> kept;  // files (under {d}) that must be byte-identical afterwards
    Stdout out = Stdout::kFile;
    int signal = 0;                  // sent after signal_after seconds
    std::map<std::string, std::string> after;  // success rows: file -> the prefix it must start with
    long max_file_bytes = 0;  // RLIMIT_FSIZE of the run (a disk that fills up), 0: none
};

// --- the scratch folder: seeded files ---------------------------------------------------------------------------

const char kTpe[] = "{\"R\": 2, \"E\": 4, \"K\": 1, \"S\": 2, \"s\": [2, 2], \"tpe\": [[1, 1, 0, 0], [0, 1, 1, 0]]}\n";
const char kOld[] = "old result, must survive\n";

const fs::path& scratch() {
    static const fs::path d = testing::temp_dir("evenep_cli_files_test", "d");
    return d;
}

// The run's stdout and stderr, outside the scratch folder (which every row empties); per process, as ctest runs the
// rows in parallel.
fs::path io_file(const char* name) {
    static const fs::path d = testing::temp_dir("evenep_cli_files_test", "io");
    return d / name;
}

// Every file a row may name, (re)written before each row: inputs with valid content, outputs with kOld.
void seed() {
    const fs::path& d = scratch();
    for (const auto& e : fs::directory_iterator(d)) fs::remove_all(e.path());
    const auto put = [&](const char* name, const std::string& text) { std::ofstream(d / name, std::ios::binary) << text; };
    put("out.json", kOld);
    put("out.svg", kOld);
    put("h.json", kTpe);
    put("costs.json", "{\"forward\": 1, \"backward\": 2}\n");
    put("images.json", "{\"patches\": [[1], [2], [3], [4], [5], [6], [7], [8]]}\n");
    put("gpu.json", "{\"rows\": []}\n");
    put("dup.json", "{\"R\": 2, \"E\": 4, \"R\": 3, \"K\": 1, \"S\": 2, \"s\": [2, 2], \"tpe\": [[1, 1, 0, 0], [0, 1, 1, 0]]}\n");
    put("dup_costs.json", "{\"forward\": 1, \"forward\": 3}\n");
    put("dup_images.json", "{\"patches\": [[1]], \"patches\": [[2]]}\n");
    put("bad_gpu.json", "{\"rows\": [1]}\n");
    put("dup_gpu.json", "{\"rows\": [{\"op\": \"plan_rank\", \"op\": \"x\"}]}\n");
    write_routing_npy((d / "r.npy").string(), make_round_robin({.R = 2, .E = 8, .K = 2, .S = 4, .seed = 1}));
    ::mkfifo((d / "fifo").c_str(), 0600);
    fs::create_directory(d / "sub");
    fs::create_directory(d / "dump");
    put("dump/keep.txt", kOld);
    fs::create_symlink(d / "h.json", d / "link.json");
    fs::create_hard_link(d / "h.json", d / "hard.json");
    // Sparse files just over the JSON (512 MiB) and .npy (4 GiB) limits: no disk is used.
    for (const auto& [name, bytes] : {std::pair{"big.json", (off_t{512} << 20) + 1}, {"big.npy", (off_t{4} << 30) + 1}}) {
        const int fd = ::open((d / name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        EXPECT_EQ(::ftruncate(fd, bytes), 0);
        ::close(fd);
    }
}

std::string read_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream os;
    os << f.rdbuf();
    return os.str();
}

// --- one run -----------------------------------------------------------------------------------------------------

struct Result {
    int exit_code = -1;  // 128 + n when killed by signal n; -1 when it ran past the timeout
    std::string err;
    double seconds = 0;
};

std::vector<std::string> split_args(const std::string& args) {
    std::vector<std::string> out;
    std::istringstream is(args);
    for (std::string w; is >> w;) {
        size_t at;
        while ((at = w.find("{d}")) != std::string::npos) w.replace(at, 3, scratch().string());
        out.push_back(w == "''" ? std::string() : w);
    }
    return out;
}

Result run(const Row& row, double timeout_s = 10) {
    const std::vector<std::string> words = split_args(row.args);
    const fs::path err_path = io_file("stderr.txt");
    int pipe_fds[2] = {-1, -1};
    if (row.out == Stdout::kClosedPipe) {
        EXPECT_EQ(::pipe(pipe_fds), 0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) {
        std::vector<char*> argv{const_cast<char*>(EVENEP_CLI_PATH)};
        for (const std::string& w : words) argv.push_back(const_cast<char*>(w.c_str()));
        argv.push_back(nullptr);
        const int in = ::open("/dev/null", O_RDONLY);
        const int out = row.out == Stdout::kDevFull ? ::open("/dev/full", O_WRONLY)
                        : row.out == Stdout::kClosedPipe
                            ? pipe_fds[1]
                            : ::open(io_file("stdout.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (row.out == Stdout::kClosedPipe) ::close(pipe_fds[0]);
        ::dup2(in, 0);
        ::dup2(out, 1);
        ::dup2(err, 2);
        for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) ::signal(sig, SIG_DFL);
        if (row.max_file_bytes > 0) {
            ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG, as on a full disk
            const rlimit limit{static_cast<rlim_t>(row.max_file_bytes), static_cast<rlim_t>(row.max_file_bytes)};
            ::setrlimit(RLIMIT_FSIZE, &limit);
        }
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::execv(EVENEP_CLI_PATH, argv.data());
        ::_exit(127);
    }
    if (row.out == Stdout::kClosedPipe) {
        ::close(pipe_fds[0]);  // the reader goes away at once
        ::close(pipe_fds[1]);
    }
    Result r;
    bool signalled = false;
    int status = 0;
    for (;;) {
        const pid_t done = ::waitpid(pid, &status, WNOHANG);
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (done == pid) break;
        if (row.signal != 0 && !signalled && r.seconds > 1.0) {
            ::kill(pid, row.signal);
            signalled = true;
        }
        if (r.seconds > timeout_s) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            r.err = read_bytes(err_path);
            return r;  // exit_code -1: a hang
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.err = read_bytes(err_path);
    return r;
}

// --- the table ---------------------------------------------------------------------------------------------------

std::vector<Row> rows() {
    // A run of a few seconds that writes --json only at its end (the planner repeated).
    const std::string long_plan = "plan --quiet --R 8 --E 64 --K 4 --S 256 --repeat 1000000 --max-time 1e6";
    const std::string fifo = "{d}/fifo", gen = "--R 4 --E 16 --K 2 --S 64";
    std::vector<Row> r = {
        // Data lost: a bad option after parsing.
        {"plan_bad_option_keeps_json", "plan --R 8 --E 380 --json {d}/out.json", 2, "E % R", {"out.json"}},
        {"demo_bad_option_keeps_json", "demo --R 3 --E 4 --K 1 --S 4 --H 8 --ffn-hidden 4 --json {d}/out.json", 2,
         "E % R", {"out.json"}},
        {"pipeline_bad_option_keeps_json", "pipeline --m 7 --V 2 --json {d}/out.json", 2, "multiple of", {"out.json"}},
        {"slack_bad_option_keeps_json", "slack --quick --R 8 --E 380 --json {d}/out.json", 2, "E % R", {"out.json"}},
        {"simulate_bad_option_keeps_json", "simulate --quick --E 30 --json {d}/out.json", 2, "E % R", {"out.json"}},
        {"bench_plan_bad_option_keeps_json", "bench plan --shapes nope --json {d}/out.json", 2, "unknown shape",
         {"out.json"}},
        // An output naming an input, however spelt; two outputs on one path.
        {"out_is_tpe", "plan --tpe {d}/h.json --json {d}/h.json", 2, "an output cannot overwrite an input", {"h.json"}},
        {"out_is_tpe_dot", "plan --tpe {d}/h.json --json {d}/sub/../h.json", 2, "same file", {"h.json"}},
        {"out_is_tpe_symlink", "plan --tpe {d}/h.json --json {d}/link.json", 2, "same file", {"h.json"}},
        {"out_is_tpe_hardlink", "plan --tpe {d}/h.json --json {d}/hard.json", 2, "same file", {"h.json"}},
        {"out_is_routing", "plan --routing {d}/r.npy --E 8 --json {d}/r.npy", 2, "same file", {"r.npy"}},
        {"out_is_images", "pipeline --images {d}/images.json --json {d}/images.json", 2, "same file", {"images.json"}},
        {"svg_is_costs", "pipeline --costs {d}/costs.json --svg {d}/costs.json", 2, "same file", {"costs.json"}},
        {"out_is_gpu_json", "simulate --quick --gpu-json {d}/gpu.json --json {d}/gpu.json", 2, "same file",
         {"gpu.json"}},
        {"two_outputs", "pipeline --json {d}/out.json --svg {d}/out.json", 2, "two outputs cannot share a path",
         {"out.json"}},
        {"two_outputs_dot", "pipeline --json {d}/out.json --svg {d}/./out.json", 2, "two outputs", {"out.json"}},
        // Full disks, closed pipes, interrupts.
        {"json_dev_full", "plan " + gen + " --quiet --json /dev/full", 2, "No space left on device"},
        {"stdout_dev_full", "plan " + gen, 2, "writing to standard output failed", {}, Stdout::kDevFull},
        {"stdout_closed_pipe", "plan " + gen, 141, "", {}, Stdout::kClosedPipe},
        {"sigint_mid_run", long_plan + " --json {d}/out.json", 128 + SIGINT, "interrupted by SIGINT: nothing written to",
         {"out.json"}, Stdout::kFile, SIGINT},
        {"sigterm_mid_run", long_plan + " --json {d}/out.json", 128 + SIGTERM, "out.json'; the old file is unchanged",
         {"out.json"}, Stdout::kFile, SIGTERM},
        {"json_is_dir", "plan --quiet --json {d}/sub", 2, "is a directory"},
        {"dump_is_fifo", "demo --R 2 --E 4 --K 1 --S 4 --H 8 --ffn-hidden 4 --dump {d}/fifo", 2, "named pipe"},
        // Devices, sizes, duplicate keys.
        {"dev_tpe", "plan --tpe /dev/null", 2, "character device"},
        {"dev_routing", "plan --routing /dev/zero --E 8", 2, "character device"},
        {"big_tpe", "plan --tpe {d}/big.json", 2, "more than the limit of 512.00 MiB"},
        {"big_routing", "plan --routing {d}/big.npy --E 8", 2, "more than the limit of 4.00 GiB"},
        {"dup_key_tpe", "plan --tpe {d}/dup.json", 2, "duplicate key \"R\" in the top-level object"},
        {"dup_key_costs", "pipeline --costs {d}/dup_costs.json", 2, "duplicate key \"forward\""},
        {"dup_key_images", "pipeline --images {d}/dup_images.json", 2, "duplicate key \"patches\""},
        {"dup_key_gpu_json", "simulate --quick --gpu-json {d}/dup_gpu.json", 2,
         "duplicate key \"op\" in the object of \"rows\""},
        {"bad_row_gpu_json", "simulate --quick --gpu-json {d}/bad_gpu.json", 2, "must be an object, got 1"},
        // The same rule for the same option.
        {"maxvio_unreachable_plan", "plan " + gen + " --maxvio 1000", 2, "--maxvio = 1000 is not reachable"},
        {"maxvio_unreachable_slack", "slack --quick --maxvio 1000", 2, "--maxvio = 1000 is not reachable"},
        {"maxvio_unreachable_simulate", "simulate --quick --maxvio 1000", 2, "--maxvio = 1000 is not reachable"},
        {"maxvio_unreachable_bench_plan", "bench plan --shapes small --maxvio 1000", 2,
         "--maxvio = 1000 is not reachable"},
        {"maxvio_below_plan", "plan --R 8 --E 64 --K 2 --S 16 --maxvio 0", 2, "reaches maxvio in ["},
        {"maxvio_below_slack", "slack --R 8 --E 64 --K 2 --S 16 --maxvio 0", 2, "reaches maxvio in ["},
        {"maxvio_below_simulate", "simulate --R 8 --E 64 --K 2 --S 16 --maxvio 0 --repeat 1", 2,
         "reaches maxvio in ["},
        {"pipeline_vit_load_zero", "pipeline --vit-load 0", 2, "--vit-load = 0 must be > 0"},
        // Successes: what was written.
        {"ok_plan_json", "plan " + gen + " --quiet --json {d}/out.json", 0, "", {}, Stdout::kFile, 0,
         {{"out.json", "{\"schema\":\"evenep.plan/2\""}}},
        {"ok_json_dev_null", "plan " + gen + " --quiet --json /dev/null", 0, ""},
        {"ok_dump_keeps_other_files", "demo --R 2 --E 4 --K 1 --S 4 --H 8 --ffn-hidden 4 --dump {d}/dump", 0, "", {},
         Stdout::kFile, 0, {{"dump/keep.txt", kOld}, {"dump/x.npy", "\x93NUMPY"}}},
        {"ok_dump_new_nested", "demo --R 2 --E 4 --K 1 --S 4 --H 8 --ffn-hidden 4 --dump {d}/new/deeper", 0, "", {},
         Stdout::kFile, 0, {{"new/deeper/out.npy", "\x93NUMPY"}}},
    };
    {
        Row full("json_disk_full", "plan " + gen + " --quiet --json {d}/out.json", 2, "out.json': write failed: File too large",
                 {"out.json"});
        full.max_file_bytes = 4096;  // the plan JSON is ~8 KB
        r.push_back(full);
    }
    if (exact_solver_available())
        r.push_back({"quality_bad_option_keeps_json", "quality --quick --only 999 --json {d}/out.json", 2, "--only",
                     {"out.json"}});
    // Every input flag given a FIFO, a directory and an empty path; every output flag given a FIFO and an empty path.
    const std::vector<std::pair<std::string, std::string>> inputs = {
        {"plan_tpe", "plan --tpe"},
        {"plan_routing", "plan --E 8 --routing"},
        {"demo_routing", "demo --E 8 --routing"},
        {"pipeline_images", "pipeline --images"},
        {"pipeline_costs", "pipeline --costs"},
        {"simulate_gpu_json", "simulate --quick --gpu-json"},
        {"bench_dispatch_routing", "bench dispatch --routing"},
    };
    for (const auto& [name, cmd] : inputs) {
        r.push_back({"fifo_" + name, cmd + " " + fifo, 2, "named pipe (FIFO), not a regular file"});
        r.push_back({"dir_" + name, cmd + " {d}/sub", 2, "is a directory, not a regular file"});
        r.push_back({"empty_" + name, cmd + " ''", 2, "empty path"});
    }
    const std::vector<std::pair<std::string, std::string>> outputs = {
        {"plan_json", "plan --quiet " + gen + " --json"},
        {"demo_json", "demo --R 2 --E 4 --K 1 --S 4 --H 8 --ffn-hidden 4 --json"},
        {"demo_dump", "demo --R 2 --E 4 --K 1 --S 4 --H 8 --ffn-hidden 4 --dump"},
        {"pipeline_json", "pipeline --json"},
        {"pipeline_svg", "pipeline --svg"},
        {"quality_json", "quality --quick --json"},
        {"slack_json", "slack --quick --json"},
        {"simulate_json", "simulate --quick --json"},
        {"bench_plan_json", "bench plan --shapes small --json"},
    };
    for (const auto& [name, cmd] : outputs) {
        r.push_back({"fifo_" + name, cmd + " " + fifo, 2, "named pipe"});
        r.push_back({"empty_" + name, cmd + " ''", 2, "empty path"});
    }
    for (const std::string cmd : {"plan", "demo", "pipeline", "slack", "simulate", "quality", "bench plan"})
        r.push_back({"seed_negative_" + std::string(cmd == std::string("bench plan") ? "bench_plan" : cmd),
                     cmd + " --seed -1", 2, "--seed: value '-1' is outside [0, "});
    return r;
}

void PrintTo(const Row& row, std::ostream* os) { *os << row.name; }

class Probe : public ::testing::TestWithParam<Row> {};

TEST_P(Probe, Row) {
    const Row& row = GetParam();
    seed();
    std::map<std::string, std::string> before;
    for (const std::string& f : row.kept) before[f] = read_bytes(scratch() / f);
    const Result res = run(row);
    ASSERT_NE(res.exit_code, -1) << row.args << ": still running after 10 s (a hang); stderr: " << res.err;
    EXPECT_EQ(res.exit_code, row.exit_code) << row.args << "\nstderr: " << res.err;
    if (row.needle.empty() && row.exit_code != 0) {
        EXPECT_EQ(res.err, "") << row.args;  // SIGPIPE: the reader is gone, nothing to say
    } else if (row.exit_code != 0) {
        EXPECT_EQ(res.err.rfind("evenep: error: ", 0), 0u) << res.err;
        EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << "not one line: " << res.err;
        EXPECT_NE(res.err.find(row.needle), std::string::npos) << row.needle << "\nnot in: " << res.err;
    }
    for (const auto& [f, bytes] : before) EXPECT_EQ(read_bytes(scratch() / f), bytes) << f << " changed: " << row.args;
    for (const auto& [f, prefix] : row.after)
        EXPECT_EQ(read_bytes(scratch() / f).rfind(prefix, 0), 0u) << f << " after " << row.args;
    for (const auto& e : fs::recursive_directory_iterator(scratch()))
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
    EXPECT_LT(res.seconds, 8) << row.args;
}

INSTANTIATE_TEST_SUITE_P(CliFiles, Probe, ::testing::ValuesIn(rows()), [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace evenep
