// JSON Schema compiler, schema automaton and trie mask (json_constraint_schema.hpp). Written from
// the JSON Schema 2020-12 core and validation specifications (json-schema.org) and RFC 3339 for
// the formats.
#include "json_constraint_schema.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "hanpu/tokenizer.hpp"

namespace hanpu {

// RFC 6901, section 3: "~" and "/" inside a reference token.
std::string escape_pointer_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

namespace {

using ojson = nlohmann::ordered_json;
using Kind = JsonSchema::Kind;

// Costs saturate here: a schema with no finite value (a required property that recurses into
// itself) costs "infinite" and is never chosen.
constexpr int64_t kInfinite = int64_t{1} << 40;
int64_t sat(int64_t a) { return std::min(a, kInfinite); }
int64_t mul_sat(int64_t a, int64_t b) {  // a, b >= 0
  if (a == 0 || b == 0) return 0;
  return a > kInfinite / b ? kInfinite : sat(a * b);
}

// Deeper schemas are refused rather than recursed into (the compiler recurses per level).
constexpr int kMaxSchemaDepth = 128;
// More alternatives alive at once than this are cut (keeping the first ones is safe: each kept
// one is a valid way on). anyOf branches sharing long prefixes is what makes them multiply.
constexpr size_t kMaxAlternatives = 64;
constexpr int32_t kMaxIntegerDigits = 15;

// Keywords that constrain values in ways this automaton does not enforce.
const std::set<std::string>& unsupported_keywords() {
  static const std::set<std::string> k{
      "oneOf", "not", "if", "then", "else", "pattern", "patternProperties", "minProperties", "maxProperties",
      "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "prefixItems", "contains",
      "minContains", "maxContains", "unevaluatedItems", "additionalItems", "contentEncoding", "contentMediaType",
      "contentSchema", "$dynamicRef", "$recursiveRef"};
  return k;
}

using Pattern = std::vector<std::pair<uint8_t, uint8_t>>;

void append_literal(Pattern& p, const std::string& bytes) {
  for (char c : bytes) p.emplace_back(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
}
void append_range(Pattern& p, char lo, char hi) { p.emplace_back(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); }
void append_digits(Pattern& p, int n) {
  for (int i = 0; i < n; ++i) append_range(p, '0', '9');
}

// RFC 3339 full-date, as alternatives of fixed patterns: years 1000-2999, days up to 28 (valid
// in every month, so no calendar is needed).
std::vector<Pattern> date_patterns() {
  std::vector<Pattern> out;
  for (int month_tens = 0; month_tens < 2; ++month_tens)
    for (int day_kind = 0; day_kind < 3; ++day_kind) {
      Pattern p;
      append_range(p, '1', '2');
      append_digits(p, 3);
      append_literal(p, "-");
      if (month_tens == 0) append_literal(p, "0"), append_range(p, '1', '9');
      else append_literal(p, "1"), append_range(p, '0', '2');
      append_literal(p, "-");
      if (day_kind == 0) append_literal(p, "0"), append_range(p, '1', '9');
      else if (day_kind == 1) append_literal(p, "1"), append_range(p, '0', '9');
      else append_literal(p, "2"), append_range(p, '0', '8');
      out.push_back(std::move(p));
    }
  return out;
}

// RFC 3339 full-time with the offset "Z" and no fraction.
std::vector<Pattern> time_patterns() {
  std::vector<Pattern> out;
  for (int hour_kind = 0; hour_kind < 2; ++hour_kind) {
    Pattern p;
    if (hour_kind == 0) append_range(p, '0', '1'), append_range(p, '0', '9');
    else append_literal(p, "2"), append_range(p, '0', '3');
    append_literal(p, ":");
    append_range(p, '0', '5');
    append_digits(p, 1);
    append_literal(p, ":");
    append_range(p, '0', '5');
    append_digits(p, 1);
    append_literal(p, "Z");
    out.push_back(std::move(p));
  }
  return out;
}

// RFC 4122's textual form in lower-case hex (8-4-4-4-12).
std::vector<Pattern> uuid_patterns() {
  // Hex digits are two ranges, so each group is spelled as digits-or-letters per position; to
  // stay one pattern, the letters are left out: a uuid of decimal digits is still a uuid.
  Pattern p;
  for (int group : {8, 4, 4, 4, 12}) {
    if (!p.empty()) append_literal(p, "-");
    append_digits(p, group);
  }
  return {p};
}

class Compiler {
 public:
  explicit Compiler(const ojson& root) : root_(root) {}

  std::shared_ptr<JsonSchema> run() {
    auto out = std::make_shared<JsonSchema>();
    s_ = out.get();
    if (!root_.is_object() && !root_.is_boolean())
      throw SchemaError("", "type", "a schema is an object or a boolean, got " + std::string(root_.type_name()));
    s_->root = compile(root_, "", 0);
    flatten();
    minimum_sizes();
    const JsonSchema::Node& root = s_->nodes[static_cast<size_t>(s_->root)];
    bool root_is_object = !root.flat.empty();
    for (int32_t n : root.flat) {
      const JsonSchema::Node& m = s_->nodes[static_cast<size_t>(n)];
      root_is_object = root_is_object && (m.kind == Kind::kObject || (m.kind == Kind::kAny && m.object_only));
    }
    if (!root_is_object)
      throw SchemaError("", "type",
                        "the root must be an object schema (\"type\": \"object\"), as OpenAI's strict mode requires: the "
                        "generation ends when the object closes");
    if (root.min_bytes >= kInfinite)
      throw SchemaError("", "$ref", "the schema admits no finite document (a required property recurses into itself)");
    return out;
  }

 private:
  int32_t add(JsonSchema::Node n) {
    s_->nodes.push_back(std::move(n));
    return static_cast<int32_t>(s_->nodes.size() - 1);
  }
  int32_t add_pattern(Pattern p) {
    JsonSchema::Node n;
    n.kind = Kind::kPattern;
    n.pattern = std::move(p);
    return add(std::move(n));
  }
  int32_t add_any_of(std::vector<int32_t> alternatives) {
    if (alternatives.size() == 1) return alternatives[0];
    JsonSchema::Node n;
    n.kind = Kind::kAnyOf;
    n.alternatives = std::move(alternatives);
    return add(std::move(n));
  }

  int32_t ref(const std::string& target, const std::string& at) {
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target != "#" && target.rfind("#/", 0) != 0)
      throw SchemaError(at, "$ref", "only references inside the schema (\"#\", \"#/$defs/...\") are supported, got \"" +
                                        target + "\"");
    const std::string pointer = target.substr(1);
    const ojson* node = &root_;
    if (!pointer.empty()) {
      try {
        node = &root_.at(ojson::json_pointer(pointer));
      } catch (const std::exception&) {
        throw SchemaError(at, "$ref", "\"" + target + "\" names nothing in the schema");
      }
    }
    // A placeholder anyOf of one first, so that recursion through the reference finds it.
    JsonSchema::Node placeholder;
    placeholder.kind = Kind::kAnyOf;
    const int32_t id = add(std::move(placeholder));
    refs_[target] = id;
    const int32_t body = compile(*node, pointer, depth_ + 1);
    s_->nodes[static_cast<size_t>(id)].alternatives = {body};
    return id;
  }

  static bool type_matches(const std::string& type, const ojson& v) {
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (type == "integer") return v.is_number_integer() || v.is_number_unsigned() ||
                                  (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()));
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    return false;
  }

