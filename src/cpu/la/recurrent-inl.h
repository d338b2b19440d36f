// The recurrent path (decode): one token at a time per work item (RecurrentItem).
// Included once per SIMD target by cpu/la_kernels.cpp (hwy/foreach_target.h): Highway's toggling guard.
#if defined(HANPU_CPU_LA_RECURRENT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HANPU_CPU_LA_RECURRENT_INL_H_
#undef HANPU_CPU_LA_RECURRENT_INL_H_
#else
#define HANPU_CPU_LA_RECURRENT_INL_H_
#endif

#include <cmath>
#include <vector>

#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include "cpu/kernels.hpp"
#include "cpu/la/base-inl.h"
#include "cpu/la/rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hanpu::cpu {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------------------------
// Recurrent form / decode: per token, S' = decay S; e = β (v − k S'); S = S' + k^T e; o = q S.

size_t RecurrentArenaFloats(const LaJob& job, int64_t width) {
  const size_t K = static_cast<size_t>(job.shape.K), Vp = RoundUp(static_cast<size_t>(width), kPad);
  return K * Vp + 2 * RoundUp(K, kPad) + 3 * Vp + 2 * RoundUp(K, kPad) + 4 * kPad;
}

// The item's state block, updated where it lives when the job reads and writes one fp32 state
// tensor (decode: initial_state and final_state are the same view) with unit column stride and a
// width of whole vectors. Then no copy goes in or out: the copies were two of the four passes over
// each head's K x V block per token (docs/MODEL.md, decode per part). Otherwise (prefill's
// recurrent path, other dtypes or strides, ragged column splits) the block is copied into the
// arena, padded to kPad columns.
struct StateBlock {
  float* rows;    // row d at rows + d * ld
  size_t ld;      // floats between rows
  size_t cols;    // columns every pass covers: a multiple of the vector length
  bool in_place;
};

StateBlock StateBlockFor(const LaJob& job, const WorkItem& item, float* arena, size_t lanes) {
  const TensorView& h0 = job.in.initial_state;
  const TensorView& ht = job.out.final_state;
  const size_t width = static_cast<size_t>(item.col1 - item.col0);
  const bool same = !h0.empty() && h0.data == ht.data && h0.dtype == DType::F32 && ht.dtype == DType::F32 &&
                    h0.stride == ht.stride && h0.stride[3] == 1 && width % lanes == 0;
  if (same) {
    float* base = static_cast<float*>(h0.data) + item.seq * h0.stride[0] + item.head * h0.stride[1] + item.col0;
    return {base, static_cast<size_t>(h0.stride[2]), width, true};
  }
  const size_t Vp = RoundUp(width, kPad);
  LoadState(job, item.seq, item.head, item.col0, item.col1, arena, Vp);
  return {arena, Vp, Vp, false};
}

void RecurrentItem(const LaJob& job, const WorkItem& item, float* arena) {
  const SeqSpan seq = job.seqs[static_cast<size_t>(item.seq)];
  const int64_t hv = item.head;
  const bool channel = job.traits().channel_gate();
  const size_t K = static_cast<size_t>(job.shape.K);
  const size_t width = static_cast<size_t>(item.col1 - item.col0);
  const size_t Vp = RoundUp(width, kPad), Kp = RoundUp(K, kPad);
  const DF d;
  const size_t N = hn::Lanes(d);
  const StateBlock S = StateBlockFor(job, item, arena, N);
  float* q = arena + K * Vp;
  float* k = q + Kp;
  float* v = k + Kp;
  float* kS = v + Vp;
  float* o = kS + Vp;
  float* decay = o + Vp;
  float* graw = decay + Kp;
  double G1[1];
  const ChunkRows rows{q, k, v, Vp, nullptr, nullptr, graw};
  std::vector<double> Gk(channel ? K : 1);
  for (int64_t t = 0; t < seq.len; ++t) {
    float beta = 0.f;
    ChunkRows r = rows;
    r.G = channel ? Gk.data() : G1;
    r.beta = &beta;
    LoadChunk(job, seq, hv, t, 1, item.col0, item.col1, r);
    const size_t gk = channel ? K : 1;
    for (size_t i = 0; i < gk; ++i) decay[i] = std::exp(static_cast<float>(r.G[i]));
    // Pass 1 (reads S only): kS = k (decay S). The decayed rows are not stored: pass 2 forms the
    // same products again, so the values are those of storing S' = decay S first, with one write
    // pass fewer.
    for (size_t j = 0; j < S.cols; j += N) hn::StoreU(hn::Zero(d), d, kS + j);
    for (size_t dd = 0; dd < K; ++dd) {
      const float* row = S.rows + dd * S.ld;
      const VF vdec = hn::Set(d, channel ? decay[dd] : decay[0]), vk = hn::Set(d, k[dd]);
      for (size_t j = 0; j < S.cols; j += N)
        hn::StoreU(hn::MulAdd(vk, hn::Mul(hn::LoadU(d, row + j), vdec), hn::LoadU(d, kS + j)), d, kS + j);
    }
    // e = β (v − kS), kept in kS.
    const VF vb = hn::Set(d, beta);
    for (size_t j = 0; j < S.cols; j += N)
      hn::StoreU(hn::Mul(vb, hn::Sub(hn::LoadU(d, v + j), hn::LoadU(d, kS + j))), d, kS + j);
    // Pass 2: S = decay S + k^T e and o = q S together.
    for (size_t j = 0; j < S.cols; j += N) hn::StoreU(hn::Zero(d), d, o + j);
    for (size_t dd = 0; dd < K; ++dd) {
      float* row = S.rows + dd * S.ld;
      const VF vdec = hn::Set(d, channel ? decay[dd] : decay[0]);
      const VF vk = hn::Set(d, k[dd]), vq = hn::Set(d, q[dd]);
      for (size_t j = 0; j < S.cols; j += N) {
        const VF s = hn::MulAdd(vk, hn::LoadU(d, kS + j), hn::Mul(hn::LoadU(d, row + j), vdec));
        hn::StoreU(s, d, row + j);
        hn::StoreU(hn::MulAdd(vq, s, hn::LoadU(d, o + j)), d, o + j);
      }
    }
    StoreOutputRows(job, seq, hv, t, 1, item.col0, item.col1, o, Vp);
  }
  if (!S.in_place) StoreState(job, item.seq, hv, item.col0, item.col1, S.rows, S.ld);
  hwy::FlushStream();
}

}  // namespace HWY_NAMESPACE
}  // namespace hanpu::cpu
HWY_AFTER_NAMESPACE();

#endif  // HANPU_CPU_LA_RECURRENT_INL_H_
