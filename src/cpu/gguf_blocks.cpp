// Scalar reference dequantizers for the GGML block formats (see gguf_blocks.hpp). Formulas follow
// ggml/src/ggml-quants.c (dequantize_row_q8_0, _q4_0, _q4_K, _q5_K, _q6_K, _iq4_xs and
// quantize_row_q8_0_ref), written here from their definitions: every element is the same float32
// expression, evaluated in the same order, so the results match ggml's and gguf-py's bit for bit.
#include "cpu/gguf_blocks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hanpu/tensor.hpp"

namespace hanpu::gguf {

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_XS) == 136);

namespace {

// Block sizes: ggml's type_traits (ggml/src/ggml.c), the same numbers as gguf-py's
// constants.py GGML_QUANT_SIZES. Codes 4, 5 and 31..33, 36..38 are retired and absent.
constexpr BlockFormat kFormats[] = {
    {GgmlType::F32, "F32", 1, 4, true},          {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, true},      {GgmlType::Q4_1, "Q4_1", 32, 20, false},
    {GgmlType::Q5_0, "Q5_0", 32, 22, false},     {GgmlType::Q5_1, "Q5_1", 32, 24, false},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},      {GgmlType::Q8_1, "Q8_1", 32, 40, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, false},    {GgmlType::Q3_K, "Q3_K", 256, 110, false},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false}, {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, false}, {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
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
    case GgmlType::Q4_K: dequant_q4_k(blocks_of<BlockQ4_K>(src), dst, nb); return;
    case GgmlType::Q5_K: dequant_q5_k(blocks_of<BlockQ5_K>(src), dst, nb); return;
    case GgmlType::Q6_K: dequant_q6_k(blocks_of<BlockQ6_K>(src), dst, nb); return;
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

}  // namespace hanpu::gguf