  int32_t compile(const ojson& schema, const std::string& at, int depth) {
    const int saved_depth = depth_;
    depth_ = depth;
    if (depth > kMaxSchemaDepth)
      throw SchemaError(at, "$ref", "the schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
    const int32_t id = compile_inner(schema, at);
    depth_ = saved_depth;
    return id;
  }

  int32_t compile_inner(const ojson& schema, const std::string& at) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) throw SchemaError(at, "false", "the schema false admits no value");
      return add(JsonSchema::Node{});  // true: any value
    }
    if (!schema.is_object())
      throw SchemaError(at, "type", "a schema is an object or a boolean, got " + std::string(schema.type_name()));
    for (const auto& [key, value] : schema.items()) {
      if (unsupported_keywords().count(key)) {
        // Values that constrain nothing are let through.
        if ((key == "minLength" || key == "minProperties") && value == 0) continue;
        throw SchemaError(at, key, "not supported by hanpu's constrained decoding (it cannot be enforced token by token "
                                   "here); supported: type, properties, required, additionalProperties, enum, const, "
                                   "items, minItems, maxItems, anyOf, $ref, $defs, format date/time/date-time/uuid");
      }
    }
    if (schema.contains("uniqueItems") && schema["uniqueItems"] != false)
      throw SchemaError(at, "uniqueItems", "not supported by hanpu's constrained decoding (true cannot be enforced)");
    if (schema.contains("unevaluatedProperties") && schema["unevaluatedProperties"] != false &&
        schema["unevaluatedProperties"] != true && !schema["unevaluatedProperties"].is_object())
      throw SchemaError(at, "unevaluatedProperties", "expected a boolean or a schema");
    const std::string here = at;
    auto child_at = [&](const std::string& keyword) { return here + "/" + escape_pointer_token(keyword); };

    // Keywords that replace the schema and so cannot be combined with constraining siblings.
    static const std::set<std::string> annotations{"title", "description", "default", "examples", "$comment",
                                                   "deprecated", "readOnly", "writeOnly", "$schema", "$id",
                                                   "$defs", "definitions", "$anchor", "name", "strict",
                                                   "additionalProperties", "unevaluatedProperties"};
    auto only_with_annotations = [&](const std::string& keyword) {
      for (const auto& [key, value] : schema.items())
        if (key != keyword && !annotations.count(key) && (key == "type" || key == "properties" || key == "items" ||
                                                          key == "enum" || key == "const" || key == "anyOf" ||
                                                          key == "allOf" || key == "$ref" || key == "required" ||
                                                          key == "format" || key == "minItems" || key == "maxItems"))
          throw SchemaError(here, key, "not supported next to '" + keyword + "' (it would have to hold for every "
                                           "branch at once); move it into the branches");
    };
    if (schema.contains("$ref")) {
      only_with_annotations("$ref");
      if (!schema["$ref"].is_string()) throw SchemaError(here, "$ref", "expected a string");
      return ref(schema["$ref"].get<std::string>(), here);
    }
    if (schema.contains("allOf")) {
      only_with_annotations("allOf");
      const ojson& all = schema["allOf"];
      if (!all.is_array() || all.size() != 1)
        throw SchemaError(here, "allOf", "only an allOf of one schema is supported (an intersection of several "
                                         "cannot be enforced here)");
      return compile(all[0], child_at("allOf") + "/0", depth_ + 1);
    }
    if (schema.contains("anyOf")) {
      only_with_annotations("anyOf");
      const ojson& any = schema["anyOf"];
      if (!any.is_array() || any.empty()) throw SchemaError(here, "anyOf", "expected a non-empty array of schemas");
      std::vector<int32_t> alts;
      for (size_t i = 0; i < any.size(); ++i)
        alts.push_back(compile(any[i], child_at("anyOf") + "/" + std::to_string(i), depth_ + 1));
      JsonSchema::Node n;
      n.kind = Kind::kAnyOf;
      n.alternatives = std::move(alts);
      return add(std::move(n));
    }

