// Decode GEMV kernels over GGUF blocks, Q8_0, Q4_K, Q5_K and Q6_K (see linear_gguf.hpp): Highway,
// compiled once per SIMD target and dispatched at run time (HANPU_ISA caps the target, hanpu/isa.hpp).
//
// Per weight row, blocks in address order. The integer part: the weights widened to int16
// (Q8_0: sign-extended bytes; Q4_K: zero-extended bytes split into the low nibbles, sub-block 2c,
// and the high nibbles, sub-block 2c+1, of each 32-byte chunk; ggml-common.h's block_q4_K layout)
// times the int16 activations, pairs summed into int32 lanes (ReorderWidenMulAccumulate: VPMADDWD
// on x86). No overflow: |w| <= 127 (Q8_0) or 15 (Q4_K), |x| <= 127, 32 products per sub-block.
// Then per 32 weights one conversion and one f32 multiply-add by (weight scale * activation scale);
// the reduction over lanes happens once per row. Vectors are capped at 16 int16 lanes (256 bits):
// on Zen 4, where a 512-bit operation runs as two 256-bit halves, the 512-bit form of the Q8_0
// kernel was slower (1 thread, 256 x 1024 in cache: 16.6 GB/s of weights against 21.9 capped; Q4_K
// from DRAM about 11 -> 14 GB/s), and a Q6_K vector then holds exactly one 16-element scale group.
// On x86 targets with AVX2 all four types run the AVX2 forms further down instead (u8 x i8
// multiply-adds, which Highway 1.0.3 lacks); these Highway forms serve SSE4, the portable target
// and other architectures, and are the reference the AVX2 forms' integer sums equal.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/engine_impl.hpp"
#include "hanpu/isa.hpp"
#include "cpu/gguf_avx2.hpp"
#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/linear_gguf_small_blocks.hpp"  // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_XS
#include "hanpu/linear.hpp"
#include "cpu/linear_kernels.hpp"  // decode_prefetch_bytes
#include "cpu/x86_features.hpp"
#include "hanpu/tensor.hpp"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/linear_gguf.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#ifndef HANPU_LINEAR_GGUF_ONCE
#define HANPU_LINEAR_GGUF_ONCE
namespace hanpu::cpu::gguf_detail {
// f16 -> f32, inline (one per block in the hot loop; the out-of-line hanpu::f16_to_f32 is the same
// function of the bits). Exact for every input.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp != 0 && exp != 31) {
    u = sign | (exp + 112) << 23 | mant << 13;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: mant * 2^-24, exact in f32
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace hanpu::cpu::gguf_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A block's f16 scale as f32 (exact): one VCVTPH2PS where the target has F16C (Highway's AVX2 and
// AVX3 targets are compiled with it), else the bit conversion.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
HWY_INLINE float F16ToF32(uint16_t h) { return _cvtsh_ss(h); }
#else
HWY_INLINE float F16ToF32(uint16_t h) { return gguf_detail::F16ToF32(h); }
#endif

float DotQ8_0(const gguf::BlockQ8_0* b, int64_t nb, const int16_t* xq, const float* xs, int64_t ahead) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const size_t L = hn::Lanes(d16);
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  auto block = [&](int64_t i, decltype(acc0)& acc) {
    hwy::Prefetch(reinterpret_cast<const char*>(b + i) + ahead);
    auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
    for (size_t j = 0; j < 32; j += L) {
      const auto w = hn::PromoteTo(d16, hn::LoadU(d8, b[i].qs + j));
      s0 = hn::ReorderWidenMulAccumulate(d32, w, hn::LoadU(d16, xq + i * 32 + j), s0, s1);
    }
    const float scale = F16ToF32(b[i].d) * xs[i];
    acc = hn::MulAdd(hn::ConvertTo(df, hn::Add(s0, s1)), hn::Set(df, scale), acc);
  };
  for (; i + 2 <= nb; i += 2) {  // two accumulators: the multiply-adds of neighbouring blocks overlap
    block(i, acc0);
    block(i + 1, acc1);
  }
  if (i < nb) block(i, acc0);
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
}

// Per super-block of 256: the 6-bit sub-block scales multiply the nibbles in int16 (at most
// 15 * 63 = 945) before the pairwise multiply-add with the activations (one int8 scale for the
// whole super-block, as llama.cpp's Q8_K), so the 8 sub-blocks sum into one set of int32 lanes
// (at most 945 * 127 * 256 in all, below 2^31) and the super-block costs one conversion and one
// multiply-add by d * activation scale. The min term dmin * s_x * sum_j m_j B_j (B_j the sum of the
// int8 activations over sub-block j: exact integers, at most 8 * 63 * 32 * 127 in all) once per
// super-block, as the AVX2 form and llama.cpp's ggml_vec_dot_q4_K_q8_K.
// Q5_K (block_q5_K) is the same with a fifth bit: bit 2c of qh[l] for element l of sub-block 2c,
// bit 2c+1 for sub-block 2c+1 (values up to 31, times the scale 1953, a super-block's int32 lanes
// within 256 * 1953 * 127 < 2^31).
template <class Block>
float DotK4(const Block* b, int64_t nb, const int16_t* xq, const float* xs, const int16_t* bsum16, int64_t ahead) {
  constexpr bool kQ5 = std::is_same_v<Block, gguf::BlockQ5_K>;
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const size_t L = hn::Lanes(d16);
  const auto low4 = hn::Set(d16, int16_t{0xF});
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  float min_acc = 0.0f;  // sum over the super-blocks of dmin * s_x * sum_j m_j B_j
  for (int64_t i = 0; i < nb; ++i) {
    const Block& blk = b[i];
    const char* bytes = reinterpret_cast<const char*>(b + i);
    hwy::Prefetch(bytes + ahead);
    hwy::Prefetch(bytes + ahead + 64);
    hwy::Prefetch(bytes + ahead + 128);
    if constexpr (kQ5) hwy::Prefetch(bytes + ahead + 192);
    // The 8 six-bit scales and mins (k4_scale_min for every j at once): bytes 0..3 hold the low 6
    // bits of scales 0..3, bytes 4..7 of mins 0..3, bytes 8..11 the low 4 bits of scales / mins
    // 4..7, whose top 2 bits are the top bits of bytes 0..3 / 4..7.
    uint32_t w[3];
    std::memcpy(w, blk.scales, 12);
    const uint64_t sc = uint64_t{w[0] & 0x3f3f3f3fu} |
                        uint64_t{(w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u)} << 32;
    alignas(8) uint8_t m[8];
    const uint32_t m_lo = w[1] & 0x3f3f3f3fu, m_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u);
    std::memcpy(m, &m_lo, 4);
    std::memcpy(m + 4, &m_hi, 4);
    const int16_t* x = xq + i * 256;
    auto s0 = hn::Zero(d32), s1 = hn::Zero(d32), t0 = hn::Zero(d32), t1 = hn::Zero(d32);
    for (int c = 0; c < 4; ++c) {
      const auto sc_lo = hn::Set(d16, static_cast<int16_t>((sc >> (16 * c)) & 0xFF));
      const auto sc_hi = hn::Set(d16, static_cast<int16_t>((sc >> (16 * c + 8)) & 0xFF));
      const uint8_t* q = blk.qs + 32 * c;
      const int16_t* x_lo = x + 64 * c;
      const int16_t* x_hi = x_lo + 32;
      for (size_t j = 0; j < 32; j += L) {
        const auto raw = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(), hn::LoadU(du8, q + j)));
        auto lo = hn::And(raw, low4), hi = hn::ShiftRight<4>(raw);
        if constexpr (kQ5) {
          const auto one = hn::Set(d16, int16_t{1});
          const auto hb = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(), hn::LoadU(du8, blk.qh + j)));
          lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(hb, 2 * c), one)));
          hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(hb, 2 * c + 1), one)));
        }
        s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(lo, sc_lo), hn::LoadU(d16, x_lo + j), s0, s1);
        t0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(hi, sc_hi), hn::LoadU(d16, x_hi + j), t0, t1);
      }
    }
    const auto isum = hn::Add(hn::Add(s0, s1), hn::Add(t0, t1));
    const float scale = F16ToF32(blk.d) * xs[i];
    if (i & 1) acc1 = hn::MulAdd(hn::ConvertTo(df, isum), hn::Set(df, scale), acc1);
    else acc0 = hn::MulAdd(hn::ConvertTo(df, isum), hn::Set(df, scale), acc0);
    int32_t msum = 0;
    for (int j = 0; j < 8; ++j) msum += m[j] * (bsum16[i * 16 + 2 * j] + bsum16[i * 16 + 2 * j + 1]);
    min_acc += (F16ToF32(blk.dmin) * xs[i]) * static_cast<float>(msum);  // msum exact in f32 (< 2^21)
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1))) - min_acc;
}

