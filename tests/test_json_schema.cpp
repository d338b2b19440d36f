// response_format json_schema (issue 35 item 5): the schema compiler's refusals, the byte
// automaton on hand-written documents for every supported keyword, and constrained sampling from
// random logits whose output must parse and validate (checked by a small validator of the
// supported subset written here from the JSON Schema 2020-12 validation spec, independent of the
// automaton) at every seed and budget tried. The Python serve tests check the same with PyPI's
// jsonschema through the server.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "hanpu/generator.hpp"
#include "hanpu/tokenizer.hpp"
#include "model/json_constraint_schema.hpp"
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

}  // namespace
