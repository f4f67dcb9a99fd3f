// File I/O and the plan dump (SPEC §6). Cases:
//   TpeJson.RoundTrip / ReadsHandWritten / MissingFileIsRuntimeError (also: a directory)
//   TpeJson/BadTpeJson.Throws/*       missing field, wrong type, float, wrong lengths, negative count,
//                                     E % R != 0, s out of range, row sum > s*K, parse error, not an object
//   Npy.RoundTripInt32 / RoundTripFloat32 / RoundTripInt64AndBytes / ScalarAndEmpty
//   Npy.HeaderIsNumpyFormat           magic, version 1.0, header padded to 64 bytes, ends in '\n'
//   Npy.ReadsVersion2AndPython2Long   hand-built 2.0 header, "3L" shape entries, double-quoted keys
//   Npy.WriteRejectsBadArguments      size mismatch, big-endian dtype
//   Npy/BadNpy.Throws/*               bad magic, bad version, truncated header/data, trailing bytes,
//                                     fortran_order True, big-endian, unsupported/structured dtype,
//                                     missing/unknown key, negative shape, garbage header
//   RoutingNpy.RoundTrip / UnequalSPadsAndTrims / AcceptsInt64 / Int64OutOfRange / IdOutOfRange /
//              WrongDtype / WrongRank / BadE
//   PlanJson.FieldsAndShapes          make_plan + compute_dst, parsed back with nlohmann: every field and shape
//   PlanJson.NoDstWithoutRouting / DstSizeMismatchThrows / IndentAndSlots
#include "evenep/io.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "evenep/error.hpp"
#include "evenep/plan.hpp"
#include "evenep/routing.hpp"

namespace evenep {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 777;

template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// A fresh directory per test under gtest's temp dir.
class IoTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string name = std::string(info->test_suite_name()) + "_" + info->name();
        for (char& c : name)
            if (c == '/') c = '_';
        dir_ = fs::path(::testing::TempDir()) / ("evenep_io_" + std::to_string(::getpid()) + "_" + name);
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& file) const { return (dir_ / file).string(); }
    std::string write_bytes(const std::string& file, const std::string& bytes) const {
        std::ofstream f(path(file), std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return path(file);
    }
    std::string read_bytes(const std::string& file) const {
        std::ifstream f(path(file), std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    }

    fs::path dir_;
};

// A .npy file as numpy writes it: magic, version, little-endian header length, header dict, data.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
    std::string head = dict;
    const size_t prefix = major == 1 ? 10 : 12;
    while ((prefix + head.size() + 1) % 64 != 0) head.push_back(' ');
    head.push_back('\n');
    std::string out("\x93NUMPY", 6);
    out.push_back(static_cast<char>(major));
    out.push_back(0);
    const size_t n = head.size();
    out.push_back(static_cast<char>(n & 0xFF));
    out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (major != 1) {
        out.push_back(static_cast<char>((n >> 16) & 0xFF));
        out.push_back(static_cast<char>((n >> 24) & 0xFF));
    }
    return out + head + data;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// --- tpe JSON ----------------------------------------------------------------------------------------------------

using TpeJson = IoTest;

TEST_F(TpeJson, RoundTrip) {
    const Routing r = make_lognormal({.R = 4, .E = 16, .K = 3, .S = 40, .seed = kSeed}, 1.0);
    TpeFile f{.R = 4, .E = 16, .K = 3, .S = 40, .s = r.s, .tpe = r.tpe()};
    write_tpe_json(path("a.json"), f);
    const TpeFile g = read_tpe_json(path("a.json"));
    EXPECT_EQ(g.R, 4);
    EXPECT_EQ(g.E, 16);
    EXPECT_EQ(g.K, 3);
    EXPECT_EQ(g.S, 40);
    EXPECT_EQ(g.s, f.s);
    EXPECT_EQ(g.tpe, f.tpe);
    // The written file is plain JSON in the documented layout.
    const auto j = nlohmann::json::parse(read_bytes("a.json"));
    EXPECT_EQ(j["tpe"].size(), 4u);
    EXPECT_EQ(j["tpe"][3].size(), 16u);
}

TEST_F(TpeJson, ReadsHandWritten) {
    write_bytes("h.json", R"({"R": 2, "E": 4, "K": 2, "S": 3, "note": "extra keys are ignored",
                              "s": [3, 2], "tpe": [[1, 2, 3, 0], [0, 0, 4, 0]]})");
    const TpeFile f = read_tpe_json(path("h.json"));
    EXPECT_EQ(f.s, (std::vector<int32_t>{3, 2}));
    EXPECT_EQ(f.tpe, (std::vector<int32_t>{1, 2, 3, 0, 0, 0, 4, 0}));
}

