// Routing files and plan dumps (SPEC §6): tpe JSON, NumPy .npy, routing .npy, plan JSON "evenep.plan/2".
//
// Every reader checks every field and throws evenep::Error naming the file, the field (or rank/token/k) and
// the offending value. Files are read and written through include/evenep/files.hpp: inputs must be regular files
// within a size limit (kMaxInputFileBytes for .npy, kMaxJsonInputBytes for JSON), outputs are replaced atomically.
// Every error is ErrorKind::kInvalidArgument (the CLI's exit code 2), a failed write included.
#include "evenep/io.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "evenep/detail/align.hpp"
#include "evenep/detail/json_input.hpp"
#include "evenep/detail/layout.hpp"
#include "evenep/error.hpp"
#include "evenep/files.hpp"

namespace evenep {
namespace {

static_assert(std::endian::native == std::endian::little, ".npy I/O assumes a little-endian host");

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

inline constexpr char kNpyMagic[] = "\x93NUMPY";
inline constexpr size_t kNpyMagicBytes = 6;
inline constexpr size_t kNpyAlign = 64;  // numpy pads magic + length + header to a multiple of 64 bytes
inline constexpr size_t kNpyMaxHeaderBytes = size_t{1} << 20;  // numpy writes a few hundred bytes, reads <= 10000

// The bytes of an input (files.hpp: regular files only, at most `max_bytes`) as the parsers below take them.
std::vector<char> read_file(const std::string& path, const char* what, uint64_t max_bytes) {
    const std::string text = read_input_file(path, what, max_bytes);
    return std::vector<char>(text.begin(), text.end());
}

void write_file(
    const std::string& path, const char* what, const std::string& head, const void* data, size_t num_bytes) {
    AtomicFile f(path, what);
    f.write(head);
    if (num_bytes > 0) f.write(data, num_bytes);
    f.commit();
}

// --- tpe JSON ---------------------------------------------------------------------------------------------------

std::string json_type(const Json& j) {
    if (j.is_number_float()) return "a float (" + j.dump() + ")";
    if (j.is_number()) return "a number";
    return std::string(j.type_name());
}

// An int32 from `j` (an integer JSON number, not a float), else an Error naming `field`.
int32_t json_int(const Json& j, const std::string& where, const std::string& field) {
    EVENEP_CHECK(j.is_number_integer(), where, ": field ", field, " must be an integer, got ", json_type(j));
    if (j.is_number_unsigned()) {
        const uint64_t v = j.get<uint64_t>();
        EVENEP_CHECK(v <= static_cast<uint64_t>(INT32_MAX), where, ": field ", field, " = ", v, " overflows int32");
        return static_cast<int32_t>(v);
    }
    const int64_t v = j.get<int64_t>();
    EVENEP_CHECK(v >= INT32_MIN && v <= INT32_MAX, where, ": field ", field, " = ", v, " overflows int32");
    return static_cast<int32_t>(v);
}

const Json& json_field(const Json& root, const std::string& where, const char* name) {
    const auto it = root.find(name);
    EVENEP_CHECK(it != root.end(), where, ": missing field \"", name, "\"");
    return *it;
}

// Checks that `j` is an array of `size` entries. (Returns nothing: a reference return with temporary string
// arguments trips GCC 13's -Wdangling-reference.)
void check_json_array(const Json& j, const std::string& where, const std::string& field, size_t size) {
    EVENEP_CHECK(j.is_array(), where, ": field ", field, " must be an array, got ", json_type(j));
    EVENEP_CHECK(j.size() == size, where, ": field ", field, " has ", j.size(), " entries, expected ", size);
}

// --- .npy -------------------------------------------------------------------------------------------------------

struct DtypeInfo {
    std::string descr;  // normalised: "|" for 1-byte types, "<" otherwise
    int itemsize = 0;
};

// Parses a numpy descr ("<i4", "|u1", "<f8", ...). Only little-endian bool/int/uint/float are supported.
DtypeInfo parse_dtype(const std::string& descr, const std::string& where) {
    EVENEP_CHECK(descr.size() >= 3, where, ": unsupported dtype '", descr, "'");
    const char order = descr[0], kind = descr[1];
    EVENEP_CHECK(order != '>', where, ": dtype '", descr, "' is big-endian; only little-endian data is supported");
    EVENEP_CHECK(order == '<' || order == '|', where, ": dtype '", descr, "' has byte order '", order,
                 "'; expected '<' or '|'");
    int size = 0;
    for (size_t i = 2; i < descr.size(); ++i) {
        EVENEP_CHECK(descr[i] >= '0' && descr[i] <= '9' && size < 1000, where, ": unsupported dtype '", descr, "'");
        size = size * 10 + (descr[i] - '0');
    }
    bool ok = false;
    switch (kind) {
        case 'b':
            ok = size == 1;
            break;
        case 'i':
        case 'u':
            ok = size == 1 || size == 2 || size == 4 || size == 8;
            break;
        case 'f':
            ok = size == 2 || size == 4 || size == 8;
            break;
        default:
            ok = false;
    }
    EVENEP_CHECK(ok, where, ": unsupported dtype '", descr,
                 "' (supported: bool, int/uint 1-8 bytes, float 2/4/8 bytes)");
    EVENEP_CHECK(order == '<' || size == 1, where, ": dtype '", descr, "': byte order '|' needs a 1-byte type");
    return DtypeInfo{std::string(1, size == 1 ? '|' : '<') + kind + std::to_string(size), size};
}

// Up to 40 bytes of `text` around `pos` for an error message, control and non-ASCII bytes as \xNN (a header whose
// announced length lies may hold binary data).
std::string excerpt(const std::string& text, size_t pos) {
    const size_t begin = pos > 20 ? pos - 20 : 0, end = std::min(text.size(), begin + 40);
    std::string out = begin > 0 ? "..." : "";
    for (size_t i = begin; i < end; ++i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        char hex[8];
        std::snprintf(hex, sizeof(hex), "\\x%02x", c);
        out += (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? std::string(1, static_cast<char>(c)) : hex;
    }
    return end < text.size() ? out + "..." : out;
}

// The header dict of a .npy file: {'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }
class NpyHeaderParser {
  public:
    NpyHeaderParser(const std::string& text, const std::string& where) : text_(text), where_(where) {}

    void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
        bool have_descr = false, have_order = false, have_shape = false;
        expect('{');
        for (;;) {
            skip_space();
            if (peek() == '}') break;
            const std::string key = parse_string();
            expect(':');
            skip_space();
            if (key == "descr") {
                check(!have_descr, "duplicate key 'descr'");
                check(peek() == '\'' || peek() == '"', "structured dtypes are not supported (descr is not a string)");
                descr = parse_string();
                have_descr = true;
            } else if (key == "fortran_order") {
                check(!have_order, "duplicate key 'fortran_order'");
                fortran_order = parse_bool();
                have_order = true;
            } else if (key == "shape") {
                check(!have_shape, "duplicate key 'shape'");
                shape = parse_shape();
                have_shape = true;
            } else {
                fail("unexpected key '" + key + "'");
            }
            skip_space();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            check(peek() == '}', "expected ',' or '}' after the value of '" + key + "'");
        }
        expect('}');
        skip_space();
        check(pos_ == text_.size(), "trailing characters after the header dict");
        check(have_descr, "missing key 'descr'");
        check(have_order, "missing key 'fortran_order'");
        check(have_shape, "missing key 'shape'");
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        std::ostringstream os;
        os << where_ << ": bad header (" << what << ") at offset " << pos_ << " of " << text_.size()
           << " header bytes, near \"" << excerpt(text_, pos_) << "\"";
        throw Error(ErrorKind::kInvalidArgument, os.str());
    }
    void check(bool cond, const std::string& what) const {
        if (!cond) fail(what);
    }
    char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n')) ++pos_;
    }
    void expect(char c) {
        skip_space();
        check(peek() == c, std::string("expected '") + c + "'");
        ++pos_;
    }
    std::string parse_string() {
        const char quote = peek();
        check(quote == '\'' || quote == '"', "expected a quoted string");
        const size_t end = text_.find(quote, pos_ + 1);
        check(end != std::string::npos, "unterminated string");
        std::string s = text_.substr(pos_ + 1, end - pos_ - 1);
        pos_ = end + 1;
        return s;
    }
    bool parse_bool() {
        if (text_.compare(pos_, 4, "True") == 0) {
            pos_ += 4;
            return true;
        }
        if (text_.compare(pos_, 5, "False") == 0) {
            pos_ += 5;
            return false;
        }
        fail("fortran_order must be True or False");
    }
    std::vector<int64_t> parse_shape() {
        std::vector<int64_t> shape;
        expect('(');
        for (;;) {
            skip_space();
            if (peek() == ')') break;
            check(peek() >= '0' && peek() <= '9', "shape entries must be non-negative integers");
            int64_t v = 0;
            while (peek() >= '0' && peek() <= '9') {
                check(v <= (std::numeric_limits<int64_t>::max() - 9) / 10, "shape entry overflows int64");
                v = v * 10 + (text_[pos_++] - '0');
            }
            if (peek() == 'L') ++pos_;  // Python 2 long suffix
            shape.push_back(v);
            skip_space();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            check(peek() == ')', "expected ',' or ')' in shape");
        }
        expect(')');
        return shape;
    }

