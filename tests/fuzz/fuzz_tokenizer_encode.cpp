// libFuzzer target: the golden byte-level BPE tokenizer (tests/golden/tokenizer) and the golden
// tiktoken tokenizer (tests/data/kimi_tiktoken) encoding arbitrary bytes (with and without
// special tokens) and decoding arbitrary ids. Every id encode returns must be in the vocabulary,
// and decoding it must not fail.
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "fuzz_common.hpp"
#include "hanpu/tokenizer.hpp"

#ifndef HANPU_FUZZ_TOKENIZER
#error "HANPU_FUZZ_TOKENIZER (a tokenizer.json) must be defined by the build"
#endif

namespace {

void check(const hanpu::Tokenizer& tok, const uint8_t* data, size_t size, bool normalizes) {
  const std::string text(hanpu::fuzz::as_text(data, size));
  for (bool special : {true, false}) {
    try {
      const std::vector<int32_t> ids = tok.encode(text, special);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) std::abort();
      const std::string back = tok.decode(ids);
      // ASCII is unchanged by NFC, so ordinary-text encoding must round-trip exactly
      // (include/hanpu/tokenizer.hpp: decode(encode(bytes)) gives them back). The tiktoken
      // tokenizer does not normalize, so any bytes round-trip there.
      bool ascii = true;
      for (unsigned char c : text) ascii = ascii && c < 0x80;
      if (!special && (ascii || !normalizes) && back != text) std::abort();
    } catch (const hanpu::Error&) {
    }
  }
  // The same bytes as token ids (4 bytes each, any value): out-of-range ids must be an Error.
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  try {
    (void)tok.decode(ids);
  } catch (const hanpu::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const hanpu::Tokenizer tok = hanpu::Tokenizer::from_file(HANPU_FUZZ_TOKENIZER);
  // tests/golden/tokenizer/tokenizer.json -> tests/data/kimi_tiktoken
  static const hanpu::Tokenizer kimi = hanpu::Tokenizer::from_dir(
      (std::filesystem::path(HANPU_FUZZ_TOKENIZER).parent_path().parent_path().parent_path() / "data" / "kimi_tiktoken").string());
  check(tok, data, size, /*normalizes=*/true);
  check(kimi, data, size, /*normalizes=*/false);
  return 0;
}
