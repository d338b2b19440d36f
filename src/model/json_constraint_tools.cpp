// Tool-call grammar, automaton and mask (json_constraint_tools.hpp). The formats are the ones the
// templates render for past calls (Qwen3.5's and Qwen3-Next's chat templates, Kimi's
// tokenizer_config chat template); the parsers they must satisfy are in chat_output.cpp.
#include "json_constraint_tools.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "hanpu/tokenizer.hpp"

namespace hanpu {

namespace {

using ojson = nlohmann::ordered_json;
using Kind = ToolCallGrammar::Kind;
using Node = ToolCallGrammar::Node;
using Option = ToolCallGrammar::Option;

constexpr int64_t kInfinite = int64_t{1} << 40;
int64_t sat_add(int64_t a, int64_t b) { return std::min(a + b, kInfinite); }  // a, b <= kInfinite
constexpr int32_t kMaxDigits = 6;       // Kimi's call index
constexpr size_t kMaxPatterns = 64;     // an XML string parameter's enum values / format patterns
constexpr int kMaxRefDepth = 32;

// Names every format carries without escaping, and that every parser cuts where the name ends
// ('"', '>', ':' and the markers cannot occur in them). OpenAI and Anthropic require
// ^[a-zA-Z0-9_-]{1,64}$ of tool names anyway.
bool plain_name(const std::string& s) {
  if (s.empty() || s.size() > 256) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return false;
  return true;
}

// A substring matcher as a table (Knuth-Morris-Pratt's automaton): state k = the first k bytes
// of `s` are the end of what was fed; state s.size() = found.
std::vector<std::array<uint8_t, 256>> substring_dfa(const std::string& s) {
  std::vector<std::array<uint8_t, 256>> d(s.size() + 1);
  d[0].fill(0);
  d[0][static_cast<uint8_t>(s[0])] = 1;
  size_t x = 0;  // the state the text would be in without its first byte
  for (size_t k = 1; k <= s.size(); ++k) {
    d[k] = d[x];
    if (k < s.size()) {
      d[k][static_cast<uint8_t>(s[k])] = static_cast<uint8_t>(k + 1);
      x = d[x][static_cast<uint8_t>(s[k])];
    }
  }
  return d;
}

bool string_only(const ojson& s, const ojson& root, int depth) {
  if (depth > kMaxRefDepth || !s.is_object()) return false;
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) return false;
    const std::string target = s["$ref"].get<std::string>();
    if (target == "#") return string_only(root, root, depth + 1);
    if (target.rfind("#/", 0) != 0) return false;
    try {
      return string_only(root.at(ojson::json_pointer(target.substr(1))), root, depth + 1);
    } catch (const std::exception&) {
      return false;
    }
  }
  if (s.contains("allOf")) {
    const ojson& a = s["allOf"];
    return a.is_array() && a.size() == 1 && string_only(a[0], root, depth + 1);
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      const ojson& a = s[key];
      if (!a.is_array() || a.empty()) return false;
      for (const ojson& b : a)
        if (!string_only(b, root, depth + 1)) return false;
      return true;
    }
  if (s.contains("const")) return s["const"].is_string();
  if (s.contains("enum")) {
    const ojson& e = s["enum"];
    if (!e.is_array() || e.empty()) return false;
    for (const ojson& v : e)
      if (!v.is_string()) return false;
    return true;
  }
  if (s.contains("type")) {
    const ojson& t = s["type"];
    if (t.is_string()) return t == "string";
    if (!t.is_array() || t.empty()) return false;
    for (const ojson& x : t)
      if (x != "string") return false;
    return true;
  }
  // No type: the schema compiler infers one from the keywords (json_constraint_schema.cpp).
  return s.contains("format") && !s.contains("properties") && !s.contains("required") && !s.contains("items") &&
         !s.contains("minItems") && !s.contains("maxItems");
}

class Builder {
 public:
  Builder(const ToolCallGrammar::Options& o, ToolCallGrammar& g) : o_(o), g_(g) {}

