// response_format json_schema (issue 35 item 5): the schema compiler's refusals, the byte
// automaton on hand-written documents for every supported keyword, and constrained sampling from
// random logits whose output must parse and validate (checked by a small validator of the
// supported subset written here from the JSON Schema 2020-12 validation spec, independent of the
// automaton) at every seed and budget tried. The Python serve tests check the same with PyPI's
// jsonschema through the server.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "hanpu/generator.hpp"
#include "hanpu/tokenizer.hpp"
#include "hanpu/chat_output.hpp"
#include "model/json_constraint_schema.hpp"
#include "model/json_constraint_tools.hpp"
#include "test_support.hpp"

namespace {

using hanpu::GenerationOptions;
using hanpu::JsonSchema;
using hanpu::SchemaError;
using hanpu::SchemaState;
using hanpu::TokenStream;
using ojson = nlohmann::ordered_json;

std::shared_ptr<const JsonSchema> compile(const char* text) { return JsonSchema::compile(ojson::parse(text)); }

bool accepts(const JsonSchema& s, const std::string& doc) {
  SchemaState st(s);
  for (char c : doc)
    if (!st.feed(static_cast<uint8_t>(c))) return false;
  return st.done();
}

// The validator of the subset (independent of the automaton).
bool valid(const ojson& v, const ojson& schema, const ojson& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string r = schema["$ref"];
    return valid(v, r == "#" ? root : root.at(ojson::json_pointer(r.substr(1))), root);
  }
  if (schema.contains("anyOf")) {
    for (const ojson& a : schema["anyOf"])
      if (valid(v, a, root)) return true;
    return false;
  }
  if (schema.contains("allOf"))
    for (const ojson& a : schema["allOf"])
      if (!valid(v, a, root)) return false;
  if (schema.contains("const") && v != schema["const"]) return false;
  if (schema.contains("enum") && std::find(schema["enum"].begin(), schema["enum"].end(), v) == schema["enum"].end()) return false;
  if (schema.contains("type")) {
    std::vector<std::string> types;
    if (schema["type"].is_string()) types.push_back(schema["type"]);
    else for (const ojson& t : schema["type"]) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types)
      ok = ok || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
           (t == "number" && v.is_number()) || (t == "integer" && (v.is_number_integer() || v.is_number_unsigned())) ||
           (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null());
    if (!ok) return false;
  }
  if (v.is_object()) {
    if (schema.contains("required"))
      for (const ojson& r : schema["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (schema.contains("properties") && schema["properties"].contains(k)) {
        if (!valid(x, schema["properties"][k], root)) return false;
      } else if (schema.contains("additionalProperties") && !valid(x, schema["additionalProperties"], root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return false;
    if (schema.contains("items"))
      for (const ojson& x : v)
        if (!valid(x, schema["items"], root)) return false;
  }
  if (v.is_string() && schema.contains("format")) {
    const std::string s = v;
    const std::string f = schema["format"];
    auto digits = [&](size_t from, size_t n) {
      for (size_t i = from; i < from + n; ++i)
        if (i >= s.size() || !isdigit(static_cast<unsigned char>(s[i]))) return false;
      return true;
    };
    auto date_ok = [&](size_t at) {
      if (!digits(at, 4) || s[at + 4] != '-' || !digits(at + 5, 2) || s[at + 7] != '-' || !digits(at + 8, 2)) return false;
      const int month = std::stoi(s.substr(at + 5, 2)), day = std::stoi(s.substr(at + 8, 2));
      return month >= 1 && month <= 12 && day >= 1 && day <= 28;
    };
    auto time_ok = [&](size_t at) {
      if (!digits(at, 2) || s[at + 2] != ':' || !digits(at + 3, 2) || s[at + 5] != ':' || !digits(at + 6, 2) || s[at + 8] != 'Z')
        return false;
      return std::stoi(s.substr(at, 2)) < 24 && std::stoi(s.substr(at + 3, 2)) < 60 && std::stoi(s.substr(at + 6, 2)) < 60;
    };
    if (f == "date") return s.size() == 10 && date_ok(0);
    if (f == "time") return s.size() == 9 && time_ok(0);
    if (f == "date-time") return s.size() == 20 && date_ok(0) && s[10] == 'T' && time_ok(11);
    if (f == "uuid")
      return s.size() == 36 && s[8] == '-' && s[13] == '-' && s[18] == '-' && s[23] == '-' && digits(0, 8) &&
             digits(9, 4) && digits(14, 4) && digits(19, 4) && digits(24, 12);
  }
  return true;
}

TEST(JsonSchemaCompile, RefusesWhatItCannotEnforceNamingKeywordAndPlace) {
  struct Case {
    const char* schema;
    const char* pointer;
    const char* keyword;
  };
  const Case cases[] = {
      {R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})", "/properties/age", "minimum"},
      {R"({"type":"object","properties":{"s":{"type":"string","pattern":"a+"}}})", "/properties/s", "pattern"},
      {R"({"type":"object","properties":{"s":{"type":"string","maxLength":3}}})", "/properties/s", "maxLength"},
      {R"({"type":"object","properties":{"s":{"type":"string","format":"email"}}})", "/properties/s", "format"},
      {R"({"type":"object","properties":{"a":{"oneOf":[{"type":"string"}]}}})", "/properties/a", "oneOf"},
      {R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})", "/properties/a", "not"},
      {R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})", "/properties/a", "uniqueItems"},
      {R"({"type":"object","properties":{"a":{"type":"array","prefixItems":[true]}}})", "/properties/a", "prefixItems"},
      {R"({"type":"object","properties":{"a":{"type":"array","items":[true]}}})", "/properties/a", "items"},
      {R"({"type":"object","properties":{"a":{"type":"array","minItems":3,"maxItems":2}}})", "/properties/a", "maxItems"},
      {R"({"type":"object","properties":{"a":{"type":"array","minItems":-1}}})", "/properties/a", "minItems"},
      {R"({"type":"object","properties":{"a":{"allOf":[{"type":"string"},{"type":"string"}]}}})", "/properties/a", "allOf"},
      {R"({"type":"object","properties":{"a":{"type":"string","anyOf":[{"type":"string"}]}}})", "/properties/a", "type"},
      {R"({"type":"object","properties":{"a":{"$ref":"http://x/y"}}})", "/properties/a", "$ref"},
      {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}})", "/properties/a", "$ref"},
      {R"({"type":"object","properties":{"a":false}})", "/properties/a", "false"},
      {R"({"type":"object","properties":{"a":{"type":"strng"}}})", "/properties/a", "type"},
      {R"({"type":"object","properties":{"a":{"enum":[1,2],"type":"string"}}})", "/properties/a", "enum"},
      {R"({"type":"object","required":["x"],"additionalProperties":false})", "", "required"},
      {R"({"type":"object","patternProperties":{"a":true}})", "", "patternProperties"},
      {R"({"type":"string"})", "", "type"},
      {R"({"type":"array"})", "", "type"},
      {R"(3)", "", "type"},
      {R"({"$ref":"#/$defs/a","$defs":{"a":{"type":"object","required":["x"],"properties":{"x":{"$ref":"#/$defs/a"}}}}})",
       "", "$ref"},
  };
  for (const Case& c : cases) {
    try {
      compile(c.schema);
      ADD_FAILURE() << "accepted " << c.schema;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.pointer(), c.pointer) << c.schema << ": " << e.what();
      EXPECT_EQ(e.keyword(), c.keyword) << c.schema << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.keyword), std::string::npos) << e.what();
    }
  }
  // Annotations, unknown keywords and constraints at their neutral values are accepted.
  EXPECT_NO_THROW(compile(R"({"type":"object","title":"t","description":"d","x-vendor":1,"minProperties":0,
                              "properties":{"a":{"type":"string","minLength":0,"default":"x","uniqueItems":false}}})"));
}

