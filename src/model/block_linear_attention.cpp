// The linear-attention token mixers: Gated DeltaNet and Kimi Delta Attention (blocks.hpp). Both run
// the LA engine of include/hanpu/la.hpp from the layer's recurrent state: a prefill (T > 1) through
// gdn_prefill / kda_prefill, a decode step (T = 1) through gdn_decode / kda_decode.
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "hanpu/la.hpp"
#include "model/blocks.hpp"
#include "model/layer_kernels.hpp"
#include "model/layer_ops.hpp"
#include "model/fused_gdn_layout.hpp"

namespace hanpu::model {

void append_conv_taps(const std::vector<float>& w, int64_t channels, int64_t K, int64_t channel0,
                      int64_t total_channels, std::vector<float>& taps) {
  taps.resize(static_cast<size_t>(K * total_channels));
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t j = 0; j < K; ++j)
      taps[static_cast<size_t>(j * total_channels + channel0 + ch)] = w[static_cast<size_t>(ch * K + j)];
}

namespace {

// A [1, T, dims...] f32 view of T token rows `ld` floats apart, each holding dims contiguous: the
// engine's inputs read in place from the conv output or from a stacked projection's columns.
TensorView token_rows(const float* base, int64_t T, int64_t ld, std::vector<int64_t> dims) {
  dims.insert(dims.begin(), {1, T});
  TensorView v = TensorView::contiguous(const_cast<float*>(base), DType::F32, dims);
  v.stride[0] = T * ld;
  v.stride[1] = ld;
  return v;
}

// Runs the LA engine over the conv output `conv` ([T, conv_dim] rows holding q | k | v) into `o`
// [T, HV, V]: a prefill from the recurrent state (replaced by the final state), or decode steps.
// The engine turns the raw g into -exp(A_log)·softplus(g + dt_bias), or with a lower bound (Ling's
// safe gate) into lower_bound·sigmoid(exp(A_log)·(g + dt_bias)).
void run_engine(Variant variant, const BlockRun& r, const float* conv, int64_t conv_dim, int64_t nk, int64_t nv,
                int64_t dk, int64_t dv, TensorView g, TensorView beta, std::optional<float> lower_bound,
                const std::vector<float>& A_log, const std::vector<float>& dt_bias, Tensor& state, float* o) {
  const int64_t T = r.T, kd = nk * dk;
  LaInputs in;
  in.q = token_rows(conv, T, conv_dim, {nk, dk});
  in.k = token_rows(conv + kd, T, conv_dim, {nk, dk});
  in.v = token_rows(conv + 2 * kd, T, conv_dim, {nv, dv});
  in.g = g;
  in.beta = beta;
  LaOptions lo;
  lo.qk_l2norm = true;
  in.A_log = TensorView::contiguous(const_cast<float*>(A_log.data()), DType::F32, {nv});
  in.dt_bias = TensorView::contiguous(const_cast<float*>(dt_bias.data()), DType::F32,
                                      {static_cast<int64_t>(dt_bias.size())});
  lo.gate_in_kernel = true;  // the gate activation in fp32, as FLA's gate kernels
  lo.lower_bound = lower_bound;
  lo.beta_sigmoid = true;
  TensorView ov = TensorView::contiguous(o, DType::F32, {1, T, nv, dv});
  ExecOptions ex;
  ex.threads = r.th.n;
  ex.engine = r.th.engine;
  if (T == 1) {
    if (variant == Variant::GDN) gdn_decode(in, lo, state.view(), ov, ex);
    else kda_decode(in, lo, state.view(), ov, ex);
  } else {
    in.initial_state = state.view();
    Tensor next(DType::F32, state.shape());
    la_prefill(variant, in, lo, LaOutputs{ov, next.view()}, ex);
    state = std::move(next);
  }
}

}  // namespace

// ---- Gated DeltaNet ----------------------------------------------------------------------------

