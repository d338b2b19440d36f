// The hybrid model runtime (include/hanpu/model.hpp): checkpoint loading (memory-mapped
// safetensors, sharded or not) or synthetic weights, the per-layer composition of blocks
// (blocks.hpp) the config describes, and the forward pass: per layer, RMSNorm, token mixer,
// residual add, RMSNorm, channel mixer, residual add; final norm, LM head. The same code runs
// every family; what differs is the config (parsers in *_config.cpp) and the blocks it names.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>
#include <variant>

#include "hanpu/model.hpp"
#include "io/file_io.hpp"
#include "model/gguf_export.hpp"
#include "io/json_io.hpp"
#include "io/safetensors.hpp"
#include "model/blocks.hpp"
#include "model/gguf_arch.hpp"
#include "model/layer_ops.hpp"

namespace hanpu {

namespace fs = std::filesystem;
using model::Clock;
using model::parallel_for;
using model::scratch;
using model::seconds_since;

namespace {

// Regular files only (a FIFO is an error, not a hang), size-limited, named in every error.
std::string read_text_file(const fs::path& p) { return read_regular_file(p.string(), "JSON file", kMaxJsonFileBytes); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
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
  void release(const std::string& name) const {
    auto it = map_.find(name);
    if (it != map_.end()) files_[it->second].release_pages(name);
  }
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
  SyntheticSource(uint64_t seed, EngineThreads threads, std::vector<ByteBuffer>& buffers)
      : seed_(seed), threads_(threads), buffers_(buffers) {}
  TensorView find(const std::string& name, std::string* file) const override { return {}; }
  std::string where() const override { return "synthetic model"; }
  // Uniform in [-a, a] with a = sqrt(3) * std: the variance of the real init, no normal sampling.
  // Tensor `name` of `shape`: fresh random bytes (each call draws new ones), kept until release().
  TensorView make(const std::string& name, const std::vector<int64_t>& shape, double stddev, double mean = 0.0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    latest_[name] = buffers_.size();
    made_bytes_ += static_cast<uint64_t>(n) * 2;
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
  // The model copied tensor `name` (stacked projections): its bytes are freed.
  void release(const std::string& name) {
    auto it = latest_.find(name);
    if (it != latest_.end()) buffers_[it->second] = ByteBuffer();
  }
  // Bytes of every tensor made: the model's weights, whether they live in the buffers or in the
  // copies the model made of released ones.
  uint64_t made_bytes() const { return made_bytes_; }

 private:
  uint64_t seed_;
  EngineThreads threads_;
  std::vector<ByteBuffer>& buffers_;
  uint64_t counter_ = 0;
  uint64_t made_bytes_ = 0;
  std::map<std::string, size_t> latest_;  // tensor name -> its buffer
};

}  // namespace

// One decoder layer: its token mixer and its channel mixer, each one of the blocks of blocks.hpp
// (the one the config names), and its two norms.
using TokenMixerBlock = std::variant<model::GdnMixer, model::KdaMixer, model::GatedAttention, model::MlaAttention>;
using ChannelMixerBlock = std::variant<model::SwiGluMlp, model::MoeBlock>;

struct Layer {
  TokenMixerBlock token_mixer;
  ChannelMixerBlock channel_mixer;
  int64_t slot = 0;  // index among the layers of its kind (linear: state index; attention: cache index)
  std::vector<float> input_norm, post_norm;  // norm multipliers

  // The token mixer on rows h of one sequence, with that sequence's state of this layer.
  void mix_tokens(const model::BlockRun& run, HybridState& st, const float* h, float* x) const {
    const size_t s = static_cast<size_t>(slot);
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<M, model::GdnMixer> || std::is_same_v<M, model::KdaMixer>)
            m.forward(run, st.conv_state[s], st.recurrent_state[s], h, x);
          else if constexpr (std::is_same_v<M, model::GatedAttention>)
            m.forward(run, st.key_cache[s], st.value_cache[s], h, x);
          else
            m.forward(run, st.key_cache[s], h, x);
        },
        token_mixer);
  }
  void mix_channels(const model::BlockRun& run, const float* h, float* x) const {
    std::visit([&](const auto& m) { m.forward(run, h, x); }, channel_mixer);
  }
};

