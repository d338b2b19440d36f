// benchmarks/json_schema_mask.cpp: the cost per generated token of constrained JSON output
// (response_format json_object and json_schema; src/model/json_constraint*.cpp) and of a
// constrained tool call (tool_choice "required", in the JSON-in-<tool_call> and Qwen3.5's XML
// formats; json_constraint_tools.cpp) next to unconstrained sampling, over a real vocabulary
// (docs/SERVE.md, "Structured output" and "Tool calls").
//
//   json_schema_mask TOKENIZER [STEPS]   TOKENIZER: a checkpoint directory, tokenizer.json or .gguf
//
// Each mode samples STEPS tokens (documents of at most 96 tokens, restarted when one closes)
// from random logits (normal, sigma 3, fixed seed) with the steps TokenStream::push takes (mask,
// sample, advance; tool calls: replies of at most 200 tokens, one call each); modes are interleaved round by round and the median and 90th percentile of
// the per-token times are printed. The first constraint's construction (the vocabulary's byte trie,
// built once per tokenizer) is timed on its own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "hanpu/generator.hpp"
#include "hanpu/tokenizer.hpp"
#include "model/json_constraint.hpp"
#include "model/json_constraint_schema.hpp"
#include "model/json_constraint_tools.hpp"

namespace {

using Clock = std::chrono::steady_clock;

hanpu::Tokenizer load(const std::string& src) {
  if (src.size() > 5 && src.substr(src.size() - 5) == ".gguf") return hanpu::Tokenizer::from_gguf(src);
  if (src.size() > 5 && src.substr(src.size() - 5) == ".json") return hanpu::Tokenizer::from_file(src);
  return hanpu::Tokenizer::from_dir(src);
}

// A schema with strings, numbers, an enum, an array of objects and an optional nullable field:
// the states a tool-argument or extraction schema goes through.
const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"role":{"enum":["admin","user","guest"]},
  "tags":{"type":"array","items":{"type":"string"},"maxItems":4},
  "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},"required":["city","zip"]},
  "note":{"anyOf":[{"type":"string"},{"type":"null"}]}},
  "required":["name","age","role","tags","address","note"],"additionalProperties":false})";

// tool_choice "required" over three tools, the first with kSchema as its parameters.
std::shared_ptr<const hanpu::ToolCallGrammar> tool_grammar(hanpu::ToolCallFormat format) {
  hanpu::ToolCallGrammar::Options o;
  o.format = format;
  o.tools = {{"lookup_person", nlohmann::ordered_json::parse(kSchema)},
             {"get_weather", nlohmann::ordered_json::parse(R"({"type":"object","properties":{"city":{"type":"string"},
                 "days":{"type":"integer"}},"required":["city"]})")},
             {"list_files", nullptr}};
  return hanpu::ToolCallGrammar::compile(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: json_schema_mask TOKENIZER [STEPS]\n");
    return 2;
  }
  const hanpu::Tokenizer tok = load(argv[1]);
  const int steps = argc > 2 ? std::stoi(argv[2]) : 200;
  const size_t V = static_cast<size_t>(tok.vocab_size());
  const auto schema = hanpu::JsonSchema::compile(nlohmann::ordered_json::parse(kSchema));
  {
    hanpu::GenerationOptions o;
    o.max_tokens = 96;
    o.json_schema = schema;
    const auto t0 = Clock::now();
    hanpu::TokenStream s(&tok, {}, o);  // builds and caches the trie
    std::printf("vocabulary %zu tokens; first json_schema stream (byte trie built once per tokenizer): %.1f ms\n", V,
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  // Per token: the mask alone (copying the row included) and the whole step (mask, sampling,
  // advancing the state) -- unconstrained, the step is the sampling alone.
  const auto tools_json = tool_grammar(hanpu::ToolCallFormat::kJsonTags);
  const auto tools_xml = tool_grammar(hanpu::ToolCallFormat::kXmlTags);
  const char* names[] = {"unconstrained", "json_object", "json_schema", "tool_call_json", "tool_call_xml"};
  constexpr int kModes = 5;
  std::vector<double> mask_ms[kModes], step_ms[kModes];
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(V), row(V);
  const int rounds = 4;
  for (int round = 0; round < rounds; ++round)
    for (int mode = 0; mode < kModes; ++mode) {
      int done = 0;
      uint64_t seed = static_cast<uint64_t>(round) * 1000;
      while (done < steps / rounds) {
        hanpu::Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed++});
        std::unique_ptr<hanpu::JsonConstraint> object;
        std::unique_ptr<hanpu::SchemaConstraint> constrained;
        std::unique_ptr<hanpu::ToolCallConstraint> call;
        if (mode == 1) object = std::make_unique<hanpu::JsonConstraint>(tok);
        if (mode == 2) constrained = std::make_unique<hanpu::SchemaConstraint>(tok, schema);
        if (mode >= 3) call = std::make_unique<hanpu::ToolCallConstraint>(tok, mode == 3 ? tools_json : tools_xml,
                                                                            std::vector<int32_t>{});
        const int64_t max_tokens = call ? 200 : 96;  // room for the largest tool's arguments
        for (int64_t i = 0; i < max_tokens && done < steps / rounds; ++i, ++done) {
          for (float& x : logits) x = normal(rng);
          const auto t0 = Clock::now();
          row = logits;
          if (object) object->mask(row, max_tokens - i);
          if (constrained) constrained->mask(row, max_tokens - i);
          if (call) call->mask(row, max_tokens - i);
          const auto t1 = Clock::now();
          const int32_t token = sampler.sample(row);
          if (object && !object->advance(token)) return 1;
          if (constrained && !constrained->advance(token)) return 1;
          if (call && !call->advance(token)) return 1;
          const auto t2 = Clock::now();
          mask_ms[mode].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          step_ms[mode].push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
          if ((object && object->done()) || (constrained && constrained->done()) || (call && call->done())) break;
        }
      }
    }
  for (int mode = 0; mode < kModes; ++mode) {
    for (auto* v : {&mask_ms[mode], &step_ms[mode]}) std::sort(v->begin(), v->end());
    const auto& m = mask_ms[mode];
    const auto& t = step_ms[mode];
    std::printf("%-14s mask (with the row copy): median %.3f ms, p90 %.3f ms; whole step: median %.3f ms, p90 %.3f ms "
                "(%zu tokens)\n", names[mode], m[m.size() / 2], m[m.size() * 9 / 10], t[t.size() / 2],
                t[t.size() * 9 / 10], t.size());
  }
  return 0;
}
