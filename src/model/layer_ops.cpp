// F32 kernels between the projections of every block (see layer_ops.hpp): work split over threads and the data
// layouts here, the per-row SIMD work in layer_kernels.cpp.
#include "model/layer_ops.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "hanpu/tensor.hpp"
#include "model/layer_kernels.hpp"

namespace hanpu::model {

void parallel_for(int64_t n, Threads threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads.n, n)));
  if (nt == 1) {
    fn(0, n);
    return;
  }
  threads.run(nt, [&](int t, Workspace&) {
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) fn(b, e);
  });
}

void rms_norm_rows(const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows, int64_t dim,
                   const float* scale, float eps, Threads threads) {
  parallel_for(rows, threads.when(rows >= 16), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      simd_rms_norm_row(x + r * ldx, out + r * ldo, static_cast<size_t>(dim), scale, eps);
    }
  });
}

// Channels per slice when few tokens split the conv by channels: a multiple of every target's
// f32 vector (64 = a 2048-bit SVE vector), so each slice's vector loop and scalar tail cover the
// channels the whole row's would, and the results do not depend on the split.
constexpr int64_t kConvChannelSlice = 64;

void causal_conv_silu(const float* x, int64_t ldx, float* y, int64_t T, int64_t channels, const float* taps,
                      int64_t K, float* state, Threads threads) {
  const int64_t S = K - 1;
  const int64_t kept = std::max<int64_t>(0, S - T);
  // Tokens t0..t1 over channels [c0, c1), then the new state's columns [c0, c1): the last S rows of
  // [state; x]. With T < S the state's own last S - T rows move to its front (memmove: they overlap)
  // and the T new rows follow; no scratch copy of the state. A range's state columns are written
  // only after every token of the call has read them, so each caller below does it once, last.
  auto conv_rows = [&](int64_t t0, int64_t t1, int64_t c0, int64_t c1, std::vector<const float*>& rows) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        const int64_t r = t - S + j;  // row r of [state; x], r in [-S, T)
        rows[static_cast<size_t>(j)] = (r < 0 ? state + (S + r) * channels : x + r * ldx) + c0;
      }
      simd_conv_silu_row(rows.data(), taps + c0, static_cast<size_t>(channels), static_cast<size_t>(K),
                         y + t * channels + c0, static_cast<size_t>(c1 - c0));
    }
  };
  auto new_state = [&](int64_t c0, int64_t c1) {
    const size_t bytes = static_cast<size_t>(c1 - c0) * sizeof(float);
    for (int64_t r = 0; r < kept; ++r) std::memmove(state + r * channels + c0, state + (r + S - kept) * channels + c0, bytes);
    for (int64_t r = kept; r < S; ++r) std::memcpy(state + r * channels + c0, x + (T - S + r) * ldx + c0, bytes);
  };
  if (T < 8 && threads.n > 1 && channels >= 2 * kConvChannelSlice) {
    // Few tokens (decode): the channels split over the threads, each slice's state columns
    // updated by the thread that read them. One thread took 21 us per Qwen3.5-0.8B layer (6144
    // channels, K = 4), 1.5% of a Q4_K_M token on the AVX-512 Xeon, the other thread waiting.
    const int64_t slices = (channels + kConvChannelSlice - 1) / kConvChannelSlice;
    parallel_for(slices, threads, [&](int64_t s0, int64_t s1) {
      std::vector<const float*> rows(static_cast<size_t>(K));
      const int64_t c0 = s0 * kConvChannelSlice, c1 = std::min(channels, s1 * kConvChannelSlice);
      conv_rows(0, T, c0, c1, rows);
      new_state(c0, c1);
    });
    return;
  }
  // Threads take ranges of tokens and walk each token's row front to back: rows are contiguous
  // (a channel-blocked walk down the tokens would jump a whole row per step, a TLB miss each).
  parallel_for(T, threads.when(T >= 8), [&](int64_t t0, int64_t t1) {
    std::vector<const float*> rows(static_cast<size_t>(K));
    conv_rows(t0, t1, 0, channels, rows);
  });
  new_state(0, channels);
}

