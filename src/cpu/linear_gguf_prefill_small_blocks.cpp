// Integer prefill GEMM over Q4_0, IQ4_NL and IQ4_XS blocks, AVX2 (linear_gguf_small_blocks.hpp,
// gguf_small_block_prefill_int; reached through gguf_prefill_int). docs/GGUF.md ("Prefill GEMM on
// integer dot products") has the measurements that choose it.
//
// What the three formats share: after a table lookup (IQ4_NL / IQ4_XS: ggml-common.h's
// kvalues_iq4nl, -127..113) or an offset (Q4_0: nibble - 8), every weight is a signed integer of at
// most 7 bits times a block scale. So the prefill is the K-quant integer path's plan
// (linear_gguf_prefill.cpp): activations quantized once per call with the decode GEMV's rule, weight
// rows unpacked once per tile of kGgufTileRows rows into the worker's scratch, and register blocks of
// 4 activation rows x 2 weight rows over the whole K. What differs:
//
//   Q4_0, IQ4_NL (one f16 scale per 32, activations per 32 as the GEMV's): the tile holds the signed
//     int8 values and d in f32. Per 32 elements and (activation row, weight row) pair: |w| times x
//     with w's sign (VPSIGNB, exact: |w| <= 127 and |x| <= 127, pairs at most 2 * 127 * 127 < 2^15),
//     VPMADDUBSW, VPMADDWD by ones, one conversion and one FMA by d * activation scale.
//   IQ4_XS (f16 d per 256, a 6-bit scale ls - 32 per 32, activations per 256 as the GEMV's): the
//     tile holds int16 values already multiplied by their sub-block scale (|level * (ls - 32)| <=
//     127 * 32 = 4064, exact), the activations widened to int16, and per 16 elements and pair one
//     VPMADDWD and one VPADDD. The sign trick would have cost a VPSIGNB per pair and 32 elements and
//     two more registers (the signed and the absolute weights) on top of the scale vectors, which
//     the 4 x 2 block does not have; the int16 form does the same two multiplies per 32 elements and
//     pair with 12 registers. A super-block's int32 lane is at most 16 * 2 * 4064 * 127 = 16.5e6 <
//     2^24, so its conversion is exact; then one FMA by d * activation scale per super-block.
//
// The integer sums are the decode GEMV's (linear_gguf_small_blocks.cpp: the same products of the
// same int8 activations, summed in another order), so every row meets the GEMV's bounds
// (tests/test_linear_gguf_small_blocks.cpp, GgufSmallBlockIntPrefill).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/engine_impl.hpp"
#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/linear_gguf_small_blocks.hpp"
#include "cpu/x86_features.hpp"
#include "hanpu/tensor.hpp"

