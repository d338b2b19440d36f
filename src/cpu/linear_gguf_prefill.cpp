// Integer prefill GEMM over GGUF blocks (Q8_0, Q4_K, Q5_K, Q6_K), AVX2: see linear_gguf.hpp
// (gguf_prefill_int) for what it computes and docs/GGUF.md ("Prefill") for the measurements that
// choose it.
//
// Layout of the work. The activations are quantized once per call, row by row, with the decode
// GEMV's rule (gguf_quantize_activation_row: int8 per 32 for Q8_0, per 256 for the K-quants, plus
// the f32 sums per 32 for the Q4_K / Q5_K min term and the int8 sums per 16 for Q6_K's -32), in an
// AVX2 form shared with the decode GEMV (gguf_avx2.hpp quantize_activation_row).
// The weight rows are taken kGgufTileRows at a time and unpacked once into the worker's scratch:
// the K-quants' 4/5/6-bit values as bytes in element order (0..15 / 0..31 / 0..63, Q6_K before its
// -32), the sub-block scale of every 32 elements as a ready VPMADDWD operand (16 int16 lanes: one
// scale for Q4_K / Q5_K, Q6_K's two 16-element scales in the two 128-bit halves), the f32 block
// scale d, the f32 min terms dmin * m_j, Q6_K's 16 scales widened to int16. Q8_0's bytes are kept
// as they are, with their f32 scale per 32.
//
// Then register blocks of kRowsX activation rows by kRowsW weight rows (4 x 2; the K-quants' loop
// over a super-block in inline assembly, see superblock_dot) run the whole K: per 32
// elements one load of each weight row's bytes (and scale vector), one load of each activation
// row's, and per (activation row, weight row) pair VPMADDUBSW (unsigned weight bytes times signed
// activation bytes into int16 pairs) and VPMADDWD by the sub-block scale into int32 lanes. That
// pair of multiplies is all the per-pair work on the values: the unpacking is paid once per weight
// row and tile, not once per activation row, which is what a GEMV per row (the decode kernels here,
// llama.cpp's K-quant dot products) pays again for each. Per super-block and pair, one conversion
// and one f32 multiply-add by d * activation scale (and Q6_K's -32 term in integers, the min term
// as one f32 negative multiply-add of 8 lanes). Q8_0 takes llama.cpp's sign trick (|w| unsigned,
// the activation with w's sign: exact since |q| <= 127 on both sides) and, as its scale is per 32,
// one VPMADDWD by ones, a conversion and a multiply-add per 32 and pair.
//
// No overflow: a VPMADDUBSW lane is at most 2 * 63 * 127 = 16002 (Q6_K), 2 * 31 * 127 (Q5_K),
// 2 * 15 * 127 (Q4_K), 2 * 127 * 127 = 32258 (Q8_0), within int16; a super-block's int32 lane at most
// 8 * 2 * 16002 * 128 < 2^25 (Q6_K). The integer sums are the decode GEMV's (the same products, only
// summed in another order), so the result meets the same bound (tests/test_linear_gguf.cpp).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/engine_impl.hpp"
#include "cpu/gguf_avx2.hpp"
#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/linear_gguf_small_blocks.hpp"  // Q4_0, IQ4_NL, IQ4_XS
#include "cpu/x86_features.hpp"
#include "hanpu/isa.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu::cpu {

namespace {

// Activation rows quantized for one call (kept per calling thread, so a model's many projections
// reuse the allocation).
struct ActivationRows {
  int64_t M = 0, K = 0, block = 32;
  std::vector<int8_t> q8;       // M x K + 63: storage of xq8
  int8_t* xq8 = nullptr;        // M x K, 64-byte aligned (rows are whole 256-byte super-blocks apart), so
                                // no 32-byte load of the kernels splits a cache line
  std::vector<float> scale;     // M x K / block
  std::vector<float> sum;       // M x K / 32
  std::vector<int16_t> bsum16;  // M x K / 16
};

GgufPrefill parse_prefill_env() {
  const char* v = std::getenv("HANPU_GGUF_PREFILL");
  if (v == nullptr || *v == '\0') return GgufPrefill::kAuto;
  const std::string s(v);
  if (s == "int") return GgufPrefill::kIntegerDot;
  if (s == "f32") return GgufPrefill::kF32Tiles;
  throw Error("HANPU_GGUF_PREFILL: got '" + s + "', expected 'int' (integer dot products on quantized activations) or "
              "'f32' (dequantized f32 tiles)");
}

}  // namespace