    // The types the value may have.
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const ojson& t = schema["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty())
        for (const ojson& x : t) {
          if (!x.is_string()) throw SchemaError(here, "type", "expected a type name or an array of them");
          types.push_back(x.get<std::string>());
        }
      else throw SchemaError(here, "type", "expected a type name or a non-empty array of them");
      for (const std::string& x : types)
        if (x != "object" && x != "array" && x != "string" && x != "number" && x != "integer" && x != "boolean" &&
            x != "null")
          throw SchemaError(here, "type", "unknown type \"" + x + "\"; expected object, array, string, number, "
                                          "integer, boolean or null");
    }

    if (schema.contains("enum") || schema.contains("const")) {
      std::vector<ojson> values;
      if (schema.contains("const")) values.push_back(schema["const"]);
      if (schema.contains("enum")) {
        if (!schema["enum"].is_array() || schema["enum"].empty())
          throw SchemaError(here, "enum", "expected a non-empty array");
        std::vector<ojson> e(schema["enum"].begin(), schema["enum"].end());
        if (schema.contains("const")) {  // both: the const, if the enum has it
          if (std::find(e.begin(), e.end(), values[0]) == e.end()) values.clear();
        } else {
          values = std::move(e);
        }
      }
      std::vector<int32_t> alts;
      for (const ojson& v : values) {
        bool ok = types.empty();
        for (const std::string& t : types) ok = ok || type_matches(t, v);
        if (!ok) continue;  // the schema's type rules this one out
        Pattern p;
        append_literal(p, v.dump(-1, ' ', false, ojson::error_handler_t::strict));
        alts.push_back(add_pattern(std::move(p)));
      }
      if (alts.empty()) throw SchemaError(here, schema.contains("enum") ? "enum" : "const", "no value fits the schema's type");
      return add_any_of(std::move(alts));
    }

