// The head-fused engine's GEMMs on Intel AMX (TDPBF16PS): one function per product shape, each
// with explicit leading dimensions, so that a plan (issue 38, item 2) can select them one by one.
//
// Operands of TDPBF16PS are bf16: the left one (A) as rows (16 rows x 32 values per tile), the
// right one (B) in k pairs, the VNNI layout (row p of a tile holds, per output column, the pair
// B[2p][c], B[2p+1][c] in one 32-bit word). An f32 operand becomes `terms` bf16 parts:
//   1 term: x rounded to nearest bf16, relative error <= 2^-8, bf16's unit roundoff (what FLA does on GPU tensor cores);
//   2 terms: hi = bf16(x), lo = bf16(x - hi) (x - hi is exact in f32), |x - hi - lo| <= 2^-8 |x - hi| <= 2^-16 |x|.
// Products and accumulation are in f32 (a bf16 x bf16 product is exact in f32). With two terms on
// both sides the lo x lo product (<= 2^-16 relative) is left out. docs/ACCURACY.md has the bounds.
//
// x86-64 with GCC/Clang only; call only after la_amx_usable() (amx_usable(): CPUID, XCR0 and the
// Linux tile permission). The tile configuration is loaded by every product (it is cheap next to
// one product) and released by la_amx_release().
#pragma once

#include <cstddef>
#include <cstdint>