TEST(JsonSchemaAutomaton, EveryKeyword) {
  struct Case {
    const char* schema;
    std::vector<std::string> good, bad;
  };
  const std::vector<Case> cases = {
      {R"({"type":"object"})", {"{}", R"({"a":1,"b":[{"c":null}],"a":"x"})"}, {"[]", "{", "{} ", "0"}},
      {R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"a":1})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})", {"{}"}, {R"({"a":1})"}},
      {R"({"type":"object","properties":{"meta":{"type":"object"}},"required":["meta"]})",
       {R"({"meta":{}})", R"({"meta":{"k":[1,2],"j":"s"}})"}, {R"({"meta":[]})", R"({"meta":1})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"]})",
       {R"({"b":""})", R"({"a":-12,"b":"x\n\u00e9"})", R"({"a":0,"b":"é"})"},
       {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"a":1.5,"b":""})", R"({"a":1e3,"b":""})", R"({"a":01,"b":""})", R"({"a":1234567890123456,"b":""})",
        R"({"b":1})", R"({"c":1,"b":""})", R"({"a":1,"a":2,"b":""})", R"({"b":"","b":""})"}},
      {R"({"type":"object","properties":{"n":{"type":"number"},"t":{"type":"boolean"},"z":{"type":"null"}},
           "required":["n","t","z"]})",
       {R"({"n":-0.5e+10,"t":true,"z":null})", R"({"n":3,"t":false,"z":null})"},
       {R"({"n":"3","t":true,"z":null})", R"({"n":3,"t":1,"z":null})", R"({"n":3,"t":true,"z":0})", R"({"n":.5,"t":true,"z":null})"}},
      {R"({"type":"object","properties":{"c":{"enum":["red","green",3,null,{"k":[1]}]}},"required":["c"]})",
       {R"({"c":"red"})", R"({"c":"green"})", R"({"c":3})", R"({"c":null})", R"({"c":{"k":[1]}})"},
       {R"({"c":"re"})", R"({"c":"blue"})", R"({"c":30})", R"({"c":{"k":[2]}})", R"({"c":"red" })"}},
      {R"({"type":"object","properties":{"c":{"const":"x"},"d":{"enum":[1,12]}},"required":["c","d"]})",
       {R"({"c":"x","d":1})", R"({"c":"x","d":12})"}, {R"({"c":"y","d":1})", R"({"c":"x","d":2})", R"({"c":"x","d":123})"}},
      {R"({"type":"object","properties":{"l":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}},
           "required":["l"]})",
       {R"({"l":[1,2]})", R"({"l":[1,2,3]})"}, {R"({"l":[]})", R"({"l":[1]})", R"({"l":[1,2,3,4]})", R"({"l":[1,"2"]})"}},
      {R"({"type":"object","properties":{"l":{"type":"array"}},"required":["l"]})",
       {R"({"l":[]})", R"({"l":[1,"a",[{}],null]})"}, {R"({"l":[1,]})", R"({"l":{}})"}},
      {R"({"type":"object","properties":{"o":{"type":"object","properties":{"p":{"type":"object","properties":
           {"q":{"type":"string"}},"required":["q"]}},"required":["p"]}},"required":["o"]})",
       {R"({"o":{"p":{"q":"deep"}}})"}, {R"({"o":{"p":{}}})", R"({"o":{}})"}},
      {R"({"type":"object","properties":{"v":{"anyOf":[{"type":"string"},{"type":"integer"},
           {"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}]}},"required":["v"]})",
       {R"({"v":"s"})", R"({"v":7})", R"({"v":{"k":""}})"}, {R"({"v":true})", R"({"v":{}})", R"({"v":1.5})"}},
      {R"({"type":"object","properties":{"v":{"type":["string","null"]}},"required":["v"]})",
       {R"({"v":"s"})", R"({"v":null})"}, {R"({"v":1})"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"name":{"type":"string"},"kids":{"type":"array",
           "items":{"$ref":"#/$defs/node"}}},"required":["name"]}},"$ref":"#/$defs/node"})",
       {R"({"name":"a"})", R"({"name":"a","kids":[{"name":"b","kids":[]},{"name":"c"}]})"},
       {R"({"name":"a","kids":[{}]})", R"({"kids":[]})"}},
      {R"({"type":"object","properties":{"a":{"allOf":[{"$ref":"#/definitions/s"}]}},"required":["a"],
           "definitions":{"s":{"type":"string"}}})",
       {R"({"a":""})"}, {R"({"a":0})"}},
      {R"({"type":"object","properties":{"d":{"type":"string","format":"date"},"t":{"type":"string","format":"time"},
           "dt":{"type":"string","format":"date-time"},"u":{"type":"string","format":"uuid"}},"required":["d","t","dt","u"]})",
       {R"({"d":"2024-02-28","t":"23:59:59Z","dt":"1999-12-01T00:00:00Z","u":"12345678-1234-1234-1234-123456789012"})"},
       {R"({"d":"2024-13-01","t":"23:59:59Z","dt":"1999-12-01T00:00:00Z","u":"12345678-1234-1234-1234-123456789012"})",
        R"({"d":"2024-02-30","t":"23:59:59Z","dt":"1999-12-01T00:00:00Z","u":"12345678-1234-1234-1234-123456789012"})",
        R"({"d":"2024-02-28","t":"24:00:00Z","dt":"1999-12-01T00:00:00Z","u":"12345678-1234-1234-1234-123456789012"})",
        R"({"d":"2024-02-28","t":"23:59:59Z","dt":"1999-12-01 00:00:00Z","u":"12345678-1234-1234-1234-123456789012"})",
        R"({"d":"2024-02-28","t":"23:59:59Z","dt":"1999-12-01T00:00:00Z","u":"12345678-1234-1234-1234-12345678901"})"}},
      {R"({"type":"object","required":["x"]})", {R"({"x":[1,{"y":null}]})"}, {R"({})"}},
      {R"({"type":"object","properties":{"a\"b":{"type":"integer"}},"required":["a\"b"]})", {R"({"a\"b":1})"},
       {R"({"a":1})", R"({"a\"":1})"}},
      {R"({"type":"object","properties":{"ab":{"type":"integer"},"a":{"type":"integer"}}})",
       {R"({"ab":1,"a":2})", R"({"a":2})", R"({"ab":1})", "{}"}, {R"({"a":2,"ab":1})", R"({"b":1})"}},
  };
  for (const Case& c : cases) {
    const auto s = compile(c.schema);
    const ojson schema = ojson::parse(c.schema);
    for (const std::string& g : c.good) {
      EXPECT_TRUE(accepts(*s, g)) << c.schema << " should accept " << g;
      EXPECT_TRUE(valid(ojson::parse(g), schema, schema)) << "test's validator disagrees on " << g;
    }
    for (const std::string& b : c.bad) EXPECT_FALSE(accepts(*s, b)) << c.schema << " should refuse " << b;
  }
}

