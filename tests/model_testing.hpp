// Helpers shared by the model tests against transformers' goldens (tests/golden/qwen35_tiny and
// qwen3next_tiny): the recorded run, logits of a whole sequence, the two checks against the
// recorded logits and greedy tokens, copies of a checkpoint with edited tensors, and the loader's
// error message.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
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
inline Tensor all_logits(const HybridModel& m, std::span<const int32_t> ids, int threads = 1) {
  HybridState st = m.new_state();
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

/// The whole golden sequence prefilled at once, on 1 and 2 threads: logits NMSE <= 1e-8 against
/// transformers' over the sequence and at every position on its own.
inline void expect_logits_match_at_every_position(const HybridModel& m, const Expected& e) {
  const std::vector<int32_t> ids = e.full_sequence();
  const int64_t V = m.config().vocab_size;
  for (int threads : {1, 2}) {
    Tensor got = all_logits(m, ids, threads);
    ASSERT_EQ(got.shape(), e.logits.shape());
    const double err = nmse(got.ptr<float>(), e.logits.ptr<float>(), got.numel());
    EXPECT_LE(err, 1e-8) << "threads " << threads;
    double worst = 0;  // every position on its own, not only on average
    for (size_t t = 0; t < ids.size(); ++t)
      worst = std::max(worst, nmse(got.ptr<float>() + t * V, e.logits.ptr<float>() + t * V, V));
    EXPECT_LE(worst, 1e-8) << "threads " << threads;
    std::printf("threads %d: logits NMSE vs transformers %.3g (worst position %.3g)\n", threads, err, worst);
  }
}

/// Prefill of the golden's prompt, then greedy decode one token at a time: every step's logits
/// within NMSE 1e-8 of transformers' and the same tokens. Returns the state after the last step.
inline HybridState expect_greedy_decode_matches(const HybridModel& m, const Expected& e) {
  const int64_t V = m.config().vocab_size;
  const int64_t T0 = static_cast<int64_t>(e.prompt.size());
  HybridState st = m.new_state();
  Tensor logits = m.forward(st, e.prompt, {.threads = 2});
  Sampler greedy({.temperature = 0});
  std::vector<int32_t> got;
  for (size_t i = 0; i < e.greedy.size(); ++i) {
    // The logits that chose this token are transformers' row T0 - 1 + i.
    EXPECT_LE(nmse(logits.ptr<float>(), e.logits.ptr<float>() + (T0 - 1 + static_cast<int64_t>(i)) * V, V), 1e-8)
        << "step " << i;
    const int32_t next = greedy.sample({logits.ptr<float>(), static_cast<size_t>(V)});
    got.push_back(next);
    const int32_t one[1] = {next};
    logits = m.forward(st, one, {.threads = 1});
  }
  EXPECT_EQ(got, e.greedy);
  return st;
}

/// The message HybridModel::load(dir) fails with, or "(no error)".
inline std::string load_error(const std::string& dir) {
  try {
    HybridModel::load(dir);
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