    if (types.empty()) {  // no type: infer it from the keywords, else any value
      if (schema.contains("properties") || schema.contains("required")) types.push_back("object");
      else if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems")) types.push_back("array");
      else if (schema.contains("format")) types.push_back("string");
      else return add(JsonSchema::Node{});
    }
    std::vector<int32_t> alts;
    for (const std::string& t : types) {
      if (t == "object") alts.push_back(compile_object(schema, here));
      else if (t == "array") alts.push_back(compile_array(schema, here));
      else if (t == "string") {
        for (int32_t n : compile_string(schema, here)) alts.push_back(n);
      } else if (t == "number" || t == "integer") {
        JsonSchema::Node n;
        n.kind = t == "number" ? Kind::kNumber : Kind::kInteger;
        alts.push_back(add(std::move(n)));
      } else if (t == "boolean") {
        Pattern yes, no;
        append_literal(yes, "true");
        append_literal(no, "false");
        alts.push_back(add_pattern(std::move(yes)));
        alts.push_back(add_pattern(std::move(no)));
      } else {
        Pattern null;
        append_literal(null, "null");
        alts.push_back(add_pattern(std::move(null)));
      }
    }
    return add_any_of(std::move(alts));
  }

  int32_t compile_object(const ojson& schema, const std::string& at) {
    JsonSchema::Node n;
    const bool free_form = !schema.contains("properties") && !schema.contains("required") &&
                           (!schema.contains("additionalProperties") || schema["additionalProperties"] == true);
    if (free_form) {  // any object: the JSON automaton from its '{'
      n.kind = Kind::kAny;
      n.object_only = true;
      return add(std::move(n));
    }
    n.kind = Kind::kObject;
    std::set<std::string> required;
    if (schema.contains("required")) {
      const ojson& r = schema["required"];
      if (!r.is_array()) throw SchemaError(at, "required", "expected an array of property names");
      for (const ojson& x : r) {
        if (!x.is_string()) throw SchemaError(at, "required", "expected an array of property names");
        required.insert(x.get<std::string>());
      }
    }
    std::set<std::string> named;
    if (schema.contains("properties")) {
      const ojson& props = schema["properties"];
      if (!props.is_object()) throw SchemaError(at, "properties", "expected an object of schemas");
      for (const auto& [name, sub] : props.items()) {
        JsonSchema::Property p;
        const std::string quoted = ojson(name).dump(-1, ' ', false, ojson::error_handler_t::strict);
        p.key = quoted.substr(1, quoted.size() - 2);
        p.required = required.count(name) > 0;
        named.insert(name);
        p.node = compile(sub, at + "/properties/" + escape_pointer_token(name), depth_ + 1);
        n.properties.push_back(std::move(p));
      }
    }
    // Required names without a schema of their own take additionalProperties' (any value if absent).
    for (const std::string& name : required) {
      if (named.count(name)) continue;
      const ojson extra = schema.contains("additionalProperties") ? schema["additionalProperties"] : ojson(true);
      if (extra == false)
        throw SchemaError(at, "required", "\"" + name + "\" is required but not in properties, and additionalProperties "
                                          "is false: no object satisfies it");
      JsonSchema::Property p;
      const std::string quoted = ojson(name).dump(-1, ' ', false, ojson::error_handler_t::strict);
      p.key = quoted.substr(1, quoted.size() - 2);
      p.required = true;
      p.node = compile(extra, at + "/additionalProperties", depth_ + 1);
      n.properties.push_back(std::move(p));
    }
    return add(std::move(n));
  }

  int64_t count_field(const ojson& schema, const std::string& at, const char* key, int64_t fallback) {
    if (!schema.contains(key)) return fallback;
    const ojson& v = schema[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      throw SchemaError(at, key, "expected a non-negative integer, got " + v.dump());
    // Beyond this an array cannot be generated within any context anyway.
    constexpr uint64_t kLargestCount = uint64_t{1} << 30;
    const uint64_t x = v.get<uint64_t>();
    if (x > kLargestCount) throw SchemaError(at, key, "larger than " + std::to_string(kLargestCount) + " is not supported");
    return static_cast<int64_t>(x);
  }

  int32_t compile_array(const ojson& schema, const std::string& at) {
    JsonSchema::Node n;
    n.kind = Kind::kArray;
    n.min_items = count_field(schema, at, "minItems", 0);
    n.max_items = count_field(schema, at, "maxItems", -1);
    if (n.max_items >= 0 && n.max_items < n.min_items)
      throw SchemaError(at, "maxItems", "smaller than minItems: no array satisfies it");
    if (schema.contains("items") && schema["items"].is_array())
      throw SchemaError(at, "items", "an array of schemas (tuple items) is not supported; use one schema");
    n.items = schema.contains("items") ? compile(schema["items"], at + "/items", depth_ + 1) : add(JsonSchema::Node{});
    return add(std::move(n));
  }

  std::vector<int32_t> compile_string(const ojson& schema, const std::string& at) {
    if (!schema.contains("format")) {
      JsonSchema::Node n;
      n.kind = Kind::kString;
      return {add(std::move(n))};
    }
    const ojson& f = schema["format"];
    if (!f.is_string()) throw SchemaError(at, "format", "expected a string");
    const std::string format = f.get<std::string>();
    std::vector<Pattern> bodies;
    if (format == "date") bodies = date_patterns();
    else if (format == "time") bodies = time_patterns();
    else if (format == "uuid") bodies = uuid_patterns();
    else if (format == "date-time") {
      for (const Pattern& d : date_patterns())
        for (const Pattern& t : time_patterns()) {
          Pattern p = d;
          append_literal(p, "T");
          p.insert(p.end(), t.begin(), t.end());
          bodies.push_back(std::move(p));
        }
    } else {
      throw SchemaError(at, "format", "\"" + format + "\" is not supported; supported: date, time, date-time, uuid");
    }
    std::vector<int32_t> out;
    for (Pattern& body : bodies) {
      Pattern p;
      append_literal(p, "\"");
      p.insert(p.end(), body.begin(), body.end());
      append_literal(p, "\"");
      out.push_back(add_pattern(std::move(p)));
    }
    return out;
  }

  // Each anyOf's alternatives, resolved to the nodes that read bytes (anyOf cycles contribute nothing).
  void flatten() {
    for (size_t i = 0; i < s_->nodes.size(); ++i) {
      JsonSchema::Node& n = s_->nodes[i];
      if (n.kind != Kind::kAnyOf) {
        n.flat = {static_cast<int32_t>(i)};
        continue;
      }
      std::vector<bool> seen(s_->nodes.size(), false);
      std::vector<int32_t> out;
      std::function<void(int32_t)> walk = [&](int32_t id) {
        if (seen[static_cast<size_t>(id)]) return;
        seen[static_cast<size_t>(id)] = true;
        const JsonSchema::Node& m = s_->nodes[static_cast<size_t>(id)];
        if (m.kind != Kind::kAnyOf) {
          out.push_back(id);
          return;
        }
        for (int32_t a : m.alternatives) walk(a);
      };
      walk(static_cast<int32_t>(i));
      s_->nodes[i].flat = std::move(out);
    }
  }

  int64_t property_cost(const JsonSchema::Property& p) const {
    // "key":value
    return sat(static_cast<int64_t>(p.key.size()) + 3 + s_->nodes[static_cast<size_t>(p.node)].min_bytes);
  }

  // The shortest value of each node, by iterating to the fixed point (recursion through $ref).
  void minimum_sizes() {
    for (JsonSchema::Node& n : s_->nodes) n.min_bytes = kInfinite;
    for (bool changed = true; changed;) {
      changed = false;
      for (JsonSchema::Node& n : s_->nodes) {
        int64_t m = kInfinite;
        switch (n.kind) {
          case Kind::kAny: m = n.object_only ? 2 : 1; break;  // {} or 0
          case Kind::kNumber: case Kind::kInteger: m = 1; break;  // 0
          case Kind::kString: m = 2; break;  // ""
          case Kind::kPattern: m = static_cast<int64_t>(n.pattern.size()); break;
          case Kind::kAnyOf:
            for (int32_t a : n.flat) m = std::min(m, s_->nodes[static_cast<size_t>(a)].min_bytes);
            break;
          case Kind::kArray: {
            const int64_t item = s_->nodes[static_cast<size_t>(n.items)].min_bytes;
            m = n.min_items == 0 ? 2 : sat(1 + mul_sat(n.min_items, item + 1));  // [, items with commas between, ]
            break;
          }
          case Kind::kObject: {
            int64_t total = 2, count = 0;
            for (const JsonSchema::Property& p : n.properties)
              if (p.required) total = sat(total + property_cost(p)), ++count;
            m = sat(total + std::max<int64_t>(count - 1, 0));
            break;
          }
        }
        if (m < n.min_bytes) {
          n.min_bytes = m;
          changed = true;
        }
      }
    }
    for (JsonSchema::Node& n : s_->nodes) {
      if (n.kind != Kind::kObject) continue;
      const size_t k = n.properties.size();
      n.required_from.assign(k + 1, 0);
      n.cheapest_from.assign(k + 1, kInfinite);
      n.next_required.assign(k + 1, static_cast<int32_t>(k));
      for (size_t i = k; i-- > 0;) {
        const int64_t c = property_cost(n.properties[i]);
        n.required_from[i] = n.properties[i].required ? sat(n.required_from[i + 1] + c + 1) : n.required_from[i + 1];
        n.cheapest_from[i] = std::min(n.cheapest_from[i + 1], c);
        n.next_required[i] = n.properties[i].required ? static_cast<int32_t>(i) : n.next_required[i + 1];
      }
    }
  }

  const ojson& root_;
  JsonSchema* s_ = nullptr;
  std::map<std::string, int32_t> refs_;
  int depth_ = 0;
};

