// Input checks and atomic outputs (include/evenep/files.hpp): the one home of how EvenEP touches files.
#include "evenep/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "evenep/error.hpp"

namespace evenep {
namespace {

// --- paths -------------------------------------------------------------------------------------------------------

// "'path'" with control bytes escaped, for messages.
std::string quote_path(std::string_view path) {
    std::string out = "'";
    for (const char ch : path) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == 0x7f) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "\\x%02x", c);
            out += hex;
        } else {
            out += ch;
        }
    }
    return out + "'";
}

[[noreturn]] void refuse(std::string_view what, const std::string& path, const std::string& why) {
    throw Error(ErrorKind::kInvalidArgument, std::string(what) + " " + quote_path(path) + ": " + why);
}

const char* kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a named pipe (FIFO)";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISCHR(m)) return "a character device";
    return "not a regular file";
}

std::string parent_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

std::string name_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string real_path(const std::string& path) {
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (resolved == nullptr) return {};
    std::string out(resolved);
    std::free(resolved);
    return out;
}

std::string size_text(uint64_t bytes) {
    char buf[64];
    if (bytes >= (uint64_t{1} << 30))
        std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
    else if (bytes >= (uint64_t{1} << 20))
        std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
    else
        std::snprintf(buf, sizeof(buf), "%llu bytes", static_cast<unsigned long long>(bytes));
    return buf;
}

// The process umask (read once: reading it means setting it).
mode_t process_umask() {
    static const mode_t mask = [] {
        const mode_t m = ::umask(022);
        ::umask(m);
        return m;
    }();
    return mask;
}

mode_t new_file_mode() { return 0666 & ~process_umask(); }

// Checks the directory an output goes into: it exists, is a directory and is writable.
void check_output_parent(const std::string& path, std::string_view what) {
    const std::string parent = parent_of(path);
    struct stat st {};
    if (::stat(parent.c_str(), &st) != 0)
        refuse(what, path, "its directory " + quote_path(parent) + " cannot be used: " + std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) refuse(what, path, quote_path(parent) + " is not a directory");
    if (::access(parent.c_str(), W_OK | X_OK) != 0)
        refuse(what, path, "its directory " + quote_path(parent) + " is not writable: " + std::strerror(errno));
}

// --- the interrupt registry ----------------------------------------------------------------------------------------
//
// Fixed storage only: the signal handler may read it at any moment and must not allocate. A slot holds an output's
// target (for the message; empty for a file inside a temporary folder) and, once created, its temporary path.
// `temp_set` is stored after the path is complete (release) and cleared only after the temporary was renamed or
// removed, so the handler sees either a whole path or none; removing one that is already gone is harmless.

inline constexpr int kNumSlots = 64;  // outputs alive at once: a few files, plus one per file of a --dump folder
inline constexpr size_t kSlotPathBytes = 4096;

struct Slot {
    std::atomic<bool> used{false};
    std::atomic<bool> temp_set{false};
    bool is_dir = false;
    char target[kSlotPathBytes] = {};
    char temp[kSlotPathBytes] = {};
};

std::array<Slot, kNumSlots> g_slots;

void copy_path(char* dst, const std::string& src) {
    const size_t n = std::min(src.size(), kSlotPathBytes - 1);
    std::memcpy(dst, src.data(), n);
    dst[n] = '\0';
}

// A slot for an output (the target may be empty); -1 when all are taken (the output still works, only an interrupt
// would leave its temporary behind).
int claim_slot(const std::string& target, bool is_dir) {
    for (int i = 0; i < kNumSlots; ++i) {
        bool expected = false;
        if (g_slots[i].used.load(std::memory_order_relaxed) ||
            !g_slots[i].used.compare_exchange_strong(expected, true, std::memory_order_acq_rel))
            continue;
        g_slots[i].is_dir = is_dir;
        g_slots[i].temp_set.store(false, std::memory_order_release);
        copy_path(g_slots[i].target, target);
        return i;
    }
    return -1;
}

void set_temp(int slot, const std::string& temp) {
    if (slot < 0) return;
    copy_path(g_slots[slot].temp, temp);
    g_slots[slot].temp_set.store(true, std::memory_order_release);
}

void release_slot(int slot) {
    if (slot < 0) return;
    g_slots[slot].temp_set.store(false, std::memory_order_release);
    g_slots[slot].target[0] = '\0';
    g_slots[slot].used.store(false, std::memory_order_release);
}

