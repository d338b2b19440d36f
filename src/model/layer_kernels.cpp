// SIMD kernels of the layer glue every block uses (Highway, compiled per target and dispatched at run
// time): rows of RMSNorm, SiLU/sigmoid gating, and the block kernel of causal attention.
//
// Attention block (attention_rows): R query rows that share one KV head (the GQA group of a few
// tokens) against that head's keys and values, in three passes:
//   1. scores S = Q K^T tile by tile over the transposed keys (tiles of [hd][2N] keys, contiguous,
//      made once per call): 8 query rows (6 on AVX2/SSE4) x 2 vectors of keys accumulate in 16 (12)
//      registers with one broadcast of q[r][d] per row and two loads per d (a register-blocked
//      GEMM, no horizontal sums);
//   2. softmax per row in place, exact (max, exp, sum), zeros past the row's causal limit;
//   3. O = P V: 8 (6) rows x 2 vectors of value dims accumulate over the keys, one broadcast of
//      P[r][j] per row and two loads per key from V blocked as [dims/2N][keys][2N] (contiguous).
// Both blocked layouts turn the per-key row jumps of the cache layout (a page every few keys,
// measured as the main stall) into sequential reads.
// 8-row blocks halve the K^T and V traffic of 4-row blocks (measured: the 4-row kernel stalled
// on those loads).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/layer_kernels.hpp"
#include "hanpu/isa.hpp"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/layer_kernels.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace hanpu::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

HWY_INLINE VF Sigmoid(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(x))));
}

HWY_INLINE float SumSquares(const float* HWY_RESTRICT x, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF v = hn::LoadU(d, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

void RmsNormRow(const float* HWY_RESTRICT x, float* HWY_RESTRICT out, size_t n, const float* HWY_RESTRICT scale,
                float eps) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const float inv = 1.0f / std::sqrt(SumSquares(x, n) / static_cast<float>(n) + eps);
  const VF vinv = hn::Set(d, inv);
  size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vinv), hn::LoadU(d, scale + i)), d, out + i);
  for (; i < n; ++i) out[i] = x[i] * inv * scale[i];
}

void SiluMulRow(float* HWY_RESTRICT g, const float* HWY_RESTRICT u, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF x = hn::LoadU(d, g + i);
    hn::StoreU(hn::Mul(hn::Mul(x, Sigmoid(d, x)), hn::LoadU(d, u + i)), d, g + i);
  }
  for (; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void SiluRow(float* HWY_RESTRICT y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF x = hn::LoadU(d, y + i);
    hn::StoreU(hn::Mul(x, Sigmoid(d, x)), d, y + i);
  }
  for (; i < n; ++i) y[i] = y[i] / (1.0f + std::exp(-y[i]));
}

// The index std::max_element gives (the first element no other is greater than, by operator<):
// the maximum of the non-NaN values in vectors (NaN lanes as -inf), then the first element equal
// to it. A NaN at index 0 is std::max_element's answer (nothing compares greater than it); a NaN
// elsewhere is never chosen, as there. Greedy decoding takes it over the vocabulary every token:
// std::max_element's loop carries each comparison through the last maximum's load, ~0.3-0.8 ms
// per 248K logits on the AVX-512 Xeon, one to three percent of a 0.8B Q4_K_M token.
size_t ArgmaxRow(const float* HWY_RESTRICT x, size_t n) {
  if (n == 0 || std::isnan(x[0])) return 0;
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto clean = [&](VF v) { return hn::IfThenElse(hn::IsNaN(v), ninf, v); };
  VF m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;  // four chains: the Max latency hidden
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    m0 = hn::Max(m0, clean(hn::LoadU(d, x + i)));
    m1 = hn::Max(m1, clean(hn::LoadU(d, x + i + N)));
    m2 = hn::Max(m2, clean(hn::LoadU(d, x + i + 2 * N)));
    m3 = hn::Max(m3, clean(hn::LoadU(d, x + i + 3 * N)));
  }
  float best = hn::GetLane(hn::MaxOfLanes(d, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));
  for (; i < n; ++i)
    if (x[i] > best) best = x[i];  // false for NaN
  const VF vb = hn::Set(d, best);
  size_t j = 0;
  for (; j + N <= n; j += N) {
    const intptr_t lane = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, x + j), vb));
    if (lane >= 0) return j + static_cast<size_t>(lane);
  }
  for (; j < n; ++j)
    if (x[j] == best) return j;
  return 0;  // unreachable: best is one of the elements
}