// The shortest completion: from each prefix of a valid document, closing_cost() is at most the
// bytes that document still needs, and exactly min_bytes at the start.
TEST(JsonSchemaAutomaton, ClosingCostIsTheShortestCompletion) {
  const auto s = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"bb":{"type":"array","minItems":2,
      "items":{"enum":["xy","z"]}},"c":{"type":"string","format":"date"}},"required":["bb","c"]})");
  const std::string shortest = R"({"bb":["z","z"],"c":"1000-01-01"})";
  EXPECT_EQ(s->min_bytes(), static_cast<int64_t>(shortest.size()));
  EXPECT_TRUE(accepts(*s, shortest));
  SchemaState st(*s);
  for (size_t i = 0; i < shortest.size(); ++i) {
    EXPECT_EQ(st.closing_cost(), static_cast<int64_t>(shortest.size() - i)) << "after " << shortest.substr(0, i);
    ASSERT_TRUE(st.feed(static_cast<uint8_t>(shortest[i])));
  }
  EXPECT_EQ(st.closing_cost(), 0);
  EXPECT_TRUE(st.done());
}

const char* const kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"}},
        "required":["name","age","ok"],"additionalProperties":false})",
    R"({"type":"object","properties":{"tags":{"type":"array","items":{"enum":["a","bc",1,null]},"minItems":1,"maxItems":4},
        "n":{"type":"number"},"m":{"anyOf":[{"type":"string","format":"date-time"},{"type":"null"}]}},"required":["tags","m"]})",
    R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},"c":{"type":"array","items":{"$ref":"#/$defs/t"},
        "maxItems":2}},"required":["v"]}},"$ref":"#/$defs/t"})",
    R"({"type":"object","properties":{"u":{"type":"string","format":"uuid"},"any":true,"x":{"type":["integer","string"]}},
        "required":["any","x"]})",
    R"({"type":"object","properties":{"meta":{"type":"object"}},"required":["meta"]})",
    R"({"type":"object"})",
};

