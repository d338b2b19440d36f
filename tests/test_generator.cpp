// The one generation path (hanpu/generator.hpp): TokenStream's stop rules, and JSON output
// (src/model/json_constraint.cpp): the automaton against documents valid and invalid per RFC 8259,
// and constrained sampling from random logits that always yields a parseable object within
// max_tokens.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hanpu/generator.hpp"
#include "hanpu/model_family.hpp"
#include "hanpu/tokenizer.hpp"
#include "model/json_constraint.hpp"
#include "test_support.hpp"

namespace {

using namespace hanpu;

bool accepts(const std::string& doc) {
  JsonState s;
  for (char c : doc)
    if (!s.feed(static_cast<uint8_t>(c))) return false;
  return s.done();
}

TEST(JsonState, AcceptsCompactObjectsAndRejectsTheRest) {
  for (const char* ok : {"{}", R"({"a":1})", R"({"a":[1,-2.5e+3,0,true,false,null,"x\n\u00e9"],"b":{"c":{}}})",
                         R"({"":[[],[{}]]})", "{\"k\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", R"({"n":0.0E-0})"}) {
    EXPECT_TRUE(accepts(ok)) << ok;
    EXPECT_NO_THROW((void)nlohmann::json::parse(ok)) << ok;
  }
  for (const char* bad : {"[]", "1", "{", R"({"a"})", R"({"a":})", R"({"a":01})", R"({"a":1.})", R"({"a":tru})",
                          R"({"a":1,})", R"({a:1})", R"({"a":"\x"})", "{\"a\":\"\x01\"}", "{\"a\":\"\xc0\xaf\"}",
                          "{\"a\":\"\xed\xa0\x80\"}", R"({} )", R"({ })", R"({"a":1}})", R"({"a":-})", R"({"a":1e100})"}) {
    EXPECT_FALSE(accepts(bad)) << bad;
  }
}

TEST(JsonState, ClosingCostIsTheShortestCompletion) {
  auto cost_after = [](const std::string& prefix) {
    JsonState s;
    for (char c : prefix) EXPECT_TRUE(s.feed(static_cast<uint8_t>(c))) << prefix;
    return s.closing_cost();
  };
  EXPECT_EQ(cost_after(""), 2);             // {}
  EXPECT_EQ(cost_after("{"), 1);            // }
  EXPECT_EQ(cost_after("{\"a"), 4);         // ":0}
  EXPECT_EQ(cost_after("{\"a\":[{\"b\":"), 4);  // 0}]}
  EXPECT_EQ(cost_after("{\"a\":tr"), 3);    // ue}
  EXPECT_EQ(cost_after("{\"a\":\"\xe2"), 4); // two continuation bytes, "}
  EXPECT_EQ(cost_after("{\"a\":1,"), 5);    // "":0}
}

// Random logits, many seeds, budgets down to the minimum: the sampled text always parses as an
// object and ends the generation by itself or exactly at max_tokens with the object closed.
TEST(GeneratorJson, RandomLogitsAlwaysGiveAnObjectWithinMaxTokens) {
  const Tokenizer tok = Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  int ended_by_itself = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    GenerationOptions o;
    o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed};
    o.max_tokens = 2 + static_cast<int64_t>(seed % 40);
    o.json_object = true;
    TokenStream s(&tok, {}, o);
    std::vector<float> logits(V);
    while (!s.finished()) {
      for (float& x : logits) x = normal(rng);
      s.push(logits);
    }
    EXPECT_LE(static_cast<int64_t>(s.tokens().size()), o.max_tokens);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(s.text())) << "seed " << seed << ": " << s.text();
    EXPECT_TRUE(j.is_object()) << s.text();
    ended_by_itself += s.reason() == FinishReason::kStopToken;
  }
  EXPECT_EQ(ended_by_itself, 200) << "the object closes within the budget, which ends the generation";
}