struct HybridModel::Impl {
  ModelConfig cfg;
  std::shared_ptr<Engine> engine;  // never null (the default engine, not owned, when none was given)
  std::vector<SafetensorsFile> files;  // mapped checkpoint (keeps the weight views valid)
  std::vector<ByteBuffer> synthetic;   // synthetic weights
  std::vector<ByteBuffer> owned;       // weight copies made at load (permuted / transposed rows)
  std::shared_ptr<const model::GgufCheckpoint> gguf;  // a GGUF checkpoint (keeps its mapping)
  uint64_t weight_bytes = 0;
  TensorView embed;  // [V, H]
  model::BlockWeight embed_blocks;  // instead of `embed`: a GGUF embedding kept in GGML blocks

  // The embedding row of token `id` as f32.
  void embed_row(int64_t id, float* out) const {
    const int64_t H = cfg.hidden_size;
    if (embed_blocks.data) {
      const gguf::BlockFormat& bf = gguf::block_format(embed_blocks.type);
      gguf::dequantize(embed_blocks.type,
                       static_cast<const std::byte*>(embed_blocks.data) + id * (H / bf.block_elems) * bf.block_bytes, out, H);
    } else if (embed.dtype == DType::BF16) {
      const auto* src = static_cast<const uint16_t*>(embed.data) + id * H;
      for (int64_t i = 0; i < H; ++i) out[i] = bf16_to_f32(src[i]);
    } else {
      for (int64_t i = 0; i < H; ++i) out[i] = static_cast<float>(load_as_double(embed.data, embed.dtype, id * H + i));
    }
  }
  model::Projection lm_head;
  std::vector<float> final_norm;
  std::vector<Layer> layers;

  // The channel-mixer module of layer prefix p: the first of the family's candidates with a tensor.
  std::string channel_module(const model::WeightReader& w, const std::string& p, bool moe) const {
    for (const std::string& m : cfg.names.channel_mixer)
      if (w.has(p + m + (moe ? "gate.weight" : "gate_proj.weight"))) return p + m;
    return p + cfg.names.channel_mixer.front();  // absent everywhere: the loader names this one
  }

  // The part of forward() and forward_batch() after their checks: the decoder on rows of hidden
  // state, the T new tokens of one sequence (states.size() == 1) or one token of each of several
  // sequences (row r continues states[r]). The row-wise parts (embedding, norms, channel mixers,
  // LM head) run on all rows at once, so their weights are read once; a token mixer runs on each
  // sequence's rows with that sequence's state. Returns the logits of the last `logit_rows` rows.
  Tensor run_decoder(std::span<HybridState* const> states, std::span<const int32_t> ids, int64_t logit_rows,
                     const ForwardOptions& opt) const;

  void build(const model::WeightReader& w, const std::string& prefix, bool have_lm_head) {
    const ModelConfig& c = cfg;
    c.check();
    const int64_t H = c.hidden_size;
    const std::string embed_name = prefix + c.names.embed_tokens + "weight";
    // false: the embedding's rows are read on lookup, so it keeps the file's layout
    if (std::optional<model::BlockWeight> b = w.get_blocks ? w.get_blocks(embed_name, {c.vocab_size, H}, false) : std::nullopt)
      embed_blocks = *b;  // a quantized GGUF embedding: rows dequantized on lookup
    else
      embed = w.get(embed_name, {c.vocab_size, H});
    final_norm = w.norm_scale(prefix + "norm.weight", H, c.norm_weight_plus_one);
    if (c.tie_word_embeddings || !have_lm_head) {
      if (!c.tie_word_embeddings) w.get("lm_head.weight", {c.vocab_size, H});  // throws: missing
      if (embed_blocks.data)
        lm_head = model::Projection(std::make_unique<GgufLinear>(embed_blocks.type, embed_blocks.data, c.vocab_size, H,
                                                                 embed_name + " (tied LM head)"));
      else
        lm_head = w.projection_of(embed, embed_name + " (tied LM head)");
    } else {
      lm_head = w.projection("lm_head.weight", c.vocab_size, H);
    }
    int64_t linear_slot = 0, attn_slot = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = prefix + "layers." + std::to_string(i) + ".";
      Layer L;
      const bool full = c.is_full_attention[static_cast<size_t>(i)];
      L.slot = full ? attn_slot++ : linear_slot++;
      L.input_norm = w.norm_scale(p + "input_layernorm.weight", H, c.norm_weight_plus_one);
      L.post_norm = w.norm_scale(p + "post_attention_layernorm.weight", H, c.norm_weight_plus_one);
      // A linear-attention tensor of the wrong shape: the error says which config keys set it.
      auto with_source = [&](auto&& load) {
        try {
          load();
        } catch (const Error& e) {
          if (c.linear_shape_source.empty()) throw;
          throw Error(std::string(e.what()) + "; " + c.linear_shape_source);
        }
      };
      switch (c.token_mixer(i)) {
        case TokenMixer::kGdn:
          with_source([&] { L.token_mixer.emplace<model::GdnMixer>().load(c, w, p + c.names.linear_attention); });
          break;
        case TokenMixer::kKda:
          with_source([&] { L.token_mixer.emplace<model::KdaMixer>().load(c, w, p + c.names.linear_attention); });
          break;
        case TokenMixer::kGatedAttention: L.token_mixer.emplace<model::GatedAttention>().load(c, w, p + c.names.attention); break;
        case TokenMixer::kMla: L.token_mixer.emplace<model::MlaAttention>().load(c, w, p + c.names.attention); break;
      }
      const bool moe = c.layer_is_moe(i);
      const std::string m = channel_module(w, p, moe);
      if (moe) L.channel_mixer.emplace<model::MoeBlock>().load(c, w, m);
      else L.channel_mixer.emplace<model::SwiGluMlp>().load(w, m, H, c.mlp.intermediate_size);
      layers.push_back(std::move(L));
    }
  }
};

