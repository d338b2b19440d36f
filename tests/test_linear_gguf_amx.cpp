// GGUF prefill on AMX-BF16 (src/cpu/linear_gguf_amx.cpp) against fp64 of the dequantized weights.
//
// What the path computes: y = y0 + sum_k w~_k x~_k, w~ = bf16(w) (w the exactly dequantized
// weight, rounded to nearest even: |w~ - w| <= 2^-9 |w|), x~ the sum of the activation's bf16
// terms (3 terms: x exactly; 2: the truncated high part plus the rounded rest, |x~ - x| <= 2^-16
// |x|; 1: rounded, 2^-9 |x|), every product exact in f32 and accumulated with one f32 rounding
// each (TDPBF16PS), terms x K of them, plus one for the add into y0. So, with u = 2^-24,
// gamma_n = n u / (1 - n u), S = sum_k |w_k x_k|:
//   |y - y_ref| <= (e_w + e_x + e_w e_x) S + gamma_{terms K + 2} ((1 + e_w)(1 + e_x) S + |y0|),
// y_ref = y0 + sum_k w_k x_k in fp64. With 3 terms also, against the bf16-rounded weights
// (y~_ref = y0 + sum_k w~_k x_k): |y - y~_ref| <= gamma_{3K + 2} (sum_k |w~_k x_k| + |y0|), which
// only f32 accumulation can meet. The packing is checked bit for bit against amx_pack_weight of
// the rounded weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/linear_gguf.hpp"
#include "cpu/linear_kernels.hpp"
#include "gguf_linear_testing.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/gguf_format.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"

namespace {

using hanpu::gguf::GgmlType;

constexpr const char* kNoAmx = "AMX not usable here (CPU without AMX-BF16, no tile permission from the OS, or HANPU_ISA below native)";

// Random blocks with moderate f16 scales (random scale bytes could be Inf / NaN).
std::vector<uint8_t> make_blocks(GgmlType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto& f = hanpu::gguf::block_format(t);
  const int64_t nb = N * K / f.block_elems;
  std::vector<uint8_t> bytes(static_cast<size_t>(nb * f.block_bytes));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  const bool second = t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* blk = bytes.data() + i * f.block_bytes;
    const uint16_t d = hanpu::f32_to_f16(scale(rng)), m = hanpu::f32_to_f16(std::abs(scale(rng)));
    std::memcpy(blk + (t == GgmlType::Q6_K ? 208 : 0), &d, 2);  // Q6_K's d is last
    if (second) std::memcpy(blk + 2, &m, 2);                     // dmin / m
  }
  return bytes;
}

double activation_error(int terms) { return terms == 3 ? 0.0 : terms == 2 ? 0x1p-16 : 0x1p-9; }
double gamma(double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

// y [M, ldy] from y0 against the bounds of the file comment; w [N, K] exactly dequantized, x [M, ldx].
void expect_within_bounds(const std::vector<float>& w, int64_t N, int64_t K, const std::vector<float>& x, int64_t ldx,
                          int64_t M, const std::vector<float>& y0, const std::vector<float>& y, int64_t ldy,
                          bool accumulate, int terms) {
  const double e_w = 0x1p-9, e_x = activation_error(terms), g = gamma(static_cast<double>(terms * K + 2));
  int tight = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], y0[m * ldy + n]) << "padding written, row " << m;
    for (int64_t n = 0; n < N; ++n) {
      const double base = accumulate ? y0[m * ldy + n] : 0.0;
      double ref = base, ref_r = base, S = 0, S_r = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double wk = w[n * K + k], wr = hanpu::bf16_to_f32(hanpu::f32_to_bf16(w[n * K + k]));
        const double xk = x[m * ldx + k];
        ref += wk * xk;
        ref_r += wr * xk;
        S += std::abs(wk * xk);
        S_r += std::abs(wr * xk);
      }
      const double got = y[m * ldy + n];
      const double bound = (e_w + e_x + e_w * e_x) * S + g * ((1 + e_w) * (1 + e_x) * S + std::abs(base));
      ASSERT_LE(std::abs(got - ref), bound) << "row " << m << " col " << n << " y " << got << " y_ref " << ref;
      if (terms == 3)
        ASSERT_LE(std::abs(got - ref_r), g * (S_r + std::abs(base)))
            << "row " << m << " col " << n << " y " << got << " y~_ref " << ref_r;
      tight += std::abs(got - ref) > 1e-3 * bound;
    }
  }
  EXPECT_GT(tight, 0) << "every error far below its bound: is the bound derived from the right arithmetic?";
}