    const std::string& text_;
    const std::string& where_;
    size_t pos_ = 0;
};

// Elements of `shape` (throws on overflow past 2^62).
int64_t num_elements(const std::vector<int64_t>& shape, const std::string& where) {
    int64_t n = 1;
    for (int64_t d : shape) {
        EVENEP_CHECK(d >= 0, where, ": negative dimension ", d);
        EVENEP_CHECK(d == 0 || n <= (int64_t{1} << 62) / d, where, ": shape has more than 2^62 elements");
        n *= d;
    }
    return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::ostringstream os;
    os << '(';
    for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    if (shape.size() == 1) os << ',';
    os << ')';
    return os.str();
}

// Routing shape checks shared by the reader and writer.
void check_routing_shape(const std::string& where, int64_t R, int64_t S, int64_t K, int E) {
    EVENEP_CHECK(R >= 1, where, ": R = ", R, " must be >= 1");
    EVENEP_CHECK(S >= 1, where, ": S = ", S, " must be >= 1");
    EVENEP_CHECK(K >= 1 && K <= detail::kMaxTopK, where, ": K = ", K, " must be in [1, ", detail::kMaxTopK, "]");
    EVENEP_CHECK(R * S * K <= INT32_MAX, where, ": R*S*K = ", R * S * K, " overflows int32");
    EVENEP_CHECK(E >= 1, where, ": E = ", E, " must be >= 1");
    EVENEP_CHECK(E % R == 0, where, ": E = ", E, " is not a multiple of R = ", R, " (E % R = ", E % R, ")");
    EVENEP_CHECK(K <= E, where, ": K = ", K, " exceeds E = ", E);
}

const char* source_name(WeightSource w) {
    switch (w) {
        case WeightSource::kEmpty:
            return "empty";
        case WeightSource::kLocal:
            return "local";
        case WeightSource::kSlot:
            return "slot";
        case WeightSource::kPeer:
            return "peer";
    }
    return "unknown";
}

// rows x cols row-major block of `v` starting at 0, as nested JSON arrays.
template <typename T>
OrderedJson matrix(const std::vector<T>& v, size_t rows, size_t cols, const char* field) {
    EVENEP_CHECK(v.size() == rows * cols, "plan JSON: plan.", field, " has ", v.size(), " entries, expected ", rows,
                 " x ", cols);
    OrderedJson out = OrderedJson::array();
    for (size_t r = 0; r < rows; ++r) out.push_back(std::vector<T>(v.begin() + r * cols, v.begin() + (r + 1) * cols));
    return out;
}

}  // namespace

