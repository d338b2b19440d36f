// Decode GEMV on a load-time "row lanes" layout of Q4_K weights (AVX2), see linear_gguf.hpp and
// docs/GGUF.md "Decode GEMV on row lanes".
//
// Why: the row-major GEMV (linear_gguf.cpp K4RowDot) spends about 55 vector operations per row and
// super-block (nibble unpack, 8 VPMADDUBSW, 8 VPMADDWD, one scale VPSHUFB per sub-block, adds, an
// f32 tail) and runs compute-bound at 16-17 GB/s per Zen 3 core. With 8 rows side by side, lane r of
// every vector belonging to row r, one broadcast of 4 activation bytes feeds all 8 rows: per 4
// elements of 8 rows one VPMADDUBSW; the int16 pairs of a sub-block (32 elements) add up in int16
// (at most 8 * 2 * 15 * 127 = 30480 < 2^15) and take one VPMADDWD by the 8 rows' scales; the f32
// tail runs once per super-block for 8 rows, and no horizontal sum is left. About 33 vector
// operations per row and super-block instead of 55.
//
// Layout of one tile (8 rows x one super-block of 256, kQ4KLaneTileBytes = 1152 bytes, the file's
// 8 x 144: the same bits rearranged, so the layout takes the file's memory and no more):
//   [0, 16)     d of rows 0..7 (f16)
//   [16, 32)    dmin of rows 0..7 (f16)
//   [32, 96)    byte 16c + 2r + h = s | (m & 3) << 6, s and m the 6-bit scale and min of sub-block
//               2c + h of row r: one VPSHUFB and a mask give the scale pairs of 8 rows
//   [96, 128)   byte 8c + r = (m of sub-block 2c) >> 2 | ((m of 2c + 1) >> 2) << 4, row r
//   [128, 1152) nibbles: 32 bytes per (c, e) at 128 + 32 (8c + e), bytes 4r..4r+3 = row r's
//               qs[32c + 4e .. 32c + 4e + 3] (ggml-common.h block_q4_K: the low nibble element
//               4e + i of sub-block 2c, the high nibble that of sub-block 2c + 1), i.e. the rows'
//               32-bit words interleaved.
// The tiles of a group of 8 rows follow each other (super-block 0, 1, ...), groups in row order,
// so a thread still reads one sequential stream; rows past the last whole group (N % 8) follow in
// the file's layout and run the row-major kernel.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <string>

#include "cpu/gguf_avx2.hpp"  // prefetch_lines
#include "cpu/gguf_blocks.hpp"
#include "cpu/linear_gguf.hpp"
#include "cpu/linear_kernels.hpp"  // decode_prefetch_bytes
#include "cpu/x86_features.hpp"
#include "hanpu/tensor.hpp"  // Error

