// AVX2 helpers shared by the GGUF decode GEMV (linear_gguf.cpp) and the integer prefill
// (linear_gguf_prefill.cpp): the bit unpacking of a block format and the activation quantizer
// written once, so that the two kernels cannot disagree on a bit position or a rounding. Include after cpu/x86_features.hpp, only where
// HANPU_X86_KERNELS is set; the callers check that the CPU and HANPU_ISA allow AVX2
// (gguf_avx2_forms_allowed) before they run these.
#pragma once

#include "cpu/x86_features.hpp"

#if HANPU_X86_KERNELS
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace hanpu::cpu::gguf_avx2 {

// One half (128 elements) of a Q6_K super-block (ggml-common.h block_q6_K) as four vectors of 32
// six-bit values q (0..63, before the format's -32), in element order: q[k] holds elements
// 32k .. 32k + 31 of the half. ql points at the half's 64 bytes of low nibbles (element l and
// l + 64 in byte l, l + 32 and l + 96 in byte l + 32), qh at its 32 bytes of 2-bit high parts
// (element l + 32k in bits 2k, 2k + 1 of byte l). Shifts are 16-bit (AVX2 has no 8-bit shift); each
// mask keeps only bits that stay inside their byte.
__attribute__((target("avx2"))) inline void q6k_unpack_half(const uint8_t* ql, const uint8_t* qh, __m256i q[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C),
                m30 = _mm256_set1_epi8(0x30), mc0 = _mm256_set1_epi8(static_cast<char>(0xC0));
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  q[0] = _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_slli_epi16(_mm256_and_si256(hb, m03), 4));
  q[1] = _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_slli_epi16(_mm256_and_si256(hb, m0c), 2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(hb, m30));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4), _mm256_srli_epi16(_mm256_and_si256(hb, mc0), 2));
}

// Prefetches kLines consecutive cache lines from p at level kHint (_MM_HINT_T0 or _MM_HINT_T1, the
// decode GEMVs' decode_prefetch_l2). The hint's type is spelled decltype(_MM_HINT_T0): GCC's enum
// _mm_hint, which clang does not have (its hints are ints).
template <int kHint, int kLines = 1>
__attribute__((always_inline)) inline void prefetch_lines(const void* p) {
  for (int i = 0; i < kLines; ++i)
    _mm_prefetch(static_cast<const char*>(p) + 64 * i, static_cast<decltype(_MM_HINT_T0)>(kHint));
}

// The sum of 8 f32 lanes in a fixed tree: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
__attribute__((target("avx2"), always_inline)) inline float hsum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// The activation quantizer (gguf_quantize_activation_row in linear_gguf.cpp) in AVX2, used by the
// decode GEMV and the integer prefill: the same q8, scale, sum and bsum16 bit for bit as the scalar
// form there. Q8_0's rule (ggml-quants.c quantize_row_q8_0_ref) per block of 32 or 256: d = amax /
// 127 kept in f32, q = roundf(x * (1 / d)) (x / d where 1 / d overflows, a block of subnormals),
// roundf's half-away-from-zero as truncation plus sign(v) where the exact fraction |v - trunc v| is
// at least 1/2; a block holding a NaN or inf gets scale NaN and q 0, so every output is NaN. The
// f32 sums per 32 (skipped where sum_out is nullptr) in the scalar form's tree order (lane l: (x_l + x_l+8) + (x_l+16 + x_l+24), then
// hsum8's tree), the int8 sums per 16 exact in any order. With libm's roundf per element the scalar
// form was about a third of a 256 x 1024 decode GEMV in cache and 8-13% of the integer prefill.
__attribute__((target("avx2"))) inline void quantize_activation_row(const float* x, int64_t K, int64_t block, int8_t* q8,
                                                                    float* scale, float* sum_out, int16_t* bsum16) {
  for (int64_t s = 0; sum_out != nullptr && s < K / 32; ++s) {  // the integer prefill passes none
    const float* xb = x + 32 * s;
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8));
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24));
    sum_out[s] = hsum8(_mm256_add_ps(a, b));
  }
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 zero = _mm256_setzero_ps(), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes VPACKSS's per-half interleave
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = x + b * block;
    __m256 amax = zero, bad = zero;
    for (int64_t j = 0; j < block; j += 8) {
      const __m256 v = _mm256_loadu_ps(xb + j);
      amax = _mm256_max_ps(amax, _mm256_and_ps(v, abs_mask));
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_mul_ps(v, zero), zero, _CMP_NEQ_UQ));  // NaN or inf: v * 0 is NaN
    }
    if (_mm256_movemask_ps(bad) != 0) {
      std::memset(q8 + b * block, 0, static_cast<size_t>(block));
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float am = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float d = am / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const bool reciprocal = std::isfinite(id);
    const __m256 vid = _mm256_set1_ps(id), vd = _mm256_set1_ps(d);
    for (int64_t j = 0; j < block; j += 32) {
      __m256i iv[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 xv = _mm256_loadu_ps(xb + j + 8 * k);
        const __m256 v = reciprocal ? _mm256_mul_ps(xv, vid) : _mm256_div_ps(xv, vd);
        const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 away = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(v, t), abs_mask), half, _CMP_GE_OQ);
        const __m256 r = _mm256_add_ps(t, _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(v, sign_mask))));
        iv[k] = _mm256_cvttps_epi32(r);
      }
      // |q| <= 127: the saturating packs are exact
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8 + b * block + j), _mm256_permutevar8x32_epi32(p, order));
    }
    scale[b] = d;
  }
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < K / 32; ++g) {  // sums per 16 of q8: VPSADBW of q + 128 per 8 bytes
    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * g)), bias);
    alignas(32) uint64_t s[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_sad_epu8(q, _mm256_setzero_si256()));
    bsum16[2 * g] = static_cast<int16_t>(static_cast<int>(s[0] + s[1]) - 16 * 128);
    bsum16[2 * g + 1] = static_cast<int16_t>(static_cast<int>(s[2] + s[3]) - 16 * 128);
  }
}

}  // namespace hanpu::cpu::gguf_avx2
#endif  // HANPU_X86_KERNELS