void SigmoidMulRow(float* HWY_RESTRICT o, const float* HWY_RESTRICT g, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, o + i), Sigmoid(d, hn::LoadU(d, g + i))), d, o + i);
  for (; i < n; ++i) o[i] *= 1.0f / (1.0f + std::exp(-g[i]));
}

void GatedNormRow(float* HWY_RESTRICT o, const float* HWY_RESTRICT z, const float* HWY_RESTRICT w, size_t n, float eps) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const float inv = 1.0f / std::sqrt(SumSquares(o, n) / static_cast<float>(n) + eps);
  const VF vinv = hn::Set(d, inv);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF normed = hn::Mul(hn::Mul(hn::LoadU(d, o + i), vinv), hn::LoadU(d, w + i));
    const VF zz = hn::LoadU(d, z + i);
    hn::StoreU(hn::Mul(normed, hn::Mul(zz, Sigmoid(d, zz))), d, o + i);
  }
  for (; i < n; ++i) o[i] = (o[i] * inv * w[i]) * (z[i] / (1.0f + std::exp(-z[i])));
}

void ConvSiluRow(const float* const* in, const float* HWY_RESTRICT taps, size_t tap_stride, size_t K,
                 float* HWY_RESTRICT y, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + N <= n; c += N) {
    VF acc = hn::Mul(hn::LoadU(d, taps + c), hn::LoadU(d, in[0] + c));
    for (size_t j = 1; j < K; ++j) acc = hn::MulAdd(hn::LoadU(d, taps + j * tap_stride + c), hn::LoadU(d, in[j] + c), acc);
    hn::StoreU(hn::Mul(acc, Sigmoid(d, acc)), d, y + c);
  }
  for (; c < n; ++c) {
    float acc = taps[c] * in[0][c];
    for (size_t j = 1; j < K; ++j) acc += taps[j * tap_stride + c] * in[j][c];
    y[c] = acc / (1.0f + std::exp(-acc));
  }
}

// ConvSiluRow for inputs and output in f32 or bf16 (simd_conv_silu_row_mixed). bf16 rows widen
// exactly (a shift); a bf16 output is rounded to nearest even once. The sigmoid's division is an
// approximate reciprocal refined by one Newton step on x86 (relative error a few ulp of f32, against
// the 10-cycle-per-vector divide that was 40% of ConvSiluRow's time on AVX-512); its exp argument is
// clamped at 80 so that 1 + e stays finite and its reciprocal normal: below -80 the output is
// acc / (1 + e^80), within 1e-33 |acc| of silu(acc).
HWY_INLINE VF LoadWidened(DF d, const float* f, const uint16_t* b, size_t c) {
  if (f != nullptr) return hn::LoadU(d, f + c);
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, b + c))));
}

HWY_INLINE VF SiluFast(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF den = hn::Add(one, hn::Exp(d, hn::Min(hn::Neg(x), hn::Set(d, 80.0f))));
#if HWY_ARCH_X86
  // rcp14 (AVX-512) or rcpps (12 bits) and a Newton step: 2^-22 or better.
  VF r = hn::ApproximateReciprocal(den);
  r = hn::Mul(r, hn::NegMulAdd(den, r, hn::Set(d, 2.0f)));  // r (2 - den r)
  return hn::Mul(x, r);
#else
  return hn::Div(x, den);  // NEON's estimate has 8 bits: one step would leave 2^-16
#endif
}

HWY_INLINE uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void ConvSiluRowMixed(const float* const* in_f32, const uint16_t* const* in_bf16, const float* HWY_RESTRICT taps,
                      size_t tap_stride, size_t K, float* HWY_RESTRICT y_f32, uint16_t* HWY_RESTRICT y_bf16,
                      size_t n) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + N <= n; c += N) {
    VF acc = hn::Mul(hn::LoadU(d, taps + c), LoadWidened(d, in_f32[0], in_bf16[0], c));
    for (size_t j = 1; j < K; ++j)
      acc = hn::MulAdd(hn::LoadU(d, taps + j * tap_stride + c), LoadWidened(d, in_f32[j], in_bf16[j], c), acc);
    const VF out = SiluFast(d, acc);
    if (y_f32 != nullptr) {
      hn::StoreU(out, d, y_f32 + c);
    } else {
      const auto u = hn::BitCast(du, out);
      const auto rounded =
          hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)))));
      const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(out)),
                                       hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u)), rounded);
      // Values are < 2^16 after the shift: the signed-to-unsigned demotion is exact.
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, y_bf16 + c);
    }
  }
  for (; c < n; ++c) {
    auto at = [&](size_t j) {
      if (in_f32[j] != nullptr) return in_f32[j][c];
      const uint32_t u = static_cast<uint32_t>(in_bf16[j][c]) << 16;
      float x;
      std::memcpy(&x, &u, sizeof x);
      return x;
    };
    float acc = taps[c] * at(0);
    for (size_t j = 1; j < K; ++j) acc += taps[j * tap_stride + c] * at(j);
    const float out = acc / (1.0f + std::exp(std::min(-acc, 80.0f)));
    if (y_f32 != nullptr) {
      y_f32[c] = out;
    } else {
      y_bf16[c] = Bf16Bits(out);
    }
  }
}

