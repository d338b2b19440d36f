// Integer prefill GEMM over GGUF blocks (Q8_0, Q4_K, Q5_K, Q6_K), AVX2: see linear_gguf.hpp
// (gguf_prefill_int) for what it computes and docs/GGUF.md ("Prefill") for the measurements that
// choose it.
//
// Layout of the work. The activations are quantized once per call, row by row, with the decode
// GEMV's quantizer (gguf_quantize_activation_row: int8 per 32 for Q8_0, per 256 for the K-quants,
// plus the f32 sums per 32 for the Q4_K / Q5_K min term and the int8 sums per 16 for Q6_K's -32).
// The weight rows are taken kGgufTileRows at a time and unpacked once into the worker's scratch:
// the K-quants' 4/5/6-bit values as bytes in element order (0..15 / 0..31 / 0..63, Q6_K before its
// -32), the sub-block scale of every 32 elements as a ready VPMADDWD operand (16 int16 lanes: one
// scale for Q4_K / Q5_K, Q6_K's two 16-element scales in the two 128-bit halves), the f32 block
// scale d, the f32 min terms dmin * m_j, Q6_K's 16 scales widened to int16. Q8_0's bytes are kept
// as they are, with their f32 scale per 32.
//
// Then register blocks of kRowsX activation rows by kRowsW weight rows run the whole K: per 32
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
#include <string>
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
  std::vector<int8_t> q8;       // M x K
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
  // AVX2 targets: the K-quants (Q4_K_M's Q4_K + Q6_K measured 1.4x the f32 tiles' prefill per CPU
  // second on Zen 3, docs/GGUF.md "Prefill"); Q8_0 keeps the f32 tiles (its scale per 32 costs a
  // conversion and an FMA per 32 weights and row pair on top of the two multiplies: measured even,
  // 105 vs 110 tokens/s at 512). AVX-512 targets keep the f32 tiles (4 x 4 register blocks of 512-bit
  // FMAs there): the integer form has no AVX512-VNNI variant, and the AVX2 one was not measured there.
  const std::string& target = isa_selection().target;
  return target.rfind("AVX3", 0) != 0 && t != gguf::GgmlType::Q8_0;
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

constexpr int kRowsX = 4;  // activation rows per register block
constexpr int kRowsW = 2;  // weight rows per register block: 8 int32 accumulators + 2 x 2 weight operands

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

// Rows [m0, m0 + MR) of x times tile rows [r0, r0 + NR), the whole K; y[m][n0 + r].
template <Kind kind, int MR, int NR>
HANPU_PREFILL_AVX2 void block_kquant(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, float* y,
                                     int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nsb = K / 256;
  __m256 facc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) facc[m][r] = _mm256_setzero_ps();
  const uint8_t* vals[NR];
  const int16_t* svec[NR];
  for (int r = 0; r < NR; ++r) {
    vals[r] = t.vals + (r0 + r) * K;
    svec[r] = t.svec + (r0 + r) * (K / 32) * 16;
  }
  const int8_t* xq[MR];
  for (int m = 0; m < MR; ++m) xq[m] = a.q8.data() + (m0 + m) * K;
  for (int64_t i = 0; i < nsb; ++i) {
    __m256i acc[MR][NR];
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const int64_t k = 256 * i + 32 * c;
      __m256i w[NR], s[NR];
      for (int r = 0; r < NR; ++r) {
        w[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(vals[r] + k));
        s[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(svec[r] + (8 * i + c) * 16));
      }
      for (int m = 0; m < MR; ++m) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[m] + k));
        for (int r = 0; r < NR; ++r)
          acc[m][r] = _mm256_add_epi32(acc[m][r], _mm256_madd_epi16(_mm256_maddubs_epi16(w[r], x), s[r]));
      }
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
    for (int m = 0; m < MR; ++m) {
      const float xs = a.scale[static_cast<size_t>((m0 + m) * nsb + i)];
      for (int r = 0; r < NR; ++r)
        facc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][r]), _mm256_set1_ps(t.d[(r0 + r) * t.nd + i] * xs),
                                     facc[m][r]);
    }
    if constexpr (kind == Kind::kQ4K || kind == Kind::kQ5K) {  // - dmin * m_j * X_j, X_j the f32 sum of x over j
      for (int r = 0; r < NR; ++r) {
        const __m256 mv = _mm256_loadu_ps(t.mins + (r0 + r) * (K / 32) + 8 * i);
        for (int m = 0; m < MR; ++m)
          facc[m][r] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(a.sum.data() + (m0 + m) * (K / 32) + 8 * i), facc[m][r]);
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
      wabs[r] = _mm256_abs_epi8(w[r]);
    }
    for (int m = 0; m < MR; ++m) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q8.data() + (m0 + m) * K + 32 * b));
      const float xs = a.scale[static_cast<size_t>((m0 + m) * nb + b)];
      for (int r = 0; r < NR; ++r) {
        // |w| times x with w's sign (VPSIGNB zeroes x where w is 0: the product is 0 anyway)
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(x, w[r])), ones);
        facc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d[r][b] * xs), facc[m][r]);
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

