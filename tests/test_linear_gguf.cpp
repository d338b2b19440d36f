// Decode GEMV over GGUF blocks (src/cpu/linear_gguf.cpp) against fp64 of the dequantized weights.
//
// The kernel computes y_n = sum_b (weight scale * activation scale_b) * isum_b (- the Q4_K / Q5_K
// min terms dmin * activation scale * sum_j m_j B_j, B_j the integer sum of the quantized
// activations over sub-block j, as llama.cpp's Q8_K bsums) with the activations quantized per
// block b of 32 (Q8_0) or 256 (the K-quants): x~ = s_b * q, |x - x~| <= s_b / 2. So every integer
// part is exact and y is the dot product of the dequantized weights w with x~, up to f32
// roundings. Two bounds, both derived from that arithmetic, no fitted tolerance:
//   activations: |y - y_ref| <= E_act + E_f32, E_act = sum_k |w_k| |x_k - x~_k|, y_ref = sum_k w_k x_k
//     in fp64;
//   f32 arithmetic: |y - y_act| <= E_f32, y_act = sum_k w_k x~_k in fp64,
//     E_f32 = 2u (K/32 + 8) (T_scale + T_min), u = 2^-24, T_scale = sum_k |w_k^s x~_k| (w^s the
//     weight without its min term, i.e. dequantized with dmin = 0), T_min = sum_j |dmin m_j X~_j|
//     (X~_j the sum of x~ over sub-block j): every product of the scales and an integer sum is
//     rounded at most 3 times (the scale product, an integer sum's conversion, the multiply-add),
//     and the sum of at most K/32 + 8 such terms (lanes, then the reduction) adds at most that
//     many roundings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "hanpu/engine.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/tensor.hpp"
#include "gguf_linear_testing.hpp"

namespace {

using hanpu::gguf::GgmlType;
using hanpu::cpu::GgufActivations;

struct Weights {
  GgmlType type;
  int64_t N, K;
  std::vector<uint8_t> bytes;
  std::vector<float> w;         // dequantized (exact)
  std::vector<float> w_scale;   // dequantized with dmin = 0 (Q4_K), = w for Q8_0
  std::vector<float> min_term;  // Q4_K: dmin * m_j per (row, sub-block); empty for Q8_0
};

// extreme_scales: the f16 block scales drawn from the f16 maximum (65504), 1, 1e-4 and the smallest
// subnormals (6e-8) instead of moderate values.
// saturate = +1 / -1: every value and sub-block scale at the end of its range that makes the integer
// sums largest (Q8_0 127 / -128; Q4_K 15, Q5_K 31 with scales and mins 63; Q6_K 63 / 0, i.e. q - 32
// = 31 / -32, with scales 127 / -128): the bounds of the integer forms' int16 / int32 steps.
Weights make_weights(GgmlType t, int64_t N, int64_t K, uint32_t seed, bool extreme_scales = false, int saturate = 0) {
  std::mt19937 rng(seed);
  const auto& f = hanpu::gguf::block_format(t);
  Weights W{t, N, K, {}, {}, {}, {}};
  const int64_t nb = N * K / f.block_elems;
  W.bytes.resize(static_cast<size_t>(nb * f.block_bytes));
  for (auto& b : W.bytes) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < nb && saturate != 0; ++i) {
    uint8_t* blk = W.bytes.data() + i * f.block_bytes;
    const bool up = saturate > 0;
    switch (t) {
      case GgmlType::Q8_0: std::memset(blk + 2, up ? 0x7F : 0x80, 32); break;
      case GgmlType::Q4_K: std::memset(blk + 4, 0xFF, 12 + 128); break;          // scales, qs
      case GgmlType::Q5_K: std::memset(blk + 4, 0xFF, 12 + 32 + 128); break;     // scales, qh, qs
      case GgmlType::Q6_K:
        std::memset(blk, up ? 0xFF : 0x00, 128 + 64);                           // ql, qh
        std::memset(blk + 192, up ? 0x7F : 0x80, 16);                           // scales
        break;
      default: break;
    }
  }
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* blk = W.bytes.data() + i * f.block_bytes;
    uint16_t d = hanpu::f32_to_f16(scale(rng)), dmin = hanpu::f32_to_f16(std::abs(scale(rng)));
    if (extreme_scales) {
      const float pick[] = {65504.f, 1.f, 1e-4f, 6e-8f, 1.2e-7f};
      d = hanpu::f32_to_f16((rng() & 1 ? -1.f : 1.f) * pick[rng() % 5]);
      dmin = hanpu::f32_to_f16(pick[rng() % 5]);
    }
    std::memcpy(blk + (t == GgmlType::Q6_K ? 208 : 0), &d, 2);  // Q6_K's d is last
    if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) std::memcpy(blk + 2, &dmin, 2);
  }
  W.w.resize(static_cast<size_t>(N * K));
  hanpu::gguf::dequantize(t, W.bytes.data(), W.w.data(), N * K);
  W.w_scale = W.w;
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) {
    std::vector<uint8_t> no_min = W.bytes;
    for (int64_t i = 0; i < nb; ++i) std::memset(no_min.data() + i * f.block_bytes + 2, 0, 2);
    hanpu::gguf::dequantize(t, no_min.data(), W.w_scale.data(), N * K);
    for (int64_t i = 0; i < nb; ++i) {
      // Q4_K and Q5_K start alike: d, dmin, the 12 scale bytes
      const auto* blk = reinterpret_cast<const hanpu::gguf::BlockQ4_K*>(W.bytes.data() + i * f.block_bytes);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        hanpu::gguf::k4_scale_min(j, blk->scales, sc, m);
        W.min_term.push_back(static_cast<float>(hanpu::f16_to_f32(blk->dmin) * m));
      }
    }
  }
  return W;
}

// Both the decode GEMV and the integer prefill (since 2026-12-05 its Q4_K / Q5_K min term, too, is
// taken from the integer sums of the quantized activations) meet these bounds.
void check(const Weights& W, const std::vector<float>& x, const std::vector<float>& y) {
  hanpu::testing::expect_within_integer_kernel_bounds(W.type, W.N, W.K, W.w, W.w_scale, W.min_term, x, y);
}