namespace hanpu::cpu {

bool gguf_small_block_int_prefill_type(gguf::GgmlType t) {
  return t == gguf::GgmlType::Q4_0 || t == gguf::GgmlType::IQ4_NL || t == gguf::GgmlType::IQ4_XS;
}

#if HANPU_X86_KERNELS
namespace {

#define HANPU_SBP_AVX2 __attribute__((target("avx2,fma,f16c")))
// Keeps v in a vector register: without it GCC folds a load that feeds two multiplies into both as
// a memory operand (twice the loads; linear_gguf_prefill.cpp measured that bound by loads).
#define HANPU_SBP_IN_REGISTER(v) __asm__("" : "+x"(v))

constexpr int kRowsX = 4, kRowsW = 2;

// The activation rows of one call, kept per calling thread.
struct Activations {
  int64_t M = 0, K = 0, block = 32;
  std::vector<int8_t> q8;     // M x K (and per-row scratch for the quantizer's sums)
  std::vector<int16_t> q16;   // M x K, IQ4_XS only: q8 widened
  std::vector<float> scale;   // M x K / block
  std::vector<float> sum;     // M x K / 32 (the quantizer writes them; unused here)
  std::vector<int16_t> bsum16;  // M x K / 16 (likewise)
};

Activations& activations() {
  thread_local Activations a;
  return a;
}

// One tile of up to kGgufTileRows weight rows: int8 values (Q4_0, IQ4_NL) or int16 scaled values
// (IQ4_XS), rows K apart, and d per block (per 32 / per 256), rows nd apart.
struct Tile {
  int64_t K = 0, nd = 0;
  int8_t* v8 = nullptr;
  int16_t* v16 = nullptr;
  float* d = nullptr;
};

size_t tile_bytes(int64_t K) { return static_cast<size_t>(kGgufTileRows) * static_cast<size_t>(2 * K + K / 8) + 128; }

Tile carve_tile(std::byte* base, int64_t K, int64_t nd) {
  Tile t;
  t.K = K;
  t.nd = nd;
  t.v8 = reinterpret_cast<int8_t*>(base);
  t.v16 = reinterpret_cast<int16_t*>(base);  // one of the two is used, per type
  const size_t off = (static_cast<size_t>(kGgufTileRows) * static_cast<size_t>(2 * K) + 63) & ~size_t{63};
  t.d = reinterpret_cast<float*>(base + off);
  return t;
}

// 16 nibble bytes -> 32 bytes in element order (element j in the low nibble of byte j, j + 16 in
// the high nibble), the layout of block_q4_0, block_iq4_nl and each 32 of block_iq4_xs.
HANPU_SBP_AVX2 inline __m256i nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

HANPU_SBP_AVX2 inline __m256i iq4_levels() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gguf::kIQ4NLValues)));
}

HANPU_SBP_AVX2 void unpack_row(gguf::GgmlType type, const uint8_t* row, const Tile& t, int64_t r) {
  const int64_t K = t.K;
  float* d = t.d + r * t.nd;
  const __m256i levels = iq4_levels();
  if (type == gguf::GgmlType::IQ4_XS) {
    const auto* b = reinterpret_cast<const gguf::BlockIQ4_XS*>(row);
    int16_t* v = t.v16 + r * K;
    for (int64_t i = 0; i < K / 256; ++i) {
      const gguf::BlockIQ4_XS& blk = b[i];
      d[i] = _cvtsh_ss(blk.d);
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((blk.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((blk.scales_h >> 2 * ib) & 3) << 4);
        const __m256i w8 = _mm256_shuffle_epi8(levels, nibbles(blk.qs + 16 * ib));
        const __m256i s = _mm256_set1_epi16(static_cast<int16_t>(ls - 32));
        const __m256i lo = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w8)), s);
        const __m256i hi = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w8, 1)), s);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 256 * i + 32 * ib), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 256 * i + 32 * ib + 16), hi);
      }
    }
    return;
  }
  // Q4_0 and IQ4_NL have the same 18-byte layout: f16 d, then the 16 nibble bytes.
  static_assert(sizeof(gguf::BlockQ4_0) == sizeof(gguf::BlockIQ4_NL));
  const auto* b = reinterpret_cast<const gguf::BlockQ4_0*>(row);
  int8_t* v = t.v8 + r * K;
  const bool nl = type == gguf::GgmlType::IQ4_NL;
  for (int64_t i = 0; i < K / 32; ++i) {
    d[i] = _cvtsh_ss(b[i].d);
    const __m256i q = nibbles(b[i].qs);
    const __m256i w = nl ? _mm256_shuffle_epi8(levels, q) : _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + 32 * i), w);
  }
}

