// The local CPU team: generation barrier with timeout and a symmetric-window registry for R threads.
#include "evenep/cpu/local_team.hpp"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <thread>

#include "evenep/detail/align.hpp"
#include "evenep/error.hpp"

namespace evenep::cpu {
namespace {

constexpr size_t kWindowAlign = 256;

struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(kWindowAlign)); }
};
using AlignedBytes = std::unique_ptr<std::byte[], AlignedDelete>;

AlignedBytes allocate_zeroed(size_t bytes) {
    const size_t n = std::max<size_t>(kWindowAlign, detail::align_up(bytes, kWindowAlign));
    AlignedBytes p(static_cast<std::byte*>(::operator new[](n, std::align_val_t(kWindowAlign))));
    std::memset(p.get(), 0, n);
    return p;
}

std::string rank_list(const std::vector<int>& ranks) {
    std::ostringstream os;
    for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
    return os.str();
}

}  // namespace

struct LocalTeamGroup::State {
    struct Window {
        std::string name;
        std::vector<size_t> bytes;         // [R] requested by each rank (0: not yet)
        std::vector<AlignedBytes> memory;  // [R]
        std::vector<char> released;        // [R]
    };
    // Outcome of one finished (completed or aborted) barrier generation.
    struct Outcome {
        uint64_t generation = ~uint64_t{0};
        int first_bad = -1;
        bool failed = false;
        ErrorKind kind = ErrorKind::kTimeout;
        std::string error;
    };

    int size = 0;
    std::chrono::milliseconds timeout{0};

    std::mutex mu;
    std::condition_variable cv;
    uint64_t generation = 0;
    int count = 0;
    std::vector<char> arrived;
    std::vector<std::string> phase;
    int first_bad = -1;
    std::array<Outcome, 8> outcomes;

    std::deque<Window> windows;
    std::vector<int> num_allocs;  // [R] windows allocated by each rank so far

    std::vector<std::unique_ptr<Team>> teams;

    Outcome& outcome_slot(uint64_t g) { return outcomes[g % outcomes.size()]; }

    // Ends the current generation with `o` (caller holds mu) and wakes every waiter.
    void finish_generation(Outcome o) {
        o.generation = generation;
        outcome_slot(generation) = std::move(o);
        ++generation;
        count = 0;
        first_bad = -1;
        std::fill(arrived.begin(), arrived.end(), 0);
        for (auto& p : phase) p.clear();
        cv.notify_all();
    }

    [[noreturn]] static void throw_outcome(const Outcome& o, int rank) {
        std::ostringstream os;
        os << o.error << " (seen by rank " << rank << ")";
        throw Error(o.kind, os.str());
    }

    int barrier(int rank, std::string_view phase_name, bool ok) {
        std::unique_lock<std::mutex> lk(mu);
        const uint64_t g = generation;
        EVENEP_ASSERT(!arrived[rank], "barrier: rank ", rank, " arrived twice in one generation");
        arrived[rank] = 1;
        phase[rank] = std::string(phase_name);
        ++count;
        if (!ok && (first_bad < 0 || rank < first_bad)) first_bad = rank;
        if (count == size) {
            Outcome o;
            o.first_bad = first_bad;
            for (int r = 1; r < size; ++r) {
                if (phase[r] != phase[0]) {
                    std::ostringstream os;
                    os << "barrier: ranks are in different collective calls: rank 0 in '" << phase[0] << "', rank " << r
                       << " in '" << phase[r] << "'";
                    o.failed = true;
                    o.kind = ErrorKind::kRuntime;
                    o.error = os.str();
                    break;
                }
            }
            const Outcome copy = o;
            finish_generation(std::move(o));
            if (copy.failed) throw_outcome(copy, rank);
            return copy.first_bad;
        }
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        const bool done = cv.wait_until(lk, deadline, [&] { return generation != g; });
        if (!done) {
            std::vector<int> missing, present;
            for (int r = 0; r < size; ++r) (arrived[r] ? present : missing).push_back(r);
            std::ostringstream os;
            os << "barrier timeout in phase '" << phase_name << "': rank" << (missing.size() > 1 ? "s " : " ")
               << rank_list(missing) << " did not arrive within " << timeout.count() << " ms (arrived: rank"
               << (present.size() > 1 ? "s " : " ") << rank_list(present) << ")";
            Outcome o;
            o.failed = true;
            o.kind = ErrorKind::kTimeout;
            o.error = os.str();
            const Outcome copy = o;
            finish_generation(std::move(o));
            throw_outcome(copy, rank);
        }
        const Outcome& o = outcome_slot(g);
        EVENEP_ASSERT(o.generation == g, "barrier: outcome of generation ", g, " was overwritten");
        if (o.failed) throw_outcome(o, rank);
        return o.first_bad;
    }
};