// Each family's registry row supplies the stop tokens (hanpu/model_family.hpp): a tokenizer
// holding every family's end markers gives each family exactly its own row's, after the config's
// eos ids, and a config of no known family only its eos ids.
TEST(FamilyRegistry, StopIdsComeFromEachFamilysRow) {
  std::ifstream in(hanpu::testing::golden_dir() / "qwen35_tiny" / "tokenizer.json");
  nlohmann::ordered_json tj = nlohmann::ordered_json::parse(in);
  int32_t next = Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string()).vocab_size();
  std::set<std::string> all;
  for (const ModelFamily* f : model_families()) all.insert(f->stop_tokens.begin(), f->stop_tokens.end());
  std::set<std::string> have;
  for (const auto& t : tj["added_tokens"]) have.insert(t["content"].get<std::string>());
  for (const std::string& t : all)
    if (!have.count(t))
      tj["added_tokens"].push_back({{"id", next++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                                    {"rstrip", false}, {"normalized", false}, {"special", true}});
  const auto path = std::filesystem::temp_directory_path() / ("hanpu_family_stops_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << tj.dump();
  const Tokenizer tok = Tokenizer::from_file(path.string());
  std::filesystem::remove(path);
  std::set<std::string> seen_rows;
  for (const ModelFamily* f : model_families()) {
    ASSERT_FALSE(f->stop_tokens.empty()) << f->name;
    EXPECT_TRUE(f->chat_template.empty() || f->chat_template == "chatml") << f->name << ": a fallback hanpu has";
    ModelConfig c;
    c.model_type = f->model_types[0];
    c.eos_token_ids = {7};
    std::vector<int32_t> expected = {7};
    for (const std::string& t : f->stop_tokens) expected.push_back(*tok.token_to_id(t));
    EXPECT_EQ(family_stop_ids(c, &tok), expected) << f->name;
    EXPECT_EQ(family_stop_ids(c, nullptr), std::vector<int32_t>{7}) << f->name;
    std::string row;
    for (const std::string& t : f->stop_tokens) row += t + " ";
    seen_rows.insert(row);
  }
  EXPECT_GE(seen_rows.size(), 3u) << "Qwen, Kimi and Ling end turns differently";
  ModelConfig unknown;
  unknown.model_type = "not_a_family";
  unknown.eos_token_ids = {3};
  EXPECT_EQ(family_stop_ids(unknown, &tok), std::vector<int32_t>{3});
  // The golden tokenizer has only Qwen's markers: a Kimi config finds <|im_end|> but no [EOS].
  const Tokenizer tiny = Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  ModelConfig kimi;
  kimi.model_type = "kimi_linear";
  EXPECT_EQ(family_stop_ids(kimi, &tiny), std::vector<int32_t>{*tiny.token_to_id("<|im_end|>")});
}

TEST(GeneratorJson, RefusesWhatItCannotGuarantee) {
  const Tokenizer tok = Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  GenerationOptions o;
  o.json_object = true;
  o.max_tokens = 1;
  EXPECT_THROW(TokenStream(&tok, {}, o), Error);
  o.max_tokens = 10;
  EXPECT_THROW(TokenStream(nullptr, {}, o), Error);
}

TEST(TokenStream, StopsAtStopIdsStopStringsAndLength) {
  const Tokenizer tok = Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  // Greedy over logits that single out one token per step.
  auto run = [&](std::vector<int32_t> script, GenerationOptions o, std::vector<int32_t> stop_ids) {
    o.sampling.temperature = 0;
    TokenStream s(&tok, std::move(stop_ids), o);
    for (int32_t t : script) {
      if (s.finished()) break;
      std::vector<float> logits(V, 0.f);
      logits[static_cast<size_t>(t)] = 1.f;
      s.push(logits);
    }
    return s;
  };
  const std::vector<int32_t> hello = tok.encode("Hello world, hello", false);
  ASSERT_GE(hello.size(), 3u);
  GenerationOptions o;
  o.max_tokens = 100;
  TokenStream a = run(hello, o, {hello[1]});
  EXPECT_EQ(a.reason(), FinishReason::kStopToken);
  EXPECT_EQ(a.tokens(), std::vector<int32_t>{hello[0]});
  o.stop_strings = {"o w"};  // spans tokens unless one token holds it
  TokenStream b = run(hello, o, {});
  EXPECT_EQ(b.reason(), FinishReason::kStopString);
  EXPECT_EQ(b.text(), "Hell");
  EXPECT_EQ(b.stop_string(), "o w");
  o.stop_strings.clear();
  o.max_tokens = 2;
  TokenStream c = run(hello, o, {});
  EXPECT_EQ(c.reason(), FinishReason::kLength);
  EXPECT_EQ(c.tokens().size(), 2u);
}

// The server streams text() in settled pieces, each dumped as JSON with invalid UTF-8 replaced:
// the pieces must concatenate to the whole text's dump. A lead byte that announces more
// continuation bytes than follow it ends where they end (the whole text's decoder rejects it
// there and reads the next byte afresh), not after the announced length: "\xF0AB\xC4\x9C" cut as
// "\xF0AB\xC4" + "\x9C" would give three replacement characters where the whole gives one and
// a "\xC4\x9C".
TEST(TokenStream, SettledPiecesOfInvalidUtf8DumpAsTheWholeText) {
  const Tokenizer tok = Tokenizer::from_dir((hanpu::testing::golden_dir() / "qwen35_tiny").string());
  const size_t V = static_cast<size_t>(tok.vocab_size());
  std::map<std::string, int32_t> single_byte;  // the byte-level vocabulary's one-byte tokens
  for (int32_t id = 0; id < static_cast<int32_t>(V); ++id) {
    const int32_t one[1] = {id};
    const std::string b = tok.decode(one);
    if (b.size() == 1 && !single_byte.count(b)) single_byte[b] = id;
  }
  auto dump = [](const std::string& s) {
    const std::string d = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return d.substr(1, d.size() - 2);
  };
  const std::vector<std::vector<std::string>> cases = {
      {"x", "\xF0", "A", "B", "\xC4", "\x9C", "y"},  // a 4-byte lead cut short by ASCII, then a whole character
      {"\xE0", "\x80", "\x80", "\xE2", "\x82", "\xAC"},  // overlong (invalid throughout), then the euro sign
      {"\xC4", "\xC4", "\x9C", "\x9C", "\xFF", "\xE2", "\x82"},  // stray bytes, a character cut at the end
  };
  for (const auto& bytes : cases) {
    GenerationOptions o;
    o.max_tokens = 100;
    o.sampling.temperature = 0;
    TokenStream s(&tok, {}, o);
    std::string streamed;
    size_t emitted = 0;
    for (const std::string& b : bytes) {
      ASSERT_TRUE(single_byte.count(b)) << "no one-byte token for " << static_cast<int>(static_cast<unsigned char>(b[0]));
      std::vector<float> logits(V, 0.f);
      logits[static_cast<size_t>(single_byte[b])] = 1.f;
      s.push(logits);
      const size_t end = s.settled_text_bytes(emitted);
      streamed += dump(s.text().substr(emitted, end - emitted));
      emitted = end;
    }
    streamed += dump(s.text().substr(emitted));  // the final piece
    EXPECT_EQ(streamed, dump(s.text())) << ::testing::PrintToString(bytes);
  }
}

}  // namespace

