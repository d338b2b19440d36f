// Plain F32 kernels of a Qwen3.5 layer (see qwen35_ops.hpp). Inner loops run over contiguous
// memory with no dependencies so the compiler vectorizes them.
#include "model/qwen35_ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "hanpu/tensor.hpp"
#include "model/qwen35_kernels.hpp"

namespace hanpu::model {

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  if (nt == 1) {
    fn(0, n);
    return;
  }
  ThreadPool::shared(threads).run(nt, [&](int t) {
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) fn(b, e);
  });
}

void rms_norm_rows(const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows, int64_t dim,
                   const float* scale, float eps, int threads) {
  parallel_for(rows, rows >= 16 ? threads : 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      simd_rms_norm_row(x + r * ldx, out + r * ldo, static_cast<size_t>(dim), scale, eps);
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
    std::vector<const float*> rows(static_cast<size_t>(K));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kBlock, n = std::min(kBlock, channels - c0);
      for (int64_t j = 0; j < K; ++j)  // taps transposed to [K][block] for unit-stride loops
        for (int64_t c = 0; c < n; ++c) wt[j * kBlock + c] = w[(c0 + c) * K + j];
      auto input = [&](int64_t t) -> const float* {  // row t of [state; x], t in [-S, T)
        return t < 0 ? state + (S + t) * channels + c0 : x + t * channels + c0;
      };
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < K; ++j) rows[static_cast<size_t>(j)] = input(t - S + j);
        simd_conv_silu_row(rows.data(), wt.data(), kBlock, static_cast<size_t>(K), y + t * channels + c0,
                           static_cast<size_t>(n));
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
      simd_gated_norm_row(o + i * dim, z + i * dim, w, static_cast<size_t>(dim), eps);
    }
  });
}

void silu_mul(float* gate, const float* up, int64_t rows, int64_t n, int64_t ld, int threads) {
  parallel_for(rows, rows >= 4 ? threads : 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      simd_silu_mul_row(gate + r * ld, up + r * ld, static_cast<size_t>(n));
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
  // Work items: (KV head, block of tokens); an item's rows are the block's tokens times the
  // group's query heads, all reading the same keys. About 32 rows per item: each key tile is
  // reused 32 times from L1, and the item's score rows (32 x keys floats, 256 KiB at 2K keys)
  // stay in L2. Later blocks see more keys, so items are dealt round-robin to even out threads.
  constexpr int64_t kRowsPerItem = 32;
  const int64_t tokens_per_item = std::max<int64_t>(1, kRowsPerItem / group);
  const int64_t blocks = (T + tokens_per_item - 1) / tokens_per_item;
  const int64_t items = nkv * blocks;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  const size_t tile = attention_key_tile();
  const size_t score_stride = static_cast<size_t>((p0 + T + static_cast<int64_t>(tile) - 1) / static_cast<int64_t>(tile)) * tile;
  const size_t side = std::max(score_stride, static_cast<size_t>(hd));
  auto work = [&](int tid) {
    const size_t max_rows = static_cast<size_t>(tokens_per_item * group);
    ByteBuffer scratch((max_rows * score_stride + static_cast<size_t>(hd) * tile + 2 * side) * sizeof(float));
    float* key_tile = reinterpret_cast<float*>(scratch.data());  // 64-byte aligned start
    float* scores = key_tile + static_cast<size_t>(hd) * tile;
    float* zero_row = scores + max_rows * score_stride;  // ByteBuffer is zero-initialised
    float* discard = zero_row + side;
    std::vector<const float*> qrows(max_rows);
    std::vector<float*> orows(max_rows);
    std::vector<size_t> limit(max_rows);
    for (int64_t item = tid; item < items; item += nt) {
      const int64_t g = item % nkv, b = item / nkv;
      const int64_t t0 = b * tokens_per_item, t1 = std::min(T, t0 + tokens_per_item);
      size_t rows = 0;
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = g * group; h < (g + 1) * group; ++h, ++rows) {
          qrows[rows] = q + (t * nq + h) * hd;
          orows[rows] = out + (t * nq + h) * hd;
          limit[rows] = static_cast<size_t>(p0 + t + 1);
        }
      AttentionRowsArgs args;
      args.q = qrows.data();
      args.out = orows.data();
      args.limit = limit.data();
      args.rows = rows;
      args.head_dim = static_cast<size_t>(hd);
      args.keys = keys + g * hd;
      args.values = values + g * hd;
      args.kv_stride = static_cast<size_t>(ld);
      args.scale = scale;
      args.scores = scores;
      args.score_stride = score_stride;
      args.key_tile = key_tile;
      args.zero_row = zero_row;
      args.discard_row = discard;
      attention_rows(args);
    }
  };
  if (nt == 1) work(0);
  else ThreadPool::shared(threads).run(nt, work);
}

}  // namespace hanpu::model