namespace hanpu::cpu {

namespace {

constexpr int64_t kLaneRows = 8;
constexpr size_t kQ4KLaneTileBytes = 1152;
constexpr size_t kQsOffset = 128;
static_assert(kQsOffset + 1024 == kQ4KLaneTileBytes);

int64_t row_bytes_of(gguf::GgmlType t, int64_t K) {
  const gguf::BlockFormat& bf = gguf::block_format(t);
  return K / bf.block_elems * bf.block_bytes;
}

void check_shape(const char* who, gguf::GgmlType t, int64_t N, int64_t K) {
  if (t != gguf::GgmlType::Q4_K)
    throw Error(std::string(who) + ": no row-lane layout for GGML type " + gguf::block_format(t).name + " (Q4_K only)");
  if (N < kLaneRows || K <= 0 || K % 256 != 0)
    throw Error(std::string(who) + ": shape [" + std::to_string(N) + ", " + std::to_string(K) +
                "] is not at least 8 rows of whole Q4_K super-blocks");
}

// Row r's 12 scale bytes (the file's encoding, the inverse of gguf::k4_scale_min: every one of
// the 96 bits is a bit of some scale or min, so the round trip is exact) from a tile, 8 values per
// 64-bit word (byte j of sc and m the scale and min of sub-block j), 4 at a time per rule.
static_assert(std::endian::native == std::endian::little, "the words below are read and written little-endian");
void tile_scales_mins(const uint8_t* tile, int64_t r, uint8_t out[12]) {
  uint64_t s = 0, nib = 0;
  for (int c = 0; c < 4; ++c) {
    uint16_t pair;  // bytes 2c, 2c + 1: s | (m & 3) << 6 of sub-blocks 2c, 2c + 1
    std::memcpy(&pair, tile + 32 + 16 * c + 2 * r, 2);
    const uint64_t n = tile[96 + 8 * c + r];  // the two mins' top 4 bits
    s |= uint64_t{pair} << (16 * c);
    nib |= ((n & 15) | (n >> 4) << 8) << (16 * c);
  }
  const uint64_t sc = s & 0x3f3f3f3f3f3f3f3fULL;
  const uint64_t m = ((s >> 6) & 0x0303030303030303ULL) | nib << 2;
  const uint32_t sc_lo = static_cast<uint32_t>(sc), sc_hi = static_cast<uint32_t>(sc >> 32);
  const uint32_t m_lo = static_cast<uint32_t>(m), m_hi = static_cast<uint32_t>(m >> 32);
  const uint32_t w[3] = {sc_lo | ((sc_hi >> 4) & 0x03030303u) << 6, m_lo | ((m_hi >> 4) & 0x03030303u) << 6,
                         (sc_hi & 0x0f0f0f0fu) | (m_hi & 0x0f0f0f0fu) << 4};
  std::memcpy(out, w, 12);
}

#if HANPU_X86_KERNELS
#define HANPU_LANES_AVX2 __attribute__((target("avx2,fma,f16c")))

// VPSHUFB controls over the 16 scale bytes of a sub-block pair (both 128-bit halves hold them):
// the int16 word pair of row r (lane r of 8 int32 lanes) = the scale of sub-block 2c + h, twice.
struct alignas(32) Ctrl {
  uint8_t b[32];
};
constexpr Ctrl ScalePick(int h) {
  Ctrl s{};
  for (int i = 0; i < 32; ++i) {
    const int row = i / 4;  // lanes 0..3 in the low half, 4..7 in the high half
    s.b[i] = (i & 1) ? 0x80 : static_cast<uint8_t>(2 * row + h);
  }
  return s;
}
constexpr Ctrl kPick[2] = {ScalePick(0), ScalePick(1)};

// One group of 8 rows, all its super-blocks: y[0..8) = the 8 dot products. Integer sums exact:
// per sub-block and row the int16 pair sums at most 8 * 2 * 15 * 127 = 30480, their VPMADDWD by the
// scale (<= 63) into int32; a row's super-block sum at most 63 * 15 * 127 * 256 < 2^25 (its
// conversion to f32 may round once, which the decode bound counts). Min term as the row-major
// kernel: sum_j m_j B_j (B_j the quantized activations' sums per 32) in int32, times dmin s_x.
// kHint: _MM_HINT_T0 or _MM_HINT_T1 (decode_prefetch_l2).
template <int kHint>
HANPU_LANES_AVX2 void q4k_lanes_group(const uint8_t* tiles, int64_t nb, const int8_t* x8, const float* xs,
                                      const int16_t* bsum32, float* y, int64_t ahead) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low6 = _mm256_set1_epi16(0x3F);
  const __m256i pick0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[0].b));
  const __m256i pick1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[1].b));
  __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* t = tiles + static_cast<size_t>(i) * kQ4KLaneTileBytes;
    const char* p = reinterpret_cast<const char*>(t) + ahead;
    gguf_avx2::prefetch_lines<kHint, 2>(p);  // the header's 2 lines; the nibbles' 16 below
    const int8_t* x = x8 + 256 * i;
    __m256i isum = _mm256_setzero_si256(), msum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = t + kQsOffset + 256 * c;
      gguf_avx2::prefetch_lines<kHint, 4>(q + ahead);
      __m256i slo = _mm256_setzero_si256(), shi = _mm256_setzero_si256();
      for (int e = 0; e < 8; ++e) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * e));
        const __m256i lo = _mm256_and_si256(raw, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        int32_t xl, xh;
        std::memcpy(&xl, x + 64 * c + 4 * e, 4);
        std::memcpy(&xh, x + 64 * c + 32 + 4 * e, 4);
        slo = _mm256_add_epi16(slo, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
        shi = _mm256_add_epi16(shi, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
      }
      const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 32 + 16 * c));
      const __m256i sc = _mm256_broadcastsi128_si256(sm);
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(slo, _mm256_and_si256(_mm256_shuffle_epi8(sc, pick0), low6)));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(shi, _mm256_and_si256(_mm256_shuffle_epi8(sc, pick1), low6)));
      // the mins as int16, word 2r + h = m of sub-block 2c + h of row r: bits 0..1 from the top of
      // the scale bytes, bits 2..5 from the nibbles (low nibble h = 0, high h = 1)
      const __m128i nib = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t + 96 + 8 * c));
      const __m128i hi4 = _mm_unpacklo_epi8(_mm_and_si128(nib, _mm256_castsi256_si128(low4)),
                                            _mm_and_si128(_mm_srli_epi16(nib, 4), _mm256_castsi256_si128(low4)));
      const __m256i mn = _mm256_or_si256(_mm256_slli_epi16(_mm256_cvtepu8_epi16(hi4), 2),
                                         _mm256_srli_epi16(_mm256_cvtepu8_epi16(sm), 6));
      int32_t b2;  // B_2c, B_2c+1 as one 32-bit word: VPMADDWD pairs them with m_2c, m_2c+1 of each row
      std::memcpy(&b2, bsum32 + 8 * i + 2 * c, 4);
      msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mn, _mm256_set1_epi32(b2)));
    }
    const __m256 sx = _mm256_broadcast_ss(xs + i);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, sx), acc);
    macc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, sx), macc);
  }
  _mm256_storeu_ps(y, _mm256_sub_ps(acc, macc));
}

