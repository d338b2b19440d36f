// libFuzzer target: a whole safetensors file (8-byte length, JSON header, data) read by
// SafetensorsFile::open and ::map, then every tensor loaded.
#include "fuzz_common.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = hanpu::fuzz::scratch_path("model.safetensors");
  hanpu::fuzz::write_scratch(path, data, size);
  for (bool mapped : {false, true}) {
    try {
      const hanpu::SafetensorsFile f = mapped ? hanpu::SafetensorsFile::map(path) : hanpu::SafetensorsFile::open(path);
      for (const std::string& name : f.names()) {
        const hanpu::Tensor t = f.load_copy(name);
        (void)t;
      }
    } catch (const hanpu::Error&) {
    }
  }
  return 0;
}
