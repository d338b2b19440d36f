// The full-attention token mixers: gated GQA attention and multi-head latent attention (blocks.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/blocks.hpp"
#include "model/layer_kernels.hpp"
#include "model/layer_ops.hpp"

namespace hanpu::model {

// ---- Gated GQA attention -----------------------------------------------------------------------

void GatedAttention::load(const ModelConfig& c, const WeightReader& w, const std::string& a) {
  const int64_t H = c.hidden_size;
  qkv_proj = w.stacked({{a + "q_proj.weight", c.attention.num_heads * c.attention.head_dim * 2},
                        {a + "k_proj.weight", c.attention.num_kv_heads * c.attention.head_dim},
                        {a + "v_proj.weight", c.attention.num_kv_heads * c.attention.head_dim}},
                       H);
  o_proj = w.projection(a + "o_proj.weight", H, c.attention.num_heads * c.attention.head_dim);
  q_norm = w.norm_scale(a + "q_norm.weight", c.attention.head_dim, c.norm_weight_plus_one);
  k_norm = w.norm_scale(a + "k_norm.weight", c.attention.head_dim, c.norm_weight_plus_one);
  inv_freq.resize(static_cast<size_t>(c.attention.rotary_dim / 2));
  for (int64_t i = 0; i < c.attention.rotary_dim / 2; ++i)  // as transformers: float32 theta^(2i/rot)
    inv_freq[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(c.attention.rope_theta), static_cast<float>(2 * i) / static_cast<float>(c.attention.rotary_dim));
}

void GatedAttention::forward(const BlockRun& r, std::vector<float>& kc, std::vector<float>& vc, const float* h,
                             float* x) const {
  const ModelConfig& c = r.cfg;
  const int64_t T = r.T, H = c.hidden_size, nq = c.attention.num_heads, nkv = c.attention.num_kv_heads, hd = c.attention.head_dim;
  const EngineThreads th = r.th;
  const LinearPrecision prec = r.opt.precision;
  const int64_t p0 = r.p0;
  auto t0 = Clock::now();
  // [T, S] rows of [q with its per-head gates | k | v] (one GEMM); k and v are then normed / copied
  // into the cache.
  const int64_t S = qkv_proj.out_features(), kv_cols = nkv * hd;
  float* qg = scratch(*r.ws, kQG, T * S);
  const size_t row = static_cast<size_t>(kv_cols);
  kc.resize(static_cast<size_t>(p0 + T) * row);
  vc.resize(static_cast<size_t>(p0 + T) * row);
  float* knew = kc.data() + static_cast<size_t>(p0) * row;
  float* vnew = vc.data() + static_cast<size_t>(p0) * row;
  qkv_proj.forward(h, H, qg, S, T, th, false, prec);
  r.times.attn_proj += seconds_since(t0);

  t0 = Clock::now();
  // Query heads out of the per-head [query | gate] interleave, normed and rotated; keys normed
  // and rotated into the cache, values copied there.
  const int64_t half = c.attention.rotary_dim / 2;
  float* q = scratch(*r.ws, kQ, T * nq * hd);
  const float eps = static_cast<float>(c.rms_norm_eps);
  parallel_for(T, th.when(T >= 8), [&](int64_t t_begin, int64_t t_end) {
    std::vector<float> cs(static_cast<size_t>(c.attention.rotary_dim));
    for (int64_t t = t_begin; t < t_end; ++t) {
      const float pos = static_cast<float>(p0 + t);
      for (int64_t i = 0; i < half; ++i) {  // as transformers: float32 angle, then cos/sin
        const float ang = pos * inv_freq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(ang)));
        cs[static_cast<size_t>(half + i)] = static_cast<float>(std::sin(static_cast<double>(ang)));
      }
      for (int64_t hh = 0; hh < nq; ++hh) {
        float* dst = q + (t * nq + hh) * hd;
        rms_norm_rows(qg + t * S + hh * 2 * hd, hd, dst, hd, 1, hd, q_norm.data(), eps, th.when(false));
        rope_rotate(dst, c.attention.rotary_dim, cs.data(), cs.data() + half);
      }
      const float* k_in = qg + t * S + nq * 2 * hd;
      for (int64_t hh = 0; hh < nkv; ++hh) {
        float* kr = knew + t * kv_cols + hh * hd;
        rms_norm_rows(k_in + hh * hd, hd, kr, hd, 1, hd, k_norm.data(), eps, th.when(false));
        rope_rotate(kr, c.attention.rotary_dim, cs.data(), cs.data() + half);
      }
      std::memcpy(vnew + t * kv_cols, k_in + kv_cols, static_cast<size_t>(kv_cols) * sizeof(float));
    }
  });
  float* attn = scratch(*r.ws, kAttn, T * nq * hd);
  causal_attention(q, kc.data(), vc.data(), attn, T, p0, nq, nkv, hd, 1.0f / std::sqrt(static_cast<float>(hd)), th);
  parallel_for(T, th.when(T >= 8), [&](int64_t t_begin, int64_t t_end) {  // sigmoid output gate
    for (int64_t t = t_begin; t < t_end; ++t)
      for (int64_t hh = 0; hh < nq; ++hh) {
        float* o = attn + (t * nq + hh) * hd;
        const float* g = qg + t * S + hh * 2 * hd + hd;
        simd_sigmoid_mul_row(o, g, static_cast<size_t>(hd));
      }
  });
  r.times.attn_core += seconds_since(t0);

  t0 = Clock::now();
  o_proj.forward(attn, nq * hd, x, H, T, th, true, prec);
  r.times.attn_proj += seconds_since(t0);
}