class GgufGemv : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufGemv, WithinDerivedBoundOfFp64) {
  const GgmlType t = GetParam();
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  for (int64_t K : std::vector<int64_t>{be, 3 * be, 1024, 4096}) {
    SCOPED_TRACE("K = " + std::to_string(K));
    const int64_t N = 37;
    const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K));
    const std::vector<float> x = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(K + 1));
    GgufActivations xa;
    hanpu::cpu::gguf_quantize_activations(x.data(), K, hanpu::cpu::gguf_activation_block(t), xa);
    std::vector<float> y(static_cast<size_t>(N), -1.f);
    hanpu::cpu::gguf_gemv_rows(t, W.bytes.data(), K, xa, y.data(), 0, N);
    check(W, x, y);
    // The threaded form (GgufLinear's decode rows, the model's path): rows are independent, so the same bits.
    hanpu::Engine engine(2);
    const hanpu::GgufLinear lin(t, W.bytes.data(), N, K, "w");
    for (int threads : {1, 2, 5}) {
      std::vector<float> y2(static_cast<size_t>(N), -2.f);
      lin.forward(engine, x.data(), K, y2.data(), N, 1, threads, false);
      EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgufGemv, ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

// The row-lane layout (linear_gguf_row_lanes.cpp): the packing is a permutation of the file's
// bits (unpacking gives every row back bit for bit), and its GEMV meets check()'s bounds: row
// counts with and without a tail past the last group of 8, one to 16 super-blocks, extreme scales.
TEST(GgufGemvRowLanes, SameRowsBackAndWithinDerivedBoundOfFp64) {
  const GgmlType t = GgmlType::Q4_K;
  if (!hanpu::cpu::gguf_row_lanes_available(t, 8)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  EXPECT_FALSE(hanpu::cpu::gguf_row_lanes_available(t, 7));
  EXPECT_FALSE(hanpu::cpu::gguf_row_lanes_available(GgmlType::Q8_0, 64));
  hanpu::Engine engine(2);
  for (int64_t K : std::vector<int64_t>{256, 768, 1024, 4096})
    for (int64_t N : std::vector<int64_t>{8, 9, 15, 16, 37, 67})
      for (bool extreme : {false, true}) {
        SCOPED_TRACE("K = " + std::to_string(K) + ", N = " + std::to_string(N) + (extreme ? ", extreme scales" : ""));
        const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K * 131 + N), extreme);
        std::vector<uint8_t> packed(hanpu::cpu::gguf_row_lanes_bytes(t, N, K));
        hanpu::cpu::gguf_pack_row_lanes(t, W.bytes.data(), N, K, packed.data());
        std::vector<uint8_t> back(W.bytes.size(), 0xAB);
        hanpu::cpu::gguf_unpack_row_lanes(t, packed.data(), N, K, 0, N, back.data());
        ASSERT_EQ(back, W.bytes);
        const int64_t rb = static_cast<int64_t>(W.bytes.size()) / N;  // a range starting inside a group
        std::vector<uint8_t> some(static_cast<size_t>(2 * rb));
        hanpu::cpu::gguf_unpack_row_lanes(t, packed.data(), N, K, N - 2, N, some.data());
        ASSERT_EQ(0, std::memcmp(some.data(), W.bytes.data() + (N - 2) * rb, some.size()));
        const std::vector<float> x = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(K + N));
        GgufActivations xa;
        hanpu::cpu::gguf_quantize_activations(x.data(), K, 256, xa);
        std::vector<float> y(static_cast<size_t>(N), -1.f);
        hanpu::cpu::gguf_gemv_row_lanes(t, packed.data(), N, K, xa, y.data(), 0, N);
        check(W, x, y);
        // Any split into groups gives the same bits (rows are independent).
        const hanpu::GgufLinear lin(t, packed.data(), N, K, "w", hanpu::GgufLayout::kRowLanes);
        for (int threads : {1, 2, 5}) {
          std::vector<float> y2(static_cast<size_t>(N), -2.f);
          lin.forward(engine, x.data(), K, y2.data(), N, 1, threads, false);
          EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << threads << " threads";
        }
        if (N >= 16) {  // a range from the second group on, y indexed from its first row
          std::vector<float> y3(static_cast<size_t>(N - 8), -3.f);
          hanpu::cpu::gguf_gemv_row_lanes(t, packed.data(), N, K, xa, y3.data(), 8, N);
          EXPECT_EQ(0, std::memcmp(y.data() + 8, y3.data(), y3.size() * 4));
        }
      }
  std::vector<uint8_t> small(static_cast<size_t>(7 * 144));
  EXPECT_THROW(hanpu::cpu::gguf_row_lanes_bytes(t, 7, 256), hanpu::Error);
  EXPECT_THROW(hanpu::cpu::gguf_row_lanes_bytes(t, 8, 200), hanpu::Error);
  EXPECT_THROW(hanpu::cpu::gguf_row_lanes_bytes(GgmlType::Q6_K, 8, 256), hanpu::Error);
}

