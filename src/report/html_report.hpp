// One self-contained HTML file from sections (headings, paragraphs, tables, inline SVG charts):
// inline CSS, no scripts, no external resources, so a report can be mailed or archived as one file.
// The output is also well-formed XML (XHTML syntax), which keeps it checkable by an XML parser.
#pragma once

#include <string>
#include <vector>

namespace hanpu::report {

class HtmlReport {
 public:
  explicit HtmlReport(std::string title);

  /// A section heading; level 2..4 (level 1 is the report title).
  void heading(const std::string& text, int level = 2);
  /// A paragraph of plain text (escaped; blank lines do not split it).
  void paragraph(const std::string& text);
  /// A bulleted list of plain-text items.
  void list(const std::vector<std::string>& items);
  /// A table; every row must have header.size() cells (hanpu::Error otherwise). Cells that read as
  /// numbers are right-aligned.
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
             const std::string& caption = "");
  /// An SVG chart as produced by svg_chart.hpp (inserted verbatim; it must start with "<svg").
  void svg(const std::string& svg_markup, const std::string& caption = "");
  /// Preformatted text (escaped), e.g. a command line or a small JSON excerpt.
  void preformatted(const std::string& text);

  std::string html() const;
  /// Writes html() to `path`; throws hanpu::Error naming the path if it cannot be written.
  void write(const std::string& path) const;

 private:
  std::string title_;
  std::vector<std::string> body_;
};

}  // namespace hanpu::report
