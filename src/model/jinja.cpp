// hanpu's Jinja subset for chat templates: lexer (with trim_blocks/lstrip_blocks and the `-`
// whitespace control), a recursive-descent parser to a small tree, and a tree-walking renderer
// over Python-like values. The semantics follow jinja2 3.1 as transformers configures it (see
// jinja.hpp); Python's own rules are used where Jinja defers to Python (str() and repr() of values,
// json.dumps, str methods, slicing, comparisons). Anything outside the subset is an error naming
// the construct and the template line, never a guess.
#include "model/jinja.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <utf8proc.h>

#include "hanpu/tensor.hpp"

namespace hanpu::jinja {
namespace {

constexpr size_t kMaxOutputBytes = size_t{64} << 20;  // a runaway loop stops here, not at OOM
constexpr int kMaxDepth = 200;                          // parser nesting and macro recursion
constexpr int64_t kMaxIterations = 1'000'000;  // loop bodies per render (chat templates: messages x tool calls)
// Work per render: expression evaluations, and bytes/items built by +, ~, *, join. Real chat
// templates use a tiny fraction; a template that loops on quadratic concatenation stops here.
constexpr int64_t kMaxSteps = 50'000'000;
constexpr int64_t kMaxBuiltBytes = int64_t{4} << 30;

// ---- values --------------------------------------------------------------------------------

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Args;
using Fn = std::function<Value(Args&)>;

struct Value {
  enum class K : uint8_t { Undef, None, Bool, Int, Float, Str, List, Dict, Func };
  K k = K::Undef;
  bool b = false;
  bool tuple = false;      // a List that is a Python tuple (repr only)
  bool ns = false;         // a Dict that is a namespace() (attribute assignment allowed)
  int64_t i = 0;
  double f = 0;
  std::string s;           // Str; Undef: the name that was looked up; Func: its name
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d;
  std::shared_ptr<Fn> fn;

  static Value undef(std::string name = {}) { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.k = K::None; return v; }
  static Value boolean(bool x) { Value v; v.k = K::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.k = K::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.k = K::Float; v.f = x; return v; }
  static Value str(std::string x) { Value v; v.k = K::Str; v.s = std::move(x); return v; }
  static Value list(List x = {}, bool tuple = false) {
    Value v; v.k = K::List; v.l = std::make_shared<List>(std::move(x)); v.tuple = tuple; return v;
  }
  static Value dict();
  static Value func(std::string name, Fn f) {
    Value v; v.k = K::Func; v.s = std::move(name); v.fn = std::make_shared<Fn>(std::move(f)); return v;
  }
  bool is_undef() const { return k == K::Undef; }
  bool is_num() const { return k == K::Int || k == K::Float || k == K::Bool; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items)
      if (k == key) { old = std::move(v); return; }
    items.emplace_back(key, std::move(v));
  }
};

Value Value::dict() { Value v; v.k = K::Dict; v.d = std::make_shared<Dict>(); return v; }

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
};

// ---- errors ---------------------------------------------------------------------------------

struct TemplateError {  // carries the line; turned into hanpu::Error with the origin at the top
  int line;
  std::string what;
};

[[noreturn]] void fail(int line, std::string what) { throw TemplateError{line, std::move(what)}; }

// ---- UTF-8 and Python str helpers -------------------------------------------------------------

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    char32_t cp = c;
    size_t n = 1;
    if (c >= 0xF0 && i + 4 <= s.size()) { cp = c & 0x07; n = 4; }
    else if (c >= 0xE0 && i + 3 <= s.size()) { cp = c & 0x0F; n = 3; }
    else if (c >= 0xC0 && i + 2 <= s.size()) { cp = c & 0x1F; n = 2; }
    if (n > 1) {
      bool ok = true;
      for (size_t j = 1; j < n; ++j) {
        const auto cc = static_cast<unsigned char>(s[i + j]);
        if ((cc & 0xC0) != 0x80) { ok = false; break; }
        cp = (cp << 6) | (cc & 0x3F);
      }
      if (!ok) { cp = c; n = 1; }
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) out.push_back(static_cast<char>(cp));
  else if (cp < 0x800) { out.push_back(static_cast<char>(0xC0 | (cp >> 6))); out.push_back(static_cast<char>(0x80 | (cp & 0x3F))); }
  else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {  // Python's str.isspace()
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string u = to_u32(s);
  const std::u32string set = chars ? to_u32(*chars) : std::u32string();
  auto strip_me = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t a = 0, b = u.size();
  if (left) while (a < b && strip_me(u[a])) ++a;
  if (right) while (b > a && strip_me(u[b - 1])) --b;
  return from_u32(std::u32string_view(u).substr(a, b - a));
}

std::string py_lower_upper(std::string_view s, bool upper) {  // per code point (utf8proc's simple case mapping)
  std::string out;
  out.reserve(s.size());
  for (char32_t c : to_u32(s)) {
    const auto cp = static_cast<utf8proc_int32_t>(c);
    append_utf8(out, static_cast<char32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)));
  }
  return out;
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string out;
  if (sci[0] == '-') { out = "-"; sci.erase(0, 1); }
  const size_t e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int e = std::stoi(sci.substr(e_at + 1));
  const int n = static_cast<int>(digits.size());
  if (e >= -4 && e < 16) {
    if (e >= 0) {
      if (n <= e + 1) out += digits + std::string(static_cast<size_t>(e + 1 - n), '0') + ".0";
      else out += digits.substr(0, static_cast<size_t>(e + 1)) + "." + digits.substr(static_cast<size_t>(e + 1));
    } else {
      out += "0." + std::string(static_cast<size_t>(-e - 1), '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", e < 0 ? '-' : '+', std::abs(e));
    out += eb;
  }
  return out;
}

std::string py_repr_str(const std::string& s) {
  const bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  const char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : to_u32(s)) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<char32_t>(q)) { out += '\\'; out += q; }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      out += b;
    } else append_utf8(out, c);
  }
  out += q;
  return out;
}

std::string to_str(const Value& v);

std::string repr(const Value& v) {
  switch (v.k) {
    case Value::K::Str: return py_repr_str(v.s);
    case Value::K::Undef: return "Undefined";  // repr() of jinja2's Undefined, e.g. inside a list
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {  // Python str()
  switch (v.k) {
    case Value::K::Undef: return "";
    case Value::K::None: return "None";
    case Value::K::Bool: return v.b ? "True" : "False";
    case Value::K::Int: return std::to_string(v.i);
    case Value::K::Float: return py_float_repr(v.f);
    case Value::K::Str: return v.s;
    case Value::K::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t j = 0; j < v.l->size(); ++j) out += (j ? ", " : "") + repr((*v.l)[j]);
      if (v.tuple && v.l->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::K::Dict: {
      std::string out = v.ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.d->items) {
        out += (first ? "" : ", ") + py_repr_str(k) + ": " + repr(x);
        first = false;
      }
      return out + (v.ns ? "}>" : "}");
    }
    case Value::K::Func: return "<function " + v.s + ">";
  }
  return "";
}

const char* type_name(const Value& v) {
  switch (v.k) {
    case Value::K::Undef: return "undefined";
    case Value::K::None: return "none";
    case Value::K::Bool: return "boolean";
    case Value::K::Int: return "integer";
    case Value::K::Float: return "float";
    case Value::K::Str: return "string";
    case Value::K::List: return v.tuple ? "tuple" : "list";
    case Value::K::Dict: return v.ns ? "namespace" : "dict";
    case Value::K::Func: return "function";
  }
  return "value";
}

std::string describe(const Value& v) {
  if (v.is_undef()) return v.s.empty() ? "undefined" : "undefined '" + v.s + "'";
  std::string r = repr(v);
  if (r.size() > 60) r = r.substr(0, 57) + "...";
  return std::string(type_name(v)) + " " + r;
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::Undef: case Value::K::None: return false;
    case Value::K::Bool: return v.b;
    case Value::K::Int: return v.i != 0;
    case Value::K::Float: return v.f != 0;
    case Value::K::Str: return !v.s.empty();
    case Value::K::List: return !v.l->empty();
    case Value::K::Dict: return !v.d->items.empty();
    case Value::K::Func: return true;
  }
  return false;
}

double num(const Value& v) { return v.k == Value::K::Float ? v.f : v.k == Value::K::Bool ? (v.b ? 1 : 0) : static_cast<double>(v.i); }
int64_t inum(const Value& v) { return v.k == Value::K::Bool ? (v.b ? 1 : 0) : v.i; }

bool equal(const Value& a, const Value& b) {  // Python ==
  if (a.is_num() && b.is_num()) {
    if (a.k == Value::K::Float || b.k == Value::K::Float) return num(a) == num(b);
    return inum(a) == inum(b);
  }
  if (a.k != b.k || (a.k == Value::K::List && a.tuple != b.tuple)) return false;
  switch (a.k) {
    case Value::K::Undef: case Value::K::None: return true;
    case Value::K::Str: return a.s == b.s;
    case Value::K::List:
      if (a.l->size() != b.l->size()) return false;
      for (size_t j = 0; j < a.l->size(); ++j)
        if (!equal((*a.l)[j], (*b.l)[j])) return false;
      return true;
    case Value::K::Dict: {
      if (a.d == b.d) return true;
      if (a.d->items.size() != b.d->items.size()) return false;
      for (const auto& [k, x] : a.d->items) {
        const Value* y = b.d->find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    }
    case Value::K::Func: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, int line, const char* op) {  // Python <, for numbers and strings
  if (a.is_num() && b.is_num()) { const double x = num(a), y = num(b); return x < y ? -1 : x > y ? 1 : 0; }
  if (a.k == Value::K::Str && b.k == Value::K::Str) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.k == Value::K::List && b.k == Value::K::List) {
    for (size_t j = 0; j < std::min(a.l->size(), b.l->size()); ++j) {
      if (equal((*a.l)[j], (*b.l)[j])) continue;
      return compare((*a.l)[j], (*b.l)[j], line, op);
    }
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  fail(line, std::string("comparison '") + op + "': cannot order " + describe(a) + " and " + describe(b));
}

// ---- json ------------------------------------------------------------------------------------

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value::real(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return Value::list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (const auto& [k, e] : j.items()) d.d->items.emplace_back(k, from_json(e));
      return d;
    }
    default: return Value::none();
  }
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {  // Python json.dumps
  out += '"';
  for (char32_t c : to_u32(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char b[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)), static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
          }
          out += b;
        } else {
          append_utf8(out, c);
        }
      }
    }
  }
  out += '"';
}