HybridModel::HybridModel() : impl_(std::make_unique<Impl>()) {}
HybridModel::HybridModel(HybridModel&&) noexcept = default;
HybridModel& HybridModel::operator=(HybridModel&&) noexcept = default;
HybridModel::~HybridModel() = default;

const ModelConfig& HybridModel::config() const { return impl_->cfg; }
Engine& HybridModel::engine() const { return *impl_->engine; }

namespace {
// What the loader does with float projections for a --weights choice: convert them with the
// row's load-time quantizer (int8, f16), or keep them as stored (bf16, and the GGUF formats, which
// arrive as a GGUF file whose blocks stay as they are).
model::ProjectionLoad projection_load(const WeightChoice& choice, const WeightOptions& opt) {
  model::ProjectionLoad load;
  if (choice.load() == WeightLoad::kPerTensor) {
    load.convert = &weight_format_info(*choice.format);
    if (choice.format == WeightFormat::kInt8 && opt.int8_group < 1)
      throw Error("weights: int8 group " + std::to_string(opt.int8_group) + ", expected >= 1");
    load.int8_group = opt.int8_group;
  }
  return load;
}

// The engine a model was given, or the default one (shared, not owned: it lives until exit).
std::shared_ptr<Engine> model_engine(std::shared_ptr<Engine> given) {
  if (given) return given;
  return std::shared_ptr<Engine>(std::shared_ptr<Engine>(), &Engine::default_engine());
}
}  // namespace
uint64_t HybridModel::weight_bytes() const { return impl_->weight_bytes; }

