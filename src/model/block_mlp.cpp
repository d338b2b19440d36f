// The channel mixers: SwiGLU MLP and mixture of experts (blocks.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/blocks.hpp"
#include "model/layer_ops.hpp"

namespace hanpu::model {

void SwiGluMlp::load(const WeightReader& w, const std::string& p, int64_t hidden, int64_t intermediate,
                     const std::string& gate, const std::string& up, const std::string& down) {
  gate_up = w.stacked({{p + gate + ".weight", intermediate}, {p + up + ".weight", intermediate}}, hidden);
  down_proj = w.projection(p + down + ".weight", hidden, intermediate);
}

void SwiGluMlp::forward(const BlockRun& r, const float* h, float* x, ScratchSlot slot, bool accumulate) const {
  const int64_t T = r.T, H = r.cfg.hidden_size, I = down_proj.in_features();
  const EngineThreads th = r.th;
  float* gu = scratch(*r.ws, slot, T * 2 * I);  // rows [gate | up]
  gate_up.forward(h, H, gu, 2 * I, T, th, false, r.opt.precision);
  silu_mul(gu, gu + I, T, I, 2 * I, th);
  down_proj.forward(gu, 2 * I, x, H, T, th, accumulate, r.opt.precision);
}

void MoeBlock::load(const ModelConfig& c, const WeightReader& w, const std::string& m) {
  const int64_t H = c.hidden_size, E = c.moe.num_experts, Im = c.moe.intermediate_size, Is = c.moe.shared_expert_intermediate_size;
  router = w.projection(m + "gate.weight", E, H, /*quantizable=*/false);
  if (c.moe.router_score_bias) score_bias = w.floats(m + c.names.router_score_bias, {E});
  const CheckpointNames& n = c.names;
  // Experts: one tensor set per expert (official checkpoints, save_pretrained), or the fused 3-D
  // tensors of transformers' in-memory layout (gate_up_proj [E, 2·Im, H]: gate rows then up rows,
  // already the stacked [gate | up] each expert runs as one GEMM).
  if (w.has(m + "experts.gate_up_proj") && !w.has(m + "experts.0." + n.expert_gate + ".weight")) {
    const TensorView gu = w.get(m + "experts.gate_up_proj", {E, 2 * Im, H});
    const TensorView dn = w.get(m + "experts.down_proj", {E, H, Im});
    const size_t es_gu = dtype_size(gu.dtype), es_dn = dtype_size(dn.dtype);
    for (int64_t e = 0; e < E; ++e) {
      auto* base = static_cast<std::byte*>(gu.data) + static_cast<size_t>(e * 2 * Im * H) * es_gu;
      gate_up.push_back(w.projection_of(TensorView::contiguous(base, gu.dtype, {2 * Im, H}),
                                        m + "experts.gate_up_proj[" + std::to_string(e) + "]"));
      down_proj.push_back(w.projection_of(
          TensorView::contiguous(static_cast<std::byte*>(dn.data) + static_cast<size_t>(e * H * Im) * es_dn, dn.dtype, {H, Im}),
          m + "experts.down_proj[" + std::to_string(e) + "]"));
    }
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      gate_up.push_back(w.stacked({{x + n.expert_gate + ".weight", Im}, {x + n.expert_up + ".weight", Im}}, H));
      down_proj.push_back(w.projection(x + n.expert_down + ".weight", H, Im));
    }
  }
  if (Is > 0) {
    has_shared = true;
    shared.load(w, m + n.shared_expert, H, Is);
    if (c.moe.shared_expert_gated) shared_gate = w.projection(m + "shared_expert_gate.weight", 1, H, /*quantizable=*/false);
  }
}

