// evenep/error.hpp — the one exception type of the library and the checking macros.
//
// Every host-side failure (bad input, bad configuration, CUDA/NCCL error, barrier timeout) throws
// evenep::Error. The message names what failed, the offending value and, where known, the rank.
// A function that throws leaves the objects it was given usable (SPEC §8).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace evenep {

// What kind of failure; lets callers (and the CLI's exit code) tell bad input from internal errors.
enum class ErrorKind {
    kInvalidArgument,  // caller's input or configuration is wrong
    kTimeout,          // a peer never arrived at a barrier
    kRuntime,          // CUDA, NCCL, solver or I/O failure
    kInternal,         // an invariant the library itself should keep was broken
};

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
    ErrorKind kind() const noexcept { return kind_; }

private:
    ErrorKind kind_;
};

namespace detail {

template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const char* cond, Args&&... args) {
    std::ostringstream os;
    ((os << std::forward<Args>(args)), ...);
    if (sizeof...(Args) == 0) os << "check failed: " << cond;
#ifdef EVENEP_ERROR_LOCATIONS
    os << " [" << file << ":" << line << "]";
#else
    (void)file;
    (void)line;
#endif
    throw Error(kind, os.str());
}

}  // namespace detail
}  // namespace evenep

// EVENEP_CHECK(cond, parts...): throws Error(kInvalidArgument) with the streamed parts when !cond.
#define EVENEP_CHECK(cond, ...)                                                                              \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            ::evenep::detail::throw_error(::evenep::ErrorKind::kInvalidArgument, __FILE__, __LINE__, #cond,  \
                                          ##__VA_ARGS__);                                                    \
    } while (0)

// EVENEP_CHECK_KIND(kind, cond, parts...): the same with an explicit ErrorKind.
#define EVENEP_CHECK_KIND(kind, cond, ...)                                                                  \
    do {                                                                                                    \
        if (!(cond)) ::evenep::detail::throw_error(kind, __FILE__, __LINE__, #cond, ##__VA_ARGS__);         \
    } while (0)

// EVENEP_ASSERT: an internal invariant (a bug in EvenEP if it fires).
#define EVENEP_ASSERT(cond, ...) EVENEP_CHECK_KIND(::evenep::ErrorKind::kInternal, cond, "internal: ", ##__VA_ARGS__)
