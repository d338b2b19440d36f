#include "io/json_io.hpp"

#include <cstdio>
#include <unordered_set>
#include <vector>

#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"

namespace hanpu {

namespace {

using json = nlohmann::json;

// JSON pointer token escaping (RFC 6901 section 3: '~' -> "~0", '/' -> "~1").
std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return printable(out);
}

// Tracks where the parser is (for messages) and the keys of every open object.
struct Frame {
  bool object = false;
  std::unordered_set<std::string> keys;
  std::string key;   // current key (objects)
  size_t index = 0;  // current element (arrays)
};

std::string pointer(const std::vector<Frame>& stack, size_t levels) {
  std::string p;
  for (size_t i = 0; i < levels && i < stack.size(); ++i)
    p += "/" + (stack[i].object ? pointer_token(stack[i].key) : std::to_string(stack[i].index));
  if (p.size() > 80) p = p.substr(0, 38) + "..." + p.substr(p.size() - 38);  // deep values: the ends
  return p.empty() ? "(top level)" : p;
}

// nlohmann's parse_error text without its "[json.exception.parse_error.101] " prefix, cut short:
// its "last read" part can hold a long token.
std::string parse_error_text(const json::exception& e) {
  std::string s = e.what();
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s = s.substr(close + 2);
  }
  s = printable(s);
  if (s.size() > 200) s = s.substr(0, 197) + "...";
  return s;
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

json parse_json(std::string_view text, const std::string& origin, const JsonReadOptions& opt) {
  std::vector<Frame> stack;
  auto after_value = [&] {
    if (!stack.empty() && !stack.back().object) ++stack.back().index;
  };
  auto cb = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= opt.max_depth)
          throw Error(origin + ": JSON nested deeper than " + std::to_string(opt.max_depth) + " levels at " +
                      pointer(stack, stack.size()) + ", expected at most " + std::to_string(opt.max_depth));
        stack.emplace_back();
        stack.back().object = event == json::parse_event_t::object_start;
        break;
      case json::parse_event_t::key: {
        Frame& f = stack.back();
        f.key = parsed.get<std::string>();
        if (opt.reject_duplicate_keys && !f.keys.insert(f.key).second)
          throw Error(origin + ": " + pointer(stack, stack.size() - 1) + ": duplicate key \"" + printable(f.key) +
                      "\", expected each key once");
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        after_value();
        break;
      case json::parse_event_t::value:
        after_value();
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    throw Error(origin + ": not valid JSON: " + parse_error_text(e));
  }
}

json read_json_file(const std::string& path, const JsonReadOptions& opt) {
  return parse_json(read_regular_file(path, "JSON file", kMaxJsonFileBytes), path, opt);
}

namespace {
// Renders like json::dump() (compact) but stops once `limit` characters are out: recursion ends
// after at most `limit` levels, however deep or large the value.
void render(const json& j, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  if (j.is_array()) {
    out += '[';
    bool first = true;
    for (const json& x : j) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      render(x, out, limit);
    }
    out += ']';
  } else if (j.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      out += json(it.key()).dump() + ':';
      render(it.value(), out, limit);
    }
    out += '}';
  } else {
    out += j.dump();
  }
}
}  // namespace

std::string json_summary(const json& j) {
  constexpr size_t kLimit = 60;
  std::string s;
  render(j, s, kLimit);
  s = printable(s);
  if (s.size() > kLimit) s = s.substr(0, kLimit - 3) + "...";
  return s;
}

std::string json_got(const json& j) {
  const char* kind = j.is_number_integer() ? "an integer" : j.is_number() ? "a number" : j.is_string() ? "a string"
                     : j.is_boolean() ? "a boolean" : j.is_array() ? "an array" : j.is_object() ? "an object" : "null";
  if (j.is_null()) return kind;
  return std::string(kind) + " " + json_summary(j);
}

}  // namespace hanpu
