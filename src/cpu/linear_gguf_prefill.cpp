// Integer prefill GEMM over GGUF blocks (Q8_0, Q4_K, Q5_K, Q6_K), AVX2 and, where the CPU has
// it, AVX512-VNNI ("The AVX512-VNNI form" below: the same arithmetic on 16-row tiles with VPDPBUSD):
// see linear_gguf.hpp (gguf_prefill_int) for what it computes and docs/GGUF.md ("Prefill", "AVX-512")
// for the measurements that choose it.
//
// Layout of the work. The activations are quantized once per call, row by row, with the decode
// GEMV's rule (gguf_quantize_activation_row: int8 per 32 for Q8_0, per 256 for the K-quants, plus
// the int8 sums per 16 and, from them, the sums of the quantized activations per 32 for the Q4_K /
// Q5_K min term), in an AVX2 form shared with the decode GEMV (gguf_avx2.hpp
// quantize_activation_row); for Q6_K the int8 values then get 128 added (offset_rows).
// The weight rows are taken kGgufTileRows (16) at a time and unpacked once into the worker's
// scratch, in groups of 8 rows interleaved so that lane r of a vector belongs to row r of the group
// ("row lanes"): the K-quants' 4/5/6-bit values as bytes (0..15 / 0..31 unsigned, Q6_K's q - 32 as
// signed -32..31), 4 consecutive elements of each of the 8 rows per vector (interleave_kquant_group),
// with the rows' sub-block scales as ready VPMADDWD operands, their f32 d, dmin * m_j and Q6_K's
// offset term as vectors of the 8 rows; Q8_0's values widened to int16, 2 elements of each row per vector
// (unpack_q8_0_group), its activations widened to int16 too.
//
// Then register blocks of activation rows x the tile's groups (4 x 2 groups for the K-quants, 6 x 2
// for Q8_0; the loop over a super-block / block in inline assembly) run the whole K: per step one
// load of each group's vector, one broadcast of each activation row's 4 bytes (2 int16 for Q8_0),
// and per (activation row, group) VPMADDUBSW (unsigned weight bytes times signed activation bytes;
// Q6_K: unsigned activation bytes + 128 times its signed q - 32) and VPMADDWD by the rows' sub-block scales (Q8_0: one VPMADDWD of int16 pairs) into int32 lanes,
// one lane per output. The unpacking is paid once per weight row and tile, not once per activation
// row, which is what a GEMV per row (the decode kernels here, llama.cpp's K-quant dot products)
// pays again for each. Per super-block (Q8_0: block of 32) and (activation row, group), i.e. per 8
// outputs: Q6_K's offset term subtracted (one VPSUBD), one conversion and one f32 FMA by (the 8
// rows' d) x the activation scale, Q4_K / Q5_K's min term as 8 f32 negative multiply-adds (of the rows' dmin * m_j
// by the sums of the quantized activations, block_kquant_rl). The earlier layout
// along K (lanes = 8 stretches of one row's elements) paid the conversion, scale and FMA per output
// and super-block (Q8_0: per 32 elements), a quarter of the K-quants' time and half of Q8_0's.
//
// No overflow: a VPMADDUBSW lane is at most 2 * 255 * 32 = 16320 (Q6_K: activations + 128 up to
// 255, q - 32 down to -32), 2 * 31 * 127 (Q5_K), 2 * 15 * 127 (Q4_K), within int16 (Q8_0: see
// block_q8_0); a super-block's int32 lane (one row's 256 elements) at most 64 * 2 * 16320 * 128 <
// 2^28 (Q6_K), its offset term 128 * 16 * 128 * 512 < 2^27. The integer sums are the decode GEMV's
// (Q6_K: sum sc (x + 128)(q - 32) - 128 sum sc (q - 32) = sum sc x (q - 32), the same integer; the
// same products, only summed in another order, and converted to f32 once per super-block), so the
// result meets the same bound (tests/test_linear_gguf.cpp).
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
  std::vector<float> qsum;      // M x K / 32 (Q4_K / Q5_K): s_x * B_j, the sum of the quantized activations
                                // x~ = s_x * q8 over 32 elements (B_j the integer sum of q8, exact; one rounding)
  std::vector<int16_t> bsum16;  // M x K / 16
  std::vector<int16_t> x16;     // M x K: Q8_0's q8 widened to int16 (the VPMADDWD operand of block_q8_0)
};

GgufPrefill parse_prefill_env() {
  const char* v = std::getenv("HANPU_GGUF_PREFILL");
  if (v == nullptr || *v == '\0') return GgufPrefill::kAuto;
  const std::string s(v);
  if (s == "int") return GgufPrefill::kIntegerDot;
  if (s == "f32") return GgufPrefill::kF32Tiles;
  if (s == "amx") return GgufPrefill::kAmxBf16;
  throw Error("HANPU_GGUF_PREFILL: got '" + s + "', expected 'int' (integer dot products on quantized activations), "
              "'f32' (dequantized f32 tiles) or 'amx' (bf16 tiles on AMX, linear_gguf_amx.cpp)");
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
  // the f32 tiles' 108-118; Q8_0 230-245 (8 weight rows in the lanes, block_q8_0; 142-149 with the
  // conversion and FMA per 32 and pair of the earlier form) against 111-117.
  // AVX-512 targets: every type but Q4_0 / IQ4_NL. Measured with the AVX2 form on an Intel Xeon
  // (AVX-512 with VNNI, AMX; KVM, 2 cores; loaded, 2026-12-05, the same benchmark, 1 thread,
  // medians of 3 interleaved rounds per shape): Q4_K 159-164, Q5_K 158-165, Q6_K 168-174, Q8_0
  // 113-114, IQ4_XS 87-92 against the 512-bit f32 tiles' 70-90, 76-89, 67-79, 80-84, 72-90; Q4_0 61-65
  // and IQ4_NL 63 against 76-89 and 68-84, so those two keep the f32 tiles there.
  const std::string& target = isa_selection().target;
  if (target.rfind("AVX3", 0) != 0) return true;
  return t != gguf::GgmlType::Q4_0 && t != gguf::GgmlType::IQ4_NL;
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
    case GgufPrefill::kAmxBf16:  // where AMX is not usable (else GgufLinear took that path first): the default
    case GgufPrefill::kAuto: break;
  }
  return gguf_int_prefill_default(t);
}