// Q6_K (ggml-common.h block_q6_K): per half of 128 elements, 64 bytes of low nibbles (element l
// and l+64 in byte l, l+32 and l+96 in byte l+32), 32 bytes of 2-bit high parts (element l + 32 i
// in bits 2i of byte l), 8 signed scales per 16 elements. q - 32 is in [-32, 31]; times the scale
// (|sc| <= 128) it stays within int16 (4096), and a super-block's int32 lanes within
// 256 * 4096 * 127 < 2^31. Vectors are capped at 16 int16 lanes, so that the 16 elements of one
// scale fill a whole vector (on Zen 4 a 512-bit operation runs as two 256-bit halves anyway).
float DotQ6_K(const gguf::BlockQ6_K* b, int64_t nb, const int16_t* xq, const float* xs, int64_t ahead) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::RebindToUnsigned<decltype(d16)> du16;
  const size_t L = hn::Lanes(d16);
  const auto low4 = hn::Set(d16, int16_t{0xF});
  const auto low2 = hn::Set(d16, int16_t{3});
  const auto bias = hn::Set(d16, int16_t{32});
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  for (int64_t i = 0; i < nb; ++i) {
    const gguf::BlockQ6_K& blk = b[i];
    const char* bytes = reinterpret_cast<const char*>(b + i);
    hwy::Prefetch(bytes + ahead);
    hwy::Prefetch(bytes + ahead + 64);
    hwy::Prefetch(bytes + ahead + 128);
    hwy::Prefetch(bytes + ahead + 192);
    auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      const int8_t* sc = blk.scales + 8 * h;
      const int16_t* x = xq + i * 256 + 128 * h;
      for (size_t j = 0; j < 32; j += L) {
        const int is = static_cast<int>(j / 16);
        const auto a = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(du8, ql + j)));
        const auto c = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(du8, ql + 32 + j)));
        const auto hb = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(du8, qh + j)));
        const auto q1 = hn::Sub(hn::Or(hn::And(a, low4), hn::ShiftLeft<4>(hn::And(hb, low2))), bias);
        const auto q2 = hn::Sub(hn::Or(hn::And(c, low4), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), low2))), bias);
        const auto q3 = hn::Sub(hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), low2))), bias);
        const auto q4 = hn::Sub(hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb))), bias);
        s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(q1, hn::Set(d16, int16_t{sc[is]})), hn::LoadU(d16, x + j), s0, s1);
        s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(q2, hn::Set(d16, int16_t{sc[is + 2]})), hn::LoadU(d16, x + 32 + j), s0, s1);
        s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(q3, hn::Set(d16, int16_t{sc[is + 4]})), hn::LoadU(d16, x + 64 + j), s0, s1);
        s0 = hn::ReorderWidenMulAccumulate(d32, hn::Mul(q4, hn::Set(d16, int16_t{sc[is + 6]})), hn::LoadU(d16, x + 96 + j), s0, s1);
      }
    }
    const float scale = F16ToF32(blk.d) * xs[i];
    if (i & 1) acc1 = hn::MulAdd(hn::ConvertTo(df, hn::Add(s0, s1)), hn::Set(df, scale), acc1);
    else acc0 = hn::MulAdd(hn::ConvertTo(df, hn::Add(s0, s1)), hn::Set(df, scale), acc0);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
}

void GgufGemvRows(uint32_t type, const void* w, int64_t K, const int16_t* xq, const float* xs, const int16_t* bsum16,
                  float* y, int64_t n0, int64_t n1, int64_t ahead) {
  if (type == static_cast<uint32_t>(gguf::GgmlType::Q8_0)) {
    const int64_t nb = K / 32;
    const auto* rows = static_cast<const gguf::BlockQ8_0*>(w);
    for (int64_t n = n0; n < n1; ++n) y[n] = DotQ8_0(rows + n * nb, nb, xq, xs, ahead);
  } else if (type == static_cast<uint32_t>(gguf::GgmlType::Q4_K)) {
    const int64_t nb = K / 256;
    const auto* rows = static_cast<const gguf::BlockQ4_K*>(w);
    for (int64_t n = n0; n < n1; ++n) y[n] = DotK4(rows + n * nb, nb, xq, xs, bsum16, ahead);
  } else if (type == static_cast<uint32_t>(gguf::GgmlType::Q5_K)) {
    const int64_t nb = K / 256;
    const auto* rows = static_cast<const gguf::BlockQ5_K*>(w);
    for (int64_t n = n0; n < n1; ++n) y[n] = DotK4(rows + n * nb, nb, xq, xs, bsum16, ahead);
  } else {
    const int64_t nb = K / 256;
    const auto* rows = static_cast<const gguf::BlockQ6_K*>(w);
    for (int64_t n = n0; n < n1; ++n) y[n] = DotQ6_K(rows + n * nb, nb, xq, xs, ahead);
  }
}


