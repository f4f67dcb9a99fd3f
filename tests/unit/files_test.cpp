// The file helpers of include/evenep/files.hpp and detail/json_input.hpp, in process.
//
// Cases:
//   Inputs.RefusesWhatIsNotARegularFile   FIFO, directory, character device, missing file, empty path: each named,
//                                         kInvalidArgument, and the FIFO is never opened (the call returns)
//   Inputs.SizeLimit                      a file one byte over the limit is refused with both sizes; at the limit read
//   Outputs.NothingBeforeTheFirstWrite    constructing an AtomicFile creates nothing; destroying it uncommitted
//                                         leaves the old file and no temporary
//   Outputs.CommitReplacesWhole           the target holds the new bytes, keeps its mode, no temporary is left
//   Outputs.SymlinkKeptTargetReplaced     writing through a symbolic link replaces the file it points to
//   Outputs.DevFullFails                  /dev/full: the error names the path and ENOSPC
//   Outputs.RefusedTargets                a directory, a FIFO, a missing directory, an empty path
//   Outputs.SignalRemovesTemporary        a child killed by SIGTERM mid-write (install_interrupt_cleanup): dies by
//                                         SIGTERM, one stderr line naming the target, old file intact, no temporary
//   Dirs.NewFolderAppearsWhole            a new --dump folder (with missing parents) exists only after commit
//   Dirs.ExistingFolderKeepsOtherFiles    files the run does not write are kept; no temporary folder is left
//   Dirs.UncommittedLeavesNothing         an uncommitted folder removes its temporary folder and files
//   Distinct.SameFileRefused              output == input by name, "./", "..", a symlink, a hard link; two outputs;
//                                         two reads of one input and /dev/null twice are fine
//   Json.DuplicateKeysRefused             top level and nested (named with the enclosing key); distinct keys in
//                                         sibling objects are fine
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/cli_testing.hpp"
#include "evenep/detail/json_input.hpp"
#include "evenep/error.hpp"
#include "evenep/files.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;

class Files : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = testing::temp_dir("evenep_files_test", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }
    void put(const std::string& name, const std::string& text) const {
        std::ofstream(dir_ / name, std::ios::binary) << text;
    }
    std::string get(const std::string& name) const {
        std::ifstream f(dir_ / name, std::ios::binary);
        std::ostringstream os;
        os << f.rdbuf();
        return os.str();
    }
    // Names in the folder (recursively) that look like a temporary.
    int temporaries() const {
        int n = 0;
        for (const auto& e : fs::recursive_directory_iterator(dir_))
            n += e.path().filename().string().find(".tmp-") != std::string::npos;
        return n;
    }
    fs::path dir_;
};

// The message of the Error `f` throws ("" if none), checking its kind.
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
        return e.what();
    }
    return {};
}

using Inputs = Files;
using Outputs = Files;
using Dirs = Files;
using Distinct = Files;

TEST_F(Inputs, RefusesWhatIsNotARegularFile) {
    ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
    EXPECT_NE(error_of([&] { read_input_file(path("fifo"), "--x"); }).find("named pipe (FIFO)"), std::string::npos);
    EXPECT_NE(error_of([&] { read_input_file(dir_.string(), "--x"); }).find("is a directory"), std::string::npos);
    EXPECT_NE(error_of([&] { read_input_file("/dev/null", "--x"); }).find("character device"), std::string::npos);
    const std::string missing = error_of([&] { read_input_file(path("nope"), "--x"); });
    EXPECT_NE(missing.find("--x '"), std::string::npos) << missing;
    EXPECT_NE(missing.find("No such file"), std::string::npos) << missing;
    EXPECT_NE(error_of([&] { read_input_file("", "--x"); }).find("--x: empty path"), std::string::npos);
}

TEST_F(Inputs, SizeLimit) {
    put("f", std::string(100, 'a'));
    EXPECT_EQ(read_input_file(path("f"), "--x", 100), std::string(100, 'a'));
    const std::string e = error_of([&] { read_input_file(path("f"), "--x", 99); });
    EXPECT_NE(e.find("is 100 bytes, more than the limit of 99 bytes"), std::string::npos) << e;
}

TEST_F(Outputs, NothingBeforeTheFirstWrite) {
    put("out", "old");
    {
        AtomicFile f(path("out"), "--json");
        EXPECT_EQ(temporaries(), 0);
        EXPECT_FALSE(fs::exists(path("new")));
        f.write("partial");
        EXPECT_EQ(temporaries(), 1);
        EXPECT_EQ(get("out"), "old");
    }  // not committed
    EXPECT_EQ(get("out"), "old");
    EXPECT_EQ(temporaries(), 0);
    { AtomicFile g(path("new"), "--json"); }
    EXPECT_FALSE(fs::exists(path("new")));
}

