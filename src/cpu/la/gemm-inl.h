// GEMM tiles: the register tiles (Tile, TileRows, TileCols, TileAny) in every accumulation mode,
// the software prefetch of the next item's rows that the tiles hand out, and Gemm itself.
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_GEMM_INL_H_
#undef HANPU_CPU_LA_GEMM_INL_H_
#else
#define HANPU_CPU_LA_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "cpu/kernels.hpp"
#include "cpu/la/base-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// GEMM register tiles: MR rows x NV vectors of C held in registers, as cpu/kernel_facts.hpp
// states them (the planning rules choose from the same numbers). Column tails (e.g. the last 32 of
// 128 columns) keep the full row count: taller tail tiles (12 x 2, 16 x 1) measured 10% slower on
// the GEMM probe.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kMR = kGemmTileNarrowFile.rows;
constexpr size_t kNV = kGemmTileNarrowFile.vectors;
#else
constexpr size_t kMR = kGemmTileWideFile.rows;
constexpr size_t kNV = kGemmTileWideFile.vectors;
#endif
constexpr size_t RowsFor(size_t /*nv*/) { return kMR; }

// The register tile a GEMM uses at most: the compiled kMR x kNV, or a smaller shape the plan asks
// for (plan.cpu.gemm_rows / gemm_vectors; TileRows / TileCols below already instantiate every
// smaller tile for the row and column tails, so a runtime choice needs no new instantiation).
struct TileShape {
  size_t rows = kMR, vectors = kNV;
};
TileShape ProgramTile(const FusedProgram& program) {
  TileShape t;
  if (program.gemm_rows > 0) t.rows = std::min(kMR, static_cast<size_t>(program.gemm_rows));
  if (program.gemm_vectors > 0) t.vectors = std::min(kNV, static_cast<size_t>(program.gemm_vectors));
  return t;
}

// C = A B, C += A B, C -= A B, C = diag(row_scale) C + A B (the state update's decay, applied as
// the accumulators are loaded instead of in a pass of its own), and for GDN's scalar per-row
// gates C = diag(row_scale) A B and C += diag(row_scale) A B (the gate applied as the
// accumulators are stored, instead of a pass that scales the rows of A first).
// kSubSolve: C −= A B over kd, then the strip's own unit-lower triangle, A's MR x MR block at
// columns [kd, kd + MR), is solved on the accumulators (forward substitution in registers).
enum class Acc { kSet, kAdd, kSub, kScaleAdd, kSetRowScaled, kAddRowScaled, kSubSolve };

// C[MR x NV*lanes] (op)= A[MR x kd] (rows of stride lda, broadcast per element) * B[kd x NV*lanes]
// (rows of stride ldb, loaded as vectors). A is a dense row-major operand, B a packed panel.
template <size_t MR, size_t NV, Acc kMode>
HWY_NOINLINE void Tile(const float* HWY_RESTRICT A, size_t lda, const float* HWY_RESTRICT B, size_t ldb,
                       float* HWY_RESTRICT C, size_t ldc, size_t kd, const float* HWY_RESTRICT row_scale) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc[MR][NV];
  for (size_t i = 0; i < MR; ++i) {
    for (size_t v = 0; v < NV; ++v) {
      if constexpr (kMode == Acc::kSet || kMode == Acc::kSetRowScaled || kMode == Acc::kAddRowScaled) {
        acc[i][v] = hn::Zero(d);
      } else if constexpr (kMode == Acc::kScaleAdd) {
        acc[i][v] = hn::Mul(hn::Set(d, row_scale[i]), hn::LoadU(d, C + i * ldc + v * N));
      } else {
        acc[i][v] = hn::LoadU(d, C + i * ldc + v * N);
      }
    }
  }
  for (size_t k = 0; k < kd; ++k) {
    VF b[NV];
    for (size_t v = 0; v < NV; ++v) b[v] = hn::LoadU(d, B + k * ldb + v * N);
    for (size_t i = 0; i < MR; ++i) {
      const VF a = hn::Set(d, A[i * lda + k]);
      for (size_t v = 0; v < NV; ++v)
        acc[i][v] = kMode == Acc::kSub || kMode == Acc::kSubSolve ? hn::NegMulAdd(a, b[v], acc[i][v])
                                                                  : hn::MulAdd(a, b[v], acc[i][v]);
    }
  }
  if constexpr (kMode == Acc::kSubSolve) {
    for (size_t r = 1; r < MR; ++r)
      for (size_t j = 0; j < r; ++j) {
        const VF a = hn::Set(d, A[r * lda + kd + j]);
        for (size_t v = 0; v < NV; ++v) acc[r][v] = hn::NegMulAdd(a, acc[j][v], acc[r][v]);
      }
  }
  for (size_t i = 0; i < MR; ++i) {
    for (size_t v = 0; v < NV; ++v) {
      if constexpr (kMode == Acc::kSetRowScaled) {
        acc[i][v] = hn::Mul(hn::Set(d, row_scale[i]), acc[i][v]);
      } else if constexpr (kMode == Acc::kAddRowScaled) {
        acc[i][v] = hn::MulAdd(hn::Set(d, row_scale[i]), acc[i][v], hn::LoadU(d, C + i * ldc + v * N));
      }
      hn::StoreU(acc[i][v], d, C + i * ldc + v * N);
    }
  }
}