TEST_F(TpeJson, MissingFileIsBadInput) {
    try {
        read_tpe_json(path("nope.json"));
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);  // the CLI's exit code 2
        EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("nope.json"), std::string::npos) << e.what();
    }
    EXPECT_NE(error_of([&] { read_npy(dir_.string()); }).find("is a directory"), std::string::npos);
}

struct BadCase {
    const char* name;
    const char* content;
    const char* expected;  // substring of the error message
};

const BadCase kBadTpe[] = {
    {"missing_R", R"({"E": 4, "K": 2, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0],[0,0,0,0]]})", "missing field \"R\""},
    {"missing_tpe", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 3]})", "missing field \"tpe\""},
    {"string_E", R"({"R": 2, "E": "4", "K": 2, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0],[0,0,0,0]]})",
     "field \"E\" must be an integer, got string"},
    {"float_K", R"({"R": 2, "E": 4, "K": 2.5, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0],[0,0,0,0]]})",
     "field \"K\" must be an integer, got a float"},
    {"s_not_array", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": 3, "tpe": [[0,0,0,0],[0,0,0,0]]})",
     "field \"s\" must be an array"},
    {"s_short", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3], "tpe": [[0,0,0,0],[0,0,0,0]]})",
     "field \"s\" has 1 entries, expected 2"},
    {"tpe_rows", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0]]})",
     "field \"tpe\" has 1 entries, expected 2"},
    {"tpe_cols", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0],[0,0,0]]})",
     "field \"tpe\"[1] has 3 entries, expected 4"},
    {"negative", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0],[0,0,-1,0]]})",
     "field \"tpe\"[1][2] = -1 is negative"},
    {"tpe_string", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 3], "tpe": [[0,0,0,0],[0,"x",0,0]]})",
     "field \"tpe\"[1][1] must be an integer"},
    {"e_mod_r", R"({"R": 4, "E": 10, "K": 2, "S": 3, "s": [3,3,3,3], "tpe": []})",
     "field \"E\" = 10 is not a multiple of \"R\" = 4"},
    {"r_zero", R"({"R": 0, "E": 4, "K": 2, "S": 3, "s": [], "tpe": []})", "field \"R\" = 0 must be >= 1"},
    {"k_too_big", R"({"R": 1, "E": 64, "K": 33, "S": 3, "s": [3], "tpe": [[]]})", "field \"K\" = 33"},
    {"s_zero", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [0, 3], "tpe": [[0,0,0,0],[0,0,0,0]]})",
     "field \"s\"[0] = 0 outside [1, S = 3]"},
    {"s_over", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 4], "tpe": [[0,0,0,0],[0,0,0,0]]})",
     "field \"s\"[1] = 4 outside [1, S = 3]"},
    {"row_sum", R"({"R": 2, "E": 4, "K": 2, "S": 3, "s": [3, 1], "tpe": [[0,0,0,0],[1,1,1,0]]})",
     "field \"tpe\"[1] sums to 3 entries, more than s[1]*K = 2"},
    {"overflow", R"({"R": 2, "E": 4, "K": 2, "S": 3000000000, "s": [3, 1], "tpe": []})",
     "field \"S\" = 3000000000 overflows int32"},
    {"parse_error", R"({"R": 2, "E": 4,)", "parse error"},
    {"not_object", R"([1, 2, 3])", "top level must be an object, got array"},
};

class BadTpeJson : public IoTest, public ::testing::WithParamInterface<BadCase> {};

TEST_P(BadTpeJson, Throws) {
    const std::string p = write_bytes("bad.json", GetParam().content);
    try {
        read_tpe_json(p);
        FAIL() << "no error for " << GetParam().content;
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(GetParam().expected), std::string::npos)
            << "message: " << e.what() << "\nexpected: " << GetParam().expected;
        EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
}