// The 8 rows of one tile back in the file's layout: out + r * rb is row r's block. The nibbles are
// an 8 x 32 matrix of 32-bit words (vector w = word w of the 8 rows), transposed in 4 blocks of
// 8 x 8 (unpack 32, unpack 64, 128-bit permutes); the scales re-encoded per row (integer pipes).
HANPU_LANES_AVX2 void q4k_unpack_tile(const uint8_t* tile, uint8_t* out, int64_t rb) {
  for (int r = 0; r < 8; ++r) {
    auto& b = *reinterpret_cast<gguf::BlockQ4_K*>(out + r * rb);
    std::memcpy(&b.d, tile + 2 * r, 2);
    std::memcpy(&b.dmin, tile + 16 + 2 * r, 2);
    tile_scales_mins(tile, r, b.scales);
  }
  for (int blk = 0; blk < 4; ++blk) {
    __m256i v[8], t[8], s[8];
    for (int k = 0; k < 8; ++k)
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + kQsOffset + 32 * (8 * blk + k)));
    for (int k = 0; k < 8; k += 2) {
      t[k] = _mm256_unpacklo_epi32(v[k], v[k + 1]);
      t[k + 1] = _mm256_unpackhi_epi32(v[k], v[k + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
      s[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
      s[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
      s[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
      s[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    for (int r = 0; r < 4; ++r) {  // s[r]: rows r (low half) and r + 4 (high half), words 8 blk .. 8 blk + 3; s[r + 4] the next 4
      auto* q0 = out + r * rb + offsetof(gguf::BlockQ4_K, qs) + 32 * blk;
      auto* q4 = out + (r + 4) * rb + offsetof(gguf::BlockQ4_K, qs) + 32 * blk;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q0), _mm256_permute2x128_si256(s[r], s[r + 4], 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q4), _mm256_permute2x128_si256(s[r], s[r + 4], 0x31));
    }
  }
}
#endif

}  // namespace

bool gguf_row_lanes_available(gguf::GgmlType t, int64_t N) {
#if HANPU_X86_KERNELS
  return t == gguf::GgmlType::Q4_K && N >= kLaneRows && gguf_avx2_forms_allowed();
#else
  (void)t;
  (void)N;
  return false;
#endif
}

size_t gguf_row_lanes_bytes(gguf::GgmlType t, int64_t N, int64_t K) {
  check_shape("gguf_row_lanes_bytes", t, N, K);
  const int64_t groups = N / kLaneRows;
  return static_cast<size_t>(groups * (K / 256)) * kQ4KLaneTileBytes +
         static_cast<size_t>((N - groups * kLaneRows) * row_bytes_of(t, K));
}

void gguf_pack_row_lanes(gguf::GgmlType t, const void* blocks, int64_t N, int64_t K, void* out) {
  check_shape("gguf_pack_row_lanes", t, N, K);
  const int64_t nb = K / 256, groups = N / kLaneRows, rb = row_bytes_of(t, K);
  const auto* src = static_cast<const uint8_t*>(blocks);
  auto* dst = static_cast<uint8_t*>(out);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t* tile = dst + static_cast<size_t>(g * nb + i) * kQ4KLaneTileBytes;
      std::memset(tile + 96, 0, 32);  // the min nibbles are or-ed in below
      for (int64_t r = 0; r < kLaneRows; ++r) {
        const auto& b = *reinterpret_cast<const gguf::BlockQ4_K*>(src + (g * kLaneRows + r) * rb + i * 144);
        std::memcpy(tile + 2 * r, &b.d, 2);
        std::memcpy(tile + 16 + 2 * r, &b.dmin, 2);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          gguf::k4_scale_min(j, b.scales, sc, m);
          tile[32 + 16 * (j / 2) + 2 * r + (j & 1)] = static_cast<uint8_t>(sc | (m & 3) << 6);
          tile[96 + 8 * (j / 2) + r] |= static_cast<uint8_t>((m >> 2) << (4 * (j & 1)));
        }
        for (int w = 0; w < 32; ++w) std::memcpy(tile + kQsOffset + 32 * w + 4 * r, b.qs + 4 * w, 4);
      }
    }
  std::memcpy(dst + static_cast<size_t>(groups * nb) * kQ4KLaneTileBytes, src + groups * kLaneRows * rb,
              static_cast<size_t>((N - groups * kLaneRows) * rb));
}

