// libFuzzer target: Hugging Face config.json of every supported family (Qwen3.5, Qwen3.5-MoE,
// Qwen3-Next, Kimi Linear, Ling 3.0) through parse_model_config.
#include "fuzz_common.hpp"
#include "hanpu/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const hanpu::ModelConfig c = hanpu::parse_model_config(std::string(hanpu::fuzz::as_text(data, size)), "config.json");
    (void)c.describe();
    (void)c.parameter_count();
  } catch (const hanpu::Error&) {
  }
  return 0;
}
