// Qwen3.5 text model: checkpoint loading (memory-mapped safetensors, sharded or not) and the
// forward pass (reference-models.md §2-3): per layer, (1+w) RMSNorm, then the GDN block or the
// gated full attention, residual add, (1+w) RMSNorm, SwiGLU MLP, residual add; final norm, LM head.
// Qwen3-Next runs the same code: its fused GDN projections are permuted into the Qwen3.5 layout at
// load time (qwen3next_layout.hpp), and its MoE blocks (§3.4) replace the MLP on the layers the
// config names.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "io/file_io.hpp"
#include "io/json_io.hpp"
#include "hanpu/la.hpp"
#include "hanpu/linear.hpp"
#include "hanpu/model.hpp"
#include "io/safetensors.hpp"
#include "model/qwen35_kernels.hpp"
#include "model/qwen35_ops.hpp"
#include "model/qwen3next_layout.hpp"

namespace hanpu {

namespace fs = std::filesystem;
using model::parallel_for;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Regular files only (a FIFO is an error, not a hang), size-limited, named in every error.
std::string read_text_file(const fs::path& p) { return read_regular_file(p.string(), "JSON file", kMaxJsonFileBytes); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[static_cast<size_t>(i)] = static_cast<float>(load_as_double(v.data, v.dtype, i));
  return out;
}

// y = x W^T with a BF16 weight through Bf16Linear, or an F32/F16 weight (converted to F32 once)
// through a plain loop: checkpoints are BF16, the F32 path exists so converted or test
// checkpoints still run.
class Projection {
 public:
  Projection() = default;
  Projection(const TensorView& w, const std::string& name) : out_(w.shape[0]), in_(w.shape[1]) {
    if (w.dtype == DType::BF16) bf16_.emplace(w, name);
    else f32_ = to_f32(w);
  }
  int64_t out_features() const { return out_; }
  void forward(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t M, int threads, bool accumulate,
               LinearPrecision precision = LinearPrecision::kExact) const {
    if (bf16_) {
      TensorView xv = TensorView::contiguous(const_cast<float*>(x), DType::F32, {M, in_});
      xv.stride[0] = ldx;
      TensorView yv = TensorView::contiguous(y, DType::F32, {M, out_});
      yv.stride[0] = ldy;
      bf16_->forward(xv, yv, threads, accumulate, precision);
      return;
    }
    parallel_for(out_, threads, [&](int64_t n0, int64_t n1) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) {
          const float* wr = f32_.data() + n * in_;
          const float* xr = x + m * ldx;
          float acc = 0;
          for (int64_t k = 0; k < in_; ++k) acc += xr[k] * wr[k];
          y[m * ldy + n] = accumulate ? y[m * ldy + n] + acc : acc;
        }
    });
  }

 private:
  int64_t out_ = 0, in_ = 0;
  std::optional<Bf16Linear> bf16_;
  std::vector<float> f32_;
};

struct GdnLayer {
  Projection in_qkv, in_z, in_b, in_a, out_proj;
  std::vector<float> conv_taps;  // [K, conv_dim]: conv1d.weight [conv_dim, 1, K] transposed
  std::vector<float> A_log, dt_bias, norm_w;
};

struct AttnLayer {
  Projection q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_norm, k_norm;  // 1 + w
};

// Qwen3-Next sparse MoE block (transformers' Qwen3NextSparseMoeBlock): a softmax router over the
// experts, the top-k SwiGLU experts weighted by their (renormalised) probabilities, plus a shared
// SwiGLU expert scaled by sigmoid(shared_expert_gate(x)).
struct MoeBlock {
  Projection router;  // mlp.gate.weight [experts, H]
  std::vector<Projection> gate_proj, up_proj, down_proj;  // per expert
  bool has_shared = false;
  Projection shared_gate, shared_up, shared_down, shared_expert_gate;  // shared_expert_gate: [1, H]
};

struct Layer {
  bool full = false;
  bool moe = false;  // MoE block instead of the dense MLP
  int64_t slot = 0;  // index among the layers of its kind (state / cache index)
  GdnLayer gdn;
  AttnLayer attn;
  MoeBlock experts;
  Projection gate_proj, up_proj, down_proj;
  std::vector<float> input_norm, post_norm;  // 1 + w
};

// Per-thread activation buffers reused across forward() calls: a prefill of 2K tokens needs
// ~150 MiB of activations per layer, and fresh allocations would page-fault (and zero) all of it
// for every layer. Each slot only grows. They are ByteBuffers, not vectors: 64-byte aligned rows and,
// from 2 MiB on, huge pages. The LA engine reads q/k/v as 512-byte pieces of rows 24 KiB apart (one
// per token and head); from malloc'd memory every piece straddled a cache line and every row cost a
// TLB miss, which made the engine ~2.5x slower here than on the same views standalone.
enum ScratchSlot {
  kX, kH, kGate, kUp, kMixed, kZ, kB, kA, kConv, kO, kQG, kQ, kAttn,
  kRouter, kExpertIn, kExpertGate, kExpertUp, kExpertOut, kSharedGate, kSharedUp, kSharedScore,
  kSlots
};
float* scratch(ScratchSlot slot, int64_t floats) {
  static thread_local ByteBuffer buffers[kSlots];
  ByteBuffer& b = buffers[slot];
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(floats, 1)) * sizeof(float);
  if (b.size() < bytes) b = ByteBuffer(bytes);  // contents are scratch: nothing to keep on growth
  return reinterpret_cast<float*>(b.data());
}

