// HtmlReport: sections collected as escaped HTML fragments, wrapped in one page with inline CSS.
#include "report/html_report.hpp"
#include "io/file_io.hpp"

#include <cstdlib>
#include <fstream>

#include "hanpu/tensor.hpp"
#include "report/svg_chart.hpp"

namespace hanpu::report {

namespace {

/// True for a bare number, optionally followed by '%' or 'x' ("12", "-0.5", "1.2e3", "3.1x"), so
/// numeric columns line up on the right while text columns stay left-aligned.
bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  std::string t = s;
  if (t.back() == '%' || t.back() == 'x') t.pop_back();
  char* end = nullptr;
  std::strtod(t.c_str(), &end);
  return end && end != t.c_str() && *end == '\0';
}

const char* kStyle = R"(body{font-family:Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#1a1a1a;line-height:1.45}
h1{font-size:24px;border-bottom:2px solid #4e79a7;padding-bottom:4px}
h2{font-size:19px;margin-top:32px}h3{font-size:16px}h4{font-size:14px}
table{border-collapse:collapse;margin:8px 0 16px 0;font-size:13px}
th,td{border:1px solid #d0d0d0;padding:3px 8px;text-align:left}th{background:#f0f3f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}
caption{caption-side:bottom;font-size:12px;color:#555;padding-top:4px;text-align:left}
figure{margin:12px 0 20px 0}figcaption{font-size:12px;color:#555}
svg.chart{max-width:100%;height:auto}
div.row{display:flex;flex-wrap:wrap;gap:8px 16px;margin:12px 0 20px 0}div.row figure{margin:0}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}
)";

}  // namespace

HtmlReport::HtmlReport(std::string title) : title_(std::move(title)) {}

void HtmlReport::heading(const std::string& text, int level) {
  // Strings built piecewise here: GCC 12 warns (-Wrestrict, a known false positive) on
  // "literal" + std::to_string(...) chains.
  std::string tag = "h";
  tag += std::to_string(level);
  if (level < 2 || level > 4) {
    std::string msg = "HtmlReport: heading level ";
    msg += std::to_string(level);
    throw Error(msg + ", expected 2..4");
  }
  std::string s = "<";
  s += tag;
  s += '>';
  s += xml_escape(text);
  s += "</";
  s += tag;
  s += ">\n";
  body_.push_back(std::move(s));
}

void HtmlReport::paragraph(const std::string& text) { body_.push_back("<p>" + xml_escape(text) + "</p>\n"); }

void HtmlReport::list(const std::vector<std::string>& items) {
  std::string s = "<ul>\n";
  for (const std::string& i : items) s += "<li>" + xml_escape(i) + "</li>\n";
  body_.push_back(s + "</ul>\n");
}

void HtmlReport::table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                       const std::string& caption) {
  if (header.empty()) throw Error("HtmlReport: table without columns");
  std::string s = "<table>\n";
  if (!caption.empty()) s += "<caption>" + xml_escape(caption) + "</caption>\n";
  s += "<thead><tr>";
  for (const std::string& h : header) s += "<th>" + xml_escape(h) + "</th>";
  s += "</tr></thead>\n<tbody>\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].size() != header.size())
      throw Error("HtmlReport: table row " + std::to_string(r) + " has " + std::to_string(rows[r].size()) +
                  " cells, expected " + std::to_string(header.size()) + " (one per column)");
    s += "<tr>";
    for (const std::string& c : rows[r])
      s += (looks_numeric(c) ? "<td class=\"num\">" : "<td>") + xml_escape(c) + "</td>";
    s += "</tr>\n";
  }
  body_.push_back(s + "</tbody>\n</table>\n");
}

void HtmlReport::svg(const std::string& svg_markup, const std::string& caption) {
  if (svg_markup.rfind("<svg", 0) != 0) throw Error("HtmlReport: svg(): markup does not start with <svg");
  std::string s = "<figure>\n" + svg_markup;
  if (!caption.empty()) s += "<figcaption>" + xml_escape(caption) + "</figcaption>\n";
  body_.push_back(s + "</figure>\n");
}

void HtmlReport::svg_row(const std::vector<std::string>& svg_markups) {
  std::string s = "<div class=\"row\">\n";
  for (const std::string& m : svg_markups) {
    if (m.rfind("<svg", 0) != 0) throw Error("HtmlReport: svg_row(): markup does not start with <svg");
    s += "<figure>\n" + m + "</figure>\n";
  }
  body_.push_back(s + "</div>\n");
}

void HtmlReport::preformatted(const std::string& text) { body_.push_back("<pre>" + xml_escape(text) + "</pre>\n"); }

std::string HtmlReport::html() const {
  std::string s = "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n"
                  "<meta charset=\"utf-8\"/>\n<title>" +
                  xml_escape(title_) + "</title>\n<style>\n" + kStyle + "</style>\n</head>\n<body>\n<h1>" +
                  xml_escape(title_) + "</h1>\n";
  for (const std::string& b : body_) s += b;
  return s + "</body>\n</html>\n";
}

void HtmlReport::write(const std::string& path) const {
  write_file_atomic(path, html());  // io/file_io.hpp: temp file, fsync, rename
}

}  // namespace hanpu::report