// Read on every call (a getenv and a compare per projection call), so that a test can set it
// between two forwards of one model.
GgufPrefill gguf_prefill_override() { return parse_prefill_env(); }

bool gguf_int_prefill_available(gguf::GgmlType t) {
#if HANPU_X86_KERNELS
  // The types this file has a form for, and Q4_0 / IQ4_NL / IQ4_XS (linear_gguf_prefill_small_blocks.cpp);
  // Q4_1 .. Q5_1 have only the GEMV.
  return (t == gguf::GgmlType::Q8_0 || t == gguf::GgmlType::Q4_K || t == gguf::GgmlType::Q5_K ||
          t == gguf::GgmlType::Q6_K || gguf_small_block_int_prefill_type(t)) &&
         gguf_avx2_forms_allowed();
#else
  (void)t;
  return false;
#endif
}

bool gguf_int_prefill_default(gguf::GgmlType t) {
#if HANPU_X86_KERNELS
  // AVX2 targets: every type with a form. Measured on Zen 3 (benchmarks/gguf_prefill, MLP shapes,
  // M = 512, 2 threads, GOP/s per CPU second, docs/GGUF.md "Prefill"): the K-quants 228-258 against
  // the f32 tiles' 108-118; Q8_0 142-149 against 111-117 (its scale per 32 costs a conversion and
  // an FMA per 32 weights and row pair on top of the two multiplies; it was even with the f32 tiles
  // before the activation quantizer was vectorized). AVX-512 targets keep the f32 tiles (4 x 4
  // register blocks of 512-bit FMAs there): the integer form has no AVX512-VNNI variant, and the
  // AVX2 one was not measured there.
  (void)t;
  const std::string& target = isa_selection().target;
  return target.rfind("AVX3", 0) != 0;
#else
  (void)t;
  return false;
#endif
}

bool gguf_use_int_prefill(gguf::GgmlType t, GgufPrefill p) {
  if (!gguf_int_prefill_available(t)) return false;
  if (p == GgufPrefill::kAuto) p = gguf_prefill_override();
  switch (p) {
    case GgufPrefill::kIntegerDot: return true;
    case GgufPrefill::kF32Tiles: return false;
    case GgufPrefill::kAuto: break;
  }
  return gguf_int_prefill_default(t);
}

