// Decode GEMV kernels for Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS (linear_gguf_small_blocks.hpp).
//
// Block layouts: ggml-common.h (block_q4_0 .. block_q5_1, block_iq4_xs); in all of them byte j of
// the 16 nibble bytes of a 32-element group holds element j (low nibble) and element j + 16 (high
// nibble), and Q5_0 / Q5_1 keep the fifth bit of element j in bit j of a little-endian u32.
//
// The AVX2 form (target attributes, chosen at run time as in linear_gguf.cpp): per 32 weights the 16
// nibble bytes become 32 bytes in element order (low nibbles in the low 128 bits, high nibbles in
// the high 128 bits), the fifth bits are spread to bytes with a byte shuffle and a compare, and
// VPMADDUBSW multiplies unsigned weight bytes by the signed int8 activations into int16 pairs:
//   Q4_1 / Q5_1: the weight codes are unsigned (0..15 / 0..31), multiplied as they are (pairs at
//     most 2 * 31 * 127 = 7874);
//   Q4_0 / Q5_0 (codes minus 8 / 16), IQ4_NL and IQ4_XS (the signed IQ4_NL levels, -127..113): signed
//     weights, so the sign moves onto the activations (|w| times x with w's sign, VPSIGNB: exact,
//     and zero where w is zero), as llama.cpp's AVX2 dot products do (pairs at most 2 * 127 * 127 =
//     32258 < 2^15: no saturation).
// VPMADDWD by ones (IQ4_XS: by the sub-block's scale ls - 32, in [-32, 31]) sums the pairs into 8
// int32 lanes. 32-element formats: one conversion and one FMA by d * activation scale per block, two
// accumulators alternating so that neighbouring blocks' FMAs overlap. IQ4_XS: the 8 sub-blocks sum
// in int32 (a lane at most 8 * 4 * 127 * 127 * 32 = 16.5e6 < 2^24, so its conversion is exact),
// one conversion and FMA per super-block. Q4_1 / Q5_1's offset term is m * s_b * S_b per block, S_b
// the sum of the block's int8 activations (exact; from the quantizer's sums per 16), a scalar
// multiply-add: as llama.cpp's Q8_1 activations (which carry d * sum(q)), so that the row's result
// is the dot product of the weights with the *quantized* x. Taking the offset against the f32 sum
// of the unquantized x instead (as the K-quants' min term here does) leaves the unsigned codes' mean
// (d * 7.5, not centred) times the rounding error of the block sum: on the tiny Qwen3.5 Q4_1 file that
// measured decode NMSE 6.6e-3 mean / 7.1e-2 worst step against 1.6e-3 / 9.5e-3 for Q4_0.
//
// The portable form computes the same integer sums element by element (any CPU, and the reference
// the tests hold the AVX2 form to).
#include "cpu/linear_gguf_small_blocks.hpp"

#include <cstring>
#include <string>
#include <type_traits>

#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_kernels.hpp"  // decode_prefetch_bytes
#include "cpu/x86_features.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu::cpu {

namespace {

using gguf::GgmlType;

// The integer dot product of one 32-element group of 4-bit codes (16 bytes, the Q4_0 layout) plus
// optional fifth bits, mapped through `level`, with 32 int8 activations.
template <class Level>
int32_t dot32(const uint8_t* qs, uint32_t high, const int8_t* x, Level level) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>((high >> j) & 1u) << 4;
    const int hi = (qs[j] >> 4) | static_cast<int>((high >> (j + 16)) & 1u) << 4;
    s += level(lo) * x[j] + level(hi) * x[j + 16];
  }
  return s;
}

uint32_t high_bits(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return h;
}

template <class Block>
float portable_dot32(const Block* b, int64_t nb, const int8_t* x8, const float* xs, const int16_t* bsum16) {
  constexpr bool kHasMin = std::is_same_v<Block, gguf::BlockQ4_1> || std::is_same_v<Block, gguf::BlockQ5_1>;
  constexpr bool kFive = std::is_same_v<Block, gguf::BlockQ5_0> || std::is_same_v<Block, gguf::BlockQ5_1>;
  constexpr bool kLevels = std::is_same_v<Block, gguf::BlockIQ4_NL>;
  constexpr int kOffset = kHasMin || kLevels ? 0 : (kFive ? 16 : 8);
  float acc = 0.0f, min_acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t h = 0;
    if constexpr (kFive) h = high_bits(b[i].qh);
    const int32_t s = dot32(b[i].qs, h, x8 + 32 * i, [](int q) { return kLevels ? int{gguf::kIQ4NLValues[q]} : q - kOffset; });
    acc += static_cast<float>(s) * (f16_to_f32(b[i].d) * xs[i]);
    if constexpr (kHasMin) min_acc += (f16_to_f32(b[i].m) * xs[i]) * static_cast<float>(bsum16[2 * i] + bsum16[2 * i + 1]);
  }
  return acc + min_acc;
}