INSTANTIATE_TEST_SUITE_P(TpeJson, BadTpeJson, ::testing::ValuesIn(kBadTpe), [](const auto& info) {
    return std::string(info.param.name);
});

// --- .npy --------------------------------------------------------------------------------------------------------

using Npy = IoTest;

TEST_F(Npy, RoundTripInt32) {
    std::vector<int32_t> v(2 * 3 * 5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 7919) - 100;
    write_npy(path("a.npy"), "<i4", {2, 3, 5}, v.data(), v.size() * 4);
    const NpyArray a = read_npy(path("a.npy"));
    EXPECT_EQ(a.dtype, "<i4");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 5}));
    ASSERT_EQ(a.data.size(), v.size() * 4);
    EXPECT_EQ(std::memcmp(a.data.data(), v.data(), a.data.size()), 0);
}

TEST_F(Npy, RoundTripFloat32) {
    const std::vector<float> v = {0.0f, -1.5f, 3.25e-7f, 1e30f, -0.0f, 42.0f};
    write_npy(path("f.npy"), "<f4", {6}, v.data(), v.size() * 4);
    const NpyArray a = read_npy(path("f.npy"));
    EXPECT_EQ(a.dtype, "<f4");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{6}));
    EXPECT_EQ(std::memcmp(a.data.data(), v.data(), a.data.size()), 0);
}

TEST_F(Npy, RoundTripInt64AndBytes) {
    const std::vector<int64_t> v = {-(int64_t{1} << 40), 0, 5, int64_t{1} << 62};
    write_npy(path("l.npy"), "<i8", {2, 2}, v.data(), v.size() * 8);
    const NpyArray a = read_npy(path("l.npy"));
    EXPECT_EQ(a.dtype, "<i8");
    EXPECT_EQ(std::memcmp(a.data.data(), v.data(), 32), 0);
    const std::vector<uint8_t> b = {0, 1, 255};
    write_npy(path("b.npy"), "|u1", {3}, b.data(), 3);
    EXPECT_EQ(read_npy(path("b.npy")).dtype, "|u1");
    write_npy(path("b2.npy"), "<u1", {3}, b.data(), 3);  // normalised to '|'
    EXPECT_EQ(read_npy(path("b2.npy")).dtype, "|u1");
}

TEST_F(Npy, ScalarAndEmpty) {
    const int32_t x = 9;
    write_npy(path("s.npy"), "<i4", {}, &x, 4);
    NpyArray a = read_npy(path("s.npy"));
    EXPECT_TRUE(a.shape.empty());
    EXPECT_EQ(a.data.size(), 4u);
    write_npy(path("e.npy"), "<f4", {0, 3}, nullptr, 0);
    a = read_npy(path("e.npy"));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{0, 3}));
    EXPECT_TRUE(a.data.empty());
}

TEST_F(Npy, HeaderIsNumpyFormat) {
    const std::vector<int32_t> v = {1, 2, 3, 4, 5, 6};
    write_npy(path("h.npy"), "<i4", {2, 3}, v.data(), 24);
    const std::string bytes = read_bytes("h.npy");
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 6), std::string("\x93NUMPY", 6));
    EXPECT_EQ(bytes[6], 1);
    EXPECT_EQ(bytes[7], 0);
    const size_t header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(bytes.size(), 10 + header_len + 24);
    const std::string header = bytes.substr(10, header_len);
    EXPECT_EQ(header.back(), '\n');
    EXPECT_EQ(header.rfind("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u) << header;
    // What np.save writes for a 1-d array.
    write_npy(path("h1.npy"), "<i4", {6}, v.data(), 24);
    EXPECT_NE(read_bytes("h1.npy").find("'shape': (6,), }"), std::string::npos);
}

TEST_F(Npy, ReadsVersion2AndPython2Long) {
    const std::vector<float> v = {1.0f, 2.0f, 3.0f};
    write_bytes("v2.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", raw(v), 2));
    NpyArray a = read_npy(path("v2.npy"));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(std::memcmp(a.data.data(), v.data(), 12), 0);
    write_bytes("py2.npy", npy_bytes("{\"shape\": (1L, 3L), \"fortran_order\": False, \"descr\": \"<f4\"}", raw(v)));
    a = read_npy(path("py2.npy"));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 3}));
}