// GgufLinear on the row-lane layout: decode rows run the row-lane GEMV (check()'s bounds), prefill
// rows put each tile's rows back in the file's layout, so both prefill paths give the file
// layout's bits exactly.
TEST(GgufGemvRowLanes, GgufLinearOnRowLanes) {
  const GgmlType t = GgmlType::Q4_K;
  if (!hanpu::GgufLinear::row_lanes_available(t, 37)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  hanpu::Engine engine(2);
  for (int64_t K : std::vector<int64_t>{256, 1024})
    for (int64_t N : std::vector<int64_t>{8, 37, 621}) {  // 621: several chunks per thread, 5 tail rows
      const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + 3 * N));
      std::vector<uint8_t> packed(hanpu::GgufLinear::row_lanes_bytes(t, N, K));
      hanpu::GgufLinear::pack_row_lanes(t, W.bytes.data(), N, K, packed.data());
      hanpu::GgufLinear file(t, W.bytes.data(), N, K, "file");
      hanpu::GgufLinear lanes(t, packed.data(), N, K, "lanes", hanpu::GgufLayout::kRowLanes);
      EXPECT_EQ(lanes.bytes(), packed.size());
      for (hanpu::GgufPrefill mode : {hanpu::GgufPrefill::kF32Tiles, hanpu::GgufPrefill::kIntegerDot})
        for (int64_t M : std::vector<int64_t>{1, 3, 4, 19}) {
          file.set_prefill(mode);
          lanes.set_prefill(mode);
          SCOPED_TRACE("K = " + std::to_string(K) + ", N = " + std::to_string(N) + ", M = " + std::to_string(M));
          std::vector<float> x(static_cast<size_t>(M * K));
          for (int64_t m = 0; m < M; ++m) {
            const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 17 + K));
            std::copy(xr.begin(), xr.end(), x.begin() + m * K);
          }
          for (bool accumulate : {false, true})
            for (int threads : {1, 2}) {
              std::vector<float> y1(static_cast<size_t>(M * N), 0.5f), y2 = y1;
              file.forward(engine, x.data(), K, y1.data(), N, M, threads, accumulate);
              lanes.forward(engine, x.data(), K, y2.data(), N, M, threads, accumulate);
              if (M >= hanpu::cpu::kGgufPrefillRows) {
                EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "prefill, " << threads << " threads";
              } else if (!accumulate) {
                for (int64_t m = 0; m < M; ++m) {
                  const std::vector<float> xr(x.begin() + m * K, x.begin() + (m + 1) * K);
                  check(W, xr, std::vector<float>(y2.begin() + m * N, y2.begin() + (m + 1) * N));
                }
              } else {  // accumulate adds the same rows: one more f32 add of the non-accumulated values
                std::vector<float> y3(static_cast<size_t>(M * N));
                lanes.forward(engine, x.data(), K, y3.data(), N, M, threads, false);
                for (size_t i = 0; i < y3.size(); ++i) EXPECT_EQ(y2[i], 0.5f + y3[i]) << i;
              }
            }
        }
    }
  std::vector<uint8_t> q8(static_cast<size_t>(8 * 34));
  EXPECT_THROW(hanpu::GgufLinear(GgmlType::Q8_0, q8.data(), 8, 32, "q8", hanpu::GgufLayout::kRowLanes), hanpu::Error);
}

// GgufLinear::forward_decode_parts (a stacked projection's GGUF parts in one pass): every part's
// rows bit for bit those of its own forward (which the tests above bound against fp64), on the
// file's layout and row lanes, types side by side, tails past the last 8-row group, parts smaller
// than the threads' share, parts of several chunks each (601 and 517 rows), accumulate, 1 and 2
// threads; and where it does not apply it declines.
TEST(GgufLinearDecodeParts, SameBitsAsEachPartsOwnForward) {
  hanpu::Engine engine(2);
  const int64_t K = 1024;
  const bool lanes_here = hanpu::GgufLinear::row_lanes_available(GgmlType::Q4_K, 16);
  struct Part {
    GgmlType type;
    int64_t N;
    bool lanes;
  };
  std::vector<Part> spec{{GgmlType::Q6_K, 37, false}, {GgmlType::Q4_K, 37, lanes_here}, {GgmlType::Q4_K, 16, lanes_here},
                         {GgmlType::Q5_K, 3, false}, {GgmlType::Q4_K, 9, false}, {GgmlType::Q4_K, 8, lanes_here},
                         {GgmlType::Q6_K, 601, false}, {GgmlType::Q4_K, 517, lanes_here}};
  std::vector<Weights> ws;
  std::vector<std::vector<uint8_t>> packed;
  std::vector<std::unique_ptr<hanpu::GgufLinear>> lin;
  std::vector<const hanpu::GgufLinear*> parts;
  std::vector<int64_t> cols;
  int64_t N = 0;
  for (size_t i = 0; i < spec.size(); ++i) {
    ws.push_back(make_weights(spec[i].type, spec[i].N, K, static_cast<uint32_t>(101 + i)));
    const void* data = ws.back().bytes.data();
    if (spec[i].lanes) {
      packed.emplace_back(hanpu::GgufLinear::row_lanes_bytes(spec[i].type, spec[i].N, K));
      hanpu::GgufLinear::pack_row_lanes(spec[i].type, data, spec[i].N, K, packed.back().data());
      data = packed.back().data();
    }
    lin.push_back(std::make_unique<hanpu::GgufLinear>(spec[i].type, data, spec[i].N, K, "part" + std::to_string(i),
                                                      spec[i].lanes ? hanpu::GgufLayout::kRowLanes : hanpu::GgufLayout::kFile));
    parts.push_back(lin.back().get());
    cols.push_back(N);
    N += spec[i].N;
  }
  for (int64_t M : std::vector<int64_t>{1, 2, 3}) {
    const int64_t ldx = K + 5, ldy = N + 3;
    std::vector<float> x(static_cast<size_t>(M * ldx));
    for (int64_t m = 0; m < M; ++m) {
      const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 29 + 7));
      std::copy(xr.begin(), xr.end(), x.begin() + m * ldx);
    }
    for (bool accumulate : {false, true})
      for (int threads : {1, 2}) {
        SCOPED_TRACE("M = " + std::to_string(M) + ", accumulate " + std::to_string(accumulate) + ", " +
                     std::to_string(threads) + " threads");
        std::vector<float> y1(static_cast<size_t>(M * ldy), 0.25f), y2 = y1;
        for (size_t i = 0; i < parts.size(); ++i)
          parts[i]->forward(engine, x.data(), ldx, y1.data() + cols[i], ldy, M, threads, accumulate);
        ASSERT_TRUE(hanpu::GgufLinear::forward_decode_parts(engine, parts, cols, x.data(), ldx, y2.data(), ldy, M, threads,
                                                             accumulate));
        EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
        if (!accumulate)
          for (size_t i = 0; i < parts.size(); ++i)
            for (int64_t m = 0; m < M; ++m) {
              const std::vector<float> xr(x.begin() + m * ldx, x.begin() + m * ldx + K);
              check(ws[i], xr, std::vector<float>(y2.begin() + m * ldy + cols[i], y2.begin() + m * ldy + cols[i] + spec[i].N));
            }
      }
  }
  // Declines, leaving y alone: prefill rows, a single part, activations in blocks of 32 beside 256,
  // different K.
  std::vector<float> x(static_cast<size_t>(4 * K), 1.f), y(static_cast<size_t>(4 * N), 0.f);
  EXPECT_FALSE(hanpu::GgufLinear::forward_decode_parts(engine, parts, cols, x.data(), K, y.data(), N, 4, 2, false));
  EXPECT_FALSE(hanpu::GgufLinear::forward_decode_parts(engine, {parts[0]}, {0}, x.data(), K, y.data(), N, 1, 2, false));
  const Weights q8 = make_weights(GgmlType::Q8_0, 4, K, 5), q4 = make_weights(GgmlType::Q4_K, 4, 512, 6);
  hanpu::GgufLinear l8(GgmlType::Q8_0, q8.bytes.data(), 4, K, "q8"), l4(GgmlType::Q4_K, q4.bytes.data(), 4, 512, "q4");
  EXPECT_FALSE(hanpu::GgufLinear::forward_decode_parts(engine, {parts[0], &l8}, {0, 37}, x.data(), K, y.data(), N, 1, 2, false));
  EXPECT_FALSE(hanpu::GgufLinear::forward_decode_parts(engine, {parts[0], &l4}, {0, 37}, x.data(), K, y.data(), N, 1, 2, false));
  for (float v : y) EXPECT_EQ(v, 0.f);
}