  int32_t add(Node n) {
    g_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(g_.nodes.size() - 1);
  }
  int32_t choice(std::vector<Option> options, bool accepting = false) {
    Node n;
    n.kind = Kind::kChoice;
    std::sort(options.begin(), options.end(), [](const Option& a, const Option& b) { return a.text < b.text; });
    n.options = std::move(options);
    n.accepting = accepting;
    return add(std::move(n));
  }
  void set_choice(int32_t id, std::vector<Option> options, bool accepting) {
    std::sort(options.begin(), options.end(), [](const Option& a, const Option& b) { return a.text < b.text; });
    g_.nodes[static_cast<size_t>(id)].options = std::move(options);
    g_.nodes[static_cast<size_t>(id)].accepting = accepting;
  }
  int32_t json_value(int32_t tool, int32_t schema_node, int32_t next) {
    Node n;
    n.kind = Kind::kJson;
    n.tool = tool;
    n.schema_node = schema_node;
    n.next = next;
    return add(std::move(n));
  }
  int32_t root_of(int32_t tool) const { return g_.schemas[static_cast<size_t>(tool)]->root; }

  // One XML parameter value (Qwen3.5's format), then "\n</parameter>\n" and the parameters
  // after it (`after`).
  int32_t xml_value(int32_t tool, const JsonSchema::Property& p, const std::string& name, const ojson& params,
                    int32_t after) {
    const std::string tool_name = o_.tools[static_cast<size_t>(tool)].name;
    const std::string pointer = "/properties/" + escape_pointer_token(name);
    const int32_t close = choice({{"\n</parameter>\n", after}});
    const ojson sub = params.contains("properties") && params["properties"].is_object() && params["properties"].contains(name)
                          ? params["properties"][name]
                          : params.value("additionalProperties", ojson(true));
    if (!xml_parameter_is_string(sub, params)) return json_value(tool, p.node, close);
    const JsonSchema& schema = *g_.schemas[static_cast<size_t>(tool)];
    std::vector<ToolCallGrammar::Pattern> patterns;
    bool free_text = false;
    for (int32_t alt : schema.nodes[static_cast<size_t>(p.node)].flat) {
      const JsonSchema::Node& n = schema.nodes[static_cast<size_t>(alt)];
      if (n.kind == JsonSchema::Kind::kString) {
        free_text = true;
        continue;
      }
      const bool quoted = n.kind == JsonSchema::Kind::kPattern && n.pattern.size() >= 2 && n.pattern.front().first == '"' &&
                          n.pattern.front().second == '"' && n.pattern.back().first == '"' && n.pattern.back().second == '"';
      if (!quoted)
        throw ToolSchemaError(static_cast<size_t>(tool), tool_name, pointer, "type",
                              "a parameter that admits only strings compiled to a value that is not one (internal)");
      ToolCallGrammar::Pattern raw(n.pattern.begin() + 1, n.pattern.end() - 1);
      bool fixed = true;
      for (const auto& [lo, hi] : raw) fixed = fixed && lo == hi;
      if (fixed) {  // an enum or const value: the string itself, unescaped
        std::string json_text = "\"";
        for (const auto& r : raw) json_text += static_cast<char>(r.first);
        json_text += "\"";
        const std::string text = ojson::parse(json_text).get<std::string>();
        bool clean = text.find('\n') == std::string::npos && text.find('\r') == std::string::npos;
        for (const std::string& t : g_.tracked) clean = clean && text.find(t) == std::string::npos;
        if (!clean)
          throw ToolSchemaError(static_cast<size_t>(tool), tool_name, pointer, "enum",
                                "the value " + ojson(text).dump() + " cannot be written as an XML parameter (it holds a "
                                "line break or a tool-call marker)");
        raw.clear();
        for (char c : text) raw.emplace_back(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
      }
      patterns.push_back(std::move(raw));
    }
    if (free_text) {  // any string: the patterns are strings too
      Node n;
      n.kind = Kind::kRaw;
      n.next = close;
      return add(std::move(n));
    }
    if (patterns.size() > kMaxPatterns)
      throw ToolSchemaError(static_cast<size_t>(tool), tool_name, pointer, "enum",
                            "more than " + std::to_string(kMaxPatterns) + " string values (" +
                                std::to_string(patterns.size()) + ") in one XML parameter are not supported");
    Node n;
    n.kind = Kind::kRawPatterns;
    n.patterns = std::move(patterns);
    n.next = close;
    return add(std::move(n));
  }

  // A tool's parameters in Qwen3.5's XML form: the choice after each parameter (from index k on).
  int32_t xml_parameters(int32_t tool, const ojson& params, int32_t after_call) {
    const std::string& tool_name = o_.tools[static_cast<size_t>(tool)].name;
    const JsonSchema& schema = *g_.schemas[static_cast<size_t>(tool)];
    const JsonSchema::Node& root = schema.nodes[static_cast<size_t>(schema.root)];
    if (root.flat.size() != 1 || schema.nodes[static_cast<size_t>(root.flat[0])].kind != JsonSchema::Kind::kObject) {
      const bool any_of = root.flat.size() > 1;
      throw ToolSchemaError(static_cast<size_t>(tool), tool_name, "", any_of ? "anyOf" : "properties",
                            any_of ? "alternatives of the whole parameters object cannot be written as XML parameters"
                                   : "an object of any keys (no 'properties' or 'required') cannot be written as XML "
                                     "parameters: list the parameters under 'properties'");
    }
    const JsonSchema::Node& obj = schema.nodes[static_cast<size_t>(root.flat[0])];
    const int32_t count = static_cast<int32_t>(obj.properties.size());
    std::vector<int32_t> from(static_cast<size_t>(count) + 1);
    for (int32_t& id : from) id = choice({});
    std::vector<std::string> names;
    std::vector<int32_t> values;
    for (int32_t j = 0; j < count; ++j) {
      const JsonSchema::Property& p = obj.properties[static_cast<size_t>(j)];
      const std::string name = ojson::parse("\"" + p.key + "\"").get<std::string>();
      const bool trimmed = !name.empty() && name.front() != ' ' && name.back() != ' ' && name.front() != '\t' &&
                           name.back() != '\t';
      if (!trimmed || name.find_first_of("<>\n\r") != std::string::npos)
        throw ToolSchemaError(static_cast<size_t>(tool), tool_name, "/properties/" + escape_pointer_token(name), "properties",
                              "the parameter name " + ojson(name).dump() + " cannot be written as <parameter=NAME> (it "
                              "is empty, has '<', '>' or a line break, or spaces at its ends)");
      names.push_back(name);
      values.push_back(xml_value(tool, p, name, params, from[static_cast<size_t>(j) + 1]));
    }
    for (int32_t k = 0; k <= count; ++k) {
      std::vector<Option> options;
      const int32_t next_required = obj.next_required[static_cast<size_t>(k)];
      for (int32_t j = k; j < count && j <= next_required; ++j)
        options.push_back({"<parameter=" + names[static_cast<size_t>(j)] + ">\n", values[static_cast<size_t>(j)]});
      if (next_required == count) options.push_back({"</function>\n</tool_call>", after_call});
      set_choice(from[static_cast<size_t>(k)], std::move(options), false);
    }
    return from[0];
  }

  void build() {
    const auto& tools = o_.tools;
    if (tools.empty()) throw Error("tool call grammar: no tools");
    std::map<std::string, size_t> seen;
    int32_t forced = -1;
    for (size_t i = 0; i < tools.size(); ++i) {
      if (auto [it, fresh] = seen.emplace(tools[i].name, i); !fresh)
        throw ToolSchemaError(i, tools[i].name, "", "name",
                              "the name is also the name of tools[" + std::to_string(it->second) + "]");
      if (tools[i].name == o_.forced) forced = static_cast<int32_t>(i);
    }
    if (!o_.forced.empty() && forced < 0) throw Error("tool call grammar: function '" + o_.forced + "' is not in the tools");
    // Only the tools the call may name are compiled (and so refused for what they hold).
    std::vector<int32_t> callable;
    g_.schemas.resize(tools.size());
    for (size_t i = 0; i < tools.size(); ++i) {
      if (forced >= 0 && static_cast<int32_t>(i) != forced) continue;
      callable.push_back(static_cast<int32_t>(i));
      const std::string& name = tools[i].name;
      if (!plain_name(name))
        throw ToolSchemaError(i, name, "", "name",
                              "a required call needs tool names of letters, digits, '_', '-' and '.' (1 to 256), got " +
                                  ojson(name).dump(-1, ' ', false, ojson::error_handler_t::replace));
      const ojson params = tools[i].parameters.is_null() ? ojson{{"type", "object"}, {"properties", ojson::object()}}
                                                         : tools[i].parameters;
      try {
        g_.schemas[i] = JsonSchema::compile(params);
      } catch (const SchemaError& e) {
        throw ToolSchemaError(i, name, e.pointer(), e.keyword(), e.what());
      }
    }

    // Markers that may not appear inside a value: the format's own, and the reasoning tags.
    switch (o_.format) {
      case ToolCallFormat::kJsonTags: g_.tracked = {"<tool_call>", "</tool_call>"}; break;
      case ToolCallFormat::kXmlTags:
        g_.tracked = {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"};
        g_.terminator = "\n</parameter>";
        g_.terminator_dfa = substring_dfa(g_.terminator);
        break;
      case ToolCallFormat::kKimiSections:
        g_.tracked = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                      "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
        break;
    }
    g_.tracked.push_back("<think>");
    g_.tracked.push_back("</think>");
    for (const std::string& t : g_.tracked) g_.dfa.push_back(substring_dfa(t));  // each starts with '<' (plain fast path)

    const int32_t done = choice({}, true);
    const int32_t after = o_.parallel ? choice({}) : done;  // filled in below
    const auto name_of = [&](int32_t i) { return tools[static_cast<size_t>(i)].name; };
    switch (o_.format) {
      case ToolCallFormat::kJsonTags: {
        const std::string open = "<tool_call>\n{\"name\": \"", mid = "\", \"arguments\": ";
        const int32_t tail = choice({{"}\n</tool_call>", after}});
        std::vector<Option> names;
        std::vector<int32_t> args(tools.size(), -1);
        for (int32_t i : callable) {
          args[static_cast<size_t>(i)] = json_value(i, root_of(i), tail);
          names.push_back({name_of(i) + mid, args[static_cast<size_t>(i)]});
        }
        const int32_t name = choice(std::move(names));
        if (o_.parallel) set_choice(after, {{"\n" + open, name}}, true);
        g_.start = forced >= 0 ? args[static_cast<size_t>(forced)] : name;
        g_.prefix = open + (forced >= 0 ? name_of(forced) + mid : "");
        break;
      }
      case ToolCallFormat::kKimiSections: {
        const std::string section = "<|tool_calls_section_begin|>", open = "<|tool_call_begin|>functions.",
                          arguments = "<|tool_call_argument_begin|>";
        const int32_t close = choice({{"<|tool_call_end|>", after}});
        std::vector<Option> names;
        std::vector<int32_t> args(tools.size(), -1);
        for (int32_t i : callable) {
          args[static_cast<size_t>(i)] = json_value(i, root_of(i), close);
          Node digits;
          digits.kind = Kind::kDigits;
          digits.next = choice({{arguments, args[static_cast<size_t>(i)]}});
          names.push_back({name_of(i) + ":", add(std::move(digits))});
        }
        const int32_t name = choice(std::move(names));
        // The section ends after any call; with parallel calls another may begin instead.
        const int32_t section_end = o_.parallel ? after : choice({});
        std::vector<Option> next{{"<|tool_calls_section_end|>", done}};
        if (o_.parallel) next.push_back({open, name});
        set_choice(section_end, std::move(next), false);
        g_.nodes[static_cast<size_t>(close)].options[0].next = section_end;
        g_.start = forced >= 0 ? args[static_cast<size_t>(forced)] : name;
        g_.prefix = section + open + (forced >= 0 ? name_of(forced) + ":0" + arguments : "");
        break;
      }
      case ToolCallFormat::kXmlTags: {
        const std::string open = "<tool_call>\n<function=";
        std::vector<Option> names;
        std::vector<int32_t> params(tools.size(), -1);
        for (int32_t i : callable) {
          const ojson& p = tools[static_cast<size_t>(i)].parameters;
          params[static_cast<size_t>(i)] = xml_parameters(i, p.is_null() ? ojson::object() : p, after);
          names.push_back({name_of(i) + ">\n", params[static_cast<size_t>(i)]});
        }
        const int32_t name = choice(std::move(names));
        if (o_.parallel) set_choice(after, {{"\n" + open, name}}, true);
        g_.start = forced >= 0 ? params[static_cast<size_t>(forced)] : name;
        g_.prefix = open + (forced >= 0 ? name_of(forced) + ">\n" : "");
        break;
      }
    }
    if (o_.lazy) {
      // The model writes the call's start itself: the grammar begins at the opening marker (the
      // trigger), with the prefix a required call's prompt would end with as its first text.
      if (forced >= 0) throw Error("tool call grammar: a lazy grammar is for tool_choice auto (no named function)");
      g_.trigger_text = o_.format == ToolCallFormat::kKimiSections ? "<|tool_calls_section_begin|>" : "<tool_call>";
      g_.start = choice({{g_.prefix, g_.start}});
      g_.prefix.clear();
    }
    shortest_ways();
    if (g_.nodes[static_cast<size_t>(g_.start)].min_to_end >= kInfinite)
      throw Error("tool call grammar: no call of finite length exists");
  }

  // min_to_end of every node, to the fixed point (the graph has cycles through parallel calls).
  void shortest_ways() {
    for (Node& n : g_.nodes) n.min_to_end = kInfinite;
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : g_.nodes) {
        const auto to = [&](int32_t id) { return g_.nodes[static_cast<size_t>(id)].min_to_end; };
        int64_t m = kInfinite;
        switch (n.kind) {
          case Kind::kChoice:
            if (n.accepting) m = 0;
            for (const Option& o : n.options) m = std::min(m, sat_add(static_cast<int64_t>(o.text.size()), to(o.next)));
            break;
          case Kind::kJson: {
            const JsonSchema& s = *g_.schemas[static_cast<size_t>(n.tool)];
            m = sat_add(s.nodes[static_cast<size_t>(n.schema_node)].min_bytes, to(n.next));
            break;
          }
          case Kind::kRaw: m = to(n.next); break;
          case Kind::kRawPatterns:
            for (const auto& p : n.patterns) m = std::min(m, sat_add(static_cast<int64_t>(p.size()), to(n.next)));
            break;
          case Kind::kDigits: m = sat_add(1, to(n.next)); break;
        }
        if (m < n.min_to_end) {
          n.min_to_end = m;
          changed = true;
        }
      }
    }
  }

