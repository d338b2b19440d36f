// Integer prefill GEMM over GGUF blocks (Q8_0, Q4_K, Q5_K, Q6_K), AVX2: see linear_gguf.hpp
// (gguf_prefill_int) for what it computes and docs/GGUF.md ("Prefill") for the measurements that
// choose it.
//
// Layout of the work. The activations are quantized once per call, row by row, with the decode
// GEMV's rule (gguf_quantize_activation_row: int8 per 32 for Q8_0, per 256 for the K-quants, plus
// the f32 sums per 32 for the Q4_K / Q5_K min term and the int8 sums per 16 for Q6_K's -32), in an
// AVX2 form with the same int8 values (quantize_row).
// The weight rows are taken kGgufTileRows at a time and unpacked once into the worker's scratch:
// the K-quants' 4/5/6-bit values as bytes in element order (0..15 / 0..31 / 0..63, Q6_K before its
// -32), the sub-block scale of every 32 elements as a ready VPMADDWD operand (16 int16 lanes: one
// scale for Q4_K / Q5_K, Q6_K's two 16-element scales in the two 128-bit halves), the f32 block
// scale d, the f32 min terms dmin * m_j, Q6_K's 16 scales widened to int16. Q8_0's values are
// widened to int16 and interleaved 8 rows to a vector (unpack_q8_0_row), with their f32 scales per
// 32 as one vector of the 8 rows per block; its activations are widened to int16 too.
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
// as one f32 negative multiply-add of 8 lanes). Q8_0, whose scale is per 32, puts 8 weight rows in
// the lanes instead of 8 stretches of K (block_q8_0): VPMADDWD of int16 weight pairs by a broadcast
// activation pair, so the conversion and FMA per block serve 8 outputs, not one.
//
// No overflow: a VPMADDUBSW lane is at most 2 * 63 * 127 = 16002 (Q6_K), 2 * 31 * 127 (Q5_K),
// 2 * 15 * 127 (Q4_K), within int16 (Q8_0: see block_q8_0); a super-block's int32 lane at most
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
  std::vector<int16_t> x16;     // M x K: Q8_0's q8 widened to int16 (the VPMADDWD operand of block_q8_0)
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
  // The types this file has a form for (not every GEMV type: Q4_0 .. Q5_1 and IQ4_XS have only the GEMV).
  return (t == gguf::GgmlType::Q8_0 || t == gguf::GgmlType::Q4_K || t == gguf::GgmlType::Q5_K ||
          t == gguf::GgmlType::Q6_K) &&
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
  // the f32 tiles' 108-118; Q8_0 230-245 (8 weight rows in the lanes, block_q8_0; 142-149 with the
  // conversion and FMA per 32 and pair of the earlier form) against 111-117. AVX-512 targets keep the f32 tiles (4 x 4
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
  int16_t* w16 = nullptr;     // Q8_0: kGgufTileRows x K int16 over vals and svec, groups of 8 rows interleaved
                              // (see unpack_q8_0_row); d then holds [group][block][8 rows]
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
  t.w16 = reinterpret_cast<int16_t*>(base + off);  // vals and svec are contiguous: kGgufTileRows * K is a multiple of 64
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

// Q8_0's tile: rows in groups of 8, each group's int16 weights as [block b][pair j][row][2]: the
// 32-byte vector (b, j) holds elements 32b + 2j and 32b + 2j + 1 of the group's 8 rows, so one
// VPMADDWD against an activation pair broadcast to every lane gives 8 rows' partial sums, and a block's
// 16 of them summed are 8 outputs' exact integer dot products over the block, scaled in one vector
// (block_q8_0). d[group][block][row]: the rows' f32 scales as one vector per block. A row past the
// tile's last (nw) has zero weights and scale.
constexpr int kQ8Group = 8;
constexpr int kQ8RowsX = 6;