// GgufLinear (the projection a GGUF model's quantized weights run through). Prefill rows (M >=
// kGgufPrefillRows) and types without a GEMV kernel dequantize tiles exactly and keep x in f32:
// y = y0 + sum_k w_k x_k with every product and sum rounded once in f32, so, in any order of the
// K additions (lanes, then the reduction), |y - y_ref| <= (K + 1) u sum_k |w_k x_k| + u |y| (the
// last term for accumulate's add into y0), u = 2^-24, y_ref in fp64. Decode rows of the GEMV types
// go through the GEMV above and meet its bound (check()).
class GgufLinearRows : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufLinearRows, PrefillAndDecodeRowsWithinTheirBounds) {
  const GgmlType t = GetParam();
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (int64_t K : std::vector<int64_t>{be, 2 * be, 1024}) {
    const int64_t N = 37;  // not a multiple of the 4-row register block or the 16-row tile
    const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + 7));
    hanpu::GgufLinear lin(t, W.bytes.data(), N, K, "test");
    for (hanpu::GgufPrefill mode : {hanpu::GgufPrefill::kF32Tiles, hanpu::GgufPrefill::kIntegerDot})
    for (int64_t M : std::vector<int64_t>{1, 3, 4, 5, 7, 67}) {  // decode rows, tails of 4 x 4, past one 64-row block
      lin.set_prefill(mode);
      SCOPED_TRACE("K = " + std::to_string(K) + ", M = " + std::to_string(M) + ", integer prefill " +
                   std::to_string(lin.prefill_is_integer()));
      std::vector<float> x(static_cast<size_t>(M * (K + 3)));
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 31 + K));
        std::copy(xr.begin(), xr.end(), x.begin() + m * (K + 3));
      }
      const int64_t ldy = N + 5;
      for (bool accumulate : {false, true}) {
        for (int threads : {1, 2}) {
          std::vector<float> y(static_cast<size_t>(M * ldy));
          for (size_t i = 0; i < y.size(); ++i) y[i] = 0.25f * static_cast<float>(i % 13) - 1.5f;
          const std::vector<float> y0 = y;
          lin.forward(engine, x.data(), K + 3, y.data(), ldy, M, threads, accumulate);
          // Decode rows, and prefill rows where the integer path runs (the default on AVX2 targets),
          // quantize the activations and meet check()'s bounds; the f32 tiles meet the bound below.
          const bool gemv = (M < hanpu::cpu::kGgufPrefillRows && hanpu::cpu::gguf_gemv_supported(t)) ||
                            (M >= hanpu::cpu::kGgufPrefillRows && lin.prefill_is_integer());
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], y0[m * ldy + n]) << "padding written";
            const std::vector<float> xr(x.begin() + m * (K + 3), x.begin() + m * (K + 3) + K);
            if (gemv) {
              std::vector<float> row(static_cast<size_t>(N));
              for (int64_t n = 0; n < N; ++n) row[n] = y[m * ldy + n] - (accumulate ? y0[m * ldy + n] : 0.f);
              if (!accumulate) check(W, xr, row);  // the GEMV's own bound (accumulate adds one f32 add)
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
}

INSTANTIATE_TEST_SUITE_P(Types, GgufLinearRows,
                         ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                                           GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::IQ4_XS),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