// Prefill rows over weights already dequantized to f32 (GgufLinear, M >= kGgufPrefillRows): y[m, n]
// (+)= dot(x[m, :K], w[n, :K]) for n < nw, m < M. Register blocks of kRowsX rows of x by 4 weight
// rows: each load of x feeds 4 FMAs and each load of w kRowsX, so the loop is FMA-bound rather than
// load-bound (1 x 4 was: 42% of the f32 FMA peak in bench-model's MLP on Zen 4). 4 x 4 = 16
// accumulators fit AVX-512's 32 registers; AVX2's 16 take 2 x 4.
#if HWY_TARGET <= HWY_AVX3
constexpr int64_t kRowsX = 4;
#else
constexpr int64_t kRowsX = 2;
#endif

template <int64_t RX, int64_t RW>
HWY_INLINE void F32Block(const float* w, int64_t K, int64_t Kv, const float* x, int64_t ldx, float* y, int64_t ldy,
                         bool accumulate) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[RX][RW];
  for (int64_t i = 0; i < RX; ++i)
    for (int64_t j = 0; j < RW; ++j) acc[i][j] = hn::Zero(df);
  for (int64_t k = 0; k < Kv; k += L) {
    hn::Vec<decltype(df)> wv[RW];
    for (int64_t j = 0; j < RW; ++j) wv[j] = hn::LoadU(df, w + j * K + k);
    for (int64_t i = 0; i < RX; ++i) {
      const auto xv = hn::LoadU(df, x + i * ldx + k);
      for (int64_t j = 0; j < RW; ++j) acc[i][j] = hn::MulAdd(xv, wv[j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < RX; ++i)
    for (int64_t j = 0; j < RW; ++j) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[i][j]));
      for (int64_t k = Kv; k < K; ++k) s += x[i * ldx + k] * w[j * K + k];
      float& out = y[i * ldy + j];
      out = accumulate ? out + s : s;
    }
}

void GgufF32Tile(const float* w, int64_t nw, int64_t K, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
                 bool accumulate) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t Kv = K - K % L;
  int64_t m = 0;
  for (; m + kRowsX <= M; m += kRowsX) {
    int64_t n = 0;
    for (; n + 4 <= nw; n += 4) F32Block<kRowsX, 4>(w + n * K, K, Kv, x + m * ldx, ldx, y + m * ldy + n, ldy, accumulate);
    for (; n < nw; ++n) F32Block<kRowsX, 1>(w + n * K, K, Kv, x + m * ldx, ldx, y + m * ldy + n, ldy, accumulate);
  }
  for (; m < M; ++m) {
    int64_t n = 0;
    for (; n + 4 <= nw; n += 4) F32Block<1, 4>(w + n * K, K, Kv, x + m * ldx, ldx, y + m * ldy + n, ldy, accumulate);
    for (; n < nw; ++n) F32Block<1, 1>(w + n * K, K, Kv, x + m * ldx, ldx, y + m * ldy + n, ldy, accumulate);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hanpu::cpu {
HWY_EXPORT(GgufGemvRows);
HWY_EXPORT(GgufF32Tile);

#if HANPU_X86_KERNELS
namespace {

#define HANPU_GGUF_AVX2 __attribute__((target("avx2,fma,f16c")))
#define HANPU_GGUF_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

// The AVX2 forms (target attributes, chosen at run time as in linear_int8_dot.cpp; Highway 1.0.3
// has no u8 x i8 multiply-add). The weights stay bytes: VPMADDUBSW multiplies an unsigned byte
// operand by a signed one into int16 pairs, VPMADDWD sums pairs into int32 (by ones for Q8_0, by
// the sub-block scale for the K-quants). All integer sums are exact (bounds at each kernel), so the
// totals are those of the Highway forms above and the error bound is the same.
//
// Blocks per step. One row at a time, its blocks in address order (one sequential stream per
// thread, which the hardware prefetchers follow across rows), but several consecutive blocks per
// step: their int32 sums are folded into one vector by VPHADDD, so that the int -> f32 conversion,
// the gathering of the f16 scales (one VCVTPH2PS for all of the step's blocks), the multiply by the
// activation scales and the FMA run once per step instead of once per block, and the horizontal
// reduction once per row. Q8_0 takes 4 blocks of 32 per step: with one block, conversion, scale
// and FMA were about half of its vector work, and 4 sums fill one VPHADDD tree. Q6_K takes 2
// super-blocks of 256 (its per-block tail is a smaller part of the work; a super-block keeps a
// scale vector and an int32 sum in registers). Q4_K / Q5_K stay at one super-block per step (see
// K4RowDot: 2 measured slower). A row's tail of fewer blocks runs the same step with the missing
// blocks' terms zero. Rows are independent, so threaded results equal one thread's bit for bit.
//
// (A first form read 4 / 2 rows side by side per pass to share the activation loads instead: in
// cache it ran as fast, but from DRAM it lost 10-30% on Zen 3, because the hardware prefetchers
// do not follow several short streams of one row each (1 KiB per row at K = 1024) and the
// software prefetches alone cannot keep enough lines in flight.)
constexpr int kQ8Blocks = 4;
constexpr int kKBlocks = 2;  // Q6_K

// VPSHUFB controls that copy one int16 word of each 128-bit half into every word of that half:
// kScaleOf[j] word j of both halves (Q4_K / Q5_K: sub-block j's scale), kScalePairOf[k] word 2k in
// the low half and 2k + 1 in the high half (Q6_K: the two 16-element scales of a 32-element vector).
struct alignas(32) ByteShuffle {
  uint8_t b[32];
};
constexpr ByteShuffle WordBroadcast(int lo, int hi) {
  ByteShuffle s{};
  for (int i = 0; i < 32; ++i) s.b[i] = static_cast<uint8_t>(2 * (i < 16 ? lo : hi) + (i & 1));
  return s;
}
constexpr ByteShuffle kScaleOf[8] = {WordBroadcast(0, 0), WordBroadcast(1, 1), WordBroadcast(2, 2), WordBroadcast(3, 3),
                                     WordBroadcast(4, 4), WordBroadcast(5, 5), WordBroadcast(6, 6), WordBroadcast(7, 7)};
constexpr ByteShuffle kScalePairOf[4] = {WordBroadcast(0, 1), WordBroadcast(2, 3), WordBroadcast(4, 5), WordBroadcast(6, 7)};

HANPU_GGUF_AVX2_INLINE __m256i Shuffle(__m256i v, const ByteShuffle& s) {
  return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(s.b)));
}

using gguf_avx2::hsum8;  // the sum of 8 f32 lanes in a fixed tree

// Q8_0, 4 blocks per step. Per block: VPMADDUBSW of |w| by x with w's sign (= w x; |w| <= 128,
// |x| <= 127: a pair at most 2 * 128 * 127 = 32512, no saturation), VPMADDWD by ones into int32;
// a block's sum at most 32 * 128 * 127 < 2^24, so its conversion to f32 is exact. Then per step:
// the VPHADDD tree (block b's sum in lanes b and b + 4), one conversion, the 4 f16 scales in one
// VCVTPH2PS times the 4 activation scales, one FMA. Blocks past the row's end (nv < 4) count zero:
// d = 0 and activation scale 0 times a zero sum.
HANPU_GGUF_AVX2_INLINE void Q8_0Step(const uint8_t* row, int64_t i, int nv, const int8_t* x8, const float* xs,
                                     __m256& acc) {
  constexpr int64_t kB = sizeof(gguf::BlockQ8_0);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i q[kQ8Blocks];
  uint64_t d4 = 0;
  alignas(16) float s4[kQ8Blocks] = {0.f, 0.f, 0.f, 0.f};
  for (int b = 0; b < kQ8Blocks; ++b) {
    if (b >= nv) {
      q[b] = _mm256_setzero_si256();
      continue;
    }
    const uint8_t* blk = row + kB * (i + b);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8 + 32 * (i + b)));
    q[b] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), ones);
    uint16_t d;
    std::memcpy(&d, blk, 2);
    d4 |= uint64_t{d} << (16 * b);
    s4[b] = xs[i + b];
  }
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
  const __m128 s = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(d4))), _mm_load_ps(s4));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_set_m128(s, s), acc);
}

