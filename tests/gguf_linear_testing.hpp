// Shared check of the GGUF linear tests (test_linear_gguf.cpp, test_linear_gguf_small_blocks.cpp):
// activations of very different magnitudes, and one output row of the f32-tile prefill against fp64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace hanpu::testing {

// K activations in blocks of 32 of very different magnitudes (1e-6 .. 1e3), every seventh block zero:
// the per-block activation scales of the GGUF kernels meet every range.
inline std::vector<float> gguf_test_activations(int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nrm(0.f, 1.f);
  std::uniform_real_distribution<float> mag(-6.f, 3.f);
  std::vector<float> x(static_cast<size_t>(K));
  for (int64_t b = 0; b < K / 32; ++b) {
    const float s = std::pow(10.f, mag(rng));
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(b * 32 + j)] = b % 7 == 3 ? 0.f : s * nrm(rng);
  }
  return x;
}

// Row m of y (the f32 tiles: the exactly dequantized weights w [N, K] times f32 activations xr, K
// terms in f32) against the fp64 sum, plus y0's value where the call accumulated. The bound is the
// f32 dot product's: (K + 1) roundings of the magnitudes' sum, plus one of the result.
inline void expect_row_within_f32_dot_bound(const std::vector<float>& w, int64_t N, int64_t K, const std::vector<float>& xr,
                                            const float* y_row, const float* y0_row, bool accumulate) {
  for (int64_t n = 0; n < N; ++n) {
    double ref = accumulate ? y0_row[n] : 0.0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double p = static_cast<double>(w[n * K + k]) * xr[k];
      ref += p;
      mag += std::abs(p);
    }
    const double got = y_row[n];
    ASSERT_LE(std::abs(got - ref), (K + 1) * 0x1p-24 * mag + 0x1p-24 * std::abs(got)) << "col " << n;
  }
}

}  // namespace hanpu::testing