// Async-signal-safe append of a C string to buf (size kSlotPathBytes * 2).
void append(char* buf, size_t cap, size_t& len, const char* s) {
    while (*s != '\0' && len + 1 < cap) buf[len++] = *s++;
    buf[len] = '\0';
}

void on_interrupt(int sig) {
    // Files first, then the temporary folders they were in.
    for (const bool dirs : {false, true}) {
        for (Slot& s : g_slots) {
            if (!s.used.load(std::memory_order_acquire) || !s.temp_set.load(std::memory_order_acquire) ||
                s.is_dir != dirs)
                continue;
            dirs ? ::rmdir(s.temp) : ::unlink(s.temp);
        }
    }
    static char line[2 * kSlotPathBytes];
    size_t len = 0;
    const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
    int targets = 0;
    for (Slot& s : g_slots) {
        if (!s.used.load(std::memory_order_acquire) || s.target[0] == '\0') continue;
        if (targets++ == 0) {
            append(line, sizeof(line), len, "evenep: error: interrupted by ");
            append(line, sizeof(line), len, name);
            append(line, sizeof(line), len, ": nothing written to '");
        } else {
            append(line, sizeof(line), len, "', '");
        }
        append(line, sizeof(line), len, s.target);
    }
    if (targets > 0) {
        append(line, sizeof(line), len, targets == 1 ? "'; the old file is unchanged\n" : "'; the old files are unchanged\n");
        [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line, len);
    }
    std::signal(sig, SIG_DFL);
    std::raise(sig);  // delivered with the default action once this handler returns
}

// Removes a temporary folder and the files in it (best effort; used on failure paths only).
void remove_tree(const std::string& dir) {
    if (DIR* d = ::opendir(dir.c_str())) {
        while (const dirent* e = ::readdir(d)) {
            const std::string name = e->d_name;
            if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
        }
        ::closedir(d);
    }
    ::rmdir(dir.c_str());
}

void sync_directory(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);  // durability of the rename; a failure here loses nothing that is not already on its way
    ::close(fd);
}

}  // namespace

// --- inputs ------------------------------------------------------------------------------------------------------

uint64_t check_input_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
    if (path.empty()) throw Error(ErrorKind::kInvalidArgument, std::string(what) + ": empty path");
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) refuse(what, path, std::strerror(errno));
    if (!S_ISREG(st.st_mode)) refuse(what, path, std::string("is ") + kind_of(st.st_mode) + ", not a regular file");
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size > max_bytes)
        refuse(what, path, "is " + size_text(size) + ", more than the limit of " + size_text(max_bytes) +
                               " for this input");
    if (::access(path.c_str(), R_OK) != 0) refuse(what, path, std::strerror(errno));
    return size;
}

std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
    check_input_file(path, what, max_bytes);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) refuse(what, path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        refuse(what, path, "changed into something that is not a regular file while being opened");
    }
    std::string bytes;
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    for (;;) {
        if (got == bytes.size()) {
            if (bytes.size() > max_bytes) break;
            bytes.resize(std::min<uint64_t>(bytes.size() + 65536, max_bytes + 1));  // a file still growing
        }
        const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            refuse(what, path, std::string("read failed: ") + std::strerror(err));
        }
        if (n == 0) break;
        got += static_cast<size_t>(n);
    }
    ::close(fd);
    if (got > max_bytes)
        refuse(what, path, "grew past the limit of " + size_text(max_bytes) + " for this input while being read");
    bytes.resize(got);
    return bytes;
}

// --- outputs -----------------------------------------------------------------------------------------------------

void check_output_file(const std::string& path, std::string_view what) {
    if (path.empty()) throw Error(ErrorKind::kInvalidArgument, std::string(what) + ": empty path");
    if (path.back() == '/') refuse(what, path, "names a directory; give a file");
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        if (errno != ENOENT) refuse(what, path, std::strerror(errno));
        struct stat lst {};
        if (::lstat(path.c_str(), &lst) == 0) refuse(what, path, "is a symbolic link to a missing file");
        check_output_parent(path, what);
        return;
    }
    if (S_ISCHR(st.st_mode)) return;  // /dev/null, /dev/full: written in place
    if (!S_ISREG(st.st_mode)) refuse(what, path, std::string("is ") + kind_of(st.st_mode) + "; give a regular file");
    if (::access(path.c_str(), W_OK) != 0) refuse(what, path, std::string("cannot be written: ") + std::strerror(errno));
    check_output_parent(real_path(path), what);
}