namespace {

class LocalTeam final : public Team {
  public:
    LocalTeam(LocalTeamGroup::State* state, int rank) : state_(state), rank_(rank) {}

    int rank() const override { return rank_; }
    int size() const override { return state_->size; }

    SymmetricWindow alloc_symmetric(size_t bytes, std::string_view name) override {
        SymmetricWindow w;
        {
            std::lock_guard<std::mutex> lk(state_->mu);
            const int id = state_->num_allocs[rank_]++;
            while (static_cast<int>(state_->windows.size()) <= id) {
                LocalTeamGroup::State::Window nw;
                nw.name = std::string(name);
                nw.bytes.assign(state_->size, 0);
                nw.memory.resize(state_->size);
                nw.released.assign(state_->size, 0);
                state_->windows.push_back(std::move(nw));
            }
            auto& win = state_->windows[id];
            win.bytes[rank_] = bytes;
            win.memory[rank_] = allocate_zeroed(bytes);
            w.id = id;
            w.bytes = bytes;
            w.local = win.memory[rank_].get();
            w.name = std::string(name);
        }
        barrier("alloc_symmetric: " + std::string(name), true);
        std::lock_guard<std::mutex> lk(state_->mu);
        const auto& win = state_->windows[w.id];
        bool same = true;
        std::ostringstream sizes;
        for (int r = 0; r < state_->size; ++r) {
            same = same && win.bytes[r] == bytes;
            sizes << (r ? ", " : "") << "rank " << r << ": " << win.bytes[r];
        }
        EVENEP_CHECK(same, "alloc_symmetric '", name, "': ranks asked for different sizes (", sizes.str(), " bytes)");
        return w;
    }

    void free_symmetric(SymmetricWindow& w) override {
        if (w.id < 0) return;
        std::lock_guard<std::mutex> lk(state_->mu);
        auto& win = state_->windows[w.id];
        win.released[rank_] = 1;
        if (std::all_of(win.released.begin(), win.released.end(), [](char c) { return c != 0; }))
            for (auto& m : win.memory) m.reset();
        w = SymmetricWindow{};
    }

    std::byte* peer_base(const SymmetricWindow& w, int peer) const override {
        EVENEP_CHECK(peer >= 0 && peer < state_->size, "peer_base: peer ", peer, " outside [0, ", state_->size, ")");
        std::lock_guard<std::mutex> lk(state_->mu);
        EVENEP_CHECK(w.id >= 0 && w.id < static_cast<int>(state_->windows.size()), "peer_base: window '", w.name,
                     "' is not allocated");
        std::byte* p = state_->windows[w.id].memory[peer].get();
        EVENEP_CHECK(p != nullptr, "peer_base: rank ", peer, "'s copy of window '", w.name, "' is missing");
        return p;
    }

    int barrier(std::string_view phase, bool ok) override { return state_->barrier(rank_, phase, ok); }
    std::chrono::milliseconds barrier_timeout() const override {
        std::lock_guard<std::mutex> lk(state_->mu);
        return state_->timeout;
    }

  private:
    LocalTeamGroup::State* state_;
    int rank_;
};

}  // namespace