struct JsonStyle {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // json.dumps indent (a number becomes that many spaces)
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void to_json(std::string& out, const Value& v, const JsonStyle& st, int level, int line) {
  const auto newline = [&](int lv) {
    out += '\n';
    for (int j = 0; j < lv; ++j) out += *st.indent;
  };
  switch (v.k) {
    case Value::K::None: out += "null"; return;
    case Value::K::Bool: out += v.b ? "true" : "false"; return;
    case Value::K::Int: out += std::to_string(v.i); return;
    case Value::K::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return;
    case Value::K::Str: json_string(out, v.s, st.ensure_ascii); return;
    case Value::K::List: {
      if (v.l->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t j = 0; j < v.l->size(); ++j) {
        if (j) out += st.item_sep;
        if (st.indent) newline(level + 1);
        to_json(out, (*v.l)[j], st, level + 1, line);
      }
      if (st.indent) newline(level);
      out += ']';
      return;
    }
    case Value::K::Dict: {
      if (v.ns) fail(line, "tojson: Object of type Namespace is not JSON serializable");
      if (v.d->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& it : v.d->items) items.push_back(&it);
      if (st.sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t j = 0; j < items.size(); ++j) {
        if (j) out += st.item_sep;
        if (st.indent) newline(level + 1);
        json_string(out, items[j]->first, st.ensure_ascii);
        out += st.key_sep;
        to_json(out, items[j]->second, st, level + 1, line);
      }
      if (st.indent) newline(level);
      out += '}';
      return;
    }
    case Value::K::Undef: fail(line, "tojson: Object of type Undefined is not JSON serializable (" + describe(v) + ")");
    case Value::K::Func: fail(line, "tojson: Object of type function is not JSON serializable");
  }
}

// ---- lexer --------------------------------------------------------------------------------------

enum class Tok : uint8_t { Name, Int, Float, Str, Op, End };

struct Token {
  Tok t = Tok::End;
  std::string s;  // name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

// A piece of the template: literal text, {{ expression }} or {% statement %}, tokenized.
struct Piece {
  enum Kind { Text, Var, Block } kind;
  std::string text;
  std::vector<Token> toks;
  int line;
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Python string-literal escapes, as jinja2 decodes its string tokens ("unicode-escape").
std::string decode_string(std::string_view body, int line) {
  std::string out;
  for (size_t j = 0; j < body.size(); ++j) {
    const char c = body[j];
    if (c != '\\' || j + 1 >= body.size()) { out += c; continue; }
    const char e = body[++j];
    auto hex = [&](size_t n) -> char32_t {
      if (j + n >= body.size()) fail(line, "string literal: truncated \\x/\\u escape");
      uint32_t v = 0;
      for (size_t q = 1; q <= n; ++q) {
        const char h = body[j + q];
        if (!std::isxdigit(static_cast<unsigned char>(h))) fail(line, "string literal: bad hex digit in escape");
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      j += n;
      if (v > 0x10FFFF) fail(line, "string literal: escape beyond U+10FFFF");
      return v;
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '0': out += '\0'; break;
      case '\n': break;
      case 'x': append_utf8(out, hex(2)); break;
      case 'u': append_utf8(out, hex(4)); break;
      case 'U': append_utf8(out, hex(8)); break;
      default: out += '\\'; out += e;
    }
  }
  return out;
}

// Tokenizes the inside of a tag. `pos` starts after the opener; returns the position of the
// closer ("}}" or "%}", with its '-' or '+' modifier) once found outside string literals.
size_t lex_tag(const std::string& src, size_t pos, const char* closer, int& line, std::vector<Token>& toks, int tag_line) {
  static const char* kOps3[] = {"**", "//", "==", "!=", "<=", ">="};
  std::string balance;  // open brackets, innermost last
  while (pos < src.size()) {
    const char c = src[pos];
    if (c == '\n') { ++line; ++pos; continue; }
    if (c == ' ' || c == '\t' || c == '\r') { ++pos; continue; }
    // closer, possibly with a '-' or '+' modifier just before it; as in jinja2's lexer, only
    // outside brackets ("{{ {'a': {}} }}" closes at the last "}}")
    if (balance.empty()) {
      if ((c == '-' || c == '+') && src.compare(pos + 1, 2, closer) == 0) return pos;
      if (src.compare(pos, 2, closer) == 0) return pos;
    }
    Token t;
    t.line = line;
    if (is_name_start(c)) {
      size_t e = pos;
      while (e < src.size() && is_name_char(src[e])) ++e;
      t.t = Tok::Name;
      t.s = src.substr(pos, e - pos);
      pos = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos;
      while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      bool is_float = false;
      if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
        is_float = true;
        ++e;
        while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
      }
      if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
        size_t q = e + 1;
        if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
        if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
          is_float = true;
          e = q;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
      }
      std::string text = src.substr(pos, e - pos);
      text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
      if (is_float) {
        t.t = Tok::Float;
        t.f = std::strtod(text.c_str(), nullptr);
      } else {
        t.t = Tok::Int;
        const auto r = std::from_chars(text.data(), text.data() + text.size(), t.i);
        if (r.ec != std::errc()) fail(line, "integer literal '" + text + "' out of the 64-bit range");
      }
      pos = e;
    } else if (c == '\'' || c == '"') {
      size_t e = pos + 1;
      while (e < src.size() && src[e] != c) {
        if (src[e] == '\\') ++e;
        if (e < src.size() && src[e] == '\n') ++line;
        ++e;
      }
      if (e >= src.size()) fail(t.line, "string literal: no closing quote");
      t.t = Tok::Str;
      t.s = decode_string(std::string_view(src).substr(pos + 1, e - pos - 1), t.line);
      pos = e + 1;
    } else {
      t.t = Tok::Op;
      bool found = false;
      for (const char* op : kOps3)
        if (src.compare(pos, 2, op) == 0) { t.s = op; pos += 2; found = true; break; }
      if (!found) {
        if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
          fail(line, std::string("unexpected character '") + (static_cast<unsigned char>(c) < 0x20 ? '?' : c) + "' in a tag");
        t.s = std::string(1, c);
        ++pos;
        if (c == '(' || c == '[' || c == '{') {
          balance += c;
        } else if (c == ')' || c == ']' || c == '}') {
          const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
          if (balance.empty()) fail(line, std::string("unexpected '") + c + "' (no bracket open)");
          if (balance.back() != open)
            fail(line, std::string("unexpected '") + c + "', expected '" + (balance.back() == '(' ? ')' : balance.back() == '[' ? ']' : '}') + "'");
          balance.pop_back();
        }
      }
    }
    toks.push_back(std::move(t));
  }
  fail(tag_line, std::string("tag opened here is never closed (expected '") + closer + "')");
}

std::vector<Piece> lex(std::string_view raw) {
  // jinja2 normalizes newlines to "\n" and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(raw.size());
  for (size_t j = 0; j < raw.size(); ++j) {
    if (raw[j] == '\r') {
      src += '\n';
      if (j + 1 < raw.size() && raw[j + 1] == '\n') ++j;
    } else {
      src += raw[j];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();

  std::vector<Piece> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  auto count_lines = [](std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); };
  while (pos <= src.size()) {
    size_t open = std::string::npos;
    char kind = 0;
    for (size_t q = src.find('{', pos); q != std::string::npos && q + 1 < src.size(); q = src.find('{', q + 1)) {
      const char n = src[q + 1];
      if (n == '{' || n == '%' || n == '#') { open = q; kind = n; break; }
    }
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(text);
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::Text, text, {}, text_line});
      break;
    }
    const char mod = open + 2 < src.size() ? src[open + 2] : 0;
    if (mod == '-') {
      size_t e = text.size();
      while (e > 0 && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
      text.resize(e);
    } else if (mod != '+' && (kind == '%' || kind == '#')) {  // lstrip_blocks
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if (l_pos > 0 || line_starting) {
        bool ws = l_pos < text.size();
        for (size_t q = l_pos; q < text.size(); ++q)
          if (!std::isspace(static_cast<unsigned char>(text[q]))) { ws = false; break; }
        if (ws) text.resize(l_pos);
      }
    }
    if (!text.empty()) out.push_back({Piece::Text, text, {}, text_line});
    const int tag_line = line;
    size_t body = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    size_t after;
    bool strip_after = false, plus_end = false;
    if (kind == '#') {
      const size_t close = src.find("#}", body);
      if (close == std::string::npos) fail(tag_line, "comment opened here is never closed (expected '#}')");
      line += count_lines(std::string_view(src).substr(body, close - body));
      strip_after = close > body && src[close - 1] == '-';
      plus_end = close > body && src[close - 1] == '+';
      after = close + 2;
    } else {
      Piece p{kind == '{' ? Piece::Var : Piece::Block, {}, {}, tag_line};
      const size_t close = lex_tag(src, body, kind == '{' ? "}}" : "%}", line, p.toks, tag_line);
      strip_after = src[close] == '-';
      plus_end = src[close] == '+';
      after = close + ((src[close] == '-' || src[close] == '+') ? 3 : 2);
      // {% raw %}...{% endraw %}: the text in between is output as it is
      if (kind == '%' && p.toks.size() == 1 && p.toks[0].t == Tok::Name && p.toks[0].s == "raw") {
        size_t q = after;
        size_t end_open = std::string::npos, end_close = 0;
        while ((q = src.find("{%", q)) != std::string::npos) {
          size_t r = q + 2;
          const bool minus = r < src.size() && src[r] == '-';
          if (minus || (r < src.size() && src[r] == '+')) ++r;
          while (r < src.size() && std::isspace(static_cast<unsigned char>(src[r]))) ++r;
          if (src.compare(r, 6, "endraw") == 0) {
            r += 6;
            while (r < src.size() && std::isspace(static_cast<unsigned char>(src[r]))) ++r;
            bool em = false;
            if (r < src.size() && (src[r] == '-' || src[r] == '+')) { em = src[r] == '-'; ++r; }
            if (src.compare(r, 2, "%}") == 0) {
              end_open = q;
              std::string inner = src.substr(after, q - after);
              if (strip_after) { size_t a = 0; while (a < inner.size() && std::isspace(static_cast<unsigned char>(inner[a]))) ++a; inner.erase(0, a); }
              if (minus) { size_t e = inner.size(); while (e > 0 && std::isspace(static_cast<unsigned char>(inner[e - 1]))) --e; inner.resize(e); }
              if (!inner.empty()) out.push_back({Piece::Text, inner, {}, line});
              line += count_lines(std::string_view(src).substr(after, r + 2 - after));
              end_close = r + 2;
              strip_after = em;
              plus_end = false;
              break;
            }
          }
          q += 2;
        }
        if (end_open == std::string::npos) fail(tag_line, "{% raw %} without {% endraw %}");
        after = end_close;
        kind = '%';
      } else {
        out.push_back(std::move(p));
      }
    }
    pos = after;
    if (strip_after) {
      while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos]))) {
        if (src[pos] == '\n') ++line;
        ++pos;
      }
      line_starting = pos > after && src[pos - 1] == '\n';
    } else if ((kind == '%' || kind == '#') && !plus_end && pos < src.size() && src[pos] == '\n') {  // trim_blocks
      ++pos;
      ++line;
      line_starting = true;
    } else {
      line_starting = false;
    }
    if (pos >= src.size()) break;
  }
  return out;
}

// ---- syntax tree ----------------------------------------------------------------------------------

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum Kind { Lit, Name, ListLit, TupleLit, DictLit, Attr, Index, Slice, Call, Filter, Test, Not, Neg, Pos, Bin, And, Or, Cond } kind;
  int line = 0;
  Value lit;
  std::string name;  // Name, Attr, Filter, Test; Bin: the operator
  std::vector<ExprP> kids;  // operands; Call/Filter/Test: kids[0] subject then the arguments
  std::vector<std::string> arg_names;  // Call/Filter/Test: "" for positional (parallel to kids[1..])
  bool negated = false;  // Test: "is not"
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Plain, FilterBlock, CallBlock } kind;
  int line = 0;
  std::string text;  // Text
  ExprP expr;        // Output, Set value, For iterable, If: unused
  std::vector<std::pair<ExprP, Body>> branches;  // If
  Body body, else_body;
  std::vector<std::string> targets;  // For, Set; Set with attr: targets[0].attr
  std::string attr;
  ExprP cond;  // For ... if cond; FilterBlock: the filter chain with a null subject
  std::vector<std::string> params;  // Macro
  std::vector<ExprP> defaults;      // Macro (nullptr: no default)
};

}  // namespace

struct Template {
  Body body;
  std::string origin;
};

namespace {

// ---- parser ------------------------------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& t, int line) : t_(t), line_(line) {}

