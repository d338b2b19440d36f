// AVX512-VNNI kernels of Int8Linear's decode form (LinearPrecision::kInt8, few rows): the
// activations are quantized to int8 per group of the weight's group size (symmetric, scale
// max|x| / 127, as llama.cpp's Q8_0 treats its activations) and each group's dot product is one
// VPDPBUSD per 64 weights (64 multiply-adds of int8 pairs into 16 int32 lanes), then one
// conversion and one multiply-add by the two scales. x86-64 with GCC/Clang only; compiled through
// target attributes and called only after int8_vnni_usable() said yes.
//
// Why: with f32 activations each group of 16 weights costs a widening load, a conversion, a scale
// multiply and an FMA (linear_portable.cpp's RowBlockInt8): measured on Zen 4 with the weight in
// L3, one thread, 15-18 GB/s of weights, which is about what one core draws from DRAM, so decode
// with int8 weights was bound by those instructions rather than by memory. Here a group of 64
// weights costs about eight instructions.
//
// VPDPBUSD multiplies unsigned by signed bytes. The weights' signs are moved onto the activations
// (u = |w|, s = x with the sign of w, an exact identity since |q| <= 127 on both sides), so neither
// side needs an offset and its correction term.
#include "cpu/linear_kernels.hpp"
#include "cpu/isa.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/x86_features.hpp"
#ifdef HANPU_X86_KERNELS
#define HANPU_HAVE_VNNI_CODE 1
#endif

namespace hanpu::cpu {

#if HANPU_HAVE_VNNI_CODE

#define HANPU_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace {

bool detect_avx512vnni() { return x86::avx512_core_usable() && x86::has_avx512_vnni(); }


// Rows [0, MR) of the quantized activations times weight row n, in weight-row order (the
// weight streams in address order, as every decode kernel here reads it). Per 64 weights: one
// load, |w| and its sign mask, per row the signed activations and a VPDPBUSD into the group's
// int32 lanes; per group per row one conversion and one multiply-add by w_scale * x_scale.
template <int MR>
HANPU_VNNI_TARGET void dot_row(const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq,
                               const float* xs, int64_t Kp, int64_t groups, float* y, int64_t ldy, int64_t n,
                               bool accumulate) {
  const int8_t* row = q + n * K;
  const float* row_scales = scales + n * groups;
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
    __m512i dot[MR];
    for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
    for (int64_t k = k0; k < k1; k += 64) {
      // Past K the row belongs to the next row or to no allocation: a masked load (zeros).
      const __mmask64 mask = k1 - k >= 64 ? ~__mmask64{0} : (__mmask64{1} << (k1 - k)) - 1;
      const __m512i w = _mm512_maskz_loadu_epi8(mask, row + k);
      const __m512i w_abs = _mm512_abs_epi8(w);
      const __mmask64 negative = _mm512_movepi8_mask(w);
      for (int i = 0; i < MR; ++i) {
        const __m512i x = _mm512_loadu_si512(xq + i * Kp + k);
        const __m512i x_signed = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
        dot[i] = _mm512_dpbusd_epi32(dot[i], w_abs, x_signed);
      }
    }
    const float ws = row_scales[g];
    // (The masked conversion: GCC 12 warns about the undefined temporary of the unmasked one.)
    for (int i = 0; i < MR; ++i)
      acc[i] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, dot[i]), _mm512_set1_ps(ws * xs[i * groups + g]), acc[i]);
  }
  for (int i = 0; i < MR; ++i) {
    const float sum = x86::horizontal_sum(acc[i]);
    float& out = y[i * ldy + n];
    out = accumulate ? out + sum : sum;
  }
}

}  // namespace

bool int8_vnni_usable() {
  // HANPU_ISA below "native" turns the kernels outside Highway off (cpu/isa.hpp).
  static const bool usable = detect_avx512vnni();
  return usable && isa_selection().native;
}

void int8_vnni_quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t G, int8_t* xq, float* xs) {
  const int64_t Kp = int8_vnni_row_stride(K), groups = (K + G - 1) / G;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    int8_t* qr = xq + m * Kp;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
      xs[m * groups + g] = quantize_int8_group(xr + k0, k1 - k0, qr + k0);
    }
    std::fill(qr + K, qr + Kp, int8_t{0});
  }
}

void int8_vnni_gemv(const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq, const float* xs,
                    int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1, bool accumulate) {
  const int64_t Kp = int8_vnni_row_stride(K), groups = (K + G - 1) / G;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    for (int64_t n = n0; n < n1; ++n)
      dot_row<4>(q, scales, K, G, xq + m * Kp, xs + m * groups, Kp, groups, y + m * ldy, ldy, n, accumulate);
  for (; m + 2 <= M; m += 2)
    for (int64_t n = n0; n < n1; ++n)
      dot_row<2>(q, scales, K, G, xq + m * Kp, xs + m * groups, Kp, groups, y + m * ldy, ldy, n, accumulate);
  for (; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n)
      dot_row<1>(q, scales, K, G, xq + m * Kp, xs + m * groups, Kp, groups, y + m * ldy, ldy, n, accumulate);
}

#else  // no AVX512-VNNI code on this architecture / compiler: the f32 int8 kernels are used.

bool int8_vnni_usable() { return false; }
void int8_vnni_quantize_rows(const float*, int64_t, int64_t, int64_t, int64_t, int8_t*, float*) {}
void int8_vnni_gemv(const int8_t*, const float*, int64_t, int64_t, const int8_t*, const float*, int64_t, float*,
                    int64_t, int64_t, int64_t, bool) {}

#endif

}  // namespace hanpu::cpu
