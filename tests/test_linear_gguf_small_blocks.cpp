// Decode GEMV over Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS blocks (src/cpu/linear_gguf_small_blocks.cpp)
// against fp64 of the exactly dequantized weights (gguf::dequantize, bit-exact against gguf-py:
// tests/python/test_gguf_blocks.py).
//
// The kernels compute y_n = sum_b (d_b * s_b) * isum_b + sum_b (m_b * s_b) * S_b: activations
// quantized per block b of 32 (256 for IQ4_XS), x~ = s_b * q, |x - x~| <= s_b / 2, isum_b the exact
// integer sum of codes times q, m_b the Q4_1 / Q5_1 offset and S_b the integer sum of the block's q
// (llama.cpp's Q8_1 form). So y is sum_k w_k x~_k up to f32 rounding. Two bounds derived from that
// arithmetic (no fitted tolerance; tests/test_linear_gguf.cpp's, with the offset term in the place
// of the K-quants' min term, here against x~):
//   activations: |y - y_ref| <= E_act + E_f32, E_act = sum_k |w_k| |x_k - x~_k|, y_ref = sum_k w_k x_k
//     in fp64;
//   f32 arithmetic: |y - y_act| <= E_f32, y_act = sum_k w_k x~_k in fp64,
//     E_f32 = 2u (K/32 + 8) (T_scale + T_off), u = 2^-24, T_scale = sum_k |w_k^s x~_k| (w^s the weight
//     without its offset, i.e. dequantized with m = 0), T_off = sum_b |m_b s_b S_b|: each block's
//     (or IQ4_XS super-block's) product of the scales and the integer sum is rounded at most 3 times
//     (d * s, the conversion where a sum passes 2^24, the FMA or multiply), and the sum of at most
//     K/32 + 8 such terms (lanes, then the reduction) adds at most that many roundings.
// Both forms (AVX2 where the CPU has it, and the portable one) are held to the bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/linear_gguf_small_blocks.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"
#include "gguf_linear_testing.hpp"