 private:
  const ToolCallGrammar::Options& o_;
  ToolCallGrammar& g_;
};

}  // namespace

bool xml_parameter_is_string(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& root) {
  return string_only(schema, root, 0);
}

std::shared_ptr<const ToolCallGrammar> ToolCallGrammar::compile(const Options& options) {
  auto g = std::make_shared<ToolCallGrammar>();
  Builder(options, *g).build();
  return g;
}

int64_t ToolCallGrammar::min_bytes() const { return nodes[static_cast<size_t>(start)].min_to_end; }

// ---- the automaton ----------------------------------------------------------------------------

ToolCallState::ToolCallState(const ToolCallGrammar& g) : g_(&g) { enter(g.start); }

void ToolCallState::enter(int32_t id) {
  node_ = id;
  typed_ = 0;
  const Node& n = g_->nodes[static_cast<size_t>(id)];
  lo_ = 0;
  hi_ = static_cast<int32_t>(n.options.size());
  match_.fill(0);
  term_match_ = 0;
  utf8_left_ = 0;
  utf8_lo_ = 0x80;
  utf8_hi_ = 0xBF;
  alive_ = n.patterns.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.patterns.size()) - 1;
  if (n.kind == Kind::kJson) value_.emplace(*g_->schemas[static_cast<size_t>(n.tool)], n.schema_node);
  else value_.reset();
}