// --- tpe JSON ---------------------------------------------------------------------------------------------------

TpeFile read_tpe_json(const std::string& path) {
    const std::string where = "tpe JSON '" + path + "'";
    const Json root = detail::read_json_file(path, "tpe JSON");
    EVENEP_CHECK(root.is_object(), where, ": top level must be an object, got ", json_type(root));
    TpeFile f;
    f.R = json_int(json_field(root, where, "R"), where, "\"R\"");
    f.E = json_int(json_field(root, where, "E"), where, "\"E\"");
    f.K = json_int(json_field(root, where, "K"), where, "\"K\"");
    f.S = json_int(json_field(root, where, "S"), where, "\"S\"");
    EVENEP_CHECK(f.R >= 1, where, ": field \"R\" = ", f.R, " must be >= 1");
    EVENEP_CHECK(f.E >= 1, where, ": field \"E\" = ", f.E, " must be >= 1");
    EVENEP_CHECK(f.E % f.R == 0, where, ": field \"E\" = ", f.E, " is not a multiple of \"R\" = ", f.R,
                 " (E % R = ", f.E % f.R, ")");
    EVENEP_CHECK(f.K >= 1 && f.K <= detail::kMaxTopK, where, ": field \"K\" = ", f.K, " must be in [1, ",
                 detail::kMaxTopK, "]");
    EVENEP_CHECK(f.K <= f.E, where, ": field \"K\" = ", f.K, " exceeds \"E\" = ", f.E);
    EVENEP_CHECK(f.S >= 1, where, ": field \"S\" = ", f.S, " must be >= 1");

    const Json& s = json_field(root, where, "s");
    check_json_array(s, where, "\"s\"", f.R);
    f.s.resize(f.R);
    for (int r = 0; r < f.R; ++r) {
        const std::string field = "\"s\"[" + std::to_string(r) + "]";
        f.s[r] = json_int(s[r], where, field);
        EVENEP_CHECK(f.s[r] >= 1 && f.s[r] <= f.S, where, ": field ", field, " = ", f.s[r], " outside [1, S = ", f.S,
                     "]");
    }
    const Json& tpe = json_field(root, where, "tpe");
    check_json_array(tpe, where, "\"tpe\"", f.R);
    f.tpe.resize(static_cast<size_t>(f.R) * f.E);
    for (int r = 0; r < f.R; ++r) {
        const Json& row = tpe[r];
        check_json_array(row, where, "\"tpe\"[" + std::to_string(r) + "]", f.E);
        int64_t sum = 0;
        for (int e = 0; e < f.E; ++e) {
            const std::string field = "\"tpe\"[" + std::to_string(r) + "][" + std::to_string(e) + "]";
            const int32_t v = json_int(row[e], where, field);
            EVENEP_CHECK(v >= 0, where, ": field ", field, " = ", v, " is negative");
            f.tpe[static_cast<size_t>(r) * f.E + e] = v;
            sum += v;
        }
        EVENEP_CHECK(sum <= static_cast<int64_t>(f.s[r]) * f.K, where, ": field \"tpe\"[", r, "] sums to ", sum,
                     " entries, more than s[", r, "]*K = ", static_cast<int64_t>(f.s[r]) * f.K);
    }
    return f;
}