template <size_t M, size_t NV, Acc kMode>
HWY_INLINE void TileRows(size_t mr, const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc,
                         size_t kd, const float* rs) {
  if constexpr (M > 0) {
    if (mr == M) return Tile<M, NV, kMode>(A, lda, B, ldb, C, ldc, kd, rs);
    TileRows<M - 1, NV, kMode>(mr, A, lda, B, ldb, C, ldc, kd, rs);
  }
}

template <size_t NV, Acc kMode>
HWY_INLINE void TileCols(size_t mr, size_t nv, const float* A, size_t lda, const float* B, size_t ldb, float* C,
                         size_t ldc, size_t kd, const float* rs) {
  if constexpr (NV > 0) {
    if (nv == NV) return TileRows<RowsFor(NV), NV, kMode>(mr, A, lda, B, ldb, C, ldc, kd, rs);
    TileCols<NV - 1, kMode>(mr, nv, A, lda, B, ldb, C, ldc, kd, rs);
  }
}

// Any tile up to RowsFor(nv) rows x nv <= kNV vectors (row and column tails of a GEMM).
template <Acc kMode>
HWY_INLINE void TileAny(size_t mr, size_t nv, const float* A, size_t lda, const float* B, size_t ldb, float* C,
                        size_t ldc, size_t kd, const float* rs = nullptr) {
  TileCols<kNV, kMode>(mr, nv, A, lda, B, ldb, C, ldc, kd, rs);
}

enum class Tri {
  kNone,
  kLowerN,  // only C[i][j] with j <= i are needed: skip column panels right of the strip
  kLowerK,  // A[i][k] is zero for k > i: limit the reduction of each strip to k <= its last row
};

// Software prefetch of the rows the next work item reads (q, k, v and KDA's g; o is written with
// streaming stores). Rows of one head are H*K elements apart, a page or more, so the hardware
// streamers follow them poorly and LoadChunk would wait on memory for most of them (measured: 14%
// of a GDN chunk with inputs in L3, 21% from DRAM). Each prefetch holds a line-fill buffer until
// its line arrives, and the GEMM tiles need those buffers for their own L2 refills: issuing too
// many at once stalls the tiles. So the lines are handed out evenly over every GEMM tile of the
// chunk (the tile count of the previous chunk sets the share), a few per tile.
class ChunkPrefetcher {
 public:
  // rate (plan.cpu.prefetch_rate): 0 issues no prefetches; r >= 1 hands out r times the even share
  // per tile, so the lines are all issued within the first 1/r of the chunk's tiles.
  explicit ChunkPrefetcher(int rate = 1) : rate_(static_cast<size_t>(rate < 0 ? 0 : rate)) {}
  void plan(const LaJob& job, const SeqSpan& seq, int64_t hv, int64_t t0, size_t L, int64_t col0, int64_t col1) {
    count_ = 0;
    next_ = 0;
    offset_ = 0;
    total_lines_ = 0;
    if (rate_ == 0) return;
    const LaInputs& in = job.in;
    const int64_t h = job.key_head(hv), t = seq.bos + t0;
    const size_t K = static_cast<size_t>(job.shape.K);
    for (size_t i = 0; i < L; ++i) {
      add(in.q, seq.batch, t + i, h, 0, K);
      add(in.k, seq.batch, t + i, h, 0, K);
      add(in.v, seq.batch, t + i, hv, col0, static_cast<size_t>(col1 - col0));
      if (job.traits().channel_gate()) add(in.g, seq.batch, t + i, hv, 0, K);
    }
    // Share per tile from the previous chunk's tile count (+1 so that rounding leaves no rest).
    per_tile_ = (tiles_ ? total_lines_ / tiles_ + 1 : kFirstChunkLinesPerTile) * rate_;
    tiles_ = 0;
  }
  // Called once per GEMM tile: issues this tile's share of the lines.
  void tile() {
    ++tiles_;
    lines(per_tile_);
  }
  // Whatever the tiles did not issue (only when the chunk had fewer tiles than the last one).
  void rest() { lines(~size_t{0}); }