size_t AttentionKeyTile() { return 2 * hn::Lanes(DF()); }

// Scores of kQuad rows against one tile of 2N keys of the transposed keys (row i = dim i, stride
// ld): kQuad rows x 2 vectors of accumulators, per dimension 2 key loads and kQuad broadcasts.
// Rows per register block: with two vectors of keys (or value dims) per row, 2 x rows accumulators
// plus two operand loads and one broadcast must fit the register file. 8 rows (16 accumulators) on
// targets with 32 vector registers (AVX-512, NEON); 6 (12) on x86's 16-register targets, where 8
// rows spilled accumulators to the stack in every step of the inner loop.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kQuad = 6;
#else
constexpr size_t kQuad = 8;
#endif
size_t AttentionRowBlock() { return kQuad; }
HWY_INLINE void ScoreTile(const float* const* q, const float* HWY_RESTRICT kt, size_t ld, size_t hd, float* const* s) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc[kQuad][2];
  for (size_t r = 0; r < kQuad; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
  for (size_t i = 0; i < hd; ++i) {
    const VF k0 = hn::LoadU(d, kt + i * ld), k1 = hn::LoadU(d, kt + i * ld + N);
    for (size_t r = 0; r < kQuad; ++r) {
      const VF b = hn::Set(d, q[r][i]);
      acc[r][0] = hn::MulAdd(b, k0, acc[r][0]);
      acc[r][1] = hn::MulAdd(b, k1, acc[r][1]);
    }
  }
  for (size_t r = 0; r < kQuad; ++r) {
    hn::StoreU(acc[r][0], d, s[r]);
    hn::StoreU(acc[r][1], d, s[r] + N);
  }
}

// out[r][o .. o + NV*N) = sum over j < keys of p[r][j] * (v + j * ld)[0 .. NV*N), for RB rows: the
// RB x NV sums stay in registers over all keys (the prefill's PV blocks and decode's value sums).
template <size_t RB, size_t NV>
HWY_INLINE void WeightedRowSums(const float* const* p, const float* HWY_RESTRICT v, size_t ld, size_t keys,
                                float* const* out, size_t o) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc[RB][NV];
  for (size_t r = 0; r < RB; ++r)
    for (size_t b = 0; b < NV; ++b) acc[r][b] = hn::Zero(d);
  for (size_t j = 0; j < keys; ++j) {
    const float* vr = v + j * ld;
    VF vv[NV];
    for (size_t b = 0; b < NV; ++b) vv[b] = hn::LoadU(d, vr + b * N);
    for (size_t r = 0; r < RB; ++r) {
      const VF pb = hn::Set(d, p[r][j]);
      for (size_t b = 0; b < NV; ++b) acc[r][b] = hn::MulAdd(pb, vv[b], acc[r][b]);
    }
  }
  for (size_t r = 0; r < RB; ++r)
    for (size_t b = 0; b < NV; ++b) hn::StoreU(acc[r][b], d, out[r] + o + b * N);
}

void SoftmaxRow(float* HWY_RESTRICT s, size_t keys, size_t padded, float scale) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vs = hn::Set(d, scale);
  VF vmax = hn::Set(d, -INFINITY);
  size_t i = 0;
  for (; i + N <= keys; i += N) {
    const VF x = hn::Mul(hn::LoadU(d, s + i), vs);
    hn::StoreU(x, d, s + i);
    vmax = hn::Max(vmax, x);
  }
  float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (size_t k = i; k < keys; ++k) mx = std::max(mx, s[k] *= scale);
  const VF vm = hn::Set(d, mx);
  VF vsum = hn::Zero(d);
  i = 0;
  for (; i + N <= keys; i += N) {
    const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, s + i), vm));
    hn::StoreU(e, d, s + i);
    vsum = hn::Add(vsum, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (size_t k = i; k < keys; ++k) sum += (s[k] = std::exp(s[k] - mx));
  const float inv = 1.0f / sum;
  const VF vinv = hn::Set(d, inv);
  i = 0;
  for (; i + N <= keys; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, s + i), vinv), d, s + i);
  for (size_t k = i; k < keys; ++k) s[k] *= inv;
  std::fill(s + keys, s + padded, 0.0f);
}