// Frame phases.
enum : uint8_t {
  kOpen,          // nothing read yet (object, array)
  kKeyOrEnd,      // object after '{'
  kKeyStart,      // object after ','
  kKey,           // object: in a key
  kColon,         // object: after a key
  kExpectValue,   // object: after ':'
  kInValue,       // object or array: a child frame is reading the value
  kNext,          // object or array: after a value
  kFirstItem,     // array after '['
  kAfterComma,    // array after ','
};

enum class Step { kConsumed, kDone, kReject, kEndBefore, kPush };

}  // namespace

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::ordered_json& schema) {
  return Compiler(schema).run();
}

int64_t JsonSchema::min_bytes() const { return nodes[static_cast<size_t>(root)].min_bytes; }

namespace {

struct Machine {
  const JsonSchema& s;
  using Frame = SchemaState::Frame;
  using Stack = SchemaState::Stack;

  const JsonSchema::Node& node(int32_t id) const { return s.nodes[static_cast<size_t>(id)]; }

  // The object's keys that may come next: from `index` to the first required one.
  std::pair<int32_t, int32_t> key_range(const JsonSchema::Node& n, int32_t index) const {
    const int32_t last = std::min(n.next_required[static_cast<size_t>(index)], static_cast<int32_t>(n.properties.size()) - 1);
    return {index, last};
  }
  static bool same_prefix(const std::string& a, const std::string& b, int32_t len) {
    return a.size() >= static_cast<size_t>(len) && b.size() >= static_cast<size_t>(len) &&
           a.compare(0, static_cast<size_t>(len), b, 0, static_cast<size_t>(len)) == 0;
  }

  Step step(Frame& f, uint8_t b, int32_t* child) const {
    const JsonSchema::Node& n = node(f.node);
    switch (n.kind) {
      case Kind::kPattern: {
        const auto [lo, hi] = n.pattern[static_cast<size_t>(f.index)];
        if (b < lo || b > hi) return Step::kReject;
        return ++f.index == static_cast<int32_t>(n.pattern.size()) ? Step::kDone : Step::kConsumed;
      }
      case Kind::kString: case Kind::kNumber: case Kind::kInteger: case Kind::kAny: {
        if (f.phase == kOpen) {  // the first byte: strings, numbers and objects begin as their type says
          if (!first_byte_fits(n, b)) return Step::kReject;
          f.phase = kInValue;
        }
        if (f.json.number_may_end() && (b == ',' || b == '}' || b == ']')) return Step::kEndBefore;
        if (n.kind == Kind::kInteger) {
          if (b == '.' || b == 'e' || b == 'E') return Step::kReject;
          // At most 15 digits: exactly a double, so every JSON parser reads an integer back
          // (nlohmann/json and JavaScript turn longer ones into floating point).
          if (b >= '0' && b <= '9' && ++f.key_len > kMaxIntegerDigits) return Step::kReject;
        }
        if (!f.json.feed(b)) return Step::kReject;
        return f.json.done() ? Step::kDone : Step::kConsumed;
      }
      case Kind::kObject: return step_object(f, n, b, child);
      case Kind::kArray: return step_array(f, n, b, child);
      case Kind::kAnyOf: return Step::kReject;  // never a frame
    }
    return Step::kReject;
  }

