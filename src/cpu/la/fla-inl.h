// The FLA-style chunk-parallel path: the map, reduce and output phases (Fla*) and their
// GEMM-first variant (Gf*), with the scratch they share.
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_FLA_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_FLA_INL_H_
#undef HANPU_CPU_LA_FLA_INL_H_
#else
#define HANPU_CPU_LA_FLA_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include "cpu/kernels.hpp"
#include "cpu/la/base-inl.h"
#include "cpu/la/gemm-inl.h"
#include "cpu/la/kda_gram-inl.h"
#include "cpu/la/rows-inl.h"
#include "cpu/la/solve-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------------------------
// FLA-style chunk-parallel baseline. Phase 1 (per chunk and head): Γ, T = (I+A)^-1,
// W = T diag(β e^Γ) K, U = T diag(β) V into main memory. Phase 2 (per sequence, head, columns):
// h[c] = S, v_new = U − W S, S update. Phase 3 (per chunk and head): O = (Q e^Γ) h[c] + P v_new.

struct FlaScratch {
  size_t K, C, Vp, gk;
  size_t q, k, v, G, beta, graw, AP, Kt, KQl, KrT, eg, tmpA, tmpB, total;
};

FlaScratch MakeFlaScratch(const LaJob& job, int chunk) {
  FlaScratch s{};
  s.K = static_cast<size_t>(job.shape.K);
  s.C = static_cast<size_t>(chunk);
  s.Vp = RoundUp(static_cast<size_t>(job.shape.V), kPad);
  s.gk = job.traits().channel_gate() ? s.K : 1;
  const size_t Kp = RoundUp(s.K, kPad);
  size_t off = 0;
  auto take = [&](size_t floats) {
    const size_t at = off;
    off += RoundUp(floats, kPad);
    return at;
  };
  s.q = take(s.C * s.K);
  s.k = take(s.C * s.K);
  s.v = take(s.C * s.Vp);
  s.G = take(2 * s.C * s.gk);
  s.beta = take(s.C);
  s.graw = take(std::max(s.K, s.C));  // a gate row (K) or a row of C gate factors (MaskGram)
  s.AP = take(2 * s.C * s.C);
  s.Kt = take(s.K * s.C);
  s.KQl = take(2 * 16 * s.K);
  s.KrT = take(s.K * s.C);
  s.eg = take(s.C * s.gk);
  s.tmpA = take(s.C * std::max(Kp, s.Vp));
  s.tmpB = take(s.C * std::max(Kp, s.Vp));
  s.total = off;
  return s;
}

struct ChunkRef {
  SeqSpan seq;
  int64_t t0;
  size_t L;
};

ChunkRef FlaChunk(const LaJob& job, const FlaBuffers& buf, int64_t c) {
  const SeqSpan seq = job.seqs[static_cast<size_t>(buf.chunk_seq[c])];
  const int64_t t0 = buf.chunk_start[c];
  return {seq, t0, static_cast<size_t>(std::min<int64_t>(buf.chunk, seq.len - t0))};
}

// Loads the chunk rows and Γ into the scratch and forms the masked grams: the Map phase
// (map_phase) needs K K^T and v, the output phase Q K^T, as FLA's separate kernels compute them
// (GDN; KDA's anchored evaluation forms both together). Returns the ChunkRef.
ChunkRef FlaPrepare(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch, bool map_phase) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaChunk(job, buf, c);
  float* q = scratch + s.q;
  float* k = scratch + s.k;
  double* G = reinterpret_cast<double*>(scratch + s.G);
  float* beta = scratch + s.beta;
  float* graw = scratch + s.graw;
  float* AP = scratch + s.AP;
  const ChunkRows rows{q, k, map_phase ? scratch + s.v : nullptr, s.Vp, G, beta, graw};
  LoadChunk(job, ch.seq, hv, ch.t0, ch.L, 0, job.shape.V, rows);
  const size_t Lp = RoundUp(ch.L, kPad);
  if (s.gk > 1) {
    KdaTokenFactors(G, ch.L, s.K, scratch + s.eg);
    KdaGram(k, q, G, ch.L, s.K, s.C, s.C, scratch + s.KQl, scratch + s.KrT, graw, scratch + s.eg, AP);
  } else {
    float* Kt = scratch + s.Kt;
    Transpose(k, ch.L, s.K, Kt, s.C);
    if (map_phase)
      Gemm<Acc::kSet>(k, s.K, Kt, s.C, AP, s.C, ch.L, Lp, s.K, Tri::kLowerN);
    else
      Gemm<Acc::kSet>(q, s.K, Kt, s.C, AP + s.C * s.C, s.C, ch.L, Lp, s.K, Tri::kLowerN);
  }
  MaskGram(s.gk == 1, G, beta, ch.L, s.C, s.C, AP, graw);
  return ch;
}

void FlaMapChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaPrepare(job, buf, c, hv, scratch, true);
  const size_t K = s.K, C = s.C, Vp = s.Vp, L = ch.L, gk = s.gk;
  const int64_t HV = job.shape.HV;
  const size_t slot = static_cast<size_t>(c * HV + hv);
  float* T = buf.T + slot * C * C;
  const size_t Kp = RoundUp(K, kPad);
  float* W = buf.W + slot * C * Kp;
  float* U = buf.U + slot * C * Vp;
  double* gam = buf.gamma + slot * C * gk;
  const float* k = scratch + s.k;
  const float* v = scratch + s.v;
  const double* G = reinterpret_cast<const double*>(scratch + s.G);
  const float* beta = scratch + s.beta;
  float* egam = scratch + s.graw;  // K floats: one row of e^Γ at a time
  // T = (I + A)^-1: solve against the identity (rows padded to a vector multiple).
  std::fill(T, T + C * C, 0.f);
  for (size_t i = 0; i < L; ++i) T[i * C + i] = 1.f;
  SolveUnitLower(scratch + s.AP, C, T, C, L, RoundUp(L, kPad));
  // W = T diag(β e^Γ) K, U = T diag(β) V (FLA's recompute_w_u).
  float* Kb = scratch + s.tmpA;
  float* Vb = scratch + s.tmpB;
  for (size_t i = 0; i < L; ++i) {
    ExpRow(G + i * gk, egam, gk);
    float* kb = Kb + i * Kp;
    if (gk > 1) {
      MulRows(k + i * K, egam, kb, K);
      Scale(kb, beta[i], K);
    } else {
      ScaleTo(k + i * K, beta[i] * egam[0], kb, K);
    }
    std::fill(kb + K, kb + Kp, 0.f);
    ScaleTo(v + i * Vp, beta[i], Vb + i * Vp, Vp);
    for (size_t d = 0; d < gk; ++d) gam[i * gk + d] = G[i * gk + d];
  }
  // W = T Kb: rows of W and Kb are padded to Kp columns (zero pads) so W is a GEMM output.
  Gemm<Acc::kSet>(T, C, Kb, Kp, W, Kp, L, Kp, L, Tri::kLowerK);
  Gemm<Acc::kSet>(T, C, Vb, Vp, U, Vp, L, Vp, L, Tri::kLowerK);
}