void AttentionRows(const AttentionRowsArgs& a) {
  const DF d;
  const size_t N = hn::Lanes(d), W = 2 * N;
  const size_t R = a.rows, hd = a.head_dim, dv = a.value_dim;
  size_t max_keys = 0;
  for (size_t r = 0; r < R; ++r) max_keys = std::max(max_keys, a.limit[r]);
  const size_t padded = (max_keys + W - 1) / W * W;
  // Pass 1: scores, kQuad rows at a time (missing rows of the last block read a zero row).
  for (size_t j0 = 0; j0 < max_keys; j0 += W) {
    for (size_t r0 = 0; r0 < R; r0 += kQuad) {
      const float* q[kQuad];
      float* s[kQuad];
      for (size_t i = 0; i < kQuad; ++i) {
        const bool real = r0 + i < R;
        q[i] = real ? a.q[r0 + i] : a.zero_row;
        s[i] = (real ? a.scores + (r0 + i) * a.score_stride : a.discard_row) + j0;
      }
      ScoreTile(q, a.keys_t + j0 * hd, W, hd, s);
    }
  }
  // Pass 2: softmax over each row's visible keys.
  for (size_t r = 0; r < R; ++r) SoftmaxRow(a.scores + r * a.score_stride, a.limit[r], padded, a.scale);
  // Pass 3: P V.
  for (size_t r0 = 0; r0 < R; r0 += kQuad) {
    const float* p[kQuad];
    float* out[kQuad];
    size_t keys = 0;
    for (size_t i = 0; i < kQuad; ++i) {
      const bool real = r0 + i < R;
      p[i] = real ? a.scores + (r0 + i) * a.score_stride : a.zero_row;  // zero_row has >= padded zeros
      out[i] = real ? a.out[r0 + i] : a.discard_row;
      if (real) keys = std::max(keys, a.limit[r0 + i]);
    }
    if (!a.values_blocked) {
      for (size_t i = 0; i < kQuad && r0 + i < R; ++i)
        for (size_t dd = 0; dd < dv; ++dd) {
          float acc = 0;
          for (size_t j = 0; j < keys; ++j) acc += p[i][j] * a.values[j * a.value_stride + dd];
          out[i][dd] = acc;
        }
      continue;
    }
    for (size_t dd = 0; dd < dv; dd += W) WeightedRowSums<kQuad, 2>(p, a.values_blocked + (dd / W) * a.values_block_stride, W, keys, out, dd);
  }
}

// Decode form (attention_split): the few query rows of one or a few new tokens read each cached
// key and value row once, in the cache's own layout; a key row (head_dim floats) stays in L1 while
// every query row takes its dot product with it, so the cache is streamed once per call and never
// re-laid out.
HWY_INLINE float DotRow(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF s0 = hn::Zero(d), s1 = hn::Zero(d);  // two chains: FMA latency over a 16-32 vector row
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), s1);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Decode attention over the cache (few query rows, keys read once). Measured before these blocks
// (Xeon model 207, Qwen3.5-0.8B's 2 KV heads of 256 dims, one token over 512 cached keys, one
// thread, benchmarks/attention_core.cpp decode): 0.25 ms with the cache in L3, about 10% of the read
// bandwidth from memory. Each key's score was one dot product of two chains ending in a
// reduction, and each value row was added into four rows' sums held in memory, so the FMAs waited
// on their own latency and the loads missed without a prefetch.
//
// Scores: this many keys per block, one query row at a time, so that one chain per key gives 8
// independent chains (two FMA pipes of 4-cycle latency), and with the query vector and a key
// vector 10 registers (AVX2 has 16). The block's key rows (8 x 1 KiB at 256 dims) stay in L1
// while every row of the split reads them.
constexpr size_t kScoreKeys = 8;

