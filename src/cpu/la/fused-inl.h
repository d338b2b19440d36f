// The head-fused driver: the arena layout of a group (FusedLayout), FusedGroup running the
// chunk program's stages in the plan's order, and the arena size it needs.
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_FUSED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_FUSED_INL_H_
#undef HANPU_CPU_LA_FUSED_INL_H_
#else
#define HANPU_CPU_LA_FUSED_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include "cpu/kernels.hpp"
#include "cpu/la_amx.hpp"
#include "cpu/operator_timers.hpp"
#include "cpu/la/base-inl.h"
#include "cpu/la/gemm-inl.h"
#include "cpu/la/kda_gram-inl.h"
#include "cpu/la/rows-inl.h"
#include "cpu/la/solve-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------------------------
// Head-fused item.

struct FusedLayout {
  size_t K, C, Vp, ldc, gk;  // Vp: leading dim of V-wide rows; ldc: of C-wide rows
  size_t KrQs, KnQg, Kt, AP, XO, G, beta, egam, graw, KQl, KrT, eg;
  size_t ldw, Tinv, W, U;  // only without GEMM-first: the inverse, W and U of the W/U form
  // only with bf16 grams: raw q/k rows (ldraw bf16 each), K^T in bf16 pairs (ldc per pair row),
  // the grams' row and column factors
  size_t ldraw, raw, KtPairs, gram_scale;
  size_t AP_unmasked;  // only for GDN with HV > H: the grams before masking, for the next value head
  size_t Eg;  // only with update_keeps_vnew: v_new scaled by e^{Γ_L−Γ_j} for the update
  // only with AMX GEMMs (LaJob::amx_terms, cpu/la_amx.hpp): q's and k's row factors and a row of
  // C product factors; S, v_new (output), e^{Γ_L−Γ_j} v_new (update) in bf16 k pairs of ldp words
  // per pair row, P in bf16 rows of ldr, K^T in bf16 rows of ldr; each packed operand's term stride.
  size_t amx_fac, Spk, Epk, E2pk, Ppk, KtRaw;
  size_t ldp, ldr, S_ts, E_ts, P_ts;
  // only KDA with AMX GEMMs: its decayed f32 A operands (Kn, Qg: C x K; the update's decayed K^T:
  // K x C) in bf16 rows of `terms` parts, one at a time (ldA = la_amx_depth(K) for the state reads,
  // ldr for the update), term stride A_ts (uint16).
  size_t Apk, ldA, A_ts;
  size_t total;
};