// ---- penalties (apply_penalties, hanpu/model.hpp) ----

TEST(Penalties, HandComputedCase) {
  // repetition 2 over {0, 1}: 2 -> 1, -2 -> -4; then the generated tokens [1, 0] once each:
  // minus 0.25 (frequency) and 0.5 (presence).
  std::vector<float> logits = {2.f, -2.f, 1.f, 0.5f};
  const std::vector<int32_t> context = {0, 1, 0};
  SamplingOptions o;
  o.presence_penalty = 0.5f;
  o.frequency_penalty = 0.25f;
  o.repetition_penalty = 2.f;
  apply_penalties(logits, context, 1, o);
  EXPECT_EQ(logits, (std::vector<float>{0.25f, -4.75f, 1.f, 0.5f}));
  // a window of 1 token: only the last (0) is repeated; negative penalties raise repeated tokens
  logits = {2.f, -2.f, 1.f, 0.5f};
  o = SamplingOptions{};
  o.repetition_penalty = 2.f;
  o.repetition_window = 1;
  o.presence_penalty = -1.f;
  apply_penalties(logits, context, 2, o);
  EXPECT_EQ(logits, (std::vector<float>{2.f, -2.f, 1.f, 0.5f}));
}

// The Python reference (python/tests/test_serve_penalties.py) writes random cases to
// $HANPU_PENALTY_CASES and compares this test's output ($HANPU_PENALTY_OUT) with its own formulas;
// without them there is nothing to compare, so ctest does not run it (DISABLED_; the pytest runs it).
TEST(Penalties, DISABLED_CasesFromThePythonReference) {
  const char* in = std::getenv("HANPU_PENALTY_CASES");
  const char* out = std::getenv("HANPU_PENALTY_OUT");
  if (!in || !out) GTEST_FAIL() << "driven by python/tests/test_serve_penalties.py: HANPU_PENALTY_CASES and HANPU_PENALTY_OUT unset";
  const nlohmann::json cases = nlohmann::json::parse(std::ifstream(in));
  nlohmann::json results = nlohmann::json::array();
  for (const nlohmann::json& c : cases) {
    std::vector<float> logits = c["logits"].get<std::vector<float>>();
    const std::vector<int32_t> context = c["context"].get<std::vector<int32_t>>();
    SamplingOptions o;
    o.presence_penalty = c["presence_penalty"].get<float>();
    o.frequency_penalty = c["frequency_penalty"].get<float>();
    o.repetition_penalty = c["repetition_penalty"].get<float>();
    o.repetition_window = c["repetition_window"].get<int64_t>();
    apply_penalties(logits, context, c["generated_from"].get<size_t>(), o);
    results.push_back(logits);
  }
  std::ofstream(out) << results.dump();
}
