// llama.cpp's logits at every prompt position, for comparing hanpu with llama.cpp on the same GGUF
// file and token ids (tools/compare_logits_with_llama_cpp.py drives it; build.sh compiles it against
// a llama.cpp build). Not part of hanpu's build or test suite: it links the peer's libllama.
//
//   llama_logits MODEL.gguf IDS OUT.npy [--threads N] [--step] [--cache-type f16|f32] [--flash-attn auto|on|off]
//                [--override-kv KEY=int:N|KEY=str:S ...]
//
// IDS: comma-separated token ids. OUT.npy: float32 [n_tokens, n_vocab], row i = the logits after
// token i. Default: the whole prompt in one llama_decode (one ubatch: llama.cpp's prefill path);
// --step: one token per llama_decode (its decode path). --cache-type: the K/V cache element type
// (llama.cpp's default is f16; f32 removes that rounding from the comparison). --flash-attn: llama.cpp's
// flash-attention switch (default auto, which the CPU backend turns on). --override-kv: a
// metadata key as llama-cli's option of that name sets it (the driver gives a file without a
// tokenizer `tokenizer.ggml.model=str:no_vocab` and `<arch>.vocab_size`, which llama.cpp then reads).
// Uses only llama.h's public API (llama.cpp include/llama.h of the peer's version).
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama_logits: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<llama_token> parse_ids(const std::string& s) {
  std::vector<llama_token> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || v < 0 || v > 0x7fffffff) die("IDS: '" + tok + "' is not a token id (expected comma-separated non-negative integers)");
    ids.push_back(static_cast<llama_token>(v));
    i = j + 1;
  }
  if (ids.empty()) die("IDS: no token ids");
  return ids;
}

// numpy's .npy v1.0: magic, header length, a Python dict literal padded to 64 bytes, then the data.
void write_npy(const std::string& path, const std::vector<float>& data, size_t rows, size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) die("cannot write '" + path + "'");
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const unsigned short hlen = static_cast<unsigned short>(header.size());
  const unsigned char len_le[2] = {static_cast<unsigned char>(hlen & 0xff), static_cast<unsigned char>(hlen >> 8)};
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(len_le, 1, 2, f) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) die("short write to '" + path + "'");
}

llama_model_kv_override parse_override(const std::string& s) {
  llama_model_kv_override o{};
  const size_t eq = s.find('='), colon = s.find(':', eq == std::string::npos ? 0 : eq);
  if (eq == std::string::npos || colon == std::string::npos || eq == 0 || eq >= sizeof(o.key))
    die("--override-kv: got '" + s + "', expected KEY=int:N or KEY=str:S");
  std::memcpy(o.key, s.data(), eq);
  const std::string type = s.substr(eq + 1, colon - eq - 1), value = s.substr(colon + 1);
  if (type == "int") {
    o.tag = LLAMA_KV_OVERRIDE_TYPE_INT;
    o.val_i64 = std::strtoll(value.c_str(), nullptr, 10);
  } else if (type == "str" && value.size() < sizeof(o.val_str)) {
    o.tag = LLAMA_KV_OVERRIDE_TYPE_STR;
    std::memcpy(o.val_str, value.data(), value.size());
  } else {
    die("--override-kv: got '" + s + "', expected KEY=int:N or KEY=str:S (strings under 128 bytes)");
  }
  return o;
}

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) die("usage: llama_logits MODEL.gguf IDS OUT.npy [--threads N] [--step] [--cache-type f16|f32] [--flash-attn auto|on|off] [--override-kv KEY=TYPE:VALUE] [--verbose]");
  const std::string model_path = argv[1], out_path = argv[3];
  const std::vector<llama_token> ids = parse_ids(argv[2]);
  int threads = 2;
  bool step = false, verbose = false;
  llama_flash_attn_type flash = LLAMA_FLASH_ATTN_TYPE_AUTO;  // llama.cpp's default
  ggml_type cache_type = GGML_TYPE_F16;
  std::vector<llama_model_kv_override> overrides;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--step") step = true;
    else if (a == "--verbose") verbose = true;
    else if (a == "--flash-attn" && i + 1 < argc) {
      const std::string f = argv[++i];
      if (f == "auto") flash = LLAMA_FLASH_ATTN_TYPE_AUTO;
      else if (f == "on") flash = LLAMA_FLASH_ATTN_TYPE_ENABLED;
      else if (f == "off") flash = LLAMA_FLASH_ATTN_TYPE_DISABLED;
      else die("--flash-attn: got '" + f + "', expected auto, on or off");
    }
    else if (a == "--override-kv" && i + 1 < argc) overrides.push_back(parse_override(argv[++i]));
    else if (a == "--cache-type" && i + 1 < argc) {
      const std::string t = argv[++i];
      if (t == "f16") cache_type = GGML_TYPE_F16;
      else if (t == "f32") cache_type = GGML_TYPE_F32;
      else die("--cache-type: got '" + t + "', expected f16 or f32");
    } else die("unknown argument '" + a + "'");
  }
  if (threads < 1) die("--threads: expected >= 1");
  if (!verbose) llama_log_set(quiet_log, nullptr);

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  if (!overrides.empty()) {
    overrides.push_back(llama_model_kv_override{});  // the list ends at an empty key
    mp.kv_overrides = overrides.data();
  }
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) die("llama.cpp could not load '" + model_path + "' (its messages are above)");
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  if (n_vocab <= 0) die("'" + model_path + "': llama.cpp reports a vocabulary of " + std::to_string(n_vocab));
  for (llama_token t : ids)
    if (t >= n_vocab) die("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab) + ")");

  const uint32_t n = static_cast<uint32_t>(ids.size());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n < 256 ? 256 : n;
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;  // the whole prompt in one ubatch (one graph), as hanpu's single forward
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = cache_type;
  cp.flash_attn_type = flash;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("llama.cpp could not create a context for '" + model_path + "'");

  std::vector<float> logits(static_cast<size_t>(n) * n_vocab);
  const uint32_t chunk = step ? 1 : n;
  llama_batch batch = llama_batch_init(static_cast<int32_t>(chunk), 0, 1);
  for (uint32_t start = 0; start < n; start += chunk) {
    const uint32_t m = std::min(chunk, n - start);
    batch.n_tokens = static_cast<int32_t>(m);
    for (uint32_t i = 0; i < m; ++i) {
      batch.token[i] = ids[start + i];
      batch.pos[i] = static_cast<llama_pos>(start + i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    const int32_t rc = llama_decode(ctx, batch);
    if (rc != 0) die("llama_decode returned " + std::to_string(rc) + " at position " + std::to_string(start));
    for (uint32_t i = 0; i < m; ++i) {
      const float* row = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
      if (!row) die("no logits for position " + std::to_string(start + i));
      std::memcpy(logits.data() + static_cast<size_t>(start + i) * n_vocab, row, sizeof(float) * n_vocab);
    }
  }
  llama_batch_free(batch);
  write_npy(out_path, logits, n, static_cast<size_t>(n_vocab));
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
