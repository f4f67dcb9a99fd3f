// Strict JSON inputs (include/evenep/detail/json_input.hpp): positions on every parse error, duplicate keys refused.
#include "evenep/detail/json_input.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "evenep/error.hpp"

namespace evenep::detail {
namespace {

using Json = nlohmann::json;

// nlohmann::json's DOM parser plus two things it lacks: where a parse failed (a number overflow such as 1e400
// otherwise surfaces as an out_of_range exception without a position) and a refusal of a key given twice in one
// object (it would keep the last value silently). sax_parse is a template over the handler, so these members hide
// the base class's.
class StrictDomParser : public nlohmann::detail::json_sax_dom_parser<Json> {
    using Base = nlohmann::detail::json_sax_dom_parser<Json>;

  public:
    explicit StrictDomParser(Json& root) : Base(root, false) {}

    bool start_object(std::size_t n) {
        keys_.emplace_back();
        parents_.push_back(last_key_);
        return Base::start_object(n);
    }
    bool end_object() {
        keys_.pop_back();
        last_key_ = parents_.back();  // a sibling object in the same array has the same parent
        parents_.pop_back();
        return Base::end_object();
    }
    bool key(Json::string_t& k) {
        if (!keys_.back().insert(k).second) {
            duplicate = k;
            duplicate_parent = parents_.back();
            return false;  // stops the parse; sax_parse returns false
        }
        last_key_ = k;
        return Base::key(k);
    }
    bool parse_error(std::size_t position, const std::string& token, const Json::exception& e) {
        failure = {position, token, e.what(), e.id};
        return false;
    }

    struct Failure {
        std::size_t position = 0;  // bytes read, i.e. the end of the failing token
        std::string token, what;
        int id = 0;  // nlohmann's error id: 406 = number out of range
    } failure;
    std::string duplicate, duplicate_parent;

  private:
    std::vector<std::unordered_set<std::string>> keys_;  // per open object
    std::vector<std::string> parents_;                   // the key each open object was the value of ("" at the top)
    std::string last_key_;
};

// `s` shortened for a message, control bytes as \xNN.
std::string shown(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < 40; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c >= 0x7f) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "\\x%02x", c);
            out += hex;
        } else {
            out += s[i];
        }
    }
    return s.size() > 40 ? out + "..." : out;
}

}  // namespace

Json parse_json_strict(std::string_view text, const std::string& where) {
    Json root;
    StrictDomParser sax(root);
    if (Json::sax_parse(text.begin(), text.end(), &sax)) return root;
    EVENEP_CHECK(sax.duplicate.empty(), where, ": duplicate key \"", shown(sax.duplicate), "\"",
                 sax.duplicate_parent.empty() ? std::string(" in the top-level object")
                                              : " in the object of \"" + shown(sax.duplicate_parent) + "\"",
                 " (JSON readers disagree on which value wins; give each key once)");
    int64_t line = 1, column = 0;  // of the end of the failing token
    for (size_t i = 0; i < std::min(sax.failure.position, text.size()); ++i)
        text[i] == '\n' ? (++line, column = 0) : ++column;
    EVENEP_CHECK(sax.failure.id != 406, where, ": line ", line, ", column ", column, ": number ",
                 shown(sax.failure.token), " is out of range of a double");
    EVENEP_CHECK(false, where, ": ", sax.failure.what);  // nlohmann's text: "parse error at line L, column C: ..."
    return root;
}

Json read_json_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
    const std::string text = read_input_file(path, what, max_bytes);
    return parse_json_strict(text, std::string(what) + " '" + path + "'");
}

}  // namespace evenep::detail