// The integer prefill GEMM (gguf_prefill_int, linear_gguf_prefill.cpp): every output row must meet
// the decode GEMV's two bounds (check()): against fp64 of the exactly dequantized weights and the
// quantized activations (only f32 rounding, E_f32), and against the unquantized activations
// (E_act + E_f32). M from 1 to 17 covers every tail of the 4-row (K-quants) and 6-row (Q8_0)
// register blocks, N = 37 two whole 16-row tiles and one of 5 rows (one group of 8 with 3 zero
// rows), N = 13 one tile of two groups, the second with 3 zero rows; K one block, three blocks, 1024 and 4096; moderate and extreme weight scales. Threads give
// the same bits (each output is one thread's), and accumulate adds the same value into y.
class GgufIntPrefill : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufIntPrefill, EveryRowWithinTheGemvBounds) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (bool extreme : {false, true}) {
    for (const auto& [N, K] : std::vector<std::pair<int64_t, int64_t>>{{37, be}, {37, 3 * be}, {37, 1024}, {37, 4096}, {13, 3 * be}}) {
      const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + N + 3 + extreme), extreme);
      for (int64_t M = 1; M <= 17; M += (K >= 4096 ? 4 : 1)) {
        SCOPED_TRACE("N = " + std::to_string(N) + ", K = " + std::to_string(K) + ", M = " + std::to_string(M) + ", extreme " +
                     std::to_string(extreme));
        const int64_t ldx = K + 5, ldy = N + 3;
        std::vector<float> x(static_cast<size_t>(M * ldx), 1e30f);  // padding that would show if read
        for (int64_t m = 0; m < M; ++m) {
          const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 17 + K));
          std::copy(xr.begin(), xr.end(), x.begin() + m * ldx);
        }
        std::vector<float> y(static_cast<size_t>(M * ldy), -7.f);
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y.data(), ldy, M, 1, false);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], -7.f) << "padding written";
          const std::vector<float> xr(x.begin() + m * ldx, x.begin() + m * ldx + K);
          const std::vector<float> row(y.begin() + m * ldy, y.begin() + m * ldy + N);
          check(W, xr, row);
        }
        std::vector<float> y2(static_cast<size_t>(M * ldy), -7.f);
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y2.data(), ldy, M, 2, false);
        ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << "2 threads";
        std::vector<float> y3(static_cast<size_t>(M * ldy));
        for (size_t i = 0; i < y3.size(); ++i) y3[i] = 0.5f * static_cast<float>(i % 7) - 1.f;
        const std::vector<float> y0 = y3;
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y3.data(), ldy, M, 2, true);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < ldy; ++n) {
            const size_t i = static_cast<size_t>(m * ldy + n);
            ASSERT_EQ(y3[i], n < N ? y0[i] + y[i] : y0[i]) << "accumulate, row " << m << " col " << n;
          }
      }
    }
  }
}

// Through GgufLinear: kIntegerDot is what forward runs for prefill rows, kF32Tiles the f32 tiles
// (the decode rows M < 4 take the GEMV either way); the two differ by the activation rounding only.
TEST_P(GgufIntPrefill, GgufLinearSettingSelectsThePath) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  const int64_t K = 512, N = 19, M = 9;
  const Weights W = make_weights(t, N, K, 77);
  hanpu::GgufLinear lin(t, W.bytes.data(), N, K, "test");
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m + 5));
    std::copy(xr.begin(), xr.end(), x.begin() + m * K);
  }
  hanpu::Engine engine(2);
  std::vector<float> y_int(static_cast<size_t>(M * N)), y_f32(static_cast<size_t>(M * N)), y_direct(y_int.size());
  lin.set_prefill(hanpu::GgufPrefill::kIntegerDot);
  EXPECT_TRUE(lin.prefill_is_integer());
  lin.forward(engine, x.data(), K, y_int.data(), N, M, 2, false);
  hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y_direct.data(), N, M, 2, false);
  EXPECT_EQ(0, std::memcmp(y_int.data(), y_direct.data(), y_int.size() * 4));
  lin.set_prefill(hanpu::GgufPrefill::kF32Tiles);
  EXPECT_FALSE(lin.prefill_is_integer());
  lin.forward(engine, x.data(), K, y_f32.data(), N, M, 2, false);
  EXPECT_NE(0, std::memcmp(y_int.data(), y_f32.data(), y_int.size() * 4)) << "the two paths gave the same bits";
}

// The AVX2 form's register blocks (K-quants 4 x 2 with int16 sums per run of steps, Q8_0 6 x 2, both
// in assembly) against its one-row tails (intrinsics, one VPMADDWD per step): the same integer sums
// and f32 operations, so the same bits, for every row, on random and on saturating blocks (every
// weight at its largest magnitude, activations of one sign near their block's maximum: the int16
// runs at their bounds, Q4_K 8 * 2 * 15 * 127, Q5_K 4 * 2 * 31 * 127, Q6_K 2 * 2 * 255 * 32).
// kAvx2 explicitly, so that it runs where the AVX512-VNNI form is the default too.
TEST_P(GgufIntPrefill, RegisterBlocksSameBitsAsTheOneRowTails) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  using hanpu::cpu::GgufIntForm;
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (int saturate : {0, 1, -1}) {
    for (float xsign : {1.f, -1.f}) {
      for (const auto& [N, K] : std::vector<std::pair<int64_t, int64_t>>{{37, be}, {21, 3 * be}, {13, 1024}}) {
        SCOPED_TRACE("N = " + std::to_string(N) + ", K = " + std::to_string(K) + ", saturate " +
                     std::to_string(saturate) + ", activations " + std::to_string(xsign));
        const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + N + 5 + saturate), false, saturate);
        const int64_t M = 13;  // Q8_0: 6 + 6 + a tail of 1; K-quants: 4 + 4 + 4 + 1
        std::mt19937 rng(static_cast<uint32_t>(K + 3));
        std::uniform_real_distribution<float> u(0.9f, 1.f);
        std::vector<float> x(static_cast<size_t>(M * K));
        for (int64_t m = 0; m < M; ++m) {
          if (saturate != 0) {
            for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(m * K + k)] = xsign * u(rng);
          } else {
            const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 7 + K));
            for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(m * K + k)] = xsign * xr[static_cast<size_t>(k)];
          }
        }
        std::vector<float> y(static_cast<size_t>(M * N)), y1(static_cast<size_t>(N));
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y.data(), N, M, 2, false, false,
                                     GgufIntForm::kAvx2);
        for (int64_t m = 0; m < M; ++m) {
          hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data() + m * K, K, y1.data(), N, 1, 1, false,
                                       false, GgufIntForm::kAvx2);
          ASSERT_EQ(0, std::memcmp(y.data() + m * N, y1.data(), y1.size() * 4)) << "row " << m;
          // (saturating blocks: rows of equal weights, errors far below the bound, which check() refuses
          // as a sign of a wrong bound; SaturatingValuesSameBitsAsTheAvx2Form checks those against fp64)
          if (saturate == 0) check(W, std::vector<float>(x.begin() + m * K, x.begin() + (m + 1) * K), y1);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgufIntPrefill,
                         ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