// ---- Multi-head latent attention ---------------------------------------------------------------

void MlaAttention::load(const ModelConfig& c, const WeightReader& w, const std::string& a) {
  const int64_t H = c.hidden_size, nh = c.mla.num_heads, r = c.mla.kv_lora_rank;
  const int64_t nope = c.mla.qk_nope_head_dim, rope = c.mla.qk_rope_head_dim, dv = c.mla.v_head_dim;
  const int64_t qk = c.mla.qk_head_dim();
  // One GEMM for every projection of the layer's input: rows [q (or q_a) | kv_a | head gate].
  std::vector<std::pair<std::string, int64_t>> parts;
  if (c.mla.q_lora_rank > 0) {
    parts.emplace_back(a + "q_a_proj.weight", c.mla.q_lora_rank);
    q_a_norm = w.norm_scale(a + "q_a_layernorm.weight", c.mla.q_lora_rank, c.norm_weight_plus_one);
    q_b_proj = w.projection(a + "q_b_proj.weight", nh * qk, c.mla.q_lora_rank);
  } else {
    parts.emplace_back(a + "q_proj.weight", nh * qk);
  }
  parts.emplace_back(a + "kv_a_proj_with_mqa.weight", r + rope);
  if (c.mla.head_gate) parts.emplace_back(a + "g_proj.weight", nh);
  in_proj = w.stacked(parts, H);
  kv_a_norm = w.norm_scale(a + "kv_a_layernorm.weight", r, c.norm_weight_plus_one);
  o_proj = w.projection(a + c.names.attention_out + ".weight", H, nh * dv);
  if (c.mla.rope) {
    inv_freq.resize(static_cast<size_t>(rope / 2));
    for (int64_t i = 0; i < rope / 2; ++i)  // as transformers: float32 theta^(2i/dim), dim = qk_rope_head_dim
      inv_freq[static_cast<size_t>(i)] =
          1.0f / std::pow(static_cast<float>(c.mla.rope_theta), static_cast<float>(2 * i) / static_cast<float>(rope));
  }
  // kv_b_proj [nh·(nope + v), r]: per head nope rows of W_uk, then v rows of W_uv. The absorbed
  // query projection needs W_ukᵀ: a transposed copy of the same values (bit-exact in any dtype).
  const std::string kvb = a + "kv_b_proj.weight";
  const TensorView wb = w.get(kvb, {nh * (nope + dv), r});
  const size_t es = dtype_size(wb.dtype);
  for (int64_t hh = 0; hh < nh; ++hh) {
    const auto* head = static_cast<const std::byte*>(wb.data) + static_cast<size_t>(hh * (nope + dv) * r) * es;
    const TensorView uk = TensorView::contiguous(const_cast<std::byte*>(head), wb.dtype, {nope, r});
    w.owned->push_back(transpose_copy(uk));
    key_absorb.push_back(w.projection_of(TensorView::contiguous(w.owned->back().data(), wb.dtype, {r, nope}),
                                         kvb + " (head " + std::to_string(hh) + " keys, transposed)"));
    const TensorView uv = TensorView::contiguous(const_cast<std::byte*>(head + static_cast<size_t>(nope * r) * es),
                                                 wb.dtype, {dv, r});
    value_up.push_back(w.projection_of(uv, kvb + " (head " + std::to_string(hh) + " values)"));
    // The expanded prefill's W_uk (a view). Not with int8 weights: quantized along r it would not
    // be the same numbers as the absorbed copy quantized along nope, and prefill and decode would
    // then use different keys; int8 models keep the latent form throughout.
    if (w.load.elementwise()) key_up.push_back(w.projection_of(uk, kvb + " (head " + std::to_string(hh) + " keys)"));
  }
}

