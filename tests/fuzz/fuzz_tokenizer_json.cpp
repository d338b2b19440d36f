// libFuzzer target: tokenizer.json through Tokenizer::from_file; a tokenizer that loads encodes and
// decodes a fixed multilingual text with special tokens.
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
  return 0;
}