// Scores of one query row against the kScoreKeys keys of a block (scaled).
HWY_INLINE void ScoreBlock(const float* HWY_RESTRICT q, const float* const* keys, size_t hd, float scale,
                           float* HWY_RESTRICT out) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc[kScoreKeys];
  for (size_t b = 0; b < kScoreKeys; ++b) acc[b] = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= hd; i += N) {
    const VF qv = hn::LoadU(d, q + i);
    for (size_t b = 0; b < kScoreKeys; ++b) acc[b] = hn::MulAdd(qv, hn::LoadU(d, keys[b] + i), acc[b]);
  }
  for (size_t b = 0; b < kScoreKeys; ++b) {
    float s = hn::GetLane(hn::SumOfLanes(d, acc[b]));
    for (size_t t = i; t < hd; ++t) s += q[t] * keys[b][t];
    out[b] = scale * s;
  }
}

// Requests the rows of keys (and values) [j0, j1) of the split (every 64-byte line) ahead of use:
// a decode step's cache comes from memory (the weight stream evicted it), and one block's rows
// are too few and too short for the hardware prefetchers to run ahead.
HWY_INLINE void PrefetchRows(const float* base, size_t stride, size_t j0, size_t j1, size_t floats) {
  for (size_t j = j0; j < j1; ++j) {
    const char* row = reinterpret_cast<const char*>(base + j * stride);
    for (size_t b = 0; b < floats * sizeof(float); b += 64) hwy::Prefetch(row + b);
  }
}

// Rows [0, RB) of the value sums, NV vectors of value columns from c (rows of p and out ldp and
// ldo apart).
template <size_t RB, size_t NV>
HWY_INLINE void ValueTile(const float* p, size_t ldp, const float* values, size_t value_stride, size_t n, size_t c,
                          float* out, size_t ldo) {
  const float* prow[RB];
  float* orow[RB];
  for (size_t r = 0; r < RB; ++r) prow[r] = p + r * ldp, orow[r] = out + r * ldo;
  WeightedRowSums<RB, NV>(prow, values + c, value_stride, n, orow, c);
}

// Value columns of a row block: chunks of kValueVectors vectors, then single vectors, then scalars.
// 4 rows x 4 vectors = 16 accumulators with 32 registers; 4 x 2 = 8 with AVX2's 16.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kValueVectors = 2;
#else
constexpr size_t kValueVectors = 4;
#endif
constexpr size_t kValueRows = 4;

template <size_t RB>
void ValueRows(const float* p, size_t ldp, const float* values, size_t value_stride, size_t n, size_t dv, float* out,
               size_t ldo) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + kValueVectors * N <= dv; c += kValueVectors * N)
    ValueTile<RB, kValueVectors>(p, ldp, values, value_stride, n, c, out, ldo);
  for (; c + N <= dv; c += N) ValueTile<RB, 1>(p, ldp, values, value_stride, n, c, out, ldo);
  for (; c < dv; ++c)
    for (size_t r = 0; r < RB; ++r) {
      float s = 0;
      for (size_t jj = 0; jj < n; ++jj) s += p[r * ldp + jj] * values[jj * value_stride + c];
      out[r * ldo + c] = s;
    }
}