 private:
  // Before any tile count is known: a GDN chunk of K = V = 128 has ~150 tiles and ~1.5K lines.
  static constexpr size_t kFirstChunkLinesPerTile = 12;
  void lines(size_t n) {
    for (; n > 0 && next_ < count_; --n) {
      const Span& r = rows_[next_];
      // Locality 2 (x86: prefetcht1): into L2 only. The next item's rows do not fit in L1 next
      // to the GEMM operands; LoadChunk then streams them from L2.
      __builtin_prefetch(r.first + offset_, 0, 2);
      offset_ += 64;
      if (offset_ >= r.bytes) {
        offset_ = 0;
        ++next_;
      }
    }
  }
  struct Span {
    const char* first;  // the first cache line of the row (64-byte aligned)
    size_t bytes;       // from `first` to the row's end
  };
  void add(const TensorView& t, int64_t b, int64_t tok, int64_t h, int64_t col0, size_t n) {
    if (t.rank != 4 || t.stride[3] != 1 || count_ == kMaxRows) return;
    const size_t esz = dtype_size(t.dtype);
    const char* p = static_cast<const char*>(t.data) + offset4(t, b, tok, h, col0) * esz;
    const char* first = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63});
    const size_t bytes = static_cast<size_t>(p + n * esz - first);
    rows_[count_++] = {first, bytes};
    total_lines_ += (bytes + 63) / 64;
  }
  static constexpr size_t kMaxRows = 4 * 64;  // four row kinds of a 64-token chunk
  Span rows_[kMaxRows];
  size_t rate_ = 1;
  size_t count_ = 0, next_ = 0, offset_ = 0, total_lines_ = 0, tiles_ = 0,
         per_tile_ = kFirstChunkLinesPerTile;
};

// C[M x N] (op)= A[M x Kd] B[Kd x N]; N a multiple of the vector length. Column panels outside,
// row strips inside, so each B panel (Kd x NV vectors) stays in L1 while all strips stream by.
template <Acc kMode>
void Gemm(const float* A, size_t lda, const float* B, size_t ldb, float* C, size_t ldc, size_t M, size_t N,
          size_t Kd, Tri tri = Tri::kNone, ChunkPrefetcher* pf = nullptr, const float* row_scale = nullptr,
          TileShape shape = {}) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  for (size_t j0 = 0; j0 < N; j0 += shape.vectors * lanes) {
    const size_t nv = std::min(shape.vectors, (N - j0) / lanes);
    const size_t rows = std::min(RowsFor(nv), shape.rows);
    for (size_t i0 = 0; i0 < M; i0 += rows) {
      const size_t mr = std::min(rows, M - i0);
      size_t tile_nv = nv;
      if (tri == Tri::kLowerN) {
        // Only columns j < i0 + mr are needed: narrow the tile near the diagonal.
        if (j0 >= i0 + mr) continue;
        tile_nv = std::min(nv, (i0 + mr - j0 + lanes - 1) / lanes);
      }
      const size_t kd = tri == Tri::kLowerK ? std::min(Kd, i0 + mr) : Kd;
      if (kd == 0 && kMode != Acc::kSet && kMode != Acc::kSetRowScaled) continue;
      TileAny<kMode>(mr, tile_nv, A + i0 * lda, lda, B + j0, ldb, C + i0 * ldc + j0, ldc, kd,
                     row_scale ? row_scale + i0 : nullptr);
      if (pf) pf->tile();
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_GEMM_INL_H_
