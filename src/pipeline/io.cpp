// Cost and image files, the evenep.pipeline/1 JSON and the SVG timeline (include/evenep/pipeline.hpp,
// docs/pipeline.md).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "evenep/detail/json_input.hpp"
#include "evenep/error.hpp"
#include "evenep/pipeline.hpp"

namespace evenep::pipeline {
namespace {

using nlohmann::json;

// The file through the one input helper (regular files only, size limit, duplicate keys refused).
json parse_file(const std::string& path, const char* what) {
    return evenep::detail::read_json_file(path, std::string("pipeline: ") + what);
}

double number(const json& v, const std::string& path, const std::string& where) {
    EVENEP_CHECK(v.is_number(), "pipeline: '", path, "': ", where, " must be a number, got ", v.dump());
    const double x = v.get<double>();
    EVENEP_CHECK(std::isfinite(x) && x >= 0, "pipeline: '", path, "': ", where, " = ", x, " must be >= 0");
    return x;
}

}  // namespace

void read_costs_file(const std::string& path, PipelineConfig& cfg) {
    const json j = parse_file(path, "--costs");
    EVENEP_CHECK(j.is_object(), "pipeline: '", path, "': expected an object with forward / backward / latency");
    for (const auto& [key, value] : j.items())
        EVENEP_CHECK(key == "forward" || key == "backward" || key == "latency", "pipeline: '", path,
                     "': unknown key '", key, "' (expected forward, backward, latency)");
    for (const char* key : {"forward", "backward"}) {
        if (!j.contains(key)) continue;
        std::vector<double>& out = std::string(key) == "forward" ? cfg.forward : cfg.backward;
        const json& v = j[key];
        out.clear();
        if (v.is_array()) {
            EVENEP_CHECK(v.size() == static_cast<size_t>(cfg.m), "pipeline: '", path, "': ", key, " has ", v.size(),
                         " values, expected m = ", cfg.m);
            for (size_t i = 0; i < v.size(); ++i) out.push_back(number(v[i], path, fmt::format("{}[{}]", key, i)));
        } else {
            out.assign(cfg.m, number(v, path, key));
        }
    }
    if (j.contains("latency")) cfg.latency = number(j["latency"], path, "latency");
}

ImagesFile read_images_file(const std::string& path, int m) {
    const json j = parse_file(path, "--images");
    EVENEP_CHECK(j.is_object() && (j.contains("patches") != j.contains("vit_forward")), "pipeline: '", path,
                 "': expected an object with exactly one of \"patches\" or \"vit_forward\"");
    const bool patches = j.contains("patches");
    const char* key = patches ? "patches" : "vit_forward";
    const json& rows = j[key];
    EVENEP_CHECK(rows.is_array() && rows.size() == static_cast<size_t>(m), "pipeline: '", path, "': ", key,
                 " must be an array of m = ", m, " micro-batches, got ",
                 rows.is_array() ? std::to_string(rows.size()) + " entries" : rows.type_name());
    ImagesFile out;
    for (size_t i = 0; i < rows.size(); ++i) {
        EVENEP_CHECK(rows[i].is_array(), "pipeline: '", path, "': ", key, "[", i, "] must be an array");
        if (patches) out.patches.emplace_back();
        else out.vit_forward.emplace_back();
        for (size_t p = 0; p < rows[i].size(); ++p) {
            const std::string where = fmt::format("{}[{}][{}]", key, i, p);
            if (patches) {
                EVENEP_CHECK(rows[i][p].is_number_integer() && rows[i][p].get<int64_t>() >= 1, "pipeline: '", path,
                             "': ", where, " = ", rows[i][p].dump(), " must be a patch count >= 1");
                out.patches.back().push_back(rows[i][p].get<int64_t>());
            } else {
                out.vit_forward.back().push_back(number(rows[i][p], path, where));
            }
        }
    }
    return out;
}

std::string schedule_json(const PipelineConfig& cfg, const Schedule& s, const std::string& policy) {
    json ops = json::array();
    for (const Op& op : s.ops)
        ops.push_back({{"rank", op.rank},
                       {"kind", to_string(op.kind)},
                       {"mb", op.mb},
                       {"chunk", op.chunk},
                       {"part", op.part},
                       {"start", op.start},
                       {"end", op.end}});
    const json j = {{"schema", "evenep.pipeline/1"},
                    {"P", cfg.P},
                    {"m", cfg.m},
                    {"V", cfg.V},
                    {"latency", cfg.latency},
                    {"policy", policy},
                    {"ops", ops},
                    {"makespan", s.makespan},
                    {"bubble_fraction", s.bubble_fraction}};
    return j.dump(1) + "\n";
}

std::string schedule_svg(const PipelineConfig& cfg, const Schedule& s, const std::string& title) {
    constexpr double kWidth = 960, kLeft = 64, kRight = 16, kTop = 58, kRow = 30, kGap = 6;
    const double span = std::max(s.makespan, 1e-9);
    const double scale = (kWidth - kLeft - kRight) / span;
    const double height = kTop + cfg.P * (kRow + kGap) + 34;
    std::string out = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
        "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{}\" y=\"18\" font-size=\"14\">{}</text>\n",
        kWidth, height, kWidth, height, kLeft, title);
    // Legend.
    const auto legend = [&](double x, const char* fill, const char* label) {
        out += fmt::format("<rect x=\"{}\" y=\"28\" width=\"14\" height=\"12\" fill=\"{}\" stroke=\"#444\" "
                           "stroke-width=\"0.5\"/><text x=\"{}\" y=\"38\">{}</text>\n",
                           x, fill, x + 18, label);
    };
    legend(kLeft, "hsl(210,70%,75%)", "forward (light)");
    legend(kLeft + 120, "hsl(210,70%,45%)", "backward (dark)");
    legend(kLeft + 240, "#f08080", "ViT forward");
    legend(kLeft + 340, "#b22222", "ViT backward");
    legend(kLeft + 450, "white", "bubble (idle)");
    for (int r = 0; r < cfg.P; ++r) {
        const double y = kTop + r * (kRow + kGap);
        out += fmt::format("<text x=\"8\" y=\"{:.1f}\">rank {}</text>\n<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                           "height=\"{}\" fill=\"white\" stroke=\"#999\" stroke-width=\"0.5\"/>\n",
                           y + kRow * 0.65, r, kLeft, y, span * scale, kRow);
    }
    for (const Op& op : s.ops) {
        const double x = kLeft + op.start * scale, w = (op.end - op.start) * scale;
        const double y = kTop + op.rank * (kRow + kGap);
        if (w <= 0) continue;
        std::string fill;
        if (op.kind == OpKind::kVitForward) fill = "#f08080";
        else if (op.kind == OpKind::kVitBackward) fill = "#b22222";
        else {
            // Hue by micro-batch (blue to green), lightness: forward light, backward dark; the virtual chunk
            // shifts the lightness a little so chunks of one rank are told apart.
            const int hue = 200 + (cfg.m > 1 ? (op.mb * 140) / (cfg.m - 1) : 0) % 360;
            const int v = op.chunk / cfg.P;
            const int light = (op.kind == OpKind::kForward ? 78 : 42) - (cfg.V > 1 ? v * 10 / (cfg.V - 1) : 0);
            fill = fmt::format("hsl({},65%,{}%)", hue % 360, light);
        }
        out += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"#333\" "
                           "stroke-width=\"0.3\"><title>{} mb {} {} {} [{:.3f}, {:.3f})</title></rect>\n",
                           x, y, w, kRow, fill, to_string(op.kind), op.mb, op.chunk >= 0 ? "chunk" : "part",
                           op.chunk >= 0 ? op.chunk : op.part, op.start, op.end);
        if (w >= 14 && (op.kind == OpKind::kForward || op.kind == OpKind::kBackward))
            out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\" fill=\"{}\">{}"
                               "</text>\n",
                               x + w / 2, y + kRow * 0.62, op.kind == OpKind::kForward ? "#222" : "white", op.mb);
    }
    const double ya = kTop + cfg.P * (kRow + kGap) + 14;
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\">0</text><text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">"
                       "makespan {:.2f}</text>\n</svg>\n",
                       kLeft, ya, kWidth - kRight, ya, s.makespan);
    return out;
}

}  // namespace evenep::pipeline