#if HANPU_X86_KERNELS
namespace {

#define HANPU_PREFILL_AVX2 __attribute__((target("avx2,fma,f16c")))

enum class Kind { kQ8_0, kQ4K, kQ5K, kQ6K };

// The K-quants' register block: kRowsX activation rows x the tile's 2 groups of 8 weight rows. 4 x 2
// keeps the loop's operands in registers (8 int32 accumulators, 2 weight and 2 scale vectors, the
// broadcast and the product: 14 of AVX2's 16): per step 2 loads and 4 broadcasts for 16
// multiplies (8 cycles on Zen 3's two multiply pipes).
constexpr int kRowsX = 4;

// Weight rows per vector in row lanes (8 int32 lanes): the tiles' groups, for every type.
constexpr int kQ8Group = 8;

// One tile of up to kGgufTileRows weight rows, unpacked (see the file comment). Pointers into the
// worker's scratch; per row strides.
struct Tile {
  int64_t K = 0;
  uint8_t* vals = nullptr;    // rows x K
  int16_t* svec = nullptr;    // rows x (K / 32) x 16 (K-quants)
  float* d = nullptr;         // rows x nd (K / 256, Q8_0: K / 32)
  float* mins = nullptr;      // rows x (K / 32) (Q4_K / Q5_K; Q6_K: its offset terms, int32 per super-block)
  int16_t* q6sc = nullptr;    // rows x (K / 16) (Q6_K's scales in the stage)
  int16_t* w16 = nullptr;     // Q8_0: kGgufTileRows x K int16 over vals and svec, groups of 8 rows interleaved
                              // (see unpack_q8_0_group); d then holds [group][block][8 rows]
  int64_t nd = 0;
};

size_t tile_bytes(int64_t K, int64_t rows) {
  // vals K, svec K (K/32 * 32 bytes), d K/32 * 4, mins K/32 * 4, q6sc K/16 * 2, each 64-aligned
  const size_t per_row = static_cast<size_t>(K + K + K / 8 + K / 8 + K / 8);
  return static_cast<size_t>(rows) * per_row + 5 * 64;
}

// The worker's scratch: the tile (kGgufTileRows rows) and, behind it, the staging of a group of 8
// rows (the K-quants unpack them in element order there, then interleave them into the tile).
size_t scratch_bytes(int64_t K) { return tile_bytes(K, kGgufTileRows) + tile_bytes(K, kQ8Group); }

Tile carve_tile(uint8_t* base, int64_t K, int64_t nd, int64_t rows = kGgufTileRows) {
  auto align = [](size_t n) { return (n + 63) & ~size_t{63}; };
  Tile t;
  t.K = K;
  t.nd = nd;
  size_t off = 0;
  const size_t R = static_cast<size_t>(rows);
  t.vals = base + off;
  t.w16 = reinterpret_cast<int16_t*>(base + off);  // vals and svec are contiguous: kGgufTileRows * K is a multiple of 64
  off = align(off + R * static_cast<size_t>(K));
  t.svec = reinterpret_cast<int16_t*>(base + off);
  off = align(off + R * static_cast<size_t>(K));
  t.d = reinterpret_cast<float*>(base + off);
  off = align(off + R * static_cast<size_t>(K / 32) * 4);
  t.mins = reinterpret_cast<float*>(base + off);
  off = align(off + R * static_cast<size_t>(K / 32) * 4);
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
constexpr int kQ8RowsX = 6;

// r[0..7] -> r[0..7] transposed as an 8 x 8 matrix of 32-bit elements: lane l of result j is lane j
// of input l. This is what puts 8 rows into row lanes (4 bytes, i.e. 2 int16 or 4 int8, of each
// row per vector): one pass of 24 shuffles per 8 vectors instead of a 4-byte copy per row and
// vector (the copies took 2% of the Q8_0 model's prefill, the K-quants' 1.5-2%).
HANPU_PREFILL_AVX2 inline void transpose_8x8_epi32(__m256i (&r)[8]) {
  __m256i t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
    u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
    u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// Group g of the tile from its 8 rows (b[l] the blocks of row l, nullptr for a row past the tile's
// last): per block, each row's 32 int8 widened to int16 (pairs 0..7 in one vector, 8..15 in another)
// and the two 8 x 8 transposes give the block's 16 vectors in row lanes.
HANPU_PREFILL_AVX2 inline void unpack_q8_0_group(const gguf::BlockQ8_0* const* b, const Tile& t, int64_t g) {
  const int64_t nb = t.K / 32;
  int16_t* w = t.w16 + g * nb * 256;
  float* d = t.d + g * nb * kQ8Group;
  for (int64_t i = 0; i < nb; ++i) {
    __m256i lo[8], hi[8];
    for (int l = 0; l < kQ8Group; ++l) {
      if (b[l] != nullptr) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[l][i].qs));
        lo[l] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
        hi[l] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
        d[kQ8Group * i + l] = _cvtsh_ss(b[l][i].d);
      } else {
        lo[l] = hi[l] = _mm256_setzero_si256();
        d[kQ8Group * i + l] = 0.0f;
      }
    }
    transpose_8x8_epi32(lo);
    transpose_8x8_epi32(hi);
    for (int j = 0; j < 8; ++j) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(w + 256 * i + 16 * j), lo[j]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(w + 256 * i + 16 * (j + 8)), hi[j]);
    }
  }
}

// Row r of a stage as a zero row: the padding rows past a tile's last weight row.
void zero_stage_row(const Tile& stage, int64_t r) {
  const int64_t K = stage.K;
  std::memset(stage.vals + r * K, 0, static_cast<size_t>(K));
  std::memset(stage.svec + r * (K / 32) * 16, 0, static_cast<size_t>(K));
  std::memset(stage.d + r * stage.nd, 0, static_cast<size_t>(stage.nd) * 4);
  std::memset(stage.mins + r * (K / 32), 0, static_cast<size_t>(K / 32) * 4);
  std::memset(stage.q6sc + r * (K / 16), 0, static_cast<size_t>(K / 16) * 2);
}

template <Kind kind>
HANPU_PREFILL_AVX2 void unpack_row(const uint8_t* row, const Tile& t, int64_t r) {
  const int64_t K = t.K;
  uint8_t* vals = t.vals + r * K;
  static_assert(kind != Kind::kQ8_0, "Q8_0 tiles are unpacked a group at a time (unpack_q8_0_group)");
  if constexpr (kind == Kind::kQ4K || kind == Kind::kQ5K) {
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
    int32_t* q6off = reinterpret_cast<int32_t*>(t.mins + r * (K / 32));  // mins is unused by Q6_K
    for (int64_t i = 0; i < K / 256; ++i) {
      const gguf::BlockQ6_K& blk = b[i];
      d[i] = _cvtsh_ss(blk.d);
      for (int g = 0; g < 16; ++g) q6sc[16 * i + g] = blk.scales[g];
      // element e of the super-block has scale sc[e / 16]: chunk c (32 elements) sc[2c] | sc[2c + 1]
      for (int c = 0; c < 8; ++c) {
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(blk.scales[2 * c + 1]), _mm_set1_epi16(blk.scales[2 * c]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(svec + (8 * i + c) * 16), s);
      }
      // The values q - 32 (signed, -32..31) and the row's offset term: the kernel multiplies them by
      // the activations + 128 (unsigned), so its sum carries 128 * sum_e sc_e (q_e - 32), which
      // depends on the weights only; computed here once per row and tile and subtracted per
      // super-block (block_kquant_rl).
      uint8_t* v = vals + 256 * i;
      const __m256i k32 = _mm256_set1_epi8(32);
      int32_t offset = 0;
      for (int h = 0; h < 2; ++h) {
        __m256i q[4];
        gguf_avx2::q6k_unpack_half(blk.ql + 64 * h, blk.qh + 32 * h, q);
        for (int k = 0; k < 4; ++k) {
          // sums of q over each 8 bytes; 16 elements = two of them, one scale
          alignas(32) uint64_t s8[4];
          _mm256_store_si256(reinterpret_cast<__m256i*>(s8), _mm256_sad_epu8(q[k], _mm256_setzero_si256()));
          const int e0 = 128 * h + 32 * k;  // first element of this vector
          offset += blk.scales[e0 / 16] * (static_cast<int32_t>(s8[0] + s8[1]) - 16 * 32) +
                    blk.scales[e0 / 16 + 1] * (static_cast<int32_t>(s8[2] + s8[3]) - 16 * 32);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 128 * h + 32 * k), _mm256_sub_epi8(q[k], k32));
        }
      }
      q6off[i] = 128 * offset;
    }
  }
}

// One Q8_0 block (32 elements) of MR activation rows x NG groups of 8 weight rows into int32 lanes:
// acc[m][g] = sum over the 16 pairs j of VPMADDWD(w_g[j], broadcast of x_m's pair j). w points at
// the group's block (16 vectors), x at the row's 32 int16. The general form (the tails) is
// intrinsics; 4 x 2 and 6 x 2 are assembly: GCC 12 turned the intrinsics into a tree of sums with every
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

// The assembly blocks (4 x 2 and 6 x 2), fully unrolled over the block's 16 pairs (no index
// register, no loop branch) and the first pair's products written straight into the accumulators
// (no zeroing, 8 or 12 fewer adds per block). The loop is bound by the vector operations it
// issues (per pair 2 loads, MR broadcasts, 2 MR VPMADDWD and 2 MR VPADDD on Zen 3's 4 vector
// pipes: 75-79% of the integer peak at best, benchmarks/avx2_int_loops.cpp); the unrolling
// measured no change beyond the noise against the loop (docs/GGUF.md, "Fourth round"). Per activation row m, for
// pair j (an .irp over the block's 16 pairs): the broadcast of x_m's pair j and the two groups'
// products.
#define HANPU_Q8_0_ROW(m)                                  \
  "vpbroadcastd 4*\\j(%[px" #m "]), %[x]\n\t"              \
  ".if \\j == 0\n\t"                                       \
  "vpmaddwd %[x], %[w0], %[a" #m "0]\n\t"                  \
  "vpmaddwd %[x], %[w1], %[a" #m "1]\n\t"                  \
  ".else\n\t"                                              \
  "vpmaddwd %[x], %[w0], %[t]\n\t"                         \
  "vpaddd %[t], %[a" #m "0], %[a" #m "0]\n\t"              \
  "vpmaddwd %[x], %[w1], %[t]\n\t"                         \
  "vpaddd %[t], %[a" #m "1], %[a" #m "1]\n\t"              \
  ".endif\n\t"
#define HANPU_Q8_0_PAIRS_BEGIN                                                 \
  ".irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15  # the 16 pairs\n\t" \
  "vmovdqa 32*\\j(%[pw0]), %[w0]\n\t"                                          \
  "vmovdqa 32*\\j(%[pw1]), %[w1]\n\t"

