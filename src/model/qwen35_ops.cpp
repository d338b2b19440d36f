// Plain F32 kernels of a Qwen3.5 layer (see qwen35_ops.hpp). Inner loops run over contiguous
// memory with no dependencies so the compiler vectorizes them.
#include "model/qwen35_ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/thread_pool.hpp"

namespace hanpu::model {

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  if (nt == 1) {
    fn(0, n);
    return;
  }
  ThreadPool::shared(nt).run(nt, [&](int t) {
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) fn(b, e);
  });
}

namespace {

inline float silu(float x) { return x / (1.f + std::exp(-x)); }

inline float inv_rms(const float* x, int64_t n, float eps) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
}

}  // namespace

void rms_norm_rows(const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows, int64_t dim,
                   const float* scale, float eps, int threads) {
  parallel_for(rows, rows >= 16 ? threads : 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * ldx;
      float* o = out + r * ldo;
      const float s = inv_rms(xr, dim, eps);
      for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * s * scale[i];
    }
  });
}

void causal_conv_silu(const float* x, float* y, int64_t T, int64_t channels, const float* w, int64_t K,
                      float* state, int threads) {
  const int64_t S = K - 1;
  // Channel blocks of 256 floats (1 KiB per row): large enough for long vector loops, small
  // enough that the K rows of the window stay in L1 while the block walks down the tokens.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (channels + kBlock - 1) / kBlock;
  parallel_for(blocks, T >= 8 ? threads : 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> wt(static_cast<size_t>(K * kBlock));
    std::vector<float> tail(static_cast<size_t>(S * kBlock));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kBlock, n = std::min(kBlock, channels - c0);
      for (int64_t j = 0; j < K; ++j)  // taps transposed to [K][block] for unit-stride loops
        for (int64_t c = 0; c < n; ++c) wt[j * kBlock + c] = w[(c0 + c) * K + j];
      auto input = [&](int64_t t) -> const float* {  // row t of [state; x], t in [-S, T)
        return t < 0 ? state + (S + t) * channels + c0 : x + t * channels + c0;
      };
      for (int64_t t = 0; t < T; ++t) {
        float* yr = y + t * channels + c0;
        for (int64_t c = 0; c < n; ++c) yr[c] = 0.f;
        for (int64_t j = 0; j < K; ++j) {
          const float* in = input(t - S + j);
          const float* wj = wt.data() + j * kBlock;
          for (int64_t c = 0; c < n; ++c) yr[c] += wj[c] * in[c];
        }
        for (int64_t c = 0; c < n; ++c) yr[c] = silu(yr[c]);
      }
      // New state: the last S rows of [state; x] (copied out first, the regions may overlap).
      for (int64_t r = 0; r < S; ++r) {
        const float* src = input(T - S + r);
        std::copy(src, src + n, tail.data() + r * kBlock);
      }
      for (int64_t r = 0; r < S; ++r) std::copy(tail.data() + r * kBlock, tail.data() + r * kBlock + n, state + r * channels + c0);
    }
  });
}

void gated_rms_norm(float* o, const float* z, int64_t rows, int64_t heads, int64_t dim, const float* w, float eps,
                    int threads) {
  const int64_t n = rows * heads;
  parallel_for(n, n >= 64 ? threads : 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* x = o + i * dim;
      const float* g = z + i * dim;
      const float s = inv_rms(x, dim, eps);
      for (int64_t d = 0; d < dim; ++d) x[d] = (x[d] * s * w[d]) * silu(g[d]);
    }
  });
}

void silu_mul(float* gate, const float* up, int64_t rows, int64_t n, int64_t ld, int threads) {
  parallel_for(rows, rows >= 4 ? threads : 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* g = gate + r * ld;
      const float* u = up + r * ld;
      for (int64_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
    }
  });
}

void rope_rotate(float* head, int64_t rot, const float* cos_row, const float* sin_row) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = head[i], b = head[i + half];
    head[i] = a * cos_row[i] - b * sin_row[i];
    head[i + half] = b * cos_row[i] + a * sin_row[i];
  }
}

void causal_attention(const float* q, const float* keys, const float* values, float* out, int64_t T, int64_t p0,
                      int64_t nq, int64_t nkv, int64_t hd, float scale, int threads) {
  const int64_t group = nq / nkv;
  const int64_t ld = nkv * hd;  // cache row stride
  // Work items: (query head, block of queries). Blocks of 16 queries reuse each key row 16 times
  // from L1 (16 score rows of up to p0+T floats); causal blocks near the end cost more, so items
  // are dealt round-robin to even out the threads.
  constexpr int64_t kQueryBlock = 16;
  const int64_t qblocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int64_t items = nq * qblocks;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  auto work = [&](int tid) {
    std::vector<float> scores(static_cast<size_t>(kQueryBlock * (p0 + T)));
    std::vector<float> acc(static_cast<size_t>(hd));
    for (int64_t item = tid; item < items; item += nt) {
      const int64_t h = item % nq, qb = item / nq;
      const int64_t kvh = h / group;
      const int64_t t0 = qb * kQueryBlock, t1 = std::min(T, t0 + kQueryBlock);
      const int64_t nkeys = p0 + t1;  // keys visible to the block's last query
      for (int64_t t = t0; t < t1; ++t) {
        const float* qr = q + (t * nq + h) * hd;
        float* sr = scores.data() + (t - t0) * (p0 + T);
        const int64_t visible = p0 + t + 1;
        float mx = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          const float* kr = keys + j * ld + kvh * hd;
          float d = 0;
          for (int64_t i = 0; i < hd; ++i) d += qr[i] * kr[i];
          sr[j] = d * scale;
          mx = std::max(mx, sr[j]);
        }
        float sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += (sr[j] = std::exp(sr[j] - mx));
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < visible; ++j) sr[j] *= inv;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = 0; j < visible; ++j) {
          const float* vr = values + j * ld + kvh * hd;
          const float p = sr[j];
          for (int64_t i = 0; i < hd; ++i) acc[i] += p * vr[i];
        }
        std::copy(acc.begin(), acc.end(), out + (t * nq + h) * hd);
      }
      (void)nkeys;
    }
  };
  if (nt == 1) work(0);
  else ThreadPool::shared(nt).run(nt, work);
}

}  // namespace hanpu::model