HANPU_SBP_AVX2 inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// Q4_0 / IQ4_NL: MR activation rows x NR weight rows over the whole K, scale per 32 on both sides.
template <int MR, int NR>
HANPU_SBP_AVX2 void block32(const Tile& t, int64_t r0, const Activations& a, int64_t m0, float* y, int64_t ldy,
                            bool accumulate) {
  const int64_t K = t.K, nb = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 facc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) facc[m][r] = _mm256_setzero_ps();
  const int8_t* vals[NR];
  const float* d[NR];
  for (int r = 0; r < NR; ++r) {
    vals[r] = t.v8 + (r0 + r) * K;
    d[r] = t.d + (r0 + r) * t.nd;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[NR], wabs[NR];
    for (int r = 0; r < NR; ++r) {
      w[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vals[r] + 32 * b));
      HANPU_SBP_IN_REGISTER(w[r]);
      wabs[r] = _mm256_abs_epi8(w[r]);
    }
    for (int m = 0; m < MR; ++m) {
      __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q8.data() + (m0 + m) * K + 32 * b));
      HANPU_SBP_IN_REGISTER(x);
      const __m256 xs = _mm256_broadcast_ss(&a.scale[static_cast<size_t>((m0 + m) * nb + b)]);
      for (int r = 0; r < NR; ++r) {
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

// One super-block of IQ4_XS: acc[m][r] += VPMADDWD(w_r, x_m) over its 16 chunks of 16 int16. w and
// x point at the super-block's first value. The general form serves the tails of the block.
template <int MR, int NR>
HANPU_SBP_AVX2 inline void superblock_dot(const int16_t* const* w, const int16_t* const* x, __m256i (&acc)[MR][NR]) {
  for (int c = 0; c < 16; ++c) {
    __m256i wv[NR];
    for (int r = 0; r < NR; ++r) {
      wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 16 * c));
      HANPU_SBP_IN_REGISTER(wv[r]);
    }
    for (int m = 0; m < MR; ++m) {
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[m] + 16 * c));
      HANPU_SBP_IN_REGISTER(xv);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_add_epi32(acc[m][r], _mm256_madd_epi16(wv[r], xv));
    }
  }
}

// 4 x 2 in assembly, 16 elements per statement: compiled from the intrinsics above, GCC 12 loaded
// all four activation vectors first and then had too few registers for the 8 accumulators, so one
// lived on the stack (a load and a store per 16 elements on the loop's dependency chain; seen in the
// disassembly; 138-143 GOP/s per CPU second on the MLP shapes against the K-quants' 238-259). Here
// the accumulators are register operands and the statement uses 4 more registers (ymm12..15).
template <>
HANPU_SBP_AVX2 inline void superblock_dot<4, 2>(const int16_t* const* w, const int16_t* const* x, __m256i (&acc)[4][2]) {
  for (int c = 0; c < 16; ++c) {
    const auto at = [c](const int16_t* p) -> const __m256i& { return *reinterpret_cast<const __m256i*>(p + 16 * c); };
    __asm__(
        "vmovdqu %[w0], %%ymm12\n\t"
        "vmovdqu %[w1], %%ymm13\n\t"
        "vmovdqu %[x0], %%ymm14\n\t"
        "vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a00], %[a00]\n\t"
        "vpmaddwd %%ymm14, %%ymm13, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a01], %[a01]\n\t"
        "vmovdqu %[x1], %%ymm14\n\t"
        "vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a10], %[a10]\n\t"
        "vpmaddwd %%ymm14, %%ymm13, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a11], %[a11]\n\t"
        "vmovdqu %[x2], %%ymm14\n\t"
        "vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a20], %[a20]\n\t"
        "vpmaddwd %%ymm14, %%ymm13, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a21], %[a21]\n\t"
        "vmovdqu %[x3], %%ymm14\n\t"
        "vpmaddwd %%ymm14, %%ymm12, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a30], %[a30]\n\t"
        "vpmaddwd %%ymm14, %%ymm13, %%ymm15\n\t"
        "vpaddd %%ymm15, %[a31], %[a31]\n\t"
        : [a00] "+x"(acc[0][0]), [a01] "+x"(acc[0][1]), [a10] "+x"(acc[1][0]), [a11] "+x"(acc[1][1]),
          [a20] "+x"(acc[2][0]), [a21] "+x"(acc[2][1]), [a30] "+x"(acc[3][0]), [a31] "+x"(acc[3][1])
        : [w0] "m"(at(w[0])), [w1] "m"(at(w[1])), [x0] "m"(at(x[0])), [x1] "m"(at(x[1])), [x2] "m"(at(x[2])),
          [x3] "m"(at(x[3]))
        : "xmm12", "xmm13", "xmm14", "xmm15");
  }
}