float portable_dot_iq4_xs(const gguf::BlockIQ4_XS* b, int64_t nb, const int8_t* x8, const float* xs) {
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((b[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((b[i].scales_h >> 2 * ib) & 3) << 4);
      s += (ls - 32) * dot32(b[i].qs + 16 * ib, 0, x8 + 256 * i + 32 * ib, [](int q) { return int{gguf::kIQ4NLValues[q]}; });
    }
    acc += static_cast<float>(s) * (f16_to_f32(b[i].d) * xs[i]);
  }
  return acc;
}

#if HANPU_X86_KERNELS
#define HANPU_SMALL_AVX2 __attribute__((target("avx2,fma,f16c")))

// 16 nibble bytes -> 32 bytes in element order: element j (low nibble of byte j) in byte j,
// element j + 16 (high nibble) in byte j + 16.
HANPU_SMALL_AVX2 inline __m256i nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// Bit j of the little-endian u32 at qh -> 0x10 in byte j, else 0.
HANPU_SMALL_AVX2 inline __m256i fifth_bits(const uint8_t* qh) {
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(high_bits(qh))),
                                            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                              0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(0x10));
}

// int16 pairs of signed w times signed x: |w| times x with w's sign (exact; zero where w is zero).
HANPU_SMALL_AVX2 inline __m256i signed_pairs(__m256i w, __m256i x) {
  return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

HANPU_SMALL_AVX2 inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

template <class Block>
HANPU_SMALL_AVX2 float avx2_dot32(const Block* b, int64_t nb, const int8_t* x8, const float* xs,
                                  const int16_t* bsum16, int64_t ahead) {
  constexpr bool kHasMin = std::is_same_v<Block, gguf::BlockQ4_1> || std::is_same_v<Block, gguf::BlockQ5_1>;
  constexpr bool kFive = std::is_same_v<Block, gguf::BlockQ5_0> || std::is_same_v<Block, gguf::BlockQ5_1>;
  constexpr bool kLevels = std::is_same_v<Block, gguf::BlockIQ4_NL>;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gguf::kIQ4NLValues)));
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float min_acc0 = 0.0f, min_acc1 = 0.0f;
  auto block = [&](int64_t i, __m256& acc, float& min_acc) HANPU_SMALL_AVX2 {
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + ahead, _MM_HINT_T0);
    __m256i q = nibbles(b[i].qs);
    if constexpr (kFive) q = _mm256_or_si256(q, fifth_bits(b[i].qh));
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8 + 32 * i));
    __m256i pairs;
    if constexpr (kHasMin) {
      pairs = _mm256_maddubs_epi16(q, x);  // unsigned codes
    } else if constexpr (kLevels) {
      pairs = signed_pairs(_mm256_shuffle_epi8(levels, q), x);  // IQ4_NL: the signed levels, -127..113
    } else {
      pairs = signed_pairs(_mm256_sub_epi8(q, _mm256_set1_epi8(kFive ? 16 : 8)), x);
    }
    const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
    acc = _mm256_fmadd_ps(s, _mm256_set1_ps(_cvtsh_ss(b[i].d) * xs[i]), acc);
    if constexpr (kHasMin) min_acc += (_cvtsh_ss(b[i].m) * xs[i]) * static_cast<float>(bsum16[2 * i] + bsum16[2 * i + 1]);
  };
  // Two blocks per step into two accumulators (named, so that they stay in registers): the FMAs
  // of neighbouring blocks overlap instead of waiting on each other.
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    block(i, acc0, min_acc0);
    block(i + 1, acc1, min_acc1);
  }
  if (i < nb) block(i, acc0, min_acc0);
  const float min_acc = min_acc0 + min_acc1;
  return hsum(_mm256_add_ps(acc0, acc1)) + min_acc;
}