TEST(JsonSchemaSampling, RandomLogitsAlwaysGiveAValidDocumentWithinMaxTokens) {
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (const char* text : kSchemas) {
    const ojson schema = ojson::parse(text);
    const auto compiled = JsonSchema::compile(schema);
    for (uint64_t seed = 0; seed < 30; ++seed) {
      GenerationOptions o;
      o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed};
      o.max_tokens = compiled->min_bytes() + static_cast<int64_t>(seed % 6) * 7;  // down to the minimum
      o.json_schema = compiled;
      TokenStream s(&tok, {}, o);
      std::vector<float> logits(V);
      while (!s.finished()) {
        for (float& x : logits) x = normal(rng);
        s.push(logits);
      }
      EXPECT_EQ(s.reason(), hanpu::FinishReason::kStopToken) << "the document closes within the budget";
      EXPECT_LE(static_cast<int64_t>(s.tokens().size()), o.max_tokens);
      ojson j;
      ASSERT_NO_THROW(j = ojson::parse(s.text())) << "seed " << seed << ": " << s.text();
      EXPECT_TRUE(valid(j, schema, schema)) << text << "\nseed " << seed << ": " << s.text();
    }
  }
}

TEST(JsonSchemaSampling, RefusesTooFewTokens) {
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  GenerationOptions o;
  o.json_schema = compile(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})");
  o.max_tokens = o.json_schema->min_bytes() - 1;  // {"a":""} is 8 bytes
  EXPECT_EQ(o.json_schema->min_bytes(), 8);
  EXPECT_THROW(TokenStream(&tok, {}, o), hanpu::Error);
  o.max_tokens = 8;
  EXPECT_NO_THROW(TokenStream(&tok, {}, o));
  EXPECT_THROW(TokenStream(nullptr, {}, o), hanpu::Error);
}

// ---- tool calls (json_constraint_tools.hpp) -----------------------------------------------------

using hanpu::ToolCallFormat;
using hanpu::ToolCallGrammar;
using hanpu::ToolCallState;
using hanpu::ToolSchemaError;

const char* const kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
     "when": {"type": "string", "format": "date-time"}, "guests": {"type": "integer"}, "vip": {"type": "boolean"},
     "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "tags": {"type": "array", "items": {"type": "string"},
     "maxItems": 3}, "address": {"$ref": "#/$defs/addr"}}, "required": ["when", "guests", "vip"],
     "$defs": {"addr": {"type": "object", "properties": {"street": {"type": "string"}}, "required": ["street"]}}}}},
  {"type": "function", "function": {"name": "noargs"}}
])";

std::shared_ptr<const ToolCallGrammar> tool_grammar(ToolCallFormat format, const std::string& forced, bool parallel,
                                                    const ojson& tools = ojson::parse(kTools)) {
  ToolCallGrammar::Options o;
  o.format = format;
  o.forced = forced;
  o.parallel = parallel;
  for (const ojson& t : tools)
    o.tools.push_back({t["function"]["name"], t["function"].contains("parameters") ? t["function"]["parameters"] : ojson()});
  return ToolCallGrammar::compile(o);
}

// Feeds a reply (after the prompt prefix); the state afterwards, or nothing if a byte was refused.
std::optional<ToolCallState> feed_reply(const ToolCallGrammar& g, const std::string& reply) {
  ToolCallState st(g);
  for (char c : reply)
    if (!st.feed(static_cast<uint8_t>(c))) return std::nullopt;
  return st;
}

bool accepts_reply(const ToolCallGrammar& g, const std::string& reply) {
  const auto st = feed_reply(g, reply);
  return st && st->accepting();
}

// Every call in prefix + reply parses, names a tool, and its arguments validate.
void expect_valid_calls(const std::string& text, ToolCallFormat format, const ojson& tools, const std::string& forced,
                        size_t min_calls, size_t max_calls, const std::string& where) {
  const hanpu::ParsedToolCalls p = hanpu::parse_tool_calls(text, format, tools);
  EXPECT_EQ(p.content, "") << where << ": " << text;
  EXPECT_GE(p.calls.size(), min_calls) << where << ": " << text;
  EXPECT_LE(p.calls.size(), max_calls) << where << ": " << text;
  for (const hanpu::ToolCall& c : p.calls) {
    const ojson* schema = nullptr;
    for (const ojson& t : tools)
      if (t["function"]["name"] == c.name) schema = t["function"].contains("parameters") ? &t["function"]["parameters"] : nullptr;
    if (!forced.empty()) EXPECT_EQ(c.name, forced) << where;
    bool known = false;
    for (const ojson& t : tools) known = known || t["function"]["name"] == c.name;
    EXPECT_TRUE(known) << where << ": " << c.name;
    ojson args;
    ASSERT_NO_THROW(args = ojson::parse(c.arguments)) << where << ": " << c.arguments;
    const ojson empty_object = ojson::parse(R"({"type":"object","properties":{},"additionalProperties":false})");
    EXPECT_TRUE(valid(args, schema ? *schema : empty_object, schema ? *schema : empty_object))
        << where << ": " << c.name << " " << c.arguments << "\n" << text;
  }
}

