// int8 x int8 kernels of Int8Linear's decode form (LinearPrecision::kInt8, few rows): the
// activations are quantized to int8 per group of the weight's group size (symmetric, scale
// max|x| / 127, as llama.cpp's Q8_0 treats its activations) and each group's dot product runs on
// integer multiply-adds, then one conversion and one multiply-add by the two scales. Two forms,
// x86-64 with GCC/Clang only, compiled through target attributes and chosen at run time:
//
//   AVX512-VNNI: one VPDPBUSD per 64 weights (64 multiply-adds of byte pairs into 16 int32 lanes).
//   AVX2 (Haswell .. Zen 3, no VNNI): per 32 weights VPMADDUBSW (byte pairs into 16 int16 sums,
//     at most 2 * 127 * 127 = 32258: no saturation) and VPMADDWD by ones (into 8 int32 lanes), the
//     sequence llama.cpp's Q8_0 dot uses on AVX2.
//
// Why: with f32 activations each group of 16 weights costs a widening load, a conversion, a scale
// multiply and an FMA (linear_portable.cpp's RowBlockInt8): measured on Zen 4 with the weight in
// L3, one thread, 15-18 GB/s of weights, which is about what one core draws from DRAM, so decode
// with int8 weights was bound by those instructions rather than by memory. Here a group of 64
// weights costs about eight instructions (VNNI) or sixteen (AVX2).
//
// Both multiply unsigned by signed bytes. The weights' signs are moved onto the activations
// (u = |w|, s = x with the sign of w, an exact identity since |q| <= 127 on both sides), so neither
// side needs an offset and its correction term.
#include "cpu/linear_kernels.hpp"
#include "hanpu/isa.hpp"
#include "hanpu/tensor.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/x86_features.hpp"
#ifdef HANPU_X86_KERNELS
#define HANPU_HAVE_INT8_DOT_CODE 1
#endif

namespace hanpu::cpu {

#if HANPU_HAVE_INT8_DOT_CODE

#define HANPU_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace {

bool detect_avx512vnni() { return x86::avx512_core_usable() && x86::has_avx512_vnni(); }


// Rows [0, MR) of the quantized activations times weight row n, in weight-row order (the
// weight streams in address order, as every decode kernel here reads it). Per 64 weights: one
// load, |w| and its sign mask, per row the signed activations and a VPDPBUSD into the group's
// int32 lanes; per group per row one conversion and one multiply-add by w_scale * x_scale.
// Bytes ahead of the weight stream that both forms prefetch with every vector load (the
// matrix is contiguous, so this runs into the next rows). Without it the int8 decode drew half the
// read probe from DRAM. Xeon model 207 (2 threads, the LM head 248320 x 1024 int8 with group 64,
// medians of four interleaved runs, GB/s of weights): VNNI form none 14.0, 1024 bytes 18.5, 2048
// 20.9-21.1, 4096 20.9-22.6, 8192 20.0, 16384 19.1; the AVX2 form (HANPU_ISA=avx2) none 12.3, 1024
// 16.9, 2048 18.8, 4096 18.8. (The bf16 decode stream, linear_portable.cpp, measured best at 1024
// on a Zen 3; 2048 was not measured there for int8.)
constexpr int64_t kInt8StreamPrefetchBytes = 2048;
template <int MR>
HANPU_VNNI_TARGET void dot_row_vnni(const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq,
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
      _mm_prefetch(reinterpret_cast<const char*>(row + k) + kInt8StreamPrefetchBytes, _MM_HINT_T0);
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

#define HANPU_AVX2_TARGET __attribute__((target("avx2,fma")))

// The AVX2 form of dot_row_vnni: per 32 weights one load, |w|, per row the activations with w's
// sign (VPSIGNB also zeroes them where w is 0, which changes nothing: the product is 0), VPMADDUBSW
// into int16 pairs and VPMADDWD by ones into the group's int32 lanes. A group end that is not a
// multiple of 32 (or K's end) is read through a zero-padded copy: an unmasked load past it would
// take the next group's weights or leave the allocation. kWholeVectors (G and K multiples of 32,
// every model shape) compiles that copy out: its library calls clobber every vector register, so
// with it in the loop GCC kept the accumulators on the stack, a store-to-load chain per group
// (measured on Zen 3: 20% of decode's samples on that store).
template <int MR, bool kWholeVectors>
HANPU_AVX2_TARGET void dot_row_avx2(const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq,
                                    const float* xs, int64_t Kp, int64_t groups, float* y, int64_t ldy, int64_t n,
                                    bool accumulate) {
  const int8_t* row = q + n * K;
  const float* row_scales = scales + n * groups;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
  alignas(32) int8_t tail[kWholeVectors ? 1 : 32];
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
    __m256i dot[MR];
    for (int i = 0; i < MR; ++i) dot[i] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += 32) {
      // With every 32-byte step, so twice per line. Once per line (every other step) measured no
      // better: Xeon model 207, HANPU_ISA=avx2, the LM head 248320 x 1024 group 64, three
      // interleaved pairs 21.5 / 21.0 / 19.8 GB/s as here against 19.2 / 17.6 / 19.3.
      _mm_prefetch(reinterpret_cast<const char*>(row + k) + kInt8StreamPrefetchBytes, _MM_HINT_T0);
      __m256i w = _mm256_setzero_si256();
      if constexpr (kWholeVectors) {
        w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
      } else if (k1 - k >= 32) {
        w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
      } else {
        std::fill(tail, tail + 32, int8_t{0});
        std::copy(row + k, row + k1, tail);
        w = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
      }
      const __m256i w_abs = _mm256_abs_epi8(w);
      for (int i = 0; i < MR; ++i) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * Kp + k));
        const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
        dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(pairs, ones));
      }
    }
    const float ws = row_scales[g];
    for (int i = 0; i < MR; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), _mm256_set1_ps(ws * xs[i * groups + g]), acc[i]);
  }
  for (int i = 0; i < MR; ++i) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
    const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
    const float sum = _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
    float& out = y[i * ldy + n];
    out = accumulate ? out + sum : sum;
  }
}

bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

enum class Int8DotForm { kNone, kAvx2, kVnni };

// VNNI under HANPU_ISA native; AVX2 whenever the selected Highway target is AVX2 or better (these
// are plain AVX2 instructions, the ones the AVX2 target itself may use).
Int8DotForm chosen_form() {
  static const bool vnni = detect_avx512vnni(), avx2 = detect_avx2();
  const IsaSelection& isa = isa_selection();
  if (vnni && isa.native) return Int8DotForm::kVnni;
  const bool avx2_allowed = isa.native || isa.target == "AVX2" || isa.target.rfind("AVX3", 0) == 0;
  return avx2 && avx2_allowed ? Int8DotForm::kAvx2 : Int8DotForm::kNone;
}

template <int MR>
void dot_rows(Int8DotForm form, const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq,
              const float* xs, int64_t Kp, int64_t groups, float* y, int64_t ldy, int64_t n0, int64_t n1,
              bool accumulate) {
  const bool whole_vectors = G % 32 == 0 && K % 32 == 0;
  for (int64_t n = n0; n < n1; ++n) {
    if (form == Int8DotForm::kVnni)
      dot_row_vnni<MR>(q, scales, K, G, xq, xs, Kp, groups, y, ldy, n, accumulate);
    else if (whole_vectors)
      dot_row_avx2<MR, true>(q, scales, K, G, xq, xs, Kp, groups, y, ldy, n, accumulate);
    else
      dot_row_avx2<MR, false>(q, scales, K, G, xq, xs, Kp, groups, y, ldy, n, accumulate);
  }
}

}  // namespace

bool int8_dot_usable() { return chosen_form() != Int8DotForm::kNone; }

void int8_dot_quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t G, int8_t* xq, float* xs) {
  const int64_t Kp = int8_dot_row_stride(K), groups = (K + G - 1) / G;
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

void int8_dot_gemv(const int8_t* q, const float* scales, int64_t K, int64_t G, const int8_t* xq, const float* xs,
                   int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1, bool accumulate) {
  const Int8DotForm form = chosen_form();
  if (form == Int8DotForm::kNone) throw Error("int8_dot_gemv: no int8 dot-product kernel on this CPU / HANPU_ISA");
  const int64_t Kp = int8_dot_row_stride(K), groups = (K + G - 1) / G;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    dot_rows<4>(form, q, scales, K, G, xq + m * Kp, xs + m * groups, Kp, groups, y + m * ldy, ldy, n0, n1, accumulate);
  for (; m + 2 <= M; m += 2)
    dot_rows<2>(form, q, scales, K, G, xq + m * Kp, xs + m * groups, Kp, groups, y + m * ldy, ldy, n0, n1, accumulate);
  for (; m < M; ++m)
    dot_rows<1>(form, q, scales, K, G, xq + m * Kp, xs + m * groups, Kp, groups, y + m * ldy, ldy, n0, n1, accumulate);
}

#else  // no x86 int8 dot code on this architecture / compiler: the f32 int8 kernels are used.

bool int8_dot_usable() { return false; }
void int8_dot_quantize_rows(const float*, int64_t, int64_t, int64_t, int64_t, int8_t*, float*) {}
void int8_dot_gemv(const int8_t*, const float*, int64_t, int64_t, const int8_t*, const float*, int64_t, float*,
                   int64_t, int64_t, int64_t, bool) {}

#endif

}  // namespace hanpu::cpu