void write_tpe_json(const std::string& path, const TpeFile& f) {
    const std::string where = "tpe JSON '" + path + "'";
    EVENEP_CHECK(f.R >= 1 && f.E >= 1 && f.E % f.R == 0, where, ": R = ", f.R, ", E = ", f.E,
                 " (need R, E >= 1 and E % R == 0)");
    EVENEP_CHECK(f.s.size() == static_cast<size_t>(f.R), where, ": s has ", f.s.size(), " entries, expected R = ", f.R);
    EVENEP_CHECK(f.tpe.size() == static_cast<size_t>(f.R) * f.E, where, ": tpe has ", f.tpe.size(),
                 " entries, expected R*E = ", static_cast<int64_t>(f.R) * f.E);
    // One rank per line; valid JSON that stays readable for large E.
    std::ostringstream os;
    os << "{\"R\": " << f.R << ", \"E\": " << f.E << ", \"K\": " << f.K << ", \"S\": " << f.S << ",\n \"s\": [";
    for (int r = 0; r < f.R; ++r) os << (r ? ", " : "") << f.s[r];
    os << "],\n \"tpe\": [\n";
    for (int r = 0; r < f.R; ++r) {
        os << "  [";
        for (int e = 0; e < f.E; ++e) os << (e ? ", " : "") << f.tpe[static_cast<size_t>(r) * f.E + e];
        os << (r + 1 < f.R ? "],\n" : "]\n");
    }
    os << " ]}\n";
    write_file(path, "tpe JSON", os.str(), nullptr, 0);
}