// The AVX512-VNNI form (linear_gguf_prefill.cpp, "The AVX512-VNNI form"), where this CPU and
// HANPU_ISA allow it: bit for bit the AVX2 form's results (the same int32 sums per super-block /
// block, the same f32 operations), and every row within the GEMV's bounds against fp64 (check()).
// M = 1..19 covers every tail of its 8-row register block and two whole blocks; N = 37 two whole
// 16-row tiles and one of 5 rows, N = 13 and 5 a tile with padding rows; K one super-block / block,
// three, 1024 and 4096; moderate and extreme weight scales; 1 and 2 threads, accumulate.
class GgufIntPrefillVnni : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufIntPrefillVnni, SameBitsAsTheAvx2FormAndWithinTheGemvBounds) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_vnni_available(t)) GTEST_SKIP() << "no AVX512-VNNI form on this CPU / HANPU_ISA";
  using hanpu::cpu::GgufIntForm;
  const int64_t be = hanpu::gguf::block_format(t).block_elems;
  hanpu::Engine engine(2);
  for (bool extreme : {false, true}) {
    for (const auto& [N, K] : std::vector<std::pair<int64_t, int64_t>>{
             {37, be}, {37, 3 * be}, {27, 3 * be}, {13, 3 * be}, {5, 2 * be}, {37, 1024}, {16, 4096}}) {
      const Weights W = make_weights(t, N, K, static_cast<uint32_t>(K + N + 11 + extreme), extreme);
      for (int64_t M = 1; M <= 19; M += (K >= 1024 ? 3 : 1)) {
        SCOPED_TRACE("N = " + std::to_string(N) + ", K = " + std::to_string(K) + ", M = " + std::to_string(M) +
                     ", extreme " + std::to_string(extreme));
        const int64_t ldx = K + 3, ldy = N + 2;
        std::vector<float> x(static_cast<size_t>(M * ldx), 1e30f);  // padding that would show if read
        for (int64_t m = 0; m < M; ++m) {
          const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m * 29 + K + 1));
          std::copy(xr.begin(), xr.end(), x.begin() + m * ldx);
        }
        std::vector<float> yv(static_cast<size_t>(M * ldy), -7.f), ya(yv.size(), -7.f), yv2(yv.size(), -7.f);
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, yv.data(), ldy, M, 1, false, false,
                                     GgufIntForm::kVnni);
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, ya.data(), ldy, M, 1, false, false,
                                     GgufIntForm::kAvx2);
        ASSERT_EQ(0, std::memcmp(yv.data(), ya.data(), yv.size() * 4)) << "VNNI and AVX2 forms differ";
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(yv[m * ldy + n], -7.f) << "padding written";
          const std::vector<float> xr(x.begin() + m * ldx, x.begin() + m * ldx + K);
          const std::vector<float> row(yv.begin() + m * ldy, yv.begin() + m * ldy + N);
          check(W, xr, row);
        }
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, yv2.data(), ldy, M, 2, false, false,
                                     GgufIntForm::kVnni);
        ASSERT_EQ(0, std::memcmp(yv.data(), yv2.data(), yv.size() * 4)) << "2 threads";
        std::vector<float> y3(yv.size());
        for (size_t i = 0; i < y3.size(); ++i) y3[i] = 0.5f * static_cast<float>(i % 7) - 1.f;
        const std::vector<float> y0 = y3;
        hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), ldx, y3.data(), ldy, M, 2, true, false,
                                     GgufIntForm::kVnni);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < ldy; ++n) {
            const size_t i = static_cast<size_t>(m * ldy + n);
            ASSERT_EQ(y3[i], n < N ? y0[i] + yv[i] : y0[i]) << "accumulate, row " << m << " col " << n;
          }
      }
    }
  }
}

// The sums at their largest (make_weights' saturate, activations of one sign near their block's
// maximum, int8 114..127): Q4_K's int16 step per 16 elements (16 * 15 * 127; per 32 it would
// overflow), Q6_K's and Q8_0's offset forms at 255 * 31 / 255 * 127 per product.
TEST_P(GgufIntPrefillVnni, SaturatingValuesSameBitsAsTheAvx2Form) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_vnni_available(t)) GTEST_SKIP() << "no AVX512-VNNI form on this CPU / HANPU_ISA";
  using hanpu::cpu::GgufIntForm;
  const int64_t be = hanpu::gguf::block_format(t).block_elems, K = 2 * be, N = 21, M = 11;
  hanpu::Engine engine(2);
  for (int wsign : {1, -1}) {
    for (float xsign : {1.f, -1.f}) {
      SCOPED_TRACE("weights " + std::to_string(wsign) + ", activations " + std::to_string(xsign));
      const Weights W = make_weights(t, N, K, static_cast<uint32_t>(5 + wsign), false, wsign);
      std::mt19937 rng(static_cast<uint32_t>(K + wsign));
      std::uniform_real_distribution<float> u(0.9f, 1.f);
      std::vector<float> x(static_cast<size_t>(M * K));
      for (float& v : x) v = xsign * u(rng);
      std::vector<float> yv(static_cast<size_t>(M * N)), ya(yv.size());
      hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, yv.data(), N, M, 1, false, false,
                                   GgufIntForm::kVnni);
      hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, ya.data(), N, M, 1, false, false,
                                   GgufIntForm::kAvx2);
      ASSERT_EQ(0, std::memcmp(yv.data(), ya.data(), yv.size() * 4)) << "VNNI and AVX2 forms differ";
      for (int64_t m = 0; m < M; ++m)
        check(W, std::vector<float>(x.begin() + m * K, x.begin() + (m + 1) * K),
              std::vector<float>(yv.begin() + m * N, yv.begin() + (m + 1) * N));
    }
  }
}