std::vector<float> make_x(int64_t M, int64_t K, int64_t ldx, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(M * ldx), 7.f);  // padding past K: must not be read
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(seed + 31 * m));
    std::copy(xr.begin(), xr.end(), x.begin() + m * ldx);
  }
  return x;
}

class GgufAmxPrefill : public ::testing::TestWithParam<GgmlType> {};

// The packed bf16 tiles: amx_pack_weight's of the rounded weights, bit for bit, for row ranges
// that start inside the matrix and end with a partial 16-row group.
TEST_P(GgufAmxPrefill, PackedTilesAreThoseOfTheRoundedWeights) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_amx_prefill_available(t)) GTEST_SKIP() << kNoAmx;
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  for (int64_t K : std::vector<int64_t>{be, 3 * be})
    for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {0, 37}, {32, 69}, {64, 65}}) {
      const int64_t N = 69;
      const std::vector<uint8_t> bytes = make_blocks(t, N, K, static_cast<uint32_t>(K + n0));
      std::vector<float> w(static_cast<size_t>(N * K));
      hanpu::gguf::dequantize(t, bytes.data(), w.data(), N * K);
      std::vector<uint16_t> wr(static_cast<size_t>((n1 - n0) * K));
      for (size_t i = 0; i < wr.size(); ++i) wr[i] = hanpu::f32_to_bf16(w[static_cast<size_t>(n0 * K) + i]);
      const int64_t elems = hanpu::cpu::amx_packed_weight_elems(n1 - n0, K);
      std::vector<uint16_t> want(static_cast<size_t>(elems)), got(static_cast<size_t>(elems), 0xdead);
      hanpu::cpu::amx_pack_weight(wr.data(), n1 - n0, K, want.data());
      std::vector<float> scratch(static_cast<size_t>(16 * K));
      std::vector<uint8_t> file_rows;
      hanpu::cpu::gguf_pack_weight_bf16(t, bytes.data(), N, K, n0, n1, false, got.data(), scratch.data(), file_rows);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 2)) << "K " << K << " rows " << n0 << ".." << n1;
    }
}

// gguf_prefill_amx for every activation split, odd shapes (N past a column block, not a multiple
// of 16 or 32; M past a pass of 128 rows, not a multiple of 32; K of one block), strided x and y,
// accumulate, 1 to 3 threads.
TEST_P(GgufAmxPrefill, WithinTheBf16BoundOfFp64) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_amx_prefill_available(t)) GTEST_SKIP() << kNoAmx;
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(3);
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape& s : std::vector<Shape>{{4, 37, be}, {33, 16, be}, {67, 200, 2 * be}, {161, 45, 1024}, {5, 290, 512}}) {
    const int64_t K = std::max(s.K, be), ldx = K + 5, ldy = s.N + 3;
    const std::vector<uint8_t> bytes = make_blocks(t, s.N, K, static_cast<uint32_t>(s.M + s.N + K));
    std::vector<float> w(static_cast<size_t>(s.N * K));
    hanpu::gguf::dequantize(t, bytes.data(), w.data(), s.N * K);
    const std::vector<float> x = make_x(s.M, K, ldx, static_cast<uint32_t>(K + s.M));
    for (int terms : {1, 2, 3})
      for (bool accumulate : {false, true})
        for (int threads : {1, 2, 3}) {
          if (threads == 3 && (terms != 3 || accumulate)) continue;
          SCOPED_TRACE("M " + std::to_string(s.M) + " N " + std::to_string(s.N) + " K " + std::to_string(K) + ", terms " +
                       std::to_string(terms) + ", accumulate " + std::to_string(accumulate) + ", threads " +
                       std::to_string(threads));
          std::vector<float> y(static_cast<size_t>(s.M * ldy));
          for (size_t i = 0; i < y.size(); ++i) y[i] = 0.25f * static_cast<float>(i % 13) - 1.5f;
          const std::vector<float> y0 = y;
          hanpu::cpu::gguf_prefill_amx(engine, t, bytes.data(), s.N, K, x.data(), ldx, y.data(), ldy, s.M, threads,
                                       accumulate, false, terms);
          expect_within_bounds(w, s.N, K, x, ldx, s.M, y0, y, ldy, accumulate, terms);
        }
  }
}

