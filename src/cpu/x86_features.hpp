// x86-64 feature checks and helpers shared by the kernels written outside Highway (AMX,
// AVX512-BF16, AVX512-VNNI, AVX2 int8: linear_amx.cpp, linear_bf16dot.cpp, linear_int8_dot.cpp).
// Each caller also asks isa_selection() (hanpu/isa.hpp) before it runs such a kernel.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HANPU_X86_KERNELS 1
#include <cpuid.h>
#include <immintrin.h>

namespace hanpu::cpu::x86 {

struct CpuidRegs {
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool ok = false;
};

inline CpuidRegs cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  r.ok = __get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d) != 0;
  return r;
}

inline unsigned xcr0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return lo;
}

/// AVX-512 F, DQ, BW and VL in CPUID, and the OS saves the SSE, AVX, opmask and ZMM state.
inline bool avx512_core_usable() {
  const CpuidRegs l7 = cpuid(7, 0), l1 = cpuid(1, 0);
  const bool avx512 = l7.ok && (l7.b >> 16 & 1) && (l7.b >> 17 & 1) && (l7.b >> 30 & 1) && (l7.b >> 31 & 1);
  const bool osxsave = l1.ok && (l1.c >> 27 & 1);
  return avx512 && osxsave && (xcr0() & 0xE6u) == 0xE6u;
}
/// CPUID leaf 0's vendor string is "AuthenticAMD" (or Hygon's Zen-derived "HygonGenuine").
inline bool vendor_is_amd() {
  const CpuidRegs r = cpuid(0, 0);
  constexpr unsigned kAuth = 0x68747541u, kHygo = 0x6f677948u;  // "Auth", "Hygo" in EBX
  return r.ok && (r.b == kAuth || r.b == kHygo);
}
inline bool has_avx512_bf16() {
  const CpuidRegs r = cpuid(7, 1);
  return r.ok && (r.a >> 5 & 1);
}
inline bool has_avx512_vnni() {
  const CpuidRegs r = cpuid(7, 0);
  return r.ok && (r.c >> 11 & 1);
}
inline bool has_amx_bf16_tiles() {
  const CpuidRegs r = cpuid(7, 0);
  return r.ok && (r.d >> 22 & 1) && (r.d >> 24 & 1);  // AMX-BF16, AMX-TILE
}

/// Sum of the 16 lanes. (Masked extracts: GCC 12 warns about the undefined temporaries inside
/// _mm512_reduce_add_ps and the plain extracts.)
__attribute__((target("avx512f,avx512dq"))) inline float horizontal_sum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, v, 0), _mm512_maskz_extractf32x8_ps(0xFF, v, 1));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

}  // namespace hanpu::cpu::x86

#endif