  bool at_end() const { return p_ >= t_.size(); }
  const Token& peek(size_t ahead = 0) const {
    static const Token end{};
    return p_ + ahead < t_.size() ? t_[p_ + ahead] : end;
  }
  int line() const { return at_end() ? (t_.empty() ? line_ : t_.back().line) : t_[p_].line; }
  bool is_op(const char* s, size_t ahead = 0) const { return peek(ahead).t == Tok::Op && peek(ahead).s == s; }
  bool is_name(const char* s, size_t ahead = 0) const { return peek(ahead).t == Tok::Name && peek(ahead).s == s; }
  std::string show(const Token& t) const {
    switch (t.t) {
      case Tok::End: return "end of tag";
      case Tok::Str: return "string " + py_repr_str(t.s);
      case Tok::Int: return "integer " + std::to_string(t.i);
      case Tok::Float: return "number " + py_float_repr(t.f);
      default: return "'" + t.s + "'";
    }
  }
  [[noreturn]] void expected(const std::string& what) { fail(line(), "expected " + what + ", got " + show(peek())); }
  void expect_op(const char* s) {
    if (!is_op(s)) expected(std::string("'") + s + "'");
    ++p_;
  }
  std::string expect_name(const char* what) {
    if (peek().t != Tok::Name) expected(what);
    return t_[p_++].s;
  }
  void expect_end(const char* what) {
    if (!at_end()) fail(line(), std::string("unexpected ") + show(peek()) + " after " + what);
  }
  // The closing tag of a block ("endif", "else", ...): nothing may follow the keyword but, for
  // endmacro, the macro's name.
  void expect_end_after_keyword(bool allow_name = false) {
    const std::string kw = expect_name("a keyword");
    if (allow_name && peek().t == Tok::Name) ++p_;
    expect_end(("'" + kw + "'").c_str());
  }
  // {% filter name(args) | name2 %}: a filter chain without a subject
  ExprP filters_from_name() {
    ExprP e;
    do {
      auto f = make(Expr::Filter, line());
      f->name = expect_name("a filter name");
      f->kids.push_back(std::move(e));
      if (accept_op("(")) call_args(*f);
      e = std::move(f);
    } while (accept_op("|"));
    return e;
  }
  bool accept_name(const char* s) { if (is_name(s)) { ++p_; return true; } return false; }
  bool accept_op(const char* s) { if (is_op(s)) { ++p_; return true; } return false; }

  ExprP make(Expr::Kind k, int line) { auto e = std::make_unique<Expr>(); e->kind = k; e->line = line; return e; }

  struct Depth {
    ExprParser& p;
    explicit Depth(ExprParser& q) : p(q) { if (++p.depth_ > kMaxDepth) fail(p.line(), "expression nested deeper than " + std::to_string(kMaxDepth) + " levels"); }
    ~Depth() { --p.depth_; }
  };

