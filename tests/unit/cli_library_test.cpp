// Library-level halves of the CLI hardening (issue 10, item 7): the fixes that live in the library, tested without
// the binary.
//
// Cases:
//   RunRanks.ThreadStartFailureIsAnError   with the address space capped so that not all R threads can start,
//                                          run_ranks throws Error(kInvalidArgument) naming the rank and R (no
//                                          std::terminate), runs fn on no rank, and joins the started threads.
//   IoHardening.NamedPipeIsRefused         read_tpe_json / read_npy on a FIFO throw at once (never open it).
//   IoHardening.TpeNumberOverflowNamesLine a tpe JSON holding 1e400: the message names the file, line and value.
//   IoHardening.NpyHeaderLieIsEscaped      a .npy whose header length runs into binary data: a short, printable
//                                          message; an absurd header length is refused before parsing.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "evenep/cpu/local_team.hpp"
#include "evenep/error.hpp"
#include "evenep/io.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;

// Virtual memory of this process in bytes (/proc/self/statm, first field in pages).
size_t vm_bytes() {
    std::ifstream f("/proc/self/statm");
    size_t pages = 0;
    f >> pages;
    return pages * static_cast<size_t>(::sysconf(_SC_PAGE_SIZE));
}

TEST(RunRanks, ThreadStartFailureIsAnError) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            constexpr int kR = 4096;  // 4096 stacks of 8 MiB cannot fit in 256 MiB of address space
            cpu::LocalTeamGroup group(kR, std::chrono::milliseconds(2000));
            rlimit lim{};
            lim.rlim_cur = lim.rlim_max = vm_bytes() + (size_t{256} << 20);
            if (::setrlimit(RLIMIT_AS, &lim) != 0) std::_Exit(3);
            std::atomic<int> ran{0};
            try {
                (void)cpu::run_ranks(group, [&](Team&) { ran.fetch_add(1); });
                std::_Exit(4);  // every thread started: the cap did not bite
            } catch (const Error& e) {
                const std::string what = e.what();
                const bool named = what.find("cannot start the thread of rank") != std::string::npos &&
                                   what.find("R = 4096") != std::string::npos;
                std::fprintf(stderr, "%s\n", what.c_str());
                std::_Exit(e.kind() == ErrorKind::kInvalidArgument && named && ran.load() == 0 ? 0 : 5);
            }
        },
        ::testing::ExitedWithCode(0), "cannot start the thread of rank");
}

class IoHardening : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("evenep_cli_library_test_" + std::to_string(getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const char* name) const { return (dir_ / name).string(); }
    fs::path dir_;
};

std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
    try {
        f();
    } catch (const Error& e) {
        if (kind) *kind = e.kind();
        return e.what();
    }
    return "(no error)";
}

TEST_F(IoHardening, NamedPipeIsRefused) {
    ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
    const auto t0 = std::chrono::steady_clock::now();
    ErrorKind kind = ErrorKind::kInternal;
    const std::string tpe = error_of([&] { read_tpe_json(path("fifo")); }, &kind);
    EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
    EXPECT_NE(tpe.find("named pipe"), std::string::npos) << tpe;
    EXPECT_NE(tpe.find("fifo"), std::string::npos) << tpe;
    const std::string npy = error_of([&] { read_npy(path("fifo")); });
    EXPECT_NE(npy.find("named pipe"), std::string::npos) << npy;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST_F(IoHardening, TpeNumberOverflowNamesLine) {
    std::ofstream(path("big.json")) << "{\"R\": 2, \"E\": 4, \"K\": 1, \"S\": 2,\n \"s\": [2, 2],\n"
                                       " \"tpe\": [[0, 0, 0, 0], [1, 1e400, 0, 0]]}\n";
    ErrorKind kind = ErrorKind::kInternal;
    const std::string msg = error_of([&] { read_tpe_json(path("big.json")); }, &kind);
    EXPECT_EQ(kind, ErrorKind::kInvalidArgument) << msg;
    for (const char* needle : {"big.json", "line 3", "1e400", "out of range"})
        EXPECT_NE(msg.find(needle), std::string::npos) << needle << " in: " << msg;
}

TEST_F(IoHardening, NpyHeaderLieIsEscaped) {
    const auto npy = [](uint32_t header_len, size_t tail) {
        std::string b = "\x93NUMPY";
        b += '\x02';
        b += '\x00';
        for (int i = 0; i < 4; ++i) b += static_cast<char>((header_len >> (8 * i)) & 0xff);
        b += "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
        for (size_t i = 0; i < tail; ++i) b += static_cast<char>(i * 151 % 256);
        return b;
    };
    std::ofstream(path("lie.npy"), std::ios::binary) << npy(200000, 220000);
    const std::string msg = error_of([&] { read_npy(path("lie.npy")); });
    EXPECT_NE(msg.find("lie.npy"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad header"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 400u) << msg;
    for (char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "non-printable byte in the message";

    std::ofstream(path("huge.npy"), std::ios::binary) << npy(0x7fffffff, 64);
    const std::string huge = error_of([&] { read_npy(path("huge.npy")); });
    EXPECT_NE(huge.find("header length 2147483647"), std::string::npos) << huge;
}

}  // namespace
}  // namespace evenep