void MoeBlock::route(const ModelConfig& c, const float* l, std::vector<int64_t>& chosen, std::vector<float>& weights,
                     std::vector<float>& work) const {
  const int64_t E = c.moe.num_experts, K = c.moe.num_experts_per_tok;
  // work = [score (E) | choice (E)]: the score weighs an expert, the choice picks it.
  work.resize(static_cast<size_t>(2 * E));
  float* score = work.data();
  float* choice = work.data() + E;
  if (c.moe.router_scoring == RouterScoring::kSoftmax) {
    const float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += score[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) score[e] /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-l[e]));
  }
  for (int64_t e = 0; e < E; ++e) choice[e] = score[e] + (score_bias.empty() ? 0.0f : score_bias[static_cast<size_t>(e)]);
  // Higher first; ties to the lower index.
  auto better = [](const float* v) { return [v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }; };
  if (c.moe.num_expert_groups > 1) {
    // A group scores the sum of its two best choices; experts outside the best topk_groups groups
    // are not eligible (DeepSeek-V3's grouped top-k).
    const int64_t G = c.moe.num_expert_groups, per = E / G;
    std::vector<float> group_score(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      float best = -std::numeric_limits<float>::infinity(), second = best;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > best) second = best, best = choice[e];
        else if (choice[e] > second) second = choice[e];
      }
      group_score[static_cast<size_t>(g)] = best + second;
    }
    std::vector<int64_t> groups(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) groups[static_cast<size_t>(g)] = g;
    std::partial_sort(groups.begin(), groups.begin() + c.moe.topk_groups, groups.end(), better(group_score.data()));
    std::vector<bool> keep(static_cast<size_t>(G), false);
    for (int64_t i = 0; i < c.moe.topk_groups; ++i) keep[static_cast<size_t>(groups[static_cast<size_t>(i)])] = true;
    for (int64_t e = 0; e < E; ++e)
      if (!keep[static_cast<size_t>(e / per)]) choice[e] = -std::numeric_limits<float>::infinity();
  }
  chosen.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) chosen[static_cast<size_t>(e)] = e;
  std::partial_sort(chosen.begin(), chosen.begin() + K, chosen.end(), better(choice));
  chosen.resize(static_cast<size_t>(K));
  weights.resize(static_cast<size_t>(K));
  float sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += weights[static_cast<size_t>(k)] = score[chosen[static_cast<size_t>(k)]];
  const float denom = c.moe.norm_topk_prob ? sum + static_cast<float>(c.moe.topk_norm_eps) : 1.0f;
  const float scale = static_cast<float>(c.moe.routed_scaling_factor);
  for (float& w : weights) w = w / denom * scale;
}

void MoeBlock::forward(const BlockRun& r, const float* h, float* x) const {
  const ModelConfig& c = r.cfg;
  const int64_t T = r.T, H = c.hidden_size, E = c.moe.num_experts, Im = c.moe.intermediate_size;
  const EngineThreads th = r.th;
  const LinearPrecision prec = r.opt.precision;

  float* logits = scratch(*r.ws, kRouter, T * E);
  router.forward(h, H, logits, E, T, th, false, prec);
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));  // per expert: (token, weight)
  std::vector<int64_t> chosen;
  std::vector<float> weights, work;
  for (int64_t t = 0; t < T; ++t) {
    route(c, logits + t * E, chosen, weights, work);
    for (size_t k = 0; k < chosen.size(); ++k) routed[static_cast<size_t>(chosen[k])].emplace_back(t, weights[k]);
  }

  // Experts: the rows routed to expert e gathered into one block, so a prefill runs each expert as
  // a GEMM over its tokens (decode: one row); outputs scatter-added into the residual, weighted.
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = routed[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n == 0) continue;
    float* xe = scratch(*r.ws, kExpertIn, n * H);
    float* gu = scratch(*r.ws, kExpertGateUp, n * 2 * Im);  // rows [gate | up]
    float* ye = scratch(*r.ws, kExpertOut, n * H);
    const EngineThreads row_threads = th.when(n >= 16);  // few rows: copying is cheaper than waking threads
    parallel_for(n, row_threads, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i)
        std::memcpy(xe + i * H, h + rows[static_cast<size_t>(i)].first * H, static_cast<size_t>(H) * sizeof(float));
    });
    gate_up[static_cast<size_t>(e)].forward(xe, H, gu, 2 * Im, n, th, false, prec);
    silu_mul(gu, gu + Im, n, Im, 2 * Im, row_threads);
    down_proj[static_cast<size_t>(e)].forward(gu, 2 * Im, ye, H, n, th, false, prec);
    // Each token appears at most once per expert, so rows scatter to distinct residual rows.
    parallel_for(n, row_threads, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        const auto [t, w] = rows[static_cast<size_t>(i)];
        float* xr = x + t * H;
        const float* yr = ye + i * H;
        for (int64_t j = 0; j < H; ++j) xr[j] += w * yr[j];
      }
    });
  }

  if (!has_shared) return;
  if (!c.moe.shared_expert_gated) {
    shared.forward(r, h, x, kSharedGateUp);  // added straight into the residual
    return;
  }
  float* score = scratch(*r.ws, kSharedScore, T);
  float* ys = scratch(*r.ws, kExpertOut, T * H);
  shared.forward(r, h, ys, kSharedGateUp, /*accumulate=*/false);
  shared_gate.forward(h, H, score, 1, T, th, false, prec);
  parallel_for(T, th.when(T >= 16), [&](int64_t b, int64_t end) {
    for (int64_t t = b; t < end; ++t) {
      const float gate = 1.0f / (1.0f + std::exp(-score[t]));
      float* xr = x + t * H;
      const float* yr = ys + t * H;
      for (int64_t j = 0; j < H; ++j) xr[j] += gate * yr[j];
    }
  });
}

}  // namespace hanpu::model