namespace hanpu::cpu {

/// AMX-BF16 tiles can run here (linear_kernels.hpp, amx_usable()).
bool la_amx_usable();
/// Releases the tile state of the calling thread (after its last product).
void la_amx_release();

/// Depth and row granularity of the packed operands: depth (k) is padded with zeros to whole
/// tile steps of 32, rows of A to whole tiles of 16, columns of B to 16.
inline size_t la_amx_depth(size_t k) { return (k + 31) / 32 * 32; }
inline size_t la_amx_rows(size_t m) { return (m + 15) / 16 * 16; }
inline size_t la_amx_cols(size_t n) { return (n + 15) / 16 * 16; }

/// B operand: rows [0, rows) of the f32 matrix B (row stride ldb, `cols` columns), row r scaled by
/// row_scale[r] (if given), as bf16 k pairs: term t's pair row p is out + t * term_stride + p * ldo
/// (uint32 words; ldo >= la_amx_cols(cols)). Pair rows up to la_amx_depth(rows) / 2 are written,
/// zeros past `rows` and past `cols` (up to la_amx_cols(cols)).
void la_amx_pack_pairs(const float* B, size_t ldb, size_t rows, size_t cols, const float* row_scale, int terms,
                       uint32_t* out, size_t ldo, size_t term_stride);

/// A operand: rows [0, rows) of the f32 matrix A (row stride lda) as bf16 rows of `terms` parts,
/// row i holding columns [0, min(cols, i + 1)) when `lower` (the rest of the row is zero: a lower
/// triangular A), else [0, cols); zeros up to la_amx_depth(cols); rows up to la_amx_rows(rows)
/// are zero. Term t's row i at out + t * term_stride + i * ldo (uint16; ldo >= la_amx_depth(cols)).
void la_amx_pack_rows(const float* A, size_t lda, size_t rows, size_t cols, bool lower, int terms, uint16_t* out,
                      size_t ldo, size_t term_stride);

/// A operand from k pairs: the bf16 matrix whose transpose is stored as 32-bit pairs
/// (pairs[p][j] = X[j][2p] | X[j][2p+1] << 16, row stride ldp words, e.g. K^T pairs of the staged
/// bf16 key rows) -> out[d][j] = X[j][d] for d < dims, j < cols; zero for j in [cols,
/// la_amx_depth(cols)) and rows up to la_amx_rows(dims). ldo (uint16) >= la_amx_depth(cols).
void la_amx_unpair(const uint32_t* pairs, size_t ldp, size_t dims, size_t cols, uint16_t* out, size_t ldo);

/// What the product does with C.
enum class AmxStore {
  kSet,       // C = diag(p) A B
  kAdd,       // C = C + diag(p) A B
  kScaleAdd,  // C = diag(c) C + diag(p) A B
};

/// Called once per 32 x 32 block of a product while its last tile products run (e.g. a software prefetcher
/// handing out its lines evenly over the work, as the f32 GEMM tiles do).
struct AmxHook {
  void (*fn)(void*) = nullptr;
  void* ctx = nullptr;
};

/// C[M x N] (op)= diag(p_scale) A[M x depth] B[depth x N] on AMX. A: a_terms bf16 row blocks
/// (row stride lda uint16, term stride a_ts), readable for la_amx_rows(M) rows and
/// la_amx_depth(depth) columns, zero from `depth` on; B: b_terms pair blocks (row stride ldb
/// words, term stride b_ts), readable for la_amx_depth(depth) / 2 pair rows and la_amx_cols(N)
/// columns, zero past depth. lower: A[i][k] = 0 for k > i (each 16-row strip stops at its last
/// row's depth). p_scale (M) may be null (1); c_scale (M) only for kScaleAdd.
void la_amx_gemm(const uint16_t* A, size_t lda, size_t a_ts, int a_terms, const uint32_t* B, size_t ldb, size_t b_ts,
                 int b_terms, float* C, size_t ldc, size_t M, size_t N, size_t depth, bool lower, AmxStore store,
                 const float* p_scale, const float* c_scale, AmxHook hook = {});

// ---- The engine's products, one entry point each (what a plan selects; cpu/la/fused-inl.h calls
// them). Every operand with its leading dimension; `terms` bf16 parts for the f32 operands.

/// State reads: C (op)= diag(row_scale) X S for L raw bf16 rows X (q or k as stored, ld_rows) and
/// the state S in pairs (la_amx_pack_pairs of S, K x N): GDN's X = βV − diag(β e^Γ / |k|) K S
/// (kAdd) and O = diag(e^Γ scale / |q|) Q S (kSet).
inline void la_amx_state_read(const uint16_t* rows, size_t ld_rows, size_t L, const uint32_t* S_pairs, size_t ld_pairs,
                              size_t term_stride, int terms, float* C, size_t ldc, size_t N, size_t K, AmxStore store,
                              const float* row_scale, AmxHook hook = {}) {
  la_amx_gemm(rows, ld_rows, 0, 1, S_pairs, ld_pairs, term_stride, terms, C, ldc, L, N, K, false, store, row_scale,
              nullptr, hook);
}
/// Intra-chunk output: O += P V_new for the masked lower-triangular gram P (la_amx_pack_rows with
/// lower) and v_new in pairs, L x L by L x N.
inline void la_amx_output(const uint16_t* P_rows, size_t ld_p, size_t p_term_stride, const uint32_t* E_pairs,
                          size_t ld_e, size_t e_term_stride, int terms, float* O, size_t ldo, size_t L, size_t N,
                          AmxHook hook = {}) {
  la_amx_gemm(P_rows, ld_p, p_term_stride, terms, E_pairs, ld_e, e_term_stride, terms, O, ldo, L, N, L, true,
              AmxStore::kAdd, nullptr, nullptr, hook);
}
/// State update: S = diag(decay) S + Kᵀ E' for Kᵀ as bf16 rows (la_amx_unpair of the keys' pairs,
/// K x L) and E' = diag(e^{Γ_L−Γ_j} / |k_j|) v_new in pairs (L x N).
inline void la_amx_state_update(const uint16_t* Kt_rows, size_t ld_kt, size_t K, const uint32_t* E_pairs, size_t ld_e,
                                size_t e_term_stride, int terms, float* S, size_t lds, size_t N, size_t L,
                                const float* decay, AmxHook hook = {}) {
  la_amx_gemm(Kt_rows, ld_kt, 0, 1, E_pairs, ld_e, e_term_stride, terms, S, lds, K, N, L, false, AmxStore::kScaleAdd,
              nullptr, decay, hook);
}

/// KDA's state reads: C (op)= A S for f32 rows A packed in `terms` parts (la_amx_pack_rows of the
/// decayed rows, L x K: X += Kn S with Kn = −diag(β) K ⊙ e^Γ (kAdd), O = (Q ⊙ e^Γ) S (kSet)) and the
/// state in pairs of as many parts. KDA's per-channel decays leave no raw bf16 operand.
inline void la_amx_decayed_state_read(const uint16_t* A_rows, size_t ld_a, size_t a_term_stride, const uint32_t* S_pairs,
                                      size_t ld_pairs, size_t s_term_stride, int terms, float* C, size_t ldc, size_t L,
                                      size_t N, size_t K, AmxStore store, AmxHook hook = {}) {
  la_amx_gemm(A_rows, ld_a, a_term_stride, terms, S_pairs, ld_pairs, s_term_stride, terms, C, ldc, L, N, K, false, store,
              nullptr, nullptr, hook);
}
/// KDA's state update: S = diag(decay) S + Kdᵀ E for the decayed keys Kdᵀ[d][j] = k_j[d] e^{Γ_L[d]−Γ_j[d]}
/// (K x L, la_amx_pack_rows in `terms` parts) and v_new in pairs (L x N, as many parts).
inline void la_amx_decayed_state_update(const uint16_t* Kt_rows, size_t ld_kt, size_t kt_term_stride, size_t K,
                                        const uint32_t* E_pairs, size_t ld_e, size_t e_term_stride, int terms, float* S,
                                        size_t lds, size_t N, size_t L, const float* decay, AmxHook hook = {}) {
  la_amx_gemm(Kt_rows, ld_kt, kt_term_stride, terms, E_pairs, ld_e, e_term_stride, terms, S, lds, K, N, L, false,
              AmxStore::kScaleAdd, nullptr, decay, hook);
}

}  // namespace hanpu::cpu