// Multiply-adds per head of the two forms, over pairs = T·p0 + T(T+1)/2 query-key pairs:
//   latent:   T·r·(nope + dv)        W_ukᵀ into each query, W_uv out of each output
//             + pairs·(2r + rope)    scores over the cached rows (r + rope), sums over their r
//   expanded: (p0 + T)·r·(nope + dv) W_uk and W_uv over every cached row, once per call
//             + pairs·(qk + dv)      scores over nope + rope dims, sums over the v dims
// Kimi Linear (r 512, rope 64, nope 128, v 128): a fresh prefill is cheaper expanded at any T
// (its latent rows are 576 wide against 192), decode of one token over a long cache latent.
bool MlaAttention::expand_pays(const ModelConfig& c, int64_t T, int64_t p0) {
  const double r = static_cast<double>(c.mla.kv_lora_rank), up = static_cast<double>(c.mla.qk_nope_head_dim + c.mla.v_head_dim);
  const double pairs = static_cast<double>(T) * static_cast<double>(p0) + 0.5 * static_cast<double>(T) * static_cast<double>(T + 1);
  const double latent = static_cast<double>(T) * r * up + pairs * static_cast<double>(c.mla.cache_dim() + c.mla.kv_lora_rank);
  const double expanded =
      static_cast<double>(p0 + T) * r * up + pairs * static_cast<double>(c.mla.qk_head_dim() + c.mla.v_head_dim);
  return expanded < latent;
}