// --- .npy -------------------------------------------------------------------------------------------------------

NpyArray read_npy(const std::string& path) {
    const std::string where = ".npy '" + path + "'";
    const std::vector<char> bytes = read_file(path, ".npy", kMaxInputFileBytes);
    EVENEP_CHECK(bytes.size() >= kNpyMagicBytes + 2 && std::memcmp(bytes.data(), kNpyMagic, kNpyMagicBytes) == 0, where,
                 ": bad magic (not a NumPy .npy file)");
    const int major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
    EVENEP_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, where, ": unsupported format version ", major,
                 ".", minor, " (supported: 1.0, 2.0, 3.0)");
    const size_t len_bytes = major == 1 ? 2 : 4;
    const size_t prefix = kNpyMagicBytes + 2 + len_bytes;
    EVENEP_CHECK(bytes.size() >= prefix, where, ": truncated before the header length");
    size_t header_len = 0;
    for (size_t i = 0; i < len_bytes; ++i)
        header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[kNpyMagicBytes + 2 + i])) << (8 * i);
    EVENEP_CHECK(header_len <= kNpyMaxHeaderBytes, where, ": header length ", header_len,
                 " bytes announced, more than any .npy header (limit ", kNpyMaxHeaderBytes, "); corrupt file?");
    EVENEP_CHECK(bytes.size() >= prefix + header_len, where, ": truncated header (", header_len,
                 " header bytes announced, ", bytes.size() - prefix, " present)");
    const std::string header(bytes.data() + prefix, header_len);

    std::string descr;
    bool fortran_order = false;
    NpyArray out;
    NpyHeaderParser(header, where).parse(descr, fortran_order, out.shape);
    const DtypeInfo dtype = parse_dtype(descr, where);
    out.dtype = dtype.descr;
    EVENEP_CHECK(!fortran_order, where, ": fortran_order True is not supported (save a C-order array, e.g. ",
                 "np.save(path, np.ascontiguousarray(a)))");
    const int64_t count = num_elements(out.shape, where);
    EVENEP_CHECK(count <= std::numeric_limits<int64_t>::max() / dtype.itemsize, where, ": array too large");
    const size_t data_bytes = static_cast<size_t>(count) * dtype.itemsize;
    const size_t present = bytes.size() - prefix - header_len;
    EVENEP_CHECK(present >= data_bytes, where, ": truncated data: shape ", shape_string(out.shape), " of ", out.dtype,
                 " needs ", data_bytes, " bytes, file has ", present);
    EVENEP_CHECK(present == data_bytes, where, ": ", present - data_bytes, " unexpected trailing bytes after the ",
                 data_bytes, " data bytes");
    out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(prefix + header_len), bytes.end());
    return out;
}