// IQ4_XS: MR x NR over the whole K, int16 values with the sub-block scales folded in, scale d per 256.
template <int MR, int NR>
HANPU_SBP_AVX2 void block256(const Tile& t, int64_t r0, const Activations& a, int64_t m0, float* y, int64_t ldy,
                             bool accumulate) {
  const int64_t K = t.K, nsb = K / 256;
  // f32 accumulators in memory: the loop below keeps the 8 int32 ones, 2 weight vectors and the
  // activation in registers; these are touched once per super-block.
  alignas(32) float facc[MR][NR][8];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) _mm256_store_ps(facc[m][r], _mm256_setzero_ps());
  const int16_t* vals[NR];
  for (int r = 0; r < NR; ++r) vals[r] = t.v16 + (r0 + r) * K;
  const int16_t* xq[MR];
  for (int m = 0; m < MR; ++m) xq[m] = a.q16.data() + (m0 + m) * K;
  for (int64_t i = 0; i < nsb; ++i) {
    __m256i acc[MR][NR];
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_si256();
    {
      const int16_t* wp[NR];
      const int16_t* xp[MR];
      for (int r = 0; r < NR; ++r) wp[r] = vals[r] + 256 * i;
      for (int m = 0; m < MR; ++m) xp[m] = xq[m] + 256 * i;
      superblock_dot<MR, NR>(wp, xp, acc);
    }
    for (int m = 0; m < MR; ++m) {
      const __m256 xs = _mm256_broadcast_ss(&a.scale[static_cast<size_t>((m0 + m) * nsb + i)]);
      for (int r = 0; r < NR; ++r) {
        const __m256 dx = _mm256_mul_ps(_mm256_broadcast_ss(&t.d[(r0 + r) * t.nd + i]), xs);
        _mm256_store_ps(facc[m][r], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][r]), dx, _mm256_load_ps(facc[m][r])));
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      const float v = hsum(_mm256_load_ps(facc[m][r]));
      float& out = y[(m0 + m) * ldy + r];
      out = accumulate ? out + v : v;
    }
}

template <bool kXs, int MR, int NR>
void run_block(const Tile& t, int64_t r0, const Activations& a, int64_t m0, float* y, int64_t ldy, bool accumulate) {
  if constexpr (kXs) block256<MR, NR>(t, r0, a, m0, y, ldy, accumulate);
  else block32<MR, NR>(t, r0, a, m0, y, ldy, accumulate);
}

// Rows [m0, m0 + mr) for 1 <= mr <= MR: the full block or one of its tails.
template <bool kXs, int MR, int NR>
void run_rows_tail(const Tile& t, int64_t r0, const Activations& a, int64_t m0, int64_t mr, float* y, int64_t ldy,
                   bool accumulate) {
  if constexpr (MR == 1) {
    run_block<kXs, 1, NR>(t, r0, a, m0, y, ldy, accumulate);
  } else {
    if (mr == MR) run_block<kXs, MR, NR>(t, r0, a, m0, y, ldy, accumulate);
    else run_rows_tail<kXs, MR - 1, NR>(t, r0, a, m0, mr, y, ldy, accumulate);
  }
}

template <bool kXs>
void run_tile(int64_t nw, const Tile& t, const Activations& a, float* y, int64_t ldy, bool accumulate) {
  static_assert(kRowsW == 2, "the weight-row tail below is one row");
  for (int64_t m0 = 0; m0 < a.M; m0 += kRowsX) {
    const int64_t mr = std::min<int64_t>(kRowsX, a.M - m0);
    int64_t r0 = 0;
    for (; r0 + kRowsW <= nw; r0 += kRowsW) run_rows_tail<kXs, kRowsX, kRowsW>(t, r0, a, m0, mr, y + r0, ldy, accumulate);
    if (r0 < nw) run_rows_tail<kXs, kRowsX, 1>(t, r0, a, m0, mr, y + r0, ldy, accumulate);
  }
}