// 4 x 2: 8 accumulators, 2 weight vectors, the broadcast and the product (12 registers); per pair of
// elements 2 loads and 4 broadcasts for 8 VPMADDWD (4 cycles on Zen 3's two multiply pipes). The
// tail of 4 activation rows.
template <>
HANPU_PREFILL_AVX2 inline void q8_0_block_dot<4, 2>(const int16_t* const* w, const int16_t* const* x,
                                                     __m256i (&acc)[4][2]) {
  __m256i w0, w1, xv, tmp;
  __asm__(HANPU_Q8_0_PAIRS_BEGIN HANPU_Q8_0_ROW(0) HANPU_Q8_0_ROW(1) HANPU_Q8_0_ROW(2) HANPU_Q8_0_ROW(3) ".endr\n\t"
          : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]),
            [a20] "=&x"(acc[2][0]), [a21] "=&x"(acc[2][1]), [a30] "=&x"(acc[3][0]), [a31] "=&x"(acc[3][1]),
            [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(xv), [t] "=&x"(tmp)
          : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [px0] "r"(x[0]), [px1] "r"(x[1]), [px2] "r"(x[2]), [px3] "r"(x[3])
          : "memory");
}

// 6 x 2, the block in use: 12 accumulators, 2 weight vectors, the broadcast and the product (all 16
// registers); per pair of elements 2 loads and 6 broadcasts for 12 VPMADDWD.
template <>
HANPU_PREFILL_AVX2 inline void q8_0_block_dot<6, 2>(const int16_t* const* w, const int16_t* const* x,
                                                     __m256i (&acc)[6][2]) {
  __m256i w0, w1, xv, tmp;
  __asm__(HANPU_Q8_0_PAIRS_BEGIN HANPU_Q8_0_ROW(0) HANPU_Q8_0_ROW(1) HANPU_Q8_0_ROW(2) HANPU_Q8_0_ROW(3)
              HANPU_Q8_0_ROW(4) HANPU_Q8_0_ROW(5) ".endr\n\t"
          : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]),
            [a20] "=&x"(acc[2][0]), [a21] "=&x"(acc[2][1]), [a30] "=&x"(acc[3][0]), [a31] "=&x"(acc[3][1]),
            [a40] "=&x"(acc[4][0]), [a41] "=&x"(acc[4][1]), [a50] "=&x"(acc[5][0]), [a51] "=&x"(acc[5][1]),
            [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(xv), [t] "=&x"(tmp)
          : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [px0] "r"(x[0]), [px1] "r"(x[1]), [px2] "r"(x[2]), [px3] "r"(x[3]),
            [px4] "r"(x[4]), [px5] "r"(x[5])
          : "memory");
}
#undef HANPU_Q8_0_ROW
#undef HANPU_Q8_0_PAIRS_BEGIN

// Q8_0 (scale per 32 on both sides): MR activation rows x NG groups of 8 weight rows, lanes along
// the weight rows (unpack_q8_0_group). Per pair of elements j of block b: one broadcast of each
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

// The K-quants in row lanes (as Q8_0, block_q8_0): groups of 8 weight rows, lane r of a vector
// for row r. Tile layout, for group g, super-block i, chunk c of 32 elements, step q of 4:
//   vals [g][i][c][q][row][4 bytes]      the 4 values 32c + 4q .. 32c + 4q + 3 of each row
//   svec [g][i][c][16 int16]             Q4_K / Q5_K: row r's sub-block scale in lanes 2r, 2r + 1
//        [g][i][c][h][16 int16]          Q6_K: h = 0 for steps 0..3 (scale 2c), 1 for 4..7 (2c + 1)
//   d    [g][i][row]                     mins [g][i][j][row] (dmin * m_j, Q4_K / Q5_K)
//   mins [g][i][row] as int32            Q6_K: 128 * sum_e sc_e (q_e - 32), the offset term (unpack_row)
// A group's 8 rows are unpacked into the 8-row stage in element order (unpack_row) and moved from
// there into row lanes, the values by 8 x 8 transposes of 4-byte elements (transpose_8x8_epi32);
// rows past the tile's last (nw) are zero (their outputs are not stored).
template <Kind kind>
HANPU_PREFILL_AVX2 void interleave_kquant_group(const Tile& st, const Tile& t, int64_t g) {
  const int64_t K = t.K, nsb = K / 256;
  for (int64_t i = 0; i < nsb; ++i) {
    const int64_t gi = g * nsb + i;
    for (int k = 0; k < 8; ++k) {  // the super-block's 32-byte piece k of each row: steps e = 8k .. 8k + 7
      __m256i v[8];
      for (int l = 0; l < kQ8Group; ++l)
        v[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(st.vals + l * K + 256 * i + 32 * k));
      transpose_8x8_epi32(v);
      for (int j = 0; j < 8; ++j)
        _mm256_store_si256(reinterpret_cast<__m256i*>(t.vals + gi * 2048 + 32 * (8 * k + j)), v[j]);
    }
    for (int64_t l = 0; l < kQ8Group; ++l) {
      t.d[gi * 8 + l] = st.d[l * st.nd + i];
      if constexpr (kind == Kind::kQ6K)
        reinterpret_cast<int32_t*>(t.mins)[gi * 8 + l] = reinterpret_cast<const int32_t*>(st.mins + l * (K / 32))[i];
      for (int c = 0; c < 8; ++c) {
        if constexpr (kind == Kind::kQ6K) {
          const int16_t* q6 = st.q6sc + l * (K / 16) + 16 * i;
          for (int h = 0; h < 2; ++h) {
            int16_t* sv = t.svec + ((gi * 8 + c) * 2 + h) * 16 + 2 * l;
            sv[0] = q6[2 * c + h];
            sv[1] = q6[2 * c + h];
          }
        } else {
          const int16_t sc = st.svec[(l * (K / 32) + 8 * i + c) * 16];
          int16_t* sv = t.svec + (gi * 8 + c) * 16 + 2 * l;
          sv[0] = sc;
          sv[1] = sc;
          t.mins[(gi * 8 + c) * 8 + l] = st.mins[l * (K / 32) + 8 * i + c];
        }
      }
    }
  }
}

// One super-block of MR activation rows x NG groups of 8 weight rows into int32 lanes (lane r:
// row r's sum of scale x value x activation over the 256 elements): per chunk and step, one
// broadcast of 4 activation bytes per activation row and per (activation row, group) VPMADDUBSW,
// VPMADDWD by the group's scale vector, VPADDD. w, sc: the group's super-block; x: the row's.
template <Kind kind, int MR, int NG>
HANPU_PREFILL_AVX2 inline void kquant_rl_dot(const uint8_t* const* w, const int16_t* const* sc, const int8_t* const* x,
                                             __m256i (&acc)[MR][NG]) {
  constexpr int kScalesPerChunk = kind == Kind::kQ6K ? 2 : 1;
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) acc[m][g] = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    for (int q = 0; q < 8; ++q) {
      __m256i wv[NG], sv[NG];
      for (int g = 0; g < NG; ++g) {
        wv[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[g] + 256 * c + 32 * q));
        sv[g] = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(sc[g] + 16 * (kScalesPerChunk * c + (kind == Kind::kQ6K && q >= 4))));
      }
      for (int m = 0; m < MR; ++m) {
        int32_t four;
        std::memcpy(&four, x[m] + 32 * c + 4 * q, 4);
        const __m256i xv = _mm256_set1_epi32(four);
        for (int g = 0; g < NG; ++g)
          acc[m][g] = _mm256_add_epi32(
              acc[m][g], _mm256_madd_epi16(kind == Kind::kQ6K ? _mm256_maddubs_epi16(xv, wv[g])  // unsigned x + 128
                                                              : _mm256_maddubs_epi16(wv[g], xv),
                                           sv[g]));
      }
    }
  }
}

// The 4 x 2 blocks in assembly (GCC 12 made the intrinsics load-bound in the earlier layout: each
// load folded into every multiply that reads it as a memory operand, or accumulators spilled).
// Until 2026-12-05 one loop for the three types, one VPMADDWD by the scales per step (16 multiplies
// per step, 14 registers: 8 int32 sums, 2 weight and 2 scale vectors, the broadcast and the
// product); the tails (kquant_rl_dot above) keep that per-step form.

// Steps of 4 elements whose VPMADDUBSW pairs can be summed in int16 (VPADDW) before the one
// VPMADDWD by the rows' scales: a pair is at most 2 * 15 * 128 (Q4_K), 2 * 31 * 128 (Q5_K), 2 * 255
// * 32 (Q6_K: activations + 128 times q - 32, -32..31) in magnitude, so 8, 4 and 2 steps stay within
// 32767 (30720, 31744, 32640; the activations are at most 127 in magnitude, 128 counted for margin).
// Q4_K's 8 steps are a whole sub-block of 32 (its scale's run), Q6_K's 2 half of its 16.
template <Kind kind>
constexpr int kI16Steps = kind == Kind::kQ4K ? 8 : kind == Kind::kQ5K ? 4 : 2;