template <int kHint>
HANPU_GGUF_AVX2 float Q8_0Row(const uint8_t* row, int64_t nb, const int8_t* x8, const float* xs, int64_t ahead) {
  constexpr int64_t kB = sizeof(gguf::BlockQ8_0);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();  // alternate steps: their FMAs overlap
  int64_t i = 0;
  auto prefetch = [&](int64_t at) __attribute__((target("avx2"), always_inline)) {
    const char* p = reinterpret_cast<const char*>(row + kB * at + ahead);
    gguf_avx2::prefetch_lines<kHint, 3>(p);  // a step's 136 bytes: 3 lines per step cover the stream
  };
  for (; i + 2 * kQ8Blocks <= nb; i += 2 * kQ8Blocks) {
    prefetch(i);
    Q8_0Step(row, i, kQ8Blocks, x8, xs, acc0);
    prefetch(i + kQ8Blocks);
    Q8_0Step(row, i + kQ8Blocks, kQ8Blocks, x8, xs, acc1);
  }
  for (; i < nb; i += kQ8Blocks) Q8_0Step(row, i, static_cast<int>(std::min<int64_t>(kQ8Blocks, nb - i)), x8, xs, acc0);
  return hsum8(_mm256_add_ps(acc0, acc1));
}

// Q4_K / Q5_K's 8 six-bit scales and mins (ggml-common.h's get_scale_min_k4 for every j at once),
// byte j of each the value of sub-block j: bytes 0..3 hold the low 6 bits of scales 0..3, bytes
// 4..7 of mins 0..3, bytes 8..11 the low 4 bits of scales / mins 4..7, whose top 2 bits are the top
// bits of bytes 0..3 / 4..7. In general registers on purpose: the integer pipes are idle beside
// the vector loop, while the same decode in vector registers (two VPSHUFB, shifts and masks of the
// block's first 16 bytes) added to the vector pipes' work and was 10-18% slower on Zen 3, 5-10% with
// the decode moved one super-block ahead.
inline void K4ScalesMins(const uint8_t* scales, uint64_t& sc, uint64_t& m) {
  uint32_t w[3];
  std::memcpy(w, scales, 12);
  sc = uint64_t{w[0] & 0x3f3f3f3fu} | uint64_t{(w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u)} << 32;
  m = uint64_t{w[1] & 0x3f3f3f3fu} | uint64_t{((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u)} << 32;
}

// Q4_K / Q5_K, one super-block per step (2 per step, as Q6_K, measured slower here: 12.6 against
// 14.6-15.5 GB/s in cache on Zen 3, the two super-blocks' operands do not fit the registers). The
// nibbles stay bytes; VPMADDUBSW multiplies them (unsigned, at most 31) by the int8 activations
// into int16 pairs (at most 2 * 31 * 127 = 7874, no saturation), then VPMADDWD by the sub-block
// scale sums pairs into int32 (a lane of a super-block at most 8 * 2 * 7874 * 63 < 2^23: its
// conversion is exact). The 8 scales are widened once per super-block into a vector and each
// sub-block's is picked by one VPSHUFB (a general-register broadcast per sub-block before: 6-12%
// slower). Then one conversion and one FMA by d * s_x per super-block.
// The min term in integers, as llama.cpp's ggml_vec_dot_q4_K_q8_K: dmin * s_x * sum_j m_j B_j, B_j
// the sum of the int8 activations over sub-block j (the quantizer's bsum32), one 128-bit VPMADDWD
// of the 8 mins by the 8 sums (|m_j B_j| <= 63 * 32 * 127, a lane at most twice that), one
// conversion and one FMA in 4 f32 lanes. So the kernel computes the dot product of the
// dequantized weights with the quantized activations, min included. (Before: dmin * m_j times the
// f32 sum of the unquantized x, which leaves the min's share of each weight outside the activation
// rounding's cancellation; docs/GGUF.md has the error measured both ways.)
template <bool kQ5, int kHint>
HANPU_GGUF_AVX2 float K4RowDot(const void* blocks, int64_t nb, const int8_t* x8, const float* xs, const int16_t* bsum32,
                               int64_t ahead) {
  using Block = std::conditional_t<kQ5, gguf::BlockQ5_K, gguf::BlockQ4_K>;
  static_assert(offsetof(Block, d) == 0 && offsetof(Block, dmin) == 2, "d, dmin: one 32-bit load");
  const auto* b = static_cast<const Block*>(blocks);
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  __m128 min_acc = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const Block& blk = b[i];
    const char* bytes = reinterpret_cast<const char*>(b + i);
    gguf_avx2::prefetch_lines<kHint, kQ5 ? 4 : 3>(bytes + ahead);  // a block of 144 / 176 bytes: 3 / 4 lines
    uint64_t sc, m;
    K4ScalesMins(blk.scales, sc, m);
    const int8_t* x = x8 + i * 256;
    // the 8 scales as int16 in both 128-bit halves, for VPSHUFB
    const __m256i sv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    __m256i isum = _mm256_setzero_si256();
    __m256i hb = _mm256_setzero_si256();
    if constexpr (kQ5) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * c));
      __m256i lo = _mm256_and_si256(raw, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if constexpr (kQ5) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * c)), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * c + 1)), one), 4));
      }
      const __m256i p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 64 * c)));
      const __m256i p_hi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 64 * c + 32)));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p_lo, Shuffle(sv, kScaleOf[2 * c])));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p_hi, Shuffle(sv, kScaleOf[2 * c + 1])));
    }
    const __m128i msum = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(m))),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum32 + 8 * i)));
    uint32_t ddmin;  // d and dmin: one conversion, one multiply by s_x
    std::memcpy(&ddmin, &blk, 4);
    const __m128 s = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(ddmin))), _mm_broadcast_ss(xs + i));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcastss_ps(s), acc);
    min_acc = _mm_fmadd_ps(_mm_cvtepi32_ps(msum), _mm_permute_ps(s, 0x55), min_acc);  // dmin s_x
  }
  const __m128 mh = _mm_add_ps(min_acc, _mm_movehl_ps(min_acc, min_acc));
  return hsum8(acc) - _mm_cvtss_f32(_mm_add_ss(mh, _mm_movehdup_ps(mh)));
}