void AttentionSplit(const AttentionSplitArgs& a) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const size_t R = a.rows, hd = a.head_dim, dv = a.value_dim, n = a.key_end - a.key_begin;
  const float* keys = a.keys + a.key_begin * a.key_stride;
  const float* values = a.values + a.key_begin * a.value_stride;
  // Scores of every row against every key of the split, block by block (the next block's keys
  // and values requested first). Masked scores are computed too; they are zeroed below.
  PrefetchRows(keys, a.key_stride, 0, std::min(n, kScoreKeys), hd);
  size_t j0 = 0;
  for (; j0 + kScoreKeys <= n; j0 += kScoreKeys) {
    PrefetchRows(keys, a.key_stride, j0 + kScoreKeys, std::min(n, j0 + 2 * kScoreKeys), hd);
    PrefetchRows(values, a.value_stride, j0, j0 + kScoreKeys, dv);
    const float* rows[kScoreKeys];
    for (size_t b = 0; b < kScoreKeys; ++b) rows[b] = keys + (j0 + b) * a.key_stride;
    for (size_t r = 0; r < R; ++r)
      if (a.limit[r] > a.key_begin + j0) ScoreBlock(a.q[r], rows, hd, a.scale, a.scores + r * n + j0);
  }
  for (size_t jj = j0; jj < n; ++jj)
    for (size_t r = 0; r < R; ++r)
      if (a.key_begin + jj < a.limit[r]) a.scores[r * n + jj] = a.scale * DotRow(a.q[r], keys + jj * a.key_stride, hd);
  for (size_t r = 0; r < R; ++r) {
    float* s = a.scores + r * n;
    const size_t visible = a.limit[r] > a.key_begin ? std::min(n, a.limit[r] - a.key_begin) : 0;
    std::fill(s + visible, s + n, 0.0f);  // masked keys weigh nothing in the value sums
    if (visible == 0) {
      a.max[r] = -INFINITY;
      a.sum[r] = 0;
      continue;
    }
    float mx = -INFINITY;
    for (size_t jj = 0; jj < visible; ++jj) mx = std::max(mx, s[jj]);
    const VF vm = hn::Set(d, mx);
    size_t jj = 0;
    VF vsum = hn::Zero(d);
    for (; jj + N <= visible; jj += N) {
      const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, s + jj), vm));
      hn::StoreU(e, d, s + jj);
      vsum = hn::Add(vsum, e);
    }
    float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
    for (; jj < visible; ++jj) sum += (s[jj] = std::exp(s[jj] - mx));
    a.max[r] = mx;
    a.sum[r] = sum;
  }
  // acc[r] = sum_j p[r][j] v_j: a small GEMM (rows x keys times keys x value dims).
  size_t r = 0;
  for (; r + kValueRows <= R; r += kValueRows)
    ValueRows<kValueRows>(a.scores + r * n, n, values, a.value_stride, n, dv, a.acc + r * dv, dv);
  switch (R - r) {
    case 3: ValueRows<3>(a.scores + r * n, n, values, a.value_stride, n, dv, a.acc + r * dv, dv); break;
    case 2: ValueRows<2>(a.scores + r * n, n, values, a.value_stride, n, dv, a.acc + r * dv, dv); break;
    case 1: ValueRows<1>(a.scores + r * n, n, values, a.value_stride, n, dv, a.acc + r * dv, dv); break;
    default: break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hanpu::model {
HWY_EXPORT(RmsNormRow);
HWY_EXPORT(SiluMulRow);
HWY_EXPORT(SiluRow);
HWY_EXPORT(SigmoidMulRow);
HWY_EXPORT(ArgmaxRow);
HWY_EXPORT(GatedNormRow);
HWY_EXPORT(AttentionKeyTile);
HWY_EXPORT(AttentionRowBlock);
HWY_EXPORT(ConvSiluRow);
HWY_EXPORT(ConvSiluRowMixed);
HWY_EXPORT(AttentionRows);
HWY_EXPORT(AttentionSplit);

void simd_rms_norm_row(const float* x, float* out, size_t n, const float* scale, float eps) {
  HANPU_DISPATCH(RmsNormRow)(x, out, n, scale, eps);
}
void simd_silu_mul_row(float* g, const float* u, size_t n) { HANPU_DISPATCH(SiluMulRow)(g, u, n); }
void simd_silu_row(float* y, size_t n) { HANPU_DISPATCH(SiluRow)(y, n); }
void simd_sigmoid_mul_row(float* o, const float* g, size_t n) { HANPU_DISPATCH(SigmoidMulRow)(o, g, n); }
size_t simd_argmax(const float* x, size_t n) { return HANPU_DISPATCH(ArgmaxRow)(x, n); }
void simd_gated_norm_row(float* o, const float* z, const float* w, size_t n, float eps) {
  HANPU_DISPATCH(GatedNormRow)(o, z, w, n, eps);
}
void simd_conv_silu_row(const float* const* in, const float* taps, size_t tap_stride, size_t K, float* y, size_t n) {
  HANPU_DISPATCH(ConvSiluRow)(in, taps, tap_stride, K, y, n);
}
void simd_conv_silu_row_mixed(const float* const* in_f32, const uint16_t* const* in_bf16, const float* taps,
                              size_t tap_stride, size_t K, float* y_f32, uint16_t* y_bf16, size_t n) {
  HANPU_DISPATCH(ConvSiluRowMixed)(in_f32, in_bf16, taps, tap_stride, K, y_f32, y_bf16, n);
}
size_t attention_key_tile() { return HANPU_DISPATCH(AttentionKeyTile)(); }
size_t attention_row_block() { return HANPU_DISPATCH(AttentionRowBlock)(); }
void attention_rows(const AttentionRowsArgs& args) { HANPU_DISPATCH(AttentionRows)(args); }
void attention_split(const AttentionSplitArgs& args) { HANPU_DISPATCH(AttentionSplit)(args); }
}  // namespace hanpu::model
#endif