  Step step_object(Frame& f, const JsonSchema::Node& n, uint8_t b, int32_t* child) const {
    const int32_t size = static_cast<int32_t>(n.properties.size());
    switch (f.phase) {
      case kOpen:
        if (b != '{') return Step::kReject;
        f.phase = kKeyOrEnd;
        f.index = 0;
        return Step::kConsumed;
      case kKeyOrEnd:
      case kNext:
        if (b == '}') return n.next_required[static_cast<size_t>(f.index)] == size ? Step::kDone : Step::kReject;
        if (f.phase == kNext) {
          if (b != ',' || f.index >= size) return Step::kReject;
          f.phase = kKeyStart;
          return Step::kConsumed;
        }
        [[fallthrough]];
      case kKeyStart:
        if (b != '"' || f.index >= size) return Step::kReject;
        f.phase = kKey;
        f.key_len = 0;
        return Step::kConsumed;
      case kKey: {
        const auto [first, last] = key_range(n, f.index);
        // The key typed so far is a prefix of the candidate kept in `count` (the first that
        // matched; all that match share that prefix).
        const int32_t current = static_cast<int32_t>(f.count);
        const std::string& prefix_of = n.properties[static_cast<size_t>(f.key_len == 0 ? first : current)].key;
        if (b == '"')
          for (int32_t c = first; c <= last; ++c) {
            const std::string& k = n.properties[static_cast<size_t>(c)].key;
            if (static_cast<int32_t>(k.size()) == f.key_len && same_prefix(k, prefix_of, f.key_len)) {
              f.count = c;
              f.phase = kColon;
              return Step::kConsumed;
            }
          }
        for (int32_t c = first; c <= last; ++c) {
          const std::string& k = n.properties[static_cast<size_t>(c)].key;
          if (static_cast<int32_t>(k.size()) > f.key_len && same_prefix(k, prefix_of, f.key_len) &&
              static_cast<uint8_t>(k[static_cast<size_t>(f.key_len)]) == b) {
            f.count = c;
            ++f.key_len;
            return Step::kConsumed;
          }
        }
        return Step::kReject;
      }
      case kColon:
        if (b != ':') return Step::kReject;
        f.phase = kExpectValue;
        return Step::kConsumed;
      case kExpectValue:
        f.phase = kInValue;
        *child = n.properties[static_cast<size_t>(f.count)].node;
        return Step::kPush;
      default: return Step::kReject;
    }
  }

  Step step_array(Frame& f, const JsonSchema::Node& n, uint8_t b, int32_t* child) const {
    switch (f.phase) {
      case kOpen:
        if (b != '[') return Step::kReject;
        f.phase = kFirstItem;
        f.count = 0;
        return Step::kConsumed;
      case kFirstItem:
        if (b == ']') return n.min_items == 0 ? Step::kDone : Step::kReject;
        if (n.max_items == 0) return Step::kReject;
        f.phase = kInValue;
        *child = n.items;
        return Step::kPush;
      case kNext:
        if (b == ']') return f.count >= n.min_items ? Step::kDone : Step::kReject;
        if (b != ',' || (n.max_items >= 0 && f.count >= n.max_items)) return Step::kReject;
        f.phase = kAfterComma;
        return Step::kConsumed;
      case kAfterComma:
        f.phase = kInValue;
        *child = n.items;
        return Step::kPush;
      default: return Step::kReject;
    }
  }

  // The frame's child value ended.
  void complete_child(Frame& f) const {
    const JsonSchema::Node& n = node(f.node);
    if (n.kind == Kind::kObject) f.index = static_cast<int32_t>(f.count) + 1;
    else ++f.count;
    f.phase = kNext;
  }

  Frame start(int32_t id) const {
    Frame f;
    f.node = id;
    f.phase = kOpen;
    f.json = JsonState::any_value();
    return f;
  }

  // First byte of a value frame just pushed: strings and numbers begin as their type says.
  static bool first_byte_fits(const JsonSchema::Node& n, uint8_t b) {
    const Kind k = n.kind;
    if (k == Kind::kAny && n.object_only) return b == '{';
    if (k == Kind::kString) return b == '"';
    if (k == Kind::kNumber || k == Kind::kInteger) return b == '-' || (b >= '0' && b <= '9');
    return true;
  }

  void feed(Stack s, uint8_t b, std::vector<Stack>& out) const {
    while (!s.empty()) {
      int32_t child = -1;
      switch (step(s.back(), b, &child)) {
        case Step::kConsumed: out.push_back(std::move(s)); return;
        case Step::kReject: return;
        case Step::kDone:
          s.pop_back();
          if (!s.empty()) complete_child(s.back());
          out.push_back(std::move(s));
          return;
        case Step::kEndBefore:
          s.pop_back();
          if (s.empty()) return;
          complete_child(s.back());
          continue;
        case Step::kPush: {
          const std::vector<int32_t>& alts = node(child).flat;
          for (size_t i = 0; i < alts.size(); ++i) {
            if (!first_byte_fits(node(alts[i]), b)) continue;
            Stack c = s;
            c.push_back(start(alts[i]));
            feed(std::move(c), b, out);
          }
          return;
        }
      }
    }
    // A finished document takes nothing more.
  }