HANPU_PREFILL_AVX2 inline void unpack_q8_0_row(const gguf::BlockQ8_0* b, const Tile& t, int64_t r) {
  const int64_t nb = t.K / 32, g = r / kQ8Group, lane = r % kQ8Group;
  int16_t* w = t.w16 + g * nb * 256 + 2 * lane;
  float* d = t.d + g * nb * kQ8Group + lane;
  for (int64_t i = 0; i < nb; ++i) {
    alignas(32) int16_t v[32];
    if (b != nullptr) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
      _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(v + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
      d[kQ8Group * i] = _cvtsh_ss(b[i].d);
    } else {
      std::memset(v, 0, sizeof v);
      d[kQ8Group * i] = 0.0f;
    }
    for (int j = 0; j < 16; ++j) std::memcpy(w + 256 * i + 16 * j, v + 2 * j, 4);
  }
}

template <Kind kind>
HANPU_PREFILL_AVX2 void unpack_row(const uint8_t* row, const Tile& t, int64_t r) {
  const int64_t K = t.K;
  uint8_t* vals = t.vals + r * K;
  if constexpr (kind == Kind::kQ8_0) {
    unpack_q8_0_row(reinterpret_cast<const gguf::BlockQ8_0*>(row), t, r);
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

// One Q8_0 block (32 elements) of MR activation rows x NG groups of 8 weight rows into int32 lanes:
// acc[m][g] = sum over the 16 pairs j of VPMADDWD(w_g[j], broadcast of x_m's pair j). w points at
// the group's block (16 vectors), x at the row's 32 int16. The general form (the tails) is
// intrinsics; 4 x 2 is assembly: GCC 12 turned the intrinsics into a tree of sums with every
// product spilled to the stack (seen in the disassembly; no faster than the old per-pair form).
template <int MR, int NG>
HANPU_PREFILL_AVX2 inline void q8_0_block_dot(const int16_t* const* w, const int16_t* const* x, __m256i (&acc)[MR][NG]) {
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) acc[m][g] = _mm256_setzero_si256();
  for (int j = 0; j < 16; ++j) {
    __m256i wv[NG];
    for (int g = 0; g < NG; ++g) wv[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[g] + 16 * j));
    for (int m = 0; m < MR; ++m) {
      int32_t pair;
      std::memcpy(&pair, x[m] + 2 * j, 4);
      const __m256i xv = _mm256_set1_epi32(pair);
      for (int g = 0; g < NG; ++g) acc[m][g] = _mm256_add_epi32(acc[m][g], _mm256_madd_epi16(wv[g], xv));
    }
  }
}

// 4 x 2: 8 accumulators, 2 weight vectors, the broadcast and the product (12 registers); per pair of
// elements 2 loads and 4 broadcasts for 8 VPMADDWD (4 cycles on Zen 3's two multiply pipes).
template <>
HANPU_PREFILL_AVX2 inline void q8_0_block_dot<4, 2>(const int16_t* const* w, const int16_t* const* x,
                                                     __m256i (&acc)[4][2]) {
  __m256i w0, w1, xv, tmp;
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
      "vmovdqa (%[pw0],%[idx],8), %[w0]\n\t"
      "vmovdqa (%[pw1],%[idx],8), %[w1]\n\t"
      "vpbroadcastd (%[px0],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a00], %[a00]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a01], %[a01]\n\t"
      "vpbroadcastd (%[px1],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a10], %[a10]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a11], %[a11]\n\t"
      "vpbroadcastd (%[px2],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a20], %[a20]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a21], %[a21]\n\t"
      "vpbroadcastd (%[px3],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a30], %[a30]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a31], %[a31]\n\t"
      "add $4, %[idx]\n\t"
      "cmp $64, %[idx]\n\t"
      "jne 1b\n\t"
      : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]), [a20] "=&x"(acc[2][0]), [a21] "=&x"(acc[2][1]), [a30] "=&x"(acc[3][0]), [a31] "=&x"(acc[3][1]), [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(xv), [t] "=&x"(tmp), [idx] "=&r"(idx)
      : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [px0] "r"(x[0]), [px1] "r"(x[1]), [px2] "r"(x[2]), [px3] "r"(x[3])
      : "cc", "memory");
}

