// src/cpu/local_status.hpp — internal to the CPU backend: how a rank's input checks travel through a barrier.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

#include "evenep/buffer.hpp"
#include "evenep/error.hpp"

namespace evenep::cpu::internal {

// A rank's own input checks: run before the call's first barrier, their outcome travels through it (one ok bit
// per rank), so that every rank throws together and none is left waiting at a later barrier.
struct LocalStatus {
    bool ok = true;
    ErrorKind kind = ErrorKind::kInvalidArgument;
    std::string message;

    template <typename F>
    void run(F&& checks) {
        try {
            checks();
        } catch (const Error& e) {
            ok = false;
            kind = e.kind();
            message = e.what();
        }
    }
    // After the status barrier: throws this rank's own error, or the peer report (`undone`: what did not happen,
    // e.g. "nothing was sent"), or returns.
    void throw_if_failed(int first_bad, std::string_view call, std::string_view undone) const {
        if (!ok) throw Error(kind, message);
        if (first_bad >= 0) {
            std::ostringstream os;
            os << "peer rank " << first_bad << " reported invalid input to " << call
               << " (its own error names the value); " << undone;
            throw Error(ErrorKind::kInvalidArgument, os.str());
        }
    }
};

// `cfg` after BufferConfig::validate() (for constructors' member initialisers).
inline BufferConfig validated(const BufferConfig& cfg) {
    cfg.validate();
    return cfg;
}

}  // namespace evenep::cpu::internal