TEST(ToolCallGrammar, RefusesWhatItCannotEnforceNamingToolAndKeyword) {
  auto refused = [](ToolCallFormat format, const char* tools, size_t tool, const std::string& pointer, const std::string& keyword) {
    try {
      tool_grammar(format, "", false, ojson::parse(tools));
      ADD_FAILURE() << "accepted: " << tools;
    } catch (const ToolSchemaError& e) {
      EXPECT_EQ(e.tool(), tool) << tools;
      EXPECT_EQ(e.pointer(), pointer) << tools;
      EXPECT_EQ(e.keyword(), keyword) << tools << ": " << e.what();
    }
  };
  const auto J = ToolCallFormat::kJsonTags, X = ToolCallFormat::kXmlTags;
  refused(J, R"([{"function": {"name": "a"}}, {"function": {"name": "b", "parameters": {"type": "object",
      "properties": {"age": {"type": "integer", "minimum": 0}}}}}])", 1, "/properties/age", "minimum");
  refused(J, R"([{"function": {"name": "a b"}}])", 0, "", "name");
  refused(J, R"([{"function": {"name": "a"}}, {"function": {"name": "a"}}])", 1, "", "name");
  refused(J, R"([{"function": {"name": "a", "parameters": {"type": "string"}}}])", 0, "", "type");
  refused(X, R"([{"function": {"name": "a", "parameters": {"type": "object"}}}])", 0, "", "properties");
  refused(X, R"([{"function": {"name": "a", "parameters": {"anyOf": [{"type": "object", "properties": {"x": {}}},
      {"type": "object", "properties": {"y": {}}}]}}}])", 0, "", "anyOf");
  refused(X, R"([{"function": {"name": "a", "parameters": {"type": "object", "properties": {"m": {"enum": ["x\ny"]}}}}}])",
          0, "/properties/m", "enum");
  refused(X, R"([{"function": {"name": "a", "parameters": {"type": "object", "properties": {"m": {"enum": ["</parameter>"]}}}}}])",
          0, "/properties/m", "enum");
  refused(X, R"([{"function": {"name": "a", "parameters": {"type": "object", "properties": {"a>b": {"type": "string"}}}}}])",
          0, "/properties/a>b", "properties");
  // The JSON format takes a free-form object (any keys).
  EXPECT_NO_THROW(tool_grammar(J, "", false, ojson::parse(R"([{"function": {"name": "a", "parameters": {"type": "object"}}}])")));
}

TEST(ToolCallGrammar, JsonTagsAutomaton) {
  const auto g = tool_grammar(ToolCallFormat::kJsonTags, "", false);
  EXPECT_EQ(g->prompt_prefix(), "<tool_call>\n{\"name\": \"");
  EXPECT_TRUE(accepts_reply(*g, "get_weather\", \"arguments\": {\"city\":\"Oslo\",\"days\":3}}\n</tool_call>"));
  EXPECT_TRUE(accepts_reply(*g, "noargs\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(accepts_reply(*g, "book\", \"arguments\": {\"when\":\"2024-02-28T10:00:00Z\",\"guests\":2,\"vip\":false,"
                                "\"address\":{\"street\":\"a\"}}}\n</tool_call>"));
  EXPECT_TRUE(feed_reply(*g, "get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>")->done())
      << "without parallel calls the reply ends with the first call";
  EXPECT_FALSE(feed_reply(*g, "get_weathers"));                                              // not a tool
  EXPECT_FALSE(feed_reply(*g, "get_weather\", \"arguments\": {\"days\":3"));                // city is required first
  EXPECT_FALSE(feed_reply(*g, "get_weather\", \"arguments\": {\"city\":\"a</tool_call>"));  // a marker inside a value
  EXPECT_FALSE(feed_reply(*g, "get_weather\", \"arguments\": {\"city\":\"<think>"));
  EXPECT_TRUE(feed_reply(*g, "get_weather\", \"arguments\": {\"city\":\"a<b</tool_ca\\u003e"));  // escaped: not the marker
  EXPECT_FALSE(feed_reply(*g, "get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>\n"));
  const auto named = tool_grammar(ToolCallFormat::kJsonTags, "book", true);
  EXPECT_EQ(named->prompt_prefix(), "<tool_call>\n{\"name\": \"book\", \"arguments\": ");
  const std::string one = "{\"when\":\"2024-02-28T10:00:00Z\",\"guests\":2,\"vip\":true}}\n</tool_call>";
  const auto st = feed_reply(*named, one);
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->accepting() && !st->done()) << "parallel calls: another may follow";
  // ... of the named function only
  EXPECT_TRUE(accepts_reply(*named, one + "\n<tool_call>\n{\"name\": \"book\", \"arguments\": " + one));
  EXPECT_FALSE(feed_reply(*named, one + "\n<tool_call>\n{\"name\": \"noargs"));
}