// GgufLinear with the AMX setting (and HANPU_GGUF_PREFILL=amx under kAuto) runs this path: the same
// bits as gguf_prefill_amx with the default terms; decode rows still take the GEMV.
TEST_P(GgufAmxPrefill, GgufLinearSettingSelectsThePath) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_amx_prefill_available(t)) GTEST_SKIP() << kNoAmx;
  const int64_t K = std::max<int64_t>(256, hanpu::gguf::block_format(t).block_elems), N = 53, M = 40;
  static_assert(hanpu::cpu::kGgufAmxMinRows <= 40);
  const std::vector<uint8_t> bytes = make_blocks(t, N, K, 11);
  const std::vector<float> x = make_x(M, K, K, 5);
  hanpu::Engine engine(2);
  hanpu::GgufLinear lin(t, bytes.data(), N, K, "amx");
  lin.set_prefill(hanpu::GgufPrefill::kAmxBf16);
  EXPECT_TRUE(lin.prefill_is_amx());
  EXPECT_FALSE(lin.prefill_is_integer());
  std::vector<float> y1(static_cast<size_t>(M * N)), y2(y1.size());
  lin.forward(engine, x.data(), K, y1.data(), N, M, 2, false);
  hanpu::cpu::gguf_prefill_amx(engine, t, bytes.data(), N, K, x.data(), K, y2.data(), N, M, 2, false, false,
                               hanpu::cpu::kGgufAmxTerms);
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  lin.set_prefill(hanpu::GgufPrefill::kAuto);
  setenv("HANPU_GGUF_PREFILL", "amx", 1);
  EXPECT_TRUE(lin.prefill_is_amx());
  const int other = hanpu::cpu::kGgufAmxTerms == 3 ? 1 : 3;
  setenv("HANPU_GGUF_AMX_TERMS", std::to_string(other).c_str(), 1);
  std::vector<float> y3(y1.size());
  lin.forward(engine, x.data(), K, y3.data(), N, M, 2, false);
  hanpu::cpu::gguf_prefill_amx(engine, t, bytes.data(), N, K, x.data(), K, y2.data(), N, M, 2, false, false, other);
  EXPECT_EQ(0, std::memcmp(y3.data(), y2.data(), y3.size() * 4)) << "HANPU_GGUF_AMX_TERMS=" << other;
  EXPECT_NE(0, std::memcmp(y3.data(), y1.data(), y3.size() * 4)) << "the terms made no difference";
  setenv("HANPU_GGUF_AMX_TERMS", "4", 1);
  EXPECT_THROW(lin.forward(engine, x.data(), K, y3.data(), N, M, 2, false), hanpu::Error);
  unsetenv("HANPU_GGUF_AMX_TERMS");
  setenv("HANPU_GGUF_PREFILL", "int", 1);
  EXPECT_FALSE(lin.prefill_is_amx());
  unsetenv("HANPU_GGUF_PREFILL");
  lin.set_prefill(hanpu::GgufPrefill::kF32Tiles);
  EXPECT_FALSE(lin.prefill_is_amx());
  // The default (kAuto, no variable): AMX from kGgufAmxMinRows rows, the others' default below.
  lin.set_prefill(hanpu::GgufPrefill::kAuto);
  EXPECT_TRUE(lin.prefill_is_amx());
  const int64_t few = hanpu::cpu::kGgufAmxMinRows - 1;
  hanpu::GgufLinear other_path(t, bytes.data(), N, K, "other");
  other_path.set_prefill(hanpu::cpu::gguf_use_int_prefill(t) ? hanpu::GgufPrefill::kIntegerDot : hanpu::GgufPrefill::kF32Tiles);
  std::vector<float> y4(static_cast<size_t>(few * N)), y5(y4.size());
  lin.forward(engine, x.data(), K, y4.data(), N, few, 2, false);
  other_path.forward(engine, x.data(), K, y5.data(), N, few, 2, false);
  EXPECT_EQ(0, std::memcmp(y4.data(), y5.data(), y4.size() * 4)) << few << " rows";
  lin.forward(engine, x.data(), K, y3.data(), N, M, 2, false);
  EXPECT_EQ(0, std::memcmp(y3.data(), y1.data(), y3.size() * 4)) << M << " rows";
}