  int64_t frame_cost(const Frame& f) const {
    const JsonSchema::Node& n = node(f.node);
    switch (n.kind) {
      case Kind::kPattern: return static_cast<int64_t>(n.pattern.size()) - f.index;
      case Kind::kString: case Kind::kNumber: case Kind::kInteger: case Kind::kAny:
        return f.phase == kOpen ? n.min_bytes : f.json.closing_cost();
      case Kind::kAnyOf: return kInfinite;
      case Kind::kArray: {
        const int64_t item = node(n.items).min_bytes;
        const int64_t missing = std::max<int64_t>(n.min_items - f.count, 0);
        switch (f.phase) {
          case kOpen: return n.min_bytes;
          case kFirstItem: return missing == 0 ? 1 : mul_sat(missing, item + 1);
          case kAfterComma: return mul_sat(std::max<int64_t>(missing, 1), item + 1);
          case kInValue: return sat(mul_sat(std::max<int64_t>(missing - 1, 0), item + 1) + 1);
          default: return sat(mul_sat(missing, item + 1) + 1);  // kNext
        }
      }
      case Kind::kObject: {
        auto after = [&](int32_t i) { return n.required_from[static_cast<size_t>(i)]; };  // each with its comma
        switch (f.phase) {
          case kOpen: return n.min_bytes;
          case kKeyOrEnd:
            return n.next_required[0] == static_cast<int32_t>(n.properties.size()) ? 1 : after(f.index);  // first comma is the '}' slot
          case kKeyStart: {
            const bool any_required = n.next_required[static_cast<size_t>(f.index)] < static_cast<int32_t>(n.properties.size());
            return sat(1 + (any_required ? after(f.index) - 1 : n.cheapest_from[static_cast<size_t>(f.index)]));
          }
          case kKey: {
            const auto [first, last] = key_range(n, f.index);
            const std::string& prefix_of = n.properties[static_cast<size_t>(f.key_len == 0 ? first : static_cast<int32_t>(f.count))].key;
            int64_t best = kInfinite;
            for (int32_t c = first; c <= last; ++c) {
              const JsonSchema::Property& p = n.properties[static_cast<size_t>(c)];
              if (!same_prefix(p.key, prefix_of, f.key_len)) continue;
              best = std::min(best, sat(property_cost(p) - 1 - f.key_len + after(c + 1) + 1));
            }
            return best;
          }
          case kColon: {
            const JsonSchema::Property& p = n.properties[static_cast<size_t>(f.count)];
            return sat(1 + node(p.node).min_bytes + after(static_cast<int32_t>(f.count) + 1) + 1);
          }
          case kExpectValue: {
            const JsonSchema::Property& p = n.properties[static_cast<size_t>(f.count)];
            return sat(node(p.node).min_bytes + after(static_cast<int32_t>(f.count) + 1) + 1);
          }
          case kInValue: return sat(after(static_cast<int32_t>(f.count) + 1) + 1);
          default: return sat(after(f.index) + 1);  // kNext
        }
      }
    }
    return kInfinite;
  }

  int64_t property_cost(const JsonSchema::Property& p) const {
    return sat(static_cast<int64_t>(p.key.size()) + 3 + node(p.node).min_bytes);
  }

  int64_t stack_cost(const Stack& s) const {
    int64_t total = 0;
    for (const Frame& f : s) total = sat(total + frame_cost(f));
    return total;
  }
};

}  // namespace

SchemaState::SchemaState(const JsonSchema& schema) : schema_(&schema) {
  Machine m{schema};
  for (int32_t id : schema.nodes[static_cast<size_t>(schema.root)].flat) stacks_.push_back({m.start(id)});
}

SchemaState::SchemaState(const JsonSchema& schema, int32_t node) : schema_(&schema) {
  Machine m{schema};
  for (int32_t id : schema.nodes[static_cast<size_t>(node)].flat) stacks_.push_back({m.start(id)});
}

bool SchemaState::can_end() const {
  for (const Stack& s : stacks_) {
    if (s.empty()) return true;
    if (s.size() != 1) continue;
    const Frame& f = s[0];
    const Kind kind = schema_->nodes[static_cast<size_t>(f.node)].kind;
    if ((kind == Kind::kNumber || kind == Kind::kInteger || kind == Kind::kAny) && f.phase != kOpen && f.json.number_may_end())
      return true;
  }
  return false;
}

bool SchemaState::feed(uint8_t byte) {
  Machine m{*schema_};
  std::vector<Stack> next;
  for (Stack& s : stacks_) {
    m.feed(std::move(s), byte, next);
    if (next.size() >= kMaxAlternatives) break;
  }
  if (next.size() > kMaxAlternatives) next.resize(kMaxAlternatives);
  stacks_ = std::move(next);
  return !stacks_.empty();
}