namespace {

using hanpu::cpu::GgufActivations;
using hanpu::cpu::SmallBlockForm;
using hanpu::gguf::GgmlType;

bool has_offset(GgmlType t) { return t == GgmlType::Q4_1 || t == GgmlType::Q5_1; }

struct Weights {
  GgmlType type;
  int64_t N, K;
  std::vector<uint8_t> bytes;
  std::vector<float> w;       // dequantized (exact)
  std::vector<float> w_scale;  // dequantized with m = 0 (= w without an offset)
  std::vector<float> offset;   // Q4_1 / Q5_1: m per (row, block of 32); else empty
};

// Random payload bytes; the f16 scale d (and m) moderate, or with extreme_scales drawn from the f16
// maximum, 1, 1e-4 and the subnormals 6e-8, 1.2e-7.
Weights make_weights(GgmlType t, int64_t N, int64_t K, uint32_t seed, bool extreme_scales = false) {
  std::mt19937 rng(seed);
  const auto& f = hanpu::gguf::block_format(t);
  Weights W{t, N, K, {}, {}, {}, {}};
  const int64_t nb = N * K / f.block_elems;
  W.bytes.resize(static_cast<size_t>(nb * f.block_bytes));
  for (auto& b : W.bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* blk = W.bytes.data() + i * f.block_bytes;
    uint16_t d = hanpu::f32_to_f16(scale(rng)), m = hanpu::f32_to_f16(scale(rng) * 4);
    if (extreme_scales) {
      const float pick[] = {65504.f, 1.f, 1e-4f, 6e-8f, 1.2e-7f};
      d = hanpu::f32_to_f16((rng() & 1 ? -1.f : 1.f) * pick[rng() % 5]);
      m = hanpu::f32_to_f16((rng() & 1 ? -1.f : 1.f) * pick[rng() % 5]);
    }
    std::memcpy(blk, &d, 2);  // d first in every one of these layouts
    if (has_offset(t)) std::memcpy(blk + 2, &m, 2);
  }
  W.w.resize(static_cast<size_t>(N * K));
  hanpu::gguf::dequantize(t, W.bytes.data(), W.w.data(), N * K);
  W.w_scale = W.w;
  if (has_offset(t)) {
    std::vector<uint8_t> no_m = W.bytes;
    for (int64_t i = 0; i < nb; ++i) {
      uint16_t m;
      std::memcpy(&m, W.bytes.data() + i * f.block_bytes + 2, 2);
      W.offset.push_back(hanpu::f16_to_f32(m));
      std::memset(no_m.data() + i * f.block_bytes + 2, 0, 2);
    }
    hanpu::gguf::dequantize(t, no_m.data(), W.w_scale.data(), N * K);
  }
  return W;
}

// The two bounds above for every row of y, and that some row comes near its bound (a bound far
// above every error would pass anything).
void check(const Weights& W, const std::vector<float>& x, const std::vector<float>& y) {
  hanpu::testing::expect_within_integer_kernel_bounds(W.type, W.N, W.K, W.w, W.w_scale, W.offset, x, y);
}

std::vector<SmallBlockForm> forms() {
  std::vector<SmallBlockForm> f{SmallBlockForm::kPortable};
  if (hanpu::cpu::gguf_small_block_form_available(SmallBlockForm::kAvx2)) f.push_back(SmallBlockForm::kAvx2);
  return f;
}

const char* form_name(SmallBlockForm f) { return f == SmallBlockForm::kAvx2 ? "avx2" : "portable"; }

class SmallBlockGemv : public ::testing::TestWithParam<GgmlType> {};

TEST_P(SmallBlockGemv, WithinDerivedBoundOfFp64) {
  const GgmlType t = GetParam();
  ASSERT_TRUE(hanpu::cpu::gguf_gemv_supported(t));
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (bool extreme : {false, true})
    for (int64_t K : std::vector<int64_t>{be, 3 * be, 1024, 4096}) {
      const int64_t N = 37;
      const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + extreme), extreme);
      const std::vector<float> x = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(K + 1));
      GgufActivations xa;
      hanpu::cpu::gguf_quantize_activations(x.data(), K, hanpu::cpu::gguf_activation_block(t), xa);
      for (SmallBlockForm form : forms()) {
        SCOPED_TRACE("K = " + std::to_string(K) + ", extreme scales " + std::to_string(extreme) + ", " +
                     form_name(form));
        std::vector<float> y(static_cast<size_t>(N), -1.f);
        hanpu::cpu::gguf_small_block_gemv_rows(t, W.bytes.data(), K, xa, y.data(), 0, N, form);
        check(W, x, y);
        // A slice of rows writes only those rows.
        std::vector<float> part(static_cast<size_t>(N), -3.f);
        hanpu::cpu::gguf_small_block_gemv_rows(t, W.bytes.data(), K, xa, part.data(), 5, 9, form);
        for (int64_t n = 0; n < N; ++n) ASSERT_EQ(part[n], n >= 5 && n < 9 ? y[n] : -3.f) << n;
      }
      // Through the dispatch of every GGUF type (gguf_gemv_rows) and threaded: the same bits as the
      // chosen form's rows.
      std::vector<float> y(static_cast<size_t>(N)), y2(static_cast<size_t>(N));
      hanpu::cpu::gguf_small_block_gemv_rows(t, W.bytes.data(), K, xa, y.data(), 0, N);
      hanpu::cpu::gguf_gemv_rows(t, W.bytes.data(), K, xa, y2.data(), 0, N);
      EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4));
      const hanpu::GgufLinear lin(t, W.bytes.data(), N, K, "w");  // the model's decode rows
      for (int threads : {1, 2, 5}) {
        std::fill(y2.begin(), y2.end(), -2.f);
        lin.forward(engine, x.data(), K, y2.data(), N, 1, threads, false);
        EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << threads << " threads";
      }
    }
}

