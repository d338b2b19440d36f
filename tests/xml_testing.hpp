// An independent XML parser (expat) for tests of SVG/HTML output: the whole document as a flat list
// of elements (name, attributes, direct text, depth), or the parser's error.
#pragma once

#include <expat.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace hanpu::report {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // character data directly inside the element
  int depth = 0;
  double num(const std::string& a) const { return std::stod(attrs.at(a)); }
  bool has_class(const std::string& c) const {
    auto it = attrs.find("class");
    return it != attrs.end() && it->second == c;
  }
};

struct Parsed {
  std::string error;  // empty when well-formed
  std::vector<Element> elements;
  std::vector<const Element*> with_class(const std::string& c) const {
    std::vector<const Element*> out;
    for (const Element& e : elements)
      if (e.has_class(c)) out.push_back(&e);
    return out;
  }
  std::vector<const Element*> named(const std::string& n) const {
    std::vector<const Element*> out;
    for (const Element& e : elements)
      if (e.name == n) out.push_back(&e);
    return out;
  }
};

struct ParseState {
  Parsed* out;
  std::vector<size_t> open;
};

inline Parsed parse_xml(const std::string& xml) {
  Parsed p;
  ParseState st{&p, {}};
  XML_Parser parser = XML_ParserCreate(nullptr);
  XML_SetUserData(parser, &st);
  XML_SetElementHandler(
      parser,
      [](void* ud, const XML_Char* name, const XML_Char** atts) {
        auto* s = static_cast<ParseState*>(ud);
        Element e;
        e.name = name;
        e.depth = static_cast<int>(s->open.size());
        for (int i = 0; atts[i]; i += 2) e.attrs[atts[i]] = atts[i + 1];
        s->open.push_back(s->out->elements.size());
        s->out->elements.push_back(std::move(e));
      },
      [](void* ud, const XML_Char*) { static_cast<ParseState*>(ud)->open.pop_back(); });
  XML_SetCharacterDataHandler(parser, [](void* ud, const XML_Char* s, int len) {
    auto* st = static_cast<ParseState*>(ud);
    if (!st->open.empty()) st->out->elements[st->open.back()].text.append(s, static_cast<size_t>(len));
  });
  if (XML_Parse(parser, xml.data(), static_cast<int>(xml.size()), 1) == XML_STATUS_ERROR)
    p.error = std::string(XML_ErrorString(XML_GetErrorCode(parser))) + " at line " +
              std::to_string(XML_GetCurrentLineNumber(parser));
  XML_ParserFree(parser);
  return p;
}

inline Parsed parse_ok(const std::string& xml) {
  Parsed p = parse_xml(xml);
  EXPECT_EQ(p.error, "") << xml.substr(0, 2000);
  return p;
}

inline bool has_text(const Parsed& p, const std::string& text) {
  for (const Element& e : p.elements)
    if (e.text == text) return true;
  return false;
}

}  // namespace hanpu::report
