// Scalar reference dequantizers for the GGML block formats (see gguf_blocks.hpp). Formulas follow
// ggml/src/ggml-quants.c (dequantize_row_q8_0, _q4_0, _q4_1, _q5_0, _q5_1, _q4_K, _q5_K, _q6_K, _iq4_xs and
// quantize_row_q8_0_ref), written here from their definitions: every element is the same float32
// expression, evaluated in the same order, so the results match ggml's and gguf-py's bit for bit.
#include "cpu/gguf_blocks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hanpu/tensor.hpp"

namespace hanpu::gguf {

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

namespace {

// Block sizes: ggml's type_traits (ggml/src/ggml.c), the same numbers as gguf-py's
// constants.py GGML_QUANT_SIZES. Codes 4, 5 and 31..33, 36..38 are retired and absent.
constexpr BlockFormat kFormats[] = {
    {GgmlType::F32, "F32", 1, 4, true},          {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, true},      {GgmlType::Q4_1, "Q4_1", 32, 20, true},
    {GgmlType::Q5_0, "Q5_0", 32, 22, true},      {GgmlType::Q5_1, "Q5_1", 32, 24, true},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},      {GgmlType::Q8_1, "Q8_1", 32, 40, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, false},    {GgmlType::Q3_K, "Q3_K", 256, 110, false},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false}, {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, true}, {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},  {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, true},
    {GgmlType::I8, "I8", 1, 1, false},           {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},         {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},         {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::BF16, "BF16", 1, 2, true},        {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},  {GgmlType::MXFP4, "MXFP4", 32, 17, false},
};

template <class Block>
const Block* blocks_of(const void* src) {
  return static_cast<const Block*>(src);
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
    y += kQK8_0;
  }
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + kQK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
    y += kQK4_0;
  }
}

// Q4_1: w = d * q + m (the product rounded, then the sum: ggml's x0*d + m without contraction).
void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + kQK4_0 / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
    y += kQK4_0;
  }
}

// The 5th bit of element j of a Q5_0 / Q5_1 block, as 0 or 16: bit j of qh read as a
// little-endian u32 (ggml memcpy's the 4 bytes into a uint32_t).
inline int q5_high(const uint8_t* qh, int j) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return static_cast<int>((h >> j) & 1u) << 4;
}

// Q5_0: w = d * (q - 16), q the 5-bit value.
void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | q5_high(b[i].qh, j)) - 16) * d;
      y[j + kQK4_0 / 2] = static_cast<float>(((b[i].qs[j] >> 4) | q5_high(b[i].qh, j + 16)) - 16) * d;
    }
    y += kQK4_0;
  }
}