// Q6_K, 2 super-blocks per step (an odd last one: its copy's lanes scaled by zero). The 6-bit values q (0..63, before the -32) stay bytes (gguf_avx2.hpp's
// unpack, shared with the prefill); VPMADDUBSW by the int8 activations gives int16 pairs (at most
// 2 * 63 * 127 = 16002), VPMADDWD by the signed 16-element scales sums them into int32 (one
// 32-byte vector spans two scales, low and high 128 bits: one VPSHUFB of the row's 16 scales,
// widened once per super-block). The -32 is applied once per super-block as 32 * sum_g sc_g *
// (sum of the int8 activations over group g), from the per-16 sums the quantizer stores. A lane
// holds at most 8 * 2 * 16002 * 128 + 2 * 32 * 128 * 2032 < 2^26 before VPHADDD, 2^27 after: exact
// integers, whose conversion to f32 may round once (as the Highway form's 2^31 lanes; the test's
// bound counts one rounding for it).
template <int kHint>
HANPU_GGUF_AVX2 float Q6RowDot(const uint8_t* row, int64_t nb, const int8_t* x8, const int16_t* bsum16, const float* xs,
                               int64_t ahead) {
  constexpr int64_t kB = sizeof(gguf::BlockQ6_K);
  static_assert(kKBlocks == 2, "the lane pick below is VPHADDD's order for 2 super-blocks");
  const __m256i pick = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);  // [d0, d1], [xs0, xs1] -> lanes
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i += kKBlocks) {
    const bool two = i + 1 < nb;
    __m256i isum[kKBlocks];
    uint32_t dd = 0;
    for (int r = 0; r < kKBlocks; ++r) {
      const int64_t ib = two ? i + r : i;
      const int8_t* x = x8 + 256 * ib;
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsum16 + 16 * ib));
      const gguf::BlockQ6_K& blk = *reinterpret_cast<const gguf::BlockQ6_K*>(row + kB * ib);
      const char* p = reinterpret_cast<const char*>(row + kB * ib + ahead);
      gguf_avx2::prefetch_lines<kHint, 4>(p);  // 210 bytes: at most 4 lines
      dd |= uint32_t{blk.d} << (16 * r);
      // the 16 scales in element order as int16: sc0..7 | sc8..15; half h uses 8h..8h+7 in both halves
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
      // - 32 * sum_g sc_g * bsum_g over the 16 groups
      __m256i s = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
      for (int h = 0; h < 2; ++h) {
        const __m256i sh = h == 0 ? _mm256_permute4x64_epi64(sc16, 0x44) : _mm256_permute4x64_epi64(sc16, 0xEE);
        __m256i q[4];
        gguf_avx2::q6k_unpack_half(blk.ql + 64 * h, blk.qh + 32 * h, q);
        for (int k = 0; k < 4; ++k) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 128 * h + 32 * k));
          s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), Shuffle(sh, kScalePairOf[k])));
        }
      }
      isum[r] = s;
    }
    const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dd))));
    const __m256 xs2 = _mm256_castps128_ps256(_mm_setr_ps(xs[i], two ? xs[i + 1] : 0.f, 0.f, 0.f));
    const __m256 s = _mm256_mul_ps(_mm256_permutevar8x32_ps(f, pick), _mm256_permutevar8x32_ps(xs2, pick));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(isum[0], isum[1])),
                          two ? s : _mm256_blend_ps(s, _mm256_setzero_ps(), 0xCC), acc);
  }
  return hsum8(acc);
}




// kHint: the software prefetches' level (decode_prefetch_l2).
template <int kHint>
void GemvRowsAvx2Hint(gguf::GgmlType t, const uint8_t* base, int64_t row_bytes, int64_t K, const GgufActivations& x,
                      const int8_t* x8, const float* xs, float* y, int64_t n0, int64_t n1, int64_t ahead) {
  switch (t) {
    case gguf::GgmlType::Q8_0:
      for (int64_t n = n0; n < n1; ++n) y[n] = Q8_0Row<kHint>(base + n * row_bytes, K / 32, x8, xs, ahead);
      break;
    case gguf::GgmlType::Q4_K:
      for (int64_t n = n0; n < n1; ++n)
        y[n] = K4RowDot<false, kHint>(base + n * row_bytes, K / 256, x8, xs, x.bsum32.data(), ahead);
      break;
    case gguf::GgmlType::Q5_K:
      for (int64_t n = n0; n < n1; ++n)
        y[n] = K4RowDot<true, kHint>(base + n * row_bytes, K / 256, x8, xs, x.bsum32.data(), ahead);
      break;
    default:  // Q6_K
      for (int64_t n = n0; n < n1; ++n) y[n] = Q6RowDot<kHint>(base + n * row_bytes, K / 256, x8, x.bsum16.data(), xs, ahead);
      break;
  }
}

