// AVX2 helpers shared by the GGUF decode GEMV (linear_gguf.cpp) and the integer prefill
// (linear_gguf_prefill.cpp): the bit unpacking of a block format written once, so that the two
// kernels cannot disagree on a bit position. Include after cpu/x86_features.hpp, only where
// HANPU_X86_KERNELS is set; the callers check that the CPU and HANPU_ISA allow AVX2
// (gguf_avx2_forms_allowed) before they run these.
#pragma once

#include "cpu/x86_features.hpp"

#if HANPU_X86_KERNELS
#include <immintrin.h>

#include <cstdint>

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

}  // namespace hanpu::cpu::gguf_avx2
#endif  // HANPU_X86_KERNELS