// The item's columns [col0, col1) only (FLA's BV tiling): the state, v_new and the snapshots h of
// those columns; sibling column blocks may run on other threads at the same time, so v_new is
// formed in scratch and only the item's columns are written to the shared buffers.
void FlaReduceItem(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const size_t K = s.K, C = s.C, Vp = s.Vp, gk = s.gk;
  const int64_t HV = job.shape.HV, hv = item.head;
  const SeqSpan seq = job.seqs[static_cast<size_t>(item.seq)];
  const size_t Kp = RoundUp(K, kPad);
  const size_t c0 = static_cast<size_t>(item.col0), w = static_cast<size_t>(item.col1 - item.col0);
  // GEMM width: whole heads as always (Vp); a block in whole vectors, which stays inside Vp
  // because blocks start at multiples of the column quantum (the vector length or a multiple).
  const size_t N = item.col0 == 0 && item.col1 == job.shape.V ? Vp : RoundUp(w, hn::Lanes(DF()));
  float* S = scratch;  // K x Vp: the running state of the item's columns (FlaScratchFloats reserves room)
  float* krow = S + RoundUp(K * Vp, kPad);
  float* Kt = krow + Kp;  // K x C: decayed keys of the chunk
  float* vnew = Kt + RoundUp(K * C, kPad);  // C x Vp: v_new of the item's columns
  LoadState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  int64_t c = buf.seq_first_chunk[item.seq];
  for (int64_t t0 = 0; t0 < seq.len; t0 += buf.chunk, ++c) {
    const size_t L = static_cast<size_t>(std::min<int64_t>(buf.chunk, seq.len - t0));
    const size_t slot = static_cast<size_t>(c * HV + hv);
    for (size_t d = 0; d < K; ++d) std::memcpy(buf.h + slot * K * Vp + d * Vp + c0, S + d * Vp, w * sizeof(float));
    // v_new = U − W S
    const float* U = buf.U + slot * C * Vp;
    for (size_t i = 0; i < L; ++i) {
      std::memcpy(vnew + i * Vp, U + i * Vp + c0, w * sizeof(float));
      std::fill(vnew + i * Vp + w, vnew + i * Vp + N, 0.f);
    }
    Gemm<Acc::kSub>(buf.W + slot * C * Kp, Kp, S, Vp, vnew, Vp, L, N, K);
    for (size_t i = 0; i < L; ++i) std::memcpy(buf.v_new + slot * C * Vp + i * Vp + c0, vnew + i * Vp, w * sizeof(float));
    const double* gam = buf.gamma + slot * C * gk;
    const double* GL = gam + (L - 1) * gk;
    // FLA's state kernel re-reads the chunk's keys from main memory.
    for (size_t j = 0; j < L; ++j) {
      const int64_t t = seq.bos + t0 + static_cast<int64_t>(j);
      LoadRow(job.in.k, offset4(job.in.k, seq.batch, t, job.key_head(hv), 0), job.in.k.stride[3], K, krow);
      if (job.opt.qk_l2norm) L2Normalize(krow, K);
      for (size_t d = 0; d < K; ++d) {
        const float e = std::exp(static_cast<float>(GL[gk > 1 ? d : 0] - gam[j * gk + (gk > 1 ? d : 0)]));
        Kt[d * C + j] = krow[d] * e;
      }
    }
    for (size_t d = 0; d < K; ++d) Scale(S + d * Vp, std::exp(static_cast<float>(GL[gk > 1 ? d : 0])), N);
    Gemm<Acc::kAdd>(Kt, C, vnew, Vp, S, Vp, K, N, L);
  }
  StoreState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  hwy::FlushStream();
}

// Columns [col0, col1) of the chunk's output (FLA's BV tiling of chunk_fwd_o).
void FlaOutputChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                    float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaPrepare(job, buf, c, hv, scratch, false);
  const size_t K = s.K, C = s.C, Vp = s.Vp, L = ch.L, gk = s.gk;
  const size_t slot = static_cast<size_t>(c * job.shape.HV + hv);
  const size_t c0 = static_cast<size_t>(col0), w = static_cast<size_t>(col1 - col0);
  const size_t N = col0 == 0 && col1 == job.shape.V ? Vp : RoundUp(w, hn::Lanes(DF()));  // as FlaReduceItem
  const float* q = scratch + s.q;
  const double* G = reinterpret_cast<const double*>(scratch + s.G);
  float* Qg = scratch + s.tmpA;
  float* O = scratch + s.tmpB;
  float* egam = scratch + s.graw;
  for (size_t i = 0; i < L; ++i) {
    ExpRow(G + i * gk, egam, gk);
    if (gk > 1)
      MulRows(q + i * K, egam, Qg + i * K, K);
    else
      ScaleTo(q + i * K, egam[0], Qg + i * K, K);
  }
  Gemm<Acc::kSet>(Qg, K, buf.h + slot * K * Vp + c0, Vp, O, Vp, L, N, K);
  Gemm<Acc::kAdd>(scratch + s.AP + C * C, C, buf.v_new + slot * C * Vp + c0, Vp, O, Vp, L, N, L, Tri::kLowerK);
  StoreOutputRows(job, ch.seq, hv, ch.t0, L, col0, col1, O, Vp);
  hwy::FlushStream();
}