  ExprP expression(bool with_cond = true) {
    Depth d(*this);
    ExprP e = or_expr();
    if (with_cond) {
      while (is_name("if")) {
        const int ln = line();
        ++p_;
        auto c = make(Expr::Cond, ln);
        ExprP cond = or_expr();
        ExprP other;
        if (accept_name("else")) other = expression();
        c->kids.push_back(std::move(e));
        c->kids.push_back(std::move(cond));
        if (other) c->kids.push_back(std::move(other));
        e = std::move(c);
      }
    }
    return e;
  }
  // expression, or a tuple of them without parentheses ("a, b")
  ExprP tuple_or_expression() {
    const int ln = line();
    ExprP first = expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::TupleLit, ln);
    t->kids.push_back(std::move(first));
    while (accept_op(",")) {
      if (at_end() || is_op(")") || is_op("]")) break;
      t->kids.push_back(expression());
    }
    return t;
  }
  ExprP binary(Expr::Kind k, const std::string& op, ExprP a, ExprP b, int ln) {
    auto e = make(k, ln);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) { const int ln = line(); ++p_; e = binary(Expr::Or, "or", std::move(e), and_expr(), ln); }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) { const int ln = line(); ++p_; e = binary(Expr::And, "and", std::move(e), not_expr(), ln); }
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      Depth d(*this);
      const int ln = line();
      ++p_;
      auto e = make(Expr::Not, ln);
      e->kids.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    for (;;) {
      const int ln = line();
      std::string op;
      if (peek().t == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                  peek().s == "<=" || peek().s == ">=")) {
        op = peek().s;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        p_ += 2;
      } else {
        return e;
      }
      e = binary(Expr::Bin, op, std::move(e), math1(), ln);
    }
  }
  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) { const int ln = line(); const std::string op = t_[p_++].s; e = binary(Expr::Bin, op, std::move(e), concat(), ln); }
    return e;
  }
  ExprP concat() {
    ExprP e = math2();
    while (is_op("~")) { const int ln = line(); ++p_; e = binary(Expr::Bin, "~", std::move(e), math2(), ln); }
    return e;
  }
  ExprP math2() {
    ExprP e = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const int ln = line();
      const std::string op = t_[p_++].s;
      e = binary(Expr::Bin, op, std::move(e), pow(), ln);
    }
    return e;
  }
  ExprP pow() {
    ExprP e = unary(true);
    while (is_op("**")) { const int ln = line(); ++p_; e = binary(Expr::Bin, "**", std::move(e), unary(true), ln); }
    return e;
  }
  ExprP unary(bool with_filter) {
    Depth d(*this);
    const int ln = line();
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const bool neg = is_op("-");
      ++p_;
      e = make(neg ? Expr::Neg : Expr::Pos, ln);
      e->kids.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters(std::move(e));
    return e;
  }
  ExprP primary() {
    const Token& t = peek();
    const int ln = line();
    if (t.t == Tok::Name) {
      ++p_;
      if (t.s == "true" || t.s == "True") { auto e = make(Expr::Lit, ln); e->lit = Value::boolean(true); return e; }
      if (t.s == "false" || t.s == "False") { auto e = make(Expr::Lit, ln); e->lit = Value::boolean(false); return e; }
      if (t.s == "none" || t.s == "None") { auto e = make(Expr::Lit, ln); e->lit = Value::none(); return e; }
      auto e = make(Expr::Name, ln);
      e->name = t.s;
      return e;
    }
    if (t.t == Tok::Str) {
      std::string s;
      while (peek().t == Tok::Str) s += t_[p_++].s;  // adjacent literals concatenate
      auto e = make(Expr::Lit, ln);
      e->lit = Value::str(std::move(s));
      return e;
    }
    if (t.t == Tok::Int || t.t == Tok::Float) {
      ++p_;
      auto e = make(Expr::Lit, ln);
      e->lit = t.t == Tok::Int ? Value::integer(t.i) : Value::real(t.f);
      return e;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return make(Expr::TupleLit, ln);
      ExprP first = expression();
      if (accept_op(")")) return first;
      auto tup = make(Expr::TupleLit, ln);
      tup->kids.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        tup->kids.push_back(expression());
      }
      expect_op(")");
      return tup;
    }
    if (accept_op("[")) {
      auto l = make(Expr::ListLit, ln);
      while (!is_op("]")) {
        if (!l->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        l->kids.push_back(expression());
      }
      expect_op("]");
      return l;
    }
    if (accept_op("{")) {
      auto d = make(Expr::DictLit, ln);
      while (!is_op("}")) {
        if (!d->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        d->kids.push_back(expression());
        expect_op(":");
        d->kids.push_back(expression());
      }
      expect_op("}");
      return d;
    }
    expected("an expression");
  }
  void call_args(Expr& e) {  // after '('
    while (!is_op(")")) {
      if (e.kids.size() > 1) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(line(), "call with *args/**kwargs is not supported");
      if (peek().t == Tok::Name && is_op("=", 1)) {
        e.arg_names.push_back(t_[p_].s);
        p_ += 2;
      } else {
        if (!e.arg_names.empty() && !e.arg_names.back().empty()) fail(line(), "positional argument after a keyword argument");
        e.arg_names.emplace_back();
      }
      e.kids.push_back(expression());
    }
    expect_op(")");
  }
  ExprP postfix(ExprP e) {
    for (;;) {
      const int ln = line();
      if (accept_op(".")) {
        auto a = make(Expr::Attr, ln);
        if (peek().t == Tok::Int) a->name = std::to_string(t_[p_++].i), a->lit = Value::integer(std::stoll(a->name));
        else a->name = expect_name("an attribute name after '.'");
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (accept_op("[")) {
        ExprP parts[3];
        bool slice = false;
        int colons = 0;
        for (;;) {
          if (is_op(":")) { ++p_; slice = true; if (++colons > 2) expected("']'"); continue; }
          if (is_op("]")) break;
          if (parts[colons]) expected("':' or ']'");
          parts[colons] = expression();
        }
        expect_op("]");
        if (!slice && !parts[0]) fail(ln, "empty subscript '[]'");
        auto s = make(slice ? Expr::Slice : Expr::Index, ln);
        s->kids.push_back(std::move(e));
        if (slice) for (auto& q : parts) s->kids.push_back(std::move(q));
        else s->kids.push_back(std::move(parts[0]));
        e = std::move(s);
      } else if (accept_op("(")) {
        auto c = make(Expr::Call, ln);
        c->kids.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprP filters(ExprP e) {
    for (;;) {
      const int ln = line();
      if (accept_op("|")) {
        auto f = make(Expr::Filter, ln);
        f->name = expect_name("a filter name after '|'");
        f->kids.push_back(std::move(e));
        if (accept_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::Test, ln);
        t->negated = accept_name("not");
        if (peek().t == Tok::Name) t->name = t_[p_++].s;
        else expected("a test name after 'is'");
        t->kids.push_back(std::move(e));
        if (accept_op("(")) {
          call_args(*t);
        } else if ((peek().t == Tok::Name || peek().t == Tok::Str || peek().t == Tok::Int || peek().t == Tok::Float ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->arg_names.emplace_back();
          t->kids.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        ++p_;
        auto c = make(Expr::Call, ln);
        c->kids.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
};

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : ps_(std::move(pieces)) {}

  Body parse_all() {
    std::string stop;
    Body b = body({}, stop);
    return b;
  }

 private:
  // Parses pieces until a block tag whose first word is in `ends`; returns its word in `stop`
  // (the tag's tokens stay in cur_ for the caller).
  Body body(const std::set<std::string>& ends, std::string& stop, int opener_line = 0, const char* opener = nullptr) {
    if (++depth_ > kMaxDepth) fail(opener_line, "blocks nested deeper than " + std::to_string(kMaxDepth) + " levels");
    Body out;
    while (i_ < ps_.size()) {
      Piece& p = ps_[i_++];
      if (p.kind == Piece::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Text;
        n->line = p.line;
        n->text = std::move(p.text);
        out.push_back(std::move(n));
        continue;
      }
      if (p.kind == Piece::Var) {
        ExprParser ep(p.toks, p.line);
        if (ep.at_end()) fail(p.line, "empty expression '{{ }}'");
        auto n = std::make_unique<Node>();
        n->kind = Node::Output;
        n->line = p.line;
        n->expr = ep.tuple_or_expression();
        ep.expect_end("the expression in '{{ ... }}'");
        out.push_back(std::move(n));
        continue;
      }
      if (p.toks.empty() || p.toks[0].t != Tok::Name) fail(p.line, "a statement tag '{% ... %}' must start with a keyword");
      const std::string& kw = p.toks[0].s;
      if (ends.count(kw)) {
        stop = kw;
        cur_ = &p;
        --depth_;
        return out;
      }
      out.push_back(statement(p));
    }
    if (opener) fail(opener_line, std::string("'") + opener + "' opened here is never closed (expected '{% " + *ends.begin() + " %}', got the end of the template)");
    --depth_;
    return out;
  }

  std::unique_ptr<Node> statement(Piece& p) {
    ExprParser ep(p.toks, p.line);
    const std::string kw = ep.expect_name("a statement keyword");
    auto n = std::make_unique<Node>();
    n->line = p.line;
    std::string stop;
    if (kw == "if") {
      n->kind = Node::If;
      ExprP cond = ep.expression();
      ep.expect_end("the condition of 'if'");
      for (;;) {
        Body b = body({"elif", "else", "endif"}, stop, p.line, "if");
        n->branches.emplace_back(std::move(cond), std::move(b));
        ExprParser tail(cur_->toks, cur_->line);
        tail.expect_name("elif/else/endif");
        if (stop == "elif") {
          cond = tail.expression();
          tail.expect_end("the condition of 'elif'");
          continue;
        }
        tail.expect_end(stop == "else" ? "'else'" : "'endif'");
        if (stop == "else") {
          n->else_body = body({"endif"}, stop, p.line, "if");
          ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
        }
        break;
      }
    } else if (kw == "for") {
      n->kind = Node::For;
      do n->targets.push_back(ep.expect_name("a loop variable name after 'for'"));
      while (ep.accept_op(","));
      if (!ep.accept_name("in")) ep.expected("'in' after the loop variables");
      {
        const int ln = ep.line();
        ExprP it = ep.expression(false);
        if (ep.is_op(",")) {
          auto t = ep.make(Expr::TupleLit, ln);
          t->kids.push_back(std::move(it));
          while (ep.accept_op(",")) t->kids.push_back(ep.expression(false));
          it = std::move(t);
        }
        n->expr = std::move(it);
      }
      if (ep.accept_name("if")) n->cond = ep.expression(false);
      if (ep.is_name("recursive")) fail(p.line, "'for ... recursive' is not supported");
      ep.expect_end("the 'for' header");
      ++loop_depth_;
      n->body = body({"else", "endfor"}, stop, p.line, "for");
      --loop_depth_;
      if (stop == "else") {
        ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
        n->else_body = body({"endfor"}, stop, p.line, "for");
      }
      ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
    } else if (kw == "set") {
      const std::string first = ep.expect_name("a variable name after 'set'");
      n->targets.push_back(first);
      if (ep.accept_op(".")) {
        n->attr = ep.expect_name("an attribute name after '.'");
      } else {
        while (ep.accept_op(",")) n->targets.push_back(ep.expect_name("a variable name"));
      }
      if (ep.at_end() || ep.is_op("|")) {  // {% set x %}...{% endset %}
        if (!n->attr.empty() || n->targets.size() != 1) fail(p.line, "block 'set' assigns one plain variable");
        n->kind = Node::SetBlock;
        if (ep.is_op("|")) {
          auto f = ep.filters(nullptr);
          n->cond = std::move(f);
        }
        ep.expect_end("the block 'set' header");
        n->body = body({"endset"}, stop, p.line, "set");
        ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
      } else {
        n->kind = Node::Set;
        ep.expect_op("=");
        n->expr = ep.tuple_or_expression();
        ep.expect_end("the value of 'set'");
      }
    } else if (kw == "macro") {
      n->kind = Node::Macro;
      n->attr = ep.expect_name("a macro name");
      ep.expect_op("(");
      while (!ep.is_op(")")) {
        if (!n->params.empty()) ep.expect_op(",");
        if (ep.is_op(")")) break;
        n->params.push_back(ep.expect_name("a parameter name"));
        n->defaults.push_back(ep.accept_op("=") ? ep.expression() : nullptr);
        if (!n->defaults.back() && n->defaults.size() > 1 && n->defaults[n->defaults.size() - 2])
          fail(p.line, "macro parameter '" + n->params.back() + "' without a default after one with a default");
      }
      ep.expect_op(")");
      ep.expect_end("the macro header");
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;
      n->body = body({"endmacro"}, stop, p.line, "macro");
      loop_depth_ = saved_loops;
      ExprParser(cur_->toks, cur_->line).expect_end_after_keyword(true);
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Break : Node::Continue;
      ep.expect_end(kw == "break" ? "'break'" : "'continue'");
      if (loop_depth_ == 0) fail(p.line, "'" + kw + "' outside a 'for' loop");
    } else if (kw == "generation") {  // transformers' AssistantTracker: renders its body
      n->kind = Node::Plain;
      ep.expect_end("'generation'");
      n->body = body({"endgeneration"}, stop, p.line, "generation");
      ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
    } else if (kw == "filter") {
      n->kind = Node::FilterBlock;
      n->cond = ep.filters_from_name();
      ep.expect_end("the 'filter' header");
      n->body = body({"endfilter"}, stop, p.line, "filter");
      ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
    } else if (kw == "call") {
      n->kind = Node::CallBlock;
      n->expr = ep.expression();
      if (n->expr->kind != Expr::Call) fail(p.line, "'call' block: expected a macro call");
      ep.expect_end("the 'call' header");
      n->body = body({"endcall"}, stop, p.line, "call");
      ExprParser(cur_->toks, cur_->line).expect_end_after_keyword();
    } else if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) {
      fail(p.line, "'{% " + kw + " %}' without a matching opening tag");
    } else {
      fail(p.line, "unsupported statement '{% " + kw + " %}' (supported: if, for, set, macro, call, filter, break, "
                   "continue, raw, generation)");
    }
    return n;
  }

  std::vector<Piece> ps_;
  size_t i_ = 0;
  Piece* cur_ = nullptr;
  int depth_ = 0;
  int loop_depth_ = 0;  // for bodies being parsed (break/continue belong in one)
};


// ---- rendering ---------------------------------------------------------------------------------------

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopeP = std::shared_ptr<Scope>;

Value lookup(const ScopeP& sc, const std::string& name) {
  for (const Scope* s = sc.get(); s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::undef(name);
}

[[noreturn]] void undefined_use(const Value& v, int line, const std::string& what) {
  fail(line, (v.s.empty() ? std::string("an undefined value") : "'" + v.s + "' is undefined") + " (" + what + ")");
}

// Argument access for built-in filters, tests, methods and globals: position `idx` or keyword `name`.
const Value* find_arg(const Args& a, size_t idx, const char* name) {
  if (idx < a.pos.size()) return &a.pos[idx];
  for (const auto& [k, v] : a.kw)
    if (k == name) return &v;
  return nullptr;
}
Value arg_or(const Args& a, size_t idx, const char* name, Value def) {
  const Value* v = find_arg(a, idx, name);
  return v ? *v : std::move(def);
}
void max_args(const Args& a, size_t n, const std::string& what, std::initializer_list<const char*> names) {
  if (a.pos.size() > n) fail(a.line, what + ": takes at most " + std::to_string(n) + " positional arguments, got " + std::to_string(a.pos.size()));
  for (const auto& [k, v] : a.kw) {
    bool ok = false;
    for (const char* nm : names) ok = ok || k == nm;
    if (!ok) fail(a.line, what + ": unexpected keyword argument '" + k + "'");
  }
}
std::string str_arg(const Args& a, size_t idx, const char* name, const std::string& what) {
  const Value* v = find_arg(a, idx, name);
  if (!v || v->k != Value::K::Str) fail(a.line, what + ": argument '" + name + "' expected a string, got " + (v ? describe(*v) : std::string("nothing")));
  return v->s;
}
int64_t int_arg(const Args& a, size_t idx, const char* name, int64_t def, const std::string& what) {
  const Value* v = find_arg(a, idx, name);
  if (!v || v->k == Value::K::None) return def;
  if (v->k != Value::K::Int && v->k != Value::K::Bool) fail(a.line, what + ": argument '" + name + "' expected an integer, got " + describe(*v));
  return inum(*v);
}

List iterate(const Value& v, int line, const char* what) {
  switch (v.k) {
    case Value::K::Undef: return {};
    case Value::K::List: return *v.l;
    case Value::K::Dict: {
      List keys;
      for (const auto& [k, x] : v.d->items) keys.push_back(Value::str(k));
      return keys;
    }
    case Value::K::Str: {
      List chars;
      for (char32_t c : to_u32(v.s)) { std::string one; append_utf8(one, c); chars.push_back(Value::str(std::move(one))); }
      return chars;
    }
    default: fail(line, std::string(what) + ": " + describe(v) + " is not iterable");
  }
}

int64_t length(const Value& v, int line) {
  switch (v.k) {
    case Value::K::Undef: return 0;
    case Value::K::Str: return static_cast<int64_t>(to_u32(v.s).size());
    case Value::K::List: return static_cast<int64_t>(v.l->size());
    case Value::K::Dict: return static_cast<int64_t>(v.d->items.size());
    default: fail(line, "length: " + describe(v) + " has no length");
  }
}

bool contains(const Value& hay, const Value& needle, int line) {
  switch (hay.k) {
    case Value::K::Undef: return false;
    case Value::K::Str:
      if (needle.k != Value::K::Str) fail(line, "'in <string>' requires a string on the left, got " + describe(needle));
      return hay.s.find(needle.s) != std::string::npos;
    case Value::K::List:
      for (const Value& x : *hay.l)
        if (equal(x, needle)) return true;
      return false;
    case Value::K::Dict: return needle.k == Value::K::Str && hay.d->find(needle.s);
    default: fail(line, "'in': " + describe(hay) + " is not a container");
  }
}

// Python slice of a sequence of `n` items: the chosen indices.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step, int line) {
  auto as_int = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.k == Value::K::Undef || v.k == Value::K::None) return std::nullopt;
    if (v.k != Value::K::Int && v.k != Value::K::Bool) fail(line, std::string("slice ") + what + ": expected an integer, got " + describe(v));
    return inum(v);
  };
  const int64_t st = as_int(step, "step").value_or(1);
  if (st == 0) fail(line, "slice step cannot be zero");
  const int64_t lower = st < 0 ? -1 : 0, upper = st < 0 ? n - 1 : n;
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) { x += n; if (x < lower) x = lower; }
    else if (x > upper) x = upper;
    return x;
  };
  const int64_t a = adjust(as_int(start, "start"), st < 0 ? upper : lower);
  const int64_t b = adjust(as_int(stop, "stop"), st < 0 ? lower : upper);
  std::vector<int64_t> out;
  for (int64_t i = a; st > 0 ? i < b : i > b; i += st) out.push_back(i);
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `rep` around every character
    const std::u32string u = to_u32(s);
    int64_t done = 0;
    for (size_t j = 0; j <= u.size(); ++j) {
      if (count < 0 || done < count) { out += rep; ++done; }
      if (j < u.size()) append_utf8(out, u[j]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  for (;;) {
    const size_t at = (count >= 0 && done >= count) ? std::string::npos : s.find(old, pos);
    if (at == std::string::npos) { out += s.substr(pos); return out; }
    out += s.substr(pos, at - pos) + rep;
    pos = at + old.size();
    ++done;
  }
}

List py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit, bool from_right, int line) {
  List out;
  if (sep) {
    if (sep->empty()) fail(line, "split: empty separator");
    std::vector<std::string> parts;
    if (!from_right) {
      size_t pos = 0;
      for (;;) {
        const size_t at = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) ? std::string::npos : s.find(*sep, pos);
        if (at == std::string::npos) { parts.push_back(s.substr(pos)); break; }
        parts.push_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
    } else {
      size_t end = s.size();
      for (;;) {
        const size_t at = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) || end < sep->size()
                              ? std::string::npos : s.rfind(*sep, end - sep->size());
        if (at == std::string::npos) { parts.push_back(s.substr(0, end)); break; }
        parts.push_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.push_back(Value::str(std::move(p)));
    return out;
  }
  // whitespace split: runs of whitespace separate, no empty strings
  const std::u32string u = to_u32(s);
  std::vector<std::pair<size_t, size_t>> words;
  if (!from_right) {
    size_t j = 0;
    while (j < u.size()) {
      while (j < u.size() && py_isspace(u[j])) ++j;
      if (j >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(words.size()) >= maxsplit) {  // the rest, as it is
        words.emplace_back(j, u.size());
        break;
      }
      size_t e = j;
      while (e < u.size() && !py_isspace(u[e])) ++e;
      words.emplace_back(j, e);
      j = e;
    }
  } else {
    size_t j = u.size();
    while (j > 0) {
      while (j > 0 && py_isspace(u[j - 1])) --j;
      if (j == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(words.size()) >= maxsplit) {
        words.emplace_back(0, j);
        break;
      }
      size_t b = j;
      while (b > 0 && !py_isspace(u[b - 1])) --b;
      words.emplace_back(b, j);
      j = b;
    }
    std::reverse(words.begin(), words.end());
  }
  for (auto [a, b] : words) out.push_back(Value::str(from_u32(std::u32string_view(u).substr(a, b - a))));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = py_lower_upper(s, false);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string title_case(const std::string& s) {  // Python str.title on ASCII letters
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha) c = static_cast<char>(prev_cased ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c)));
    prev_cased = alpha;
  }
  return out;
}

class Renderer {
 public:
  Renderer(const Template& t, ScopeP globals) : t_(t), globals_(std::move(globals)) {}

  enum class Flow { Normal, Break, Continue };

  std::string run() {
    auto root = std::make_shared<Scope>();
    root->parent = globals_;
    std::string out;
    exec(t_.body, root, out);
    return out;
  }

 private:
  const Template& t_;
  ScopeP globals_;
  int depth_ = 0;
  int64_t iterations_ = 0;
  int64_t steps_ = 0;
  int64_t built_ = 0;

  void charge(int64_t bytes, int line) {
    built_ += bytes;
    if (built_ > kMaxBuiltBytes) fail(line, "the render builds more than " + std::to_string(kMaxBuiltBytes >> 30) + " GiB of strings and lists (a loop concatenating without end?)");
  }
  static int64_t size_of(const Value& v) {
    return v.k == Value::K::Str ? static_cast<int64_t>(v.s.size()) : v.k == Value::K::List ? static_cast<int64_t>(v.l->size()) * 16 : 0;
  }

  void emit(std::string& out, const std::string& s, int line) {
    if (out.size() + s.size() > kMaxOutputBytes) fail(line, "output exceeds " + std::to_string(kMaxOutputBytes >> 20) + " MiB");
    out += s;
  }

  Flow exec(const Body& body, const ScopeP& sc, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec_node(*n, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void assign(const ScopeP& sc, const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) { sc->vars[targets[0]] = v; return; }
    if (v.k != Value::K::List) fail(line, "cannot unpack " + describe(v) + " into " + std::to_string(targets.size()) + " variables");
    if (v.l->size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(v.l->size()) + " values into " + std::to_string(targets.size()) + " variables");
    for (size_t j = 0; j < targets.size(); ++j) sc->vars[targets[j]] = (*v.l)[j];
  }

  Flow exec_node(const Node& n, const ScopeP& sc, std::string& out) {
    switch (n.kind) {
      case Node::Text: emit(out, n.text, n.line); return Flow::Normal;
      case Node::Output: emit(out, to_str(eval(*n.expr, sc)), n.line); return Flow::Normal;
      case Node::If:
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond, sc))) return exec(body, sc, out);
        return exec(n.else_body, sc, out);
      case Node::For: return exec_for(n, sc, out);
      case Node::Set: {
        Value v = eval(*n.expr, sc);
        if (!n.attr.empty()) {
          Value target = lookup(sc, n.targets[0]);
          if (target.k != Value::K::Dict || !target.ns)
            fail(n.line, "'set " + n.targets[0] + "." + n.attr + "': can only assign attributes of a namespace(), not of " + describe(target));
          target.d->set(n.attr, std::move(v));
        } else {
          assign(sc, n.targets, v, n.line);
        }
        return Flow::Normal;
      }
      case Node::SetBlock: {
        std::string inner;
        exec(n.body, sc, inner);
        Value v = Value::str(std::move(inner));
        if (n.cond) v = apply_filters(*n.cond, std::move(v), sc);
        sc->vars[n.targets[0]] = std::move(v);
        return Flow::Normal;
      }
      case Node::Macro: sc->vars[n.attr] = make_macro(n, sc); return Flow::Normal;
      case Node::Break: return Flow::Break;
      case Node::Continue: return Flow::Continue;
      case Node::Plain: return exec(n.body, sc, out);
      case Node::FilterBlock: {
        std::string inner;
        exec(n.body, sc, inner);
        emit(out, to_str(apply_filters(*n.cond, Value::str(std::move(inner)), sc)), n.line);
        return Flow::Normal;
      }
      case Node::CallBlock: {
        // {% call macro(args) %}body{% endcall %}: the macro sees `caller()` rendering the body
        const Node* np = &n;
        Value f = eval(*n.expr->kids[0], sc);
        Args a = eval_args(*n.expr, sc);
        if (f.k != Value::K::Func) fail(n.line, "'call' block: " + describe(f) + " is not a macro");
        a.kw.emplace_back("caller", Value::func("caller", [this, np, sc](Args&) {
          std::string s;
          auto body_scope = std::make_shared<Scope>();
          body_scope->parent = sc;
          exec(np->body, body_scope, s);
          return Value::str(std::move(s));
        }));
        emit(out, to_str((*f.fn)(a)), n.line);
        return Flow::Normal;
      }
    }
    return Flow::Normal;
  }

  // A filter chain whose innermost subject is null (block filters): applies it to `v`.
  Value apply_filters(const Expr& chain, Value v, const ScopeP& sc) {
    if (chain.kids[0]) v = apply_filters(*chain.kids[0], std::move(v), sc);
    Args a = eval_args(chain, sc);
    return filter(chain.name, v, a, sc);
  }

  Flow exec_for(const Node& n, const ScopeP& sc, std::string& out) {
    const Value src = eval(*n.expr, sc);
    List items = iterate(src, n.line, "for");
    if (n.cond) {
      List kept;
      for (const Value& it : items) {
        auto s = std::make_shared<Scope>();
        s->parent = sc;
        assign(s, n.targets, it, n.line);
        if (truthy(eval(*n.cond, s))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, sc, out);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t j = 0; j < len; ++j) {
      if (++iterations_ > kMaxIterations) fail(n.line, "more than " + std::to_string(kMaxIterations) + " loop iterations");
      auto s = std::make_shared<Scope>();
      s->parent = sc;
      assign(s, n.targets, items[static_cast<size_t>(j)], n.line);
      Value loop = Value::dict();
      Dict& d = *loop.d;
      d.set("index", Value::integer(j + 1));
      d.set("index0", Value::integer(j));
      d.set("revindex", Value::integer(len - j));
      d.set("revindex0", Value::integer(len - j - 1));
      d.set("first", Value::boolean(j == 0));
      d.set("last", Value::boolean(j == len - 1));
      d.set("length", Value::integer(len));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", j > 0 ? items[static_cast<size_t>(j - 1)] : Value::undef("previtem"));
      d.set("nextitem", j + 1 < len ? items[static_cast<size_t>(j + 1)] : Value::undef("nextitem"));
      d.set("cycle", Value::func("cycle", [j](Args& a) {
        if (a.pos.empty()) fail(a.line, "loop.cycle: no items to cycle");
        return a.pos[static_cast<size_t>(j) % a.pos.size()];
      }));
      s->vars["loop"] = std::move(loop);
      const Flow f = exec(n.body, s, out);
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Node& n, const ScopeP& def_scope) {
    const Node* np = &n;
    std::weak_ptr<Scope> weak = def_scope;  // the macro lives in that scope: no cycle
    return Value::func(n.attr, [this, np, weak](Args& a) {
      ScopeP parent = weak.lock();
      if (!parent) fail(a.line, "macro '" + np->attr + "' called after its scope ended");
      if (++depth_ > kMaxDepth) fail(a.line, "macro '" + np->attr + "': calls nested deeper than " + std::to_string(kMaxDepth));
      struct Leave { int& d; ~Leave() { --d; } } leave{depth_};
      auto s = std::make_shared<Scope>();
      s->parent = parent;
      if (a.pos.size() > np->params.size())
        fail(a.line, "macro '" + np->attr + "' takes " + std::to_string(np->params.size()) + " arguments, got " + std::to_string(a.pos.size()));
      for (const auto& [k, v] : a.kw)
        if (std::find(np->params.begin(), np->params.end(), k) == np->params.end() && k != "caller")
          fail(a.line, "macro '" + np->attr + "' takes no keyword argument '" + k + "'");
      for (size_t j = 0; j < np->params.size(); ++j) {
        const Value* v = find_arg(a, j, np->params[j].c_str());
        if (v) s->vars[np->params[j]] = *v;
        else if (np->defaults[j]) s->vars[np->params[j]] = eval(*np->defaults[j], s);
        else s->vars[np->params[j]] = Value::undef(np->params[j]);
      }
      if (const Value* c = find_arg(a, SIZE_MAX, "caller")) s->vars["caller"] = *c;  // {% call %} block
      std::string out;
      exec(np->body, s, out);
      return Value::str(std::move(out));
    });
  }

  Args eval_args(const Expr& e, const ScopeP& sc) {
    Args a;
    a.line = e.line;
    for (size_t j = 1; j < e.kids.size(); ++j) {
      Value v = eval(*e.kids[j], sc);
      if (e.arg_names[j - 1].empty()) a.pos.push_back(std::move(v));
      else a.kw.emplace_back(e.arg_names[j - 1], std::move(v));
    }
    return a;
  }

  // ---- attribute and item access ----
  Value bound(const Value& self, const std::string& name, int line) {
    return Value::func(name, [this, self, name](Args& a) { return call_method(self, name, a); });
  }

  static bool is_method(const Value& v, const std::string& name) {
    static const std::set<std::string> str_methods = {
        "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "replace", "upper",
        "lower", "title", "capitalize", "find", "rfind", "count", "join", "format", "isdigit", "isalpha", "isalnum",
        "isspace", "islower", "isupper", "index", "removeprefix", "removesuffix"};
    static const std::set<std::string> dict_methods = {"get", "items", "keys", "values"};
    static const std::set<std::string> list_methods = {"index", "count"};
    if (v.k == Value::K::Str) return str_methods.count(name) > 0;
    if (v.k == Value::K::Dict && !v.ns) return dict_methods.count(name) > 0;
    if (v.k == Value::K::List) return list_methods.count(name) > 0;
    return false;
  }

  Value getattr(const Value& obj, const std::string& name, int line, const Value* int_name = nullptr) {
    if (obj.is_undef()) undefined_use(obj, line, "its attribute '" + name + "' was asked for");
    if (is_method(obj, name)) return bound(obj, name, line);
    static const std::set<std::string> mutating = {"append", "pop", "update", "clear", "extend", "insert", "remove",
                                                   "setdefault", "popitem", "sort", "reverse", "add", "discard"};
    if ((obj.k == Value::K::List || (obj.k == Value::K::Dict && !obj.ns)) && mutating.count(name))
      fail(line, "'" + name + "': templates cannot modify values (transformers renders in jinja2's immutable sandbox)");
    if (obj.k == Value::K::Dict) {
      const Value* v = obj.d->find(name);
      return v ? *v : Value::undef(name);
    }
    if (int_name) return getitem(obj, *int_name, line);
    return Value::undef(name);
  }

  Value getitem(const Value& obj, const Value& key, int line) {
    if (obj.is_undef()) undefined_use(obj, line, "an item of it was asked for");
    if (obj.k == Value::K::Dict) {
      if (key.k == Value::K::Str) {
        if (const Value* v = obj.d->find(key.s)) return *v;
        if (is_method(obj, key.s)) return bound(obj, key.s, line);
        return Value::undef(key.s);
      }
      return Value::undef();
    }
    if ((obj.k == Value::K::List || obj.k == Value::K::Str) && (key.k == Value::K::Int || key.k == Value::K::Bool)) {
      int64_t idx = inum(key);
      if (obj.k == Value::K::List) {
        const auto n = static_cast<int64_t>(obj.l->size());
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n) return Value::undef();
        return (*obj.l)[static_cast<size_t>(idx)];
      }
      const std::u32string u = to_u32(obj.s);
      const auto n = static_cast<int64_t>(u.size());
      if (idx < 0) idx += n;
      if (idx < 0 || idx >= n) return Value::undef();
      std::string one;
      append_utf8(one, u[static_cast<size_t>(idx)]);
      return Value::str(one);
    }
    if (key.k == Value::K::Str) return getattr(obj, key.s, line);
    return Value::undef();
  }

  // ---- methods of str, dict and list ----
  Value call_method(const Value& self, const std::string& m, Args& a) {
    const int line = a.line;
    const std::string what = std::string(type_name(self)) + "." + m + "()";
    if (self.k == Value::K::Dict) {
      if (m == "get") {
        max_args(a, 2, what, {});
        if (a.pos.empty()) fail(line, what + ": expected a key");
        const Value* v = a.pos[0].k == Value::K::Str ? self.d->find(a.pos[0].s) : nullptr;
        return v ? *v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
      }
      max_args(a, 0, what, {});
      List out;
      for (const auto& [k, v] : self.d->items) {
        if (m == "items") out.push_back(Value::list({Value::str(k), v}, true));
        else if (m == "keys") out.push_back(Value::str(k));
        else out.push_back(v);
      }
      return Value::list(std::move(out));
    }
    if (self.k == Value::K::List) {
      max_args(a, 1, what, {});
      if (a.pos.empty()) fail(line, what + ": expected a value");
      int64_t count = 0;
      for (size_t j = 0; j < self.l->size(); ++j)
        if (equal((*self.l)[j], a.pos[0])) {
          if (m == "index") return Value::integer(static_cast<int64_t>(j));
          ++count;
        }
      if (m == "index") fail(line, what + ": " + describe(a.pos[0]) + " is not in the list");
      return Value::integer(count);
    }
    const std::string& s = self.s;
    auto opt_chars = [&](size_t idx, const char* name) -> std::optional<std::string> {
      const Value* v = find_arg(a, idx, name);
      if (!v || v->k == Value::K::None) return std::nullopt;
      if (v->k != Value::K::Str) fail(line, what + ": expected a string or None, got " + describe(*v));
      return v->s;
    };
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      max_args(a, 1, what, {});
      return Value::str(py_strip(s, opt_chars(0, "chars"), m != "rstrip", m != "lstrip"));
    }
    if (m == "split" || m == "rsplit") {
      max_args(a, 2, what, {"sep", "maxsplit"});
      return Value::list(py_split(s, opt_chars(0, "sep"), int_arg(a, 1, "maxsplit", -1, what), m == "rsplit", line));
    }
    if (m == "splitlines") {
      List out;
      std::string cur;
      for (size_t j = 0; j < s.size(); ++j) {
        if (s[j] == '\n' || s[j] == '\r') {
          out.push_back(Value::str(cur));
          cur.clear();
          if (s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ++j;
        } else {
          cur += s[j];
        }
      }
      if (!cur.empty()) out.push_back(Value::str(cur));
      return Value::list(std::move(out));
    }
    if (m == "startswith" || m == "endswith") {
      max_args(a, 1, what, {});
      if (a.pos.empty()) fail(line, what + ": expected a prefix");
      std::vector<std::string> cands;
      if (a.pos[0].k == Value::K::Str) cands.push_back(a.pos[0].s);
      else if (a.pos[0].k == Value::K::List && a.pos[0].tuple)
        for (const Value& v : *a.pos[0].l) {
          if (v.k != Value::K::Str) fail(line, what + ": tuple items must be strings, got " + describe(v));
          cands.push_back(v.s);
        }
      else fail(line, what + ": expected a string or a tuple of strings, got " + describe(a.pos[0]));
      for (const auto& c : cands) {
        if (m == "startswith" && s.compare(0, c.size(), c) == 0) return Value::boolean(true);
        if (m == "endswith" && s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "replace") {
      max_args(a, 3, what, {"count"});
      return Value::str(py_replace(s, str_arg(a, 0, "old", what), str_arg(a, 1, "new", what), int_arg(a, 2, "count", -1, what)));
    }
    if (m == "upper" || m == "lower") return Value::str(py_lower_upper(s, m == "upper"));
    if (m == "title") return Value::str(title_case(s));
    if (m == "capitalize") return Value::str(capitalize(s));
    if (m == "removeprefix" || m == "removesuffix") {
      const std::string x = str_arg(a, 0, "x", what);
      if (m == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::str(s.substr(x.size()));
      if (m == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::str(s.substr(0, s.size() - x.size()));
      return Value::str(s);
    }
    if (m == "find" || m == "rfind" || m == "index" || m == "count") {
      max_args(a, 1, what, {});
      const std::string sub = str_arg(a, 0, "sub", what);
      if (m == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(to_u32(s).size()) + 1);
        int64_t c = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
        return Value::integer(c);
      }
      const size_t at = m == "rfind" ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (m == "index") fail(line, what + ": substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(to_u32(s.substr(0, at)).size()));
    }
    if (m == "join") {
      max_args(a, 1, what, {});
      if (a.pos.empty()) fail(line, what + ": expected an iterable");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(a.pos[0], line, what.c_str())) {
        if (v.k != Value::K::Str) fail(line, what + ": expected strings, got " + describe(v));
        out += (first ? "" : s) + v.s;
        first = false;
      }
      return Value::str(out);
    }
    if (m == "format") {  // "{}", "{0}", "{name}" without format specs
      std::string out;
      size_t auto_idx = 0;
      for (size_t j = 0; j < s.size(); ++j) {
        if (s[j] == '{' && j + 1 < s.size() && s[j + 1] == '{') { out += '{'; ++j; continue; }
        if (s[j] == '}' && j + 1 < s.size() && s[j + 1] == '}') { out += '}'; ++j; continue; }
        if (s[j] != '{') { out += s[j]; continue; }
        const size_t e = s.find('}', j);
        if (e == std::string::npos) fail(line, what + ": single '{' in the format string");
        const std::string field = s.substr(j + 1, e - j - 1);
        const Value* v = nullptr;
        if (field.empty()) { if (auto_idx < a.pos.size()) v = &a.pos[auto_idx++]; }
        else if (std::all_of(field.begin(), field.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
          const size_t k = std::stoul(field);
          if (k < a.pos.size()) v = &a.pos[k];
        } else {
          for (const auto& [k, x] : a.kw) if (k == field) v = &x;
        }
        if (!v) fail(line, what + ": no argument for the field '{" + field + "}' (format specs are not supported)");
        out += to_str(*v);
        j = e;
      }
      return Value::str(out);
    }
    // is* predicates (ASCII classes)
    if (s.empty()) return Value::boolean(false);
    auto all = [&](auto pred) { return Value::boolean(std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); })); };
    if (m == "isdigit") return all([](unsigned char c) { return std::isdigit(c) != 0; });
    if (m == "isalpha") return all([](unsigned char c) { return std::isalpha(c) != 0; });
    if (m == "isalnum") return all([](unsigned char c) { return std::isalnum(c) != 0; });
    if (m == "isspace") return Value::boolean(py_strip(s, std::nullopt, true, true).empty());
    if (m == "islower") return Value::boolean(py_lower_upper(s, false) == s && py_lower_upper(s, true) != s);
    if (m == "isupper") return Value::boolean(py_lower_upper(s, true) == s && py_lower_upper(s, false) != s);
    fail(line, "unsupported method " + what);
  }

  // ---- operators ----
  Value arith(const std::string& op, const Value& a, const Value& b, int line) {
    if (a.is_undef()) undefined_use(a, line, "operand of '" + op + "'");
    if (b.is_undef()) undefined_use(b, line, "operand of '" + op + "'");
    auto bad = [&]() -> Value { fail(line, "unsupported operand types for '" + op + "': " + describe(a) + " and " + describe(b)); };
    if (a.is_num() && b.is_num()) {
      const bool ints = a.k != Value::K::Float && b.k != Value::K::Float;
      const int64_t x = inum(a), y = inum(b);
      const double fx = num(a), fy = num(b);
      int64_t r = 0;
      if (op == "+") return ints ? (__builtin_add_overflow(x, y, &r) ? bad() : Value::integer(r)) : Value::real(fx + fy);
      if (op == "-") return ints ? (__builtin_sub_overflow(x, y, &r) ? bad() : Value::integer(r)) : Value::real(fx - fy);
      if (op == "*") return ints ? (__builtin_mul_overflow(x, y, &r) ? bad() : Value::integer(r)) : Value::real(fx * fy);
      if (op == "/") {
        if (fy == 0) fail(line, "division by zero");
        return Value::real(fx / fy);
      }
      if (op == "//" || op == "%") {
        if (ints ? y == 0 : fy == 0) fail(line, op == "//" ? "integer division by zero" : "modulo by zero");
        if (ints) {
          if (x == std::numeric_limits<int64_t>::min() && y == -1) bad();
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) { --q; m += y; }
          return Value::integer(op == "//" ? q : m);
        }
        double m = std::fmod(fx, fy);
        if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
        return Value::real(op == "//" ? std::floor((fx - m) / fy + 0.5 - 0.5) : m);
      }
      if (op == "**") {
        if (ints && y >= 0) {
          int64_t acc = 1;
          for (int64_t k = 0; k < y; ++k)
            if (__builtin_mul_overflow(acc, x, &acc)) bad();
          return Value::integer(acc);
        }
        return Value::real(std::pow(fx, fy));
      }
      return bad();
    }
    if (op == "+") {
      if (a.k == Value::K::Str && b.k == Value::K::Str) return Value::str(a.s + b.s);
      if (a.k == Value::K::List && b.k == Value::K::List && a.tuple == b.tuple) {
        List l = *a.l;
        l.insert(l.end(), b.l->begin(), b.l->end());
        return Value::list(std::move(l), a.tuple);
      }
    }
    if (op == "*") {
      const Value* seq = (a.k == Value::K::Str || a.k == Value::K::List) ? &a : (b.k == Value::K::Str || b.k == Value::K::List) ? &b : nullptr;
      const Value* n = seq == &a ? &b : &a;
      if (seq && (n->k == Value::K::Int || n->k == Value::K::Bool)) {
        const int64_t times = std::max<int64_t>(0, inum(*n));
        const size_t unit = seq->k == Value::K::Str ? seq->s.size() : seq->l->size();
        if (unit && static_cast<uint64_t>(times) > (seq->k == Value::K::Str ? kMaxOutputBytes : size_t{1'000'000}) / unit)
          fail(line, "'*': result too large");
        if (seq->k == Value::K::Str) {
          std::string out;
          for (int64_t k = 0; k < times; ++k) out += seq->s;
          return Value::str(out);
        }
        List l;
        for (int64_t k = 0; k < times; ++k) l.insert(l.end(), seq->l->begin(), seq->l->end());
        return Value::list(std::move(l), seq->tuple);
      }
    }
    if (op == "%" && a.k == Value::K::Str) fail(line, "'%' string formatting is not supported (use ~ or format())");
    return bad();
  }

  Value eval(const Expr& e, const ScopeP& sc) {
    if (++steps_ > kMaxSteps) fail(e.line, "more than " + std::to_string(kMaxSteps) + " expression evaluations in one render");
    switch (e.kind) {
      case Expr::Lit: return e.lit;
      case Expr::Name: return lookup(sc, e.name);
      case Expr::ListLit:
      case Expr::TupleLit: {
        List l;
        for (const auto& k : e.kids) l.push_back(eval(*k, sc));
        return Value::list(std::move(l), e.kind == Expr::TupleLit);
      }
      case Expr::DictLit: {
        Value d = Value::dict();
        for (size_t j = 0; j + 1 < e.kids.size(); j += 2) {
          Value k = eval(*e.kids[j], sc);
          if (k.k != Value::K::Str) fail(e.line, "dict literal: keys must be strings here, got " + describe(k));
          d.d->set(k.s, eval(*e.kids[j + 1], sc));
        }
        return d;
      }
      case Expr::Attr: {
        Value obj = eval(*e.kids[0], sc);
        return getattr(obj, e.name, e.line, e.lit.k == Value::K::Int ? &e.lit : nullptr);
      }
      case Expr::Index: {
        Value obj = eval(*e.kids[0], sc);
        return getitem(obj, eval(*e.kids[1], sc), e.line);
      }
      case Expr::Slice: {
        Value obj = eval(*e.kids[0], sc);
        Value parts[3];
        for (int j = 0; j < 3; ++j)
          if (e.kids[static_cast<size_t>(j) + 1]) parts[j] = eval(*e.kids[static_cast<size_t>(j) + 1], sc);
        if (obj.is_undef()) undefined_use(obj, e.line, "it was sliced");
        if (obj.k == Value::K::List) {
          List l;
          for (int64_t j : slice_indices(static_cast<int64_t>(obj.l->size()), parts[0], parts[1], parts[2], e.line))
            l.push_back((*obj.l)[static_cast<size_t>(j)]);
          return Value::list(std::move(l), obj.tuple);
        }
        if (obj.k == Value::K::Str) {
          const std::u32string u = to_u32(obj.s);
          std::u32string r;
          for (int64_t j : slice_indices(static_cast<int64_t>(u.size()), parts[0], parts[1], parts[2], e.line)) r += u[static_cast<size_t>(j)];
          return Value::str(from_u32(r));
        }
        return Value::undef();
      }
      case Expr::Call: {
        Value f = eval(*e.kids[0], sc);
        Args a = eval_args(e, sc);
        if (f.is_undef()) undefined_use(f, e.line, "it was called");
        if (f.k != Value::K::Func) fail(e.line, describe(f) + " is not callable");
        return (*f.fn)(a);
      }
      case Expr::Filter: {
        Value v = e.kids[0] ? eval(*e.kids[0], sc) : Value::undef();
        Args a = eval_args(e, sc);
        return filter(e.name, v, a, sc);
      }
      case Expr::Test: {
        Value v = eval(*e.kids[0], sc);
        Args a = eval_args(e, sc);
        const bool r = test(e.name, v, a);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Not: return Value::boolean(!truthy(eval(*e.kids[0], sc)));
      case Expr::Neg:
      case Expr::Pos: {
        Value v = eval(*e.kids[0], sc);
        if (v.is_undef()) undefined_use(v, e.line, "operand of unary '-'");
        if (!v.is_num()) fail(e.line, std::string("bad operand for unary '") + (e.kind == Expr::Neg ? "-" : "+") + "': " + describe(v));
        if (e.kind == Expr::Pos) return v.k == Value::K::Bool ? Value::integer(inum(v)) : v;
        if (v.k == Value::K::Float) return Value::real(-v.f);
        if (inum(v) == std::numeric_limits<int64_t>::min()) fail(e.line, "integer overflow");
        return Value::integer(-inum(v));
      }
      case Expr::And: {
        Value a = eval(*e.kids[0], sc);
        return truthy(a) ? eval(*e.kids[1], sc) : a;
      }
      case Expr::Or: {
        Value a = eval(*e.kids[0], sc);
        return truthy(a) ? a : eval(*e.kids[1], sc);
      }
      case Expr::Cond:
        if (truthy(eval(*e.kids[1], sc))) return eval(*e.kids[0], sc);
        return e.kids.size() > 2 ? eval(*e.kids[2], sc) : Value::undef();
      case Expr::Bin: {
        Value a = eval(*e.kids[0], sc);
        Value b = eval(*e.kids[1], sc);
        const std::string& op = e.name;
        if (op == "~") {
          Value r = Value::str(to_str(a) + to_str(b));
          charge(size_of(r), e.line);
          return r;
        }
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "in") return Value::boolean(contains(b, a, e.line));
        if (op == "not in") return Value::boolean(!contains(b, a, e.line));
        if (op == "<" || op == ">" || op == "<=" || op == ">=") {
          if (a.is_undef()) undefined_use(a, e.line, "operand of '" + op + "'");
          if (b.is_undef()) undefined_use(b, e.line, "operand of '" + op + "'");
          const int c = compare(a, b, e.line, op.c_str());
          return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
        }
        Value r = arith(op, a, b, e.line);
        charge(size_of(r), e.line);
        return r;
      }
    }
    fail(e.line, "internal: unknown expression");
  }


  // ---- tests ----
  bool test(const std::string& name, const Value& v, const Args& a) {
    const int line = a.line;
    auto other = [&]() -> const Value& {
      if (a.pos.empty()) fail(line, "test '" + name + "' needs an argument");
      return a.pos[0];
    };
    if (name == "defined") return !v.is_undef();
    if (name == "undefined") return v.is_undef();
    if (name == "none") return v.k == Value::K::None;
    if (name == "boolean") return v.k == Value::K::Bool;
    if (name == "true") return v.k == Value::K::Bool && v.b;
    if (name == "false") return v.k == Value::K::Bool && !v.b;
    if (name == "integer") return v.k == Value::K::Int;
    if (name == "float") return v.k == Value::K::Float;
    if (name == "number") return v.is_num();
    if (name == "string") return v.k == Value::K::Str;
    if (name == "mapping") return v.k == Value::K::Dict;
    if (name == "iterable") return v.k == Value::K::Str || v.k == Value::K::List || v.k == Value::K::Dict || v.is_undef();
    if (name == "sequence") return v.k == Value::K::Str || v.k == Value::K::List || v.k == Value::K::Dict;
    if (name == "callable") return v.k == Value::K::Func;
    if (name == "sameas") {
      const Value& o = other();
      if (v.k != o.k) return false;
      if (v.k == Value::K::None || v.k == Value::K::Undef) return true;
      if (v.k == Value::K::Bool) return v.b == o.b;
      if (v.k == Value::K::List) return v.l == o.l;
      if (v.k == Value::K::Dict) return v.d == o.d;
      return equal(v, o) && v.k != Value::K::Str && v.k != Value::K::Float && (v.k != Value::K::Int || (v.i >= -5 && v.i <= 256));
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
    if (name == "ne" || name == "!=") return !equal(v, other());
    if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other(), line, "<") < 0;
    if (name == "le" || name == "<=") return compare(v, other(), line, "<=") <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other(), line, ">") > 0;
    if (name == "ge" || name == ">=") return compare(v, other(), line, ">=") >= 0;
    if (name == "in") return contains(other(), v, line);
    if (name == "even" || name == "odd" || name == "divisibleby") {
      if (v.is_undef()) undefined_use(v, line, "test '" + name + "'");
      if (v.k != Value::K::Int && v.k != Value::K::Bool) fail(line, "test '" + name + "': expected an integer, got " + describe(v));
      if (name == "divisibleby") {
        const Value& o = other();
        if (o.k != Value::K::Int || o.i == 0) fail(line, "test 'divisibleby': expected a non-zero integer, got " + describe(o));
        return inum(v) % o.i == 0;
      }
      return (inum(v) % 2 == 0) == (name == "even");
    }
    if (name == "lower" || name == "upper") {
      if (v.k != Value::K::Str) return false;
      return name == "lower" ? (py_lower_upper(v.s, false) == v.s) : (py_lower_upper(v.s, true) == v.s);
    }
    if (name == "escaped") return false;
    fail(line, "unknown test '" + name + "' (supported: defined, undefined, none, boolean, true, false, integer, float, "
               "number, string, mapping, iterable, sequence, callable, sameas, eq, ne, lt, le, gt, ge, in, even, odd, "
               "divisibleby, lower, upper)");
  }

  // attribute path for map/selectattr/sort/...: "a.b" or "0", as jinja2's make_attrgetter (item lookup first)
  Value attr_path(const Value& v, const Value& path, int line) {
    if (path.k == Value::K::Int) return getitem(v, path, line);
    if (path.k != Value::K::Str) fail(line, "attribute: expected a string, got " + describe(path));
    Value cur = v;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.s.find('.', start);
      const std::string part = path.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      Value key = Value::str(part);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        key = Value::integer(std::stoll(part));
      cur = getitem(cur, key, line);
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  // ---- filters ----
  Value filter(const std::string& name, const Value& v, Args& a, const ScopeP& sc) {
    const int line = a.line;
    charge(size_of(v), line);
    const std::string what = "filter '" + name + "'";
    auto need_str = [&](const Value& x) -> std::string { return to_str(x); };
    if (name == "tojson") {  // transformers: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)
      max_args(a, 4, what, {"ensure_ascii", "indent", "separators", "sort_keys"});
      JsonStyle st;
      st.ensure_ascii = truthy(arg_or(a, 0, "ensure_ascii", Value::boolean(false)));
      const Value indent = arg_or(a, 1, "indent", Value::none());
      if (indent.k == Value::K::Int || indent.k == Value::K::Bool) st.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(inum(indent), 0, 64)), ' ');
      else if (indent.k == Value::K::Str) st.indent = indent.s;
      else if (indent.k != Value::K::None) fail(line, what + ": indent expected an integer, a string or None, got " + describe(indent));
      if (st.indent) st.item_sep = ",";
      const Value seps = arg_or(a, 2, "separators", Value::none());
      if (seps.k == Value::K::List) {
        if (seps.l->size() != 2 || (*seps.l)[0].k != Value::K::Str || (*seps.l)[1].k != Value::K::Str)
          fail(line, what + ": separators expected two strings, got " + describe(seps));
        st.item_sep = (*seps.l)[0].s;
        st.key_sep = (*seps.l)[1].s;
      } else if (seps.k != Value::K::None) {
        fail(line, what + ": separators expected a pair of strings, got " + describe(seps));
      }
      st.sort_keys = truthy(arg_or(a, 3, "sort_keys", Value::boolean(false)));
      std::string out;
      to_json(out, v, st, 0, line);
      return Value::str(out);
    }
    if (name == "safe" || name == "string") {
      if (name == "string" && v.is_undef()) return Value::str("");
      return v.k == Value::K::Str ? v : Value::str(to_str(v));
    }
    if (name == "e" || name == "escape") return Value::str(html_escape(to_str(v)));
    if (name == "trim") {
      max_args(a, 1, what, {"chars"});
      const Value c = arg_or(a, 0, "chars", Value::none());
      return Value::str(py_strip(to_str(v), c.k == Value::K::Str ? std::optional<std::string>(c.s) : std::nullopt, true, true));
    }
    if (name == "length" || name == "count") return Value::integer(length(v, line));
    if (name == "upper" || name == "lower") return Value::str(py_lower_upper(need_str(v), name == "upper"));
    if (name == "capitalize") return Value::str(capitalize(to_str(v)));
    if (name == "title") return Value::str(title_case(to_str(v)));
    if (name == "replace") {
      max_args(a, 3, what, {"old", "new", "count"});
      return Value::str(py_replace(to_str(v), str_arg(a, 0, "old", what), str_arg(a, 1, "new", what), int_arg(a, 2, "count", -1, what)));
    }
    if (name == "default" || name == "d") {
      max_args(a, 2, what, {"default_value", "boolean"});
      const bool boolean = truthy(arg_or(a, 1, "boolean", Value::boolean(false)));
      if (v.is_undef() || (boolean && !truthy(v))) return arg_or(a, 0, "default_value", Value::str(""));
      return v;
    }
    if (name == "items") {
      if (v.is_undef()) return Value::list();
      if (v.k != Value::K::Dict) fail(line, what + ": can only get item pairs from a mapping, got " + describe(v));
      List out;
      for (const auto& [k, x] : v.d->items) out.push_back(Value::list({Value::str(k), x}, true));
      return Value::list(std::move(out));
    }
    if (name == "dictsort") {
      if (v.k != Value::K::Dict) fail(line, what + ": expected a mapping, got " + describe(v));
      const bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
      const bool by_value = arg_or(a, 1, "by", Value::str("key")).s == "value";
      const bool rev = truthy(arg_or(a, 2, "reverse", Value::boolean(false)));
      List out;
      for (const auto& [k, x] : v.d->items) out.push_back(Value::list({Value::str(k), x}, true));
      auto key = [&](const Value& p) {
        Value k = (*p.l)[by_value ? 1 : 0];
        if (!cs && k.k == Value::K::Str) k.s = py_lower_upper(k.s, false);
        return k;
      };
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        return rev ? compare(key(y), key(x), line, "<") < 0 : compare(key(x), key(y), line, "<") < 0;
      });
      return Value::list(std::move(out));
    }
    if (name == "list") return Value::list(iterate(v, line, "filter 'list'"));
    if (name == "first" || name == "last") {
      if (v.k == Value::K::Dict && name == "last") fail(line, what + ": a dict has no last item");
      List items = iterate(v, line, what.c_str());
      if (items.empty()) return Value::undef();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.k == Value::K::Str) {
        std::u32string u = to_u32(v.s);
        std::reverse(u.begin(), u.end());
        return Value::str(from_u32(u));
      }
      List items = iterate(v, line, what.c_str());
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "join") {
      max_args(a, 2, what, {"d", "attribute"});
      const std::string sep = to_str(arg_or(a, 0, "d", Value::str("")));
      const Value attr = arg_or(a, 1, "attribute", Value::none());
      std::string out;
      bool first = true;
      for (const Value& x : iterate(v, line, what.c_str())) {
        out += (first ? "" : sep) + to_str(attr.k == Value::K::None ? x : attr_path(x, attr, line));
        first = false;
      }
      return Value::str(out);
    }
    if (name == "int") {
      const Value def = arg_or(a, 0, "default", Value::integer(0));
      const int64_t base = int_arg(a, 1, "base", 10, what);
      if (v.k == Value::K::Int) return v;
      if (v.k == Value::K::Bool) return Value::integer(inum(v));
      if (v.k == Value::K::Float) return std::isfinite(v.f) && std::fabs(v.f) < 9.2e18 ? Value::integer(static_cast<int64_t>(v.f)) : def;
      if (v.k == Value::K::Str) {
        const std::string t = py_strip(v.s, std::nullopt, true, true);
        int64_t r = 0;
        const char* b = t.data();
        const char* e = t.data() + t.size();
        if (b != e && *b == '+') ++b;
        auto res = std::from_chars(b, e, r, static_cast<int>(std::clamp<int64_t>(base, 2, 36)));
        if (res.ec == std::errc() && res.ptr == e && !t.empty()) return Value::integer(r);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
      }
      return def;
    }
    if (name == "float") {
      const Value def = arg_or(a, 0, "default", Value::real(0.0));
      if (v.k == Value::K::Float) return v;
      if (v.k == Value::K::Int || v.k == Value::K::Bool) return Value::real(num(v));
      if (v.k == Value::K::Str) {
        const std::string t = py_strip(v.s, std::nullopt, true, true);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Value::real(d);
      }
      return def;
    }
    if (name == "abs") {
      if (v.k == Value::K::Float) return Value::real(std::fabs(v.f));
      if (v.k == Value::K::Int || v.k == Value::K::Bool) {
        if (inum(v) == std::numeric_limits<int64_t>::min()) fail(line, "integer overflow");
        return Value::integer(std::llabs(inum(v)));
      }
      fail(line, what + ": expected a number, got " + describe(v));
    }
    if (name == "round") {
      if (!v.is_num()) fail(line, what + ": expected a number, got " + describe(v));
      const int64_t prec = int_arg(a, 0, "precision", 0, what);
      const std::string method = arg_or(a, 1, "method", Value::str("common")).s;
      if (method == "common" && v.k != Value::K::Float) return Value::integer(inum(v));  // Python round(int, n) stays int
      const double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(prec, -300, 300)));
      double x = num(v) * scale;
      x = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
      return Value::real(x / scale);
    }
    if (name == "unique") {
      const bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
      const Value attr = arg_or(a, 1, "attribute", Value::none());
      List out, seen;
      for (const Value& x : iterate(v, line, what.c_str())) {
        Value k = attr.k == Value::K::None ? x : attr_path(x, attr, line);
        if (!cs && k.k == Value::K::Str) k.s = py_lower_upper(k.s, false);
        bool dup = false;
        for (const Value& s : seen) dup = dup || equal(s, k);
        if (!dup) { seen.push_back(k); out.push_back(x); }
      }
      return Value::list(std::move(out));
    }
    if (name == "sort") {
      const bool rev = truthy(arg_or(a, 0, "reverse", Value::boolean(false)));
      const bool cs = truthy(arg_or(a, 1, "case_sensitive", Value::boolean(false)));
      const Value attr = arg_or(a, 2, "attribute", Value::none());
      List items = iterate(v, line, what.c_str());
      auto key = [&](const Value& x) {
        Value k = attr.k == Value::K::None ? x : attr_path(x, attr, line);
        if (!cs && k.k == Value::K::Str) k.s = py_lower_upper(k.s, false);
        return k;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return rev ? compare(key(y), key(x), line, "<") < 0 : compare(key(x), key(y), line, "<") < 0;
      });
      return Value::list(std::move(items));
    }
    if (name == "sum") {
      const Value attr = arg_or(a, 0, "attribute", Value::none());
      Value acc = arg_or(a, 1, "start", Value::integer(0));
      for (const Value& x : iterate(v, line, what.c_str())) acc = arith("+", acc, attr.k == Value::K::None ? x : attr_path(x, attr, line), line);
      return acc;
    }
    if (name == "min" || name == "max") {
      List items = iterate(v, line, what.c_str());
      if (items.empty()) return Value::undef();
      Value best = items[0];
      for (const Value& x : items) {
        const int c = compare(x, best, line, "<");
        if (name == "min" ? c < 0 : c > 0) best = x;
      }
      return best;
    }
    if (name == "attr") return getattr(v, str_arg(a, 0, "name", what), line);
    if (name == "indent") {
      const Value w = arg_or(a, 0, "width", Value::integer(4));
      const std::string ind = w.k == Value::K::Str ? w.s : std::string(static_cast<size_t>(std::clamp<int64_t>(inum(w), 0, 1024)), ' ');
      const bool first = truthy(arg_or(a, 1, "first", Value::boolean(false)));
      const bool blank = truthy(arg_or(a, 2, "blank", Value::boolean(false)));
      Value sv = Value::str(to_str(v) + "\n");
      Args none;
      none.line = line;
      List lines = *call_method(sv, "splitlines", none).l;
      std::string out;
      for (size_t j = 0; j < lines.size(); ++j) {
        const std::string& ln = lines[j].s;
        if (j == 0) { out += ln; continue; }
        out += "\n";
        if (blank || !ln.empty()) out += ind;
        out += ln;
      }
      if (first) out = ind + out;
      return Value::str(out);
    }
    if (name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      List items = iterate(v, line, what.c_str());
      List out;
      if (name == "map") {
        const Value* attr = find_arg(a, SIZE_MAX, "attribute");
        if (attr) {
          const Value* def = find_arg(a, SIZE_MAX, "default");
          for (const Value& x : items) {
            Value r = attr_path(x, *attr, line);
            out.push_back(r.is_undef() && def ? *def : r);
          }
        } else {
          if (a.pos.empty() || a.pos[0].k != Value::K::Str) fail(line, what + ": expected a filter name or attribute=");
          Args rest;
          rest.line = line;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          rest.kw = a.kw;
          for (const Value& x : items) { Args r = rest; out.push_back(filter(a.pos[0].s, x, r, sc)); }
        }
        return Value::list(std::move(out));
      }
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      size_t p = 0;
      Value attr;
      if (by_attr) {
        if (a.pos.empty()) fail(line, what + ": expected an attribute name");
        attr = a.pos[p++];
      }
      std::string tname;
      if (p < a.pos.size()) {
        if (a.pos[p].k != Value::K::Str) fail(line, what + ": expected a test name, got " + describe(a.pos[p]));
        tname = a.pos[p++].s;
      }
      Args targs;
      targs.line = line;
      targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(p, a.pos.size())), a.pos.end());
      for (const Value& x : items) {
        const Value subject = by_attr ? attr_path(x, attr, line) : x;
        const bool ok = tname.empty() ? truthy(subject) : test(tname, subject, targs);
        if (ok == keep_if) out.push_back(x);
      }
      return Value::list(std::move(out));
    }
    if (name == "batch" || name == "slice" || name == "groupby" || name == "format" || name == "truncate" ||
        name == "wordcount" || name == "center" || name == "urlencode" || name == "striptags" || name == "pprint" ||
        name == "xmlattr" || name == "filesizeformat" || name == "forceescape" || name == "urlize" || name == "wordwrap")
      fail(line, what + " is not supported by hanpu's chat-template subset");
    fail(line, "unknown " + what);
  }
};