template <Kind kind, int NR>
void run_rows_tail(const Tile& t, int64_t r0, const ActivationRows& a, int64_t m0, int64_t mr, float* y, int64_t ldy,
                   bool accumulate) {
  switch (mr) {
    case 1: run_block<kind, 1, NR>(t, r0, a, m0, y, ldy, accumulate); break;
    case 2: run_block<kind, 2, NR>(t, r0, a, m0, y, ldy, accumulate); break;
    case 3: run_block<kind, 3, NR>(t, r0, a, m0, y, ldy, accumulate); break;
    default: run_block<kind, 4, NR>(t, r0, a, m0, y, ldy, accumulate); break;
  }
}

// One tile: nw rows unpacked, then every activation row against them, kRowsX rows at a time (a
// block of x, kRowsX * K bytes, stays in L1 across the tile's weight rows; the tile in L2).
template <Kind kind>
void run_tile(const uint8_t* rows, size_t row_bytes, int64_t nw, const Tile& t, const ActivationRows& a, float* y,
              int64_t ldy, bool accumulate) {
  for (int64_t r = 0; r < nw; ++r) unpack_row<kind>(rows + r * row_bytes, t, r);
  static_assert(kRowsX == 4 && kRowsW == 2, "run_rows_tail covers 1..4 x rows and 1..2 weight rows");
  for (int64_t m0 = 0; m0 < a.M; m0 += kRowsX) {
    const int64_t mr = std::min<int64_t>(kRowsX, a.M - m0);
    int64_t r0 = 0;
    for (; r0 + kRowsW <= nw; r0 += kRowsW) run_rows_tail<kind, 2>(t, r0, a, m0, mr, y + r0, ldy, accumulate);
    if (r0 < nw) run_rows_tail<kind, 1>(t, r0, a, m0, mr, y + r0, ldy, accumulate);
  }
}

ActivationRows& activation_rows() {
  thread_local ActivationRows rows;
  return rows;
}

}  // namespace

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
  a.q8.resize(static_cast<size_t>(M * K));
  a.scale.resize(static_cast<size_t>(M * (K / a.block)));
  a.sum.resize(static_cast<size_t>(M * (K / 32)));
  a.bsum16.resize(static_cast<size_t>(M * (K / 16)));
  {
    const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, M));
    engine.impl().run(parts, [&](int p, Workspace&) {
      for (int64_t m = M * p / parts; m < M * (p + 1) / parts; ++m)
        gguf_quantize_activation_row(x + m * ldx, K, a.block, a.q8.data() + m * K, a.scale.data() + m * (K / a.block),
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

void gguf_prefill_int(Engine&, gguf::GgmlType type, const void*, int64_t, int64_t, const float*, int64_t, float*,
                      int64_t, int64_t, int, bool) {
  throw Error(std::string("gguf_prefill_int: no integer prefill for GGML type ") + gguf::block_format(type).name +
              " in this build (x86-64 AVX2 only)");
}

#endif

}  // namespace hanpu::cpu