// 6 x 2: 12 accumulators, 2 weight vectors, the broadcast and the product (all 16 registers); per
// pair of elements 2 loads and 6 broadcasts for 12 VPMADDWD.
template <>
HANPU_PREFILL_AVX2 inline void q8_0_block_dot<6, 2>(const int16_t* const* w, const int16_t* const* x,
                                                     __m256i (&acc)[6][2]) {
  __m256i w0, w1, xv, tmp;
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
      "vmovdqa %[a00], %[a40]\n\t"
      "vmovdqa %[a00], %[a41]\n\t"
      "vmovdqa %[a00], %[a50]\n\t"
      "vmovdqa %[a00], %[a51]\n\t"
      "xor %[idx], %[idx]\n\t"
      "1:\n\t"
      "vmovdqa (%[pw0],%[idx],8), %[w0]\n\t"
      "vmovdqa (%[pw1],%[idx],8), %[w1]\n\t"
      "vpbroadcastd (%[px0],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a00], %[a00]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a01], %[a01]\n\t"
      "vpbroadcastd (%[px1],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a10], %[a10]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a11], %[a11]\n\t"
      "vpbroadcastd (%[px2],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a20], %[a20]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a21], %[a21]\n\t"
      "vpbroadcastd (%[px3],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a30], %[a30]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a31], %[a31]\n\t"
      "vpbroadcastd (%[px4],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a40], %[a40]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a41], %[a41]\n\t"
      "vpbroadcastd (%[px5],%[idx]), %[x]\n\t"
      "vpmaddwd %[x], %[w0], %[t]\n\t"
      "vpaddd %[t], %[a50], %[a50]\n\t"
      "vpmaddwd %[x], %[w1], %[t]\n\t"
      "vpaddd %[t], %[a51], %[a51]\n\t"
      "add $4, %[idx]\n\t"
      "cmp $64, %[idx]\n\t"
      "jne 1b\n\t"
      : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]), [a20] "=&x"(acc[2][0]), [a21] "=&x"(acc[2][1]), [a30] "=&x"(acc[3][0]), [a31] "=&x"(acc[3][1]), [a40] "=&x"(acc[4][0]), [a41] "=&x"(acc[4][1]), [a50] "=&x"(acc[5][0]), [a51] "=&x"(acc[5][1]), [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(xv), [t] "=&x"(tmp), [idx] "=&r"(idx)
      : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [px0] "r"(x[0]), [px1] "r"(x[1]), [px2] "r"(x[2]), [px3] "r"(x[3]), [px4] "r"(x[4]), [px5] "r"(x[5])
      : "cc", "memory");
}

// Q8_0 (scale per 32 on both sides): MR activation rows x NG groups of 8 weight rows, lanes along
// the weight rows (unpack_q8_0_row). Per pair of elements j of block b: one broadcast of each
// activation row's two int16 (x16), one load of each group's vector, and per (activation row, group)
// a VPMADDWD and an add into int32 accumulators (8 of them for 4 x 2, with 2 weight vectors, the
// broadcast and the product: 12 registers; 6 x 2, the one in use, all 16). At the end of the block each accumulator holds 8
// outputs' exact integer sums over the block; one conversion and one FMA by (8 weight scales) x (the
// activation row's scale of the block) add them into f32 accumulators (on the stack: touched once
// per block). So the f32 work is 3 vector instructions per block and 8 outputs, where the layout
// along K (lanes = elements, one output per pair) paid a conversion, a multiply and an FMA per block
// and output: measured 136-141 GOP/s per CPU second that way against the K-quants' 230-250 (MLP
// shapes, M = 512, Zen 3, 2026-12-05), 218-238 this way with 4 x 2 and 234-246 with 6 x 2 (the
// weight loads shared by 6 activation rows). The activation scale stays per 32 (the decode GEMV's and
// llama.cpp's rule for Q8_0): per 256 would add rounding to the activations for no saving here.
//
// No overflow: a VPMADDWD lane is at most 2 * 128 * 127, a block's int32 sum 32 * 128 * 127 < 2^19,
// exact in f32 (below 2^24).
template <int MR, int NG>
HANPU_PREFILL_AVX2 void block_q8_0(const Tile& t, const ActivationRows& a, int64_t m0, int64_t nw, float* y,
                                   int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nb = K / 32;
  alignas(32) float facc[MR][NG][8];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) _mm256_store_ps(facc[m][g], _mm256_setzero_ps());
  const int16_t* wg[NG];
  const float* dg[NG];
  for (int g = 0; g < NG; ++g) {
    wg[g] = t.w16 + g * nb * 256;
    dg[g] = t.d + g * nb * kQ8Group;
  }
  const int16_t* xr[MR];
  const float* xs[MR];
  for (int m = 0; m < MR; ++m) {
    xr[m] = a.x16.data() + (m0 + m) * K;
    xs[m] = a.scale.data() + (m0 + m) * nb;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i acc[MR][NG];
    {
      const int16_t* wp[NG];
      const int16_t* xp[MR];
      for (int g = 0; g < NG; ++g) wp[g] = wg[g] + 256 * b;
      for (int m = 0; m < MR; ++m) xp[m] = xr[m] + 32 * b;
      q8_0_block_dot<MR, NG>(wp, xp, acc);
    }
    for (int g = 0; g < NG; ++g) {
      const __m256 dw = _mm256_load_ps(dg[g] + kQ8Group * b);
      for (int m = 0; m < MR; ++m) {
        const __m256 s = _mm256_mul_ps(dw, _mm256_broadcast_ss(xs[m] + b));
        _mm256_store_ps(facc[m][g], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][g]), s, _mm256_load_ps(facc[m][g])));
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    float* out = y + (m0 + m) * ldy;
    for (int g = 0; g < NG; ++g) {
      const int64_t n = std::min<int64_t>(kQ8Group, nw - kQ8Group * g);
      for (int64_t r = 0; r < n; ++r) {
        const float v = facc[m][g][r];
        out[kQ8Group * g + r] = accumulate ? out[kQ8Group * g + r] + v : v;
      }
    }
  }
}