std::vector<float> one_plus(const TensorView& w) {
  std::vector<float> v = to_f32(w);
  for (float& x : v) x = 1.0f + x;
  return v;
}

// Where each tensor of a checkpoint lives, with shape/dtype checks that name file and tensor.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual TensorView find(const std::string& name, std::string* file) const = 0;
  virtual std::string where() const = 0;

  TensorView get(const std::string& name, const std::vector<int64_t>& shape, bool float_only = true) const {
    std::string file;
    TensorView v = find(name, &file);
    if (v.empty()) throw Error(where() + ": tensor '" + name + "' is missing");
    std::vector<int64_t> got(v.shape.begin(), v.shape.begin() + v.rank);
    if (got != shape)
      throw Error("'" + file + "': tensor '" + name + "' has shape " + shape_str(got) + ", expected " +
                  shape_str(shape) + " from config.json");
    if (float_only && v.dtype != DType::BF16 && v.dtype != DType::F32 && v.dtype != DType::F16)
      throw Error("'" + file + "': tensor '" + name + "' has dtype " + dtype_name(v.dtype) +
                  ", expected BF16, F32 or F16");
    return v;
  }
  bool has(const std::string& name) const {
    std::string file;
    return !find(name, &file).empty();
  }
};

class CheckpointSource : public TensorSource {
 public:
  CheckpointSource(const fs::path& dir, const ModelLoadOptions& opt, std::vector<SafetensorsFile>& files)
      : dir_(dir), files_(files) {
    const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    std::vector<std::string> shard_names;
    if (fs::exists(index)) {
      const nlohmann::json j = parse_json(read_text_file(index), index.string());
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw Error("'" + index.string() + "': no 'weight_map' object");
      std::map<std::string, size_t> shard_index;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) throw Error("'" + index.string() + "': weight_map['" + printable(it.key()) + "'] is " + json_got(it.value()) + ", expected a file name");
        const std::string f = it.value().get<std::string>();
        if (skipped(it.key())) continue;
        check_shard_name(index.string(), it.key(), f);
        auto [pos, fresh] = shard_index.emplace(f, shard_names.size());
        if (fresh) shard_names.push_back(f);
        map_[it.key()] = pos->second;
      }
    } else if (fs::exists(single)) {
      shard_names.push_back("model.safetensors");
    } else {
      throw Error("checkpoint '" + dir.string() + "': no model.safetensors or model.safetensors.index.json");
    }
    for (const std::string& name : shard_names) {
      const std::string path = (dir / name).string();
      files_.push_back(SafetensorsFile::map(path));
      const SafetensorsFile& f = files_.back();
      if (opt.progress && f.data_bytes() >= opt.progress_min_bytes) prefault_with_bar(f, name);
    }
    if (map_.empty())  // single file: every tensor is in file 0
      for (const std::string& n : files_[0].names())
        if (!skipped(n)) map_[n] = 0;
  }
  // Shards live in the checkpoint directory: an absolute name or a ".." component is refused, so an
  // index cannot make the loader open files outside it.
  static void check_shard_name(const std::string& index, const std::string& tensor, const std::string& f) {
    const fs::path p(f);
    bool ok = !f.empty() && p.is_relative() && f.find('\0') == std::string::npos;
    for (const fs::path& part : p) ok = ok && part != "..";
    ok = ok && p.has_filename();
    if (!ok)
      throw Error("'" + index + "': weight_map['" + printable(tensor) + "'] is \"" + printable(f) +
                  "\", expected a relative path inside the checkpoint directory (no '..', not absolute)");
  }
  static bool skipped(const std::string& name) {
    return name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0;
  }
  TensorView find(const std::string& name, std::string* file) const override {
    auto it = map_.find(name);
    if (it == map_.end()) return {};
    const SafetensorsFile& f = files_[it->second];
    *file = f.path();
    if (!f.has(name))
      throw Error("'" + f.path() + "': tensor '" + name + "' is missing (model.safetensors.index.json places it in this file)");
    return f.get(name);
  }
  std::string where() const override { return "checkpoint '" + dir_.string() + "'"; }
  bool any_with_prefix(const std::string& prefix) const {
    auto it = map_.lower_bound(prefix);
    return it != map_.end() && it->first.rfind(prefix, 0) == 0;
  }

 private:
  static void prefault_with_bar(const SafetensorsFile& f, const std::string& name) {
    const bool tty = isatty(STDERR_FILENO);
    int last = -1;
    f.prefault([&](uint64_t done, uint64_t total) {
      const int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
      if (pct == last) return;
      last = pct;
      if (!tty && pct != 100) return;
      constexpr int kWidth = 30;
      const int filled = pct * kWidth / 100;
      std::fprintf(stderr, "\rloading %s [%s%s] %3d%% %.2f/%.2f GB", name.c_str(), std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), pct, static_cast<double>(done) / 1e9,
                   static_cast<double>(total) / 1e9);
      if (pct == 100) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    });
  }
  fs::path dir_;
  std::vector<SafetensorsFile>& files_;
  std::map<std::string, size_t> map_;
};