#if HANPU_X86_KERNELS
namespace {

#define HANPU_PREFILL_AVX2 __attribute__((target("avx2,fma,f16c")))

enum class Kind { kQ8_0, kQ4K, kQ5K, kQ6K };

// Register block: kRowsX activation rows x kRowsW weight rows. 4 x 2 keeps everything the loop over
// 32 elements reads in registers (8 int32 accumulators, 2 weight and 2 scale vectors, the
// activation and the product: 14 of AVX2's 16), so per 32 elements it loads 8 vectors for 16
// multiplies (8 cycles on Zen 3's two multiply pipes; two 256-bit loads per cycle). Larger blocks
// run out of registers for the scale vectors: 6 x 2 (12 accumulators, scales as VPMADDWD memory
// operands, 20 loads per 12 pairs) measured 97-107 GOP/s per core against 4 x 2's 108-125 (Q4_K /
// Q6_K, MLP shapes, M = 512, Zen 3, 2026-12-05); 5 x 2, 4 x 3 and 3 x 2 (intrinsics) 72-85.
constexpr int kRowsX = 4;
constexpr int kRowsW = 2;

// One tile of up to kGgufTileRows weight rows, unpacked (see the file comment). Pointers into the
// worker's scratch; per row strides.
struct Tile {
  int64_t K = 0;
  uint8_t* vals = nullptr;    // rows x K
  int16_t* svec = nullptr;    // rows x (K / 32) x 16 (K-quants)
  float* d = nullptr;         // rows x nd (K / 256, Q8_0: K / 32)
  float* mins = nullptr;      // rows x (K / 32) (Q4_K / Q5_K)
  int16_t* q6sc = nullptr;    // rows x (K / 16) (Q6_K)
  int64_t nd = 0;
};

size_t tile_bytes(int64_t K) {
  // vals K, svec K (K/32 * 32 bytes), d K/32 * 4, mins K/32 * 4, q6sc K/16 * 2, each 64-aligned
  const size_t per_row = static_cast<size_t>(K + K + K / 8 + K / 8 + K / 8);
  return kGgufTileRows * per_row + 5 * 64;
}

Tile carve_tile(uint8_t* base, int64_t K, int64_t nd) {
  auto align = [](size_t n) { return (n + 63) & ~size_t{63}; };
  Tile t;
  t.K = K;
  t.nd = nd;
  size_t off = 0;
  t.vals = base + off;
  off = align(off + kGgufTileRows * static_cast<size_t>(K));
  t.svec = reinterpret_cast<int16_t*>(base + off);
  off = align(off + kGgufTileRows * static_cast<size_t>(K));
  t.d = reinterpret_cast<float*>(base + off);
  off = align(off + kGgufTileRows * static_cast<size_t>(K / 32) * 4);
  t.mins = reinterpret_cast<float*>(base + off);
  off = align(off + kGgufTileRows * static_cast<size_t>(K / 32) * 4);
  t.q6sc = reinterpret_cast<int16_t*>(base + off);
  return t;
}

// Q4_K / Q5_K's 8 six-bit scales and mins (ggml-common.h's get_scale_min_k4 for every j at once),
// byte j of each result the value of sub-block j: bytes 0..3 hold the low 6 bits of scales 0..3,
// bytes 4..7 of mins 0..3, bytes 8..11 the low 4 bits of scales / mins 4..7, whose top 2 bits are
// the top bits of bytes 0..3 / 4..7.
inline void k4_scales_mins(const uint8_t* scales, uint64_t& sc, uint64_t& m) {
  uint32_t w[3];
  std::memcpy(w, scales, 12);
  sc = uint64_t{w[0] & 0x3f3f3f3fu} | uint64_t{(w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u)} << 32;
  m = uint64_t{w[1] & 0x3f3f3f3fu} | uint64_t{((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u)} << 32;
}

template <Kind kind>
HANPU_PREFILL_AVX2 void unpack_row(const uint8_t* row, const Tile& t, int64_t r) {
  const int64_t K = t.K;
  uint8_t* vals = t.vals + r * K;
  if constexpr (kind == Kind::kQ8_0) {
    const auto* b = reinterpret_cast<const gguf::BlockQ8_0*>(row);
    float* d = t.d + r * t.nd;
    for (int64_t i = 0; i < K / 32; ++i) {
      std::memcpy(vals + 32 * i, b[i].qs, 32);
      d[i] = _cvtsh_ss(b[i].d);
    }
  } else if constexpr (kind == Kind::kQ4K || kind == Kind::kQ5K) {
    using Block = std::conditional_t<kind == Kind::kQ5K, gguf::BlockQ5_K, gguf::BlockQ4_K>;
    const auto* b = reinterpret_cast<const Block*>(row);
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    int16_t* svec = t.svec + r * (K / 32) * 16;
    float* d = t.d + r * t.nd;
    float* mins = t.mins + r * (K / 32);
    for (int64_t i = 0; i < K / 256; ++i) {
      const Block& blk = b[i];
      uint64_t sc, m;
      k4_scales_mins(blk.scales, sc, m);
      d[i] = _cvtsh_ss(blk.d);
      const float dmin = _cvtsh_ss(blk.dmin);
      for (int j = 0; j < 8; ++j) {
        // dmin * m_j: an f16 times an integer below 64, exact in f32
        mins[8 * i + j] = dmin * static_cast<float>((m >> (8 * j)) & 0xFF);
        const __m256i s = _mm256_set1_epi16(static_cast<int16_t>((sc >> (8 * j)) & 0xFF));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(svec + (8 * i + j) * 16), s);
      }
      __m256i hb = _mm256_setzero_si256();
      if constexpr (kind == Kind::kQ5K) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
      uint8_t* v = vals + 256 * i;
      for (int c = 0; c < 4; ++c) {  // chunk c of qs: low nibbles sub-block 2c, high nibbles 2c + 1
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * c));
        __m256i lo = _mm256_and_si256(raw, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        if constexpr (kind == Kind::kQ5K) {  // the fifth bit: bit 2c (2c + 1) of qh[l]
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * c)), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * c + 1)), one), 4));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 64 * c), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 64 * c + 32), hi);
      }
    }
  } else {  // Q6_K (ggml-common.h block_q6_K; unpacked by gguf_avx2.hpp, as the decode GEMV does)
    const auto* b = reinterpret_cast<const gguf::BlockQ6_K*>(row);
    int16_t* svec = t.svec + r * (K / 32) * 16;
    float* d = t.d + r * t.nd;
    int16_t* q6sc = t.q6sc + r * (K / 16);
    for (int64_t i = 0; i < K / 256; ++i) {
      const gguf::BlockQ6_K& blk = b[i];
      d[i] = _cvtsh_ss(blk.d);
      for (int g = 0; g < 16; ++g) q6sc[16 * i + g] = blk.scales[g];
      // element e of the super-block has scale sc[e / 16]: chunk c (32 elements) sc[2c] | sc[2c + 1]
      for (int c = 0; c < 8; ++c) {
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(blk.scales[2 * c + 1]), _mm_set1_epi16(blk.scales[2 * c]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(svec + (8 * i + c) * 16), s);
      }
      uint8_t* v = vals + 256 * i;
      for (int h = 0; h < 2; ++h) {
        __m256i q[4];
        gguf_avx2::q6k_unpack_half(blk.ql + 64 * h, blk.qh + 32 * h, q);
        for (int k = 0; k < 4; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 128 * h + 32 * k), q[k]);
      }
    }
  }
}