template <Kind kind, int MR, int NR>
void run_block(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, float* y, int64_t ldy, bool accumulate) {
  block_kquant<kind, MR, NR>(t, r0, a, m0, y, ldy, accumulate);
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

// Q8_0's rows [m0, m0 + mr) for 1 <= mr <= MR.
template <int MR, int NG>
void run_q8_0_rows(const Tile& t, const ActivationRows& a, int64_t m0, int64_t mr, int64_t nw, float* y, int64_t ldy,
                   bool accumulate) {
  if constexpr (MR == 1) {
    block_q8_0<1, NG>(t, a, m0, nw, y, ldy, accumulate);
  } else {
    if (mr == MR) block_q8_0<MR, NG>(t, a, m0, nw, y, ldy, accumulate);
    else run_q8_0_rows<MR - 1, NG>(t, a, m0, mr, nw, y, ldy, accumulate);
  }
}

// One tile: nw rows unpacked, then every activation row against them, MR rows at a time (a
// block of x, MR * K bytes, stays in L1 across the tile's weight rows; the tile in L2).
template <Kind kind>
void run_tile(const uint8_t* rows, size_t row_bytes, int64_t nw, const Tile& t, const ActivationRows& a, float* y,
              int64_t ldy, bool accumulate) {
  if constexpr (kind == Kind::kQ8_0) {
    const int64_t groups = (nw + kQ8Group - 1) / kQ8Group;
    for (int64_t r = 0; r < groups * kQ8Group; ++r)
      unpack_q8_0_row(r < nw ? reinterpret_cast<const gguf::BlockQ8_0*>(rows + r * row_bytes) : nullptr, t, r);
    static_assert(kGgufTileRows == 2 * kQ8Group, "block_q8_0 takes a tile as one or two groups of 8 rows");
    for (int64_t m0 = 0; m0 < a.M; m0 += kQ8RowsX) {
      const int64_t mr = std::min<int64_t>(kQ8RowsX, a.M - m0);
      if (groups == 2) run_q8_0_rows<kQ8RowsX, 2>(t, a, m0, mr, nw, y, ldy, accumulate);
      else run_q8_0_rows<kQ8RowsX, 1>(t, a, m0, mr, nw, y, ldy, accumulate);
    }
  } else {
    for (int64_t r = 0; r < nw; ++r) unpack_row<kind>(rows + r * row_bytes, t, r);
    run_tile_blocks<kind, kRowsX, kRowsW>(nw, t, a, y, ldy, accumulate);
  }
}

// The activation quantizer of gguf_quantize_activation_row (linear_gguf.cpp) in AVX2: the same q8,
// scale and bsum16 bit for bit (Q8_0's rule: d = amax / 127, q = roundf(x / d), round half away
// from zero, x * (1 / d) unless 1 / d overflows, a block with a NaN or inf gets scale NaN and q 0);
// the f32 sums per 32 in a tree order instead of left to right (each within 5 roundings instead
// of 31 of the exact sum; the tests' bound counts every term). Measured 8-13% of the integer
// prefill's time with the scalar form (a libm roundf per element and a serial sum).
HANPU_PREFILL_AVX2 void quantize_row(const float* x, int64_t K, int64_t block, int8_t* q8, float* scale, float* sum_out,
                                     int16_t* bsum16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), fmax = _mm256_set1_ps(3.40282347e38f);
  for (int64_t s = 0; s < K / 32; ++s) {
    const float* xs = x + 32 * s;
    const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xs), _mm256_loadu_ps(xs + 8)),
                                   _mm256_add_ps(_mm256_loadu_ps(xs + 16), _mm256_loadu_ps(xs + 24)));
    sum_out[s] = hsum(v);
  }
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = x + b * block;
    __m256 amax = _mm256_setzero_ps();
    int finite = 0xff;
    for (int64_t j = 0; j < block; j += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + j), abs_mask);
      finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, fmax, _CMP_LE_OQ));  // false for NaN and inf
      amax = _mm256_max_ps(amax, a);
    }
    int8_t* qb = q8 + b * block;
    if (finite != 0xff) {
      std::memset(qb, 0, static_cast<size_t>(block));
      scale[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const bool reciprocal = std::isfinite(id);
    const __m256 vid = _mm256_set1_ps(id), vd = _mm256_set1_ps(d);
    for (int64_t j = 0; j < block; j += 32) {
      __m256i q[4];
      for (int u = 0; u < 4; ++u) {
        const __m256 xv = _mm256_loadu_ps(xb + j + 8 * u);
        const __m256 v = reciprocal ? _mm256_mul_ps(xv, vid) : _mm256_div_ps(xv, vd);
        // roundf: the truncation, plus sign(v) where the (exact) fraction is at least one half
        const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 frac = _mm256_and_ps(_mm256_sub_ps(v, t), abs_mask);
        const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ),
                                          _mm256_or_ps(one, _mm256_and_ps(v, sign_mask)));
        q[u] = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
      }
      // |q| <= 127: the saturating packs are exact; they interleave 128-bit lanes, the permute undoes it
      const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + j), p8);
    }
    scale[b] = d;
  }
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < K / 32; ++g) {  // sums of q8 per 16, exact in any order
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * g));
    __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);  // sums of 4
    s4 = _mm256_hadd_epi32(s4, s4);
    s4 = _mm256_hadd_epi32(s4, s4);  // lane 0: elements 0..15, lane 4: 16..31
    bsum16[2 * g] = static_cast<int16_t>(_mm256_extract_epi32(s4, 0));
    bsum16[2 * g + 1] = static_cast<int16_t>(_mm256_extract_epi32(s4, 4));
  }
}

