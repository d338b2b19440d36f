// SIMD kernels of the CPU backend, compiled once per SIMD target by Highway and dispatched at run
// time (AVX2, AVX-512, NEON, ...).
//
// The head-fused path (FusedGroup) runs all six operators of the chunkwise computation (the paper, arXiv 2609.32114, §2) for a group of work
// items (sequence, value head, column block), chunk after chunk, with the states S and every
// per-chunk intermediate in a per-core arena. Per chunk of L <= C rows, with Γ the chunk-local cumulative
// log-decay (Γ_r = Σ_{s<=r} g_s, computed in fp64: see LoadChunk) and scale folded into q:
//
//   GEMM-first (paper §4):        X = diag(β) V − diag(β e^Γ) K S     (#5 read, rewritten)
//                                O = diag(e^Γ) Q S                   (#6, inter-chunk part)
//                                A = strictly-lower(β_i e^{Γi−Γj} k_i·k_j),  P = lower(e^{Γi−Γj} q_i·k_j)
//   solve:                       (I + A) E = X                       (#3, W never formed)
//   output:                      O += P E ;  o <- O
//   state update, in place:      S <- e^{Γ_L} S + Σ_j e^{Γ_L−Γ_j} k_j^T E_j   (#5 update)
//
// For KDA the decays are per key channel: the e^Γ factors multiply K and Q element-wise, and
// K K^T / Q K^T are evaluated with anchors so that only non-positive exponents appear (§2.7 of
// FLA's fla/ops/kda/chunk_intra.py). Masks are applied by selection, never by multiplying with 0.
#include <chrono>
#include <vector>

#include "cpu/kernels.hpp"
#include "hanpu/isa.hpp"

// SVE/RVV vectors are sizeless and cannot live in the accumulator arrays the GEMM tile uses.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/la_kernels.cpp"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

// The stages, one Highway -inl.h per stage family (each includes what it uses):
#include "cpu/la/base-inl.h"       // float tag, padded arena rows
#include "cpu/la/gemm-inl.h"       // GEMM tiles, prefetcher, Gemm
#include "cpu/la/rows-inl.h"       // row loads/stores, vector helpers, LoadChunk, state, transposes
#include "cpu/la/kda_gram-inl.h"   // KDA gram factors
#include "cpu/la/solve-inl.h"      // MaskGram, SolveUnitLower
#include "cpu/la/fused-inl.h"      // the head-fused driver (FusedGroup)
#include "cpu/la/recurrent-inl.h"  // the recurrent path (RecurrentItem)
#include "cpu/la/fla-inl.h"        // the FLA-style path (Fla*, Gf*)

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// Times C += A B (M x Kd times Kd x N, operands resident in cache) on this thread: the GEMM
// core's own efficiency, for the benchmark's breakdown.
double GemmProbeGflops(size_t M, size_t N, size_t Kd, double seconds) {
  const size_t Np = RoundUp(N, kPad), ld = LeadingDim(N);
  std::vector<float> A(M * Kd, 0.5f), B(Kd * ld, 0.25f), C(M * ld, 0.f);
  size_t reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 16; ++i) Gemm<Acc::kAdd>(A.data(), Kd, B.data(), ld, C.data(), ld, M, Np, Kd);
    reps += 16;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  volatile float sink = C[0];
  (void)sink;
  return 2.0 * static_cast<double>(M * Np * Kd) * static_cast<double>(reps) / elapsed / 1e9;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
int FloatLanes() { return static_cast<int>(hn::Lanes(DF())); }
int GemmMaxRows() { return static_cast<int>(kMR); }
int GemmMaxVectors() { return static_cast<int>(kNV); }

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hanpu::cpu {
HWY_EXPORT(FusedGroup);
HWY_EXPORT(FusedArenaFloats);
HWY_EXPORT(RecurrentItem);
HWY_EXPORT(RecurrentArenaFloats);
HWY_EXPORT(FlaMapChunk);
HWY_EXPORT(FlaReduceItem);
HWY_EXPORT(FlaOutputChunk);
HWY_EXPORT(GfMapChunk);
HWY_EXPORT(GfStateItem);
HWY_EXPORT(GfOutputChunk);
HWY_EXPORT(FlaScratchFloats);
HWY_EXPORT(TargetName);
HWY_EXPORT(GemmProbeGflops);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(GemmMaxRows);
HWY_EXPORT(GemmMaxVectors);

size_t fused_arena_floats(const LaJob& job, int64_t width, int chunk, size_t group, const FusedProgram& order) {
  return HANPU_DISPATCH(FusedArenaFloats)(job, width, chunk, group, order);
}
void fused_group(const LaJob& job, const WorkItem* items, size_t count, float* arena, int chunk,
                 const FusedProgram& order) {
  HANPU_DISPATCH(FusedGroup)(job, items, count, arena, chunk, order);
}
size_t recurrent_arena_floats(const LaJob& job, int64_t width) {
  return HANPU_DISPATCH(RecurrentArenaFloats)(job, width);
}
void recurrent_item(const LaJob& job, const WorkItem& item, float* arena) {
  HANPU_DISPATCH(RecurrentItem)(job, item, arena);
}
size_t fla_scratch_floats(const LaJob& job, int chunk) { return HANPU_DISPATCH(FlaScratchFloats)(job, chunk); }
void fla_map_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  HANPU_DISPATCH(FlaMapChunk)(job, buf, c, hv, scratch);
}
void fla_reduce_item(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  HANPU_DISPATCH(FlaReduceItem)(job, buf, item, scratch);
}
void fla_output_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                      float* scratch) {
  HANPU_DISPATCH(FlaOutputChunk)(job, buf, c, hv, col0, col1, scratch);
}
void gf_map_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  HANPU_DISPATCH(GfMapChunk)(job, buf, c, hv, scratch);
}
void gf_state_item(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  HANPU_DISPATCH(GfStateItem)(job, buf, item, scratch);
}
void gf_output_chunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                     float* scratch) {
  HANPU_DISPATCH(GfOutputChunk)(job, buf, c, hv, col0, col1, scratch);
}
const char* simd_target_name() { return HANPU_DISPATCH(TargetName)(); }
double gemm_probe_gflops(size_t M, size_t N, size_t Kd, double seconds) {
  return HANPU_DISPATCH(GemmProbeGflops)(M, N, Kd, seconds);
}
int simd_float_lanes() { return HANPU_DISPATCH(FloatLanes)(); }
int gemm_max_rows() { return HANPU_DISPATCH(GemmMaxRows)(); }
int gemm_max_vectors() { return HANPU_DISPATCH(GemmMaxVectors)(); }

DenormalGuard::DenormalGuard() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  saved_ = csr;
  csr |= 0x8040u;  // FTZ (bit 15) and DAZ (bit 6)
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#endif
}
DenormalGuard::~DenormalGuard() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr = saved_;
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#endif
}

}  // namespace hanpu::cpu
#endif