// ---------------------------------------------------------------------------------------------
// The chunk-parallel path in the GEMM-first form: the tier-3 kernels (tail_map, tail_state,
// tail_output) of a GEMM-first plan, with the plan's operators in the plan's phases. Map (gate,
// kkt, qkt, kkt_gate, qkt_gate, solve_diag): the masked gated grams A and P of a (chunk, head)
// into main memory (A in buf.T, P in buf.P). State (ks, rhs, solve, update): per item's columns,
// chunk by chunk, X = diag(β)V − diag(β e^Γ) K S solved in place against (I + A) into v_new, the
// state snapshot h, then the update. Output (qs, pv, out): O = diag(e^Γ) Q h + P v_new.

void GfMapChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaChunk(job, buf, c);
  const size_t K = s.K, C = s.C, L = ch.L, gk = s.gk;
  float* q = scratch + s.q;
  float* k = scratch + s.k;
  double* G = reinterpret_cast<double*>(scratch + s.G);
  float* beta = scratch + s.beta;
  float* graw = scratch + s.graw;
  float* AP = scratch + s.AP;
  const ChunkRows rows{q, k, nullptr, s.Vp, G, beta, graw};
  LoadChunk(job, ch.seq, hv, ch.t0, L, 0, job.shape.V, rows);
  if (gk > 1) {
    KdaTokenFactors(G, L, K, scratch + s.eg);
    KdaGram(k, q, G, L, K, C, C, scratch + s.KQl, scratch + s.KrT, graw, scratch + s.eg, AP);
  } else {
    float* Kt = scratch + s.Kt;
    const size_t Lp = RoundUp(L, kPad);
    Transpose(k, L, K, Kt, C);
    Gemm<Acc::kSet>(k, K, Kt, C, AP, C, L, Lp, K, Tri::kLowerN);
    Gemm<Acc::kSet>(q, K, Kt, C, AP + C * C, C, L, Lp, K, Tri::kLowerN);
  }
  MaskGram(gk == 1, G, beta, L, C, C, AP, graw);
  const size_t slot = static_cast<size_t>(c * job.shape.HV + hv);
  std::memcpy(buf.T + slot * C * C, AP, C * C * sizeof(float));
  std::memcpy(buf.P + slot * C * C, AP + C * C, C * C * sizeof(float));
  std::memcpy(buf.gamma + slot * C * gk, G, L * gk * sizeof(double));
}

void GfStateItem(const LaJob& job, const FlaBuffers& buf, const WorkItem& item, float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const size_t K = s.K, C = s.C, Vp = s.Vp, gk = s.gk;
  const int64_t HV = job.shape.HV, hv = item.head;
  const SeqSpan seq = job.seqs[static_cast<size_t>(item.seq)];
  const size_t c0 = static_cast<size_t>(item.col0), w = static_cast<size_t>(item.col1 - item.col0);
  const size_t N = RoundUp(w, kPad);  // private rows of Vp floats: whole pads, as the fused path
  float* q = scratch + s.q;
  float* k = scratch + s.k;
  float* X = scratch + s.v;  // β v of the item's columns, then v_new
  double* G = reinterpret_cast<double*>(scratch + s.G);
  float* beta = scratch + s.beta;
  float* graw = scratch + s.graw;
  float* Kn = scratch + s.tmpA;  // KDA: −β e^Γ ⊙ k; GDN: the row factors −β e^Γ
  float* Kt = scratch + s.Kt;    // K x C: k_j e^{Γ_L−Γ_j}
  float* S = scratch + s.total;  // K x Vp (GfScratchFloats reserves it)
  LoadState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  ChunkRows rows{q, k, X, Vp, G, beta, graw, /*v_times_beta=*/true};
  int64_t c = buf.seq_first_chunk[item.seq];
  for (int64_t t0 = 0; t0 < seq.len; t0 += buf.chunk, ++c) {
    const size_t L = static_cast<size_t>(std::min<int64_t>(buf.chunk, seq.len - t0));
    const size_t slot = static_cast<size_t>(c * HV + hv);
    LoadChunk(job, seq, hv, t0, L, item.col0, item.col1, rows);
    for (size_t d = 0; d < K; ++d) std::memcpy(buf.h + slot * K * Vp + d * Vp + c0, S + d * Vp, w * sizeof(float));
    // ks, rhs: X = diag(β)V − diag(β e^Γ) K S.
    if (gk > 1) {
      for (size_t i = 0; i < L; ++i) {
        ExpRow(G + i * K, graw, K);
        MulRowsScaled(k + i * K, graw, -beta[i], Kn + i * K, K);
      }
      Gemm<Acc::kAdd>(Kn, K, S, Vp, X, Vp, L, N, K);
    } else {
      ExpRow(G, graw, L);
      for (size_t i = 0; i < L; ++i) Kn[i] = -beta[i] * graw[i];
      Gemm<Acc::kAddRowScaled>(k, K, S, Vp, X, Vp, L, N, K, Tri::kNone, nullptr, Kn);
    }
    // solve: (I + A) v_new = X, A from the Map phase.
    SolveUnitLower(buf.T + slot * C * C, C, X, Vp, L, N);
    for (size_t i = 0; i < L; ++i) std::memcpy(buf.v_new + slot * C * Vp + i * Vp + c0, X + i * Vp, w * sizeof(float));
    // update: S <- e^{Γ_L} S + Σ_j (e^{Γ_L−Γ_j} k_j)^T v_new_j.
    const double* GL = G + (L - 1) * gk;
    for (size_t j = 0; j < L; ++j)
      for (size_t d = 0; d < K; ++d)
        Kt[d * C + j] = k[j * K + d] * std::exp(static_cast<float>(GL[gk > 1 ? d : 0] - G[j * gk + (gk > 1 ? d : 0)]));
    for (size_t d = 0; d < K; ++d) Scale(S + d * Vp, std::exp(static_cast<float>(GL[gk > 1 ? d : 0])), N);
    Gemm<Acc::kAdd>(Kt, C, X, Vp, S, Vp, K, N, L);
  }
  StoreState(job, item.seq, hv, item.col0, item.col1, S, Vp);
  hwy::FlushStream();
}