// The 4 x 2 block with int16 sums, the form Q4_K and Q5_K run: per step and (activation row, group)
// a VPMADDUBSW and a VPADDW into an int16 accumulator (the run's first step writes it), and per run
// of kI16Steps steps one VPMADDWD of it by the rows' scales (a memory operand) added into the int32
// sums: rows 0 and 1's in the 4 registers left beside the 8 int16 accumulators, 2 weight vectors,
// the broadcast and the product; rows 2 and 3's in acc32 on the stack (loaded, added and stored
// once per run). Per step 8 multiplies + 8 / kI16Steps instead of 16, and 16 + 16 / kI16Steps
// integer vector operations instead of 24. The integer sums are the same integers as the per-step
// form's (no lane leaves int16 on the way, bounds above), so the results are the same bits
// (tests/test_linear_gguf.cpp compares the block with the one-row tails, which keep the per-step
// form, and with the AVX512-VNNI form).
//
// Measured on an Intel Xeon (AVX-512 + AMX host under HANPU_ISA=avx2, KVM, 2026-12-05; loaded, CPU
// time, docs/GGUF.md "AVX2 prefill on the Intel Xeon"): the loops alone (benchmarks/avx2_int_loops.cpp,
// all sums in L1) 257 GOP/s per core with runs of 8 against the per-step form's 202 in registers, 220
// with runs of 4, 175 with runs of 2; the GEMM (gguf_prefill, 1 thread, MLP shapes) Q4_K 1.17-1.20x
// (1.03-1.15x with all 8 int32 sums on the stack), Q5_K 1.0-1.07x, Q6_K 0.82-0.88x (its runs of 2
// flush too often: kquant_rl_dot_4x2_q6k_pairs instead). Zen 3 (4 vector pipes for the adds, where
// the per-step form is bound by its 16 multiplies on 2) not measured.
// The weights' nibbles (0..15 / 0..31) are the unsigned operand, the activations the signed.
#define HANPU_KQUANT_I16_PRODUCT(w, dst) "vpmaddubsw %[x], %[" #w "], " dst "\n\t"
#define HANPU_KQUANT_I16_ROW(m)                                        \
  "vpbroadcastd 4*\\q(%[px" #m "],%[idx]), %[x]\n\t"                   \
  ".if (\\q & (%c[ks] - 1)) == 0  # the run's first step\n\t"          \
  HANPU_KQUANT_I16_PRODUCT(w0, "%[h" #m "0]")                          \
  HANPU_KQUANT_I16_PRODUCT(w1, "%[h" #m "1]")                          \
  ".else\n\t"                                                          \
  HANPU_KQUANT_I16_PRODUCT(w0, "%[t]")                                 \
  "vpaddw %[t], %[h" #m "0], %[h" #m "0]\n\t"                          \
  HANPU_KQUANT_I16_PRODUCT(w1, "%[t]")                                 \
  "vpaddw %[t], %[h" #m "1], %[h" #m "1]\n\t"                          \
  ".endif\n\t"
// (row m, group g): the int32 sums += VPMADDWD(h_mg, the group's scales of step q); rows 0 and 1's
// sums in the 4 registers left (a_mg), rows 2 and 3's in acc32 on the stack
#define HANPU_KQUANT_I16_SCALE(m, g) \
  "vpmaddwd (%[ps" #g "],%[idx]), %[h" #m #g "], %[h" #m #g "]\n\t"
#define HANPU_KQUANT_I16_FLUSH_REG(m, g) \
  HANPU_KQUANT_I16_SCALE(m, g) "vpaddd %[h" #m #g "], %[a" #m #g "], %[a" #m #g "]\n\t"
#define HANPU_KQUANT_I16_FLUSH_MEM(m, g)                                      \
  HANPU_KQUANT_I16_SCALE(m, g)                                                \
  "vpaddd 32*(2*(" #m "-2)+" #g ")(%[acc]), %[h" #m #g "], %[h" #m #g "]\n\t" \
  "vmovdqa %[h" #m #g "], 32*(2*(" #m "-2)+" #g ")(%[acc])\n\t"
template <Kind kind>
HANPU_PREFILL_AVX2 inline void kquant_rl_dot_4x2_i16(const uint8_t* const* w, const int16_t* const* sc,
                                                     const int8_t* const* x, __m256i (&acc)[4][2]) {
  static_assert(kind != Kind::kQ6K, "Q6_K's runs of 2 steps take kquant_rl_dot_4x2_q6k_pairs");
  alignas(32) int32_t acc32[4][8];  // rows 2 and 3
  __m256i h00, h01, h10, h11, h20, h21, h30, h31, w0, w1, xv, tmp;
  int64_t idx;
  __asm__(
      "vpxor %[a00], %[a00], %[a00]\n\t"
      "vmovdqa %[a00], %[a01]\n\t"
      "vmovdqa %[a00], %[a10]\n\t"
      "vmovdqa %[a00], %[a11]\n\t"
      ".irp k, 0, 1, 2, 3\n\t"
      "vmovdqa %[a00], 32*\\k(%[acc])\n\t"
      ".endr\n\t"
      "xor %[idx], %[idx]\n\t"
      "1:\n\t"
      ".irp q, 0, 1, 2, 3, 4, 5, 6, 7  # the 8 steps of 4 elements of the chunk\n\t"
      "vmovdqa 32*\\q(%[pw0],%[idx],8), %[w0]\n\t"
      "vmovdqa 32*\\q(%[pw1],%[idx],8), %[w1]\n\t"
      HANPU_KQUANT_I16_ROW(0) HANPU_KQUANT_I16_ROW(1) HANPU_KQUANT_I16_ROW(2) HANPU_KQUANT_I16_ROW(3)
      ".if ((\\q + 1) & (%c[ks] - 1)) == 0  # the run's last step\n\t"
      HANPU_KQUANT_I16_FLUSH_REG(0, 0) HANPU_KQUANT_I16_FLUSH_REG(0, 1) HANPU_KQUANT_I16_FLUSH_REG(1, 0)
      HANPU_KQUANT_I16_FLUSH_REG(1, 1) HANPU_KQUANT_I16_FLUSH_MEM(2, 0) HANPU_KQUANT_I16_FLUSH_MEM(2, 1)
      HANPU_KQUANT_I16_FLUSH_MEM(3, 0) HANPU_KQUANT_I16_FLUSH_MEM(3, 1)
      ".endif\n\t"
      ".endr\n\t"
      "add $32, %[idx]\n\t"
      "cmp $256, %[idx]\n\t"
      "jne 1b\n\t"
      : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]),
        [h00] "=&x"(h00), [h01] "=&x"(h01), [h10] "=&x"(h10), [h11] "=&x"(h11), [h20] "=&x"(h20), [h21] "=&x"(h21),
        [h30] "=&x"(h30), [h31] "=&x"(h31), [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(xv), [t] "=&x"(tmp),
        [idx] "=&r"(idx)
      : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [ps0] "r"(sc[0]), [ps1] "r"(sc[1]), [px0] "r"(x[0]), [px1] "r"(x[1]),
        [px2] "r"(x[2]), [px3] "r"(x[3]), [acc] "r"(&acc32[0][0]), [ks] "i"(kI16Steps<kind>)
      : "cc", "memory");
  for (int m = 2; m < 4; ++m)
    for (int g = 0; g < 2; ++g) acc[m][g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc32[2 * (m - 2) + g]));
}
#undef HANPU_KQUANT_I16_FLUSH_MEM
#undef HANPU_KQUANT_I16_FLUSH_REG
#undef HANPU_KQUANT_I16_SCALE
#undef HANPU_KQUANT_I16_ROW
#undef HANPU_KQUANT_I16_PRODUCT
// Q6_K's 4 x 2 block on pairs of steps: its int16 runs are 2 steps (2 * 2 * 255 * 32 = 32640), too
// short for the stack flush of kquant_rl_dot_4x2_i16, so the 8 int32 sums stay in registers and
// the weights are memory operands of the VPMADDUBSWs instead (8 sums, 2 scale vectors, the two
// steps' broadcasts and products: 14 registers). Per pair of steps and (activation row, group): two
// VPMADDUBSW (activations + 128 unsigned, q - 32 signed, as kquant_rl_dot_4x2), one VPADDW, one
// VPMADDWD by the scales, one VPADDD: 5 integer vector operations per 2 steps instead of 6, 3
// multiplies instead of 4, for twice the weight loads (from L1 / L2, 4 activation rows read each).
// The same integer sums, so the same bits (tests as kquant_rl_dot_4x2_i16). Measured as there:
// 1.01-1.04x the per-step form on the Xeon (the weight loads; Zen 3, bound by its multiplies, not measured).
#define HANPU_Q6K_PAIR_ROW(m)                                              \
  "vpbroadcastd 4*\\q(%[px" #m "],%[idx]), %[x]\n\t"                       \
  "vpbroadcastd 4*\\q+4(%[px" #m "],%[idx]), %[y]\n\t"                     \
  "vpmaddubsw 32*\\q(%[pw0],%[idx],8), %[x], %[t]\n\t"                     \
  "vpmaddubsw 32*\\q+32(%[pw0],%[idx],8), %[y], %[u]\n\t"                  \
  "vpaddw %[u], %[t], %[t]\n\t"                                            \
  "vpmaddwd %[s0], %[t], %[t]\n\t"                                         \
  "vpaddd %[t], %[a" #m "0], %[a" #m "0]\n\t"                              \
  "vpmaddubsw 32*\\q(%[pw1],%[idx],8), %[x], %[t]\n\t"                     \
  "vpmaddubsw 32*\\q+32(%[pw1],%[idx],8), %[y], %[u]\n\t"                  \
  "vpaddw %[u], %[t], %[t]\n\t"                                            \
  "vpmaddwd %[s1], %[t], %[t]\n\t"                                         \
  "vpaddd %[t], %[a" #m "1], %[a" #m "1]\n\t"
