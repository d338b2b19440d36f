// The softmax attention core of a prefill (model::causal_attention) on the shapes of the hybrid
// models' attention layers, next to the FMA peak measured in the same run: Qwen3.5-0.8B's gated
// GQA (8 query / 2 KV heads of 256), the h2304 share configs' (16 / 4 of 256), and Kimi Linear's
// expanded MLA (32 / 32 heads, keys of nope + rope = 192, values of 128). FLOPs: the causal
// triangle's, 2 · query heads · pairs · (key dims + value dims).
// Medians of `reps` calls after one warm-up. HANPU_ISA caps the SIMD target (docs/PERFORMANCE.md).
//   attention_core [threads] [reps] [T ...]     (defaults 2, 5, 512 2048 8192)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/isa.hpp"
#include "device/host.hpp"
#include "hanpu/engine.hpp"
#include "model/qwen35_ops.hpp"

namespace {

using namespace hanpu;

struct Shape {
  const char* name;
  int64_t nq, nkv, hd, value_dims;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
    if (threads < 1 || reps < 1) throw Error("usage: attention_core [threads >= 1] [reps >= 1] [T ...]");
    std::vector<int64_t> lengths;
    for (int i = 3; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
    if (lengths.empty()) lengths = {512, 2048, 8192};
    for (int64_t T : lengths)
      if (T < 1) throw Error("T: got " + std::to_string(T) + ", expected a positive length");
    const HostInfo info = detect_host();
    const HostMeasurement m = measure_host(threads, 0.5);
    std::printf("attention core: %s, SIMD %s (HANPU_ISA %s), %d threads; f32 FMA peak %.0f GFLOP/s (measured now)\n",
                info.cpu_model.c_str(), cpu::isa_selection().target.c_str(),
                cpu::isa_selection().requested.empty() ? "unset" : cpu::isa_selection().requested.c_str(), threads,
                m.fma_peak_gflops_all);
    std::printf("%-22s %6s %10s %9s %7s\n", "shape", "T", "ms", "GFLOP/s", "%peak");
    const Shape shapes[] = {{"qwen3.5-0.8b GQA 8/2x256", 8, 2, 256, 256},
                            {"h2304 GQA 16/4x256", 16, 4, 256, 256},
                            {"kimi MLA 32/32x192", 32, 32, 192, 128}};
    const cpu::Threads th{&Engine::default_engine(), threads};
    for (const Shape& s : shapes)
      for (int64_t T : lengths) {
        std::vector<float> q(static_cast<size_t>(T * s.nq * s.hd)), k(static_cast<size_t>(T * s.nkv * s.hd)),
            v(static_cast<size_t>(T * s.nkv * s.value_dims)), out(static_cast<size_t>(T * s.nq * s.value_dims));
        uint64_t x = 12345;
        for (auto* vec : {&q, &k, &v})
          for (float& f : *vec) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            f = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
          }
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
        std::vector<double> ms;
        for (int r = 0; r <= reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          model::causal_attention(q.data(), k.data(), v.data(), out.data(), T, 0, s.nq, s.nkv, s.hd, s.value_dims,
                                  s.nkv * s.value_dims, scale, th);
          const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (r > 0) ms.push_back(took);  // the first call pays the workspace's first touch
        }
        std::sort(ms.begin(), ms.end());
        const double median = ms[ms.size() / 2];
        const double pairs = static_cast<double>(T) * static_cast<double>(T + 1) / 2;
        const double gflops = 2.0 * static_cast<double>(s.nq) * pairs * static_cast<double>(s.hd + s.value_dims) / median / 1e6;
        std::printf("%-22s %6lld %10.2f %9.1f %6.1f%%\n", s.name, static_cast<long long>(T), median, gflops,
                    100.0 * gflops / m.fma_peak_gflops_all);
      }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_core: %s\n", e.what());
    return 1;
  }
}