void gated_rms_norm(float* o, const float* z, int64_t ldz, int64_t rows, int64_t heads, int64_t dim, const float* w,
                    float eps, Threads threads) {
  const int64_t n = rows * heads;
  parallel_for(n, threads.when(n >= 64), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      simd_gated_norm_row(o + i * dim, z + (i / heads) * ldz + (i % heads) * dim, w, static_cast<size_t>(dim), eps);
    }
  });
}

void silu_mul(float* gate, const float* up, int64_t rows, int64_t n, int64_t ld, Threads threads) {
  parallel_for(rows, threads.when(rows >= 4), [&](int64_t r0, int64_t r1) {
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

namespace {

// Few new tokens (decode, or a tiny chunk): attention over the cache in its own row layout,
// the keys cut into splits of kSplitKeys that threads take independently and that are merged by
// their softmax maxima (as flash-decoding does). The tiled kernel below re-lays out all p0 + T
// cached keys and values on every call: for one token that relayout moves twice the bytes the
// attention itself reads, so decode cost grew with the context for nothing.
// At most 256 keys per split: the split's scores (rows x 256 floats) stay in L1. The work items
// are (split, KV head) in split-major order, so each thread reads its own range of cache rows;
// head-major items had each thread read one head, and with Qwen3.5's 2 KV heads (one cache row
// holds both heads' keys in 2 KiB) the threads read alternate KiBs of the same pages. One token
// over 8K keys, Xeon model 207, 2 threads, medians of three interleaved runs (docs/PERFORMANCE.md):
// 16 q / 4 KV heads 6.6 -> 5.3 ms, Kimi's MLA 23.4 -> 19.0 ms, Qwen3.5-0.8B's 2.66 -> 2.65 ms (no
// change). The number of splits is rounded up to a multiple of the threads so that they get
// equal ranges.
constexpr int64_t kSplitKeys = 256;

void attention_over_cache(const float* q, const float* keys, const float* values, float* out, int64_t T, int64_t p0,
                          int64_t nq, int64_t nkv, int64_t hd, int64_t dv, int64_t value_stride, float scale,
                          Threads threads) {
  const int64_t group = nq / nkv, rows = T * group, nkeys = p0 + T;
  const int64_t nt = std::max(1, threads.n);
  int64_t splits = (nkeys + kSplitKeys - 1) / kSplitKeys;
  splits = std::min(nkeys, (splits + nt - 1) / nt * nt);
  const int64_t split_keys = (nkeys + splits - 1) / splits;
  splits = (nkeys + split_keys - 1) / split_keys;
  const int64_t items = nkv * splits;
  const size_t udv = static_cast<size_t>(dv), urows = static_cast<size_t>(rows);
  // Per item (split-major: item sp * nkv + g): max and sum per row, then the rows' unnormalised
  // outputs.
  std::vector<float> partial(static_cast<size_t>(items) * urows * (2 + udv));
  const auto item_partial = [&](int64_t sp, int64_t g) {
    return partial.data() + static_cast<size_t>(sp * nkv + g) * urows * (2 + udv);
  };
  parallel_for(items, threads, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(urows * static_cast<size_t>(split_keys));
    std::vector<const float*> qrows(urows);
    std::vector<size_t> limit(urows);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t sp = item / nkv, g = item % nkv;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < group; ++h) {
          qrows[static_cast<size_t>(t * group + h)] = q + (t * nq + g * group + h) * hd;
          limit[static_cast<size_t>(t * group + h)] = static_cast<size_t>(p0 + t + 1);
        }
      float* base = item_partial(sp, g);
      AttentionSplitArgs a;
      a.q = qrows.data();
      a.limit = limit.data();
      a.rows = urows;
      a.head_dim = static_cast<size_t>(hd);
      a.value_dim = udv;
      a.keys = keys + g * hd;
      a.values = values + g * dv;
      a.key_stride = static_cast<size_t>(nkv * hd);
      a.value_stride = static_cast<size_t>(value_stride);
      a.key_begin = static_cast<size_t>(sp * split_keys);
      a.key_end = static_cast<size_t>(std::min(nkeys, (sp + 1) * split_keys));
      a.scale = scale;
      a.scores = scores.data();
      a.max = base;
      a.sum = base + urows;
      a.acc = base + 2 * urows;
      attention_split(a);
    }
  });
  // Merge the splits of each row: out = sum_s e^{max_s - M} acc_s / sum_s e^{max_s - M} sum_s.
  for (int64_t g = 0; g < nkv; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r / group, h = g * group + r % group;
      float* o = out + (t * nq + h) * dv;
      float m = -INFINITY;
      for (int64_t sp = 0; sp < splits; ++sp)
        m = std::max(m, item_partial(sp, g)[r]);
      double l = 0;
      std::fill(o, o + dv, 0.0f);
      for (int64_t sp = 0; sp < splits; ++sp) {
        const float* base = item_partial(sp, g);
        if (base[r] == -INFINITY) continue;  // no visible key in this split
        const float w = std::exp(base[r] - m);
        l += static_cast<double>(w) * base[urows + static_cast<size_t>(r)];
        const float* acc = base + 2 * urows + static_cast<size_t>(r) * udv;
        for (int64_t i = 0; i < dv; ++i) o[i] += w * acc[i];
      }
      const float inv = static_cast<float>(1.0 / l);
      for (int64_t i = 0; i < dv; ++i) o[i] *= inv;
    }
}

}  // namespace