HANPU_PREFILL_AVX2 inline void kquant_rl_dot_4x2_q6k_pairs(const uint8_t* const* w, const int16_t* const* sc,
                                                         const int8_t* const* x, __m256i (&acc)[4][2]) {
  __m256i xv, yv, tmp, tmp2, s0, s1;
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
      ".irp q, 0, 2, 4, 6  # the chunk's 4 pairs of steps\n\t"
      ".if (\\q & 3) == 0  # the scales of the 16 elements of steps q .. q + 3\n\t"
      "vmovdqa 32*(\\q >> 2)(%[ps0],%[idx],2), %[s0]\n\t"
      "vmovdqa 32*(\\q >> 2)(%[ps1],%[idx],2), %[s1]\n\t"
      ".endif\n\t"
      HANPU_Q6K_PAIR_ROW(0) HANPU_Q6K_PAIR_ROW(1) HANPU_Q6K_PAIR_ROW(2) HANPU_Q6K_PAIR_ROW(3)
      ".endr\n\t"
      "add $32, %[idx]\n\t"
      "cmp $256, %[idx]\n\t"
      "jne 1b\n\t"
      : [a00] "=&x"(acc[0][0]), [a01] "=&x"(acc[0][1]), [a10] "=&x"(acc[1][0]), [a11] "=&x"(acc[1][1]),
        [a20] "=&x"(acc[2][0]), [a21] "=&x"(acc[2][1]), [a30] "=&x"(acc[3][0]), [a31] "=&x"(acc[3][1]),
        [x] "=&x"(xv), [y] "=&x"(yv), [t] "=&x"(tmp), [u] "=&x"(tmp2), [s0] "=&x"(s0), [s1] "=&x"(s1), [idx] "=&r"(idx)
      : [pw0] "r"(w[0]), [pw1] "r"(w[1]), [ps0] "r"(sc[0]), [ps1] "r"(sc[1]), [px0] "r"(x[0]), [px1] "r"(x[1]),
        [px2] "r"(x[2]), [px3] "r"(x[3])
      : "cc", "memory");
}
#undef HANPU_Q6K_PAIR_ROW
template <>
HANPU_PREFILL_AVX2 inline void kquant_rl_dot<Kind::kQ4K, 4, 2>(const uint8_t* const* w, const int16_t* const* sc,
                                                              const int8_t* const* x, __m256i (&acc)[4][2]) {
  kquant_rl_dot_4x2_i16<Kind::kQ4K>(w, sc, x, acc);
}
template <>
HANPU_PREFILL_AVX2 inline void kquant_rl_dot<Kind::kQ5K, 4, 2>(const uint8_t* const* w, const int16_t* const* sc,
                                                              const int8_t* const* x, __m256i (&acc)[4][2]) {
  kquant_rl_dot_4x2_i16<Kind::kQ5K>(w, sc, x, acc);  // Q4_K's layout (values 0..31 instead of 0..15)
}
template <>
HANPU_PREFILL_AVX2 inline void kquant_rl_dot<Kind::kQ6K, 4, 2>(const uint8_t* const* w, const int16_t* const* sc,
                                                              const int8_t* const* x, __m256i (&acc)[4][2]) {
  kquant_rl_dot_4x2_q6k_pairs(w, sc, x, acc);
}

// Rows [m0, m0 + MR) of x times the tile's NG groups, the whole K. Per super-block and (activation
// row, group), i.e. per 8 outputs: Q6_K's offset term subtracted in integers (one VPSUBD; until
// 2026-12-05 the -32 term was 8 VPMADDWD of the rows' scale pairs by the row's int8 sums per 16,
// which held Q6_K 15% below its speed now), one conversion and one FMA by (8 rows' d) x activation scale, and
// Q4_K / Q5_K's min term as 8 FNMADDs (the rows' dmin * m_j times qsum, the sum of the quantized
// activations over sub-block j: llama.cpp's and the decode GEMV's min term, dmin * s_x * sum_j m_j
// B_j with B_j the integer sum of q8, whose s_x * B_j is rounded once to f32 here instead of
// multiplying m_j by B_j in integers: that form, 4 VPMADDWD per 8 outputs on the multiply pipes the
// main loop saturates, measured 2-8% slower on Q4_K. Before 2026-12-05 the sums were the f32 sums of
// the unquantized x, which leave the min's share of each weight outside the activation rounding's
// cancellation: 2.4x the decode's logits error, docs/GGUF.md "Q4_K / Q5_K min term in integers").
// The layout along K (lanes = elements, one output per pair) paid the conversion, scale, FMA and
// min term per output: about a quarter of its time.
template <Kind kind, int MR, int NG>
HANPU_PREFILL_AVX2 void block_kquant_rl(const Tile& t, const ActivationRows& a, int64_t m0, int64_t nw, float* y,
                                        int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nsb = K / 256;
  constexpr int kScalesPerChunk = kind == Kind::kQ6K ? 2 : 1;
  alignas(32) float facc[MR][NG][8];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) _mm256_store_ps(facc[m][g], _mm256_setzero_ps());
  for (int64_t i = 0; i < nsb; ++i) {
    __m256i acc[MR][NG];
    {
      const uint8_t* wp[NG];
      const int16_t* sp[NG];
      const int8_t* xp[MR];
      for (int g = 0; g < NG; ++g) {
        wp[g] = t.vals + (g * nsb + i) * 2048;
        sp[g] = t.svec + (g * nsb + i) * 8 * 16 * kScalesPerChunk;
      }
      for (int m = 0; m < MR; ++m) xp[m] = a.xq8 + (m0 + m) * K + 256 * i;
      kquant_rl_dot<kind, MR, NG>(wp, sp, xp, acc);
    }
    if constexpr (kind == Kind::kQ6K) {  // the offset term 128 * sum_e sc_e (q_e - 32) of the 8 rows (unpack_row)
      for (int g = 0; g < NG; ++g) {
        const __m256i off = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.mins) + g * nsb + i);
        for (int m = 0; m < MR; ++m) acc[m][g] = _mm256_sub_epi32(acc[m][g], off);
      }
    }
    __m256 f[MR][NG];
    for (int g = 0; g < NG; ++g) {
      const __m256 dw = _mm256_load_ps(t.d + (g * nsb + i) * 8);
      for (int m = 0; m < MR; ++m) {
        const __m256 xs = _mm256_broadcast_ss(&a.scale[static_cast<size_t>((m0 + m) * nsb + i)]);
        f[m][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][g]), _mm256_mul_ps(dw, xs), _mm256_load_ps(facc[m][g]));
      }
    }
    if constexpr (kind == Kind::kQ4K || kind == Kind::kQ5K) {
      // sub-block by sub-block, so that the groups' min vectors and each row's sum are loaded once
      // for all the block's outputs (the order (output, sub-block) loaded both per FNMADD; the min
      // term took 8-12% of the Q4_K GEMM's time that way, 3-5% this way: one thread, MLP shapes,
      // M = 512, Zen 3, 2026-12-05, against the same loop without it)
      for (int j = 0; j < 8; ++j) {
        __m256 mv[NG];
        for (int g = 0; g < NG; ++g) mv[g] = _mm256_load_ps(t.mins + ((g * nsb + i) * 8 + j) * 8);
        for (int m = 0; m < MR; ++m) {
          const __m256 xsum = _mm256_broadcast_ss(a.qsum.data() + (m0 + m) * (K / 32) + 8 * i + j);
          for (int g = 0; g < NG; ++g) f[m][g] = _mm256_fnmadd_ps(mv[g], xsum, f[m][g]);
        }
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < NG; ++g) _mm256_store_ps(facc[m][g], f[m][g]);
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

template <Kind kind, int MR, int NG>
void run_kquant_rl_rows(const Tile& t, const ActivationRows& a, int64_t m0, int64_t mr, int64_t nw, float* y,
                        int64_t ldy, bool accumulate) {
  if constexpr (MR == 1) {
    block_kquant_rl<kind, 1, NG>(t, a, m0, nw, y, ldy, accumulate);
  } else {
    if (mr == MR) block_kquant_rl<kind, MR, NG>(t, a, m0, nw, y, ldy, accumulate);
    else run_kquant_rl_rows<kind, MR - 1, NG>(t, a, m0, mr, nw, y, ldy, accumulate);
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
void run_tile(const uint8_t* rows, size_t row_bytes, int64_t nw, const Tile& t, const Tile& stage,
              const ActivationRows& a, float* y, int64_t ldy, bool accumulate) {
  if constexpr (kind == Kind::kQ8_0) {
    const int64_t groups = (nw + kQ8Group - 1) / kQ8Group;
    for (int64_t g = 0; g < groups; ++g) {
      const gguf::BlockQ8_0* b[kQ8Group];
      for (int64_t l = 0; l < kQ8Group; ++l) {
        const int64_t r = kQ8Group * g + l;
        b[l] = r < nw ? reinterpret_cast<const gguf::BlockQ8_0*>(rows + r * row_bytes) : nullptr;
      }
      unpack_q8_0_group(b, t, g);
    }
    static_assert(kGgufTileRows == 2 * kQ8Group, "block_q8_0 takes a tile as one or two groups of 8 rows");
    for (int64_t m0 = 0; m0 < a.M; m0 += kQ8RowsX) {
      const int64_t mr = std::min<int64_t>(kQ8RowsX, a.M - m0);
      if (groups == 2) run_q8_0_rows<kQ8RowsX, 2>(t, a, m0, mr, nw, y, ldy, accumulate);
      else run_q8_0_rows<kQ8RowsX, 1>(t, a, m0, mr, nw, y, ldy, accumulate);
    }
  } else {
    const int64_t groups = (nw + kQ8Group - 1) / kQ8Group;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t l = 0; l < kQ8Group; ++l) {
        const int64_t r = kQ8Group * g + l;
        if (r < nw) {
          unpack_row<kind>(rows + r * row_bytes, stage, l);
        } else {
          zero_stage_row(stage, l);
        }
      }
      interleave_kquant_group<kind>(stage, t, g);
    }
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowsX) {
      const int64_t mr = std::min<int64_t>(kRowsX, a.M - m0);
      if (groups == 2) run_kquant_rl_rows<kind, kRowsX, 2>(t, a, m0, mr, nw, y, ldy, accumulate);
      else run_kquant_rl_rows<kind, kRowsX, 1>(t, a, m0, mr, nw, y, ldy, accumulate);
    }
  }
}

