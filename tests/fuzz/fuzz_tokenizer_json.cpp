// libFuzzer target: the input as a tokenizer.json through Tokenizer::from_file, and as a
// tiktoken.model through Tokenizer::from_tiktoken (with an empty added_tokens_decoder); a
// tokenizer that loads encodes and decodes a fixed multilingual text with special tokens.
#include "fuzz_common.hpp"
#include "hanpu/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = hanpu::fuzz::scratch_path("tokenizer.json");
  hanpu::fuzz::write_scratch(path, data, size);
  try {
    const hanpu::Tokenizer t = hanpu::Tokenizer::from_file(path);
    const std::vector<int32_t> ids = t.encode("Hello, world! Grüße 你好 <|im_start|>user\n  x = 1\n", true);
    (void)t.decode(ids);
  } catch (const hanpu::Error&) {
  }
  const std::string& model = hanpu::fuzz::scratch_path("tiktoken.model");
  const std::string& config = hanpu::fuzz::scratch_path("tokenizer_config.json");
  static const bool config_written = [&] {
    const std::string text = R"({"added_tokens_decoder": {}})";
    hanpu::fuzz::write_scratch(config, reinterpret_cast<const uint8_t*>(text.data()), text.size());
    return true;
  }();
  (void)config_written;
  hanpu::fuzz::write_scratch(model, data, size);
  try {
    const hanpu::Tokenizer t = hanpu::Tokenizer::from_tiktoken(model, config);
    const std::vector<int32_t> ids = t.encode("Hello, world! Grüße 你好、世界 <|reserved_token_300|>\n  x = 1\n", true);
    (void)t.decode(ids);
  } catch (const hanpu::Error&) {
  }
  return 0;
}