void gguf_unpack_row_lanes(gguf::GgmlType t, const void* packed, int64_t N, int64_t K, int64_t n0, int64_t n1,
                           void* out) {
  check_shape("gguf_unpack_row_lanes", t, N, K);
  if (n0 < 0 || n1 > N || n0 > n1)
    throw Error("gguf_unpack_row_lanes: rows [" + std::to_string(n0) + ", " + std::to_string(n1) + ") not within [0, " +
                std::to_string(N) + ")");
  const int64_t nb = K / 256, groups = N / kLaneRows, rb = row_bytes_of(t, K);
  const auto* src = static_cast<const uint8_t*>(packed);
  auto* dst = static_cast<uint8_t*>(out);
  int64_t n = n0;
#if HANPU_X86_KERNELS
  if (gguf_avx2_forms_allowed())  // whole groups by the transpose
    for (; n % kLaneRows == 0 && n + kLaneRows <= std::min(n1, groups * kLaneRows); n += kLaneRows)
      for (int64_t i = 0; i < nb; ++i)
        q4k_unpack_tile(src + static_cast<size_t>((n / kLaneRows) * nb + i) * kQ4KLaneTileBytes,
                        dst + (n - n0) * rb + i * 144, rb);
#endif
  for (; n < n1; ++n) {
    uint8_t* row = dst + (n - n0) * rb;
    if (n >= groups * kLaneRows) {
      std::memcpy(row, src + static_cast<size_t>(groups * nb) * kQ4KLaneTileBytes + (n - groups * kLaneRows) * rb,
                  static_cast<size_t>(rb));
      continue;
    }
    const int64_t g = n / kLaneRows, r = n % kLaneRows;
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t* tile = src + static_cast<size_t>(g * nb + i) * kQ4KLaneTileBytes;
      auto& b = *reinterpret_cast<gguf::BlockQ4_K*>(row + i * 144);
      std::memcpy(&b.d, tile + 2 * r, 2);
      std::memcpy(&b.dmin, tile + 16 + 2 * r, 2);
      tile_scales_mins(tile, r, b.scales);
      for (int w = 0; w < 32; ++w) std::memcpy(b.qs + 4 * w, tile + kQsOffset + 32 * w + 4 * r, 4);
    }
  }
}

void gguf_gemv_row_lanes(gguf::GgmlType t, const void* packed, int64_t N, int64_t K, const GgufActivations& x,
                         float* y, int64_t n0, int64_t n1) {
  check_shape("gguf_gemv_row_lanes", t, N, K);
  const int64_t groups = N / kLaneRows, tail0 = groups * kLaneRows;
  if (n0 < 0 || n1 > N || n0 > n1 || (n0 % kLaneRows != 0 && n0 < tail0) || (n1 % kLaneRows != 0 && n1 < tail0))
    throw Error("gguf_gemv_row_lanes: rows [" + std::to_string(n0) + ", " + std::to_string(n1) +
                ") do not start and end on a group of 8 (or in the last " + std::to_string(N - tail0) + " rows) of " +
                std::to_string(N));
  if (x.K != K || x.block != 256)
    throw Error("gguf_gemv_row_lanes: the activations (K = " + std::to_string(x.K) + ", blocks of " +
                std::to_string(x.block) + ") are not quantized for Q4_K with K = " + std::to_string(K));
  if (!gguf_row_lanes_available(t, N))
    throw Error("gguf_gemv_row_lanes: the AVX2 forms may not run on this CPU / ISA selection");
#if HANPU_X86_KERNELS
  const int64_t nb = K / 256;
  const auto* base = static_cast<const uint8_t*>(packed);
  const int64_t ahead = decode_prefetch_bytes();
  const auto group = decode_prefetch_l2() ? q4k_lanes_group<_MM_HINT_T1> : q4k_lanes_group<_MM_HINT_T0>;
  for (int64_t g = n0 / kLaneRows; g * kLaneRows < std::min(n1, tail0); ++g)
    group(base + static_cast<size_t>(g * nb) * kQ4KLaneTileBytes, nb, x.q8.data(), x.scale.data(), x.bsum32.data(),
          y + (g * kLaneRows - n0), ahead);
  if (n1 > tail0) {  // the rows past the last group, in the file's layout
    const uint8_t* tail = base + static_cast<size_t>(groups * nb) * kQ4KLaneTileBytes;
    const int64_t a = std::max(n0, tail0);
    gguf_gemv_rows(t, tail, K, x, y + (a - n0) - (a - tail0), a - tail0, n1 - tail0);
  }
#else
  (void)y;
#endif
}


}  // namespace hanpu::cpu