TEST(ToolCallGrammar, KimiSectionsAutomaton) {
  const auto g = tool_grammar(ToolCallFormat::kKimiSections, "", true);
  EXPECT_EQ(g->prompt_prefix(), "<|tool_calls_section_begin|><|tool_call_begin|>functions.");
  const std::string call = "get_weather:12<|tool_call_argument_begin|>{\"city\":\"x\"}<|tool_call_end|>";
  EXPECT_TRUE(accepts_reply(*g, call + "<|tool_calls_section_end|>"));
  EXPECT_TRUE(accepts_reply(*g, call + "<|tool_call_begin|>functions.noargs:13<|tool_call_argument_begin|>{}"
                                       "<|tool_call_end|><|tool_calls_section_end|>"));
  EXPECT_FALSE(accepts_reply(*g, call)) << "the section must close";
  EXPECT_FALSE(feed_reply(*g, "get_weather:<|tool_call_argument_begin|>")) << "an index of one or more digits";
  EXPECT_FALSE(feed_reply(*g, "get_weather:1234567")) << "at most six digits";
  EXPECT_FALSE(feed_reply(*g, "get_weather:0<|tool_call_argument_begin|>{\"city\":\"<|tool_call_end|>"));
  const auto named = tool_grammar(ToolCallFormat::kKimiSections, "get_weather", false);
  EXPECT_EQ(named->prompt_prefix(),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>");
  EXPECT_TRUE(feed_reply(*named, "{\"city\":\"x\"}<|tool_call_end|><|tool_calls_section_end|>")->done());
  EXPECT_FALSE(feed_reply(*named, "{\"city\":\"x\"}<|tool_call_end|><|tool_call_begin|>"));
}

TEST(ToolCallGrammar, XmlTagsAutomaton) {
  const auto g = tool_grammar(ToolCallFormat::kXmlTags, "", true);
  EXPECT_EQ(g->prompt_prefix(), "<tool_call>\n<function=");
  const std::string weather = "get_weather>\n<parameter=city>\nNew York\nline two\n</parameter>\n<parameter=days>\n12\n"
                              "</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts_reply(*g, weather));
  const std::string book = "book>\n<parameter=when>\n2024-01-02T03:04:05Z\n</parameter>\n<parameter=guests>\n-3\n</parameter>\n"
                           "<parameter=vip>\ntrue\n</parameter>\n<parameter=note>\n\"hi\"\n</parameter>\n<parameter=tags>\n"
                           "[\"a\",\"b\"]\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts_reply(*g, book));
  EXPECT_TRUE(accepts_reply(*g, weather + "\n<tool_call>\n<function=" + book));
  EXPECT_TRUE(accepts_reply(*g, "noargs>\n</function>\n</tool_call>"));
  EXPECT_TRUE(accepts_reply(*g, "get_weather>\n<parameter=city>\n\n</parameter>\n</function>\n</tool_call>")) << "empty text";
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n</function>")) << "city is required";
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n<parameter=days>")) << "city comes first (the schema's order)";
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n<parameter=zip>")) << "not a parameter";
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n<parameter=city>\na</parameter>")) << "the closing tag on its own line only";
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n<parameter=city>\na<parameter=")) << "a marker inside the text";
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n<parameter=city>\na\n</parameter>\n<parameter=unit>\nk"));  // enum c or f
  EXPECT_FALSE(feed_reply(*g, "get_weather>\n<parameter=city>\na\n</parameter>\n<parameter=days>\n1.5"));  // integer
  EXPECT_FALSE(feed_reply(*g, "book>\n<parameter=when>\n2024-13"));  // the date-time pattern
  EXPECT_FALSE(feed_reply(*g, "book>\n<parameter=when>\n\"2024"));   // a string parameter is its text, unquoted
  EXPECT_FALSE(feed_reply(*g, "book>\n<parameter=when>\n2024-01-02T03:04:05Z\n</parameter>\n<parameter=guests>\n1\n"
                              "</parameter>\n<parameter=vip>\nTrue"));  // JSON's true
  EXPECT_FALSE(feed_reply(*g, std::string("get_weather>\n<parameter=city>\n\xC3\x28")));  // not UTF-8
  // What the grammar writes, the XML parser reads back as the schema's values.
  const hanpu::ParsedToolCalls p =
      hanpu::parse_tool_calls(g->prompt_prefix() + book, ToolCallFormat::kXmlTags, ojson::parse(kTools));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments,
            R"({"when":"2024-01-02T03:04:05Z","guests":-3,"vip":true,"note":"hi","tags":["a","b"]})");
}

// From every prefix of a shortest reply, closing_cost() is exactly the bytes left.
TEST(ToolCallGrammar, ClosingCostIsTheShortestCompletion) {
  const std::pair<ToolCallFormat, std::string> shortest[] = {
      {ToolCallFormat::kJsonTags, "noargs\", \"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kKimiSections, "noargs:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"},
      {ToolCallFormat::kXmlTags, "noargs>\n</function>\n</tool_call>"},
  };
  for (const auto& [format, reply] : shortest)
    for (bool parallel : {false, true}) {
      const auto g = tool_grammar(format, "", parallel);
      EXPECT_EQ(g->min_bytes(), static_cast<int64_t>(reply.size())) << reply;
      ToolCallState st(*g);
      for (size_t i = 0; i < reply.size(); ++i) {
        EXPECT_EQ(st.closing_cost(), static_cast<int64_t>(reply.size() - i)) << reply.substr(0, i);
        ASSERT_TRUE(st.feed(static_cast<uint8_t>(reply[i])));
      }
      EXPECT_EQ(st.closing_cost(), 0);
      EXPECT_TRUE(st.accepting());
    }
  // XML: inside a raw value, the rest of a character and the terminator.
  const auto g = tool_grammar(ToolCallFormat::kXmlTags, "get_weather", false);
  const std::string tail = "\n</parameter>\n</function>\n</tool_call>";
  for (const std::string& text : {std::string("Oslo"), std::string("Oslo\n</para"), std::string("\xC3")}) {
    const auto st = feed_reply(*g, "<parameter=city>\n" + text);
    ASSERT_TRUE(st) << text;
    const int64_t partial = text.back() == 'a' ? 7 : 0, utf8 = text == "\xC3" ? 1 : 0;
    EXPECT_EQ(st->closing_cost(), static_cast<int64_t>(tail.size()) - partial + utf8) << text;
  }
}

// Random logits, every format, required and named, with and without parallel calls, budgets
// down to the minimum: every reply parses as calls whose arguments validate.
TEST(ToolCallSampling, RandomLogitsAlwaysGiveValidCallsWithinMaxTokens) {
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  const int32_t im_end = *tok.token_to_id("<|im_end|>");
  const ojson tools = ojson::parse(kTools);
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (ToolCallFormat format : {ToolCallFormat::kJsonTags, ToolCallFormat::kKimiSections, ToolCallFormat::kXmlTags})
    for (const std::string forced : {"", "book", "get_weather"})
      for (bool parallel : {false, true}) {
        const auto g = tool_grammar(format, forced, parallel);
        for (uint64_t seed = 0; seed < 12; ++seed) {
          GenerationOptions o;
          o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed};
          o.max_tokens = g->min_bytes() + static_cast<int64_t>(seed % 4) * 40;
          o.tool_calls = g;
          TokenStream s(&tok, {im_end}, o);
          std::vector<float> logits(V);
          while (!s.finished()) {
            for (float& x : logits) x = normal(rng);
            logits[static_cast<size_t>(im_end)] += 2;  // end often where it may
            s.push(logits);
          }
          const std::string where = "format " + std::to_string(static_cast<int>(format)) + " forced '" + forced +
                                    "' parallel " + std::to_string(parallel) + " seed " + std::to_string(seed);
          EXPECT_EQ(s.reason(), hanpu::FinishReason::kStopToken) << where;
          EXPECT_LE(static_cast<int64_t>(s.tokens().size()), o.max_tokens) << where;
          expect_valid_calls(g->prompt_prefix() + s.text(), format, tools, forced, 1, parallel ? 1000 : 1, where);
        }
      }
}

std::shared_ptr<const ToolCallGrammar> lazy_grammar(ToolCallFormat format, bool parallel) {
  ToolCallGrammar::Options o;
  o.format = format;
  o.parallel = parallel;
  o.lazy = true;
  for (const ojson& t : ojson::parse(kTools))
    o.tools.push_back({t["function"]["name"], t["function"].contains("parameters") ? t["function"]["parameters"] : ojson()});
  return ToolCallGrammar::compile(o);
}

// tool_choice auto (a lazy grammar): the reply is free until the model writes the opening marker,
// then the call is constrained. A "model" of random logits that, after some free text, pushes
// towards the marker byte by byte: every reply holds calls that parse and validate after it, and
// the text before it is left as written.
TEST(ToolCallSampling, LazyGrammarConstrainsFromTheTrigger) {
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  const int32_t im_end = *tok.token_to_id("<|im_end|>");
  std::vector<int32_t> byte_token(256, -1);
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (!tok.is_special(id) && tok.token_bytes(id).size() == 1) byte_token[static_cast<uint8_t>(tok.token_bytes(id)[0])] = id;
  const ojson tools = ojson::parse(kTools);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (ToolCallFormat format : {ToolCallFormat::kJsonTags, ToolCallFormat::kKimiSections, ToolCallFormat::kXmlTags})
    for (bool parallel : {false, true}) {
      const auto g = lazy_grammar(format, parallel);
      ASSERT_TRUE(g->prompt_prefix().empty());
      const std::string& trigger = g->trigger();
      for (uint64_t seed = 0; seed < 12; ++seed) {
        GenerationOptions o;
        o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed};
        o.max_tokens = 220 + static_cast<int64_t>(seed) * 20;
        o.tool_calls = g;
        TokenStream s(&tok, {im_end}, o);
        std::vector<float> logits(V);
        const size_t free_tokens = 3 + seed % 6;
        while (!s.finished()) {
          for (float& x : logits) x = normal(rng);
          logits[static_cast<size_t>(im_end)] -= 20;  // not before the call
          const size_t at = s.text().find(trigger);
          if (s.tokens().size() >= free_tokens && at == std::string::npos) {
            // the next byte of the marker after what of it the text ends with
            size_t have = 0;
            for (size_t n = std::min(trigger.size() - 1, s.text().size()); n > 0; --n)
              if (s.text().compare(s.text().size() - n, n, trigger, 0, n) == 0) { have = n; break; }
            logits[static_cast<size_t>(byte_token[static_cast<uint8_t>(trigger[have])])] += 40;
          } else if (at != std::string::npos) {
            logits[static_cast<size_t>(im_end)] += 22;  // end often where it may
          }
          s.push(logits);
        }
        const std::string where = "format " + std::to_string(static_cast<int>(format)) + " parallel " +
                                  std::to_string(parallel) + " seed " + std::to_string(seed);
        const size_t at = s.text().find(trigger);
        ASSERT_NE(at, std::string::npos) << where << ": " << s.text();
        EXPECT_EQ(s.reason(), hanpu::FinishReason::kStopToken) << where;
        expect_valid_calls(s.text().substr(at), format, tools, "", 1, parallel ? 1000 : 1, where);
      }
    }
}