// Q8_0: rows [m_begin, m_end) of q8 as int16 (block_q8_0 broadcasts them in pairs).
HANPU_PREFILL_AVX2 void widen_rows(ActivationRows& a, int64_t m_begin, int64_t m_end) {
  for (int64_t i = m_begin * a.K; i < m_end * a.K; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.x16.data() + i),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.xq8 + i))));
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
  quantize_row(x, K, block, q8, scale, sum, bsum16);
}

void gguf_prefill_int(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K, const float* x,
                      int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate) {
  if (!gguf_int_prefill_available(type))
    throw Error(std::string("gguf_prefill_int: no integer prefill for GGML type ") + gguf::block_format(type).name +
                " on this CPU / ISA selection (Q8_0, Q4_K, Q5_K, Q6_K with AVX2)");
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
  const bool widen = type == gguf::GgmlType::Q8_0;
  if (widen) a.x16.resize(static_cast<size_t>(M * K));
  {
    const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, M));
    engine.impl().run(parts, [&](int p, Workspace&) {
      for (int64_t m = M * p / parts; m < M * (p + 1) / parts; ++m)
        quantize_row(x + m * ldx, K, a.block, a.xq8 + m * K, a.scale.data() + m * (K / a.block),
                     a.sum.data() + m * (K / 32), a.bsum16.data() + m * (K / 16));
      if (widen) widen_rows(a, M * p / parts, M * (p + 1) / parts);
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