void causal_attention(const float* q, const float* keys, const float* values, float* out, int64_t T, int64_t p0,
                      int64_t nq, int64_t nkv, int64_t hd, float scale, Threads threads) {
  causal_attention(q, keys, values, out, T, p0, nq, nkv, hd, hd, nkv * hd, scale, threads);
}

void causal_attention(const float* q, const float* keys, const float* values, float* out, int64_t T, int64_t p0,
                      int64_t nq, int64_t nkv, int64_t hd, int64_t dv, int64_t value_stride, float scale,
                      Threads threads) {
  // Up to this many new tokens take the cache as it is (attention_over_cache); more amortise the
  // relayout of the tiled kernel, whose 8-row register blocks and 32-row items reuse every key
  // tile across the tokens (prefill).
  constexpr int64_t kCacheLayoutMaxTokens = 4;
  if (T <= kCacheLayoutMaxTokens) {
    attention_over_cache(q, keys, values, out, T, p0, nq, nkv, hd, dv, value_stride, scale, threads);
    return;
  }
  const int64_t group = nq / nkv;
  const int64_t ld = nkv * hd;  // key row stride
  // Work items: (KV head, block of tokens); an item's rows are the block's tokens times the
  // group's query heads, all reading the same keys. Four register blocks of rows per item (24
  // rows on AVX2, 32 with 32 registers): each key tile is reused that often from L1, and the
  // item's score rows (32 x keys floats, 256 KiB at 2K keys) stay in L2. A whole number of blocks
  // leaves no block half empty (32 rows in 6-row blocks ran 36 row slots). Items go head by head,
  // so the threads work on the same head's relaid keys and values at once, which stay in L2/L3
  // (block by block, every item of a block read another head's: with MLA's 32 heads of 192 + 128
  // dims, 84 MB at 2K keys, more than L3). Within a head the latest block (the most keys) comes
  // first and threads take the next item from a shared counter, so the causal triangle's uneven
  // items even out (a fixed round-robin gave one thread every odd block: ~3% slower at 512).
  // Each item's outputs depend on its own rows only: any thread may compute it.
  const int64_t kRowsPerItem = 4 * static_cast<int64_t>(attention_row_block());
  const int64_t tokens_per_item = std::max<int64_t>(1, kRowsPerItem / group);
  const int64_t blocks = (T + tokens_per_item - 1) / tokens_per_item;
  const int64_t items = nkv * blocks;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads.n, items)));
  const size_t tile = attention_key_tile();
  const size_t score_stride = static_cast<size_t>((p0 + T + static_cast<int64_t>(tile) - 1) / static_cast<int64_t>(tile)) * tile;
  const size_t side = std::max({score_stride, static_cast<size_t>(hd), static_cast<size_t>(dv)});
  // Keys in transposed tiles and values in blocks of `tile` dims, once per call (layouts in
  // AttentionRowsArgs): the kernel's loops then read memory sequentially.
  const size_t nkeys = static_cast<size_t>(p0 + T), W = tile, uhd = static_cast<size_t>(hd), udv = static_cast<size_t>(dv);
  const bool blocked_values = udv % W == 0;
  // In the caller's workspace of the engine, held for the call (the parts get pointers).
  WorkspaceLease caller(*threads.engine, 1);
  const size_t keys_t_floats = static_cast<size_t>(nkv) * uhd * score_stride;
  float* const keys_t = caller[0].get<float>(kAttentionKeys, keys_t_floats);
  std::fill(keys_t, keys_t + keys_t_floats, 0.0f);
  float* const values_b =
      blocked_values ? caller[0].get<float>(kAttentionValues, static_cast<size_t>(nkv) * udv * nkeys) : nullptr;
  const size_t tiles = score_stride / W;
  parallel_for(nkv * static_cast<int64_t>(tiles), threads, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const size_t g = static_cast<size_t>(w) / tiles, tl = static_cast<size_t>(w) % tiles;
      float* dst = keys_t + g * uhd * score_stride + tl * uhd * W;
      for (size_t jj = 0; jj < W && tl * W + jj < nkeys; ++jj) {
        const float* src = keys + (tl * W + jj) * static_cast<size_t>(ld) + g * uhd;
        for (size_t i = 0; i < uhd; ++i) dst[i * W + jj] = src[i];
      }
      if (!blocked_values) continue;
      for (size_t jj = 0; jj < W && tl * W + jj < nkeys; ++jj) {
        const size_t j = tl * W + jj;
        const float* src = values + j * static_cast<size_t>(value_stride) + g * udv;
        for (size_t b = 0; b < udv / W; ++b)
          std::copy(src + b * W, src + (b + 1) * W, values_b + g * udv * nkeys + b * nkeys * W + j * W);
      }
    }
  });
  std::atomic<int64_t> next_item{0};
  auto work = [&](int, Workspace&) {
    const size_t max_rows = static_cast<size_t>(tokens_per_item * group);
    ByteBuffer scratch((max_rows * score_stride + 2 * side) * sizeof(float));
    float* scores = reinterpret_cast<float*>(scratch.data());
    float* zero_row = scores + max_rows * score_stride;  // ByteBuffer is zero-initialised
    float* discard = zero_row + side;
    std::vector<const float*> qrows(max_rows);
    std::vector<float*> orows(max_rows);
    std::vector<size_t> limit(max_rows);
    for (int64_t item; (item = next_item.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const int64_t g = item / blocks, b = blocks - 1 - item % blocks;
      const int64_t t0 = b * tokens_per_item, t1 = std::min(T, t0 + tokens_per_item);
      size_t rows = 0;
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = g * group; h < (g + 1) * group; ++h, ++rows) {
          qrows[rows] = q + (t * nq + h) * hd;
          orows[rows] = out + (t * nq + h) * dv;
          limit[rows] = static_cast<size_t>(p0 + t + 1);
        }
      AttentionRowsArgs args;
      args.q = qrows.data();
      args.out = orows.data();
      args.limit = limit.data();
      args.rows = rows;
      args.head_dim = uhd;
      args.value_dim = udv;
      args.keys_t = keys_t + static_cast<size_t>(g) * uhd * score_stride;
      args.values_blocked = blocked_values ? values_b + static_cast<size_t>(g) * udv * nkeys : nullptr;
      args.values_block_stride = nkeys * W;
      args.values = values + g * dv;
      args.value_stride = static_cast<size_t>(value_stride);
      args.scale = scale;
      args.scores = scores;
      args.score_stride = score_stride;
      args.zero_row = zero_row;
      args.discard_row = discard;
      attention_rows(args);
    }
  };
  threads.run(nt, work);
}

}  // namespace hanpu::model