// Random BF16 weights of the configured shapes, generated on request (synthetic models).
class SyntheticSource : public TensorSource {
 public:
  SyntheticSource(uint64_t seed, int threads, std::vector<ByteBuffer>& buffers)
      : seed_(seed), threads_(threads), buffers_(buffers) {}
  TensorView find(const std::string& name, std::string* file) const override { return {}; }
  std::string where() const override { return "synthetic model"; }
  // Uniform in [-a, a] with a = sqrt(3) * std: the variance of the real init, no normal sampling.
  TensorView make(const std::vector<int64_t>& shape, double stddev, double mean = 0.0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    buffers_.emplace_back(static_cast<size_t>(n) * 2);
    auto* p = reinterpret_cast<uint16_t*>(buffers_.back().data());
    const uint64_t stream = seed_ * 0x9E3779B97F4A7C15ull + (++counter_);
    const float a = static_cast<float>(std::sqrt(3.0) * stddev), m = static_cast<float>(mean);
    parallel_for(n, threads_, [&](int64_t b, int64_t e) {
      uint64_t s = stream ^ (static_cast<uint64_t>(b) * 0xD1B54A32D192ED03ull) ^ 1;
      uint64_t bits = 0;
      for (int64_t i = b; i < e; ++i) {
        if ((i - b) % 4 == 0) {  // xorshift64: one draw gives four 16-bit uniforms
          s ^= s << 13, s ^= s >> 7, s ^= s << 17;
          bits = s;
        }
        const float u = (static_cast<float>(bits & 0xFFFF) + 0.5f) * (1.0f / 65536.0f);  // (0, 1)
        bits >>= 16;
        const float v = m + a * (2.f * u - 1.f);
        uint32_t f;
        std::memcpy(&f, &v, 4);
        p[i] = static_cast<uint16_t>((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);  // round to nearest even
      }
    });
    return TensorView::contiguous(p, DType::BF16, shape);
  }

 private:
  uint64_t seed_;
  int threads_;
  std::vector<ByteBuffer>& buffers_;
  uint64_t counter_ = 0;
};

}  // namespace

struct Qwen35Model::Impl {
  Qwen35Config cfg;
  std::vector<SafetensorsFile> files;  // mapped checkpoint (keeps the weight views valid)
  std::vector<ByteBuffer> synthetic;   // synthetic weights
  std::vector<ByteBuffer> permuted;    // Qwen3-Next GDN projections in the Qwen3.5 row order
  uint64_t weight_bytes = 0;
  TensorView embed;  // [V, H]
  Projection lm_head;
  std::vector<float> final_norm;  // 1 + w
  std::vector<Layer> layers;
  std::vector<float> inv_freq;  // [rotary_dim / 2]