// Q5_1: w = d * q + m, q the 5-bit value.
void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) | q5_high(b[i].qh, j)) * d + m;
      y[j + kQK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) | q5_high(b[i].qh, j + 16)) * d + m;
    }
    y += kQK4_0;
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 8; j += 2) {  // 64 elements: sub-block j in the low nibbles, j+1 in the high
      uint8_t sc, m;
      k4_scale_min(j, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      k4_scale_min(j + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      y += 64;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int j = 0; j < 8; j += 2) {
      uint8_t sc, m;
      k4_scale_min(j, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      k4_scale_min(j + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l)
        y[l] = d1 * static_cast<float>((ql[l] & 0xF) | (((qh[l] >> j) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        y[l + 32] = d2 * static_cast<float>((ql[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4)) - m2;
      ql += 32;
      y += 64;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {  // 128 elements: 64 bytes of ql, 32 of qh, 8 scales
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// IQ4_NL: w = d * level[index], one f16 scale per 32 (ggml's dequantize_row_iq4_nl; llama-quantize's
// fallback for IQ4_XS on rows that are not whole 256-blocks).
void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = d * static_cast<float>(kIQ4NLValues[b[i].qs[j] & 0xF]);
      y[j + kQK4_0 / 2] = d * static_cast<float>(kIQ4NLValues[b[i].qs[j] >> 4]);
    }
    y += kQK4_0;
  }
}

void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const int ls = ((b[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((b[i].scales_h >> 2 * ib) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIQ4NLValues[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIQ4NLValues[qs[j] >> 4]);
      }
      y += 32;
      qs += 16;
    }
  }
}

}  // namespace

std::span<const BlockFormat> block_formats() { return kFormats; }

const BlockFormat* find_block_format(uint32_t code) {
  for (const BlockFormat& f : kFormats)
    if (static_cast<uint32_t>(f.type) == code) return &f;
  return nullptr;
}

const BlockFormat& block_format(GgmlType t) {
  const BlockFormat* f = find_block_format(static_cast<uint32_t>(t));
  if (!f) throw Error("GGML type code " + std::to_string(static_cast<uint32_t>(t)) + " is not a known type");
  return *f;
}

std::string ggml_type_name(uint32_t code) {
  const BlockFormat* f = find_block_format(code);
  return f ? f->name : "unknown type code " + std::to_string(code);
}

void dequantize(GgmlType t, const void* src, float* dst, int64_t n) {
  const BlockFormat& f = block_format(t);
  if (!f.dequantize) throw Error(std::string("dequantizing GGML type ") + f.name + " is not supported by hanpu");
  if (n < 0 || n % f.block_elems != 0)
    throw Error(std::string("dequantizing ") + f.name + ": " + std::to_string(n) +
                " elements is not a whole number of blocks of " + std::to_string(f.block_elems));
  // A tensor may have a zero dimension (GGUF allows it): nothing to decode, and its data and the
  // caller's buffer may then be null, which memcpy must not see (a libFuzzer finding,
  // tests/fuzz/regressions/gguf_header/zero-element-tensor).
  if (n == 0) return;
  const int64_t nb = n / f.block_elems;
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case GgmlType::Q8_0: dequant_q8_0(blocks_of<BlockQ8_0>(src), dst, nb); return;
    case GgmlType::Q4_0: dequant_q4_0(blocks_of<BlockQ4_0>(src), dst, nb); return;
    case GgmlType::Q4_1: dequant_q4_1(blocks_of<BlockQ4_1>(src), dst, nb); return;
    case GgmlType::Q5_0: dequant_q5_0(blocks_of<BlockQ5_0>(src), dst, nb); return;
    case GgmlType::Q5_1: dequant_q5_1(blocks_of<BlockQ5_1>(src), dst, nb); return;
    case GgmlType::Q4_K: dequant_q4_k(blocks_of<BlockQ4_K>(src), dst, nb); return;
    case GgmlType::Q5_K: dequant_q5_k(blocks_of<BlockQ5_K>(src), dst, nb); return;
    case GgmlType::Q6_K: dequant_q6_k(blocks_of<BlockQ6_K>(src), dst, nb); return;
    case GgmlType::IQ4_NL: dequant_iq4_nl(blocks_of<BlockIQ4_NL>(src), dst, nb); return;
    case GgmlType::IQ4_XS: dequant_iq4_xs(blocks_of<BlockIQ4_XS>(src), dst, nb); return;
    default: break;
  }
  throw Error(std::string("dequantizing GGML type ") + f.name + " is not implemented");  // registry/switch mismatch
}

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  if (n < 0 || n % kQK8_0 != 0)
    throw Error("quantizing Q8_0: " + std::to_string(n) + " elements is not a whole number of blocks of 32");
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK8_0; ++j) {
      // For finite x the value is within [-127, 127]; an inf or NaN input (where ggml's C converts
      // out of range, which is undefined) gives 0 here, never undefined behaviour.
      const float r = std::roundf(x[j] * id);
      b[i].qs[j] = std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
    }
    x += kQK8_0;
  }
}

namespace {

// ggml's GROUP_MAX_EPS (ggml-quants.c): a group whose largest magnitude is below it is all zero.
constexpr float kGroupMaxEps = 1e-15f;

// ggml's nearest_int: round to nearest, ties to even (ggml adds 1.5 * 2^23 in float32, which is
// exact for |x| <= 2^22, the range its callers assert). Values beyond that range (only from
// inf/NaN or overflowing inputs, where ggml's result is unspecified) are clamped here so that the
// conversion to int is always defined; every caller clamps the result to a few bits anyway.
inline int nearest_int(float x) {
  if (!(x == x)) return 0;  // NaN
  const float r = std::nearbyint(std::clamp(x, -4194304.0f, 4194304.0f));
  return static_cast<int>(r);
}

// The asymmetric fit of ggml's make_qkx2_quants for n values with per-element weights: levels
// 0..nmax, x ~ scale * L - min_out. Starts from the min/max fit, then tries nstep + 1 scales
// (nmax + rmin + rdelta * k) / (max - min) and keeps the weighted least-squares scale and min of
// the candidate with the smallest weighted squared error. Returns scale; *min_out >= 0.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* min_out, float rmin,
                    float rdelta, int nstep) {
  float lo = x[0], hi = x[0];
  float sum_w = w[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;  // the min is only ever subtracted: a block of positive values keeps min 0
  if (hi == lo) {
    std::fill(L, L + n, uint8_t{0});
    *min_out = -lo;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (hi - lo);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * static_cast<float>(L[i]) + lo - x[i];
    best_error += w[i] * (diff * diff);
  }
  uint8_t candidate[32];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      candidate[i] = static_cast<uint8_t>(l);
      const float wl = w[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {  // a positive offset is not representable: refit the scale through zero
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * static_cast<float>(candidate[i]) + this_min - x[i];
      error += w[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(candidate, candidate + n, L);
      best_error = error;
      scale = this_scale;
      lo = this_min;
    }
  }
  *min_out = -lo;
  return scale;
}

// The symmetric fit of ggml's make_qx_quants with rmse_type 1 and no importance weights (weights
// x^2): levels -nmax..nmax-1 stored as L + nmax. Starts from iscale = -nmax / x_absmax (the
// value of largest magnitude maps to -nmax exactly), then tries the 18 scales
// (nmax + 0.1 k) / x_absmax, k = -9..9 except 0, keeping the one that maximizes sumlx^2 / suml2.
// Returns the scale (negative when the largest-magnitude value is positive).
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  const auto level = [&](float iscale, int i) { return std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1); };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(iscale, i) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void check_whole_blocks(const char* name, int64_t n, int64_t block) {
  if (n < 0 || n % block != 0)
    throw Error(std::string("quantizing ") + name + ": " + std::to_string(n) +
                " elements is not a whole number of blocks of " + std::to_string(block));
}

}  // namespace

namespace {

// The part Q4_K and Q5_K share (ggml's quantize_row_q4_K_ref / _q5_K_ref): per sub-block of 32 an
// asymmetric fit with levels 0..nmax (fit_scale_min: weights |x| + rms, nstep + 1 candidate scales
// from rmin), the 8 scales and 8 mins coded in 6 bits against the two f16 super-block scales, then
// every element re-rounded against the coded scale and min into L[256].
void fit_k_super_block(const float* x, int nmax, float rmin, int nstep, uint16_t& d_out, uint16_t& dmin_out,
                       uint8_t scales_out[kKScaleSize], uint8_t L[kQK_K]) {
  constexpr int kSub = 32, kSubBlocks = kQK_K / kSub;
  float scales[kSubBlocks], mins[kSubBlocks], weights[kSub];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kSubBlocks; ++j) {
    const float* xs = x + kSub * j;
    // Weights: the element's magnitude plus the sub-block's rms, so large values count more
    // without the small ones counting for nothing.
    float sum_x2 = 0;
    for (int l = 0; l < kSub; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / kSub);
    for (int l = 0; l < kSub; ++l) weights[l] = rms + std::fabs(xs[l]);
    scales[j] = fit_scale_min(kSub, nmax, xs, weights, L + kSub * j, &mins[j], rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(scales_out, 0, kKScaleSize);
  for (int j = 0; j < kSubBlocks; ++j) {
    // As ggml: the rounded code is taken modulo 256 (a negative scale wraps to a large code),
    // then capped at 63.
    const auto ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const auto lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      scales_out[j] = ls;
      scales_out[j + 4] = lm;
    } else {  // low 4 bits in bytes 8..11, high 2 bits in the top of bytes 0..7 (k4_scale_min)
      scales_out[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales_out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales_out[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  d_out = f32_to_f16(max_scale / 63.0f);
  dmin_out = f32_to_f16(max_min / 63.0f);
  // Re-round every element against the scale and min as they are stored.
  for (int j = 0; j < kSubBlocks; ++j) {
    uint8_t sc, m;
    k4_scale_min(j, scales_out, sc, m);
    const float d = f16_to_f32(d_out) * static_cast<float>(sc);
    if (d == 0) continue;  // keeps the fit's levels (they dequantize to -dm regardless)
    const float dm = f16_to_f32(dmin_out) * static_cast<float>(m);
    for (int l = 0; l < kSub; ++l)
      L[kSub * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[kSub * j + l] + dm) / d), 0, nmax));
  }
}

}  // namespace

void quantize_q4_k(const float* x, void* dst, int64_t n) {
  check_whole_blocks("Q4_K", n, kQK_K);
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t L[kQK_K];
    BlockQ4_K& blk = b[i];
    fit_k_super_block(x, 15, -1.0f, 20, blk.d, blk.dmin, blk.scales, L);
    for (int j = 0; j < kQK_K; j += 64)
      for (int l = 0; l < 32; ++l) blk.qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quantize_q5_k(const float* x, void* dst, int64_t n) {
  check_whole_blocks("Q5_K", n, kQK_K);
  auto* b = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t L[kQK_K];
    BlockQ5_K& blk = b[i];
    // ggml's make_qkx2_quants(32, 31, ..., -0.5f, 0.1f, 15): levels 0..31, 16 candidate scales.
    fit_k_super_block(x, 31, -0.5f, 15, blk.d, blk.dmin, blk.scales, L);
    // Per 64 elements (sub-blocks 2c and 2c+1): low nibbles in qs as Q4_K's, the fifth bit of
    // element l of sub-block 2c in bit 2c of qh[l], of sub-block 2c+1 in bit 2c+1 (dequant_q5_k).
    std::memset(blk.qh, 0, sizeof blk.qh);
    for (int j = 0, c = 0; j < kQK_K; j += 64, ++c)
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = L[j + l], hi = L[j + l + 32];
        blk.qs[j / 2 + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        blk.qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
  }
}

void quantize_q6_k(const float* x, void* dst, int64_t n) {
  check_whole_blocks("Q6_K", n, kQK_K);
  auto* b = static_cast<BlockQ6_K*>(dst);
  constexpr int kSub = 16, kSubBlocks = kQK_K / kSub;
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    int8_t L[kQK_K];
    float scales[kSubBlocks];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < kSubBlocks; ++j) {
      scales[j] = fit_symmetric_scale(kSub, 32, x + kSub * j, L + kSub * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    BlockQ6_K& blk = b[i];
    std::memset(&blk, 0, sizeof blk);
    if (max_abs_scale < kGroupMaxEps) continue;  // all zero: d = 0, every level 0
    // The sub-block scale of largest magnitude codes as -128; the others within [-128, 127].
    const float iscale = -128.0f / max_scale;
    blk.d = f32_to_f16(1 / iscale);
    for (int j = 0; j < kSubBlocks; ++j)
      blk.scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
    for (int j = 0; j < kSubBlocks; ++j) {
      const float d = f16_to_f32(blk.d) * static_cast<float>(blk.scales[j]);
      if (d == 0) continue;
      for (int l = 0; l < kSub; ++l)
        L[kSub * j + l] = static_cast<int8_t>(std::clamp(nearest_int(x[kSub * j + l] / d), -32, 31) + 32);
    }
    // Layout (see dequant_q6_k): per 128 elements, ql holds low nibbles of elements l and l+64
    // (byte l) and of l+32 and l+96 (byte l+32); qh byte l holds the top 2 bits of all four.
    for (int j = 0; j < kQK_K; j += 128) {
      uint8_t* ql = blk.ql + j / 2;
      uint8_t* qh = blk.qh + j / 4;
      for (int l = 0; l < 32; ++l) {
        const auto q = [&](int o) { return static_cast<uint8_t>(L[j + l + o]); };
        ql[l] = static_cast<uint8_t>((q(0) & 0xF) | ((q(64) & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q(32) & 0xF) | ((q(96) & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6));
      }
    }
  }
}

namespace {

// Packs 32 five-bit codes as Q5_0 / Q5_1 store them: low nibbles of element j and j + 16 in byte j,
// the fifth bit of element j in bit j of the little-endian u32 qh (dequant_q5_0).
void pack_q5(const int* q, uint8_t* qh_out, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    qh |= static_cast<uint32_t>((q[j] & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((q[j + 16] & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(qh_out, &qh, 4);
}

// float -> int truncating toward zero as C's conversion does, defined for every input: NaN gives 0,
// values beyond [-128, 255] are clamped first (only inf/NaN inputs or overflowing scales get there,
// where ggml's C conversion is undefined).
int truncated(float v) { return std::isnan(v) ? 0 : static_cast<int>(std::clamp(v, -128.0f, 255.0f)); }

// ggml's quantize_row_q5_0_ref (gguf-py's Q5_0.quantize_blocks): d = the value of largest
// magnitude / -16 (so it maps to level 0 exactly), q = trunc(x / d + 16.5) capped at 31.
void quantize_q5_0(const float* x, void* dst, int64_t n) {
  check_whole_blocks("Q5_0", n, kQK4_0);
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < n / kQK4_0; ++i, x += kQK4_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK4_0; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    int q[kQK4_0];
    for (int j = 0; j < kQK4_0; ++j) q[j] = std::clamp(truncated(x[j] * id + 16.5f), 0, 31);
    pack_q5(q, b[i].qh, b[i].qs);
  }
}

// ggml's quantize_row_q5_1_ref (gguf-py's Q5_1.quantize_blocks): d = (max - min) / 31, m = min,
// q = trunc((x - min) / d + 0.5).
void quantize_q5_1(const float* x, void* dst, int64_t n) {
  check_whole_blocks("Q5_1", n, kQK4_0);
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / kQK4_0; ++i, x += kQK4_0) {
    float lo = std::numeric_limits<float>::max(), hi = -std::numeric_limits<float>::max();
    for (int j = 0; j < kQK4_0; ++j) {
      if (x[j] < lo) lo = x[j];
      if (x[j] > hi) hi = x[j];
    }
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    b[i].m = f32_to_f16(lo);
    int q[kQK4_0];
    for (int j = 0; j < kQK4_0; ++j) q[j] = std::clamp(truncated((x[j] - lo) * id + 0.5f), 0, 31);
    pack_q5(q, b[i].qh, b[i].qs);
  }
}

}  // namespace

bool can_quantize(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::Q5_0: case GgmlType::Q5_1: return true;
    default: return false;
  }
}

void quantize(GgmlType t, const float* src, void* dst, int64_t n) {
  const BlockFormat& f = block_format(t);
  if (!can_quantize(t)) throw Error(std::string("quantizing to GGML type ") + f.name + " is not supported by hanpu");
  check_whole_blocks(f.name, n, f.block_elems);
  switch (t) {
    case GgmlType::F32: if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
      return;
    }
    case GgmlType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    case GgmlType::Q8_0: quantize_q8_0(src, dst, n); return;
    case GgmlType::Q4_K: quantize_q4_k(src, dst, n); return;
    case GgmlType::Q5_K: quantize_q5_k(src, dst, n); return;
    case GgmlType::Q5_0: quantize_q5_0(src, dst, n); return;
    case GgmlType::Q5_1: quantize_q5_1(src, dst, n); return;
    case GgmlType::Q6_K: quantize_q6_k(src, dst, n); return;
    default: break;
  }
}

}  // namespace hanpu::gguf