AtomicFile::AtomicFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
    check_output_file(path_, what_);
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0) {
        target_ = real_path(path_);
        if (target_.empty()) refuse(what_, path_, std::string("cannot resolve the path: ") + std::strerror(errno));
        in_place_ = S_ISCHR(st.st_mode);
        mode_ = st.st_mode & 07777;
    } else {
        target_ = path_;
        mode_ = new_file_mode();
    }
    slot_ = claim_slot(path_, false);
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      target_(std::move(other.target_)),
      temp_(std::move(other.temp_)),
      fd_(other.fd_),
      slot_(other.slot_),
      in_place_(other.in_place_),
      committed_(other.committed_),
      mode_(other.mode_) {
    other.fd_ = -1;
    other.slot_ = -1;
    other.temp_.clear();
    other.committed_ = true;
}

AtomicFile::~AtomicFile() {
    if (!committed_) discard();
    release_slot(slot_);
}

void AtomicFile::discard() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!temp_.empty()) ::unlink(temp_.c_str());
    temp_.clear();
    if (slot_ >= 0) g_slots[slot_].temp_set.store(false, std::memory_order_release);
}

void AtomicFile::fail(std::string_view step, int err) {
    discard();
    committed_ = true;  // nothing left to clean up
    refuse(what_, path_,
           std::string(step) + ": " + std::strerror(err) + (in_place_ ? "" : "; the old file (if any) is unchanged"));
}

void AtomicFile::open_temporary() {
    if (in_place_) {
        fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd_ < 0) fail("cannot open for writing", errno);
        return;
    }
    std::string templ = parent_of(target_) + "/." + name_of(target_) + ".tmp-XXXXXX";
    fd_ = ::mkostemp(templ.data(), O_CLOEXEC);
    if (fd_ < 0) fail("cannot create a temporary file beside it", errno);
    temp_ = templ;
    set_temp(slot_, temp_);
    if (::fchmod(fd_, mode_) != 0) fail("cannot set the permissions of the temporary file", errno);
}

void AtomicFile::write(std::string_view bytes) {
    EVENEP_CHECK_KIND(ErrorKind::kInternal, !committed_, what_, " ", quote_path(path_), ": write after commit");
    if (fd_ < 0) open_temporary();
    while (!bytes.empty()) {
        const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("write failed", n < 0 ? errno : EIO);
        bytes.remove_prefix(static_cast<size_t>(n));
    }
}

void AtomicFile::commit() {
    if (committed_) return;
    if (fd_ < 0) open_temporary();
    if (!in_place_ && ::fsync(fd_) != 0) fail("flushing to disk failed", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing failed", errno);
    if (!in_place_) {
        if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("renaming the temporary file into place failed", errno);
        temp_.clear();
        sync_directory(parent_of(target_));
    }
    committed_ = true;
    release_slot(slot_);
    slot_ = -1;
}

void write_file_atomically(const std::string& path, std::string_view what, std::string_view bytes) {
    AtomicFile f(path, std::string(what));
    f.write(bytes);
    f.commit();
}

AtomicDir::AtomicDir(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
    if (path_.empty()) throw Error(ErrorKind::kInvalidArgument, what_ + ": empty path");
    while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) refuse(what_, path_, std::string("is ") + kind_of(st.st_mode) + ", not a directory");
        if (::access(path_.c_str(), W_OK | X_OK) != 0)
            refuse(what_, path_, std::string("is not writable: ") + std::strerror(errno));
        path_ = real_path(path_);  // the temporary folder goes beside the real one (same file system)
    } else if (errno != ENOENT) {
        refuse(what_, path_, std::strerror(errno));
    }
    // Missing parent folders are created with the temporary folder; the first existing ancestor must be writable.
    std::string ancestor = path_;
    struct stat ast {};
    do {
        ancestor = parent_of(ancestor);
    } while (ancestor != "." && ancestor != "/" && ::stat(ancestor.c_str(), &ast) != 0 && errno == ENOENT);
    check_output_parent(ancestor + "/x", what_);
    slots_.push_back(claim_slot(path_, true));
}

AtomicDir::~AtomicDir() {
    if (!committed_) discard();
    for (int s : slots_) release_slot(s);
}