HANPU_PREFILL_AVX2 inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// Keeps v in a vector register (the Q8_0 block). Without it GCC folds a load that feeds several
// multiplies into each of them as a memory operand (the K-quants' 4 x 2 block issued 18 loads per
// 32 elements instead of 8 that way; Zen 3 does two 256-bit loads per cycle).
#define HANPU_IN_REGISTER(v) __asm__("" : "+x"(v))

// One super-block (256 elements) of MR activation rows x NR weight rows into int32 lanes:
// acc[m][r] = sum over the 8 chunks of 32 of VPMADDWD(VPMADDUBSW(w_r, x_m), scale_r). w, s and x
// point at the super-block's first byte / scale vector / int8.
//
// The general form (the tails of the block: fewer rows) is intrinsics; the 4 x 2 block is written
// in assembly because GCC 12 made it load-bound: it folded each activation load into both of its
// multiplies as a memory operand (18 loads per 32 elements instead of 8) and, with the loads kept
// in registers (HANPU_IN_REGISTER), spilled 3 of the 8 accumulators (seen in the disassembly).
// The assembly took the Q4_K / Q6_K MLP shapes from 80-90 to 105-125 GOP/s per core.
template <int MR, int NR>
HANPU_PREFILL_AVX2 inline void superblock_dot(const uint8_t* const* w, const int16_t* const* s, const int8_t* const* x8,
                                              __m256i (&acc)[MR][NR]) {
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    __m256i wv[NR], sv[NR];
    for (int r = 0; r < NR; ++r) {
      wv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[r] + 32 * c));
      sv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(s[r] + 16 * c));
    }
    for (int m = 0; m < MR; ++m) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8[m] + 32 * c));
      for (int r = 0; r < NR; ++r)
        acc[m][r] = _mm256_add_epi32(acc[m][r], _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r], xv), sv[r]));
    }
  }
}

