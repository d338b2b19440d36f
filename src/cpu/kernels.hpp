// Interface between the host-side driver (la_cpu.cpp) and the SIMD kernels (la_kernels.cpp and
// its stage files src/cpu/la/*-inl.h, which Highway compiles once per target and dispatches at run
// time).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hanpu/plan_exec.hpp"
#include "la/job.hpp"

namespace hanpu::cpu {

/// Floats of per-core scratch the head-fused path needs for a group of `group` items of `width`
/// state columns. Independent of T: the states and every per-chunk intermediate live here,
/// nothing per chunk goes to main memory.
size_t fused_arena_floats(const LaJob& job, int64_t width, int chunk, size_t group, const FusedProgram& program);

/// Head-fused: all chunks of a group of items (same sequence and columns), every operator,
/// states in the arena; the group advances chunk by chunk in lockstep.
void fused_group(const LaJob& job, const WorkItem* items, size_t count, float* arena, int chunk,
                 const FusedProgram& program);

/// Recurrent form (and decode): token by token, state in the arena. Reads the item's columns of
/// job.in.initial_state (or zeros), writes job.out.o and job.out.final_state (if present).
size_t recurrent_arena_floats(const LaJob& job, int64_t width);
void recurrent_item(const LaJob& job, const WorkItem& item, float* arena);

/// The FLA-style chunk-parallel path: Map phase per (chunk, head) into main-memory buffers,
/// Reduce per (sequence, head, columns), then the output Map per (chunk, head).
struct FlaBuffers {
  int chunk = 64;
  int64_t total_chunks = 0;       // over all sequences
  const int64_t* chunk_seq = nullptr;    // [total_chunks] sequence of each chunk
  const int64_t* chunk_start = nullptr;  // [total_chunks] first token (within the sequence)
  const int64_t* seq_first_chunk = nullptr;  // [N] index of the sequence's first chunk
  // Per (chunk, value head) in main memory, as FLA materialises them:
  double* gamma = nullptr;  // cumulative gates [chunks, HV, C(*K)] (chunk-relative; fp64 like the fused path, see LoadChunk)
  float* T = nullptr;      // (I+A)^-1 [chunks, HV, C, C]
  float* W = nullptr;      // [chunks, HV, C, K]
  float* U = nullptr;      // [chunks, HV, C, V]
  float* h = nullptr;      // state at the start of each chunk [chunks, HV, K, V]
  float* v_new = nullptr;  // [chunks, HV, C, V]
  float* P = nullptr;      // GEMM-first form only: the masked gated Q K^T [chunks, HV, C, C] (T holds A)
};
size_t fla_scratch_floats(const LaJob& job, int chunk);
void fla_map_chunk(const LaJob& job, const FlaBuffers& buf, int64_t chunk_index, int64_t hv, float* scratch);
/// The state recurrence of the item's columns (a block of them or the whole head).
void fla_reduce_item(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch);
/// Columns [col0, col1) of the output of one (chunk, value head).
void fla_output_chunk(const LaJob& job, const FlaBuffers& buf, int64_t chunk_index, int64_t hv, int64_t col0, int64_t col1,
                      float* scratch);
/// The same three phases in the GEMM-first form (a GEMM-first plan's tier-3 kernels): Map forms
/// the masked grams A (into T) and P; the state phase solves (I + A) v_new = diag(β)V −
/// diag(β e^Γ) K S per item's columns; the output is diag(e^Γ) Q h + P v_new. Same scratch.
void gf_map_chunk(const LaJob& job, const FlaBuffers& buf, int64_t chunk_index, int64_t hv, float* scratch);
void gf_state_item(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch);
void gf_output_chunk(const LaJob& job, const FlaBuffers& buf, int64_t chunk_index, int64_t hv, int64_t col0, int64_t col1,
                     float* scratch);

/// Flush denormals to zero on this thread while alive (decays underflow routinely; denormal
/// arithmetic is ~100x slower on x86 and changes results by less than 1e-38).
class DenormalGuard {
 public:
  DenormalGuard();
  ~DenormalGuard();

 private:
  unsigned saved_ = 0;
};

/// Whether gram_bf16_lower can run here: AMX present and permitted (amx_usable), and this build
/// has the code (x86-64, GCC/Clang). gram_bf16.cpp.
bool gram_bf16_usable();
/// KK[i][j] = k_i . k_j and QK[i][j] = q_i . k_j from bf16 rows, for rows i < L and at least every
/// column j <= i (whole 16 x 16 blocks on and below the diagonal are written, rows and columns up
/// to L rounded up to 16: the masking pass discards the rest). k_rows, q_rows: rows of ld_rows
/// bf16 (a multiple of 32, zero beyond K), L rounded up to 16 of them readable. kt_pairs: K^T as
/// bf16 pairs, ld_rows / 2 rows of ld_pairs uint32, zero for columns >= L. The products of bf16
/// values are exact in f32; only the summation order differs from the f32 path.
void gram_bf16_lower(const uint16_t* k_rows, const uint16_t* q_rows, size_t ld_rows, const uint32_t* kt_pairs,
                     size_t ld_pairs, size_t L, float* KK, float* QK, size_t ldc);

/// Whether gram_f32_sme can run here: an aarch64 Linux build (HANPU_HAVE_GRAM_SME), the kernel
/// reports SME (getauxval(AT_HWCAP2) & HWCAP2_SME) and HANPU_ISA is unset or native. gram_sme.cpp.
bool gram_f32_sme_usable();
#if defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define HANPU_HAVE_GRAM_SME 1
/// The streaming vector length SVL in bytes (RDSVL): an f32 ZA tile is SVL/4 x SVL/4 values.
size_t sme_vector_bytes();
/// C[i][j] = sum_k At[k][i] * Bt[k][j] for i < M, j < N, i.e. C = A B^T given both operands
/// K-major (A^T: Kd rows of lda floats, M of them used; B^T: Kd rows of ldb floats, N used), in
/// f32 with SME's FMOPA outer products into the ZA tiles; only C's M x N values are written and
/// nothing beyond the operands' M and N columns is read (any M, N, Kd, any SVL). The engine's
/// grams: K K^T is At = Bt = the arena's K^T. Only after gram_f32_sme_usable().
void gram_f32_sme(const float* At, size_t lda, const float* Bt, size_t ldb, size_t M, size_t N, size_t Kd, float* C,
                  size_t ldc);
#else
#define HANPU_HAVE_GRAM_SME 0
#endif

/// GFLOP/s of the GEMM core on one thread for C(M x N) += A(M x Kd) B(Kd x N), cache-resident.
double gemm_probe_gflops(size_t M, size_t N, size_t Kd, double seconds);

/// Name of the SIMD target the kernels dispatch to (e.g. "AVX3").
const char* simd_target_name();
/// Floats per native vector of that target.
int simd_float_lanes();
/// The largest GEMM register tile the dispatched target's kernels are compiled for (rows, vectors
/// of C); FusedProgram::gemm_rows / gemm_vectors may ask for any shape up to it.
int gemm_max_rows();
int gemm_max_vectors();

}  // namespace hanpu::cpu
