// The linear-attention token mixers: Gated DeltaNet and Kimi Delta Attention (blocks.hpp). Both run
// the LA engine of include/hanpu/la.hpp from the layer's recurrent state: a prefill (T > 1) through
// gdn_prefill / kda_prefill, a decode step (T = 1) through gdn_decode / kda_decode.
#include <cmath>
#include <cstring>
#include <optional>

#include "hanpu/la.hpp"
#include "model/blocks.hpp"
#include "model/qwen35_kernels.hpp"
#include "model/qwen35_ops.hpp"
#include "model/qwen3next_layout.hpp"

namespace hanpu::model {

void append_conv_taps(const std::vector<float>& w, int64_t channels, int64_t K, int64_t channel0,
                      int64_t total_channels, std::vector<float>& taps) {
  taps.resize(static_cast<size_t>(K * total_channels));
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t j = 0; j < K; ++j)
      taps[static_cast<size_t>(j * total_channels + channel0 + ch)] = w[static_cast<size_t>(ch * K + j)];
}

namespace {

// Runs the LA engine over the conv output `conv` ([T, conv_dim] rows holding q | k | v) into `o`
// [T, HV, V]: a prefill from the recurrent state (replaced by the final state), or decode steps.
// The engine turns the raw g into -exp(A_log)·softplus(g + dt_bias), or with a lower bound (Ling's
// safe gate) into lower_bound·sigmoid(exp(A_log)·(g + dt_bias)).
void run_engine(Variant variant, const BlockRun& r, const float* conv, int64_t conv_dim, int64_t nk, int64_t nv,
                int64_t dk, int64_t dv, TensorView g, TensorView beta, std::optional<float> lower_bound,
                const std::vector<float>& A_log, const std::vector<float>& dt_bias, Tensor& state, float* o) {
  const int64_t T = r.T, kd = nk * dk;
  LaInputs in;
  auto view = [&](const float* base, int64_t heads, int64_t dim) {
    TensorView v = TensorView::contiguous(const_cast<float*>(base), DType::F32, {1, T, heads, dim});
    v.stride[0] = T * conv_dim;
    v.stride[1] = conv_dim;
    return v;
  };
  in.q = view(conv, nk, dk);
  in.k = view(conv + kd, nk, dk);
  in.v = view(conv + 2 * kd, nv, dv);
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
  const int64_t H = c.hidden_size, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t cd = c.gdn_conv_dim(), vd = c.gdn_value_dim();
  if (c.fused_gdn_projections) {
    // Qwen3-Next: in_proj_qkvz / in_proj_ba rows permuted into owned copies in the Qwen3.5 order
    // [q | k | v | z] and [b | a]; the four projections are views of those copies.
    const TensorView qkvz = w.get(g + "in_proj_qkvz.weight", {cd + vd, H});
    const TensorView ba = w.get(g + "in_proj_ba.weight", {2 * nv, H});
    w.owned->push_back(gather_rows(qkvz, qwen3next_qkvz_source_rows(nk, nv, c.linear_key_head_dim, c.linear_value_head_dim),
                                   g + "in_proj_qkvz.weight"));
    std::byte* rows = w.owned->back().data();
    const size_t row_bytes = static_cast<size_t>(H) * dtype_size(qkvz.dtype);
    in_qkv = w.projection_of(TensorView::contiguous(rows, qkvz.dtype, {cd, H}), g + "in_proj_qkvz.weight (q|k|v rows)");
    in_z = w.projection_of(TensorView::contiguous(rows + static_cast<size_t>(cd) * row_bytes, qkvz.dtype, {vd, H}),
                      g + "in_proj_qkvz.weight (z rows)");
    w.owned->push_back(gather_rows(ba, qwen3next_ba_source_rows(nk, nv), g + "in_proj_ba.weight"));
    rows = w.owned->back().data();
    const size_t ba_row_bytes = static_cast<size_t>(H) * dtype_size(ba.dtype);
    in_b = w.projection_of(TensorView::contiguous(rows, ba.dtype, {nv, H}), g + "in_proj_ba.weight (b rows)");
    in_a = w.projection_of(TensorView::contiguous(rows + static_cast<size_t>(nv) * ba_row_bytes, ba.dtype, {nv, H}),
                      g + "in_proj_ba.weight (a rows)");
  } else {
    in_qkv = w.projection(g + "in_proj_qkv.weight", cd, H);
    in_z = w.projection(g + "in_proj_z.weight", vd, H);
    in_b = w.projection(g + "in_proj_b.weight", nv, H);
    in_a = w.projection(g + "in_proj_a.weight", nv, H);
  }
  out_proj = w.projection(g + "out_proj.weight", H, vd);
  append_conv_taps(w.floats(g + "conv1d.weight", {cd, 1, c.linear_conv_kernel}), cd, c.linear_conv_kernel, 0, cd,
                   conv_taps);
  A_log = w.floats(g + "A_log", {nv});
  dt_bias = w.floats(g + "dt_bias", {nv});
  norm_w = w.floats(g + "norm.weight", {c.linear_value_head_dim});
}

void GdnMixer::forward(const BlockRun& r, Tensor& conv_state, Tensor& recurrent_state, const float* h, float* x) const {
  const ModelConfig& c = r.cfg;
  const int64_t T = r.T, H = c.hidden_size, cd = c.gdn_conv_dim(), vd = c.gdn_value_dim();
  const int64_t nv = c.linear_num_value_heads;
  const cpu::Threads th = r.th;
  const LinearPrecision prec = r.opt.precision;
  auto t0 = Clock::now();
  float* mixed = scratch(*r.ws, kMixed, T * cd);
  float* z = scratch(*r.ws, kZ, T * vd);
  float* b = scratch(*r.ws, kB, T * nv);
  float* a = scratch(*r.ws, kA, T * nv);
  in_qkv.forward(h, H, mixed, cd, T, th, false, prec);
  in_z.forward(h, H, z, vd, T, th, false, prec);
  in_b.forward(h, H, b, nv, T, th, false, prec);
  in_a.forward(h, H, a, nv, T, th, false, prec);
  r.times.gdn_proj += seconds_since(t0);

  t0 = Clock::now();
  float* conv = scratch(*r.ws, kConv, T * cd);
  causal_conv_silu(mixed, conv, T, cd, conv_taps.data(), c.linear_conv_kernel, conv_state.ptr<float>(), th);
  r.times.gdn_conv += seconds_since(t0);

  t0 = Clock::now();
  float* o = scratch(*r.ws, kO, T * vd);
  run_engine(Variant::GDN, r, conv, cd, c.linear_num_key_heads, nv, c.linear_key_head_dim, c.linear_value_head_dim,
             TensorView::contiguous(a, DType::F32, {1, T, nv}), TensorView::contiguous(b, DType::F32, {1, T, nv}),
             std::nullopt, A_log, dt_bias, recurrent_state, o);
  r.times.gdn_engine += seconds_since(t0);

  t0 = Clock::now();
  gated_rms_norm(o, z, T, nv, c.linear_value_head_dim, norm_w.data(), static_cast<float>(c.rms_norm_eps), th);
  r.times.gdn_norm += seconds_since(t0);

  t0 = Clock::now();
  out_proj.forward(o, vd, x, H, T, th, true, prec);
  r.times.gdn_proj += seconds_since(t0);
}

// ---- Kimi Delta Attention ----------------------------------------------------------------------

void KdaMixer::load(const ModelConfig& c, const WeightReader& w, const std::string& p) {
  const int64_t H = c.hidden_size, nh = c.linear_num_value_heads, dk = c.linear_key_head_dim;
  const int64_t qkv = nh * dk, K = c.linear_conv_kernel;
  // One GEMM writes the conv input [q | k | v] (measured: three separate ones ran the KDA
  // projections at 135-162 GFLOP/s against 159-193 for GDN's stacked in_proj_qkv, docs/PERFORMANCE.md).
  qkv_proj = w.stacked({{p + "q_proj.weight", qkv}, {p + "k_proj.weight", qkv}, {p + "v_proj.weight", qkv}}, H);
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
  if (c.kda_low_rank_gates) {
    fg_a = w.stacked({{f + "f_a_proj.weight", dk}, {p + "g_a_proj.weight", dk}}, H);  // both rank-dk, from x
    f_b = w.projection(f + "f_b_proj.weight", qkv, dk);
    g_b = w.projection(p + "g_b_proj.weight", qkv, dk);
    A_log = w.floats(f + "A_log", {1, 1, nh, 1});
  } else {
    f_proj = w.projection(f + "f_proj.weight", qkv, H);
    g_proj = w.projection(p + "g_proj.weight", qkv, H);
    A_log = w.floats(f + "A_log", {nh});
  }
  dt_bias = w.floats(f + "dt_bias", {qkv});
  b_proj = w.projection(p + "b_proj.weight", nh, H);
  o_norm = w.floats(p + "o_norm.weight", {dk});
  o_proj = w.projection(p + c.names.attention_out + ".weight", H, qkv);
}

void KdaMixer::forward(const BlockRun& r, Tensor& conv_state, Tensor& recurrent_state, const float* h, float* x) const {
  const ModelConfig& c = r.cfg;
  const int64_t T = r.T, H = c.hidden_size, nh = c.linear_num_value_heads, dk = c.linear_key_head_dim;
  const int64_t qkv = nh * dk, cd = 3 * qkv;
  const cpu::Threads th = r.th;
  const LinearPrecision prec = r.opt.precision;
  auto t0 = Clock::now();
  float* mixed = scratch(*r.ws, kMixed, T * cd);
  qkv_proj.forward(h, H, mixed, cd, T, th, false, prec);
  float* f = scratch(*r.ws, kA, T * qkv);
  float* gate = scratch(*r.ws, kGateOut, T * qkv);
  if (c.kda_low_rank_gates) {
    float* low = scratch(*r.ws, kLowRank, T * 2 * dk);  // [f_a(x) | g_a(x)] per token
    fg_a.forward(h, H, low, 2 * dk, T, th, false, prec);
    f_b.forward(low, 2 * dk, f, qkv, T, th, false, prec);
    g_b.forward(low + dk, 2 * dk, gate, qkv, T, th, false, prec);
  } else {
    f_proj.forward(h, H, f, qkv, T, th, false, prec);
    g_proj.forward(h, H, gate, qkv, T, th, false, prec);
  }
  float* b = scratch(*r.ws, kB, T * nh);
  b_proj.forward(h, H, b, nh, T, th, false, prec);
  r.times.kda_proj += seconds_since(t0);

  t0 = Clock::now();
  float* conv = scratch(*r.ws, kConv, T * cd);
  causal_conv_silu(mixed, conv, T, cd, conv_taps.data(), c.linear_conv_kernel, conv_state.ptr<float>(), th);
  r.times.kda_conv += seconds_since(t0);

  t0 = Clock::now();
  float* o = scratch(*r.ws, kO, T * qkv);
  run_engine(Variant::KDA, r, conv, cd, nh, nh, dk, dk, TensorView::contiguous(f, DType::F32, {1, T, nh, dk}),
             TensorView::contiguous(b, DType::F32, {1, T, nh}),
             c.kda_safe_gate ? std::optional<float>(static_cast<float>(c.kda_lower_bound)) : std::nullopt, A_log,
             dt_bias, recurrent_state, o);
  r.times.kda_engine += seconds_since(t0);

  // o_norm: RMSNorm per head with the raw weight, times sigmoid of the output gate (FLA's
  // FusedRMSNormGated with activation sigmoid).
  t0 = Clock::now();
  rms_norm_rows(o, dk, o, dk, T * nh, dk, o_norm.data(), static_cast<float>(c.rms_norm_eps), th);
  parallel_for(T, th.when(T >= 8), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) simd_sigmoid_mul_row(o + t * qkv, gate + t * qkv, static_cast<size_t>(qkv));
  });
  r.times.kda_norm += seconds_since(t0);

  t0 = Clock::now();
  o_proj.forward(o, qkv, x, H, T, th, true, prec);
  r.times.kda_proj += seconds_since(t0);
}

}  // namespace hanpu::model