  // Builds every layer from `get(name, shape)`; `vec` gives 1-D float parameters.
  template <class Get>
  void build(Get&& get, const std::string& prefix, bool have_lm_head) {
    const Qwen35Config& c = cfg;
    const int64_t H = c.hidden_size;
    embed = get(prefix + "embed_tokens.weight", {c.vocab_size, H});
    final_norm = one_plus(get(prefix + "norm.weight", {H}));
    if (c.tie_word_embeddings || !have_lm_head) {
      if (!c.tie_word_embeddings) get("lm_head.weight", {c.vocab_size, H});  // throws: missing
      lm_head = Projection(embed, prefix + "embed_tokens.weight (tied LM head)");
    } else {
      lm_head = Projection(get("lm_head.weight", {c.vocab_size, H}), "lm_head.weight");
    }
    int64_t gdn_slot = 0, attn_slot = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = prefix + "layers." + std::to_string(i) + ".";
      Layer L;
      L.full = c.is_full_attention[static_cast<size_t>(i)];
      L.slot = L.full ? attn_slot++ : gdn_slot++;
      L.input_norm = one_plus(get(p + "input_layernorm.weight", {H}));
      L.post_norm = one_plus(get(p + "post_attention_layernorm.weight", {H}));
      auto proj = [&](const std::string& n, int64_t out, int64_t in) { return Projection(get(n, {out, in}), n); };
      if (L.full) {
        const std::string a = p + "self_attn.";
        L.attn.q_proj = proj(a + "q_proj.weight", c.num_heads * c.head_dim * 2, H);
        L.attn.k_proj = proj(a + "k_proj.weight", c.num_kv_heads * c.head_dim, H);
        L.attn.v_proj = proj(a + "v_proj.weight", c.num_kv_heads * c.head_dim, H);
        L.attn.o_proj = proj(a + "o_proj.weight", H, c.num_heads * c.head_dim);
        L.attn.q_norm = one_plus(get(a + "q_norm.weight", {c.head_dim}));
        L.attn.k_norm = one_plus(get(a + "k_norm.weight", {c.head_dim}));
      } else {
        const std::string g = p + "linear_attn.";
        const int64_t nv = c.linear_num_value_heads;
        if (c.fused_gdn_projections) {
          build_fused_gdn_projections(L.gdn, get(g + "in_proj_qkvz.weight", {c.gdn_conv_dim() + c.gdn_value_dim(), H}),
                                      get(g + "in_proj_ba.weight", {2 * nv, H}), g);
        } else {
          L.gdn.in_qkv = proj(g + "in_proj_qkv.weight", c.gdn_conv_dim(), H);
          L.gdn.in_z = proj(g + "in_proj_z.weight", c.gdn_value_dim(), H);
          L.gdn.in_b = proj(g + "in_proj_b.weight", nv, H);
          L.gdn.in_a = proj(g + "in_proj_a.weight", nv, H);
        }
        L.gdn.out_proj = proj(g + "out_proj.weight", H, c.gdn_value_dim());
        const std::vector<float> w = to_f32(get(g + "conv1d.weight", {c.gdn_conv_dim(), 1, c.linear_conv_kernel}));
        L.gdn.conv_taps.resize(w.size());
        for (int64_t ch = 0; ch < c.gdn_conv_dim(); ++ch)
          for (int64_t j = 0; j < c.linear_conv_kernel; ++j)
            L.gdn.conv_taps[static_cast<size_t>(j * c.gdn_conv_dim() + ch)] =
                w[static_cast<size_t>(ch * c.linear_conv_kernel + j)];
        L.gdn.A_log = to_f32(get(g + "A_log", {nv}));
        L.gdn.dt_bias = to_f32(get(g + "dt_bias", {nv}));
        L.gdn.norm_w = to_f32(get(g + "norm.weight", {c.linear_value_head_dim}));
      }
      if (c.layer_is_moe(i)) {
        L.moe = true;
        const std::string m = p + "mlp.";
        const int64_t E = c.num_experts, Im = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
        L.experts.router = proj(m + "gate.weight", E, H);
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = m + "experts." + std::to_string(e) + ".";
          L.experts.gate_proj.push_back(proj(x + "gate_proj.weight", Im, H));
          L.experts.up_proj.push_back(proj(x + "up_proj.weight", Im, H));
          L.experts.down_proj.push_back(proj(x + "down_proj.weight", H, Im));
        }
        if (Is > 0) {
          L.experts.has_shared = true;
          L.experts.shared_gate = proj(m + "shared_expert.gate_proj.weight", Is, H);
          L.experts.shared_up = proj(m + "shared_expert.up_proj.weight", Is, H);
          L.experts.shared_down = proj(m + "shared_expert.down_proj.weight", H, Is);
          L.experts.shared_expert_gate = proj(m + "shared_expert_gate.weight", 1, H);
        }
      } else {
        L.gate_proj = proj(p + "mlp.gate_proj.weight", c.intermediate_size, H);
        L.up_proj = proj(p + "mlp.up_proj.weight", c.intermediate_size, H);
        L.down_proj = proj(p + "mlp.down_proj.weight", H, c.intermediate_size);
      }
      layers.push_back(std::move(L));
    }
    inv_freq.resize(static_cast<size_t>(c.rotary_dim / 2));
    for (int64_t i = 0; i < c.rotary_dim / 2; ++i)  // as transformers: float32 theta^(2i/rot)
      inv_freq[static_cast<size_t>(i)] =
          1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim));
  }

  // Qwen3-Next: in_proj_qkvz / in_proj_ba rows permuted into owned copies in the Qwen3.5 order
  // [q | k | v | z] and [b | a]; the four projections are views of those copies.
  void build_fused_gdn_projections(GdnLayer& gdn, const TensorView& qkvz, const TensorView& ba, const std::string& g) {
    const Qwen35Config& c = cfg;
    const int64_t H = c.hidden_size, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
    const int64_t cd = c.gdn_conv_dim(), vd = c.gdn_value_dim();
    permuted.push_back(model::gather_rows(
        qkvz, model::qwen3next_qkvz_source_rows(nk, nv, c.linear_key_head_dim, c.linear_value_head_dim),
        g + "in_proj_qkvz.weight"));
    std::byte* rows = permuted.back().data();
    const size_t row_bytes = static_cast<size_t>(H) * dtype_size(qkvz.dtype);
    gdn.in_qkv = Projection(TensorView::contiguous(rows, qkvz.dtype, {cd, H}), g + "in_proj_qkvz.weight (q|k|v rows)");
    gdn.in_z = Projection(TensorView::contiguous(rows + static_cast<size_t>(cd) * row_bytes, qkvz.dtype, {vd, H}),
                          g + "in_proj_qkvz.weight (z rows)");
    permuted.push_back(model::gather_rows(ba, model::qwen3next_ba_source_rows(nk, nv), g + "in_proj_ba.weight"));
    rows = permuted.back().data();
    const size_t ba_row_bytes = static_cast<size_t>(H) * dtype_size(ba.dtype);
    gdn.in_b = Projection(TensorView::contiguous(rows, ba.dtype, {nv, H}), g + "in_proj_ba.weight (b rows)");
    gdn.in_a = Projection(TensorView::contiguous(rows + static_cast<size_t>(nv) * ba_row_bytes, ba.dtype, {nv, H}),
                          g + "in_proj_ba.weight (a rows)");
  }

  void moe_forward(const Layer& L, const float* h, float* x, int64_t T, const ForwardOptions& opt) const;
  void gdn_forward(const Layer& L, Qwen35State& st, const float* h, float* x, int64_t T, const ForwardOptions& opt,
                   ForwardTimes* tm) const;
  void attn_forward(const Layer& L, Qwen35State& st, const float* h, float* x, int64_t T, const ForwardOptions& opt,
                    ForwardTimes* tm) const;
};

