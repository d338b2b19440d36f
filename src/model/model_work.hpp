// The arithmetic and the weight bytes of one forward call, per part of the model, counted from
// the model description: what bench-model divides by the measured times to print achieved
// GFLOP/s and weight GB/s next to the machine's measured FMA peak and bandwidth (issue: every
// figure next to the limit). The parts are ForwardTimes' (hanpu/model.hpp).
#pragma once

#include <cstdint>

#include "hanpu/model.hpp"

namespace hanpu::model {

struct PartWork {
  double flops = 0;         // 2 x multiply-adds
  double weight_bytes = 0;  // distinct weight bytes the part reads
};

struct ForwardWork {
  PartWork linear_projections;  // GDN/KDA in/out projections (incl. KDA's low-rank gates)
  PartWork linear_engine;       // the LA engine: chunked prefill, or the recurrent step in decode
  PartWork attention_projections;  // q/k/v/o (+ gate) or MLA's down/up projections and absorptions
  PartWork attention_core;      // softmax attention over the cache (causal triangle)
  PartWork mlp;                 // dense SwiGLU and MoE (router, the experts used, shared expert)
  PartWork lm_head;             // the logit rows computed
  PartWork total() const;
  ForwardWork& operator+=(const ForwardWork& other);  // part by part (e.g. over decode steps)
};

/// What the projections' format changes in the count.
struct ProjectionWork {
  double bytes_per_weight = 2.0;  // bf16
  /// Where a part's weights are in other formats than the average (a GGUF file's Q6_K LM head beside
  /// Q4_K projections): that part's bytes per weight; 0 takes bytes_per_weight.
  double linear_bytes_per_weight = 0, attention_bytes_per_weight = 0, mlp_bytes_per_weight = 0,
         lm_head_bytes_per_weight = 0;
  /// MLA keeps the latent form (no expanded W_uk is built: the load conversion is not element-wise,
  /// model_parts.hpp ProjectionLoad::elementwise).
  bool latent_only = false;
};

/// The work of one forward of `tokens` new tokens at positions start .. start+tokens-1, with
/// logits for every token (all_logits) or for the last only. Projections count one multiply-add
/// per weight per token; MoE layers the top-k experts and shared expert per token and, for the
/// bytes, the experts a batch of that many tokens is expected to touch under uniform routing.
/// The engine counts la_flops_per_token_head (exact triangles, chunk 64) in prefill and the
/// three K x V products of the recurrent step per token in decode (tokens == 1). MLA counts the
/// form MlaAttention::forward runs (MlaAttention::expand_pays): expanded, W_uk and W_uv over every
/// cached row and attention over nope + rope key dims and v value dims, or latent. Weight bytes
/// are `weights.bytes_per_weight` each (the registry row's: hanpu/weight_format.hpp; a GGUF file:
/// its tensor bytes over its parameters, the average of its block formats; the few unconverted
/// router rows are counted alike).
ForwardWork forward_work(const ModelConfig& c, int64_t start, int64_t tokens, bool all_logits,
                         const ProjectionWork& weights = {});

}  // namespace hanpu::model