TEST_F(Npy, WriteRejectsBadArguments) {
    const std::vector<int32_t> v = {1, 2, 3};
    EXPECT_NE(error_of([&] {
                  write_npy(path("x.npy"), "<i4", {2, 2}, v.data(), 12);
              }).find("shape (2, 2) of <i4 needs 16 bytes, got 12"),
              std::string::npos);
    EXPECT_NE(error_of([&] { write_npy(path("x.npy"), ">i4", {3}, v.data(), 12); }).find("big-endian"),
              std::string::npos);
    EXPECT_NE(error_of([&] { write_npy(path("x.npy"), "<c8", {3}, v.data(), 12); }).find("unsupported dtype"),
              std::string::npos);
}

const std::string kData24(24, '\0');
const std::string kGoodDict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";

struct BadNpyCase {
    const char* name;
    std::string bytes;
    const char* expected;
};

std::vector<BadNpyCase> bad_npy_cases() {
    std::string good = npy_bytes(kGoodDict, kData24);
    std::string bad_magic = good;
    bad_magic[1] = 'X';
    std::string bad_version = good;
    bad_version[6] = 4;
    std::string header_cut = good.substr(0, 40);
    return {
        {"bad_magic", bad_magic, "bad magic"},
        {"empty_file", "", "bad magic"},
        {"bad_version", bad_version, "unsupported format version 4.0"},
        {"truncated_header", header_cut, "truncated header"},
        {"truncated_data", npy_bytes(kGoodDict, kData24.substr(0, 20)),
         "truncated data: shape (2, 3) of <i4 needs 24 bytes, file has 20"},
        {"trailing_bytes", npy_bytes(kGoodDict, kData24 + "xyz"), "3 unexpected trailing bytes"},
        {"fortran", npy_bytes("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", kData24),
         "fortran_order True is not supported"},
        {"big_endian", npy_bytes("{'descr': '>i4', 'fortran_order': False, 'shape': (2, 3), }", kData24), "big-endian"},
        {"unicode", npy_bytes("{'descr': '<U2', 'fortran_order': False, 'shape': (3,), }", kData24),
         "unsupported dtype '<U2'"},
        {"structured", npy_bytes("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (6,), }", kData24),
         "structured dtypes are not supported"},
        {"missing_shape", npy_bytes("{'descr': '<i4', 'fortran_order': False, }", kData24), "missing key 'shape'"},
        {"unknown_key", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", kData24),
         "unexpected key 'x'"},
        {"negative_shape", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (-2, 3), }", kData24),
         "shape entries must be non-negative integers"},
        {"bad_bool", npy_bytes("{'descr': '<i4', 'fortran_order': 0, 'shape': (2, 3), }", kData24),
         "fortran_order must be True or False"},
        {"garbage", npy_bytes("hello", kData24), "bad header (expected '{')"},
    };
}

class BadNpy : public IoTest, public ::testing::WithParamInterface<BadNpyCase> {};

TEST_P(BadNpy, Throws) {
    const std::string p = write_bytes("bad.npy", GetParam().bytes);
    const std::string msg = error_of([&] { read_npy(p); });
    EXPECT_NE(msg.find(GetParam().expected), std::string::npos)
        << "message: " << msg << "\nexpected: " << GetParam().expected;
    EXPECT_NE(msg.find("bad.npy"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Npy, BadNpy, ::testing::ValuesIn(bad_npy_cases()), [](const auto& info) {
    return std::string(info.param.name);
});

// --- routing .npy ---------------------------------------------------------------------------------------------------

using RoutingNpy = IoTest;

TEST_F(RoutingNpy, RoundTrip) {
    const Routing r = make_adversarial({.R = 4, .E = 16, .K = 3, .S = 50, .seed = kSeed}, Adversarial::kMasked);
    write_routing_npy(path("r.npy"), r);
    const NpyArray a = read_npy(path("r.npy"));
    EXPECT_EQ(a.dtype, "<i4");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 50, 3}));
    const Routing b = read_routing_npy(path("r.npy"), 16);
    EXPECT_EQ(b.R, 4);
    EXPECT_EQ(b.E, 16);
    EXPECT_EQ(b.K, 3);
    EXPECT_EQ(b.S, 50);
    EXPECT_EQ(b.s, r.s);
    EXPECT_EQ(b.topk_idx, r.topk_idx);
}