Qwen35Model::Qwen35Model() : impl_(std::make_unique<Impl>()) {}
Qwen35Model::Qwen35Model(Qwen35Model&&) noexcept = default;
Qwen35Model& Qwen35Model::operator=(Qwen35Model&&) noexcept = default;
Qwen35Model::~Qwen35Model() = default;

const Qwen35Config& Qwen35Model::config() const { return impl_->cfg; }
uint64_t Qwen35Model::weight_bytes() const { return impl_->weight_bytes; }

Qwen35Model Qwen35Model::load(const std::string& dir, const ModelLoadOptions& opt) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw Error("checkpoint '" + dir + "': not a directory");
  const fs::path cfg_path = d / "config.json";
  if (!fs::exists(cfg_path)) throw Error("checkpoint '" + dir + "': no config.json");
  Qwen35Model m;
  Impl& im = *m.impl_;
  im.cfg = parse_qwen35_config(read_text_file(cfg_path), cfg_path.string());
  CheckpointSource src(d, opt, im.files);
  for (const SafetensorsFile& f : im.files) im.weight_bytes += f.data_bytes();
  // Official checkpoints are Qwen3_5ForConditionalGeneration (model.language_model.*);
  // text-only conversions are Qwen3_5ForCausalLM (model.*).
  const std::string prefix = src.any_with_prefix("model.language_model.") ? "model.language_model." : "model.";
  im.build([&](const std::string& name, const std::vector<int64_t>& shape) { return src.get(name, shape); }, prefix,
           src.has("lm_head.weight"));
  return m;
}

Qwen35Model Qwen35Model::synthetic(const Qwen35Config& c, uint64_t seed, int threads) {
  Qwen35Model m;
  Impl& im = *m.impl_;
  im.cfg = c;
  SyntheticSource src(seed, threads, im.synthetic);
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape) -> TensorView {
    auto ends = [&](const char* s) {
      const std::string t(s);
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    // Scales as a trained model's: projections ~ 1/sqrt(fan_in) so activations stay O(1);
    // norm offsets near 0 (multiplier 1 + w), the gated norm's raw weight near 1; decays moderate.
    if (ends("A_log")) return src.make(shape, 0.5, 0.5);
    if (ends("dt_bias")) return src.make(shape, 0.5);
    if (ends("linear_attn.norm.weight")) return src.make(shape, 0.1, 1.0);
    if (ends("norm.weight")) return src.make(shape, 0.1);
    if (ends("conv1d.weight")) return src.make(shape, 0.5);
    if (ends("embed_tokens.weight")) return src.make(shape, 1.0);
    return src.make(shape, 1.0 / std::sqrt(static_cast<double>(shape.back())));
  };
  im.build(get, "model.", !c.tie_word_embeddings);
  for (const ByteBuffer& b : im.synthetic) im.weight_bytes += b.size();
  return m;
}

size_t Qwen35State::bytes() const {
  size_t n = 0;
  for (const Tensor& t : conv_state) n += t.bytes();
  for (const Tensor& t : recurrent_state) n += t.bytes();
  for (const auto& v : key_cache) n += v.capacity() * sizeof(float);
  for (const auto& v : value_cache) n += v.capacity() * sizeof(float);
  return n;
}

Qwen35State Qwen35Model::new_state() const {
  const Qwen35Config& c = impl_->cfg;
  Qwen35State s;
  for (int64_t i = 0; i < c.num_gdn_layers(); ++i) {
    s.conv_state.emplace_back(DType::F32, std::vector<int64_t>{c.linear_conv_kernel - 1, c.gdn_conv_dim()});
    s.recurrent_state.emplace_back(DType::F32, std::vector<int64_t>{1, c.linear_num_value_heads,
                                                                    c.linear_key_head_dim, c.linear_value_head_dim});
  }
  s.key_cache.resize(static_cast<size_t>(c.num_attention_layers()));
  s.value_cache.resize(static_cast<size_t>(c.num_attention_layers()));
  return s;
}