INSTANTIATE_TEST_SUITE_P(Types, GgufAmxPrefill,
                         ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_0,
                                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL,
                                           GgmlType::IQ4_XS),
                         [](const ::testing::TestParamInfo<GgmlType>& i) {
                           return std::string(hanpu::gguf::block_format(i.param).name);
                         });

// The row-lane layout (Q4_K): each column block's rows put back in the file's layout first, so
// the same bits as the file's layout, for blocks that start and end inside a group of 8 and past
// the last group.
TEST(GgufAmxPrefillRowLanes, SameBitsAsTheFileLayout) {
  const GgmlType t = GgmlType::Q4_K;
  if (!hanpu::cpu::gguf_amx_prefill_available(t)) GTEST_SKIP() << kNoAmx;
  if (!hanpu::GgufLinear::row_lanes_available(t, 8)) GTEST_SKIP() << "no row-lane layout here (AVX2 forms not allowed)";
  hanpu::Engine engine(2);
  for (int64_t N : std::vector<int64_t>{8, 37, 300})
    for (int64_t K : std::vector<int64_t>{256, 768}) {
      const std::vector<uint8_t> bytes = make_blocks(t, N, K, static_cast<uint32_t>(N + K));
      std::vector<uint8_t> packed(hanpu::GgufLinear::row_lanes_bytes(t, N, K));
      hanpu::GgufLinear::pack_row_lanes(t, bytes.data(), N, K, packed.data());
      hanpu::GgufLinear file(t, bytes.data(), N, K, "file");
      hanpu::GgufLinear lanes(t, packed.data(), N, K, "lanes", hanpu::GgufLayout::kRowLanes);
      file.set_prefill(hanpu::GgufPrefill::kAmxBf16);
      lanes.set_prefill(hanpu::GgufPrefill::kAmxBf16);
      for (int64_t M : std::vector<int64_t>{4, 45})
        for (int threads : {1, 2}) {
          const std::vector<float> x = make_x(M, K, K, static_cast<uint32_t>(M));
          std::vector<float> y1(static_cast<size_t>(M * N), 0.5f), y2 = y1;
          file.forward(engine, x.data(), K, y1.data(), N, M, threads, true);
          lanes.forward(engine, x.data(), K, y2.data(), N, M, threads, true);
          EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "N " << N << " K " << K << " M " << M;
          std::vector<float> w(static_cast<size_t>(N * K));
          hanpu::gguf::dequantize(t, bytes.data(), w.data(), N * K);
          const std::vector<float> y0(y1.size(), 0.5f);
          expect_within_bounds(w, N, K, x, K, M, y0, y2, N, true, hanpu::cpu::kGgufAmxTerms);
        }
    }
}

// Errors: K not whole blocks, terms out of range.
TEST(GgufAmxPrefillErrors, BadShapeAndTerms) {
  if (!hanpu::cpu::gguf_amx_prefill_available(GgmlType::Q8_0)) GTEST_SKIP() << kNoAmx;
  hanpu::Engine engine(1);
  std::vector<uint8_t> q8(static_cast<size_t>(4 * 34));
  std::vector<float> x(64 * 4), y(16);
  EXPECT_THROW(hanpu::cpu::gguf_prefill_amx(engine, GgmlType::Q8_0, q8.data(), 4, 48, x.data(), 48, y.data(), 4, 4, 1,
                                            false, false, 3),
               hanpu::Error);
  EXPECT_THROW(hanpu::cpu::gguf_prefill_amx(engine, GgmlType::Q8_0, q8.data(), 4, 32, x.data(), 32, y.data(), 4, 4, 1,
                                            false, false, 0),
               hanpu::Error);
}

}  // namespace