// Blocks whose codes are all at one end (all-zero and all-0xFF payloads): the extreme levels
// (Q4_0 -8 / 7, Q5_0 -16 / 15, Q4_1 / Q5_1 0 / 15, 31, IQ4_NL -127 / 113, IQ4_XS -127 / 113 with
// scales -32 / 31)
// against full-scale activations of both signs, where a saturating int16 pair would show.
TEST_P(SmallBlockGemv, ExtremeCodesAgainstFullScaleActivations) {
  const GgmlType t = GetParam();
  const int64_t K = 1024, N = 4;
  Weights W = make_weights(t, N, K, 5);
  const auto& f = hanpu::gguf::block_format(t);
  const int64_t nb = N * K / f.block_elems;
  const size_t payload = t == GgmlType::IQ4_XS ? 2 : (has_offset(t) ? 4 : 2);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* blk = W.bytes.data() + i * f.block_bytes;
    std::memset(blk + payload, (i / (K / f.block_elems)) % 2 ? 0xFF : 0x00, f.block_bytes - payload);
  }
  Weights fresh = W;
  hanpu::gguf::dequantize(t, W.bytes.data(), fresh.w.data(), N * K);
  fresh.w_scale = fresh.w;
  if (has_offset(t)) {
    std::vector<uint8_t> no_m = W.bytes;
    for (int64_t i = 0; i < nb; ++i) std::memset(no_m.data() + i * f.block_bytes + 2, 0, 2);
    hanpu::gguf::dequantize(t, no_m.data(), fresh.w_scale.data(), N * K);
  }
  std::vector<float> x(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) x[k] = (k / 64) % 2 ? 3.f : -3.f;  // every activation +-127 after quantizing
  x[7] = 0.5f;
  GgufActivations xa;
  hanpu::cpu::gguf_quantize_activations(x.data(), K, hanpu::cpu::gguf_activation_block(t), xa);
  for (SmallBlockForm form : forms()) {
    SCOPED_TRACE(form_name(form));
    std::vector<float> y(static_cast<size_t>(N));
    hanpu::cpu::gguf_small_block_gemv_rows(t, fresh.bytes.data(), K, xa, y.data(), 0, N, form);
    // the activations are exact here but for x[7], so y_act and y_ref nearly coincide
    check(fresh, x, y);
  }
}

// The accuracy docs/GGUF.md states: NMSE of the GEMV's y against fp64 of the dequantized weights
// and the unquantized x, for Gaussian activations (x ~ N(0, 1), K = 4096, 256 rows, moderate
// scales). The rounding of x to int8 is the only error of note (the weights are exact), so it is
// the error of the kernel, not of the format. Bounded by the sum of the rows' derived bounds
// (E_act + E_f32)^2 over sum y_ref^2; the measured value is printed.
TEST_P(SmallBlockGemv, GaussianActivationsNmse) {
  const GgmlType t = GetParam();
  const int64_t K = 4096, N = 256;
  const Weights W = make_weights(t, N, K, 11);
  std::mt19937 rng(12);
  std::normal_distribution<float> nrm(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(K));
  for (float& v : x) v = nrm(rng);
  GgufActivations xa;
  hanpu::cpu::gguf_quantize_activations(x.data(), K, hanpu::cpu::gguf_activation_block(t), xa);
  std::vector<float> y(static_cast<size_t>(N));
  hanpu::cpu::gguf_small_block_gemv_rows(t, W.bytes.data(), K, xa, y.data(), 0, N);
  double err2 = 0, ref2 = 0, bound2 = 0;
  const int64_t nsub = K / 32;
  for (int64_t n = 0; n < N; ++n) {
    double y_ref = 0, e_act = 0, t_scale = 0, t_off = 0;
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n * K + k);
      const double xk = x[static_cast<size_t>(k)];
      const double xt = static_cast<double>(xa.scale[static_cast<size_t>(k / xa.block)]) * xa.q[static_cast<size_t>(k)];
      y_ref += static_cast<double>(W.w[i]) * xk;
      e_act += std::abs(static_cast<double>(W.w[i])) * std::abs(xk - xt);
      t_scale += std::abs(static_cast<double>(W.w_scale[i]) * xt);
      if (!W.offset.empty()) t_off += std::abs(W.offset[static_cast<size_t>(n * nsub + k / 32)] * xt);  // >= |m s S|
    }
    // the two bounds of check() added: E_act + E_f32
    const double e = e_act + 2 * 0x1p-24 * (static_cast<double>(nsub) + 8) * (t_scale + t_off);
    err2 += (y[n] - y_ref) * (y[n] - y_ref);
    ref2 += y_ref * y_ref;
    bound2 += e * e;
  }
  const double got = err2 / ref2;
  EXPECT_LE(got, bound2 / ref2);
  EXPECT_GT(got, 0.0);
  std::printf("%s GEMV, Gaussian x, K = 4096: NMSE vs fp64 of the dequantized weights %.3g (bound %.3g)\n",
              hanpu::gguf::block_format(t).name, got, bound2 / ref2);
}