TEST_F(RoutingNpy, UnequalSPadsAndTrims) {
    const Routing r = make_adversarial({.R = 4, .E = 8, .K = 2, .S = 30, .seed = kSeed}, Adversarial::kUnequalS);
    write_routing_npy(path("u.npy"), r);
    const Routing full = read_routing_npy(path("u.npy"), 8);
    EXPECT_EQ(full.s, std::vector<int32_t>(4, 30));
    for (int rank = 0; rank < 4; ++rank) {
        EXPECT_TRUE(std::equal(r.topk_idx[rank].begin(), r.topk_idx[rank].end(), full.topk_idx[rank].begin()));
        for (size_t i = r.topk_idx[rank].size(); i < full.topk_idx[rank].size(); ++i)
            EXPECT_EQ(full.topk_idx[rank][i], -1) << "rank " << rank;
    }
    EXPECT_EQ(full.tpe(), r.tpe());
    const Routing trimmed = read_routing_npy(path("u.npy"), 8, /*trim_masked_tail=*/true);
    EXPECT_EQ(trimmed.s, r.s);  // lognormal tokens are never fully masked
    EXPECT_EQ(trimmed.topk_idx, r.topk_idx);
}

TEST_F(RoutingNpy, AcceptsInt64) {
    const std::vector<int64_t> v = {0, 1, 2, -1, 3, 0, 1, 2};  // [2, 2, 2]
    write_npy(path("l.npy"), "<i8", {2, 2, 2}, v.data(), v.size() * 8);
    const Routing r = read_routing_npy(path("l.npy"), 4);
    EXPECT_EQ(r.topk_idx, (std::vector<std::vector<int32_t>>{{0, 1, 2, -1}, {3, 0, 1, 2}}));
    EXPECT_EQ(r.total_entries(), 7);
}

TEST_F(RoutingNpy, Int64OutOfRange) {
    const std::vector<int64_t> v = {0, 1, 2, 3, 0, 1, int64_t{1} << 40, 2};
    write_npy(path("l.npy"), "<i8", {2, 2, 2}, v.data(), v.size() * 8);
    const std::string msg = error_of([&] { read_routing_npy(path("l.npy"), 4); });
    EXPECT_NE(msg.find("rank 1, token 1, k 0: expert id 1099511627776 outside [0, E = 4)"), std::string::npos) << msg;
}

TEST_F(RoutingNpy, IdOutOfRange) {
    std::vector<int32_t> v(2 * 3 * 2, 0);
    v[1 * 6 + 2 * 2 + 1] = 8;  // rank 1, token 2, k 1
    write_npy(path("r.npy"), "<i4", {2, 3, 2}, v.data(), v.size() * 4);
    std::string msg = error_of([&] { read_routing_npy(path("r.npy"), 8); });
    EXPECT_NE(msg.find("rank 1, token 2, k 1: expert id 8 outside [0, E = 8)"), std::string::npos) << msg;
    v[1 * 6 + 2 * 2 + 1] = -2;
    write_npy(path("r.npy"), "<i4", {2, 3, 2}, v.data(), v.size() * 4);
    msg = error_of([&] { read_routing_npy(path("r.npy"), 8); });
    EXPECT_NE(msg.find("expert id -2"), std::string::npos) << msg;
}

TEST_F(RoutingNpy, WrongDtype) {
    const std::vector<float> v(8, 0.0f);
    write_npy(path("f.npy"), "<f4", {2, 2, 2}, v.data(), 32);
    const std::string msg = error_of([&] { read_routing_npy(path("f.npy"), 4); });
    EXPECT_NE(msg.find("dtype '<f4' is not int32"), std::string::npos) << msg;
}

TEST_F(RoutingNpy, WrongRank) {
    const std::vector<int32_t> v(8, 0);
    write_npy(path("r.npy"), "<i4", {4, 2}, v.data(), 32);
    const std::string msg = error_of([&] { read_routing_npy(path("r.npy"), 4); });
    EXPECT_NE(msg.find("shape (4, 2) is not [R, S, K]"), std::string::npos) << msg;
}

