// Accuracy of int8 weights against the bf16 model on a synthetic preset (random bf16 weights of
// the real shapes; docs/LINEAR.md, docs/MODEL.md): a random 128-token prompt, then 32 decode
// steps, once with f32 activations (--precision exact) and once with int8 decode activations
// (--precision int8, where the CPU has AVX512-VNNI). Per mode: the logits' NMSE against the bf16
// model with both fed the bf16 model's greedy tokens (mean and worst step), how often their argmax
// agrees, and how long the int8 model's own greedy sequence stays equal to the bf16 model's.
//   int8_accuracy [preset] [group]     (defaults qwen3.5-0.8b, 64)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compare.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/model.hpp"

namespace {

using namespace hanpu;
using bench::nmse;


int32_t argmax(const Tensor& logits, int64_t n) {
  const float* a = logits.ptr<float>();
  return static_cast<int32_t>(std::max_element(a, a + n) - a);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string preset = argc > 1 ? argv[1] : "qwen3.5-0.8b";
    const int64_t group = argc > 2 ? std::atoll(argv[2]) : 64;
    if (group < 1) throw Error("group: got " + std::string(argv[2]) + ", expected a positive integer");
    const ModelConfig c = model_preset(preset);
    const int64_t V = c.vocab_size;
    constexpr int kThreads = 2, kSteps = 32;
    const HybridModel ref = HybridModel::synthetic(c, 1, kThreads);
    const HybridModel q = HybridModel::synthetic(c, 1, kThreads, {.format = "int8", .int8_group = group});
    std::vector<int32_t> prompt(128);
    uint64_t s = 7;
    for (int32_t& id : prompt) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      id = static_cast<int32_t>(s % static_cast<uint64_t>(V));
    }
    std::printf("%s, int8 weights (group %lld) against the bf16 model, %d decode steps after 128 prompt tokens\n",
                preset.c_str(), static_cast<long long>(group), kSteps);
    for (LinearPrecision p : {LinearPrecision::kExact, LinearPrecision::kInt8}) {
      HybridState sr = ref.new_state(), sq = q.new_state(), sg = q.new_state();
      int32_t next_ref = argmax(ref.forward(sr, prompt, {.threads = kThreads}), V);
      q.forward(sq, prompt, {.threads = kThreads, .precision = p});
      int32_t next_own = argmax(q.forward(sg, prompt, {.threads = kThreads, .precision = p}), V);
      double worst = 0, sum = 0;
      int agree = 0, same_prefix = 0;
      bool diverged = false;
      for (int i = 0; i < kSteps; ++i) {
        const int32_t fed[1] = {next_ref};  // both models fed the bf16 model's greedy token
        const Tensor a = ref.forward(sr, fed, {.threads = kThreads});
        const Tensor b = q.forward(sq, fed, {.threads = kThreads, .precision = p});
        const double e = nmse(b.ptr<float>(), a.ptr<float>(), static_cast<size_t>(V));
        worst = std::max(worst, e);
        sum += e;
        agree += argmax(b, V) == argmax(a, V);
        diverged = diverged || next_own != next_ref;
        same_prefix += diverged ? 0 : 1;
        const int32_t own[1] = {next_own};  // the int8 model's own greedy sequence
        next_own = argmax(q.forward(sg, own, {.threads = kThreads, .precision = p}), V);
        next_ref = argmax(a, V);
      }
      const bool int8_ran = p == LinearPrecision::kInt8 && Int8Linear::int8_activations_available(1);
      std::printf("  decode activations %-5s%s: logits NMSE mean %.3g, worst %.3g; argmax agrees %d/%d; greedy "
                  "sequence equal for %d/%d tokens\n",
                  linear_precision_name(p), p == LinearPrecision::kInt8 && !int8_ran ? " (no VNNI: ran exact)" : "",
                  sum / kSteps, worst, agree, kSteps, same_prefix, kSteps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "int8_accuracy: %s\n", e.what());
    return 1;
  }
  return 0;
}