bool SchemaState::done() const {
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool SchemaState::in_plain_string() const {
  if (stacks_.size() != 1 || stacks_[0].empty()) return false;
  const Frame& top = stacks_[0].back();
  const Kind kind = schema_->nodes[static_cast<size_t>(top.node)].kind;
  return (kind == Kind::kString || kind == Kind::kAny) && top.json.in_plain_string();
}

int64_t SchemaState::closing_cost() const {
  Machine m{*schema_};
  int64_t best = kInfinite;
  for (const Stack& s : stacks_) best = std::min(best, m.stack_cost(s));
  return best;
}

namespace {

// `sorted`: (bytes, id) sorted by bytes. Each trie node's tokens and children are then
// contiguous; the trie is laid out breadth by breadth through a queue of (token range, depth).
ByteTrie build_byte_trie(const std::vector<std::pair<std::string, int32_t>>& sorted) {
  ByteTrie t;
  struct Pending {
    size_t begin, end, depth;
  };
  std::vector<Pending> queue{{0, sorted.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending p = queue[q];
    t.first_edge.push_back(static_cast<uint32_t>(t.edge_byte.size()));
    t.first_token.push_back(static_cast<uint32_t>(t.tokens.size()));
    size_t i = p.begin;
    while (i < p.end && sorted[i].first.size() == p.depth) t.tokens.push_back(sorted[i++].second);
    while (i < p.end) {
      const char c = sorted[i].first[p.depth];
      size_t j = i;
      while (j < p.end && sorted[j].first[p.depth] == c) ++j;
      t.edge_byte.push_back(static_cast<uint8_t>(c));
      t.edge_node.push_back(static_cast<uint32_t>(queue.size()));
      queue.push_back({i, j, p.depth + 1});
      i = j;
    }
  }
  t.first_edge.push_back(static_cast<uint32_t>(t.edge_byte.size()));
  t.first_token.push_back(static_cast<uint32_t>(t.tokens.size()));
  return t;
}

bool plain_string_content(const std::string& bytes) {
  JsonState s = JsonState::any_value();
  s.feed('"');
  for (char c : bytes)
    if (c == '"' || c == '\\' || !s.feed(static_cast<uint8_t>(c))) return false;
  return s.in_plain_string();
}

bool plain_raw_text(const std::string& bytes) {
  JsonState s = JsonState::any_value();
  s.feed('"');
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (b == '<' || b == '\n' || (b < 0x20 && b != '\t' && b != '\r')) return false;
    // Bytes a JSON string would escape are one ASCII character of raw text: feed a stand-in.
    if (!s.feed(b == '"' || b == '\\' || b < 0x20 ? static_cast<uint8_t>('a') : b)) return false;
  }
  return s.in_plain_string();
}

}  // namespace

std::shared_ptr<const VocabularyTrie> vocabulary_trie(const Tokenizer& tok) {
  static std::mutex mu;
  static std::map<const Tokenizer*, std::shared_ptr<const VocabularyTrie>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[&tok];
  if (slot) return slot;
  std::vector<std::pair<std::string, int32_t>> sorted, not_plain;
  auto t = std::make_shared<VocabularyTrie>();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) continue;
    std::string b = tok.token_bytes(id);
    if (b.empty()) continue;
    if (b.size() == 1) t->single_byte[static_cast<uint8_t>(b[0])] = true;
    if (b.find('>') != std::string::npos) t->closing_angle.push_back(id);
    sorted.emplace_back(std::move(b), id);
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::pair<std::string, int32_t>> with_angle;
  for (const auto& entry : sorted) {
    if (plain_string_content(entry.first)) {
      t->plain.push_back(entry.second);
      if (entry.first.find('<') == std::string::npos) t->plain_without_angle.push_back(entry.second);
      else with_angle.push_back(entry);
    } else {
      not_plain.push_back(entry);
    }
  }
  std::vector<std::pair<std::string, int32_t>> text_rest;
  for (const auto& entry : sorted) {
    if (plain_raw_text(entry.first)) t->text_plain.push_back(entry.second);
    else text_rest.push_back(entry);
  }
  t->all = build_byte_trie(sorted);
  t->not_plain = build_byte_trie(not_plain);
  t->plain_with_angle = build_byte_trie(with_angle);
  t->text_rest = build_byte_trie(text_rest);
  slot = std::move(t);
  return slot;
}

void add_closing_bytes(const JsonSchema& schema, std::set<uint8_t>& bytes) {
  for (char c : std::string("{}[]\":,0-.eE+truefalsn")) bytes.insert(static_cast<uint8_t>(c));
  for (int b = 0x80; b <= 0xBF; ++b) bytes.insert(static_cast<uint8_t>(b));
  for (const JsonSchema::Node& n : schema.nodes) {
    for (const JsonSchema::Property& p : n.properties)
      for (char c : p.key) bytes.insert(static_cast<uint8_t>(c));
    for (const auto& [lo, hi] : n.pattern) bytes.insert(lo);
  }
}

SchemaConstraint::SchemaConstraint(const Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema)
    : tokenizer_(&tokenizer), trie_(vocabulary_trie(tokenizer)), schema_(std::move(schema)), state_(*schema_) {
  // The budget counts one token per byte of the shortest completion: each byte such a
  // completion may use must exist as a token of its own. Those are JSON's punctuation, "0",
  // the letters of true/false/null, UTF-8 continuation bytes (the rest of a character cut
  // short), and every byte of the schema's keys and patterns (the lowest of each range).
  std::set<uint8_t> needed;
  add_closing_bytes(*schema_, needed);
  for (uint8_t b : needed)
    if (!trie_->single_byte[b])
      throw Error("JSON schema output: the tokenizer has no single-byte token for byte " + std::to_string(b) +
                  ", which closing a document within max_tokens relies on");
}

SchemaConstraint::~SchemaConstraint() = default;

void SchemaConstraint::mask(std::span<float> logits, int64_t tokens_left) const {
  mask_with_trie(*trie_, state_, state_.in_plain_string(), logits, tokens_left);
}

bool SchemaConstraint::advance(int32_t token) {
  if (token < 0 || token >= tokenizer_->vocab_size() || tokenizer_->is_special(token)) return false;
  const std::string bytes = tokenizer_->token_bytes(token);
  if (bytes.empty()) return false;
  SchemaState s = state_;
  for (char c : bytes)
    if (!s.feed(static_cast<uint8_t>(c))) return false;
  state_ = std::move(s);
  return true;
}

}  // namespace hanpu