TEST_F(RoutingNpy, BadE) {
    const std::vector<int32_t> v(3 * 2 * 2, 0);
    write_npy(path("r.npy"), "<i4", {3, 2, 2}, v.data(), v.size() * 4);
    EXPECT_NE(error_of([&] { read_routing_npy(path("r.npy"), 8); }).find("E = 8 is not a multiple of R = 3"),
              std::string::npos);
    EXPECT_NE(error_of([&] { read_routing_npy(path("r.npy"), 0); }).find("E = 0"), std::string::npos);
}

// --- plan JSON
// ---------------------------------------------------------------------------------------------------------

struct PlanFixture {
    Config cfg{.R = 4, .E = 16, .K = 4, .S = 64, .B = -1, .tp = 8};
    Routing routing;
    Plan plan;
    std::vector<std::vector<int32_t>> dst;

    explicit PlanFixture(PlannerMode mode, int B = -1) {
        cfg.B = B;
        routing = make_adversarial({.R = 4, .E = 16, .K = 4, .S = 64, .seed = kSeed}, Adversarial::kMasked);
        plan = make_plan(cfg, mode, routing.tpe(), routing.s);
        dst.resize(cfg.R);
        for (int r = 0; r < cfg.R; ++r) {
            dst[r].resize(routing.topk_idx[r].size());
            compute_dst(plan, r, routing.topk_idx[r], dst[r]);
        }
    }
};

template <typename T>
std::vector<std::vector<T>> rows_of(const std::vector<T>& v, size_t rows, size_t cols) {
    std::vector<std::vector<T>> out(rows);
    for (size_t r = 0; r < rows; ++r) out[r].assign(v.begin() + r * cols, v.begin() + (r + 1) * cols);
    return out;
}

TEST(PlanJson, FieldsAndShapes) {
    for (PlannerMode mode : {PlannerMode::kReference, PlannerMode::kOptimized}) {
        SCOPED_TRACE(std::string(to_string(mode)) + " seed " + std::to_string(kSeed));
        const PlanFixture f(mode);
        const Plan& p = f.plan;
        const auto j = nlohmann::json::parse(plan_to_json(p, f.dst));
        const size_t R = 4, E = 16, G = 8, B = 4;
        EXPECT_EQ(j.at("schema"), "evenep.plan/2");
        EXPECT_EQ(j.at("planner"), std::string(to_string(mode)));
        const auto& c = j.at("config");
        EXPECT_EQ(c.at("R"), 4);
        EXPECT_EQ(c.at("E"), 16);
        EXPECT_EQ(c.at("K"), 4);
        EXPECT_EQ(c.at("S"), 64);
        EXPECT_EQ(c.at("epn"), 4);
        EXPECT_EQ(c.at("B"), 4);
        EXPECT_EQ(c.at("tp"), 8);
        EXPECT_EQ(c.at("NvS").get<int64_t>(), p.cfg.recv_rows());
        EXPECT_EQ(j.at("s").get<std::vector<int32_t>>(), p.s);
        EXPECT_EQ(j.at("tpe").get<std::vector<std::vector<int32_t>>>(), rows_of(p.tpe, R, E));
        EXPECT_EQ(j.at("q").get<std::vector<int32_t>>(), p.q);
        EXPECT_EQ(j.at("alloc").get<std::vector<std::vector<int32_t>>>(), rows_of(p.alloc, E, R));
        EXPECT_EQ(j.at("group_expert").get<std::vector<std::vector<int32_t>>>(), rows_of(p.group_expert, R, G));
        EXPECT_EQ(j.at("cu_seqlens").get<std::vector<std::vector<int32_t>>>(), rows_of(p.cu_seqlens, R, G));
        EXPECT_EQ(j.at("group_count").get<std::vector<std::vector<int32_t>>>(), rows_of(p.group_count, R, G));
        EXPECT_EQ(j.at("copies").get<std::vector<std::vector<int32_t>>>(), rows_of(p.copies, R, B));
        EXPECT_EQ(j.at("relay_src").get<std::vector<std::vector<int32_t>>>(), rows_of(p.relay_src, R, B));
        EXPECT_EQ(j.at("relay_round").get<std::vector<std::vector<int32_t>>>(), rows_of(p.relay_round, R, B));
        const auto& src = j.at("group_source");
        ASSERT_EQ(src.size(), R);
        const char* names[] = {"empty", "local", "slot", "peer"};
        for (size_t r = 0; r < R; ++r) {
            ASSERT_EQ(src[r].size(), G);
            for (size_t g = 0; g < G; ++g)
                EXPECT_EQ(src[r][g], names[static_cast<int>(p.group_source[r * G + g])]) << "rank " << r << " g " << g;
        }
        const auto& cost = j.at("cost");
        EXPECT_EQ(cost.at("max_rank_copy_traffic").get<int64_t>(), p.cost.max_rank_copy_traffic);
        EXPECT_EQ(cost.at("total_copies").get<int64_t>(), p.cost.total_copies);
        EXPECT_EQ(cost.at("crossing_rows").get<int64_t>(), p.cost.crossing_rows);
        EXPECT_EQ(cost.at("moved_entries").get<int64_t>(), p.cost.moved_entries);
        EXPECT_EQ(cost.at("copy_critical_path").get<int64_t>(), p.cost.copy_critical_path);
        EXPECT_EQ(cost.at("direct_critical_path").get<int64_t>(), p.cost.direct_critical_path);
        const auto& pr = j.at("per_rank");
        EXPECT_EQ(pr.at("load_before").get<std::vector<int64_t>>(), p.load_before);
        EXPECT_EQ(pr.at("remote_experts").get<std::vector<int32_t>>(), p.remote_experts);
        EXPECT_EQ(pr.at("copies_received").get<std::vector<int32_t>>(), p.copies_received);
        EXPECT_EQ(pr.at("copies_pushed").get<std::vector<int32_t>>(), p.copies_pushed);
        EXPECT_EQ(pr.at("peer_reads").get<std::vector<int32_t>>(), p.peer_reads);
        EXPECT_EQ(pr.at("crossing_out").get<std::vector<int64_t>>(), p.crossing_out);
        EXPECT_EQ(j.at("dst").get<std::vector<std::vector<int32_t>>>(), f.dst);
        // Masked entries appear as INT32_MIN in dst.
        bool any_masked = false;
        for (const auto& row : j.at("dst"))
            for (const auto& v : row) any_masked = any_masked || v.get<int64_t>() == INT32_MIN;
        EXPECT_TRUE(any_masked);
        // Keys in the documented order.
        const std::vector<std::string> order = {
            "schema",     "planner",     "config",       "s",      "tpe",  "q",        "alloc", "group_expert",
            "cu_seqlens", "group_count", "group_source", "copies", "relay_src", "relay_round", "cost", "per_rank", "dst"};
        const auto ordered = nlohmann::ordered_json::parse(plan_to_json(p, f.dst));
        std::vector<std::string> keys;
        for (const auto& [k, v] : ordered.items()) keys.push_back(k);
        EXPECT_EQ(keys, order);
    }
}