// Q8_0: rows [m_begin, m_end) of q8 as int16 (block_q8_0 broadcasts them in pairs).
HANPU_PREFILL_AVX2 void widen_rows(ActivationRows& a, int64_t m_begin, int64_t m_end) {
  for (int64_t i = m_begin * a.K; i < m_end * a.K; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.x16.data() + i),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.xq8 + i))));
}

// Q6_K: rows [m_begin, m_end) of q8 as unsigned bytes q8 + 128 (the sign bit flipped), the
// unsigned operand of its VPMADDUBSW (kquant_rl_dot).
HANPU_PREFILL_AVX2 void offset_rows(ActivationRows& a, int64_t m_begin, int64_t m_end) {
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = m_begin * a.K; i < m_end * a.K; i += 32) {
    auto* p = reinterpret_cast<__m256i*>(a.xq8 + i);
    _mm256_store_si256(p, _mm256_xor_si256(_mm256_load_si256(p), sign));
  }
}

// ---------------------------------------------------------------------------------------------
// The AVX512-VNNI form (gguf_int_prefill_vnni_available): the same work on 512-bit registers, one
// tile of 16 weight rows in the 16 int32 lanes (row lanes as above, lane r for row r), and
// VPDPBUSD (4 products of unsigned x signed bytes summed into each int32 lane, no int16
// saturation step, no separate add) for VPMADDUBSW + VPMADDWD + VPADDD. What VPDPBUSD cannot take
// is the K-quants' sub-block scale (the AVX2 form's VPMADDWD operand): each sub-block's products are
// summed into a zeroed int32 vector and multiplied by the rows' scales once per sub-block:
//   Q4_K: per 16 elements (4 VPDPBUSD) one VPDPWSSD of that sum by the scales: the sum is at most
//         16 * 15 * 128 = 30720 in magnitude, so it is its own low int16 (high int16 0 or -1), and
//         each scale lane holds (sc, 0) as int16: VPDPWSSD adds sum * sc, fused;
//   Q5_K: per 32 elements (8 VPDPBUSD) VPMULLD by the scales and VPADDD (the sum, up to
//         32 * 31 * 128, is not an int16);
//   Q6_K: per 16 elements (its scale's run) VPMULLD and VPADDD; the activations + 128 as the
//         unsigned operand, q - 32 the signed one, and the offset term subtracted, as in the AVX2 form.
// Q8_0 has no sub-block: its activations + 128 (unsigned) times the signed weights, 8 VPDPBUSD per
// block of 32, the accumulators starting at -128 * (the rows' sum of weights over the block), the
// offset term computed once per row and block at unpacking. So the block's int32 is sum x w exactly
// (at most 32 * 255 * 128 on the way), as the AVX2 form's int16 VPMADDWD gives it; the activation
// offset (rather than the weights') keeps that term a function of the weights alone, one vector per
// block shared by every activation row, where a weight offset (w + 128) would need 128 * (the
// activation row's sum per block), one broadcast and subtraction per activation row and block.
// Every super-block / block thus yields the AVX2 form's int32 sums (the same integers: sums of the
// same products; no intermediate beyond int32, bounds above), and the f32 work on them is the same
// operations (conversion, FMA by d x activation scale, Q4_K / Q5_K's 8 FNMADDs j = 0..7), so the
// results are the AVX2 form's bit for bit (tests/test_linear_gguf.cpp).
//
// Register block: kVnniRowsX activation rows x the tile's 16 rows, the whole K, f32 accumulators in
// registers (32 of them here). Per step of 4 elements one load of the tile's 64 bytes and per
// activation row a broadcast of its 4 bytes and a VPDPBUSD.
#define HANPU_PREFILL_VNNI __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

constexpr int kVnniRowsX = 8;

// Tile and 16-row stage (the K-quants are unpacked in element order there by unpack_row, then
// interleaved). The VNNI tile, in the Tile's regions (each large enough):
//   vals [i][s][row][4 bytes]   super-block i (Q8_0: block), step s of 4 elements (64 / 8 per i), 64 bytes
//   svec as int32 [i][c][row]   Q4_K / Q5_K: sub-block c's scale; Q6_K [i][e][row], e = 0..15 per 16
//   d    [i][row]               mins [i][j][row] (Q4_K / Q5_K dmin * m_j)
//   mins as int32 [i][row]      Q6_K: its offset term; Q8_0: -128 * sum of the block's weights
size_t vnni_scratch_bytes(int64_t K) { return 2 * tile_bytes(K, kGgufTileRows); }

template <Kind kind>
HANPU_PREFILL_AVX2 void interleave_kquant_vnni(const Tile& st, const Tile& t) {
  const int64_t K = t.K, nsb = K / 256;
  auto* sc32 = reinterpret_cast<int32_t*>(t.svec);
  for (int64_t i = 0; i < nsb; ++i) {
    for (int k = 0; k < 8; ++k) {    // the super-block's 32-byte piece k of each row: steps 8k .. 8k + 7
      for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7: the low / high 32 bytes of each step
        __m256i v[8];
        for (int l = 0; l < 8; ++l)
          v[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(st.vals + (8 * h + l) * K + 256 * i + 32 * k));
        transpose_8x8_epi32(v);
        for (int j = 0; j < 8; ++j)
          _mm256_store_si256(reinterpret_cast<__m256i*>(t.vals + i * 4096 + 64 * (8 * k + j) + 32 * h), v[j]);
      }
    }
    for (int64_t l = 0; l < kGgufTileRows; ++l) {
      t.d[i * 16 + l] = st.d[l * st.nd + i];
      if constexpr (kind == Kind::kQ6K) {
        reinterpret_cast<int32_t*>(t.mins)[i * 16 + l] = reinterpret_cast<const int32_t*>(st.mins + l * (K / 32))[i];
        const int16_t* q6 = st.q6sc + l * (K / 16) + 16 * i;
        for (int e = 0; e < 16; ++e) sc32[(i * 16 + e) * 16 + l] = q6[e];
      } else {
        for (int c = 0; c < 8; ++c) {
          sc32[(i * 8 + c) * 16 + l] = st.svec[(l * (K / 32) + 8 * i + c) * 16];
          t.mins[(i * 8 + c) * 16 + l] = st.mins[l * (K / 32) + 8 * i + c];
        }
      }
    }
  }
}

