// The softmax attention core of a prefill (model::causal_attention) on the shapes of the hybrid
// models' attention layers, next to the FMA peak measured in the same run: Qwen3.5-0.8B's gated
// GQA (8 query / 2 KV heads of 256), the h2304 share configs' (16 / 4 of 256), and Kimi Linear's
// expanded MLA (32 / 32 heads, keys of nope + rope = 192, values of 128). FLOPs: the causal
// triangle's, 2 · query heads · pairs · (key dims + value dims).
// Medians of `reps` calls after one warm-up. HANPU_ISA caps the SIMD target (docs/PERFORMANCE.md).
//   attention_core [threads] [reps] [T ...]     (defaults 2, 5, 512 2048 8192)
// With `decode` before the lengths: one new token over a cache of T keys (the decode step's
// attention_over_cache), the cache evicted from every cache level before each call as a decode
// step's weight stream evicts it; GB/s of cache read next to the read bandwidth measured now.
//   attention_core [threads] [reps] decode [T ...]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "hanpu/isa.hpp"
#include "cpu/host.hpp"
#include "hanpu/engine.hpp"
#include "model/layer_ops.hpp"

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
    const bool decode = argc > 3 && std::string(argv[3]) == "decode";
    for (int i = decode ? 4 : 3; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
    if (lengths.empty()) lengths = {512, 2048, 8192};
    for (int64_t T : lengths)
      if (T < 1) throw Error("T: got " + std::to_string(T) + ", expected a positive length");
    const HostInfo info = detect_host();
    const HostMeasurement m = measure_host(threads, 0.5);
    std::printf("attention core: %s, SIMD %s (HANPU_ISA %s), %d threads; f32 FMA peak %.0f GFLOP/s (measured now)\n",
                info.cpu_model.c_str(), isa_selection().target.c_str(),
                isa_selection().requested.empty() ? "unset" : isa_selection().requested.c_str(), threads,
                m.fma_peak_gflops_all);
    if (decode)
      std::printf("decode: one token over a cache of T keys; read bandwidth %.1f GB/s (measured now)\n%-26s %6s %10s %9s %7s\n",
                  m.mem_bandwidth_gbs, "shape", "T", "ms", "GB/s", "%bw");
    else
      std::printf("%-22s %6s %10s %9s %7s\n", "shape", "T", "ms", "GFLOP/s", "%peak");
    // Decode: a buffer twice the last-level cache, read by all threads through the engine's pool
    // before each call, evicts the cache as a decode step's projections do (and leaves the pool's
    // workers awake, as the projection before the attention does).
    const EngineThreads th{&Engine::default_engine(), threads};
    const int64_t llc = info.data_cache(3) ? info.data_cache(3)->size_bytes : 0;
    std::vector<float> evict(decode ? static_cast<size_t>(2 * std::max<int64_t>(llc, 64 << 20)) / sizeof(float) : 0, 1.0f);
    std::atomic<float> evict_sink{0.0f};  // keeps the eviction reads
    const auto evict_caches = [&] {
      model::parallel_for(static_cast<int64_t>(evict.size() / 16), th, [&](int64_t i0, int64_t i1) {
        float sum = 0;
        for (int64_t i = i0; i < i1; ++i) sum += evict[static_cast<size_t>(i) * 16];  // one float per line
        evict_sink.store(sum, std::memory_order_relaxed);
      });
    };
    // Uniform inputs in [-1, 1) from one xorshift stream.
    const auto fill = [](std::initializer_list<std::vector<float>*> vectors) {
      uint64_t x = 12345;
      for (auto* vec : vectors)
        for (float& f : *vec) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          f = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
    };
    const Shape shapes[] = {{"qwen3.5-0.8b GQA 8/2x256", 8, 2, 256, 256},
                            {"h2304 GQA 16/4x256", 16, 4, 256, 256},
                            {"kimi MLA 32/32x192", 32, 32, 192, 128}};
    for (const Shape& s : shapes)
      for (int64_t T : lengths) {
        if (decode) {
          const int64_t keys = T + 1;
          std::vector<float> q(static_cast<size_t>(s.nq * s.hd)), k(static_cast<size_t>(keys * s.nkv * s.hd)),
              v(static_cast<size_t>(keys * s.nkv * s.value_dims)), out(static_cast<size_t>(s.nq * s.value_dims));
          fill({&q, &k, &v});
          std::vector<double> ms;
          for (int r = 0; r <= reps; ++r) {
            evict_caches();
            const auto t0 = std::chrono::steady_clock::now();
            model::causal_attention(q.data(), k.data(), v.data(), out.data(), 1, T, s.nq, s.nkv, s.hd, s.value_dims,
                                    s.nkv * s.value_dims, 1.0f / std::sqrt(static_cast<float>(s.hd)), th);
            const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (r > 0) ms.push_back(took);
          }
          std::sort(ms.begin(), ms.end());
          const double median = ms[ms.size() / 2];
          const double bytes = static_cast<double>(keys) * static_cast<double>(s.nkv * (s.hd + s.value_dims)) * 4;
          std::printf("%-26s %6lld %10.3f %9.1f %6.1f%%\n", s.name, static_cast<long long>(T), median,
                      bytes / median / 1e6, 100.0 * bytes / median / 1e6 / m.mem_bandwidth_gbs);
          continue;
        }
        std::vector<float> q(static_cast<size_t>(T * s.nq * s.hd)), k(static_cast<size_t>(T * s.nkv * s.hd)),
            v(static_cast<size_t>(T * s.nkv * s.value_dims)), out(static_cast<size_t>(T * s.nq * s.value_dims));
        fill({&q, &k, &v});
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