bool ToolCallState::feed_tracked(uint8_t b) {
  for (size_t i = 0; i < g_->tracked.size(); ++i) {
    match_[i] = g_->dfa[i][match_[i]][b];
    if (match_[i] == g_->tracked[i].size()) return false;
  }
  return true;
}

bool ToolCallState::feed(uint8_t b, bool literal_only) {
  for (;;) {  // a value that ends hands the byte on to the node after it
    const Node& n = g_->nodes[static_cast<size_t>(node_)];
    switch (n.kind) {
      case Kind::kChoice: {
        // The options matching what is typed share it and are contiguous (sorted): narrow them.
        int32_t lo = lo_;
        while (lo < hi_ && !(n.options[static_cast<size_t>(lo)].text.size() > static_cast<size_t>(typed_) &&
                             static_cast<uint8_t>(n.options[static_cast<size_t>(lo)].text[static_cast<size_t>(typed_)]) == b))
          ++lo;
        if (lo == hi_) return false;
        int32_t hi = lo + 1;
        while (hi < hi_ && n.options[static_cast<size_t>(hi)].text.size() > static_cast<size_t>(typed_) &&
               static_cast<uint8_t>(n.options[static_cast<size_t>(hi)].text[static_cast<size_t>(typed_)]) == b)
          ++hi;
        lo_ = lo;
        hi_ = hi;
        ++typed_;
        // The options are prefix-free (names end at a delimiter): a complete one is alone.
        if (hi_ - lo_ == 1 && n.options[static_cast<size_t>(lo_)].text.size() == static_cast<size_t>(typed_))
          enter(n.options[static_cast<size_t>(lo_)].next);
        return true;
      }
      case Kind::kJson: {
        if (value_->can_end()) {
          // The value may go on (a number's next digit) or have ended; in every format what
          // follows a value starts with a byte no value takes there ('}' after the closed
          // arguments, '<', '\n'), so trying the value first decides.
          if (!literal_only) {
            SchemaState v = *value_;
            const auto saved = match_;
            if (feed_tracked(b) && v.feed(b)) {
              value_ = std::move(v);
              return true;
            }
            match_ = saved;
          }
          enter(n.next);
          continue;
        }
        if (literal_only || !feed_tracked(b)) return false;
        return value_->feed(b);
      }
      case Kind::kRaw: {
        if (literal_only) return false;
        if (utf8_left_ > 0) {  // RFC 3629's byte ranges, as JsonState
          if (b < utf8_lo_ || b > utf8_hi_) return false;
          --utf8_left_;
          utf8_lo_ = 0x80;
          utf8_hi_ = 0xBF;
        } else if (b < 0x80) {
          if (b < 0x20 && b != '\t' && b != '\n' && b != '\r') return false;
        } else if (!utf8_lead(b, utf8_left_, utf8_lo_, utf8_hi_)) {
          return false;
        }
        term_match_ = g_->terminator_dfa[term_match_][b];
        if (term_match_ == g_->terminator.size()) {  // "\n</parameter>": the value ended
          const int32_t typed = static_cast<int32_t>(g_->terminator.size());
          enter(n.next);  // a choice whose one option starts with the terminator
          typed_ = typed;
          return true;
        }
        return feed_tracked(b);
      }
      case Kind::kRawPatterns: {
        if (literal_only) return false;
        uint64_t alive = 0;
        bool complete = false;
        for (size_t p = 0; p < n.patterns.size(); ++p) {
          if (!(alive_ >> p & 1)) continue;
          const auto& pat = n.patterns[p];
          if (static_cast<size_t>(typed_) == pat.size()) complete = true;
          else if (b >= pat[static_cast<size_t>(typed_)].first && b <= pat[static_cast<size_t>(typed_)].second)
            alive |= uint64_t{1} << p;
        }
        if (alive == 0) {
          if (!complete) return false;
          enter(n.next);  // the values hold no '\n', with which what follows starts
          continue;
        }
        alive_ = alive;
        ++typed_;
        return true;
      }
      case Kind::kDigits:
        if (b >= '0' && b <= '9' && typed_ < kMaxDigits) {
          if (literal_only) return false;
          ++typed_;
          return true;
        }
        if (typed_ == 0) return false;
        enter(n.next);
        continue;
    }
    return false;
  }
}