FusedLayout MakeFusedLayout(const LaJob& job, int64_t width, int chunk, const FusedProgram& program) {
  FusedLayout l{};
  l.K = static_cast<size_t>(job.shape.K);
  l.C = static_cast<size_t>(chunk);
  l.Vp = LeadingDim(static_cast<size_t>(width));
  l.ldc = LeadingDim(l.C);
  l.gk = job.traits().channel_gate() ? l.K : 1;
  size_t off = 0;
  auto take = [&](size_t floats) {
    const size_t at = off;
    off += RoundUp(floats, kPad);
    return at;
  };
  l.KrQs = take(2 * l.C * l.K);
  l.KnQg = take(2 * l.C * l.K);
  l.Kt = take(l.K * l.ldc);
  l.AP = take(2 * l.C * l.ldc);
  l.XO = take(2 * l.C * l.Vp);
  l.G = take(2 * l.C * l.gk);  // doubles
  l.beta = take(l.C);
  l.egam = take(l.C * std::max<size_t>(l.gk, 2));  // GDN: e^Γ_i, then e^{Γ_L−Γ_j} (update)
  l.graw = take(std::max(l.K, l.C));  // a gate row (K) or a row of C gate factors (MaskGram)
  l.KQl = take(2 * 16 * l.K);
  l.KrT = take(l.K * l.ldc);
  l.eg = take(l.C * l.gk);  // KDA: per-token decay factors of the chunk
  l.ldw = LeadingDim(l.K);
  if (!program.gemm_first) {
    l.Tinv = take(l.C * l.ldc);
    l.W = take(l.C * l.ldw);
    l.U = take(l.C * std::max(l.Vp, l.ldw));  // also stages T Kn (ld ldw)
  }
  if (job.bf16_grams) {
    l.ldraw = RoundUp(l.K, 32);  // whole AMX tile steps (32 bf16 = 64 bytes per tile row)
    l.raw = take(l.C * l.ldraw);  // two blocks of C x ldraw bf16 = C x ldraw floats
    l.KtPairs = take(l.ldraw / 2 * l.ldc);
    l.gram_scale = take(3 * l.C);
  }
  if (job.traits().head_gate() && job.group > 1) l.AP_unmasked = take(2 * l.C * l.ldc);
  if (program.update_keeps_vnew) l.Eg = take(l.C * l.Vp);
  if (job.amx_terms > 0) {
    const size_t terms = static_cast<size_t>(job.amx_terms);
    l.ldp = la_amx_cols(static_cast<size_t>(width));
    l.ldr = la_amx_depth(l.C);
    l.amx_fac = take(3 * l.C);
    l.S_ts = RoundUp(la_amx_depth(l.K) / 2 * l.ldp, kPad);  // words = floats
    l.E_ts = RoundUp(la_amx_depth(l.C) / 2 * l.ldp, kPad);
    l.P_ts = RoundUp(la_amx_rows(l.C) * l.ldr, 2 * kPad);   // uint16
    l.Spk = take(terms * l.S_ts);
    l.Epk = take(terms * l.E_ts);
    if (job.traits().channel_gate()) {
      // KDA: the update reads v_new unscaled (its decays are in K^T), from Epk; no raw K^T.
      l.ldA = la_amx_depth(l.K);
      l.A_ts = RoundUp(std::max(la_amx_rows(l.C) * l.ldA, la_amx_rows(l.K) * l.ldr), 2 * kPad);
      l.Apk = take(terms * l.A_ts / 2);
      l.Ppk = take(terms * l.P_ts / 2);
    } else {
      l.E2pk = take(terms * l.E_ts);
      // P and K^T in bf16 go where GDN's AMX path leaves room: KDA's decayed K^T (KrT) and the f32
      // K^T (Kt, which the AMX update does not read), when they fit.
      const size_t ppk = terms * l.P_ts / 2, ktraw = la_amx_rows(l.K) * l.ldr / 2, free = l.K * l.ldc;
      l.Ppk = ppk <= free ? l.KrT : take(ppk);
      l.KtRaw = ktraw <= free ? l.Kt : take(ktraw);
    }
  }
  l.total = off;
  return l;
}

