// Helpers shared by the model tests against transformers' goldens (tests/golden/qwen35_tiny and
// qwen3next_tiny): the recorded run, logits of a whole sequence, copies of a checkpoint with edited
// tensors, and the loader's error message.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hanpu/model.hpp"
#include "io/safetensors.hpp"

namespace hanpu::testing {

/// What the golden script recorded with transformers: a prompt, its greedy continuation, the
/// logits of both at every position, and (when the golden has them) a text prompt's ids and
/// continuation.
struct Expected {
  std::vector<int32_t> prompt, greedy, text_prompt, text_greedy;
  Tensor logits;  // [prompt + greedy, V]

  std::vector<int32_t> full_sequence() const {
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), greedy.begin(), greedy.end());
    return ids;
  }
};

inline std::vector<int32_t> ids_of(const Tensor& t) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<int32_t>(t.get(i)));
  return out;
}

/// The golden's expected.safetensors in `checkpoint_dir`.
inline Expected load_expected(const std::filesystem::path& checkpoint_dir) {
  SafetensorsFile f = SafetensorsFile::open((checkpoint_dir / "expected.safetensors").string());
  Expected e;
  e.prompt = ids_of(f.load_copy("prompt_ids"));
  e.greedy = ids_of(f.load_copy("greedy_ids"));
  if (f.has("text_prompt_ids")) e.text_prompt = ids_of(f.load_copy("text_prompt_ids"));
  if (f.has("text_greedy_ids")) e.text_greedy = ids_of(f.load_copy("text_greedy_ids"));
  e.logits = f.load_copy("logits");
  return e;
}

/// Logits at every position of `ids`, prefilled from a fresh state.
inline Tensor all_logits(const Qwen35Model& m, std::span<const int32_t> ids, int threads = 1) {
  Qwen35State st = m.new_state();
  return m.forward(st, ids, {.threads = threads, .all_logits = true});
}

/// Normalized MSE of n floats of `got` against `want`.
inline double nmse(const float* got, const float* want, int64_t n) {
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    err += d * d;
    ref += static_cast<double>(want[i]) * want[i];
  }
  return err / ref;
}

/// The message Qwen35Model::load(dir) fails with, or "(no error)".
inline std::string load_error(const std::string& dir) {
  try {
    Qwen35Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// Copies the checkpoint in `src` (without the golden's expected.safetensors) to `dst`; `edit` may
/// change any shard's tensor map before it is written.
using TensorMap = std::map<std::string, Tensor>;
inline void copy_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst,
                            const std::function<void(const std::string& shard, TensorMap&)>& edit = {}) {
  namespace fs = std::filesystem;
  fs::create_directories(dst);
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string name = entry.path().filename().string();
    if (name == "expected.safetensors") continue;
    if (entry.path().extension() != ".safetensors" || !edit) {
      fs::copy_file(entry.path(), dst / name, fs::copy_options::overwrite_existing);
      continue;
    }
    SafetensorsFile f = SafetensorsFile::open(entry.path().string());
    TensorMap m;
    for (const std::string& n : f.names()) m.emplace(n, f.load_copy(n));
    edit(name, m);
    std::vector<std::pair<std::string, TensorView>> out;
    for (auto& [n, t] : m) out.emplace_back(n, t.view());
    write_safetensors((dst / name).string(), out);
  }
}

}  // namespace hanpu::testing
