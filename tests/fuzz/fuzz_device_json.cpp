// libFuzzer target: device files (devices/*.json schema) through the project's JSON layer and the
// strict device reader; a valid device is written back and read again (must round-trip).
#include <cstdlib>

#include "fuzz_common.hpp"
#include "hanpu/device.hpp"
#include "io/json_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const hanpu::Device d = hanpu::device_from_json(hanpu::parse_json(hanpu::fuzz::as_text(data, size), "device.json"), "device.json");
    const nlohmann::json back = hanpu::device_to_json(d);
    const hanpu::Device again = hanpu::device_from_json(back, "device.json (written back)");
    if (hanpu::device_to_json(again) != back) std::abort();  // the writer and the reader disagree
  } catch (const hanpu::Error&) {
  }
  return 0;
}