bool ToolCallState::accepting() const {
  const Node& n = g_->nodes[static_cast<size_t>(node_)];
  return n.kind == Kind::kChoice && n.accepting && typed_ == 0;
}

bool ToolCallState::done() const {
  const Node& n = g_->nodes[static_cast<size_t>(node_)];
  return n.kind == Kind::kChoice && n.options.empty();
}

bool ToolCallState::in_plain_string() const {
  const Node& n = g_->nodes[static_cast<size_t>(node_)];
  if (n.kind != Kind::kJson || !value_->in_plain_string()) return false;
  for (size_t i = 0; i < g_->tracked.size(); ++i)
    if (match_[i] != 0) return false;
  return true;
}

bool ToolCallState::in_plain_text() const {
  const Node& n = g_->nodes[static_cast<size_t>(node_)];
  if (n.kind != Kind::kRaw || utf8_left_ != 0 || term_match_ != 0) return false;
  for (size_t i = 0; i < g_->tracked.size(); ++i)
    if (match_[i] != 0) return false;
  return true;
}

int64_t ToolCallState::closing_cost() const {
  const Node& n = g_->nodes[static_cast<size_t>(node_)];
  const auto to = [&](int32_t id) { return g_->nodes[static_cast<size_t>(id)].min_to_end; };
  switch (n.kind) {
    case Kind::kChoice: {
      if (typed_ == 0 && n.accepting) return 0;
      int64_t best = kInfinite;
      for (int32_t c = lo_; c < hi_; ++c) {
        const Option& o = n.options[static_cast<size_t>(c)];
        best = std::min(best, sat_add(static_cast<int64_t>(o.text.size()) - typed_, to(o.next)));
      }
      return best;
    }
    case Kind::kJson: return sat_add(value_->closing_cost(), to(n.next));
    case Kind::kRaw:
      // The rest of a character and the terminator (the next choice's text starts with it).
      return utf8_left_ > 0 ? sat_add(utf8_left_, to(n.next)) : to(n.next) - term_match_;
    case Kind::kRawPatterns: {
      int64_t best = kInfinite;
      for (size_t p = 0; p < n.patterns.size(); ++p)
        if (alive_ >> p & 1) best = std::min(best, static_cast<int64_t>(n.patterns[p].size()) - typed_);
      return sat_add(best, to(n.next));
    }
    case Kind::kDigits: return sat_add(typed_ == 0 ? 1 : 0, to(n.next));
  }
  return kInfinite;
}