HANPU_SMALL_AVX2 float avx2_dot_iq4_xs(const gguf::BlockIQ4_XS* b, int64_t nb, const int8_t* x8, const float* xs,
                                       int64_t ahead) {
  const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gguf::kIQ4NLValues)));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const char* bytes = reinterpret_cast<const char*>(b + i);
    _mm_prefetch(bytes + ahead, _MM_HINT_T0);
    _mm_prefetch(bytes + ahead + 64, _MM_HINT_T0);
    _mm_prefetch(bytes + ahead + 128, _MM_HINT_T0);
    const gguf::BlockIQ4_XS& blk = b[i];
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((blk.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((blk.scales_h >> 2 * ib) & 3) << 4);
      const __m256i w = _mm256_shuffle_epi8(levels, nibbles(blk.qs + 16 * ib));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8 + 256 * i + 32 * ib));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(signed_pairs(w, x), _mm256_set1_epi16(static_cast<int16_t>(ls - 32))));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(_cvtsh_ss(blk.d) * xs[i]), acc);
  }
  return hsum(acc);
}
#endif

template <class Block>
void rows32(const void* w, int64_t K, const GgufActivations& x, float* y, int64_t n0, int64_t n1, bool avx2) {
  const int64_t nb = K / 32;
  const auto* rows = static_cast<const Block*>(w);
#if HANPU_X86_KERNELS
  if (avx2) {
    const int64_t ahead = decode_prefetch_bytes();
    for (int64_t n = n0; n < n1; ++n)
      y[n] = avx2_dot32(rows + n * nb, nb, x.q8.data(), x.scale.data(), x.bsum16.data(), ahead);
    return;
  }
#endif
  (void)avx2;
  for (int64_t n = n0; n < n1; ++n) y[n] = portable_dot32(rows + n * nb, nb, x.q8.data(), x.scale.data(), x.bsum16.data());
}

}  // namespace

bool gguf_small_block_type(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::IQ4_NL || t == GgmlType::IQ4_XS;
}

bool gguf_small_block_form_available(SmallBlockForm form) {
#if HANPU_X86_KERNELS
  if (form == SmallBlockForm::kAvx2) return gguf_avx2_forms_allowed();
#else
  if (form == SmallBlockForm::kAvx2) return false;
#endif
  return true;
}

void gguf_small_block_gemv_rows(GgmlType t, const void* w, int64_t K, const GgufActivations& x, float* y, int64_t n0,
                                int64_t n1, SmallBlockForm form) {
  const gguf::BlockFormat& f = gguf::block_format(t);
  if (!gguf_small_block_type(t)) throw Error(std::string("gguf_small_block_gemv_rows: no kernel for GGML type ") + f.name);
  const int64_t xblock = t == GgmlType::IQ4_XS ? 256 : 32;
  if (K <= 0 || K % f.block_elems != 0 || x.K != K || x.block != xblock)
    throw Error("gguf_small_block_gemv_rows: K = " + std::to_string(K) + " (activations " + std::to_string(x.K) +
                " in blocks of " + std::to_string(x.block) + ") is not a positive multiple of " +
                std::to_string(f.block_elems) + " or the activations are not quantized in blocks of " +
                std::to_string(xblock) + " for " + f.name);
  if (!gguf_small_block_form_available(form))
    throw Error(std::string("gguf_small_block_gemv_rows: the AVX2 form cannot run on this CPU / ISA selection (") +
                f.name + ")");
  const bool avx2 = form == SmallBlockForm::kAvx2 || (form == SmallBlockForm::kAuto && gguf_small_block_form_available(SmallBlockForm::kAvx2));
  switch (t) {
    case GgmlType::Q4_0: rows32<gguf::BlockQ4_0>(w, K, x, y, n0, n1, avx2); return;
    case GgmlType::Q4_1: rows32<gguf::BlockQ4_1>(w, K, x, y, n0, n1, avx2); return;
    case GgmlType::Q5_0: rows32<gguf::BlockQ5_0>(w, K, x, y, n0, n1, avx2); return;
    case GgmlType::Q5_1: rows32<gguf::BlockQ5_1>(w, K, x, y, n0, n1, avx2); return;
    case GgmlType::IQ4_NL: rows32<gguf::BlockIQ4_NL>(w, K, x, y, n0, n1, avx2); return;
    default: break;
  }
  const int64_t nb = K / 256;
  const auto* rows = static_cast<const gguf::BlockIQ4_XS*>(w);
#if HANPU_X86_KERNELS
  if (avx2) {
    const int64_t ahead = decode_prefetch_bytes();
    for (int64_t n = n0; n < n1; ++n) y[n] = avx2_dot_iq4_xs(rows + n * nb, nb, x.q8.data(), x.scale.data(), ahead);
    return;
  }
#endif
  for (int64_t n = n0; n < n1; ++n) y[n] = portable_dot_iq4_xs(rows + n * nb, nb, x.q8.data(), x.scale.data());
}

}  // namespace hanpu::cpu
