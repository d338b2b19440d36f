// libFuzzer target: a GGUF file taken as a model (model/gguf_arch.hpp): its metadata mapped onto a
// config, every tensor of the mapped model loaded (shapes checked, converter transforms undone,
// quantized projections kept in blocks), its tokenizer.ggml.* keys read as a tokenizer and its
// chat template found. Seeds: the tiny models of tests/data/gguf (qwen35, qwen35moe converted by
// llama.cpp; qwen3next, kimi-linear, bailingmoe3 by tools/make_gguf_arch_fixtures.py).
#include "fuzz_common.hpp"
#include "hanpu/chat_template.hpp"
#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = hanpu::fuzz::scratch_path("model.gguf");
  hanpu::fuzz::write_scratch(path, data, size);
  try {
    const hanpu::HybridModel m = hanpu::HybridModel::load(path);
    // Bounded: a fuzzed config may ask for a large model; only small ones are run.
    if (m.config().vocab_size <= 4096 && m.config().hidden_size <= 512 && m.config().num_layers <= 8) {
      hanpu::HybridState st = m.new_state();
      const int32_t ids[2] = {0, 1 % static_cast<int32_t>(m.config().vocab_size)};
      (void)m.forward(st, ids);
    }
  } catch (const hanpu::Error&) {
  }
  try {
    const hanpu::Tokenizer t = hanpu::Tokenizer::from_gguf(path);
    (void)t.decode(t.encode("Hello, world <|im_end|> 123"));
  } catch (const hanpu::Error&) {
  }
  try {
    std::string origin;
    (void)hanpu::find_chat_template(path, false, &origin);
  } catch (const hanpu::Error&) {
  }
  return 0;
}
