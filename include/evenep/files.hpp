// evenep/files.hpp — the one home of how EvenEP reads and writes files: every reader of the library and the CLI
// (io.hpp's .npy and tpe JSON, the pipeline's cost and image files, the CLI's JSON inputs) and every writer (plan,
// demo, pipeline, quality, slack, simulate and bench outputs, --dump folders, write_npy / write_tpe_json).
//
// Inputs: a path is checked before it is opened. FIFOs, sockets, devices and directories are refused (opening a FIFO
// would block until a writer came), and so is a file larger than a stated limit.
//
// Outputs: nothing is opened until the caller writes, which it does only once all inputs are read and checked. The
// bytes go to a temporary file in the target's directory. That file is flushed to disk (fsync) and closed, and only
// then renamed over the target. A failed write, an exception or an interrupting signal (see
// install_interrupt_cleanup) removes the temporary and leaves the old target as it was. A character device (/dev/null,
// /dev/full) is written in place, since it cannot be renamed over. A symbolic link is followed, so the file it points
// to is replaced and the link stays.
//
// Every error is an evenep::Error of kind kInvalidArgument (the CLI's exit code 2) naming `what` (a flag such as
// "--json" or a file kind such as ".npy") and the path. That covers a target that cannot take the output (a full
// disk, no write permission), which the user fixes by giving another path, as with a bad input.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace evenep {

// The default size limit of an input file: 4 GiB. That covers a routing .npy of R*S*K = 10^9 int32 ids; a larger
// input would not fit the memory of the machines EvenEP's tools run on anyway.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{4} << 30;
// JSON inputs (tpe histograms, pipeline costs and images, GPU timing files): 512 MiB. Parsed JSON takes ~10x its
// text in memory.
inline constexpr uint64_t kMaxJsonInputBytes = uint64_t{512} << 20;

// --- inputs ------------------------------------------------------------------------------------------------------

// Checks, without opening it, that `path` names an existing, readable regular file of at most `max_bytes`; returns
// its size. Throws Error(kInvalidArgument) "<what> '<path>': is a named pipe (FIFO), not a regular file" (or: no such
// file, a directory, a device, a socket, larger than the limit, permission denied, empty path).
uint64_t check_input_file(const std::string& path, std::string_view what, uint64_t max_bytes = kMaxInputFileBytes);

// The whole file, after check_input_file. The file is opened non-blocking and checked again (fstat) once open, so a
// path swapped for a FIFO in between cannot block either.
std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes = kMaxInputFileBytes);

// --- outputs -----------------------------------------------------------------------------------------------------

// Checks early, without creating or opening anything, that `path` can take an output. The path must not be empty.
// Its directory must exist and be writable. An existing target must be a regular file we may write, or a character
// device. Directories, FIFOs, sockets and block devices are refused. Throws Error(kInvalidArgument) naming `what` and
// the path.
void check_output_file(const std::string& path, std::string_view what);

// One output file written atomically (see the header comment). The constructor runs check_output_file and opens
// nothing. The first write() creates the temporary ".<name>.tmp-XXXXXX" beside the target. commit() flushes, fsyncs,
// closes and renames, so the target appears whole or not at all. The destructor of an uncommitted file removes the
// temporary. Moves only; not thread-safe.
class AtomicFile {
  public:
    AtomicFile(std::string path, std::string what);
    ~AtomicFile();
    AtomicFile(AtomicFile&& other) noexcept;
    AtomicFile& operator=(AtomicFile&&) = delete;
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    const std::string& path() const { return path_; }
    void write(std::string_view bytes);
    void write(const void* data, size_t num_bytes) { write(std::string_view(static_cast<const char*>(data), num_bytes)); }
    // Publishes the file (an empty one when nothing was written). Throws on any failure, after removing the
    // temporary; the old target is then unchanged.
    void commit();

  private:
    void open_temporary();
    [[noreturn]] void fail(std::string_view step, int err);
    void discard() noexcept;

    std::string path_, what_;
    std::string target_;  // path_ with symbolic links resolved: what the rename replaces
    std::string temp_;    // empty until the first write
    int fd_ = -1;
    int slot_ = -1;  // in the interrupt registry
    bool in_place_ = false;  // a character device: written directly
    bool committed_ = false;
    mode_t mode_ = 0644;
};

// `bytes` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, std::string_view what, std::string_view bytes);

// A folder of output files (--dump) written as a whole. The constructor checks that the parent directory exists and is
// writable and that an existing `path` is a directory; it creates nothing. file(name) gives the path of `name` inside
// a temporary folder ".<name>.tmp-XXXXXX" beside `path`, created on the first call. commit() publishes it. A new
// folder is renamed into place in one step. Into an existing folder, each file is renamed in turn, so every file is
// whole, files the run does not write are kept, and the temporary folder is removed. An uncommitted folder removes
// its temporary with its contents.
class AtomicDir {
  public:
    AtomicDir(std::string path, std::string what);
    ~AtomicDir();
    AtomicDir(const AtomicDir&) = delete;
    AtomicDir& operator=(const AtomicDir&) = delete;

    const std::string& path() const { return path_; }
    // The path to write `name` at (a plain file name, no '/'); callers write it with any writer of this header.
    std::string file(const std::string& name);
    void commit();

  private:
    void discard() noexcept;
    std::string path_, what_, temp_;
    std::vector<std::string> names_;
    std::vector<int> slots_;
    bool committed_ = false;
};

// --- one run's files ---------------------------------------------------------------------------------------------

// A file a command reads or writes, named by its flag.
struct FileUse {
    std::string what;  // e.g. "--json"
    std::string path;
    bool output = false;
};

// Refuses an output that names the same file as an input or as another output. Paths are compared resolved: the
// real path of the parent directory plus the name, after symbolic links; existing files are also compared by
// device and inode, which catches hard links. Throws Error(kInvalidArgument) naming both flags and the path.
void check_distinct_files(const std::vector<FileUse>& files);

// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove every temporary of a live AtomicFile / AtomicDir and
// print one line "evenep: error: interrupted by SIGINT: nothing written to '<path>'; the old file is unchanged".
// They then re-raise the signal with its default action, so the exit status still says which signal it was.
// For programs (the CLI), not for a library embedded in another runtime: the Python package never calls it.
void install_interrupt_cleanup();

}  // namespace evenep