// ---- the mask ---------------------------------------------------------------------------------

ToolCallConstraint::ToolCallConstraint(const Tokenizer& tokenizer, std::shared_ptr<const ToolCallGrammar> grammar,
                                       std::vector<int32_t> stop_ids)
    : tokenizer_(&tokenizer), trie_(vocabulary_trie(tokenizer)), grammar_(std::move(grammar)),
      stop_ids_(std::move(stop_ids)), state_(*grammar_) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.is_special(id) || std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) continue;
    std::string text = tokenizer.token_bytes(id);
    if (!text.empty()) specials_.emplace_back(id, std::move(text));
  }
  // The budget counts one token per byte of the shortest completion: every byte such a completion
  // may use needs a token of its own (as SchemaConstraint checks for JSON), here also the bytes of
  // the markers and names, the terminator and the raw patterns.
  std::set<uint8_t> needed;
  for (const ToolCallGrammar::Node& n : grammar_->nodes) {
    for (const Option& o : n.options)
      for (char c : o.text) needed.insert(static_cast<uint8_t>(c));
    for (const auto& p : n.patterns)
      for (const auto& [lo, hi] : p) needed.insert(lo);
  }
  for (const auto& schema : grammar_->schemas)
    if (schema) add_closing_bytes(*schema, needed);  // null: a tool the call may not name
  for (uint8_t b : needed)
    if (!trie_->single_byte[b])
      throw Error("tool call output: the tokenizer has no single-byte token for byte " + std::to_string(b) +
                  ", which closing a call within max_tokens relies on");
}