// 4 x 2: 8 accumulators, 2 weight and 2 scale vectors, the activation and the product: 14 of 16
// registers; per 32 elements 8 loads for 8 pairs (16 multiplies, 8 cycles on Zen 3's two pipes).
template <>
HANPU_PREFILL_AVX2 inline void superblock_dot<4, 2>(const uint8_t* const* w, const int16_t* const* s,
                                                     const int8_t* const* x8, __m256i (&acc)[4][2]) {
  __m256i w0, w1, x, tmp, s0, s1;
  int64_t idx;
  __asm__(
      "vpxor %[a00], %[a00], %[a00]\n\t"
      "vmovdqa %[a00], %[a01]\n\t"
      "vmovdqa %[a00], %[a10]\n\t"
      "vmovdqa %[a00], %[a11]\n\t"
      "vmovdqa %[a00], %[a20]\n\t"
      "vmovdqa %[a00], %[a21]\n\t"
      "vmovdqa %[a00], %[a30]\n\t"
      "vmovdqa %[a00], %[a31]\n\t"
      "xor %[idx], %[idx]\n\t"
      "1:\n\t"
      "vmovdqa (%[pw0],%[idx]), %[w0]\n\t"
      "vmovdqa (%[pw1],%[idx]), %[w1]\n\t"
      "vmovdqa (%[ps0],%[idx]), %[s0]\n\t"
      "vmovdqa (%[ps1],%[idx]), %[s1]\n\t"
      "vmovdqu (%[px0],%[idx]), %[x]\n\t"
      "vpmaddubsw %[x], %[w0], %[t]\n\t"
      "vpmaddwd %[s0], %[t], %[t]\n\t"
      "vpaddd %[t], %[a00], %[a00]\n\t"
      "vpmaddubsw %[x], %[w1], %[t]\n\t"
      "vpmaddwd %[s1], %[t], %[t]\n\t"
      "vpaddd %[t], %[a01], %[a01]\n\t"
      "vmovdqu (%[px1],%[idx]), %[x]\n\t"
      "vpmaddubsw %[x], %[w0], %[t]\n\t"
      "vpmaddwd %[s0], %[t], %[t]\n\t"
      "vpaddd %[t], %[a10], %[a10]\n\t"
      "vpmaddubsw %[x], %[w1], %[t]\n\t"
      "vpmaddwd %[s1], %[t], %[t]\n\t"
      "vpaddd %[t], %[a11], %[a11]\n\t"
      "vmovdqu (%[px2],%[idx]), %[x]\n\t"
      "vpmaddubsw %[x], %[w0], %[t]\n\t"
      "vpmaddwd %[s0], %[t], %[t]\n\t"
      "vpaddd %[t], %[a20], %[a20]\n\t"
      "vpmaddubsw %[x], %[w1], %[t]\n\t"
      "vpmaddwd %[s1], %[t], %[t]\n\t"
      "vpaddd %[t], %[a21], %[a21]\n\t"
      "vmovdqu (%[px3],%[idx]), %[x]\n\t"
      "vpmaddubsw %[x], %[w0], %[t]\n\t"
      "vpmaddwd %[s0], %[t], %[t]\n\t"
      "vpaddd %[t], %[a30], %[a30]\n\t"
      "vpmaddubsw %[x], %[w1], %[t]\n\t"
      "vpmaddwd %[s1], %[t], %[t]\n\t"
      "vpaddd %[t], %[a31], %[a31]\n\t"
      "add $32, %[idx]\n\t"
      "cmp $256, %[idx]\n\t"
      "jne 1b\n\t"
      : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]), [a20] "=&x"(acc[2][0]), [a21] "=&x"(acc[2][1]), [a30] "=&x"(acc[3][0]), [a31] "=&x"(acc[3][1]), [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(x), [t] "=&x"(tmp), [s0] "=&x"(s0), [s1] "=&x"(s1), [idx] "=&r"(idx)
      : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [ps0] "r"(s[0]), [ps1] "r"(s[1]), [px0] "r"(x8[0]), [px1] "r"(x8[1]), [px2] "r"(x8[2]), [px3] "r"(x8[3])
      : "cc", "memory");
}