void GemvRowsAvx2(gguf::GgmlType t, const void* w, int64_t K, const GgufActivations& x, float* y, int64_t n0, int64_t n1,
                  int64_t ahead) {
  const int64_t row_bytes = K / gguf::block_format(t).block_elems * gguf::block_format(t).block_bytes;
  const auto* base = static_cast<const uint8_t*>(w);
  const int8_t* x8 = x.q8.data();
  const float* xs = x.scale.data();
  if (decode_prefetch_l2())
    GemvRowsAvx2Hint<_MM_HINT_T1>(t, base, row_bytes, K, x, x8, xs, y, n0, n1, ahead);
  else
    GemvRowsAvx2Hint<_MM_HINT_T0>(t, base, row_bytes, K, x, x8, xs, y, n0, n1, ahead);
}

}  // namespace

// AVX2 (plain AVX2 + FMA + F16C instructions) whenever the selected Highway target is AVX2 or
// better, as linear_int8_dot.cpp's chosen_form.
bool gguf_avx2_forms_allowed() {
  static const bool cpu = [] {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;  // (clang's builtin has no "f16c")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  const IsaSelection& isa = isa_selection();
  return cpu && (isa.native || isa.target == "AVX2" || isa.target.rfind("AVX3", 0) == 0);
}
#else
bool gguf_avx2_forms_allowed() { return false; }
#endif

int64_t gguf_activation_block(gguf::GgmlType t) {
  return t == gguf::GgmlType::Q8_0 || gguf::block_format(t).block_elems == 32 ? 32 : 256;
}

void gguf_quantize_activation_row(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale, float* sum_out,
                                  int16_t* bsum16) {
#if HANPU_X86_KERNELS
  if (gguf_avx2_forms_allowed()) {
    gguf_avx2::quantize_activation_row(x, K, block, q8, scale, sum_out, bsum16);
    return;
  }
#endif
  gguf_quantize_activation_row_scalar(x, K, block, q8, scale, sum_out, bsum16);
}

void gguf_quantize_activation_row_scalar(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale,
                                         float* sum_out, int16_t* bsum16) {
  for (int64_t s = 0; s < K / 32; ++s) {
    // The f32 sum of 32 in the AVX2 form's tree order (the same bits on every target): lanes
    // l = 0..7 of (x_l + x_l+8) + (x_l+16 + x_l+24), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
    const float* xs = x + s * 32;
    float l[8];
    for (int j = 0; j < 8; ++j) l[j] = (xs[j] + xs[j + 8]) + (xs[j + 16] + xs[j + 24]);
    sum_out[s] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  }
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t j = 0; j < block; ++j) {
      amax = std::max(amax, std::abs(xb[j]));
      finite = finite && std::isfinite(xb[j]);
    }
    if (!finite) {  // a NaN or inf activation: the block's scale is NaN, so every output is NaN
      std::fill(q8 + b * block, q8 + (b + 1) * block, int8_t{0});
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    // Q8_0's rule (ggml-quants.c quantize_row_q8_0_ref), the scale kept in f32.
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    // A block of subnormal activations (amax below ~127 / FLT_MAX) makes 1 / d overflow to inf; then
    // x / d (at most 127 in magnitude) instead of x * inf (a libFuzzer finding: inf converted to int16).
    const bool reciprocal = std::isfinite(id);
    for (int64_t j = 0; j < block; ++j)
      q8[b * block + j] = static_cast<int8_t>(std::roundf(reciprocal ? xb[j] * id : xb[j] / d));
    scale[b] = d;
  }
  for (int64_t g = 0; g < K / 16; ++g) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += q8[g * 16 + j];
    bsum16[g] = static_cast<int16_t>(sum);  // |sum| <= 16 * 127
  }
}

void gguf_quantize_activations(const float* x, int64_t K, int64_t block, GgufActivations& out) {
  if ((block != 32 && block != 256) || K <= 0 || K % block != 0)
    throw Error("gguf_quantize_activations: K = " + std::to_string(K) + " is not a positive multiple of the block " +
                std::to_string(block) + " (32 or 256)");
  out.K = K;
  out.block = block;
  out.q.resize(static_cast<size_t>(K));
  out.q8.resize(static_cast<size_t>(K));
  out.bsum16.resize(static_cast<size_t>(K / 16));
  out.bsum32.resize(static_cast<size_t>(K / 32));
  out.scale.resize(static_cast<size_t>(K / block));
  out.sum.resize(static_cast<size_t>(K / 32));
  gguf_quantize_activation_row(x, K, block, out.q8.data(), out.scale.data(), out.sum.data(), out.bsum16.data());
  for (int64_t j = 0; j < K / 32; ++j)  // |sum| <= 32 * 127
    out.bsum32[static_cast<size_t>(j)] = static_cast<int16_t>(out.bsum16[static_cast<size_t>(2 * j)] + out.bsum16[static_cast<size_t>(2 * j + 1)]);
  for (int64_t k = 0; k < K; ++k) out.q[static_cast<size_t>(k)] = out.q8[static_cast<size_t>(k)];
}

// The calling thread's quantized activations, kept between calls: a token's decode calls the GEMV
// for every projection, and allocating the five arrays each time was measurable on small ones.
static GgufActivations& decode_activations() {
  thread_local GgufActivations xa;
  return xa;
}

bool gguf_gemv_supported(gguf::GgmlType t) {
  return t == gguf::GgmlType::Q8_0 || t == gguf::GgmlType::Q4_K || t == gguf::GgmlType::Q5_K ||
         t == gguf::GgmlType::Q6_K || gguf_small_block_type(t);
}

