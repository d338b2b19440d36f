// libFuzzer target: Hugging Face config.json (Qwen3.5 / Qwen3-Next) through parse_qwen35_config.
#include "fuzz_common.hpp"
#include "hanpu/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const hanpu::Qwen35Config c = hanpu::parse_qwen35_config(std::string(hanpu::fuzz::as_text(data, size)), "config.json");
    (void)c.describe();
    (void)c.parameter_count();
  } catch (const hanpu::Error&) {
  }
  return 0;
}