// Rows [m0, m0 + MR) of x times tile rows [r0, r0 + NR), the whole K; y[m][n0 + r].
//
// The int32 accumulators (registers, see kRowsX) cover one super-block; then per pair one
// conversion and an FMA by d * activation scale (and Q6_K's -32 term in integers, Q4_K / Q5_K's min
// term as one 8-lane FNMADD) into f32 accumulators that live in memory (the stack): 16 registers
// do not hold both sets, and these are touched once per 256 elements.
template <Kind kind, int MR, int NR>
HANPU_PREFILL_AVX2 void block_kquant(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, float* y,
                                     int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nsb = K / 256;
  // Written by super-block 0, read and written by the others (a "= {}" here compiled to a rep stos,
  // 7% of the time at K = 1024).
  alignas(32) float facc[MR][NR][8];
  const uint8_t* vals[NR];
  const int16_t* svec[NR];
  for (int r = 0; r < NR; ++r) {
    vals[r] = t.vals + (r0 + r) * K;
    svec[r] = t.svec + (r0 + r) * (K / 32) * 16;
  }
  const int8_t* xq[MR];
  for (int m = 0; m < MR; ++m) xq[m] = a.xq8 + (m0 + m) * K;
  auto super_block = [&](int64_t i, auto first) HANPU_PREFILL_AVX2 {
    __m256i acc[MR][NR];
    {
      const uint8_t* wp[NR];
      const int16_t* sp[NR];
      const int8_t* xp[MR];
      for (int r = 0; r < NR; ++r) {
        wp[r] = vals[r] + 256 * i;
        sp[r] = svec[r] + 128 * i;
      }
      for (int m = 0; m < MR; ++m) xp[m] = xq[m] + 256 * i;
      superblock_dot<MR, NR>(wp, sp, xp, acc);
    }
    if constexpr (kind == Kind::kQ6K) {  // - 32 * sum_g sc_g * (sum of the activations over group g)
      for (int r = 0; r < NR; ++r) {
        const __m256i sc16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.q6sc + (r0 + r) * (K / 16) + 16 * i));
        for (int m = 0; m < MR; ++m) {
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsum16.data() + (m0 + m) * (K / 16) + 16 * i));
          acc[m][r] = _mm256_sub_epi32(acc[m][r], _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
        }
      }
    }
    __m256 dr[NR];
    for (int r = 0; r < NR; ++r) dr[r] = _mm256_broadcast_ss(&t.d[(r0 + r) * t.nd + i]);
    for (int m = 0; m < MR; ++m) {
      const __m256 xs = _mm256_broadcast_ss(&a.scale[static_cast<size_t>((m0 + m) * nsb + i)]);
      for (int r = 0; r < NR; ++r) {
        __m256 f = decltype(first)::value ? _mm256_setzero_ps() : _mm256_load_ps(facc[m][r]);
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][r]), _mm256_mul_ps(dr[r], xs), f);
        if constexpr (kind == Kind::kQ4K || kind == Kind::kQ5K)  // - dmin * m_j * X_j, X_j the f32 sum of x over j
          f = _mm256_fnmadd_ps(_mm256_loadu_ps(t.mins + (r0 + r) * (K / 32) + 8 * i),
                               _mm256_loadu_ps(a.sum.data() + (m0 + m) * (K / 32) + 8 * i), f);
        _mm256_store_ps(facc[m][r], f);
      }
    }
  };
  super_block(0, std::true_type{});
  for (int64_t i = 1; i < nsb; ++i) super_block(i, std::false_type{});
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      const float v = hsum(_mm256_load_ps(facc[m][r]));
      float& out = y[(m0 + m) * ldy + r];
      out = accumulate ? out + v : v;
    }
}