void Qwen35Model::Impl::gdn_forward(const Layer& L, Qwen35State& st, const float* h, float* x, int64_t T,
                                    const ForwardOptions& opt, ForwardTimes* tm) const {
  const Qwen35Config& c = cfg;
  const int64_t H = c.hidden_size, cd = c.gdn_conv_dim(), kd = c.gdn_key_dim(), vd = c.gdn_value_dim();
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int th = opt.threads;
  auto t0 = Clock::now();
  float* mixed = scratch(kMixed, T * cd);
  float* z = scratch(kZ, T * vd);
  float* b = scratch(kB, T * nv);
  float* a = scratch(kA, T * nv);
  L.gdn.in_qkv.forward(h, H, mixed, cd, T, th, false, opt.precision);
  L.gdn.in_z.forward(h, H, z, vd, T, th, false, opt.precision);
  L.gdn.in_b.forward(h, H, b, nv, T, th, false, opt.precision);
  L.gdn.in_a.forward(h, H, a, nv, T, th, false, opt.precision);
  if (tm) tm->gdn_proj += seconds_since(t0);

  t0 = Clock::now();
  float* conv = scratch(kConv, T * cd);
  model::causal_conv_silu(mixed, conv, T, cd, L.gdn.conv_taps.data(), c.linear_conv_kernel,
                          st.conv_state[static_cast<size_t>(L.slot)].ptr<float>(), th);
  if (tm) tm->gdn_conv += seconds_since(t0);
  t0 = Clock::now();

  LaInputs in;
  auto view = [&](float* base, int64_t heads, int64_t dim) {
    TensorView v = TensorView::contiguous(base, DType::F32, {1, T, heads, dim});
    v.stride[0] = T * cd;
    v.stride[1] = cd;
    return v;
  };
  in.q = view(conv, nk, dk);
  in.k = view(conv + kd, nk, dk);
  in.v = view(conv + 2 * kd, nv, dv);
  in.g = TensorView::contiguous(a, DType::F32, {1, T, nv});
  in.beta = TensorView::contiguous(b, DType::F32, {1, T, nv});
  in.A_log = TensorView::contiguous(const_cast<float*>(L.gdn.A_log.data()), DType::F32, {nv});
  in.dt_bias = TensorView::contiguous(const_cast<float*>(L.gdn.dt_bias.data()), DType::F32, {nv});
  LaOptions lo;
  lo.qk_l2norm = true;
  lo.gate_in_kernel = true;  // g = -exp(A_log) * softplus(a + dt_bias), in fp32
  lo.beta_sigmoid = true;
  float* o = scratch(kO, T * vd);
  TensorView ov = TensorView::contiguous(o, DType::F32, {1, T, nv, dv});
  Tensor& S = st.recurrent_state[static_cast<size_t>(L.slot)];
  if (T == 1) {
    gdn_decode(in, lo, S.view(), ov, th);
  } else {
    in.initial_state = S.view();
    Tensor next(DType::F32, S.shape());
    ExecOptions ex;
    ex.threads = th;
    gdn_prefill(in, lo, LaOutputs{ov, next.view()}, ex);
    S = std::move(next);
  }
  if (tm) tm->gdn_engine += seconds_since(t0);
  t0 = Clock::now();
  model::gated_rms_norm(o, z, T, nv, dv, L.gdn.norm_w.data(), static_cast<float>(c.rms_norm_eps), th);
  if (tm) tm->gdn_norm += seconds_since(t0);

  t0 = Clock::now();
  L.gdn.out_proj.forward(o, vd, x, H, T, th, true, opt.precision);
  if (tm) tm->gdn_proj += seconds_since(t0);
}