INSTANTIATE_TEST_SUITE_P(Types, SmallBlockGemv,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                           GgmlType::IQ4_NL, GgmlType::IQ4_XS),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

// GgufLinear over these types: decode rows (M < 4) run the GEMV above and meet its bounds; prefill
// rows on the f32 tiles dequantize tiles exactly and keep x in f32 (tests/test_linear_gguf.cpp's bound:
// |y - y_ref| <= (K + 1) u sum_k |w_k x_k| + u |y|).
class SmallBlockLinear : public ::testing::TestWithParam<GgmlType> {};

TEST_P(SmallBlockLinear, DecodeAndPrefillRowsWithinTheirBounds) {
  const GgmlType t = GetParam();
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (int64_t K : std::vector<int64_t>{be, 1024}) {
    const int64_t N = 37;
    const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + 7));
    hanpu::GgufLinear lin(t, W.bytes.data(), N, K, "test");
    lin.set_prefill(hanpu::GgufPrefill::kF32Tiles);  // the integer prefill: SmallBlockIntPrefill below
    EXPECT_FALSE(lin.prefill_is_integer());
    for (int64_t M : std::vector<int64_t>{1, 3, 4, 5, 67}) {
      SCOPED_TRACE("K = " + std::to_string(K) + ", M = " + std::to_string(M));
      std::vector<float> x(static_cast<size_t>(M * (K + 3)));
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 31 + K));
        std::copy(xr.begin(), xr.end(), x.begin() + m * (K + 3));
      }
      const int64_t ldy = N + 5;
      for (bool accumulate : {false, true})
        for (int threads : {1, 2}) {
          std::vector<float> y(static_cast<size_t>(M * ldy));
          for (size_t i = 0; i < y.size(); ++i) y[i] = 0.25f * static_cast<float>(i % 13) - 1.5f;
          const std::vector<float> y0 = y;
          lin.forward(engine, x.data(), K + 3, y.data(), ldy, M, threads, accumulate);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], y0[m * ldy + n]) << "padding written";
            const std::vector<float> xr(x.begin() + m * (K + 3), x.begin() + m * (K + 3) + K);
            if (M < hanpu::cpu::kGgufPrefillRows) {
              if (accumulate) continue;  // one f32 add on top of the GEMV's value
              check(W, xr, std::vector<float>(y.begin() + m * ldy, y.begin() + m * ldy + N));
              continue;
            }
            ASSERT_NO_FATAL_FAILURE(hanpu::testing::expect_row_within_f32_dot_bound(W.w, N, K, xr, y.data() + m * ldy,
                                                                                  y0.data() + m * ldy, accumulate))
                << "row " << m << " threads " << threads << " accumulate " << accumulate;
          }
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, SmallBlockLinear,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                           GgmlType::IQ4_NL, GgmlType::IQ4_XS),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

// The integer prefill of Q4_0, IQ4_NL and IQ4_XS (linear_gguf_prefill_small_blocks.cpp, through
// gguf_prefill_int and GgufLinear): the same integer products as the GEMV, summed in another order,
// so every output row meets check()'s two bounds. M = 1..17 covers every tail of the 4-row register
// block, N = 37 the tails of the 2-row block and of the 16-row tile; K one block, three blocks, 1024
// and 4096; moderate and extreme weight scales; x blocks of magnitudes 1e-6..1e3 and zero blocks
// (make_x). 1 and 2 threads give the same bits (each output is one thread's); accumulate adds
// exactly the value the plain call writes.
class SmallBlockIntPrefill : public ::testing::TestWithParam<GgmlType> {};