// Q8_0 (scale per 32 on both sides): per pair and 32 elements the sign trick, VPMADDUBSW,
// VPMADDWD by ones, a conversion and an FMA by d_w * d_x. Registers: MR x NR f32 accumulators,
// NR |w| and NR w vectors (the sign), the activation, its signed copy and the scale broadcast.
template <int MR, int NR>
HANPU_PREFILL_AVX2 void block_q8_0(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, float* y,
                                   int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nb = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 facc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) facc[m][r] = _mm256_setzero_ps();
  const int8_t* vals[NR];
  const float* d[NR];
  for (int r = 0; r < NR; ++r) {
    vals[r] = reinterpret_cast<const int8_t*>(t.vals) + (r0 + r) * K;
    d[r] = t.d + (r0 + r) * t.nd;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[NR], wabs[NR];
    for (int r = 0; r < NR; ++r) {
      w[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(vals[r] + 32 * b));
      HANPU_IN_REGISTER(w[r]);
      wabs[r] = _mm256_abs_epi8(w[r]);
    }
    for (int m = 0; m < MR; ++m) {
      __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq8 + (m0 + m) * K + 32 * b));
      HANPU_IN_REGISTER(x);
      const __m256 xs = _mm256_broadcast_ss(&a.scale[static_cast<size_t>((m0 + m) * nb + b)]);
      for (int r = 0; r < NR; ++r) {
        // |w| times x with w's sign (VPSIGNB zeroes x where w is 0: the product is 0 anyway)
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(x, w[r])), ones);
        facc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(_mm256_broadcast_ss(&d[r][b]), xs), facc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      const float v = hsum(facc[m][r]);
      float& out = y[(m0 + m) * ldy + r];
      out = accumulate ? out + v : v;
    }
}

template <Kind kind, int MR, int NR>
void run_block(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, float* y, int64_t ldy, bool accumulate) {
  if constexpr (kind == Kind::kQ8_0) block_q8_0<MR, NR>(t, r0, a, m0, y, ldy, accumulate);
  else block_kquant<kind, MR, NR>(t, r0, a, m0, y, ldy, accumulate);
}

// Rows [m0, m0 + mr) for 1 <= mr <= MR: the full block or one of its tails.
template <Kind kind, int MR, int NR>
void run_rows_tail(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, int64_t mr, float* y, int64_t ldy,
                   bool accumulate) {
  if constexpr (MR == 1) {
    run_block<kind, 1, NR>(t, r0, a, m0, y, ldy, accumulate);
  } else {
    if (mr == MR) run_block<kind, MR, NR>(t, r0, a, m0, y, ldy, accumulate);
    else run_rows_tail<kind, MR - 1, NR>(t, r0, a, m0, mr, y, ldy, accumulate);
  }
}

template <Kind kind, int MR, int NR>
void run_tile_blocks(int64_t nw, const Tile& t, const ActivationRows& a, float* y, int64_t ldy, bool accumulate) {
  for (int64_t m0 = 0; m0 < a.M; m0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, a.M - m0);
    int64_t r0 = 0;
    for (; r0 + NR <= nw; r0 += NR) run_rows_tail<kind, MR, NR>(t, r0, a, m0, mr, y + r0, ldy, accumulate);
    static_assert(NR == 2, "the weight-row tail below is one row");
    if (r0 < nw) run_rows_tail<kind, MR, 1>(t, r0, a, m0, mr, y + r0, ldy, accumulate);
  }
}

// One tile: nw rows unpacked, then every activation row against them, MR rows at a time (a
// block of x, MR * K bytes, stays in L1 across the tile's weight rows; the tile in L2).
template <Kind kind>
void run_tile(const uint8_t* rows, size_t row_bytes, int64_t nw, const Tile& t, const ActivationRows& a, float* y,
              int64_t ldy, bool accumulate) {
  for (int64_t r = 0; r < nw; ++r) unpack_row<kind>(rows + r * row_bytes, t, r);
  run_tile_blocks<kind, kRowsX, kRowsW>(nw, t, a, y, ldy, accumulate);
}

ActivationRows& activation_rows() {
  thread_local ActivationRows rows;
  return rows;
}

}  // namespace

void gguf_prefill_quantize_row(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale, float* sum,
                               int16_t* bsum16) {
  if (!gguf_avx2_forms_allowed()) throw Error("gguf_prefill_quantize_row: the AVX2 forms may not run on this CPU / ISA selection");
  if ((block != 32 && block != 256) || K <= 0 || K % block != 0)
    throw Error("gguf_prefill_quantize_row: K = " + std::to_string(K) + " is not a positive multiple of the block " +
                std::to_string(block) + " (32 or 256)");
  gguf_avx2::quantize_activation_row(x, K, block, q8, scale, sum, bsum16);  // the decode GEMV's
}