void write_npy(const std::string& path,
               const std::string& dtype,
               const std::vector<int64_t>& shape,
               const void* data,
               size_t num_bytes) {
    const std::string where = ".npy '" + path + "'";
    const DtypeInfo info = parse_dtype(dtype, where);
    const int64_t count = num_elements(shape, where);
    EVENEP_CHECK(static_cast<uint64_t>(count) * info.itemsize == num_bytes, where, ": shape ", shape_string(shape),
                 " of ", info.descr, " needs ", count * info.itemsize, " bytes, got ", num_bytes);
    EVENEP_CHECK(data != nullptr || num_bytes == 0, where, ": data is null");
    std::string dict =
        "{'descr': '" + info.descr + "', 'fortran_order': False, 'shape': " + shape_string(shape) + ", }";
    // Version 1.0 stores a 16-bit header length; fall back to 2.0 (32-bit) for very long shapes.
    const size_t unpadded_v1 = kNpyMagicBytes + 2 + 2 + dict.size() + 1;
    const bool v1 = detail::align_up(unpadded_v1, kNpyAlign) - (kNpyMagicBytes + 4) <= 0xFFFF;
    const size_t len_bytes = v1 ? 2 : 4;
    const size_t prefix = kNpyMagicBytes + 2 + len_bytes;
    const size_t total = detail::align_up(prefix + dict.size() + 1, kNpyAlign);
    dict.append(total - prefix - dict.size() - 1, ' ');
    dict.push_back('\n');
    std::string head(kNpyMagic, kNpyMagicBytes);
    head.push_back(static_cast<char>(v1 ? 1 : 2));
    head.push_back(0);
    for (size_t i = 0; i < len_bytes; ++i) head.push_back(static_cast<char>((dict.size() >> (8 * i)) & 0xFF));
    head += dict;
    write_file(path, ".npy", head, data, num_bytes);
}

// --- routing .npy -------------------------------------------------------------------------------------------------

Routing read_routing_npy(const std::string& path, int E, bool trim_masked_tail) {
    const std::string where = "routing .npy '" + path + "'";
    const NpyArray a = read_npy(path);
    EVENEP_CHECK(a.dtype == "<i4" || a.dtype == "<i8", where, ": dtype '", a.dtype,
                 "' is not int32 ('<i4') or int64 ('<i8')");
    EVENEP_CHECK(a.shape.size() == 3, where, ": shape ", shape_string(a.shape), " is not [R, S, K]");
    const int64_t R = a.shape[0], S = a.shape[1], K = a.shape[2];
    check_routing_shape(where, R, S, K, E);

    Routing out;
    out.R = static_cast<int>(R);
    out.E = E;
    out.K = static_cast<int>(K);
    out.S = static_cast<int>(S);
    out.s.assign(R, static_cast<int32_t>(S));
    out.topk_idx.resize(R);
    const bool wide = a.dtype == "<i8";
    for (int64_t r = 0; r < R; ++r) {
        auto& ids = out.topk_idx[r];
        ids.resize(static_cast<size_t>(S * K));
        int64_t last_used = -1;  // last token with an unmasked entry
        for (int64_t i = 0; i < S * K; ++i) {
            const size_t flat = static_cast<size_t>(r * S * K + i);
            int64_t v;
            if (wide) {
                std::memcpy(&v, a.data.data() + flat * 8, 8);
            } else {
                int32_t v32;
                std::memcpy(&v32, a.data.data() + flat * 4, 4);
                v = v32;
            }
            EVENEP_CHECK(v == -1 || (v >= 0 && v < E), where, ": rank ", r, ", token ", i / K, ", k ", i % K,
                         ": expert id ", v, " outside [0, E = ", E, ") (use -1 to mask)");
            ids[i] = static_cast<int32_t>(v);
            if (v != -1) last_used = i / K;
        }
        if (trim_masked_tail) {
            const int64_t s = std::max<int64_t>(last_used + 1, 1);
            out.s[r] = static_cast<int32_t>(s);
            ids.resize(static_cast<size_t>(s * K));
        }
    }
    return out;
}

