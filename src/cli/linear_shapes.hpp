// The projection shapes of Qwen3.5-0.8B and 2B, shared by `hanpu bench-linear` and
// benchmarks/linear_libraries.cpp (hanpu's kernels next to OpenBLAS and oneDNN on the same shapes).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hanpu {

struct ProjectionShape {
  std::string name;
  int64_t K, N;
  int per_model;  // how many times one forward of Qwen3.5-0.8B (all 24 layers) runs this shape
};

// Qwen3.5-0.8B projections, [out, in] as in docs/MODEL.md (Qwen3.5-0.8B's config.json): hidden 1024, 18 GDN layers
// (in_proj_qkv 6144 + z 2048 + b 16 + a 16 stacked: the same input), 6 attention layers (q with
// its gate 4096, k and v 512 each: one stacked projection), outputs 2048 -> 1024, 24 SwiGLU MLPs (gate and up
// 3584 each, stacked), LM head 248320 (tied embeddings; in prefill only the last position needs it).
const std::vector<ProjectionShape> kQwen35Projections0p8B{
    {"gdn.in_proj_qkvzba", 1024, 8224, 18}, {"gdn.out_proj", 2048, 1024, 18}, {"attn.qkv_proj", 1024, 5120, 6},
    {"attn.o_proj", 2048, 1024, 6},         {"mlp.gate_up", 1024, 7168, 24},
    {"mlp.down", 3584, 1024, 24},           {"lm_head", 1024, 248320, 0},
};

// Qwen3.5-2B projections (hidden 2048; GDN 16 qk / 16 v heads x 128, so the same stacked 8224
// rows as 0.8B; attention 8 q / 2 kv heads x 256; MLP 6144; docs/MODEL.md's qwen3.5-2b preset).
const std::vector<ProjectionShape> kQwen35Projections2B{
    {"gdn.in_proj_qkvzba", 2048, 8224, 18}, {"gdn.out_proj", 2048, 2048, 18}, {"attn.qkv_proj", 2048, 5120, 6},
    {"attn.o_proj", 2048, 2048, 6},         {"mlp.gate_up", 2048, 12288, 24},
    {"mlp.down", 6144, 2048, 24},           {"lm_head", 2048, 248320, 0},
};

// The models the benchmarks take by --model: key, the label they print ("Qwen3.5-<label>"), shapes.
struct ProjectionModel {
  const char* key;
  const char* label;
  const std::vector<ProjectionShape>* shapes;
};
inline const std::vector<ProjectionModel>& qwen35_projection_models() {
  static const std::vector<ProjectionModel> models{{"0.8b", "0.8B", &kQwen35Projections0p8B},
                                                   {"2b", "2B", &kQwen35Projections2B}};
  return models;
}
// The keys, for CLI11's IsMember check.
inline std::vector<std::string> qwen35_projection_model_keys() {
  std::vector<std::string> keys;
  for (const ProjectionModel& m : qwen35_projection_models()) keys.push_back(m.key);
  return keys;
}
inline const ProjectionModel& qwen35_projection_model(const std::string& key) {
  std::string known;
  for (const ProjectionModel& m : qwen35_projection_models()) {
    if (key == m.key) return m;
    known += (known.empty() ? "" : " or ") + std::string(m.key);
  }
  throw std::invalid_argument("--model: got '" + key + "', expected " + known);
}
inline const std::vector<ProjectionShape>& qwen35_projections(const std::string& key) {
  return *qwen35_projection_model(key).shapes;
}

}  // namespace hanpu