HANPU_SBP_AVX2 void widen_row(const int8_t* q8, int16_t* q16, int64_t K) {
  for (int64_t k = 0; k < K; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + k),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q8 + k))));
}

}  // namespace

void gguf_small_block_prefill_int(Engine& engine, gguf::GgmlType type, const void* w, int64_t N, int64_t K,
                                  const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads,
                                  bool accumulate) {
  const gguf::BlockFormat& bf = gguf::block_format(type);
  if (!gguf_small_block_int_prefill_type(type) || !gguf_avx2_forms_allowed())
    throw Error(std::string("gguf_small_block_prefill_int: no integer prefill for GGML type ") + bf.name +
                " on this CPU / ISA selection (Q4_0, IQ4_NL, IQ4_XS with AVX2)");
  if (N <= 0 || K <= 0 || K % bf.block_elems != 0)
    throw Error("gguf_small_block_prefill_int: shape [" + std::to_string(N) + ", " + std::to_string(K) +
                "] is not rows of whole " + bf.name + " blocks of " + std::to_string(bf.block_elems));
  if (M <= 0) return;
  const bool xs = type == gguf::GgmlType::IQ4_XS;
  const int nt = std::max(1, threads > 0 ? threads : engine.threads());
  Activations& a = activations();
  a.M = M;
  a.K = K;
  a.block = gguf_activation_block(type);  // 32 (Q4_0, IQ4_NL) or 256 (IQ4_XS), the GEMV's
  a.q8.resize(static_cast<size_t>(M * K));
  if (xs) a.q16.resize(static_cast<size_t>(M * K));
  a.scale.resize(static_cast<size_t>(M * (K / a.block)));
  a.sum.resize(static_cast<size_t>(M * (K / 32)));
  a.bsum16.resize(static_cast<size_t>(M * (K / 16)));
  {
    const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, M));
    engine.impl().run(parts, [&](int p, Workspace&) {
      for (int64_t m = M * p / parts; m < M * (p + 1) / parts; ++m) {
        gguf_prefill_quantize_row(x + m * ldx, K, a.block, a.q8.data() + m * K, a.scale.data() + m * (K / a.block),
                                  a.sum.data() + m * (K / 32), a.bsum16.data() + m * (K / 16));
        if (xs) widen_row(a.q8.data() + m * K, a.q16.data() + m * K, K);
      }
    });
  }
  const size_t row_bytes = static_cast<size_t>(K / bf.block_elems * bf.block_bytes);
  const int64_t tiles = (N + kGgufTileRows - 1) / kGgufTileRows;
  const int parts = static_cast<int>(std::clamp<int64_t>(nt, 1, tiles));
  const auto* wb = static_cast<const uint8_t*>(w);
  engine.impl().run(parts, [&](int p, Workspace& ws) {
    const Tile t = carve_tile(ws.bytes(kLinearPanel, tile_bytes(K)), K, K / bf.block_elems);
    for (int64_t ti = tiles * p / parts; ti < tiles * (p + 1) / parts; ++ti) {
      const int64_t n0 = ti * kGgufTileRows, nw = std::min<int64_t>(kGgufTileRows, N - n0);
      for (int64_t r = 0; r < nw; ++r) unpack_row(type, wb + (n0 + r) * row_bytes, t, r);
      if (xs) run_tile<true>(nw, t, a, y + n0, ldy, accumulate);
      else run_tile<false>(nw, t, a, y + n0, ldy, accumulate);
    }
  });
}

#else

void gguf_small_block_prefill_int(Engine&, gguf::GgmlType type, const void*, int64_t, int64_t, const float*, int64_t,
                                  float*, int64_t, int64_t, int, bool) {
  throw Error(std::string("gguf_small_block_prefill_int: no integer prefill for GGML type ") +
              gguf::block_format(type).name + " in this build (x86-64 AVX2 only)");
}

#endif

}  // namespace hanpu::cpu