ToolCallConstraint::~ToolCallConstraint() = default;

void ToolCallConstraint::mask(std::span<float> logits, int64_t tokens_left) const {
  std::vector<uint8_t> allowed(logits.size(), 0);
  const VocabularyTrie& v = *trie_;
  if (state_.in_plain_text()) {
    // Raw text: whole characters without '<' or a line feed leave the state as it is (every
    // marker and the terminator start with one of those).
    if (state_.closing_cost() <= tokens_left - 1)
      for (int32_t id : v.text_plain)
        if (static_cast<size_t>(id) < allowed.size()) allowed[static_cast<size_t>(id)] = 1;
    walk_trie(v.text_rest, state_, allowed, tokens_left);
  } else if (state_.in_plain_string()) {
    // Plain string content without '<' leaves the state (and its shortest completion) as it is.
    if (state_.closing_cost() <= tokens_left - 1)
      for (int32_t id : v.plain_without_angle)
        if (static_cast<size_t>(id) < allowed.size()) allowed[static_cast<size_t>(id)] = 1;
    walk_trie(v.not_plain, state_, allowed, tokens_left);
    walk_trie(v.plain_with_angle, state_, allowed, tokens_left);
  } else {
    walk_trie(v.all, state_, allowed, tokens_left);
  }
  for (const auto& [id, text] : specials_) {  // a marker the tokenizer has as a special token
    if (static_cast<size_t>(id) >= allowed.size()) continue;
    ToolCallState s = state_;
    bool ok = true;
    for (char c : text)
      if (!(ok = s.feed(static_cast<uint8_t>(c), true))) break;
    if (ok && s.closing_cost() <= tokens_left - 1) allowed[static_cast<size_t>(id)] = 1;
  }
  if (state_.accepting())
    for (int32_t id : stop_ids_)
      if (id >= 0 && static_cast<size_t>(id) < allowed.size()) allowed[static_cast<size_t>(id)] = 1;
  for (size_t id = 0; id < logits.size(); ++id)
    if (!allowed[id]) logits[id] = -std::numeric_limits<float>::infinity();
}

bool ToolCallConstraint::advance_bytes(std::string_view bytes, bool literal_only) {
  ToolCallState s = state_;
  for (char c : bytes)
    if (!s.feed(static_cast<uint8_t>(c), literal_only)) return false;
  state_ = std::move(s);
  return true;
}

bool ToolCallConstraint::opening_fits(const ToolCallGrammar& grammar, std::string_view bytes, bool literal_only,
                                      int64_t tokens_left) {
  ToolCallState s(grammar);
  for (char c : bytes)
    if (!s.feed(static_cast<uint8_t>(c), literal_only)) return false;
  return s.closing_cost() <= tokens_left - 1;
}

bool ToolCallConstraint::advance(int32_t token) {
  if (token < 0 || token >= tokenizer_->vocab_size()) return false;
  const bool special = tokenizer_->is_special(token);
  if (special && std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) return false;
  const std::string bytes = tokenizer_->token_bytes(token);
  if (bytes.empty()) return false;
  ToolCallState s = state_;
  for (char c : bytes)
    if (!s.feed(static_cast<uint8_t>(c), special)) return false;
  state_ = std::move(s);
  return true;
}

}  // namespace hanpu