// A group of items sharing the sequence and the column block (consecutive value heads, normally):
// all run chunk c before any runs chunk c+1, each with its own state in the arena. The heads'
// rows of one token are adjacent in q, k, v and o, so the group reads and writes memory in runs
// the hardware prefetchers follow, instead of one isolated row per head and token.
//
// Per chunk the rows are loaded, then the stages of `program` run in the plan's order (one case
// of the switch below each; plan_exec.hpp lists the plan operators each stage runs).
void FusedGroup(const LaJob& job, const WorkItem* items, size_t count, float* arena, int chunk,
                const FusedProgram& program) {
  const WorkItem& first = items[0];
  const SeqSpan seq = job.seqs[static_cast<size_t>(first.seq)];
  const bool channel = job.traits().channel_gate();
  const FusedLayout l = MakeFusedLayout(job, first.col1 - first.col0, chunk, program);
  const size_t K = l.K, C = l.C, Vp = l.Vp, ldc = l.ldc, gk = l.gk;
  const size_t width = RoundUp(static_cast<size_t>(first.col1 - first.col0), kPad);  // GEMM N
  // count states of K x Vp after the shared buffers (twice as many without the in-place update:
  // state g lives at g or count + g, alternating per chunk).
  float* states = arena + l.total;
  const size_t state_floats = RoundUp(K * Vp, kPad);
  size_t parity = 0;  // which half holds the current states (always 0 in place)
  float* Kr = arena + l.KrQs;
  float* Qs = Kr + C * K;
  float* Kn = arena + l.KnQg;
  float* Qg = Kn + C * K;
  float* Kt = arena + l.Kt;
  float* AP = arena + l.AP;
  float* X = arena + l.XO;
  float* O = X + C * Vp;
  double* G = reinterpret_cast<double*>(arena + l.G);
  float* beta = arena + l.beta;
  float* egam = arena + l.egam;
  float* graw = arena + l.graw;

  for (size_t g = 0; g < count; ++g)
    LoadState(job, items[g].seq, items[g].head, items[g].col0, items[g].col1, states + g * state_floats, Vp);
  ChunkRows rows{Qs, Kr, X, Vp, G, beta, graw, /*v_times_beta=*/true};
  if (channel) rows.kda_factors = arena + l.eg;
  // bf16 grams: raw rows staged by LoadChunk; factors p_row (all `scale` without L2 norms), then
  // a_row = col = the keys' inverse norms (all 1 without).
  float* gram_scale = job.bf16_grams ? arena + l.gram_scale : nullptr;
  GramScale gram_sc{};
  if (job.bf16_grams) {
    gram_sc = {gram_scale + C, gram_scale, gram_scale + C};
    rows.qraw = reinterpret_cast<uint16_t*>(arena + l.raw);
    rows.kraw = rows.qraw + C * l.ldraw;
    rows.ldraw = l.ldraw;
    std::fill(gram_scale, gram_scale + C, job.scale);
    std::fill(gram_scale + C, gram_scale + 3 * C, 1.f);
    if (job.opt.qk_l2norm) {
      rows.qinv = gram_scale;
      rows.kinv = gram_scale + C;
    }
  }
  // AMX GEMMs: row factors of the raw rows (q: scale and 1/|q|, k: 1/|k|), a row of product
  // factors, and the packed operands (the state's packing serves both state products of a chunk).
  const int amx = job.amx_terms;
  const size_t w = static_cast<size_t>(first.col1 - first.col0);
  float* qfac = amx ? arena + l.amx_fac : nullptr;
  float* kfac = amx ? qfac + C : nullptr;
  float* pfac = amx ? kfac + C : nullptr;
  auto* Spk = amx ? reinterpret_cast<uint32_t*>(arena + l.Spk) : nullptr;
  auto* Epk = amx ? reinterpret_cast<uint32_t*>(arena + l.Epk) : nullptr;
  auto* E2pk = amx && !channel ? reinterpret_cast<uint32_t*>(arena + l.E2pk) : nullptr;
  auto* Ppk = amx ? reinterpret_cast<uint16_t*>(arena + l.Ppk) : nullptr;
  auto* KtRaw = amx && !channel ? reinterpret_cast<uint16_t*>(arena + l.KtRaw) : nullptr;
  auto* Apk = amx && channel ? reinterpret_cast<uint16_t*>(arena + l.Apk) : nullptr;
  rows.raw_only = amx && !channel && K <= 256;  // KDA reads the f32 rows (its operands are decayed)  // the AMX products read q and k only as the raw rows
  ChunkPrefetcher prefetch(program.prefetch_rate);
  // The AMX products hand out the prefetches once per strip, as the f32 GEMM tiles do.
  const AmxHook pf_hook{[](void* p) { static_cast<ChunkPrefetcher*>(p)->tile(); }, &prefetch};
  const TileShape tile = ProgramTile(program);
  OperatorClock clock;  // per-operator timers (operator_timers.hpp; empty unless compiled in)
  clock.skip();         // the states' loads are nobody's
  // GDN (GEMM-first): the X GEMM's row factors −β e^Γ, in egam's second half (the update's
  // e^{Γ_L−Γ_j} go there only after the X GEMM).
  float* gdn_x_scale = egam + C;
  for (int64_t t0 = 0; t0 < seq.len; t0 += chunk)
  for (size_t g = 0; g < count; ++g) {
    const WorkItem& item = items[g];
    const int64_t hv = item.head;
    float* S = states + (parity * count + g) * state_floats;
    const size_t L = static_cast<size_t>(std::min<int64_t>(chunk, seq.len - t0));
    const size_t Lp = RoundUp(L, kPad);
    // GDN value heads that read the same key head (HV > H) have the same q, k and grams before
    // the per-head beta and decays: the group's previous head left them in the arena.
    const bool keys_loaded = !channel && g > 0 && job.key_head(hv) == job.key_head(items[g - 1].head);
    const bool keys_reused_next = !channel && g + 1 < count && job.key_head(items[g + 1].head) == job.key_head(hv);
    rows.skip_qk = keys_loaded;
    LoadChunk(job, seq, hv, t0, L, item.col0, item.col1, rows);
    bool s_packed = false;  // AMX: S of this item and chunk is in Spk
    bool e_packed = false;  // AMX, KDA: this chunk's v_new is in Epk (the update reads it unscaled)
    if (amx && !channel && !keys_loaded)
      for (size_t i = 0; i < L; ++i) {
        qfac[i] = job.opt.qk_l2norm ? job.scale * rows.qinv[i] : job.scale;
        kfac[i] = job.opt.qk_l2norm ? rows.kinv[i] : 1.f;
      }
    auto pack_state = [&] {
      if (!s_packed) la_amx_pack_pairs(S, Vp, K, w, nullptr, amx, Spk, l.ldp, l.S_ts);
      s_packed = true;
    };
    clock.mark(Op::kLoad);
    // Prefetch what runs next: the group's next head on this chunk, or the first head on the next.
    if (g + 1 < count)
      prefetch.plan(job, seq, items[g + 1].head, t0, L, item.col0, item.col1);
    else if (t0 + chunk < seq.len)
      prefetch.plan(job, seq, items[0].head, t0 + chunk,
                    static_cast<size_t>(std::min<int64_t>(chunk, seq.len - t0 - chunk)), item.col0, item.col1);
    else
      prefetch.plan(job, seq, 0, 0, 0, 0, 0);
    for (const CpuStage stage : program.stages) switch (stage) {
      case CpuStage::Gate: {
        // #1 Gate: e^Γ per row (GDN) or per row and channel (KDA); scale the GEMM operands. KDA:
        // the per-token factors e^{g_t} first; e^{Γi} is exact at the 16-row anchors and the last
        // row (the state's decay) and a product of at most 15 factors in between.
        if (!channel) ExpRow(G, egam, L);  // one gate per row: the whole column at once (KDA: LoadChunk
                                           // left the per-token factors in l.eg)
        for (size_t i = 0; i < L; ++i) {
          if (channel && i % kKdaBlock != 0 && i + 1 != L)
            MulRows(egam + (i - 1) * K, arena + l.eg + i * K, egam + i * K, K);
          else if (channel)
            ExpRow(G + i * K, egam + i * K, K);
          if (channel) {
            MulRowsScaled(Kr + i * K, egam + i * K, -beta[i], Kn + i * K, K);
            MulRows(Qs + i * K, egam + i * K, Qg + i * K, K);
          } else if (program.gemm_first) {
            gdn_x_scale[i] = -beta[i] * egam[i];
          } else {
            ScaleTo(Kr + i * K, -beta[i] * egam[i], Kn + i * K, K);  // the W/U form needs Kn itself
          }
        }
        clock.mark(Op::kGate);
        break;
      }
      case CpuStage::StateK:
        // GEMM-first: X = diag(β)V − diag(β e^Γ) K S (LoadChunk left diag(β)V in X). GDN's gates are
        // one scalar per row: they scale the products as the tiles store them.
        if (amx && channel) {  // KDA: the decayed Kn = −β k ⊙ e^Γ in bf16 parts
          pack_state();
          la_amx_pack_rows(Kn, K, L, K, false, amx, Apk, l.ldA, l.A_ts);
          la_amx_decayed_state_read(Apk, l.ldA, l.A_ts, Spk, l.ldp, l.S_ts, amx, X, Vp, L, w, K, AmxStore::kAdd, pf_hook);
        } else if (amx) {  // the raw k rows on AMX; the row factors carry 1/|k|
          pack_state();
          for (size_t i = 0; i < L; ++i) pfac[i] = gdn_x_scale[i] * kfac[i];
          la_amx_state_read(rows.kraw, l.ldraw, L, Spk, l.ldp, l.S_ts, amx, X, Vp, w, K, AmxStore::kAdd, pfac, pf_hook);
        } else if (channel) Gemm<Acc::kAdd>(Kn, K, S, Vp, X, Vp, L, width, K, Tri::kNone, &prefetch, nullptr, tile);
        else Gemm<Acc::kAddRowScaled>(Kr, K, S, Vp, X, Vp, L, width, K, Tri::kNone, &prefetch, gdn_x_scale, tile);
        clock.mark(Op::kStateGemms);
        break;
      case CpuStage::StateQ:
        // O = diag(e^Γ) Q S. Kept apart from the X GEMM rather than one GEMM over the stacked
        // [Kn; Qg]: measured faster on AVX-512 (the stacked A operand, 2C x K, no longer stays in
        // L1 next to the S panel).
        if (amx && channel) {  // KDA: Qg = q ⊙ e^Γ (scaled) in bf16 parts
          pack_state();
          la_amx_pack_rows(Qg, K, L, K, false, amx, Apk, l.ldA, l.A_ts);
          la_amx_decayed_state_read(Apk, l.ldA, l.A_ts, Spk, l.ldp, l.S_ts, amx, O, Vp, L, w, K, AmxStore::kSet, pf_hook);
        } else if (amx) {
          pack_state();
          for (size_t i = 0; i < L; ++i) pfac[i] = egam[i] * qfac[i];
          la_amx_state_read(rows.qraw, l.ldraw, L, Spk, l.ldp, l.S_ts, amx, O, Vp, w, K, AmxStore::kSet, pfac, pf_hook);
        } else if (channel) Gemm<Acc::kSet>(Qg, K, S, Vp, O, Vp, L, width, K, Tri::kNone, &prefetch, nullptr, tile);
        else Gemm<Acc::kSetRowScaled>(Qs, K, S, Vp, O, Vp, L, width, K, Tri::kNone, &prefetch, egam, tile);
        clock.mark(Op::kStateGemms);
        break;
      case CpuStage::Grams:
        // #2 KKT and the intra-chunk Q K^T.
        if (keys_loaded) {
          std::copy(arena + l.AP_unmasked, arena + l.AP_unmasked + 2 * C * ldc, AP);
        } else if (channel) {
          KdaGram(Kr, Qs, G, L, K, C, ldc, arena + l.KQl, arena + l.KrT, graw, arena + l.eg, AP, &prefetch, tile);
        } else if (job.bf16_grams) {
          // The grams of the stored bf16 rows on AMX (gram_bf16.cpp); scale and the norms are
          // applied by MaskGram. Kt (f32) is still needed by the state update. K^T in bf16 pairs is
          // the transpose of the rows read as 32-bit words.
          if (!amx) Transpose(Kr, L, K, Kt, ldc);  // AMX: the update reads the bf16 K^T
          float* KtPairs = arena + l.KtPairs;
          TransposeInto(reinterpret_cast<const float*>(rows.kraw), L, l.ldraw / 2, KtPairs, ldc, ldc);
          gram_bf16_lower(rows.kraw, rows.qraw, l.ldraw, reinterpret_cast<const uint32_t*>(KtPairs), ldc, L, AP,
                          AP + C * ldc, ldc);
          for (size_t i = 0; i < L / 2; ++i) prefetch.tile();  // the share of the f32 grams' tiles
          if (job.opt.qk_l2norm)
            for (size_t i = 0; i < L; ++i) gram_scale[i] *= job.scale;  // p_row = scale / |q_i|
        } else {
          Transpose(Kr, L, K, Kt, ldc);
          Gemm<Acc::kSet>(Kr, K, Kt, ldc, AP, ldc, L, Lp, K, Tri::kLowerN, &prefetch, nullptr, tile);
          Gemm<Acc::kSet>(Qs, K, Kt, ldc, AP + C * ldc, ldc, L, Lp, K, Tri::kLowerN, &prefetch, nullptr, tile);
        }
        if (keys_reused_next && !keys_loaded) std::copy(AP, AP + 2 * C * ldc, arena + l.AP_unmasked);
        clock.mark(Op::kGrams);
        break;
      case CpuStage::Mask:
        MaskGram(!channel, G, beta, L, C, ldc, AP, graw, job.bf16_grams ? &gram_sc : nullptr);
        clock.mark(Op::kMask);
        break;
      case CpuStage::Solve:
        // #3 Solve (I + A) E = X: v_new, in place; W is never formed.
        SolveUnitLower(AP, ldc, X, Vp, L, width, tile);
        clock.mark(Op::kSolve);
        break;
      case CpuStage::Inverse: {
        // #3 as FLA orders it: T = (I + A)^-1.
        float* Tinv = arena + l.Tinv;
        for (size_t i = 0; i < L; ++i) {
          std::fill(Tinv + i * ldc, Tinv + i * ldc + Lp, 0.f);
          Tinv[i * ldc + i] = 1.f;
        }
        SolveUnitLower(AP, ldc, Tinv, ldc, L, Lp, tile);
        clock.mark(Op::kSolve);
        break;
      }
      case CpuStage::WU: {
        // #4 W = T diag(β e^Γ) K (here −W, from Kn), U = T diag(β) V (LoadChunk left diag(β)V in X).
        const float* Tinv = arena + l.Tinv;
        float* W = arena + l.W;
        float* U = arena + l.U;
        for (size_t i = 0; i < L; ++i) {
          std::copy(Kn + i * K, Kn + (i + 1) * K, W + i * l.ldw);  // staging for T Kn
          std::fill(W + i * l.ldw + K, W + (i + 1) * l.ldw, 0.f);
        }
        float* Wm = U;  // T Kn into U's storage first, then copied back into W
        Gemm<Acc::kSet>(Tinv, ldc, W, l.ldw, Wm, l.ldw, L, RoundUp(K, kPad), L, Tri::kLowerK, nullptr, nullptr, tile);
        for (size_t i = 0; i < L; ++i) std::copy(Wm + i * l.ldw, Wm + (i + 1) * l.ldw, W + i * l.ldw);
        Gemm<Acc::kSet>(Tinv, ldc, X, Vp, U, Vp, L, width, L, Tri::kLowerK, nullptr, nullptr, tile);
        for (size_t i = 0; i < L; ++i) std::copy(U + i * Vp, U + (i + 1) * Vp, X + i * Vp);
        clock.mark(Op::kSolve);
        break;
      }
      case CpuStage::StateW:
        // #5 read in the W/U form: v_new = U − W S, i.e. X = U + (−W) S.
        Gemm<Acc::kAdd>(arena + l.W, l.ldw, S, Vp, X, Vp, L, width, K, Tri::kNone, nullptr, nullptr, tile);
        clock.mark(Op::kStateGemms);
        break;
      case CpuStage::Output:
        // #6 Output: O += P E, then store.
        if (amx) {  // P and v_new as bf16 terms
          la_amx_pack_rows(AP + C * ldc, ldc, L, L, true, amx, Ppk, l.ldr, l.P_ts);
          la_amx_pack_pairs(X, Vp, L, w, nullptr, amx, Epk, l.ldp, l.E_ts);
          e_packed = true;
          la_amx_output(Ppk, l.ldr, l.P_ts, Epk, l.ldp, l.E_ts, amx, O, Vp, L, w, pf_hook);
        } else {
          Gemm<Acc::kAdd>(AP + C * ldc, ldc, X, Vp, O, Vp, L, width, L, Tri::kLowerK, &prefetch, nullptr, tile);
        }
        clock.mark(Op::kOutput);
        StoreOutputRows(job, seq, hv, t0, L, item.col0, item.col1, O, Vp);
        clock.mark(Op::kStore);
        break;
      case CpuStage::Update: {
        // #5 update: S <- e^{Γ_L} S + Σ_j (e^{Γ_L−Γ_j} k_j)^T E_j; the decay of S is applied by the
        // GEMM as it loads S (kScaleAdd with one factor per row of S).
        const double* GL = G + (L - 1) * gk;
        float* decay_rows = graw;  // K factors (graw holds max(K, C) floats)
        const float* E = X;        // v_new, or (GDN) v_new scaled by e^{Γ_L−Γ_j}
        if (channel) {
          // Kt[d][j] = k_j[d] e^{ΓL[d]−Γj[d]}: the columns before the last anchor nl come from the
          // gram's KrT (k_j e^{Γnl−Γj}) times e^{ΓL−Γnl}; the rest need exponentials of their own.
          const size_t nl = (L - 1) / kKdaBlock * kKdaBlock;
          // e^{ΓL−Γj} = Π_{t=j+1..L} e^{g_t} from j = L − 1 down (1 for the last row; at most 15
          // factors); the last product, e^{ΓL−Γnl}, carries the gram's older columns.
          const float* KrT = arena + l.KrT;
          const float* eg = arena + l.eg;
          float* staging = arena + l.KQl;  // 32 x K rows, free after the gram
          std::copy(Kr + (L - 1) * K, Kr + L * K, staging + (L - 1 - nl) * K);
          std::fill(graw, graw + K, 1.f);
          for (size_t j = L - 1; j-- > nl;) {
            MulInPlace(graw, eg + (j + 1) * K, K);
            MulRows(Kr + j * K, graw, staging + (j - nl) * K, K);
          }
          if (nl > 0)  // graw = e^{ΓL−Γnl} now; the gram left KrT[d][j] = k_j[d] e^{Γnl[d]−Γj[d]}
            for (size_t d = 0; d < K; ++d) ScaleTo(KrT + d * ldc, graw[d], Kt + d * ldc, nl);
          TransposeInto(staging, L - nl, K, Kt + nl, ldc, L - nl);
          std::copy(egam + (L - 1) * K, egam + L * K, decay_rows);
        } else {
          float* to_end = egam + C;  // GDN uses egam's first C floats only; e^{Γ_L−Γ_j} after them
          ExpDiffFrom(GL[0], G, to_end, L);
          if (amx) {  // the factors e^{Γ_L−Γ_j} / |k_j| go into the packed v_new; X is left as it is
            for (size_t j = 0; j < L; ++j) pfac[j] = to_end[j] * kfac[j];
          } else if (program.update_keeps_vnew) {  // a later stage still reads v_new: scale a copy
            float* Eg = arena + l.Eg;
            for (size_t j = 0; j < L; ++j) ScaleTo(X + j * Vp, to_end[j], Eg + j * Vp, width);
            E = Eg;
          } else {
            for (size_t j = 0; j < L; ++j) Scale(X + j * Vp, to_end[j], width);
          }
          std::fill(decay_rows, decay_rows + K, egam[L - 1]);
        }
        float* S_next = S;
        if (!program.state_in_place) {  // the next state in the other half, from a copy of this one
          S_next = states + ((1 - parity) * count + g) * state_floats;
          std::copy(S, S + K * Vp, S_next);
        }
        if (amx && channel) {  // S = diag(e^{Γ_L}) S + (K ⊙ e^{Γ_L−Γ_j})^T v_new, both in bf16 parts
          la_amx_pack_rows(Kt, ldc, K, L, false, amx, Apk, l.ldr, l.A_ts);
          if (!e_packed) la_amx_pack_pairs(X, Vp, L, w, nullptr, amx, Epk, l.ldp, l.E_ts);
          la_amx_decayed_state_update(Apk, l.ldr, l.A_ts, K, Epk, l.ldp, l.E_ts, amx, S_next, Vp, w, L, decay_rows,
                                      pf_hook);
        } else if (amx) {  // S = e^{Γ_L} S + (K^T)_raw (diag(e^{Γ_L−Γ_j} / |k_j|) v_new), K^T from the grams' pairs
          la_amx_unpair(reinterpret_cast<const uint32_t*>(arena + l.KtPairs), ldc, K, L, KtRaw, l.ldr);
          la_amx_pack_pairs(X, Vp, L, w, pfac, amx, E2pk, l.ldp, l.E_ts);
          la_amx_state_update(KtRaw, l.ldr, K, E2pk, l.ldp, l.E_ts, amx, S_next, Vp, w, L, decay_rows, pf_hook);
        } else {
          Gemm<Acc::kScaleAdd>(Kt, ldc, E, Vp, S_next, Vp, K, width, L, Tri::kNone, &prefetch, decay_rows, tile);
        }
        clock.mark(Op::kUpdate);
        break;
      }
    }
    if (!program.state_in_place && g + 1 == count) parity = 1 - parity;
    prefetch.rest();  // whatever the tiles did not issue
    clock.head_chunk_done();
  }
  for (size_t g = 0; g < count; ++g)
    StoreState(job, items[g].seq, items[g].head, items[g].col0, items[g].col1,
               states + (parity * count + g) * state_floats, Vp);
  if (amx) la_amx_release();
  hwy::FlushStream();  // order the streaming stores of o before the pool hands the results over
}

size_t FusedArenaFloats(const LaJob& job, int64_t width, int chunk, size_t group, const FusedProgram& program) {
  const FusedLayout l = MakeFusedLayout(job, width, chunk, program);
  return l.total + (program.state_in_place ? 1 : 2) * group * RoundUp(l.K * l.Vp, kPad);
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_FUSED_INL_H_
