// libFuzzer target: a whole GGUF file (header, metadata, tensor infos, data) read by
// GgufFile::open, then every tensor hanpu can dequantize decoded (bounded in size).
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "fuzz_common.hpp"
#include "io/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = hanpu::fuzz::scratch_path("model.gguf");
  hanpu::fuzz::write_scratch(path, data, size);
  try {
    const hanpu::GgufFile f = hanpu::GgufFile::open(path);
    std::vector<float> out;
    for (const hanpu::GgufTensorInfo& t : f.tensors()) {
      if (!hanpu::gguf::block_format(t.type).dequantize || t.numel() > (1 << 16)) continue;
      out.resize(static_cast<size_t>(t.numel()));
      hanpu::gguf::dequantize(t.type, t.data, out.data(), t.numel());
    }
  } catch (const hanpu::Error&) {
  }
  return 0;
}