void AtomicDir::discard() noexcept {
    if (!temp_.empty()) remove_tree(temp_);
    temp_.clear();
    for (int s : slots_)
        if (s >= 0) g_slots[s].temp_set.store(false, std::memory_order_release);
}

std::string AtomicDir::file(const std::string& name) {
    EVENEP_CHECK_KIND(ErrorKind::kInternal, !name.empty() && name.find('/') == std::string::npos && name != "." &&
                                                name != "..",
                      what_, ": bad file name '", name, "'");
    if (temp_.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(parent_of(path_), ec);
        if (ec) refuse(what_, path_, "cannot create its parent folders: " + ec.message());
        std::string templ = parent_of(path_) + "/." + name_of(path_) + ".tmp-XXXXXX";
        if (::mkdtemp(templ.data()) == nullptr)
            refuse(what_, path_, std::string("cannot create a temporary folder beside it: ") + std::strerror(errno));
        ::chmod(templ.c_str(), 0777 & ~process_umask());  // mkdtemp makes it 0700; a folder as mkdir would make it
        temp_ = templ;
        set_temp(slots_.front(), temp_);
    }
    const std::string p = temp_ + "/" + name;
    names_.push_back(name);
    const int slot = claim_slot("", false);
    set_temp(slot, p);
    slots_.push_back(slot);
    return p;
}

void AtomicDir::commit() {
    if (committed_) return;
    const auto fail = [&](const std::string& step) {
        const int err = errno;
        discard();
        committed_ = true;
        refuse(what_, path_, step + ": " + std::strerror(err));
    };
    if (temp_.empty() && ::mkdir(path_.c_str(), 0777) != 0 && errno != EEXIST) fail("cannot create the folder");
    if (!temp_.empty()) {
        struct stat st {};
        if (::stat(path_.c_str(), &st) != 0) {
            if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming the temporary folder into place failed");
        } else {
            for (const std::string& name : names_) {
                const std::string from = temp_ + "/" + name;
                if (::access(from.c_str(), F_OK) != 0) continue;  // announced but not written
                if (::rename(from.c_str(), (path_ + "/" + name).c_str()) != 0)
                    fail("moving '" + name + "' into place failed");
            }
            remove_tree(temp_);
        }
        temp_.clear();
        sync_directory(parent_of(path_));
    }
    committed_ = true;
    for (int s : slots_) release_slot(s);
    slots_.clear();
}

// --- one run's files ---------------------------------------------------------------------------------------------

void check_distinct_files(const std::vector<FileUse>& files) {
    struct Resolved {
        std::string name;
        bool exists = false, device = false;
        dev_t dev = 0;
        ino_t ino = 0;
    };
    std::vector<Resolved> resolved;
    for (const FileUse& f : files) {
        Resolved r;
        struct stat st {};
        if (!f.path.empty() && ::stat(f.path.c_str(), &st) == 0) {
            r.exists = true;
            r.device = S_ISCHR(st.st_mode);
            r.dev = st.st_dev;
            r.ino = st.st_ino;
            r.name = real_path(f.path);
        } else if (!f.path.empty()) {
            const std::string parent = real_path(parent_of(f.path));
            r.name = (parent.empty() ? parent_of(f.path) : parent) + "/" + name_of(f.path);
        }
        resolved.push_back(r);
    }
    for (size_t i = 0; i < files.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            if (!files[i].output && !files[j].output) continue;  // reading one file twice is fine
            const Resolved &a = resolved[i], &b = resolved[j];
            if (a.name.empty() || b.name.empty() || (a.device && b.device)) continue;  // /dev/null twice is fine
            const bool same = a.name == b.name || (a.exists && b.exists && a.dev == b.dev && a.ino == b.ino);
            if (!same) continue;
            const FileUse& out = files[i].output ? files[i] : files[j];
            const FileUse& other = files[i].output ? files[j] : files[i];
            throw Error(ErrorKind::kInvalidArgument,
                        out.what + " " + quote_path(out.path) + " is the same file as " + other.what + " " +
                            quote_path(other.path) +
                            (other.output ? ": two outputs cannot share a path" : ": an output cannot overwrite an input") +
                            "; give another path");
        }
    }
}

void install_interrupt_cleanup() {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // e.g. under nohup
        struct sigaction sa {};
        sa.sa_handler = on_interrupt;
        sigemptyset(&sa.sa_mask);
        for (const int other : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, other);
        ::sigaction(sig, &sa, nullptr);
    }
}

}  // namespace evenep