HybridModel HybridModel::load(const std::string& dir, const ModelLoadOptions& opt) {
  std::string gguf_path = model::is_gguf_path(dir) ? dir : "";
  const WeightChoice choice = weight_choice(opt.weights.format, "weights", weight_load_names());
  const model::ProjectionLoad load = projection_load(choice, opt.weights);
  int memfd = -1;  // --weights q4_k_m etc.: the checkpoint quantized into a GGUF in memory
  if (choice.load() == WeightLoad::kGgufFile) {
    if (!gguf_path.empty())
      throw Error("'" + dir + "' is a GGUF file already; --weights " + choice.name + " quantizes a safetensors checkpoint");
    memfd = write_checkpoint_as_gguf_memfd(dir, parse_gguf_file_format(choice.name));
    gguf_path = "/proc/self/fd/" + std::to_string(memfd);
  }
  struct CloseFd {
    int fd;
    ~CloseFd() { if (fd >= 0) ::close(fd); }  // the reader's mapping keeps the memory file alive
  } close_memfd{memfd};
  if (!gguf_path.empty()) {
    const std::string& dir = gguf_path;
    // A GGUF file (or split set): its metadata mapped onto the config, its tensors onto the HF
    // names the blocks load (model/gguf_arch.hpp). Quantized projections stay in GGML blocks.
    HybridModel m;
    Impl& im = *m.impl_;
    im.engine = model_engine(opt.engine);
    auto ck = std::make_shared<const model::GgufCheckpoint>(dir);
    im.gguf = ck;
    im.cfg = ck->config();
    im.weight_bytes = ck->data_bytes();
    model::WeightReader w;
    w.get = [&](const std::string& name, const std::vector<int64_t>& shape) { return ck->get(name, shape, im.owned); };
    w.has = [&](const std::string& name) { return ck->has(name); };
    w.get_blocks = [&](const std::string& name, const std::vector<int64_t>& shape, bool row_lanes_ok) {
      return ck->get_blocks(name, shape, im.owned, row_lanes_ok);
    };
    w.owned = &im.owned;
    w.load = load;
    w.on_int8 = opt.on_int8_projection;
    im.build(w, "model.", ck->has_lm_head());
    return m;
  }
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw Error("checkpoint '" + dir + "': not a directory");
  const fs::path cfg_path = d / "config.json";
  if (!fs::exists(cfg_path)) throw Error("checkpoint '" + dir + "': no config.json");
  HybridModel m;
  Impl& im = *m.impl_;
  im.engine = model_engine(opt.engine);
  im.cfg = parse_model_config(read_text_file(cfg_path), cfg_path.string());
  CheckpointSource src(d, opt, im.files);
  for (const SafetensorsFile& f : im.files) im.weight_bytes += f.data_bytes();
  // Qwen3.5 official checkpoints are ...ForConditionalGeneration (model.language_model.*);
  // text-only ones and the other families are ...ForCausalLM (model.*).
  const std::string prefix = src.any_with_prefix("model.language_model.") ? "model.language_model." : "model.";
  model::WeightReader w;
  w.get = [&](const std::string& name, const std::vector<int64_t>& shape) { return src.get(name, shape); };
  w.has = [&](const std::string& name) { return src.has(name); };
  w.release = [&](const std::string& name) { src.release(name); };
  w.owned = &im.owned;
  w.load = load;
  // A file `hanpu quantize` wrote says its group size; the projections it stored as int8 are used
  // as they are, the rest (rows the loader permutes or transposes) are quantized with that group.
  for (const SafetensorsFile& f : im.files) {
    auto it = f.metadata().find("hanpu.int8_group");
    if (it == f.metadata().end()) continue;
    int64_t g = 0;
    try {
      g = std::stoll(it->second);
    } catch (const std::exception&) {
    }
    if (g < 1) throw Error("'" + f.path() + "': metadata 'hanpu.int8_group' is \"" + printable(it->second) + "\", expected a positive integer");
    if (load.convert && load.convert->format == WeightFormat::kInt8 && load.int8_group != g)
      throw Error("'" + f.path() + "' holds int8 weights with group " + std::to_string(g) + ", but int8 group " +
                  std::to_string(load.int8_group) + " was asked for (omit --int8-group, or quantize again)");
    if (load.convert && load.convert->format != WeightFormat::kInt8)
      throw Error("'" + f.path() + "' holds int8 weights (hanpu quantize); --weights " + choice.name +
                  " converts a float checkpoint (omit --weights, or give int8)");
    w.load.convert = &weight_format_info(WeightFormat::kInt8);
    w.load.int8_group = g;
  }
  w.get_stored = [&](const std::string& name, const std::vector<int64_t>& shape) { return src.get(name, shape, false); };
  w.on_int8 = opt.on_int8_projection;
  im.build(w, prefix, src.has("lm_head.weight"));
  return m;
}