LocalTeamGroup::LocalTeamGroup(int size, std::chrono::milliseconds barrier_timeout)
    : state_(std::make_unique<State>()) {
    EVENEP_CHECK(size >= 1, "LocalTeamGroup: size = ", size, " must be >= 1");
    EVENEP_CHECK(barrier_timeout.count() > 0, "LocalTeamGroup: barrier timeout ", barrier_timeout.count(),
                 " ms must be positive");
    state_->size = size;
    state_->timeout = barrier_timeout;
    state_->arrived.assign(size, 0);
    state_->phase.resize(size);
    state_->num_allocs.assign(size, 0);
    for (int r = 0; r < size; ++r) state_->teams.push_back(std::make_unique<LocalTeam>(state_.get(), r));
}

LocalTeamGroup::~LocalTeamGroup() = default;

int LocalTeamGroup::size() const { return state_->size; }

Team& LocalTeamGroup::team(int rank) {
    EVENEP_CHECK(rank >= 0 && rank < state_->size, "LocalTeamGroup: rank ", rank, " outside [0, ", state_->size, ")");
    return *state_->teams[rank];
}

void LocalTeamGroup::set_barrier_timeout(std::chrono::milliseconds timeout) {
    EVENEP_CHECK(timeout.count() > 0, "LocalTeamGroup: barrier timeout ", timeout.count(), " ms must be positive");
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->timeout = timeout;
}

std::chrono::milliseconds LocalTeamGroup::barrier_timeout() const {
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->timeout;
}

std::vector<std::exception_ptr> run_ranks(LocalTeamGroup& group, const std::function<void(Team&)>& fn) {
    const int R = group.size();
    std::vector<std::exception_ptr> errors(R);
    std::vector<std::thread> threads;
    threads.reserve(R);
    // NOTE: the threads wait at a start gate until all R exist. If one cannot be created (thread or memory limit),
    // the started ones return without calling fn (none of them is left waiting at a barrier for a rank that never
    // starts), are joined, and the failure is reported as an Error instead of std::terminate.
    std::mutex gate_mu;
    std::condition_variable gate_cv;
    enum class Gate { kWait, kGo, kAbort } gate = Gate::kWait;
    const auto open_gate = [&](Gate g) {
        {
            std::lock_guard<std::mutex> lk(gate_mu);
            gate = g;
        }
        gate_cv.notify_all();
    };
    std::string start_error;
    for (int r = 0; r < R && start_error.empty(); ++r) {
        try {
            threads.emplace_back([&, r] {
                {
                    std::unique_lock<std::mutex> lk(gate_mu);
                    gate_cv.wait(lk, [&] { return gate != Gate::kWait; });
                    if (gate == Gate::kAbort) return;
                }
                try {
                    fn(group.team(r));
                } catch (...) {
                    errors[r] = std::current_exception();
                }
            });
        } catch (const std::exception& e) {
            std::ostringstream os;
            os << "run_ranks: cannot start the thread of rank " << r << " of R = " << R << " (" << e.what()
               << "); started " << r << " (lower R, or raise the thread/memory limits)";
            start_error = os.str();
        }
    }
    open_gate(start_error.empty() ? Gate::kGo : Gate::kAbort);
    for (auto& t : threads) t.join();
    if (!start_error.empty()) throw Error(ErrorKind::kInvalidArgument, start_error);  // R too large here
    return errors;
}

void run_ranks_or_throw(LocalTeamGroup& group, const std::function<void(Team&)>& fn) {
    const auto errors = run_ranks(group, fn);
    // Preference: an error a rank raised about its own input, then a timeout, then anything else (errors that
    // only report a peer's failure start with "peer rank").
    int best = -1, best_score = 4;
    for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
        if (!errors[r]) continue;
        int score = 3;
        try {
            std::rethrow_exception(errors[r]);
        } catch (const Error& e) {
            const bool peer = std::string_view(e.what()).starts_with("peer rank");
            score = peer ? 2 : (e.kind() == ErrorKind::kTimeout ? 1 : 0);
        } catch (...) {
            score = 0;
        }
        if (score < best_score) {
            best_score = score;
            best = r;
        }
    }
    if (best >= 0) std::rethrow_exception(errors[best]);
}

}  // namespace evenep::cpu
