// Test tool for tests/python/test_gguf_blocks.py: runs hanpu's GGML block (de)quantizers on raw
// byte files so that the pytest can compare them with gguf-py's numpy reference.
//
//   gguf_blocks_tool formats                      one line per registry row: code name elems bytes dequantize
//   gguf_blocks_tool dequantize TYPE IN OUT       IN: whole blocks of TYPE; OUT: float32 values
//   gguf_blocks_tool quantize TYPE IN OUT         IN: float32 values; OUT: blocks of TYPE (Q8_0, Q4_K, Q6_K, F16, BF16)
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "hanpu/gguf_format.hpp"
#include "hanpu/tensor.hpp"

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw hanpu::Error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) throw hanpu::Error("cannot write " + path);
}

const hanpu::gguf::BlockFormat& by_name(const std::string& name) {
  for (const auto& f : hanpu::gguf::block_formats())
    if (name == f.name) return f;
  throw hanpu::Error("no GGML type named " + name);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "formats" && argc == 2) {
      for (const auto& f : hanpu::gguf::block_formats())
        std::printf("%u %s %u %u %d\n", static_cast<unsigned>(f.type), f.name, f.block_elems, f.block_bytes,
                    f.dequantize ? 1 : 0);
      return 0;
    }
    if ((cmd == "dequantize" || cmd == "quantize") && argc == 5) {
      const auto& f = by_name(argv[2]);
      const std::vector<char> in = read_all(argv[3]);
      if (cmd == "dequantize") {
        if (in.size() % f.block_bytes) throw hanpu::Error("input is not a whole number of blocks");
        const int64_t n = static_cast<int64_t>(in.size() / f.block_bytes) * f.block_elems;
        std::vector<float> out(static_cast<size_t>(n));
        hanpu::gguf::dequantize(f.type, in.data(), out.data(), n);
        write_all(argv[4], out.data(), out.size() * 4);
      } else {
        const int64_t n = static_cast<int64_t>(in.size() / 4);
        std::vector<char> out(static_cast<size_t>(n / f.block_elems * f.block_bytes));
        hanpu::gguf::quantize(f.type, reinterpret_cast<const float*>(in.data()), out.data(), n);
        write_all(argv[4], out.data(), out.size());
      }
      return 0;
    }
    std::fprintf(stderr, "usage: gguf_blocks_tool formats | dequantize TYPE IN OUT | quantize TYPE IN OUT\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_blocks_tool: %s\n", e.what());
    return 1;
  }
}