// kAuto runs the VNNI form where it is available, HANPU_GGUF_INT_FORM=avx2 the AVX2 one (here the
// same bits); where it is not available (HANPU_ISA=avx2 / avx3, other CPUs) asking for it throws.
TEST_P(GgufIntPrefillVnni, AutoAndEnvironmentChooseTheForm) {
  const GgmlType t = GetParam();
  if (!hanpu::cpu::gguf_int_prefill_available(t)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  using hanpu::cpu::GgufIntForm;
  const int64_t K = 512, N = 21, M = 10;
  const Weights W = make_weights(t, N, K, 91);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<float> xr = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(m + 40));
    std::copy(xr.begin(), xr.end(), x.begin() + m * K);
  }
  hanpu::Engine engine(2);
  std::vector<float> y_auto(static_cast<size_t>(M * N)), y_avx2(y_auto.size()), y_env(y_auto.size());
  hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y_auto.data(), N, M, 2, false);
  hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y_avx2.data(), N, M, 2, false, false,
                               GgufIntForm::kAvx2);
  setenv("HANPU_GGUF_INT_FORM", "avx2", 1);
  hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y_env.data(), N, M, 2, false);
  setenv("HANPU_GGUF_INT_FORM", "vnni512", 1);
  EXPECT_THROW(hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y_env.data(), N, M, 2, false),
               hanpu::Error);
  unsetenv("HANPU_GGUF_INT_FORM");
  EXPECT_EQ(0, std::memcmp(y_auto.data(), y_avx2.data(), y_auto.size() * 4));
  EXPECT_EQ(0, std::memcmp(y_env.data(), y_avx2.data(), y_auto.size() * 4));
  if (!hanpu::cpu::gguf_int_prefill_vnni_available(t))
    EXPECT_THROW(hanpu::cpu::gguf_prefill_int(engine, t, W.bytes.data(), N, K, x.data(), K, y_env.data(), N, M, 2, false,
                                              false, GgufIntForm::kVnni),
                 hanpu::Error);
}

INSTANTIATE_TEST_SUITE_P(Types, GgufIntPrefillVnni,
                         ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(hanpu::gguf::block_format(info.param).name); });

// The AVX2 activation quantizer (gguf_avx2.hpp: the one the prefill and the decode GEMV run)
// against the scalar form: the same int8 values, scales, sums of 16 and f32 sums per 32 bit for
// bit (ties of roundf away from zero, subnormal blocks, a NaN and an inf block, a zero block), and
// the f32 sums per 32 within their summation bound.
TEST(GgufIntPrefillQuantizer, SameBitsAsTheScalarQuantizer) {
  if (!hanpu::cpu::gguf_int_prefill_available(GgmlType::Q4_K)) GTEST_SKIP() << "no AVX2 form on this CPU / HANPU_ISA";
  for (int64_t block : {int64_t{32}, int64_t{256}}) {
    const int64_t K = 2048;
    std::vector<float> x = hanpu::testing::gguf_test_activations(K, static_cast<uint32_t>(block));
    // block 1: exact halves (amax 127 makes d = 1: x = k + 0.5 is a tie of roundf), both signs
    for (int64_t j = 0; j < block; ++j) x[block + j] = (j % 2 ? -1.f : 1.f) * (static_cast<float>(j % 120) + 0.5f);
    x[block] = 127.f;
    for (int64_t j = 0; j < block; ++j) x[2 * block + j] = 1e-41f * static_cast<float>(j - 7);  // subnormal
    x[3 * block + 5] = std::numeric_limits<float>::quiet_NaN();
    x[4 * block + 9] = -std::numeric_limits<float>::infinity();
    std::fill(x.begin() + 5 * block, x.begin() + 6 * block, 0.f);
    std::vector<int8_t> q_ref(K), q(K);
    std::vector<float> s_ref(K / block), s(K / block), sum_ref(K / 32), sum(K / 32);
    std::vector<int16_t> b_ref(K / 16), b(K / 16);
    hanpu::cpu::gguf_quantize_activation_row_scalar(x.data(), K, block, q_ref.data(), s_ref.data(), sum_ref.data(),
                                                    b_ref.data());
    hanpu::cpu::gguf_prefill_quantize_row(x.data(), K, block, q.data(), s.data(), sum.data(), b.data());
    EXPECT_EQ(0, std::memcmp(q.data(), q_ref.data(), q.size())) << "block " << block;
    EXPECT_EQ(0, std::memcmp(s.data(), s_ref.data(), s.size() * 4)) << "block " << block;
    EXPECT_EQ(0, std::memcmp(b.data(), b_ref.data(), b.size() * 2)) << "block " << block;
    for (int64_t g = 0; g < K / 32; ++g) {
      if (std::isnan(sum_ref[g])) EXPECT_TRUE(std::isnan(sum[g])) << "sum " << g;
      else EXPECT_EQ(0, std::memcmp(&sum[g], &sum_ref[g], 4)) << "sum " << g << ": " << sum[g] << " against " << sum_ref[g];
    }
    EXPECT_EQ(q[block + 1], -2) << "-1.5 rounds away from zero";
    EXPECT_EQ(q[block + 2], 3) << "2.5 rounds away from zero";
    for (int64_t g = 0; g < K / 32; ++g) {
      double exact = 0, mag = 0;
      for (int j = 0; j < 32; ++j) {
        exact += x[32 * g + j];
        mag += std::abs(static_cast<double>(x[32 * g + j]));
      }
      if (!std::isfinite(exact)) {
        EXPECT_FALSE(std::isfinite(sum[g])) << "sum " << g;
        continue;
      }
      EXPECT_LE(std::abs(sum[g] - exact), 5 * 0x1p-24 * mag) << "sum " << g;  // a 5-level tree of 32
    }
  }
  std::vector<float> x(96);
  std::vector<int8_t> q(96);
  std::vector<float> s(3), sm(3);
  std::vector<int16_t> b(6);
  EXPECT_THROW(hanpu::cpu::gguf_prefill_quantize_row(x.data(), 96, 256, q.data(), s.data(), sm.data(), b.data()),
               hanpu::Error);
}

