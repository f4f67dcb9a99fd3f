// The bookkeeping of a device team's symmetric windows (evenep/cuda/detail/window_registry.hpp), host only: what
// LocalTeam and NcclTeam do on alloc_window / free_window / destruction, without a GPU.
//
// Cases:
//   WindowRegistryTest.TakeRemovesOnlyThatWindow    windows freed out of allocation order; the others stay, in order
//   WindowRegistryTest.RefusesMainForeignAndDouble  the main window, a window of another registry and a window freed
//       twice each throw Error(kInvalidArgument) naming the team and free_window; nothing is removed
//   WindowRegistryTest.AllocFreeLoopHoldsOne        10000 alloc + free rounds leave only the main window held
//   WindowRegistryTest.ReleaseAllNewestFirst        teardown releases the newest window first, the main window last
#include "evenep/cuda/detail/window_registry.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "evenep/error.hpp"

namespace evenep::detail {
namespace {

// A team's per-window record, as NcclTeam's: the handed-out view is a member.
struct FakeWindow {
    int id = 0;
    struct View {
        int bytes = 0;
    } view;
};

const void* handle_of(const FakeWindow& w) { return &w.view; }

FakeWindow& add(WindowRegistry<FakeWindow>& reg, int id) {
    auto w = std::make_unique<FakeWindow>();
    w->id = id;
    return reg.add(std::move(w));
}

std::vector<int> ids(WindowRegistry<FakeWindow>& reg) {
    std::vector<int> out;
    reg.release_all([&](FakeWindow& w) { out.push_back(w.id); });
    return out;
}

void expect_refused(WindowRegistry<FakeWindow>& reg, const void* handle, const std::string& what) {
    try {
        reg.take(handle, handle_of, "test team");
        ADD_FAILURE() << "free_window of " << what << " was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << what;
        const std::string msg = e.what();
        EXPECT_NE(msg.find("test team"), std::string::npos) << msg;
        EXPECT_NE(msg.find("free_window"), std::string::npos) << msg;
    }
}

TEST(WindowRegistryTest, TakeRemovesOnlyThatWindow) {
    WindowRegistry<FakeWindow> reg;
    add(reg, 0);
    FakeWindow& a = add(reg, 1);
    FakeWindow& b = add(reg, 2);
    add(reg, 3);
    ASSERT_EQ(reg.size(), 4u);
    std::unique_ptr<FakeWindow> got = reg.take(&b.view, handle_of, "test team");
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->id, 2);
    got = reg.take(&a.view, handle_of, "test team");
    EXPECT_EQ(got->id, 1);
    EXPECT_EQ(reg.size(), 2u);
    EXPECT_EQ(reg.front().id, 0);
    EXPECT_EQ(ids(reg), (std::vector<int>{3, 0}));
}

TEST(WindowRegistryTest, RefusesMainForeignAndDouble) {
    WindowRegistry<FakeWindow> reg, other;
    const FakeWindow& main = add(reg, 0);
    FakeWindow& a = add(reg, 1);
    const FakeWindow& foreign = add(other, 7);
    expect_refused(reg, &main.view, "the main window");
    expect_refused(reg, &foreign.view, "another team's window");
    const void* freed = &a.view;
    reg.take(freed, handle_of, "test team");
    expect_refused(reg, freed, "a freed window");
    EXPECT_EQ(reg.size(), 1u);
    EXPECT_EQ(other.size(), 1u);
}

TEST(WindowRegistryTest, AllocFreeLoopHoldsOne) {
    WindowRegistry<FakeWindow> reg;
    add(reg, 0);
    for (int i = 1; i <= 10000; ++i) {
        FakeWindow& w = add(reg, i);
        ASSERT_EQ(reg.size(), 2u);
        EXPECT_EQ(reg.take(&w.view, handle_of, "test team")->id, i);
    }
    EXPECT_EQ(reg.size(), 1u);
}

TEST(WindowRegistryTest, ReleaseAllNewestFirst) {
    WindowRegistry<FakeWindow> reg;
    for (int i = 0; i < 4; ++i) add(reg, i);
    EXPECT_EQ(ids(reg), (std::vector<int>{3, 2, 1, 0}));
    EXPECT_TRUE(reg.empty());
}

}  // namespace
}  // namespace evenep::detail