TEST_P(SmallBlockIntPrefill, EveryRowWithinTheGemvBounds) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 here";
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (bool extreme : {false, true})
    for (int64_t K : std::vector<int64_t>{be, 3 * be, 1024, 4096}) {
      const int64_t N = 37;
      const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K * 3 + extreme), extreme);
      for (int64_t M = 1; M <= 17; M += (K >= 4096 ? 4 : 1)) {
        SCOPED_TRACE("K = " + std::to_string(K) + ", M = " + std::to_string(M) + ", extreme scales " +
                     std::to_string(extreme));
        const int64_t ldx = K + 5, ldy = N + 3;
        std::vector<float> x(static_cast<size_t>(M * ldx));
        for (int64_t m = 0; m < M; ++m) {
          const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 17 + K));
          std::copy(xr.begin(), xr.end(), x.begin() + m * ldx);
        }
        std::vector<float> y(static_cast<size_t>(M * ldy), -7.f);
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y.data(), ldy, M, 1, false);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.f) << "padding written";
          check(W, std::vector<float>(x.begin() + m * ldx, x.begin() + m * ldx + K),
                std::vector<float>(y.begin() + m * ldy, y.begin() + m * ldy + N));
        }
        std::vector<float> y2(static_cast<size_t>(M * ldy), -7.f);
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y2.data(), ldy, M, 2, false);
        ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << "2 threads";
        std::vector<float> y3(static_cast<size_t>(M * ldy));
        for (size_t i = 0; i < y3.size(); ++i) y3[i] = 0.5f * static_cast<float>(i % 7) - 1.f;
        const std::vector<float> y30 = y3;
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y3.data(), ldy, M, 2, true);
        for (size_t i = 0; i < y3.size(); ++i)
          ASSERT_EQ(y3[i], static_cast<int64_t>(i % ldy) < N ? y30[i] + y[i] : y30[i]) << "accumulate, element " << i;
      }
    }
}

// Codes at both ends (all-zero and all-0xFF payloads: Q4_0 -8 / 7, the levels -127 / 113, IQ4_XS's
// sub-block scales -32 / 31) against full-scale activations of both signs: an int16 pair or an
// IQ4_XS super-block sum that saturated or passed 2^24 would show against check()'s bounds.
TEST_P(SmallBlockIntPrefill, ExtremeCodesAgainstFullScaleActivations) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 here";
  const int64_t K = 4096, N = 4, M = 5;
  Weights W = make_weights(t, N, K, 5);
  const auto& f = hanpu::gguf::block_format(t);
  const int64_t nb = N * K / f.block_elems;
  for (int64_t i = 0; i < nb; ++i)
    std::memset(W.bytes.data() + i * f.block_bytes + 2, (i / (K / f.block_elems)) % 2 ? 0xFF : 0x00, f.block_bytes - 2);
  hanpu::gguf::dequantize(t, W.bytes.data(), W.w.data(), N * K);
  W.w_scale = W.w;
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[m * K + k] = ((k / 64) % 2 ? 3.f : -3.f) * (m % 2 ? -1.f : 1.f);
  for (int64_t m = 0; m < M; ++m) x[m * K + 7 + m] = 0.5f;  // one inexact activation per row (else all is exact)
  hanpu::Engine engine(2);
  std::vector<float> y(static_cast<size_t>(M * N));
  hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y.data(), N, M, 2, false);
  for (int64_t m = 0; m < M; ++m)
    check(W, std::vector<float>(x.begin() + m * K, x.begin() + (m + 1) * K),
          std::vector<float>(y.begin() + m * N, y.begin() + (m + 1) * N));
}