TEST(GgufIntPrefillErrors, TypesWithoutAFormFallBackOrAreRefused) {
  hanpu::Engine engine(1);
  std::vector<uint8_t> w(8 * 20);  // one row of 256 in Q4_1 blocks
  std::vector<float> x(4 * 256, 1.f), y(4);
  // Q4_1 / Q5_0 / Q5_1 have no integer prefill form (Q4_0, IQ4_NL, IQ4_XS do where AVX2 runs:
  // tests/test_linear_gguf_small_blocks.cpp).
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1})
    EXPECT_FALSE(hanpu::cpu::gguf_int_prefill_available(t)) << hanpu::gguf::block_format(t).name;
  EXPECT_THROW(hanpu::cpu::gguf_prefill_int(engine, GgmlType::Q4_1, w.data(), 1, 256, x.data(), 256, y.data(), 1, 4, 1,
                                            false),
               hanpu::Error);
  hanpu::GgufLinear lin(GgmlType::Q4_1, w.data(), 1, 256, "q4_1");
  lin.set_prefill(hanpu::GgufPrefill::kIntegerDot);
  EXPECT_FALSE(lin.prefill_is_integer());  // the f32 tiles
  if (hanpu::cpu::gguf_int_prefill_available(GgmlType::Q4_K)) {
    std::vector<uint8_t> q(144);
    EXPECT_THROW(hanpu::cpu::gguf_prefill_int(engine, GgmlType::Q4_K, q.data(), 1, 128, x.data(), 256, y.data(), 1, 4,
                                              1, false),
                 hanpu::Error);  // K not whole super-blocks
  }
}

TEST(GgufGemvErrors, NonFiniteActivationsGiveNaN) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const Weights W = make_weights(t, 3, 512, 9);
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> x = hanpu::testing::gguf_test_activations(512, 10);
      x[300] = bad;
      GgufActivations xa;
      hanpu::cpu::gguf_quantize_activations(x.data(), 512, hanpu::cpu::gguf_activation_block(t), xa);
      std::vector<float> y(3);
      hanpu::cpu::gguf_gemv_rows(t, W.bytes.data(), 512, xa, y.data(), 0, 3);
      for (float v : y) EXPECT_TRUE(std::isnan(v)) << hanpu::gguf::block_format(t).name << " " << bad;
    }
  }
}

// A block whose largest activation is subnormal: 1 / scale overflows to inf, and x * inf would be
// converted to int16 (undefined; libFuzzer's UBSan finding through fuzz_gguf_model). Each value is
// still rounded to within half a scale step, and the GEMV's outputs are finite.
TEST(GgufGemvErrors, SubnormalActivationBlockQuantizesWithinHalfAStep) {
  for (float amax : {1e-39f, 1e-41f, 1.4e-45f}) {
    std::vector<float> x(256);
    for (size_t k = 0; k < x.size(); ++k) x[k] = amax * (static_cast<float>(k % 17) / 8.f - 1.f);
    for (int64_t block : {32, 256}) {
      GgufActivations xa;
      hanpu::cpu::gguf_quantize_activations(x.data(), 256, block, xa);
      for (int64_t k = 0; k < 256; ++k) {
        const double s = xa.scale[static_cast<size_t>(k / block)];
        ASSERT_LE(std::abs(xa.q[static_cast<size_t>(k)]), 127);
        if (s == 0) {  // amax / 127 underflows to 0 (amax = the smallest subnormal): Q8_0's rule zeroes the block
          ASSERT_EQ(xa.q[static_cast<size_t>(k)], 0);
          continue;
        }
        ASSERT_LE(std::abs(x[static_cast<size_t>(k)] - s * xa.q[static_cast<size_t>(k)]), s * 0.5) << amax << " " << k;
      }
    }
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
      const Weights W = make_weights(t, 3, 256, 11);
      GgufActivations xa;
      hanpu::cpu::gguf_quantize_activations(x.data(), 256, hanpu::cpu::gguf_activation_block(t), xa);
      std::vector<float> y(3);
      hanpu::cpu::gguf_gemv_rows(t, W.bytes.data(), 256, xa, y.data(), 0, 3);
      for (float v : y) EXPECT_TRUE(std::isfinite(v)) << hanpu::gguf::block_format(t).name << " " << amax;
    }
  }
}

TEST(GgufGemvErrors, UnsupportedTypeAndShape) {
  GgufActivations xa;
  std::vector<float> x(256, 1.f), y(1);
  EXPECT_THROW(hanpu::cpu::gguf_quantize_activations(x.data(), 33, 32, xa), hanpu::Error);
  EXPECT_THROW(hanpu::cpu::gguf_quantize_activations(x.data(), 64, 256, xa), hanpu::Error);
  hanpu::cpu::gguf_quantize_activations(x.data(), 256, 32, xa);
  EXPECT_THROW(hanpu::cpu::gguf_gemv_rows(GgmlType::Q4_K, nullptr, 256, xa, y.data(), 0, 1), hanpu::Error);  // blocks of 32
  hanpu::cpu::gguf_quantize_activations(x.data(), 256, 256, xa);
  std::vector<uint8_t> w(210);
  EXPECT_THROW(hanpu::cpu::gguf_gemv_rows(GgmlType::Q2_K, w.data(), 256, xa, y.data(), 0, 1), hanpu::Error);
  EXPECT_THROW(hanpu::cpu::gguf_gemv_rows(GgmlType::Q4_K, w.data(), 128, xa, y.data(), 0, 1), hanpu::Error);
}

}  // namespace

// A tensor with a zero dimension decodes to nothing, whatever its (null) data and output pointers:
// the libFuzzer finding tests/fuzz/regressions/gguf_header/zero-element-tensor passed null to memcpy.
TEST(GgufBlocks, ZeroElementsTouchNothing) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K})
    EXPECT_NO_THROW(hanpu::gguf::dequantize(t, nullptr, nullptr, 0)) << hanpu::gguf::block_format(t).name;
}