ScopeP make_globals(const nlohmann::ordered_json& context) {
  auto g = std::make_shared<Scope>();
  g->vars["raise_exception"] = Value::func("raise_exception", [](Args& a) -> Value {
    fail(a.line, "raise_exception: " + (a.pos.empty() ? std::string() : to_str(a.pos[0])));
  });
  g->vars["strftime_now"] = Value::func("strftime_now", [](Args& a) -> Value {
    const std::string fmt = a.pos.empty() ? std::string() : to_str(a.pos[0]);
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) fail(a.line, "strftime_now: the formatted date is empty or longer than 511 bytes");
    return Value::str(std::string(buf, n));
  });
  g->vars["namespace"] = Value::func("namespace", [](Args& a) {
    Value ns = Value::dict();
    ns.ns = true;
    for (const Value& p : a.pos) {
      if (p.k != Value::K::Dict) fail(a.line, "namespace(): positional arguments must be dicts, got " + describe(p));
      for (const auto& [k, v] : p.d->items) ns.d->set(k, v);
    }
    for (const auto& [k, v] : a.kw) ns.d->set(k, v);
    return ns;
  });
  g->vars["dict"] = Value::func("dict", [](Args& a) {
    Value d = Value::dict();
    for (const Value& p : a.pos) {
      if (p.k != Value::K::Dict) fail(a.line, "dict(): positional arguments must be dicts, got " + describe(p));
      for (const auto& [k, v] : p.d->items) d.d->set(k, v);
    }
    for (const auto& [k, v] : a.kw) d.d->set(k, v);
    return d;
  });
  g->vars["range"] = Value::func("range", [](Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& p : a.pos)
      if (p.k != Value::K::Int && p.k != Value::K::Bool) fail(a.line, "range(): expected integers, got " + describe(p));
    if (a.pos.size() == 1) stop = inum(a.pos[0]);
    else if (a.pos.size() >= 2) { start = inum(a.pos[0]); stop = inum(a.pos[1]); if (a.pos.size() > 2) step = inum(a.pos[2]); }
    else fail(a.line, "range(): expected 1 to 3 arguments");
    if (step == 0) fail(a.line, "range(): step must not be zero");
    List l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (l.size() >= 1'000'000) fail(a.line, "range(): more than 1,000,000 items");
      l.push_back(Value::integer(i));
    }
    return Value::list(std::move(l));
  });
  if (context.is_object())
    for (const auto& [k, v] : context.items()) g->vars[k] = from_json(v);
  return g;
}

}  // namespace

std::shared_ptr<const Template> parse(std::string_view source, const std::string& origin) {
  try {
    auto t = std::make_shared<Template>();
    t->origin = origin;
    Parser p(lex(source));
    t->body = p.parse_all();
    return t;
  } catch (const TemplateError& e) {
    throw Error(origin + ", line " + std::to_string(e.line) + ": " + e.what);
  }
}

std::string render(const Template& t, const nlohmann::ordered_json& context) {
  if (!context.is_object()) throw Error(t.origin + ": the render context must be a JSON object");
  try {
    Renderer r(t, make_globals(context));
    return r.run();
  } catch (const TemplateError& e) {
    throw Error(t.origin + ", line " + std::to_string(e.line) + ": " + e.what);
  }
}

}  // namespace hanpu::jinja