void gguf_gemv_rows(gguf::GgmlType t, const void* w, int64_t K, const GgufActivations& x, float* y, int64_t n0,
                    int64_t n1) {
  if (!gguf_gemv_supported(t))
    throw Error(std::string("gguf_gemv: no kernel for GGML type ") + gguf::block_format(t).name);
  const int64_t be = gguf::block_format(t).block_elems;
  if (K <= 0 || K % be != 0 || x.K != K || x.block != gguf_activation_block(t))
    throw Error("gguf_gemv: K = " + std::to_string(K) + " (activations " + std::to_string(x.K) + " in blocks of " +
                std::to_string(x.block) + ") is not a positive multiple of " + std::to_string(be) +
                " or the activations are not quantized for " + gguf::block_format(t).name);
  if (gguf_small_block_type(t)) return gguf_small_block_gemv_rows(t, w, K, x, y, n0, n1);
#if HANPU_X86_KERNELS
  if (gguf_avx2_forms_allowed()) {
    GemvRowsAvx2(t, w, K, x, y, n0, n1, decode_prefetch_bytes());
    return;
  }
#endif
  HANPU_DISPATCH(GgufGemvRows)(static_cast<uint32_t>(t), w, K, x.q.data(), x.scale.data(), x.bsum16.data(), y, n0, n1,
                               decode_prefetch_bytes());
}



}  // namespace hanpu::cpu