void write_routing_npy(const std::string& path, const Routing& routing) {
    const std::string where = "routing .npy '" + path + "'";
    check_routing_shape(where, routing.R, routing.S, routing.K, routing.E);
    (void)routing.tpe();  // checks s, the topk_idx sizes and every id (naming rank, token, k)
    const size_t S = routing.S, K = routing.K;
    std::vector<int32_t> flat(static_cast<size_t>(routing.R) * S * K, -1);
    for (int r = 0; r < routing.R; ++r)
        std::copy(routing.topk_idx[r].begin(), routing.topk_idx[r].end(), flat.begin() + r * S * K);
    write_npy(path, "<i4", {routing.R, routing.S, routing.K}, flat.data(), flat.size() * sizeof(int32_t));
}

// --- plan JSON --------------------------------------------------------------------------------------------------

std::string plan_to_json(const Plan& plan, const std::vector<std::vector<int32_t>>& dst, int indent) {
    const Config& cfg = plan.cfg;
    const size_t R = cfg.R;
    OrderedJson j;
    j["schema"] = kPlanSchema;
    j["planner"] = std::string(to_string(plan.mode));
    j["config"] = {{"R", cfg.R},       {"E", cfg.E},           {"K", cfg.K},   {"S", cfg.S},
                   {"epn", cfg.epn()}, {"B", cfg.num_slots()}, {"tp", cfg.tp}, {"NvS", cfg.recv_rows()}};
    if (cfg.slack_ppm() != 0) j["config"]["slack"] = cfg.slack;  // absent = 0: the files without slack stay as they were
    // The auto policy (docs/auto.md): config.slack is then the largest budget, slack_ppm the one this plan chose.
    if (cfg.policy == PlannerPolicy::kAuto) {
        j["config"]["policy"] = std::string(to_string(cfg.policy));
        j["slack_ppm"] = plan.slack_ppm;
    }
    // The arrays of the one list (evenep::for_each_array): [R] arrays as vectors, the others as row-major matrices.
    OrderedJson per_rank = OrderedJson::object();
    for_each_array(plan, [&](const char* name, PlanExtent x, const auto& v, PlanJson where) {
        if (where == PlanJson::kNone) return;
        const size_t n = plan_extent_size(cfg, x);
        EVENEP_CHECK(v.size() == n, "plan JSON: plan.", name, " has ", v.size(), " entries, expected ", n);
        const size_t rows = x == PlanExtent::kER ? cfg.E : x == PlanExtent::kE ? 1 : R;
        OrderedJson out;
        if constexpr (std::is_same_v<typename std::decay_t<decltype(v)>::value_type, WeightSource>) {
            out = OrderedJson::array();
            for (size_t r = 0; r < rows; ++r) {
                OrderedJson row = OrderedJson::array();
                for (size_t c = 0; c < n / rows; ++c) row.push_back(source_name(v[r * (n / rows) + c]));
                out.push_back(std::move(row));
            }
        } else if (x == PlanExtent::kR || x == PlanExtent::kE) {
            out = OrderedJson(v);
        } else {
            out = matrix(v, rows, n / rows, name);
        }
        (where == PlanJson::kTop ? j : per_rank)[name] = std::move(out);
    });
    j["cost"] = {{"max_rank_copy_traffic", plan.cost.max_rank_copy_traffic},
                 {"total_copies", plan.cost.total_copies},
                 {"crossing_rows", plan.cost.crossing_rows},
                 {"moved_entries", plan.cost.moved_entries},
                 {"copy_critical_path", plan.cost.copy_critical_path},
                 {"direct_critical_path", plan.cost.direct_critical_path}};
    j["per_rank"] = std::move(per_rank);
    if (!dst.empty()) {
        EVENEP_CHECK(dst.size() == R, "plan JSON: dst has ", dst.size(), " ranks, expected R = ", R);
        for (size_t r = 0; r < R; ++r)
            EVENEP_CHECK(dst[r].size() == static_cast<size_t>(plan.s[r]) * cfg.K, "plan JSON: dst[", r, "] has ",
                         dst[r].size(), " entries, expected s*K = ", static_cast<int64_t>(plan.s[r]) * cfg.K);
        j["dst"] = dst;
    }
    return j.dump(indent);
}

}  // namespace evenep