HybridModel HybridModel::synthetic(const ModelConfig& c, uint64_t seed, int threads, const WeightOptions& weights,
                                   std::shared_ptr<Engine> engine) {
  const WeightChoice choice = weight_choice(weights.format, "weights", weight_load_names());
  if (choice.load() == WeightLoad::kGgufFile)
    throw Error("weights: '" + choice.name + "' quantizes a safetensors checkpoint into a GGUF file at load; synthetic "
                "weights take the formats converted per tensor (bf16, and those of weight_load_names() whose rows say "
                "kPerTensor: int8, f16)");
  HybridModel m;
  Impl& im = *m.impl_;
  im.engine = model_engine(std::move(engine));
  im.cfg = c;
  SyntheticSource src(seed, EngineThreads{im.engine.get(), threads}, im.synthetic);
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape) -> TensorView {
    auto ends = [&](const char* s) {
      const std::string t(s);
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    // Scales as a trained model's: projections ~ 1/sqrt(fan_in) so activations stay O(1);
    // zero-centred norm offsets near 0 (multiplier 1 + w), raw norm weights near 1; decays moderate.
    if (ends("A_log")) return src.make(name, shape, 0.5, 0.5);
    if (ends("dt_bias")) return src.make(name, shape, 0.5);
    if (ends("linear_attn.norm.weight") || ends("o_norm.weight")) return src.make(name, shape, 0.1, 1.0);
    if (ends("norm.weight")) return src.make(name, shape, 0.1, c.norm_weight_plus_one ? 0.0 : 1.0);
    if (ends("conv1d.weight")) return src.make(name, shape, 0.5);
    if (ends((c.names.embed_tokens + "weight").c_str())) return src.make(name, shape, 1.0);
    if (ends(c.names.router_score_bias.c_str())) return src.make(name, shape, 0.01);
    return src.make(name, shape, 1.0 / std::sqrt(static_cast<double>(shape.back())));
  };
  model::WeightReader w;
  w.get = get;
  // The synthetic layout is the official one: separate KDA convs, per-expert tensors, mlp. names.
  w.has = [&](const std::string& name) {
    return name.find("q_conv1d") != std::string::npos || name.find("f_a_proj") != std::string::npos ||
           name.find("f_proj") != std::string::npos ||
           name.find("experts.0.") != std::string::npos ||
           name.find(c.names.channel_mixer.front()) != std::string::npos;
  };
  w.owned = &im.owned;
  w.load = projection_load(choice, weights);
  w.release = [&](const std::string& name) { src.release(name); };
  im.build(w, "model.", !c.tie_word_embeddings);
  im.weight_bytes = src.made_bytes();
  return m;
}

size_t HybridState::bytes() const {
  size_t n = 0;
  for (const Tensor& t : conv_state) n += t.bytes();
  for (const Tensor& t : recurrent_state) n += t.bytes();
  for (const auto& v : key_cache) n += v.capacity() * sizeof(float);
  for (const auto& v : value_cache) n += v.capacity() * sizeof(float);
  return n;
}

HybridState HybridModel::new_state() const {
  const ModelConfig& c = impl_->cfg;
  HybridState s;
  const LinearAttentionShape la = c.linear_shape();
  for (int64_t i = 0; i < c.num_linear_layers(); ++i) {
    s.conv_state.emplace_back(DType::F32, std::vector<int64_t>{la.conv_kernel - 1, la.conv_dim()});
    s.recurrent_state.emplace_back(DType::F32, std::vector<int64_t>{1, la.value_heads, la.key_head_dim, la.value_head_dim});
  }
  s.key_cache.resize(static_cast<size_t>(c.num_attention_layers()));
  s.value_cache.resize(static_cast<size_t>(c.num_attention_layers()));
  return s;
}

namespace {
// The activation scratch of a forward call: a workspace of the model's engine, held until it returns.
struct CallScratch {
  WorkspaceLease lease;
  Workspace& ws;
  explicit CallScratch(Engine& e) : lease(e, 1), ws(lease[0]) {}
};
}  // namespace