// Before the trigger: a token that would complete it is allowed only if the call it opens can go
// on and close within the budget; inside a think block the marker is text.
TEST(ToolCallSampling, LazyOpeningIsCheckedAndIgnoredWhileThinking) {
  const auto g = lazy_grammar(ToolCallFormat::kXmlTags, false);
  EXPECT_TRUE(hanpu::ToolCallConstraint::opening_fits(*g, "<tool_call>\n<function=get", false, 200));
  EXPECT_FALSE(hanpu::ToolCallConstraint::opening_fits(*g, "<tool_call>x", false, 200));
  EXPECT_FALSE(hanpu::ToolCallConstraint::opening_fits(*g, "<tool_call>", false, 10));  // no room to close
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  std::vector<int32_t> byte_token(256, -1);
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (!tok.is_special(id) && tok.token_bytes(id).size() == 1) byte_token[static_cast<uint8_t>(tok.token_bytes(id)[0])] = id;
  // Greedy along a scripted text: the marker inside the think block, then garbage after it, is not
  // constrained (the script goes through); after </think> the same marker is.
  auto run = [&](const std::string& script, bool opened) {
    GenerationOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = 200;
    o.tool_calls = g;
    o.reasoning_opened = opened;
    TokenStream s(&tok, {}, o);
    std::vector<float> logits(static_cast<size_t>(tok.vocab_size()));
    for (char c : script) {
      if (s.finished()) break;
      std::fill(logits.begin(), logits.end(), 0.f);
      logits[static_cast<size_t>(byte_token[static_cast<uint8_t>(c)])] = 10;
      s.push(logits);
    }
    return s.text();
  };
  EXPECT_EQ(run("<tool_call>oops</think>ok", true), "<tool_call>oops</think>ok");
  const std::string after = run("x</think><tool_call>oops", true);
  EXPECT_EQ(after.substr(0, 20), "x</think><tool_call>");
  EXPECT_NE(after.substr(20, 4), "oops") << "constrained after the trigger: " << after;
  const std::string plain = run("<tool_call>oops", false);
  EXPECT_EQ(plain.substr(0, 11), "<tool_call>");
  EXPECT_EQ(plain.substr(11, 1), "\n") << plain;  // the grammar's next byte, whatever the script wanted
}