namespace hanpu {

using namespace cpu;  // the kernels above: gguf_gemv_rows, the thresholds, the workspace slots

static_assert(kGgufPrefillRows == 4, "hanpu/linear.hpp documents GgufLinear's decode rows as M < 4");

GgufLinear::GgufLinear(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, std::string name, GgufLayout layout)
    : layout_(layout), type_(t), format_(WeightFormat::kQ8_0), blocks_(blocks), N_(N), K_(K), name_(std::move(name)) {
  const gguf::BlockFormat& bf = gguf::block_format(t);
  const std::optional<WeightFormat> f = weight_format_of_ggml(t);
  if (!bf.dequantize || !f || weight_format_info(*f).block_elems == 1)
    throw Error(name_ + ": GGML type " + bf.name + " is not a block format GgufLinear runs (F32/F16/BF16 weights take "
                "F32Linear / F16Linear / Bf16Linear)");
  format_ = *f;
  if (N <= 0 || K <= 0 || K % bf.block_elems != 0)
    throw Error(name_ + ": shape [" + std::to_string(N) + ", " + std::to_string(K) + "] is not rows of whole " + bf.name +
                " blocks of " + std::to_string(bf.block_elems));
  row_bytes_ = K / bf.block_elems * bf.block_bytes;
  if (layout_ == GgufLayout::kRowLanes && !gguf_row_lanes_available(t, N))
    throw Error(name_ + ": the row-lane layout needs Q4_K, at least 8 rows and the AVX2 forms (got " + bf.name + ", " +
                std::to_string(N) + " rows" + (gguf_avx2_forms_allowed() ? "" : ", AVX2 forms not allowed here") + ")");
}

bool GgufLinear::row_lanes_available(gguf::GgmlType t, int64_t N) { return gguf_row_lanes_available(t, N); }

size_t GgufLinear::row_lanes_bytes(gguf::GgmlType t, int64_t N, int64_t K) {
  if (!gguf_row_lanes_available(t, N))
    throw Error(std::string("GgufLinear::row_lanes_bytes: no row-lane layout for ") + gguf::block_format(t).name + " [" +
                std::to_string(N) + ", " + std::to_string(K) + "] here");
  return gguf_row_lanes_bytes(t, N, K);
}

void GgufLinear::pack_row_lanes(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, void* out) {
  (void)row_lanes_bytes(t, N, K);  // the checks
  gguf_pack_row_lanes(t, blocks, N, K, out);
}

bool GgufLinear::prefill_is_integer() const { return !prefill_is_amx() && gguf_use_int_prefill(type_, prefill_); }
bool GgufLinear::prefill_is_amx() const { return gguf_use_amx_prefill(type_, prefill_); }

size_t GgufLinear::bytes() const {  // what a decode row streams
  return layout_ == GgufLayout::kRowLanes ? gguf_row_lanes_bytes(type_, N_, K_) : static_cast<size_t>(N_ * row_bytes_);
}

// Decode rows: a projection's rows go to the threads in chunks taken from a shared counter,
// largest first (guided: a chunk is the units left over twice the threads, and at least
// kGgufDecodeChunkBytes of weights), so a thread that starts late or streams slower takes fewer
// rows instead of keeping the other waiting at the end of the pass (an even split left the pool's
// wait at 5% of a 2-thread decode's samples on the AVX-512 Xeon). Units are rows on the file's
// layout and groups of 8 rows on row lanes (the N % 8 rows past the last group with the last
// group). Every row is computed as in any other split (rows are independent; accumulate adds y
// in slices of 256 rows, each row once), so the results do not depend on who took which chunk.
constexpr int64_t kGgufDecodeChunkBytes = 16384;

static int64_t gguf_decode_units(GgufLayout layout, int64_t N) { return layout == GgufLayout::kRowLanes ? N / 8 : N; }

static int64_t gguf_decode_min_units(GgufLayout layout, int64_t row_bytes) {
  const int64_t unit = layout == GgufLayout::kRowLanes ? 8 * row_bytes : row_bytes;
  return std::max<int64_t>(1, kGgufDecodeChunkBytes / std::max<int64_t>(unit, 1));
}

// Takes the next chunk [u0, u1) of `units` from `next`; false when none is left.
static bool gguf_decode_claim(std::atomic<int64_t>& next, int64_t units, int64_t min_units, int nt, int64_t& u0,
                              int64_t& u1) {
  int64_t cur = next.load(std::memory_order_relaxed);
  for (;;) {
    if (cur >= units) return false;
    const int64_t left = units - cur;
    const int64_t take = std::min(left, std::max(min_units, left / (2 * static_cast<int64_t>(nt))));
    if (next.compare_exchange_weak(cur, cur + take, std::memory_order_relaxed)) {
      u0 = cur;
      u1 = cur + take;
      return true;
    }
  }
}

// Units [u0, u1) of a projection's decode rows into yr (the row's output, from row 0).
static void gguf_decode_units_run(gguf::GgmlType t, GgufLayout layout, const uint8_t* w, int64_t N, int64_t K,
                                  int64_t row_bytes, const GgufActivations& xa, float* yr, int64_t u0, int64_t u1,
                                  bool accumulate) {
  if (layout == GgufLayout::kRowLanes) {
    const int64_t n0 = u0 * 8, n1 = u1 == N / 8 ? N : u1 * 8;
    if (!accumulate) {
      gguf_gemv_row_lanes(t, w, N, K, xa, yr + n0, n0, n1);
      return;
    }
    float part[256];
    for (int64_t b = n0; b < n1; b += 256) {
      const int64_t e = n1 - b <= 256 ? n1 : b + 256;  // b stays a multiple of 8 until the last slice
      gguf_gemv_row_lanes(t, w, N, K, xa, part, b, e);
      for (int64_t n = b; n < e; ++n) yr[n] += part[n - b];
    }
    return;
  }
  const int64_t n0 = u0, n1 = u1;
  if (!accumulate) {
    gguf_gemv_rows(t, w, K, xa, yr, n0, n1);
    return;
  }
  float part[256];  // a slice of rows at a time, added into y
  for (int64_t b = n0; b < n1; b += 256) {
    const int64_t e = std::min<int64_t>(n1, b + 256);
    gguf_gemv_rows(t, w + b * row_bytes, K, xa, part, 0, e - b);
    for (int64_t n = b; n < e; ++n) yr[n] += part[n - b];
  }
}

void GgufLinear::decode_rows(Engine& engine, const GgufLinear* const* parts, const int64_t* cols, size_t count,
                             int64_t block, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int nt,
                             bool accumulate) {
  const int64_t K = parts[0]->K_;
  GgufActivations& xa = decode_activations();  // this thread's: the workers read it by reference
  for (int64_t m = 0; m < M; ++m) {
    gguf_quantize_activations(x + m * ldx, K, block, xa);
    float* yr = y + m * ldy;
    // Every thread takes chunks of part 0 until none is left, then of part 1, and so on.
    std::vector<std::atomic<int64_t>> next(count);
    int64_t units = 0;
    for (size_t i = 0; i < count; ++i) {
      next[i].store(0, std::memory_order_relaxed);
      units += gguf_decode_units(parts[i]->layout_, parts[i]->N_);
    }
    engine.impl().run(static_cast<int>(std::clamp<int64_t>(nt, 1, units)), [&](int, Workspace&) {
      for (size_t i = 0; i < count; ++i) {
        const GgufLinear& l = *parts[i];
        const int64_t n_units = gguf_decode_units(l.layout_, l.N_), min_units = gguf_decode_min_units(l.layout_, l.row_bytes_);
        for (int64_t u0, u1; gguf_decode_claim(next[i], n_units, min_units, nt, u0, u1);)
          gguf_decode_units_run(l.type_, l.layout_, static_cast<const uint8_t*>(l.blocks_), l.N_, K, l.row_bytes_, xa,
                                yr + cols[i], u0, u1, accumulate);
      }
    });
  }
}

bool GgufLinear::forward_decode_parts(Engine& engine, const std::vector<const GgufLinear*>& parts,
                                      const std::vector<int64_t>& cols, const float* x, int64_t ldx, float* y, int64_t ldy,
                                      int64_t M, int threads, bool accumulate) {
  if (M <= 0 || M >= kGgufPrefillRows || parts.size() < 2 || cols.size() != parts.size()) return false;
  const int64_t K = parts[0]->K_;
  const int64_t block = gguf_gemv_supported(parts[0]->type_) ? gguf_activation_block(parts[0]->type_) : 0;
  for (const GgufLinear* l : parts)
    if (l->K_ != K || !gguf_gemv_supported(l->type_) || gguf_activation_block(l->type_) != block) return false;
  decode_rows(engine, parts.data(), cols.data(), parts.size(), block, x, ldx, y, ldy, M, std::max(1, threads), accumulate);
  return true;
}

void GgufLinear::forward(Engine& engine, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                         bool accumulate) const {
  if (M <= 0) return;
  const int nt = std::max(1, threads);
  const auto* w = static_cast<const uint8_t*>(blocks_);
  if (M < kGgufPrefillRows && (layout_ == GgufLayout::kRowLanes || gguf_gemv_supported(type_))) {
    // Decode rows: the blocks streamed once per row, activations quantized as llama.cpp's
    // (linear_gguf.hpp); on row lanes the groups of 8 rows split over the threads.
    const GgufLinear* self = this;
    const int64_t col = 0;
    decode_rows(engine, &self, &col, 1, layout_ == GgufLayout::kRowLanes ? 256 : gguf_activation_block(type_), x, ldx,
                y, ldy, M, nt, accumulate);
    return;
  }
  if (gguf_use_amx_prefill(type_, prefill_, M)) {
    // Prefill on AMX: weight tiles dequantized to bf16 on the fly (linear_gguf_amx.cpp).
    gguf_prefill_amx(engine, type_, blocks_, N_, K_, x, ldx, y, ldy, M, nt, accumulate, layout_ == GgufLayout::kRowLanes,
                     gguf_amx_terms());
    return;
  }
  if (gguf_use_int_prefill(type_, prefill_)) {
    // Prefill on integer dot products over activations quantized once (linear_gguf_prefill.cpp).
    gguf_prefill_int(engine, type_, blocks_, N_, K_, x, ldx, y, ldy, M, nt, accumulate, layout_ == GgufLayout::kRowLanes);
    return;
  }
  // Prefill (or a type without a GEMV kernel): tiles of kGgufTileRows weight rows dequantized to
  // f32 exactly (gguf::dequantize) into the worker's scratch, then f32 dot products with every row of
  // x. The activations stay f32: the only error is the weights' format.
  const int64_t tiles = (N_ + kGgufTileRows - 1) / kGgufTileRows;
  const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, tiles));
  engine.impl().run(parts, [&](int p, Workspace& ws) {
    float* tile = ws.get<float>(kLinearPanel, static_cast<size_t>(kGgufTileRows * K_));
    for (int64_t t = tiles * p / parts; t < tiles * (p + 1) / parts; ++t) {
      const int64_t n0 = t * kGgufTileRows, nw = std::min<int64_t>(kGgufTileRows, N_ - n0);
      const uint8_t* rows = w + n0 * row_bytes_;
      if (layout_ == GgufLayout::kRowLanes) {  // the tile's rows back in the file's layout first
        thread_local std::vector<uint8_t> file_rows;
        file_rows.resize(static_cast<size_t>(nw * row_bytes_));
        gguf_unpack_row_lanes(type_, blocks_, N_, K_, n0, n0 + nw, file_rows.data());
        rows = file_rows.data();
      }
      gguf::dequantize(type_, rows, tile, nw * K_);
      // Rows of x in blocks of kGgufRowBlock so that a block of x stays in L2 across the tile's rows.
      for (int64_t m0 = 0; m0 < M; m0 += kGgufRowBlock)
        HANPU_DISPATCH(GgufF32Tile)(tile, nw, K_, x + m0 * ldx, ldx, std::min<int64_t>(kGgufRowBlock, M - m0),
                                    y + m0 * ldy + n0, ldy, accumulate);
    }
  });
}
}  // namespace hanpu
#endif  // HWY_ONCE
