// Shared checks of the GGUF linear tests (test_linear_gguf.cpp, test_linear_gguf_small_blocks.cpp):
// activations of very different magnitudes, the integer kernels' two derived bounds, and one output
// row of the f32-tile prefill against fp64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/linear_gguf.hpp"

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

// The integer kernels' (decode GEMV, integer prefill) two bounds for every row of y = w x~, x~ the
// activations x quantized as `type`'s kernels quantize them (test_linear_gguf.cpp's header derives
// them): |y - y_act| <= E_f32 and |y - y_ref| <= E_act + E_f32, with
//   w [N, K]        the exactly dequantized weights,
//   w_scale [N, K]  the weights without their per-32 term (dequantized with dmin / m = 0; = w when
//                   the format has none),
//   per32 [N, K/32] that term per row and block of 32 (Q4_K / Q5_K: dmin * m_j; Q4_1 / Q5_1: m),
//                   or empty.
// Also that some row comes near its bound: a bound far above every error would pass anything.
inline void expect_within_integer_kernel_bounds(hanpu::gguf::GgmlType type, int64_t N, int64_t K,
                                                const std::vector<float>& w, const std::vector<float>& w_scale,
                                                const std::vector<float>& per32, const std::vector<float>& x,
                                                const std::vector<float>& y) {
  hanpu::cpu::GgufActivations xa;
  hanpu::cpu::gguf_quantize_activations(x.data(), K, hanpu::cpu::gguf_activation_block(type), xa);
  const int64_t nsub = K / 32;
  // The quantizer: |x - x~| <= s/2 (one rounding of x * (1/s) adds at most 2^-23 relative).
  std::vector<double> xt(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    const double s = xa.scale[static_cast<size_t>(k / xa.block)];
    xt[static_cast<size_t>(k)] = s * xa.q[static_cast<size_t>(k)];
    ASSERT_LE(std::abs(x[static_cast<size_t>(k)] - xt[static_cast<size_t>(k)]), s * (0.5 + 128 * 0x1p-23)) << k;
  }
  const double u = 0x1p-24;
  int tight = 0;
  for (int64_t n = 0; n < N; ++n) {
    double y_ref = 0, y_act = 0, e_act = 0, t_scale = 0, t_per32 = 0;
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n * K + k);
      const double xk = x[static_cast<size_t>(k)], xtk = xt[static_cast<size_t>(k)];
      y_ref += static_cast<double>(w[i]) * xk;
      y_act += static_cast<double>(w[i]) * xtk;
      e_act += std::abs(static_cast<double>(w[i])) * std::abs(xk - xtk);
      t_scale += std::abs(static_cast<double>(w_scale[i]) * xtk);
    }
    for (int64_t j = 0; j < nsub && !per32.empty(); ++j) {
      double xt_sum = 0;  // exact: 32 multiples of one scale with integer factors below 2^12
      for (int l = 0; l < 32; ++l) xt_sum += xt[static_cast<size_t>(j * 32 + l)];
      t_per32 += std::abs(per32[static_cast<size_t>(n * nsub + j)] * xt_sum);
    }
    const double e_f32 = 2 * u * (static_cast<double>(nsub) + 8) * (t_scale + t_per32);
    const double got = y[static_cast<size_t>(n)];
    ASSERT_LE(std::abs(got - y_act), e_f32) << "row " << n << " y " << got << " y_act " << y_act;
    ASSERT_LE(std::abs(got - y_ref), e_act + e_f32) << "row " << n << " y " << got << " y_ref " << y_ref;
    tight += std::abs(got - y_ref) > 1e-3 * (e_act + e_f32);
  }
  EXPECT_GT(tight, 0) << "every error far below its bound: is the bound derived from the right arithmetic?";
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