void GfOutputChunk(const LaJob& job, const FlaBuffers& buf, int64_t c, int64_t hv, int64_t col0, int64_t col1,
                   float* scratch) {
  const FlaScratch s = MakeFlaScratch(job, buf.chunk);
  const ChunkRef ch = FlaChunk(job, buf, c);
  const size_t K = s.K, C = s.C, Vp = s.Vp, L = ch.L, gk = s.gk;
  const size_t slot = static_cast<size_t>(c * job.shape.HV + hv);
  const size_t c0 = static_cast<size_t>(col0), w = static_cast<size_t>(col1 - col0);
  const size_t N = col0 == 0 && col1 == job.shape.V ? Vp : RoundUp(w, hn::Lanes(DF()));  // as FlaOutputChunk
  float* q = scratch + s.q;
  double* G = reinterpret_cast<double*>(scratch + s.G);
  const ChunkRows rows{q, scratch + s.k, nullptr, Vp, G, scratch + s.beta, scratch + s.graw};
  LoadChunk(job, ch.seq, hv, ch.t0, L, 0, job.shape.V, rows);
  float* Qg = scratch + s.tmpA;
  float* O = scratch + s.tmpB;
  float* egam = scratch + s.graw;
  for (size_t i = 0; i < L; ++i) {
    ExpRow(G + i * gk, egam, gk);
    if (gk > 1)
      MulRows(q + i * K, egam, Qg + i * K, K);
    else
      ScaleTo(q + i * K, egam[0], Qg + i * K, K);
  }
  // qs, then pv and out with the Map phase's P.
  Gemm<Acc::kSet>(Qg, K, buf.h + slot * K * Vp + c0, Vp, O, Vp, L, N, K);
  Gemm<Acc::kAdd>(buf.P + slot * C * C, C, buf.v_new + slot * C * Vp + c0, Vp, O, Vp, L, N, L, Tri::kLowerK);
  StoreOutputRows(job, ch.seq, hv, ch.t0, L, col0, col1, O, Vp);
  hwy::FlushStream();
}

size_t FlaScratchFloats(const LaJob& job, int chunk) {
  const FlaScratch s = MakeFlaScratch(job, chunk);
  const size_t reduce = RoundUp(s.K * s.Vp, kPad) + RoundUp(s.K, kPad) + RoundUp(s.K * s.C, kPad) + s.C * s.Vp + kPad;
  const size_t gemm_first_state = s.total + RoundUp(s.K * s.Vp, kPad);  // GfStateItem's S after the chunk buffers
  return std::max({s.total, reduce, gemm_first_state});
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_FLA_INL_H_