TEST_F(Outputs, CommitReplacesWhole) {
    put("out", "old");
    ::chmod(path("out").c_str(), 0640);
    AtomicFile f(path("out"), "--json");
    f.write("new ");
    f.write("bytes");
    f.commit();
    EXPECT_EQ(get("out"), "new bytes");
    struct stat st {};
    ASSERT_EQ(::stat(path("out").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    EXPECT_EQ(temporaries(), 0);
    write_file_atomically(path("fresh"), "--svg", "");
    EXPECT_TRUE(fs::exists(path("fresh")));
}

TEST_F(Outputs, SymlinkKeptTargetReplaced) {
    put("real", "old");
    fs::create_symlink(path("real"), path("link"));
    write_file_atomically(path("link"), "--json", "new");
    EXPECT_TRUE(fs::is_symlink(path("link")));
    EXPECT_EQ(get("real"), "new");
}

TEST_F(Outputs, DevFullFails) {
    const std::string e = error_of([&] { write_file_atomically("/dev/full", "--json", "x"); });
    EXPECT_NE(e.find("--json '/dev/full'"), std::string::npos) << e;
    EXPECT_NE(e.find("No space left on device"), std::string::npos) << e;
}

TEST_F(Outputs, RefusedTargets) {
    ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
    EXPECT_NE(error_of([&] { AtomicFile(path("fifo"), "--json"); }).find("named pipe"), std::string::npos);
    EXPECT_NE(error_of([&] { AtomicFile(dir_.string(), "--json"); }).find("directory"), std::string::npos);
    EXPECT_NE(error_of([&] { AtomicFile(path("no/x"), "--json"); }).find("cannot be used"), std::string::npos);
    EXPECT_NE(error_of([&] { AtomicFile("", "--json"); }).find("empty path"), std::string::npos);
}

TEST_F(Outputs, SignalRemovesTemporary) {
    put("out", "old");
    const std::string err = path("stderr");
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 2);
        ::signal(SIGTERM, SIG_DFL);
        install_interrupt_cleanup();
        AtomicFile f(path("out"), "--json");
        f.write("half of the");
        ::raise(SIGTERM);  // mid-write
        f.write(" result");
        f.commit();
        ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << status;
    EXPECT_EQ(WTERMSIG(status), SIGTERM);
    EXPECT_EQ(get("out"), "old");
    EXPECT_EQ(temporaries(), 0);
    EXPECT_EQ(get("stderr"), "evenep: error: interrupted by SIGTERM: nothing written to '" + path("out") +
                                 "'; the old file is unchanged\n");
}

TEST_F(Dirs, NewFolderAppearsWhole) {
    {
        AtomicDir d(path("a/b/dump"), "--dump");
        write_file_atomically(d.file("x.npy"), "npy", "x");
        EXPECT_FALSE(fs::exists(path("a/b/dump")));
        d.commit();
    }
    EXPECT_EQ(get("a/b/dump/x.npy"), "x");
    EXPECT_EQ(temporaries(), 0);
}

TEST_F(Dirs, ExistingFolderKeepsOtherFiles) {
    fs::create_directory(path("dump"));
    put("dump/keep", "mine");
    put("dump/x.npy", "old");
    AtomicDir d(path("dump"), "--dump");
    write_file_atomically(d.file("x.npy"), "npy", "new");
    EXPECT_EQ(get("dump/x.npy"), "old");
    d.commit();
    EXPECT_EQ(get("dump/x.npy"), "new");
    EXPECT_EQ(get("dump/keep"), "mine");
    EXPECT_EQ(temporaries(), 0);
}

TEST_F(Dirs, UncommittedLeavesNothing) {
    {
        AtomicDir d(path("dump"), "--dump");
        write_file_atomically(d.file("x.npy"), "npy", "x");
        EXPECT_EQ(temporaries(), 1);
    }
    EXPECT_FALSE(fs::exists(path("dump")));
    EXPECT_EQ(temporaries(), 0);
    put("file", "f");
    EXPECT_NE(error_of([&] { AtomicDir(path("file"), "--dump"); }).find("not a directory"), std::string::npos);
}

TEST_F(Distinct, SameFileRefused) {
    put("in", "i");
    fs::create_directory(path("sub"));
    fs::create_symlink(path("in"), path("link"));
    fs::create_hard_link(path("in"), path("hard"));
    for (const std::string& out : {path("in"), dir_.string() + "/./in", path("sub/../in"), path("link"), path("hard")}) {
        const std::string e = error_of([&] { check_distinct_files({{"--tpe", path("in"), false}, {"--json", out, true}}); });
        EXPECT_NE(e.find("--json '" + out + "' is the same file as --tpe"), std::string::npos) << e;
    }
    const std::string two = error_of(
        [&] { check_distinct_files({{"--json", path("new"), true}, {"--svg", dir_.string() + "/./new", true}}); });
    EXPECT_NE(two.find("two outputs cannot share a path"), std::string::npos) << two;
    EXPECT_EQ(error_of([&] {
                  check_distinct_files({{"--a", path("in"), false},
                                        {"--b", path("in"), false},
                                        {"--json", "/dev/null", true},
                                        {"--svg", "/dev/null", true}});
              }),
              "");
}

TEST(Json, DuplicateKeysRefused) {
    const auto err = [](const std::string& text) {
        return error_of([&] { detail::parse_json_strict(text, "f.json"); });
    };
    EXPECT_NE(err(R"({"a": 1, "a": 2})").find("f.json: duplicate key \"a\" in the top-level object"), std::string::npos);
    EXPECT_NE(err(R"({"rows": [{"op": 1}, {"op": 1, "x": 2, "op": 3}]})").find("duplicate key \"op\" in the object of \"rows\""),
              std::string::npos);
    EXPECT_EQ(err(R"({"rows": [{"op": 1}, {"op": 2}], "x": {"op": 3}})"), "");
    EXPECT_EQ(detail::parse_json_strict(R"({"a": {"b": [1, 2]}})", "f")["a"]["b"][1], 2);
}

}  // namespace
}  // namespace evenep