Tensor HybridModel::forward(HybridState& st, std::span<const int32_t> ids, const ForwardOptions& opt) const {
  const Impl& im = *impl_;
  const ModelConfig& c = im.cfg;
  const int64_t T = static_cast<int64_t>(ids.size());
  if (T == 0) throw Error("forward: no input tokens");
  for (int64_t t = 0; t < T; ++t)
    if (ids[static_cast<size_t>(t)] < 0 || ids[static_cast<size_t>(t)] >= c.vocab_size)
      throw Error("forward: token id " + std::to_string(ids[static_cast<size_t>(t)]) + " at position " +
                  std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (st.conv_state.size() != static_cast<size_t>(c.num_linear_layers()) ||
      st.key_cache.size() != static_cast<size_t>(c.num_attention_layers()))
    throw Error("forward: the state was not made by this model's new_state()");
  HybridState* const one[] = {&st};
  return im.run_decoder(one, ids, opt.all_logits ? T : 1, opt);
}

Tensor HybridModel::forward_batch(std::span<HybridState* const> states, std::span<const int32_t> ids,
                                  const ForwardOptions& opt) const {
  const Impl& im = *impl_;
  const ModelConfig& c = im.cfg;
  const int64_t B = static_cast<int64_t>(states.size());
  if (B == 0) throw Error("forward_batch: no sequences");
  if (ids.size() != states.size())
    throw Error("forward_batch: " + std::to_string(ids.size()) + " token ids for " + std::to_string(B) +
                " sequences, expected one id per sequence");
  for (int64_t b = 0; b < B; ++b) {
    const int32_t id = ids[static_cast<size_t>(b)];
    if (id < 0 || id >= c.vocab_size)
      throw Error("forward_batch: token id " + std::to_string(id) + " of sequence " + std::to_string(b) +
                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    const HybridState* st = states[static_cast<size_t>(b)];
    if (!st || st->conv_state.size() != static_cast<size_t>(c.num_linear_layers()) ||
        st->key_cache.size() != static_cast<size_t>(c.num_attention_layers()))
      throw Error("forward_batch: the state of sequence " + std::to_string(b) + " was not made by this model's new_state()");
  }
  return im.run_decoder(states, ids, B, opt);
}

Tensor HybridModel::Impl::run_decoder(std::span<HybridState* const> states, std::span<const int32_t> ids,
                                      int64_t logit_rows, const ForwardOptions& opt) const {
  const Impl& im = *this;
  const ModelConfig& c = im.cfg;
  const int64_t R = static_cast<int64_t>(ids.size()), H = c.hidden_size;
  const bool one_sequence = states.size() == 1;
  ForwardTimes local;
  ForwardTimes* tm = opt.times ? opt.times : &local;
  CallScratch scratch_ws(*im.engine);
  Workspace& ws = scratch_ws.ws;
  const EngineThreads th{im.engine.get(), opt.threads};
  const float eps = static_cast<float>(c.rms_norm_eps);
  // The row-wise parts see the rows as tokens: of one sequence from its position, or of several
  // sequences (no position: the channel mixers do not use one).
  const model::BlockRun rows_run{c, opt, *tm, R, one_sequence ? states[0]->position : 0, th, &ws};

  auto t0 = Clock::now();
  float* x = scratch(ws, model::kX, R * H);
  float* h = scratch(ws, model::kH, R * H);
  parallel_for(R, th.when(one_sequence && R >= 16), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      im.embed_row(ids[static_cast<size_t>(t)], x + t * H);
    }
  });
  tm->embed += seconds_since(t0);

  for (const Layer& L : im.layers) {
    t0 = Clock::now();
    model::rms_norm_rows(x, H, h, H, R, H, L.input_norm.data(), eps, th);
    tm->norms += seconds_since(t0);
    if (one_sequence) {
      L.mix_tokens(rows_run, *states[0], h, x);
    } else {
      for (int64_t b = 0; b < R; ++b) {
        HybridState& st = *states[static_cast<size_t>(b)];
        const model::BlockRun run{c, opt, *tm, 1, st.position, th, &ws};
        L.mix_tokens(run, st, h + b * H, x + b * H);
      }
    }
    t0 = Clock::now();
    model::rms_norm_rows(x, H, h, H, R, H, L.post_norm.data(), eps, th);
    tm->norms += seconds_since(t0);
    t0 = Clock::now();
    L.mix_channels(rows_run, h, x);
    tm->mlp += seconds_since(t0);
  }
  if (one_sequence) states[0]->position += R;
  else
    for (HybridState* st : states) st->position += 1;

  t0 = Clock::now();
  const float* last = x + (R - logit_rows) * H;
  model::rms_norm_rows(last, H, h, H, logit_rows, H, im.final_norm.data(), eps, th);
  tm->norms += seconds_since(t0);
  t0 = Clock::now();
  Tensor logits(DType::F32, {logit_rows, c.vocab_size});
  im.lm_head.forward(h, H, logits.ptr<float>(), c.vocab_size, logit_rows, th, false, opt.precision);
  tm->lm_head += seconds_since(t0);
  return logits;
}

}  // namespace hanpu