void GdnMixer::load(const ModelConfig& c, const WeightReader& w, const std::string& g) {
  const int64_t H = c.hidden_size, nk = c.gdn.num_key_heads, nv = c.gdn.num_value_heads;
  const int64_t cd = c.gdn.conv_dim(), vd = c.gdn.value_dim();
  // One GEMM for the four projections of the layer's input, rows [q | k | v | z | b | a].
  if (c.gdn.fused_projections) {
    // Qwen3-Next: in_proj_qkvz / in_proj_ba rows permuted into one owned copy in that order.
    const std::string qkvz_name = g + "in_proj_qkvz.weight", ba_name = g + "in_proj_ba.weight";
    const TensorView qkvz = w.get(qkvz_name, {cd + vd, H});
    const TensorView ba = w.get(ba_name, {2 * nv, H});
    if (qkvz.dtype != ba.dtype)
      throw Error("'" + qkvz_name + "' is " + dtype_name(qkvz.dtype) + " but '" + ba_name + "' is " +
                  dtype_name(ba.dtype) + ", expected one dtype for both (they are stacked into one projection)");
    const ByteBuffer head = gather_rows(
        qkvz, qwen3next_qkvz_source_rows(nk, nv, c.gdn.key_head_dim, c.gdn.value_head_dim), qkvz_name);
    const ByteBuffer tail = gather_rows(ba, qwen3next_ba_source_rows(nk, nv), ba_name);
    w.owned->push_back(ByteBuffer(head.size() + tail.size()));
    std::memcpy(w.owned->back().data(), head.data(), head.size());
    std::memcpy(w.owned->back().data() + head.size(), tail.data(), tail.size());
    if (w.release) w.release(qkvz_name), w.release(ba_name);
    in_proj = w.projection_of(TensorView::contiguous(w.owned->back().data(), qkvz.dtype, {cd + vd + 2 * nv, H}),
                              qkvz_name + " + " + ba_name + " (rows q|k|v|z|b|a)");
  } else {
    in_proj = w.stacked({{g + "in_proj_qkv.weight", cd}, {g + "in_proj_z.weight", vd}, {g + "in_proj_b.weight", nv},
                         {g + "in_proj_a.weight", nv}},
                        H);
  }
  out_proj = w.projection(g + "out_proj.weight", H, vd);
  append_conv_taps(w.floats(g + "conv1d.weight", {cd, 1, c.gdn.conv_kernel}), cd, c.gdn.conv_kernel, 0, cd,
                   conv_taps);
  A_log = w.floats(g + "A_log", {nv});
  dt_bias = w.floats(g + "dt_bias", {nv});
  norm_w = w.floats(g + "norm.weight", {c.gdn.value_head_dim});
}

void GdnMixer::forward(const BlockRun& r, Tensor& conv_state, Tensor& recurrent_state, const float* h, float* x) const {
  const ModelConfig& c = r.cfg;
  const int64_t T = r.T, H = c.hidden_size, cd = c.gdn.conv_dim(), vd = c.gdn.value_dim();
  const int64_t nv = c.gdn.num_value_heads;
  const EngineThreads th = r.th;
  const LinearPrecision prec = r.opt.precision;
  auto t0 = Clock::now();
  // [T, S] rows of [q | k | v | z | b | a] (in_proj's output columns).
  const int64_t S = in_proj.out_features();
  float* mixed = scratch(*r.ws, kMixed, T * S);
  const float* z = mixed + cd;
  const float* b = mixed + cd + vd;
  const float* a = b + nv;
  in_proj.forward(h, H, mixed, S, T, th, false, prec);
  r.times.gdn_proj += seconds_since(t0);

  t0 = Clock::now();
  float* conv = scratch(*r.ws, kConv, T * cd);
  causal_conv_silu(mixed, S, conv, T, cd, conv_taps.data(), c.gdn.conv_kernel, conv_state.ptr<float>(), th);
  r.times.gdn_conv += seconds_since(t0);

  t0 = Clock::now();
  float* o = scratch(*r.ws, kO, T * vd);
  run_engine(Variant::GDN, r, conv, cd, c.gdn.num_key_heads, nv, c.gdn.key_head_dim, c.gdn.value_head_dim,
             token_rows(a, T, S, {nv}), token_rows(b, T, S, {nv}), std::nullopt, A_log, dt_bias, recurrent_state, o);
  r.times.gdn_engine += seconds_since(t0);

  t0 = Clock::now();
  gated_rms_norm(o, z, S, T, nv, c.gdn.value_head_dim, norm_w.data(), static_cast<float>(c.rms_norm_eps), th);
  r.times.gdn_norm += seconds_since(t0);

  t0 = Clock::now();
  out_proj.forward(o, vd, x, H, T, th, true, prec);
  r.times.gdn_proj += seconds_since(t0);
}

// ---- Kimi Delta Attention ----------------------------------------------------------------------

