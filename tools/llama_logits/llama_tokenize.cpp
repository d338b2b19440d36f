// llama.cpp's token ids for texts, for comparing hanpu's GGUF tokenizer with llama.cpp's on the same
// file (tools/compare_tokenizer_with_llama_cpp.py drives it; build.sh compiles it next to
// llama_logits). Not part of hanpu's build or test suite: it links the peer's libllama.
//
//   llama_tokenize MODEL.gguf TEXTS OUT
//
// TEXTS: a file of texts, each as its UTF-8 bytes in lowercase hex on one line (so any bytes and
// newlines survive). OUT: one line per text, "<ids with special tokens parsed>;<ids with them read
// as text>", each comma-separated. The model is loaded vocabulary only; no BOS/EOS is added.
// Uses only llama.h's public API (llama.cpp include/llama.h of the peer's version).
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama_tokenize: %s\n", msg.c_str());
  std::exit(1);
}

std::string from_hex(const std::string& hex, size_t line) {
  if (hex.size() % 2) die("TEXTS line " + std::to_string(line) + ": odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    char* end = nullptr;
    const std::string pair = hex.substr(i, 2);
    const long v = std::strtol(pair.c_str(), &end, 16);
    if (*end != '\0') die("TEXTS line " + std::to_string(line) + ": '" + pair + "' is not hex");
    out.push_back(static_cast<char>(v));
  }
  return out;
}

std::string ids_of(const llama_vocab* vocab, const std::string& text, bool parse_special) {
  std::vector<llama_token> ids(text.size() + 16);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                             static_cast<int32_t>(ids.size()), false, parse_special);
  if (n < 0) {
    ids.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                       static_cast<int32_t>(ids.size()), false, parse_special);
  }
  if (n < 0) die("llama_tokenize failed");
  std::string out;
  for (int32_t i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(ids[static_cast<size_t>(i)]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) die("usage: llama_tokenize MODEL.gguf TEXTS OUT");
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) die(std::string("cannot load '") + argv[1] + "'");
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream in(argv[2]);
  if (!in) die(std::string("cannot read '") + argv[2] + "'");
  std::ofstream out(argv[3]);
  if (!out) die(std::string("cannot write '") + argv[3] + "'");
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    const std::string text = from_hex(line, ++n);
    out << ids_of(vocab, text, true) << ";" << ids_of(vocab, text, false) << "\n";
  }
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