void Qwen35Model::Impl::attn_forward(const Layer& L, Qwen35State& st, const float* h, float* x, int64_t T,
                                     const ForwardOptions& opt, ForwardTimes* tm) const {
  const Qwen35Config& c = cfg;
  const int64_t H = c.hidden_size, nq = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const int th = opt.threads;
  const int64_t p0 = st.position;
  auto t0 = Clock::now();
  float* qg = scratch(kQG, T * nq * 2 * hd);
  auto& kc = st.key_cache[static_cast<size_t>(L.slot)];
  auto& vc = st.value_cache[static_cast<size_t>(L.slot)];
  const size_t row = static_cast<size_t>(nkv * hd);
  kc.resize(static_cast<size_t>(p0 + T) * row);
  vc.resize(static_cast<size_t>(p0 + T) * row);
  float* knew = kc.data() + static_cast<size_t>(p0) * row;
  float* vnew = vc.data() + static_cast<size_t>(p0) * row;
  L.attn.q_proj.forward(h, H, qg, nq * 2 * hd, T, th, false, opt.precision);
  L.attn.k_proj.forward(h, H, knew, nkv * hd, T, th, false, opt.precision);
  L.attn.v_proj.forward(h, H, vnew, nkv * hd, T, th, false, opt.precision);
  if (tm) tm->attn_proj += seconds_since(t0);

  t0 = Clock::now();
  // Query heads out of the per-head [query | gate] interleave, normed and rotated; keys normed
  // and rotated in the cache.
  const int64_t half = c.rotary_dim / 2;
  float* q = scratch(kQ, T * nq * hd);
  const float eps = static_cast<float>(c.rms_norm_eps);
  parallel_for(T, T >= 8 ? th : 1, [&](int64_t t_begin, int64_t t_end) {
    std::vector<float> cs(static_cast<size_t>(c.rotary_dim));
    for (int64_t t = t_begin; t < t_end; ++t) {
      const float pos = static_cast<float>(p0 + t);
      for (int64_t i = 0; i < half; ++i) {  // as transformers: float32 angle, then cos/sin
        const float ang = pos * inv_freq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(ang)));
        cs[static_cast<size_t>(half + i)] = static_cast<float>(std::sin(static_cast<double>(ang)));
      }
      for (int64_t hh = 0; hh < nq; ++hh) {
        float* dst = q + (t * nq + hh) * hd;
        model::rms_norm_rows(qg + (t * nq + hh) * 2 * hd, hd, dst, hd, 1, hd, L.attn.q_norm.data(), eps, 1);
        model::rope_rotate(dst, c.rotary_dim, cs.data(), cs.data() + half);
      }
      for (int64_t hh = 0; hh < nkv; ++hh) {
        float* kr = knew + t * nkv * hd + hh * hd;
        model::rms_norm_rows(kr, hd, kr, hd, 1, hd, L.attn.k_norm.data(), eps, 1);
        model::rope_rotate(kr, c.rotary_dim, cs.data(), cs.data() + half);
      }
    }
  });
  float* attn = scratch(kAttn, T * nq * hd);
  model::causal_attention(q, kc.data(), vc.data(), attn, T, p0, nq, nkv, hd,
                          1.0f / std::sqrt(static_cast<float>(hd)), th);
  parallel_for(T, T >= 8 ? th : 1, [&](int64_t t_begin, int64_t t_end) {  // sigmoid output gate
    for (int64_t t = t_begin; t < t_end; ++t)
      for (int64_t hh = 0; hh < nq; ++hh) {
        float* o = attn + (t * nq + hh) * hd;
        const float* g = qg + (t * nq + hh) * 2 * hd + hd;
        model::simd_sigmoid_mul_row(o, g, static_cast<size_t>(hd));
      }
  });
  if (tm) tm->attn_core += seconds_since(t0);

  t0 = Clock::now();
  L.attn.o_proj.forward(attn, nq * hd, x, H, T, th, true, opt.precision);
  if (tm) tm->attn_proj += seconds_since(t0);
}

void Qwen35Model::Impl::moe_forward(const Layer& L, const float* h, float* x, int64_t T,
                                    const ForwardOptions& opt) const {
  const Qwen35Config& c = cfg;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
  const int th = opt.threads;
  const MoeBlock& B = L.experts;

  // Router: softmax over the experts in fp32, top-k, optionally renormalised (Qwen3NextTopKRouter).
  float* logits = scratch(kRouter, T * E);
  B.router.forward(h, H, logits, E, T, th, false, opt.precision);
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));  // per expert: (token, weight)
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::vector<float> prob(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += prob[static_cast<size_t>(e)] = std::exp(l[e] - mx);
    for (float& p : prob) p /= sum;
    for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
    // Highest probability first; ties to the lower expert index.
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
      const float pa = prob[static_cast<size_t>(a)], pb = prob[static_cast<size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    float top_sum = 0;
    for (int64_t k = 0; k < K; ++k) top_sum += prob[static_cast<size_t>(order[static_cast<size_t>(k)])];
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = order[static_cast<size_t>(k)];
      const float w = prob[static_cast<size_t>(e)];
      routed[static_cast<size_t>(e)].emplace_back(t, c.norm_topk_prob ? w / top_sum : w);
    }
  }

  // Experts: the rows routed to expert e gathered into one block, so a prefill runs each expert as
  // a GEMM over its tokens (decode: one row); outputs scatter-added into the residual, weighted.
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = routed[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n == 0) continue;
    float* xe = scratch(kExpertIn, n * H);
    float* ge = scratch(kExpertGate, n * Im);
    float* ue = scratch(kExpertUp, n * Im);
    float* ye = scratch(kExpertOut, n * H);
    const int row_threads = n >= 16 ? th : 1;  // few rows: copying is cheaper than waking threads
    parallel_for(n, row_threads, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i)
        std::memcpy(xe + i * H, h + rows[static_cast<size_t>(i)].first * H, static_cast<size_t>(H) * sizeof(float));
    });
    B.gate_proj[static_cast<size_t>(e)].forward(xe, H, ge, Im, n, th, false, opt.precision);
    B.up_proj[static_cast<size_t>(e)].forward(xe, H, ue, Im, n, th, false, opt.precision);
    model::silu_mul(ge, ue, n, Im, Im, row_threads);
    B.down_proj[static_cast<size_t>(e)].forward(ge, Im, ye, H, n, th, false, opt.precision);
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

  if (!B.has_shared) return;
  const int64_t Is = c.shared_expert_intermediate_size;
  float* sg = scratch(kSharedGate, T * Is);
  float* su = scratch(kSharedUp, T * Is);
  float* score = scratch(kSharedScore, T);
  float* ys = scratch(kExpertOut, T * H);
  B.shared_gate.forward(h, H, sg, Is, T, th, false, opt.precision);
  B.shared_up.forward(h, H, su, Is, T, th, false, opt.precision);
  model::silu_mul(sg, su, T, Is, Is, th);
  B.shared_down.forward(sg, Is, ys, H, T, th, false, opt.precision);
  B.shared_expert_gate.forward(h, H, score, 1, T, th, false, opt.precision);
  parallel_for(T, T >= 16 ? th : 1, [&](int64_t b, int64_t end) {
    for (int64_t t = b; t < end; ++t) {
      const float gate = 1.0f / (1.0f + std::exp(-score[t]));
      float* xr = x + t * H;
      const float* yr = ys + t * H;
      for (int64_t j = 0; j < H; ++j) xr[j] += gate * yr[j];
    }
  });
}

