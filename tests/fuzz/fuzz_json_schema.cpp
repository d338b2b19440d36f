// libFuzzer target: a JSON Schema from the network (response_format json_schema) through the
// schema compiler (src/model/json_constraint_schema.cpp), then the compiled automaton over a
// document: the input is "schema\0document". SchemaError (a hanpu::Error) and invalid JSON are the
// expected answers to bad input. Checked: every state's shortest completion is finite once the
// schema compiled, and a document the automaton says is done parses as JSON.
#include <cstring>
#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "model/json_constraint_schema.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* split = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t schema_size = split ? static_cast<size_t>(split - data) : size;
  const auto schema = nlohmann::ordered_json::parse(hanpu::fuzz::as_text(data, schema_size), nullptr, false);
  if (schema.is_discarded()) return 0;
  std::shared_ptr<const hanpu::JsonSchema> compiled;
  try {
    compiled = hanpu::JsonSchema::compile(schema);
  } catch (const hanpu::Error&) {
    return 0;
  }
  hanpu::SchemaState state(*compiled);
  if (state.closing_cost() != compiled->min_bytes()) std::abort();
  std::string doc;
  for (size_t i = schema_size + 1; split && i < size; ++i) {
    if (!state.feed(data[i])) return 0;
    doc.push_back(static_cast<char>(data[i]));
    if (state.closing_cost() > compiled->min_bytes() + (int64_t{1} << 20) && state.closing_cost() < (int64_t{1} << 40))
      std::abort();  // a finite completion is never that long for inputs this size
    if (state.done()) {
      if (nlohmann::ordered_json::parse(doc, nullptr, false).is_discarded()) std::abort();
      return 0;
    }
  }
  return 0;
}