void KdaMixer::load(const ModelConfig& c, const WeightReader& w, const std::string& p) {
  const int64_t H = c.hidden_size, nh = c.kda.num_heads, dk = c.kda.head_dim;
  const int64_t qkv = nh * dk, K = c.kda.conv_kernel;
  // Official checkpoints keep three convs; transformers' in-memory module concatenates them.
  if (w.has(p + "q_conv1d.weight") || !w.has(p + "conv1d.weight")) {
    const char* convs[] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
    for (int i = 0; i < 3; ++i)
      append_conv_taps(w.floats(p + convs[i], {qkv, 1, K}), qkv, K, i * qkv, 3 * qkv, conv_taps);
  } else {
    append_conv_taps(w.floats(p + "conv1d.weight", {3 * qkv, 1, K}), 3 * qkv, K, 0, 3 * qkv, conv_taps);
  }
  // The gates: official names sit on the layer; transformers' module nests the forget gate's in
  // forget_gate.
  const std::string f = w.has(p + "forget_gate.A_log") && !w.has(p + "A_log") ? p + "forget_gate." : p;
  // One GEMM for every projection of the layer's input (measured: separate q, k and v GEMMs ran at
  // 135-162 GFLOP/s against 159-193 for GDN's stacked in_proj_qkv, docs/PERFORMANCE.md): rows
  // [q | k | v | f_a | g_a | b] (Kimi's rank-dk gate projections) or [q | k | v | f | g | b].
  std::vector<std::pair<std::string, int64_t>> parts = {
      {p + "q_proj.weight", qkv}, {p + "k_proj.weight", qkv}, {p + "v_proj.weight", qkv}};
  if (c.kda.low_rank_gates) {
    parts.insert(parts.end(), {{f + "f_a_proj.weight", dk}, {p + "g_a_proj.weight", dk}});
    f_b = w.projection(f + "f_b_proj.weight", qkv, dk);
    g_b = w.projection(p + "g_b_proj.weight", qkv, dk);
    A_log = w.floats(f + "A_log", {1, 1, nh, 1});
  } else {
    parts.insert(parts.end(), {{f + "f_proj.weight", qkv}, {p + "g_proj.weight", qkv}});
    A_log = w.floats(f + "A_log", {nh});
  }
  parts.emplace_back(p + "b_proj.weight", nh);
  in_proj = w.stacked(parts, H);
  dt_bias = w.floats(f + "dt_bias", {qkv});
  o_norm = w.floats(p + "o_norm.weight", {dk});
  // The published Ling checkpoints name it o_proj; transformers' save_pretrained writes dense.
  o_proj = w.projection(p + (w.has(p + "o_proj.weight") ? std::string("o_proj") : c.names.attention_out) + ".weight", H, qkv);
}

void KdaMixer::forward(const BlockRun& r, Tensor& conv_state, Tensor& recurrent_state, const float* h, float* x) const {
  const ModelConfig& c = r.cfg;
  const int64_t T = r.T, H = c.hidden_size, nh = c.kda.num_heads, dk = c.kda.head_dim;
  const int64_t qkv = nh * dk, cd = 3 * qkv;
  const EngineThreads th = r.th;
  const LinearPrecision prec = r.opt.precision;
  auto t0 = Clock::now();
  // [T, S] rows of in_proj's outputs: [q | k | v | f_a | g_a | b] or [q | k | v | f | g | b].
  const int64_t S = in_proj.out_features();
  float* mixed = scratch(*r.ws, kMixed, T * S);
  in_proj.forward(h, H, mixed, S, T, th, false, prec);
  const float* f = mixed + cd;  // the forget gate's input to the engine, rows ld_f apart
  const float* gate = mixed + cd + qkv;
  int64_t ld_f = S, ld_gate = S;
  if (c.kda.low_rank_gates) {
    float* fb = scratch(*r.ws, kA, T * qkv);
    float* gb = scratch(*r.ws, kGateOut, T * qkv);
    f_b.forward(mixed + cd, S, fb, qkv, T, th, false, prec);
    g_b.forward(mixed + cd + dk, S, gb, qkv, T, th, false, prec);
    f = fb, gate = gb, ld_f = qkv, ld_gate = qkv;
  }
  r.times.kda_proj += seconds_since(t0);

  t0 = Clock::now();
  float* conv = scratch(*r.ws, kConv, T * cd);
  causal_conv_silu(mixed, S, conv, T, cd, conv_taps.data(), c.kda.conv_kernel, conv_state.ptr<float>(), th);
  r.times.kda_conv += seconds_since(t0);

  t0 = Clock::now();
  float* o = scratch(*r.ws, kO, T * qkv);
  run_engine(Variant::KDA, r, conv, cd, nh, nh, dk, dk, token_rows(f, T, ld_f, {nh, dk}),
             token_rows(mixed + S - nh, T, S, {nh}),
             c.kda.safe_gate ? std::optional<float>(static_cast<float>(c.kda.lower_bound)) : std::nullopt, A_log,
             dt_bias, recurrent_state, o);
  r.times.kda_engine += seconds_since(t0);

  // o_norm: RMSNorm per head with the raw weight, times sigmoid of the output gate (FLA's
  // FusedRMSNormGated with activation sigmoid).
  t0 = Clock::now();
  rms_norm_rows(o, dk, o, dk, T * nh, dk, o_norm.data(), static_cast<float>(c.rms_norm_eps), th);
  parallel_for(T, th.when(T >= 8), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) simd_sigmoid_mul_row(o + t * qkv, gate + t * ld_gate, static_cast<size_t>(qkv));
  });
  r.times.kda_norm += seconds_since(t0);

  t0 = Clock::now();
  o_proj.forward(o, qkv, x, H, T, th, true, prec);
  r.times.kda_proj += seconds_since(t0);
}

}  // namespace hanpu::model