// Q8_0's tile: per block and half of the rows, the rows' 32 bytes transposed into 8 steps; the
// offset term as the sum of each row's 4 bytes per step (VPDPBUSD of ones by the step) over the 8
// steps. A row past nw is zero (weights, scale and offset).
HANPU_PREFILL_VNNI void unpack_q8_0_vnni(const uint8_t* rows, size_t row_bytes, int64_t nw, const Tile& t) {
  const int64_t nb = t.K / 32;
  auto* off = reinterpret_cast<int32_t*>(t.mins);
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < 2; ++h) {
      __m256i v[8];
      for (int l = 0; l < 8; ++l) {
        const int64_t r = 8 * h + l;
        if (r < nw) {
          const gguf::BlockQ8_0& blk = reinterpret_cast<const gguf::BlockQ8_0*>(rows + r * row_bytes)[b];
          v[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
          t.d[b * 16 + r] = _cvtsh_ss(blk.d);
        } else {
          v[l] = _mm256_setzero_si256();
          t.d[b * 16 + r] = 0.0f;
        }
      }
      transpose_8x8_epi32(v);
      __m256i sum = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(t.vals + b * 512 + 64 * j + 32 * h), v[j]);
        sum = _mm256_dpbusd_epi32(sum, ones, v[j]);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(off + b * 16 + 8 * h),
                          _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)));
    }
  }
}

// The MR rows' 16 outputs (nw of them stored), added to y where accumulate (out + v, as the AVX2
// form's scalar store).
template <int MR>
HANPU_PREFILL_VNNI inline void store_vnni(const __m512 (&f)[MR], int64_t m0, int64_t nw, float* y, int64_t ldy,
                                          bool accumulate) {
  const auto mask = static_cast<__mmask16>((1u << nw) - 1);
  for (int m = 0; m < MR; ++m) {
    float* out = y + (m0 + m) * ldy;
    const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), f[m]) : f[m];
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

// acc += VPDPBUSD(w, 4 bytes at x broadcast): the broadcast folded into the instruction's memory
// operand ({1to16}), which GCC 12 does not do from the intrinsics (it emits a VPBROADCASTD per
// activation row and step, one more instruction per VPDPBUSD).
HANPU_PREFILL_VNNI inline void dpbusd_bcast(__m512i& acc, __m512i w, const int8_t* x) {
  __asm__("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(x)));
}

template <Kind kind, int MR>
HANPU_PREFILL_VNNI void block_kquant_vnni(const Tile& t, const ActivationRows& a, int64_t m0, int64_t nw, float* y,
                                          int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nsb = K / 256;
  // sums per chunk of 32: two of 16 for Q4_K (VPDPWSSD) and Q6_K (its scale per 16), one for Q5_K
  constexpr int kParts = kind == Kind::kQ5K ? 1 : 2, kSteps = 8 / kParts;
  const auto* sc32 = reinterpret_cast<const int32_t*>(t.svec);
  __m512 f[MR];
  for (int m = 0; m < MR; ++m) f[m] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* w = t.vals + i * 4096;
    const int8_t* xp[MR];
    for (int m = 0; m < MR; ++m) xp[m] = a.xq8 + (m0 + m) * K + 256 * i;
    __m512i acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_si512();
    // not unrolled over the chunks: the chunk's code (8 x 8 VPDPBUSD and their broadcasts, about 1 KiB)
    // stays in the decoded-instruction cache, the whole super-block's (8 KiB) would not
#pragma GCC unroll 1
    for (int c = 0; c < 8; ++c) {
#pragma GCC unroll 2
      for (int h = 0; h < kParts; ++h) {
        __m512i s[MR];
        for (int m = 0; m < MR; ++m) s[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = kSteps * h; q < kSteps * (h + 1); ++q) {
          const __m512i wv = _mm512_load_si512(w + 64 * (8 * c + q));
          for (int m = 0; m < MR; ++m) {
            if constexpr (kind == Kind::kQ6K) {  // unsigned x + 128 (a register broadcast), signed q - 32
              int32_t four;
              std::memcpy(&four, xp[m] + 32 * c + 4 * q, 4);
              s[m] = _mm512_dpbusd_epi32(s[m], _mm512_set1_epi32(four), wv);
            } else {  // unsigned q, signed x: x's 4 bytes as the memory operand, broadcast by the instruction
              dpbusd_bcast(s[m], wv, xp[m] + 32 * c + 4 * q);
            }
          }
        }
        if constexpr (kind == Kind::kQ4K) {
          const __m512i scv = _mm512_loadu_si512(sc32 + (i * 8 + c) * 16);
          for (int m = 0; m < MR; ++m) acc[m] = _mm512_dpwssd_epi32(acc[m], s[m], scv);
        } else {
          const __m512i scv = _mm512_loadu_si512(sc32 + ((i * 8 + c) * kParts + h) * 16);
          for (int m = 0; m < MR; ++m) acc[m] = _mm512_add_epi32(acc[m], _mm512_mullo_epi32(s[m], scv));
        }
      }
    }
    if constexpr (kind == Kind::kQ6K) {
      const __m512i off = _mm512_loadu_si512(reinterpret_cast<const int32_t*>(t.mins) + i * 16);
      for (int m = 0; m < MR; ++m) acc[m] = _mm512_sub_epi32(acc[m], off);
    }
    const __m512 dw = _mm512_loadu_ps(t.d + i * 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 xs = _mm512_set1_ps(a.scale[static_cast<size_t>((m0 + m) * nsb + i)]);
      f[m] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, acc[m]), _mm512_mul_ps(dw, xs), f[m]);
    }
    if constexpr (kind == Kind::kQ4K || kind == Kind::kQ5K) {
      for (int j = 0; j < 8; ++j) {
        const __m512 mv = _mm512_loadu_ps(t.mins + (i * 8 + j) * 16);
        for (int m = 0; m < MR; ++m)
          f[m] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(a.qsum[static_cast<size_t>((m0 + m) * (K / 32) + 8 * i + j)]), f[m]);
      }
    }
  }
  store_vnni<MR>(f, m0, nw, y, ldy, accumulate);
}

template <int MR>
HANPU_PREFILL_VNNI void block_q8_0_vnni(const Tile& t, const ActivationRows& a, int64_t m0, int64_t nw, float* y,
                                        int64_t ldy, bool accumulate) {
  const int64_t K = t.K, nb = K / 32;
  const auto* off = reinterpret_cast<const int32_t*>(t.mins);
  __m512 f[MR];
  for (int m = 0; m < MR; ++m) f[m] = _mm512_setzero_ps();
  const int8_t* xr[MR];
  const float* xs[MR];
  for (int m = 0; m < MR; ++m) {
    xr[m] = a.xq8 + (m0 + m) * K;
    xs[m] = a.scale.data() + (m0 + m) * nb;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const __m512i o = _mm512_loadu_si512(off + b * 16);
    __m512i acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = o;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i wv = _mm512_load_si512(t.vals + b * 512 + 64 * j);
      for (int m = 0; m < MR; ++m) {
        int32_t four;
        std::memcpy(&four, xr[m] + 32 * b + 4 * j, 4);
        acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_set1_epi32(four), wv);  // unsigned x + 128, signed w
      }
    }
    const __m512 dw = _mm512_loadu_ps(t.d + b * 16);
    for (int m = 0; m < MR; ++m)
      f[m] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, acc[m]), _mm512_mul_ps(dw, _mm512_set1_ps(xs[m][b])), f[m]);
  }
  store_vnni<MR>(f, m0, nw, y, ldy, accumulate);
}

// Rows [m0, m0 + mr) for 1 <= mr <= MR.
template <Kind kind, int MR>
void run_vnni_rows(const Tile& t, const ActivationRows& a, int64_t m0, int64_t mr, int64_t nw, float* y, int64_t ldy,
                   bool accumulate) {
  if (mr == MR || MR == 1) {
    if constexpr (kind == Kind::kQ8_0) block_q8_0_vnni<MR>(t, a, m0, nw, y, ldy, accumulate);
    else block_kquant_vnni<kind, MR>(t, a, m0, nw, y, ldy, accumulate);
  } else if constexpr (MR > 1) {
    run_vnni_rows<kind, MR - 1>(t, a, m0, mr, nw, y, ldy, accumulate);
  }
}