TEST(PlanJson, NoDstWithoutRouting) {
    const PlanFixture f(PlannerMode::kOptimized);
    const auto j = nlohmann::json::parse(plan_to_json(f.plan, {}));
    EXPECT_FALSE(j.contains("dst"));
    EXPECT_TRUE(j.contains("per_rank"));
}

TEST(PlanJson, DstSizeMismatchThrows) {
    PlanFixture f(PlannerMode::kReference);
    f.dst.pop_back();
    EXPECT_NE(error_of([&] { plan_to_json(f.plan, f.dst); }).find("dst has 3 ranks, expected R = 4"),
              std::string::npos);
    f.dst.push_back({1, 2, 3});
    EXPECT_NE(error_of([&] { plan_to_json(f.plan, f.dst); }).find("dst[3] has 3 entries"), std::string::npos);
}

TEST(PlanJson, IndentAndSlots) {
    const PlanFixture f(PlannerMode::kOptimized, /*B=*/1);
    const std::string compact = plan_to_json(f.plan, f.dst);
    const std::string pretty = plan_to_json(f.plan, f.dst, 2);
    EXPECT_EQ(compact.find('\n'), std::string::npos);
    EXPECT_NE(pretty.find("\n  \"planner\""), std::string::npos);
    EXPECT_EQ(nlohmann::json::parse(compact), nlohmann::json::parse(pretty));
    const auto j = nlohmann::json::parse(compact);
    EXPECT_EQ(j.at("config").at("B"), 1);
    for (const auto& row : j.at("copies")) EXPECT_EQ(row.size(), 1u);
}

}  // namespace
}  // namespace evenep
