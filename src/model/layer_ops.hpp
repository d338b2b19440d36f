// The element-wise and small kernels of a decoder layer (every family) besides the projections and the LA
// engine: RMSNorms, the causal depthwise conv, the gated RMSNorm, SwiGLU, RoPE and causal GQA
// attention over the KV cache. All in F32, each one work-split over the given engine's threads.
#pragma once

#include <cstdint>
#include <functional>

#include "hanpu/engine_work.hpp"

namespace hanpu::model {

/// A call's engine and how many parts to split into (hanpu/engine_work.hpp).
using Threads = EngineThreads;

/// Runs fn(begin, end) over [0, n) split into at most `threads.n` contiguous ranges on the engine's pool.
void parallel_for(int64_t n, Threads threads, const std::function<void(int64_t, int64_t)>& fn);

/// out[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * scale[:], for rows r in [0, rows).
/// `scale` is the norm's full multiplier (1 + w for Qwen3.5's zero-centred norms).
void rms_norm_rows(const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows, int64_t dim,
                   const float* scale, float eps, Threads threads);

/// Causal depthwise conv of width K over time with SiLU, continuing from `state`:
/// y[t,c] = silu(sum_j taps[j,c] * in[t-(K-1)+j, c]) where in[-i] is state[K-1-i] (oldest first).
/// x: [T, channels] rows ldx floats apart (the first columns of a stacked projection's output);
/// y: [T, channels] row-major; taps: [K, channels] (the checkpoint's [channels, 1, K]
/// transposed); state: [K-1, channels], updated to the last K-1 inputs.
void causal_conv_silu(const float* x, int64_t ldx, float* y, int64_t T, int64_t channels, const float* taps,
                      int64_t K, float* state, Threads threads);

/// o[r, h, :] = rmsnorm(o[r, h, :]) * w[:] * silu(z[r, h, :]) in place, over rows x heads of dim;
/// o is row-major [rows, heads, dim], z's rows are ldz floats apart.
void gated_rms_norm(float* o, const float* z, int64_t ldz, int64_t rows, int64_t heads, int64_t dim, const float* w,
                    float eps, Threads threads);

/// gate[r, :] = silu(gate[r, :]) * up[r, :], rows x n, both with row stride ld.
void silu_mul(float* gate, const float* up, int64_t rows, int64_t n, int64_t ld, Threads threads);

/// Rotate-half RoPE on the first `rot` dims of a head vector: pairs (i, i + rot/2) by angle
/// pos * inv_freq[i].
void rope_rotate(float* head, int64_t rot, const float* cos_row, const float* sin_row);

/// Causal grouped-query attention for T new queries at positions p0..p0+T-1 over a cache of
/// p0+T keys/values: out[t, h, :] = softmax(q[t,h] . K[0..p0+t, h/group] * scale) V[...].
/// q: [T, nq, hd]; keys/values: [p0+T, nkv, hd]; out: [T, nq, hd].
void causal_attention(const float* q, const float* keys, const float* values, float* out, int64_t T, int64_t p0,
                      int64_t nq, int64_t nkv, int64_t hd, float scale, Threads threads);
/// The same with values of their own width and row stride (MLA: keys of nope + rope dims, values
/// of v dims; or the latent cache, whose first r dims are the values): keys [p0+T, nkv, hd];
/// value j of KV head g at values + j * value_stride + g * dv; out: [T, nq, dv].
void causal_attention(const float* q, const float* keys, const float* values, float* out, int64_t T, int64_t p0,
                      int64_t nq, int64_t nkv, int64_t hd, int64_t dv, int64_t value_stride, float scale,
                      Threads threads);

}  // namespace hanpu::model