Tensor Qwen35Model::forward(Qwen35State& st, std::span<const int32_t> ids, const ForwardOptions& opt) const {
  const Impl& im = *impl_;
  const Qwen35Config& c = im.cfg;
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size, I = c.intermediate_size;
  if (T == 0) throw Error("forward: no input tokens");
  for (int64_t t = 0; t < T; ++t)
    if (ids[static_cast<size_t>(t)] < 0 || ids[static_cast<size_t>(t)] >= c.vocab_size)
      throw Error("forward: token id " + std::to_string(ids[static_cast<size_t>(t)]) + " at position " +
                  std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (st.conv_state.size() != static_cast<size_t>(c.num_gdn_layers()) ||
      st.key_cache.size() != static_cast<size_t>(c.num_attention_layers()))
    throw Error("forward: the state was not made by this model's new_state()");
  ForwardTimes local;
  ForwardTimes* tm = opt.times ? opt.times : &local;
  const int th = opt.threads;
  const float eps = static_cast<float>(c.rms_norm_eps);

  auto t0 = Clock::now();
  float* x = scratch(kX, T * H);
  float* h = scratch(kH, T * H);
  parallel_for(T, T >= 16 ? th : 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t id = ids[static_cast<size_t>(t)];
      float* xr = x + t * H;
      if (im.embed.dtype == DType::BF16) {
        const auto* src = static_cast<const uint16_t*>(im.embed.data) + id * H;
        for (int64_t i = 0; i < H; ++i) xr[i] = bf16_to_f32(src[i]);
      } else {
        for (int64_t i = 0; i < H; ++i) xr[i] = static_cast<float>(load_as_double(im.embed.data, im.embed.dtype, id * H + i));
      }
    }
  });
  tm->embed += seconds_since(t0);

  const int64_t dense_I = c.num_moe_layers() == c.num_layers ? 0 : I;  // all-MoE models use no dense MLP buffers
  float* gate = scratch(kGate, T * dense_I);
  float* up = scratch(kUp, T * dense_I);
  for (const Layer& L : im.layers) {
    t0 = Clock::now();
    model::rms_norm_rows(x, H, h, H, T, H, L.input_norm.data(), eps, th);
    tm->norms += seconds_since(t0);
    if (L.full) im.attn_forward(L, st, h, x, T, opt, tm);
    else im.gdn_forward(L, st, h, x, T, opt, tm);
    t0 = Clock::now();
    model::rms_norm_rows(x, H, h, H, T, H, L.post_norm.data(), eps, th);
    tm->norms += seconds_since(t0);
    t0 = Clock::now();
    if (L.moe) {
      im.moe_forward(L, h, x, T, opt);
    } else {
      L.gate_proj.forward(h, H, gate, I, T, th, false, opt.precision);
      L.up_proj.forward(h, H, up, I, T, th, false, opt.precision);
      model::silu_mul(gate, up, T, I, I, th);
      L.down_proj.forward(gate, I, x, H, T, th, true, opt.precision);
    }
    tm->mlp += seconds_since(t0);
  }
  st.position += T;

  t0 = Clock::now();
  const int64_t rows = opt.all_logits ? T : 1;
  const float* last = x + (T - rows) * H;
  model::rms_norm_rows(last, H, h, H, rows, H, im.final_norm.data(), eps, th);
  tm->norms += seconds_since(t0);
  t0 = Clock::now();
  Tensor logits(DType::F32, {rows, c.vocab_size});
  im.lm_head.forward(h, H, logits.ptr<float>(), c.vocab_size, rows, th, false, opt.precision);
  tm->lm_head += seconds_since(t0);
  return logits;
}

}  // namespace hanpu