template <Kind kind>
void run_tile_vnni(const uint8_t* rows, size_t row_bytes, int64_t nw, const Tile& t, const Tile& stage,
                   const ActivationRows& a, float* y, int64_t ldy, bool accumulate) {
  if constexpr (kind == Kind::kQ8_0) {
    unpack_q8_0_vnni(rows, row_bytes, nw, t);
  } else {
    for (int64_t l = 0; l < kGgufTileRows; ++l) {
      if (l < nw) {
        unpack_row<kind>(rows + l * row_bytes, stage, l);
      } else {
        zero_stage_row(stage, l);
      }
    }
    interleave_kquant_vnni<kind>(stage, t);
  }
  for (int64_t m0 = 0; m0 < a.M; m0 += kVnniRowsX) {
    const int64_t mr = std::min<int64_t>(kVnniRowsX, a.M - m0);
    run_vnni_rows<kind, kVnniRowsX>(t, a, m0, mr, nw, y, ldy, accumulate);
  }
}

bool vnni_cpu() {
  static const bool cpu = x86::avx512_core_usable() && x86::has_avx512_vnni();
  return cpu;
}

GgufIntForm parse_int_form_env() {
  const char* v = std::getenv("HANPU_GGUF_INT_FORM");
  if (v == nullptr || *v == '\0') return GgufIntForm::kAuto;
  const std::string s(v);
  if (s == "avx2") return GgufIntForm::kAvx2;
  throw Error("HANPU_GGUF_INT_FORM: got '" + s + "', expected 'avx2' (the integer prefill's AVX2 form where the "
              "AVX512-VNNI one would run) or nothing");
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

bool gguf_int_prefill_vnni_available(gguf::GgmlType t) {
  if (t != gguf::GgmlType::Q8_0 && t != gguf::GgmlType::Q4_K && t != gguf::GgmlType::Q5_K && t != gguf::GgmlType::Q6_K)
    return false;
  if (!vnni_cpu() || !gguf_avx2_forms_allowed()) return false;
  // native, or a Highway target whose features include VNNI (AVX3_DL, AVX3_ZEN4, AVX3_SPR)
  const IsaSelection& isa = isa_selection();
  return isa.native || isa.target.rfind("AVX3_", 0) == 0;
}

void gguf_prefill_int(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K, const float* x,
                      int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate, bool w_row_lanes,
                      GgufIntForm form) {
  if (!gguf_int_prefill_available(type))
    throw Error(std::string("gguf_prefill_int: no integer prefill for GGML type ") + gguf::block_format(type).name +
                " on this CPU / ISA selection (Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, IQ4_NL, IQ4_XS with AVX2)");
  if (form == GgufIntForm::kAuto) form = parse_int_form_env();
  if (form == GgufIntForm::kVnni && !gguf_int_prefill_vnni_available(type))
    throw Error(std::string("gguf_prefill_int: no AVX512-VNNI form for GGML type ") + gguf::block_format(type).name +
                " on this CPU / ISA selection (Q8_0, Q4_K, Q5_K, Q6_K with AVX512-VNNI, HANPU_ISA native or AVX3_DL / "
                "AVX3_ZEN4 / AVX3_SPR)");
  if (gguf_small_block_int_prefill_type(type))
    return gguf_small_block_prefill_int(engine, type, w, N, K, x, ldx, y, ldy, M, threads, accumulate);
  const bool vnni = form == GgufIntForm::kVnni || (form == GgufIntForm::kAuto && gguf_int_prefill_vnni_available(type));
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
  a.bsum16.resize(static_cast<size_t>(M * (K / 16)));
  // Q8_0: int16 activations for the AVX2 form, activations + 128 for the VNNI form (run_tile_vnni)
  const bool widen = type == gguf::GgmlType::Q8_0 && !vnni;
  const bool min_term = type == gguf::GgmlType::Q4_K || type == gguf::GgmlType::Q5_K;
  const bool offset_x = type == gguf::GgmlType::Q6_K || (type == gguf::GgmlType::Q8_0 && vnni);
  if (widen) a.x16.resize(static_cast<size_t>(M * K));
  if (min_term) a.qsum.resize(static_cast<size_t>(M * (K / 32)));
  {
    const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, M));
    engine.impl().run(parts, [&](int p, Workspace&) {
      for (int64_t m = M * p / parts; m < M * (p + 1) / parts; ++m) {
        // no f32 sums of x (nullptr): every form here takes its sums from the quantized q8
        const float* xs = a.scale.data() + m * (K / a.block);
        const int16_t* b16 = a.bsum16.data() + m * (K / 16);
        gguf_avx2::quantize_activation_row(x + m * ldx, K, a.block, a.xq8 + m * K, a.scale.data() + m * (K / a.block),
                                           nullptr, a.bsum16.data() + m * (K / 16));
        if (min_term)  // the K-quants' activation block is 256: 8 sub-blocks of 32 per scale
          for (int64_t j = 0; j < K / 32; ++j)
            a.qsum[static_cast<size_t>(m * (K / 32) + j)] = xs[j / 8] * static_cast<float>(b16[2 * j] + b16[2 * j + 1]);
      }
      if (widen) widen_rows(a, M * p / parts, M * (p + 1) / parts);
      if (offset_x) offset_rows(a, M * p / parts, M * (p + 1) / parts);
    });
  }
  const size_t row_bytes = static_cast<size_t>(K / bf.block_elems * bf.block_bytes);
  const int64_t tiles = (N + kGgufTileRows - 1) / kGgufTileRows;
  const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, tiles));
  const auto* wb = static_cast<const uint8_t*>(w);
  engine.impl().run(parts, [&](int p, Workspace& ws) {
    const int64_t nd = type == gguf::GgmlType::Q8_0 ? K / 32 : K / 256;
    auto* scratch = reinterpret_cast<uint8_t*>(ws.bytes(kLinearPanel, vnni ? vnni_scratch_bytes(K) : scratch_bytes(K)));
    const Tile t = carve_tile(scratch, K, nd);
    const Tile stage = carve_tile(scratch + tile_bytes(K, kGgufTileRows), K, nd, vnni ? kGgufTileRows : kQ8Group);
    for (int64_t ti = tiles * p / parts; ti < tiles * (p + 1) / parts; ++ti) {
      const int64_t n0 = ti * kGgufTileRows, nw = std::min<int64_t>(kGgufTileRows, N - n0);
      const uint8_t* rows = wb + n0 * row_bytes;
      if (w_row_lanes) {  // a row-lane layout (linear_gguf_row_lanes.cpp): the tile's rows in the file's layout first
        thread_local std::vector<uint8_t> file_rows;
        file_rows.resize(static_cast<size_t>(nw) * row_bytes);
        gguf_unpack_row_lanes(type, w, N, K, n0, n0 + nw, file_rows.data());
        rows = file_rows.data();
      }
      if (vnni) {
        switch (type) {
          case gguf::GgmlType::Q8_0: run_tile_vnni<Kind::kQ8_0>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
          case gguf::GgmlType::Q4_K: run_tile_vnni<Kind::kQ4K>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
          case gguf::GgmlType::Q5_K: run_tile_vnni<Kind::kQ5K>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
          default: run_tile_vnni<Kind::kQ6K>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
        }
        continue;
      }
      switch (type) {
        case gguf::GgmlType::Q8_0: run_tile<Kind::kQ8_0>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
        case gguf::GgmlType::Q4_K: run_tile<Kind::kQ4K>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
        case gguf::GgmlType::Q5_K: run_tile<Kind::kQ5K>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
        default: run_tile<Kind::kQ6K>(rows, row_bytes, nw, t, stage, a, y + n0, ldy, accumulate); break;
      }
    }
  });
}

#else

void gguf_prefill_quantize_row(const float*, int64_t, int64_t, int8_t*, float*, float*, int16_t*) {
  throw Error("gguf_prefill_quantize_row: x86-64 AVX2 only");
}

bool gguf_int_prefill_vnni_available(gguf::GgmlType) { return false; }

void gguf_prefill_int(Engine&, gguf::GgmlType type, const void*, int64_t, int64_t, const float*, int64_t, float*,
                      int64_t, int64_t, int, bool, bool, GgufIntForm) {
  throw Error(std::string("gguf_prefill_int: no integer prefill for GGML type ") + gguf::block_format(type).name +
              " in this build (x86-64 AVX2 only)");
}

#endif

}  // namespace hanpu::cpu