void gguf_prefill_int(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K, const float* x,
                      int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate) {
  if (!gguf_int_prefill_available(type))
    throw Error(std::string("gguf_prefill_int: no integer prefill for GGML type ") + gguf::block_format(type).name +
                " on this CPU / ISA selection (Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, IQ4_NL, IQ4_XS with AVX2)");
  if (gguf_small_block_int_prefill_type(type))
    return gguf_small_block_prefill_int(engine, type, w, N, K, x, ldx, y, ldy, M, threads, accumulate);
  const gguf::BlockFormat& bf = gguf::block_format(type);
  if (N <= 0 || K <= 0 || K % bf.block_elems != 0)
    throw Error("gguf_prefill_int: shape [" + std::to_string(N) + ", " + std::to_string(K) + "] is not rows of whole " +
                bf.name + " blocks");
  if (M <= 0) return;
  const int nt = std::max(1, threads > 0 ? threads : engine.threads());
  ActivationRows& a = activation_rows();
  a.M = M;
  a.K = K;
  a.block = gguf_activation_block(type);
  a.q8.resize(static_cast<size_t>(M * K + 63));
  a.xq8 = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(a.q8.data()) + 63) & ~uintptr_t{63});
  a.scale.resize(static_cast<size_t>(M * (K / a.block)));
  a.sum.resize(static_cast<size_t>(M * (K / 32)));
  a.bsum16.resize(static_cast<size_t>(M * (K / 16)));
  {
    const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, M));
    engine.impl().run(parts, [&](int p, Workspace&) {
      for (int64_t m = M * p / parts; m < M * (p + 1) / parts; ++m)
        gguf_avx2::quantize_activation_row(x + m * ldx, K, a.block, a.xq8 + m * K, a.scale.data() + m * (K / a.block),
                     a.sum.data() + m * (K / 32), a.bsum16.data() + m * (K / 16));
    });
  }
  const size_t row_bytes = static_cast<size_t>(K / bf.block_elems * bf.block_bytes);
  const int64_t tiles = (N + kGgufTileRows - 1) / kGgufTileRows;
  const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, tiles));
  const auto* wb = static_cast<const uint8_t*>(w);
  engine.impl().run(parts, [&](int p, Workspace& ws) {
    const Tile t = carve_tile(reinterpret_cast<uint8_t*>(ws.bytes(kLinearPanel, tile_bytes(K))), K,
                              type == gguf::GgmlType::Q8_0 ? K / 32 : K / 256);
    for (int64_t ti = tiles * p / parts; ti < tiles * (p + 1) / parts; ++ti) {
      const int64_t n0 = ti * kGgufTileRows, nw = std::min<int64_t>(kGgufTileRows, N - n0);
      const uint8_t* rows = wb + n0 * row_bytes;
      switch (type) {
        case gguf::GgmlType::Q8_0: run_tile<Kind::kQ8_0>(rows, row_bytes, nw, t, a, y + n0, ldy, accumulate); break;
        case gguf::GgmlType::Q4_K: run_tile<Kind::kQ4K>(rows, row_bytes, nw, t, a, y + n0, ldy, accumulate); break;
        case gguf::GgmlType::Q5_K: run_tile<Kind::kQ5K>(rows, row_bytes, nw, t, a, y + n0, ldy, accumulate); break;
        default: run_tile<Kind::kQ6K>(rows, row_bytes, nw, t, a, y + n0, ldy, accumulate); break;
      }
    }
  });
}

#else

void gguf_prefill_quantize_row(const float*, int64_t, int64_t, int8_t*, float*, float*, int16_t*) {
  throw Error("gguf_prefill_quantize_row: x86-64 AVX2 only");
}

void gguf_prefill_int(Engine&, gguf::GgmlType type, const void*, int64_t, int64_t, const float*, int64_t, float*,
                      int64_t, int64_t, int, bool) {
  throw Error(std::string("gguf_prefill_int: no integer prefill for GGML type ") + gguf::block_format(type).name +
              " in this build (x86-64 AVX2 only)");
}

#endif

}  // namespace hanpu::cpu