// GgufLinear runs this path for prefill rows when it is chosen, and the f32 tiles otherwise.
TEST_P(SmallBlockIntPrefill, GgufLinearSettingSelectsThePath) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 here";
  const int64_t K = 1024, N = 37, M = 9;
  const Weights W = make_weights(t, N, K, 21);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m + 3));
    std::copy(xr.begin(), xr.end(), x.begin() + m * K);
  }
  hanpu::Engine engine(2);
  std::vector<float> direct(static_cast<size_t>(M * N)), via(static_cast<size_t>(M * N)), tiles(static_cast<size_t>(M * N));
  hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, direct.data(), N, M, 2, false);
  hanpu::GgufLinear lin(t, W.bytes.data(), N, K, "test");
  lin.set_prefill(hanpu::GgufPrefill::kIntegerDot);
  EXPECT_TRUE(lin.prefill_is_integer());
  lin.forward(engine, x.data(), K, via.data(), N, M, 2, false);
  EXPECT_EQ(0, std::memcmp(direct.data(), via.data(), via.size() * 4));
  lin.set_prefill(hanpu::GgufPrefill::kF32Tiles);
  EXPECT_FALSE(lin.prefill_is_integer());
  lin.forward(engine, x.data(), K, tiles.data(), N, M, 2, false);
  EXPECT_NE(0, std::memcmp(direct.data(), tiles.data(), tiles.size() * 4));  // x quantized in one, f32 in the other
}

INSTANTIATE_TEST_SUITE_P(Types, SmallBlockIntPrefill,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::IQ4_XS),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

TEST(SmallBlockGemvErrors, NonFiniteActivationsGiveNaN) {
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    const Weights W = make_weights(t, 3, 512, 9);
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> x = hanpu::testing::gguf_test_activations(512, 10);
      x[300] = bad;
      GgufActivations xa;
      hanpu::cpu::gguf_quantize_activations(x.data(), 512, hanpu::cpu::gguf_activation_block(t), xa);
      for (SmallBlockForm form : forms()) {
        std::vector<float> y(3);
        hanpu::cpu::gguf_small_block_gemv_rows(t, W.bytes.data(), 512, xa, y.data(), 0, 3, form);
        for (float v : y) EXPECT_TRUE(std::isnan(v)) << hanpu::gguf::block_format(t).name << " " << bad << " " << form_name(form);
      }
    }
  }
}

TEST(SmallBlockGemvErrors, WrongTypeShapeOrActivationsAreRefused) {
  std::vector<float> x(256, 1.f), y(1);
  std::vector<uint8_t> w(256);
  GgufActivations a32, a256;
  hanpu::cpu::gguf_quantize_activations(x.data(), 256, 32, a32);
  hanpu::cpu::gguf_quantize_activations(x.data(), 256, 256, a256);
  EXPECT_EQ(hanpu::cpu::gguf_activation_block(GgmlType::Q5_0), 32);
  EXPECT_EQ(hanpu::cpu::gguf_activation_block(GgmlType::IQ4_XS), 256);
  EXPECT_EQ(hanpu::cpu::gguf_activation_block(GgmlType::IQ4_NL), 32);
  const auto message = [&](GgmlType t, int64_t K, const GgufActivations& a) -> std::string {
    try {
      hanpu::cpu::gguf_small_block_gemv_rows(t, w.data(), K, a, y.data(), 0, 1);
    } catch (const hanpu::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message(GgmlType::Q4_K, 256, a256).find("no kernel for GGML type Q4_K"), std::string::npos);
  EXPECT_NE(message(GgmlType::Q5_0, 256, a256).find("blocks of 32 for Q5_0"), std::string::npos);  // per-256 activations
  EXPECT_NE(message(GgmlType::IQ4_XS, 256, a32).find("blocks of 256 for IQ4_XS"), std::string::npos);
  EXPECT_NE(message(GgmlType::IQ4_NL, 256, a256).find("blocks of 32 for IQ4_NL"), std::string::npos);
  EXPECT_NE(message(GgmlType::Q5_1, 128, a32).find("K = 128"), std::string::npos);  // x is 256 long
  GgufActivations a48;
  EXPECT_THROW(hanpu::cpu::gguf_quantize_activations(x.data(), 48, 32, a48), hanpu::Error);
  // GgufLinear refuses rows that are not whole blocks, naming the projection.
  try {
    hanpu::GgufLinear lin(GgmlType::Q5_0, w.data(), 2, 48, "blk.0.ffn_up");
    ADD_FAILURE() << "no error";
  } catch (const hanpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_up"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q5_0"), std::string::npos) << e.what();
  }
}

}  // namespace