// A marker the tokenizer has as a special token is allowed exactly where the grammar writes it,
// and its text is part of the reply.
TEST(ToolCallSampling, SpecialTokenMarkers) {
  // qwen35_tiny's tokenizer with its special <|endoftext|> renamed </tool_call>.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("hanpu_tool_marker_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  ojson t = ojson::parse(std::ifstream(hanpu::testing::golden_dir() / "qwen35_tiny" / "tokenizer.json"));
  for (ojson& a : t["added_tokens"])
    if (a["content"] == "<|endoftext|>") a["content"] = "</tool_call>";
  std::ofstream(dir / "tokenizer.json") << t.dump();
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir(dir.string());
  std::filesystem::remove_all(dir);
  const int32_t marker = *tok.token_to_id("</tool_call>");
  ASSERT_TRUE(tok.is_special(marker));
  const auto g = tool_grammar(ToolCallFormat::kJsonTags, "noargs", false);
  GenerationOptions o;
  o.max_tokens = 40;
  o.tool_calls = g;
  std::vector<float> logits(static_cast<size_t>(tok.vocab_size()), 0.f);
  // Greedy towards the marker: the mask decides where it may come.
  logits[static_cast<size_t>(marker)] = 50;
  o.sampling.temperature = 0;
  TokenStream greedy(&tok, {}, GenerationOptions{o});
  int64_t marker_at = -1;
  while (!greedy.finished()) {
    const auto next = greedy.push(logits);
    if (!greedy.tokens().empty() && greedy.tokens().back() == marker) marker_at = static_cast<int64_t>(greedy.tokens().size());
    (void)next;
  }
  EXPECT_EQ(greedy.text(), "{}}\n</tool_call>");
  EXPECT_EQ(marker_at, static_cast<int64_t>(greedy.tokens().size())) << "the marker is the last token";
  expect_valid_calls(g->prompt_prefix() + greedy.text(), ToolCallFormat::kJsonTags, ojson::parse(kTools), "noargs", 1, 1,
                     "special marker");
}

// The mask (a walk of the vocabulary's trie with shortcuts for plain string and text content)
// allows exactly the tokens whose bytes the automaton takes one by one within the budget, plus the
// stop tokens where the reply may end: checked token by token along random replies.
TEST(ToolCallSampling, MaskIsTheTokenByTokenCheck) {
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  const int32_t im_end = *tok.token_to_id("<|im_end|>");
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.f, 3.f);
  int64_t checked = 0;
  for (ToolCallFormat format : {ToolCallFormat::kJsonTags, ToolCallFormat::kKimiSections, ToolCallFormat::kXmlTags})
    for (uint64_t seed = 0; seed < 6; ++seed) {
      const auto g = tool_grammar(format, seed % 3 == 0 ? "book" : "", seed % 2 == 0);
      hanpu::ToolCallConstraint c(tok, g, {im_end});
      ToolCallState st(*g);
      hanpu::Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed});
      const int64_t max_tokens = g->min_bytes() + 60;
      for (int64_t i = 0; i < max_tokens && !st.done(); ++i) {
        std::vector<float> logits(V);
        for (float& x : logits) x = normal(rng);
        std::vector<float> masked = logits;
        c.mask(masked, max_tokens - i);
        for (size_t id = 0; id < V; ++id) {
          bool ok = false;
          if (static_cast<int32_t>(id) == im_end) {
            ok = st.accepting();
          } else {
            const std::string bytes = tok.token_bytes(static_cast<int32_t>(id));
            ToolCallState next = st;
            ok = !bytes.empty();
            for (char b : bytes) ok = ok && next.feed(static_cast<uint8_t>(b), tok.is_special(static_cast<int32_t>(id)));
            ok = ok && next.closing_cost() <= max_tokens - i - 1;
          }
          EXPECT_EQ(std::isfinite(masked[id]), ok) << "format " << static_cast<int>(format) << " seed " << seed << " step "
                                                   << i << " token " << id << " " << tok.token_bytes(static_cast<int32_t>(id));
          ++checked;
        }
        const int32_t token = sampler.sample(masked);
        if (token == im_end) break;
        ASSERT_TRUE(c.advance(token));
        for (char b : tok.token_bytes(token)) ASSERT_TRUE(st.feed(static_cast<uint8_t>(b), tok.is_special(token)));
      }
    }
  EXPECT_GT(checked, 100000);
}

TEST(ToolCallSampling, RefusesTooFewTokensAndStopStrings) {
  const hanpu::Tokenizer tok = hanpu::Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  GenerationOptions o;
  o.tool_calls = tool_grammar(ToolCallFormat::kJsonTags, "noargs", false);
  EXPECT_EQ(o.tool_calls->min_bytes(), 16);  // {}}\n</tool_call>
  o.max_tokens = 15;
  EXPECT_THROW(TokenStream(&tok, {}, o), hanpu::Error);
  o.max_tokens = 16;
  EXPECT_NO_THROW(TokenStream(&tok, {}, o));
  o.stop_strings = {"x"};
  EXPECT_THROW(TokenStream(&tok, {}, o), hanpu::Error);
}

}  // namespace
