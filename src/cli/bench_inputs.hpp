// Synthetic linear-attention inputs and the median, shared by `hanpu bench` (cmd_bench.cpp) and
// `hanpu tune` (cmd_tune.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hanpu/la.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu::cli {

struct BenchInputs {
  Tensor q, k, v, g, beta;
  LaInputs views() const {
    LaInputs li{};
    li.q = q.view(), li.k = k.view(), li.v = v.view(), li.g = g.view(), li.beta = beta.view();
    return li;
  }
};

/// FLA-test-like data: q, k [1, T, H, K] L2-normalised rows, v [1, T, HV, V] normal, g =
/// logsigmoid(U[0,1)) ([1, T, HV] for GDN, [1, T, HV, K] for KDA), beta = sigmoid(U[0,1)); a fixed
/// seed, so every run sees the same data.
inline BenchInputs make_bench_inputs(Variant var, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, DType dt,
                                     uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nrm(0.f, 1.f);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  BenchInputs in{Tensor(dt, {1, T, H, K}), Tensor(dt, {1, T, H, K}), Tensor(dt, {1, T, HV, V}),
                 variant_traits(var).channel_gate() ? Tensor(DType::F32, {1, T, HV, K}) : Tensor(DType::F32, {1, T, HV}),
                 Tensor(DType::F32, {1, T, HV})};
  std::vector<float> row(static_cast<size_t>(K));
  for (Tensor* t : {&in.q, &in.k})
    for (int64_t r = 0; r < T * H; ++r) {
      float ss = 0;
      for (float& x : row) ss += (x = nrm(rng)) * x;
      const float inv = 1.f / std::sqrt(ss + 1e-6f);
      for (int64_t d = 0; d < K; ++d) t->set(r * K + d, row[static_cast<size_t>(d)] * inv);
    }
  for (int64_t i = 0; i < in.v.numel(); ++i) in.v.set(i, nrm(rng));
  for (int64_t i = 0; i < in.g.numel(); ++i) in.g.set(i, -std::log1p(std::exp(-uni(rng))));
  for (int64_t i = 0; i < in.beta.numel(); ++i) in.beta.set(i, 1.f / (1.f + std::exp(-uni(rng))));
  return in;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace hanpu::cli