void MlaAttention::forward(const BlockRun& run, std::vector<float>& cache, const float* h, float* x) const {
  const ModelConfig& c = run.cfg;
  const int64_t T = run.T, H = c.hidden_size, nh = c.mla.num_heads, r = c.mla.kv_lora_rank;
  const int64_t nope = c.mla.qk_nope_head_dim, rope = c.mla.qk_rope_head_dim, dv = c.mla.v_head_dim;
  const int64_t qk = c.mla.qk_head_dim(), cdim = c.mla.cache_dim();
  const EngineThreads th = run.th;
  const LinearPrecision prec = run.opt.precision;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t p0 = run.p0;
  auto t0 = Clock::now();
  // [T, S] rows of [q (or q_a) | kv_a = c | k_rope | head gate].
  const int64_t S = in_proj.out_features();
  float* in = scratch(*run.ws, kQG, T * S);
  in_proj.forward(h, H, in, S, T, th, false, prec);
  float* q = in;  // [T, nh, qk] with rows ldq apart
  int64_t ldq = S, q_cols = nh * qk;
  if (c.mla.q_lora_rank > 0) {
    const int64_t qr = c.mla.q_lora_rank;
    float* low = scratch(*run.ws, kLowRank, T * qr);
    rms_norm_rows(in, S, low, qr, T, qr, q_a_norm.data(), eps, th);
    q = scratch(*run.ws, kQ, T * nh * qk);
    q_b_proj.forward(low, qr, q, nh * qk, T, th, false, prec);
    ldq = nh * qk, q_cols = qr;
  }
  // The compressed rows go into the cache: [c (normed) | k_rope (rotated below)].
  cache.resize(static_cast<size_t>((p0 + T) * cdim));
  float* fresh = cache.data() + p0 * cdim;
  const float* kv_in = in + q_cols;
  rms_norm_rows(kv_in, S, fresh, cdim, T, r, kv_a_norm.data(), eps, th);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(fresh + t * cdim + r, kv_in + t * S + r, static_cast<size_t>(rope) * sizeof(float));
  if (c.mla.rope) {
    // DeepSeek's interleaved RoPE (transformers' apply_rotary_pos_emb_interleave): the pairs
    // (x0, x1), (x2, x3), ... rotate by one angle each and come out de-interleaved,
    // [x_even·cos - x_odd·sin | x_odd·cos + x_even·sin], for q and the cached shared key alike.
    const int64_t half = rope / 2;
    parallel_for(T, th.when(T >= 8), [&](int64_t t_begin, int64_t t_end) {
      std::vector<float> cs(static_cast<size_t>(rope)), tmp(static_cast<size_t>(rope));
      auto rotate = [&](float* x) {
        for (int64_t i = 0; i < half; ++i) {
          const float even = x[2 * i], odd = x[2 * i + 1];
          tmp[static_cast<size_t>(i)] = even * cs[static_cast<size_t>(i)] - odd * cs[static_cast<size_t>(half + i)];
          tmp[static_cast<size_t>(half + i)] = odd * cs[static_cast<size_t>(i)] + even * cs[static_cast<size_t>(half + i)];
        }
        std::copy(tmp.begin(), tmp.end(), x);
      };
      for (int64_t t = t_begin; t < t_end; ++t) {
        const float pos = static_cast<float>(p0 + t);
        for (int64_t i = 0; i < half; ++i) {  // float32 angle, then cos/sin, as transformers
          const float ang = pos * inv_freq[static_cast<size_t>(i)];
          cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(ang)));
          cs[static_cast<size_t>(half + i)] = static_cast<float>(std::sin(static_cast<double>(ang)));
        }
        rotate(fresh + t * cdim + r);
        for (int64_t hh = 0; hh < nh; ++hh) rotate(q + t * ldq + hh * qk + nope);
      }
    });
  }
  if (!key_up.empty() && expand_pays(c, T, p0)) {
    // Keys [W_uk c | k_rope] (qk dims) and values W_uv c (dv dims) per head for all p0 + T cached
    // rows, then ordinary attention with nh KV heads.
    const int64_t rows = p0 + T, ld = nh * qk;
    float* keys = scratch(*run.ws, kExpandedKeys, rows * ld);
    float* values = scratch(*run.ws, kExpandedValues, rows * nh * dv);
    for (int64_t hh = 0; hh < nh; ++hh) {
      key_up[static_cast<size_t>(hh)].forward(cache.data(), cdim, keys + hh * qk, ld, rows, th, false, prec);
      value_up[static_cast<size_t>(hh)].forward(cache.data(), cdim, values + hh * dv, nh * dv, rows, th, false, prec);
    }
    parallel_for(rows, th.when(rows >= 8), [&](int64_t t_begin, int64_t t_end) {
      for (int64_t t = t_begin; t < t_end; ++t)
        for (int64_t hh = 0; hh < nh; ++hh)
          std::memcpy(keys + t * ld + hh * qk + nope, cache.data() + t * cdim + r, static_cast<size_t>(rope) * sizeof(float));
    });
    const float* qe = q;
    if (ldq != ld) {  // rows of the stacked input projection: gather the queries
      float* dense = scratch(*run.ws, kExpandedQ, T * ld);
      for (int64_t t = 0; t < T; ++t) std::memcpy(dense + t * ld, q + t * ldq, static_cast<size_t>(ld) * sizeof(float));
      qe = dense;
    }
    run.times.attn_proj += seconds_since(t0);
    t0 = Clock::now();
    float* attn = scratch(*run.ws, kAttn, T * nh * dv);
    causal_attention(qe, keys, values, attn, T, p0, nh, nh, qk, dv, nh * dv, 1.0f / std::sqrt(static_cast<float>(qk)), th);
    run.times.attn_core += seconds_since(t0);
    t0 = Clock::now();
    finish(run, kv_in, S, attn, x);
    run.times.attn_proj += seconds_since(t0);
    return;
  }
  // Absorbed queries [W_ukᵀ q_nope | q_rope] per head, in the cache's row layout.
  float* ql = scratch(*run.ws, kLatentQ, T * nh * cdim);
  for (int64_t hh = 0; hh < nh; ++hh)
    key_absorb[static_cast<size_t>(hh)].forward(q + hh * qk, ldq, ql + hh * cdim, nh * cdim, T, th, false, prec);
  parallel_for(T, th.when(T >= 8), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t)
      for (int64_t hh = 0; hh < nh; ++hh)
        std::memcpy(ql + (t * nh + hh) * cdim + r, q + t * ldq + hh * qk + nope, static_cast<size_t>(rope) * sizeof(float));
  });
  run.times.attn_proj += seconds_since(t0);

  t0 = Clock::now();
  // One shared KV head whose keys are the cached rows and whose values are their first r dims:
  // each output is Σ p c. Scale 1/sqrt(nope + rope), as the expanded attention's.
  float* ol = scratch(*run.ws, kLatentOut, T * nh * r);
  causal_attention(ql, cache.data(), cache.data(), ol, T, p0, nh, 1, cdim, r, cdim,
                   1.0f / std::sqrt(static_cast<float>(qk)), th);
  run.times.attn_core += seconds_since(t0);

  t0 = Clock::now();
  float* attn = scratch(*run.ws, kAttn, T * nh * dv);
  for (int64_t hh = 0; hh < nh; ++hh)
    value_up[static_cast<size_t>(hh)].forward(ol + hh * r, nh * r, attn + hh * dv, nh * dv, T, th, false, prec);
  finish(run, kv_in, S, attn, x);
  run.times.attn_proj += seconds_since(t0);
}

void MlaAttention::finish(const BlockRun& run, const float* kv_in, int64_t S, float* attn, float* x) const {
  const ModelConfig& c = run.cfg;
  const int64_t T = run.T, nh = c.mla.num_heads, dv = c.mla.v_head_dim;
  if (c.mla.head_gate) {  // each head's output times sigmoid(g_proj(x))[head]
    const float* score = kv_in + c.mla.cache_dim();  // the stacked output's last nh columns
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float g = 1.0f / (1.0f + std::exp(-score[t * S + hh]));
        float* o = attn + (t * nh + hh) * dv;
        for (int64_t i = 0; i < dv; ++i) o[i] *= g;
      }
  }
  o_proj.forward(attn, nh * dv, x, c.hidden_size, T, run.th, true, run.opt.precision);
}

}  // namespace hanpu::model
