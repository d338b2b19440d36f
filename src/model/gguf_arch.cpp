// The GGUF architecture table (gguf_arch.hpp): one row per GGUF architecture hanpu runs, giving
// the model_type its metadata becomes, the metadata keys that become config.json fields, and the
// tensor names with what llama.cpp's converter did to each tensor.
//
// Sources (read, not copied): llama.cpp's gguf-py/gguf/constants.py (MODEL_TENSOR names per
// architecture, metadata keys), gguf-py/gguf/tensor_mapping.py (HF name <-> GGUF name),
// convert_hf_to_gguf.py with conversion/qwen.py (Qwen3NextModel.modify_tensors,
// _LinearAttentionVReorderBase.modify_tensors: the tensor transforms undone here).
#include "model/gguf_arch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

namespace hanpu::model {

namespace {

using json = nlohmann::ordered_json;

// What the converter did to a tensor, undone on load. r = linear_num_value_heads /
// linear_num_key_heads; with r > 1 the converter reorders value heads from grouped-by-key-head
// [g0v0..g0v(r-1), g1v0, ...] to ggml's tiled order [g0v0, g1v0, ..., g0v1, g1v1, ...]
// (_LinearAttentionVReorderBase._reorder_v_heads).
enum class Fix {
  kNone,
  kNormMinusOne,  // Qwen's zero-centred RMSNorm weights are stored as 1 + w (all "norm.weight" but linear_attn.norm)
  kALog,          // stored as ssm_a = -exp(A_log), value heads tiled
  kDtBias,        // value heads tiled (one value per head)
  kBetaAlphaRows, // in_proj_b / in_proj_a: rows = value heads, tiled
  kQkvRows,       // in_proj_qkv: the value rows (after 2 * key_dim) tiled by head of linear_value_head_dim
  kZRows,         // in_proj_z: rows tiled by head of linear_value_head_dim
  kConv,          // conv1d [C, 1, K] stored squeezed as [C, K]; value channels tiled
  kOutCols,       // out_proj: input columns tiled by head of linear_value_head_dim
  kExpert,        // mlp.experts.{e}.*: slice e of the stacked 3-D ffn_*_exps tensor
  kSqueezed,      // stored without HF's leading 1 (shared_expert_gate [1, H] as [H])
};

struct TensorRule {
  const char* hf;    // after "model.layers.{i}." (layer rules) or the full name (global rules)
  const char* gguf;  // after "blk.{i}." or the full name
  Fix fix;
};

struct ArchRow {
  const char* arch;
  const char* model_type;
  // Fills config.json fields from the metadata (keys named "<arch>.<key>").
  void (*config)(const GgufFile& f, const std::string& arch, json& cfg);
  std::vector<TensorRule> global, layer;
};

uint64_t meta_uint(const GgufFile& f, const std::string& key) { return f.get_uint(key); }

// The per-layer recurrent flags as layer_types, from <arch>.attention.recurrent_layers (written
// by the converter when the HF config has layer_types) or <arch>.full_attention_interval.
json layer_types(const GgufFile& f, const std::string& arch, uint64_t n_layer) {
  json lt = json::array();
  if (const GgufValue* v = f.find(arch + ".attention.recurrent_layers")) {
    const auto* arr = std::get_if<std::vector<GgufValue>>(&v->value);
    if (v->type != GgufType::ARRAY || !arr || arr->size() < n_layer)
      throw Error("GGUF file '" + f.path() + "': key '" + arch + ".attention.recurrent_layers' is " + v->describe() +
                  ", expected an array of at least " + std::to_string(n_layer) + " bools (one per layer)");
    for (uint64_t i = 0; i < n_layer; ++i) {
      const auto* b = std::get_if<bool>(&(*arr)[i].value);
      if (!b)
        throw Error("GGUF file '" + f.path() + "': key '" + arch + ".attention.recurrent_layers'[" + std::to_string(i) +
                    "] is " + (*arr)[i].describe() + ", expected a bool");
      lt.push_back(*b ? "linear_attention" : "full_attention");
    }
    return lt;
  }
  const uint64_t interval = meta_uint(f, arch + ".full_attention_interval");
  if (interval == 0) throw Error("GGUF file '" + f.path() + "': key '" + arch + ".full_attention_interval' is 0, expected >= 1");
  for (uint64_t i = 0; i < n_layer; ++i) lt.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
  return lt;
}

// Layers of the main model: block_count less the MTP ("nextn") layers the converter appends.
uint64_t main_layers(const GgufFile& f, const std::string& arch) {
  const uint64_t blocks = meta_uint(f, arch + ".block_count");
  uint64_t nextn = 0;
  if (f.find(arch + ".nextn_predict_layers")) nextn = meta_uint(f, arch + ".nextn_predict_layers");
  if (nextn >= blocks)
    throw Error("GGUF file '" + f.path() + "': key '" + arch + ".nextn_predict_layers' is " + std::to_string(nextn) +
                ", expected fewer than " + arch + ".block_count (" + std::to_string(blocks) + ")");
  return blocks - nextn;
}

void qwen35_config(const GgufFile& f, const std::string& a, json& c);

// Qwen3.5-MoE: Qwen3_5MoeTextModel (the dense keys plus Qwen2MoeModel's expert keys).
void qwen35moe_config(const GgufFile& f, const std::string& a, json& c) {
  qwen35_config(f, a, c);
  c.erase("intermediate_size");  // every layer is MoE; a dense size may be absent or meaningless
  c["num_experts"] = meta_uint(f, a + ".expert_count");
  c["num_experts_per_tok"] = meta_uint(f, a + ".expert_used_count");
  c["moe_intermediate_size"] = meta_uint(f, a + ".expert_feed_forward_length");
  c["shared_expert_intermediate_size"] = meta_uint(f, a + ".expert_shared_feed_forward_length");
}

// Qwen3.5 (dense): Qwen3_5TextModel in conversion/qwen.py; keys of Qwen3NextModel.set_gguf_parameters.
void qwen35_config(const GgufFile& f, const std::string& a, json& c) {
  const uint64_t n_layer = main_layers(f, a);
  c["hidden_size"] = meta_uint(f, a + ".embedding_length");
  if (f.find(a + ".feed_forward_length")) c["intermediate_size"] = meta_uint(f, a + ".feed_forward_length");
  c["num_hidden_layers"] = n_layer;
  c["num_attention_heads"] = meta_uint(f, a + ".attention.head_count");
  c["num_key_value_heads"] = meta_uint(f, a + ".attention.head_count_kv");
  const uint64_t head_dim = meta_uint(f, a + ".attention.key_length");
  if (f.find(a + ".attention.value_length") && meta_uint(f, a + ".attention.value_length") != head_dim)
    throw Error("GGUF file '" + f.path() + "': key '" + a + ".attention.value_length' is " +
                std::to_string(meta_uint(f, a + ".attention.value_length")) + ", expected " + std::to_string(head_dim) +
                " (key_length: hanpu's gated attention has one head_dim)");
  c["head_dim"] = head_dim;
  const uint64_t nk = meta_uint(f, a + ".ssm.group_count"), nv = meta_uint(f, a + ".ssm.time_step_rank");
  const uint64_t inner = meta_uint(f, a + ".ssm.inner_size");
  if (nv == 0 || inner % nv != 0)
    throw Error("GGUF file '" + f.path() + "': key '" + a + ".ssm.inner_size' is " + std::to_string(inner) +
                ", expected a multiple of " + a + ".ssm.time_step_rank (" + std::to_string(nv) + ", the value heads)");
  c["linear_num_key_heads"] = nk;
  c["linear_num_value_heads"] = nv;
  c["linear_key_head_dim"] = meta_uint(f, a + ".ssm.state_size");
  c["linear_value_head_dim"] = inner / nv;
  c["linear_conv_kernel_dim"] = meta_uint(f, a + ".ssm.conv_kernel");
  c["rms_norm_eps"] = f.get_float(a + ".attention.layer_norm_rms_epsilon");
  const uint64_t rot = meta_uint(f, a + ".rope.dimension_count");
  c["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", f.get_float(a + ".rope.freq_base")},
                          {"partial_rotary_factor", static_cast<double>(rot) / static_cast<double>(head_dim)}};
  c["layer_types"] = layer_types(f, a, n_layer);
}

const std::vector<ArchRow>& arch_table() {
  // The token-mixer and norm tensors Qwen3.5 dense and MoE share.
  const std::vector<TensorRule> q35_global = {{"model.embed_tokens.weight", "token_embd.weight", Fix::kNone},
                                              {"model.norm.weight", "output_norm.weight", Fix::kNormMinusOne},
                                              {"lm_head.weight", "output.weight", Fix::kNone}};
  const std::vector<TensorRule> q35_mixers = {
      {"input_layernorm.weight", "attn_norm.weight", Fix::kNormMinusOne},
      {"post_attention_layernorm.weight", "post_attention_norm.weight", Fix::kNormMinusOne},
      {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight", Fix::kQkvRows},
      {"linear_attn.in_proj_z.weight", "attn_gate.weight", Fix::kZRows},
      {"linear_attn.in_proj_b.weight", "ssm_beta.weight", Fix::kBetaAlphaRows},
      {"linear_attn.in_proj_a.weight", "ssm_alpha.weight", Fix::kBetaAlphaRows},
      {"linear_attn.conv1d.weight", "ssm_conv1d.weight", Fix::kConv},
      {"linear_attn.dt_bias", "ssm_dt.bias", Fix::kDtBias},
      {"linear_attn.A_log", "ssm_a", Fix::kALog},
      {"linear_attn.norm.weight", "ssm_norm.weight", Fix::kNone},
      {"linear_attn.out_proj.weight", "ssm_out.weight", Fix::kOutCols},
      {"self_attn.q_proj.weight", "attn_q.weight", Fix::kNone},  // [query | gate] per head, as in HF
      {"self_attn.k_proj.weight", "attn_k.weight", Fix::kNone},
      {"self_attn.v_proj.weight", "attn_v.weight", Fix::kNone},
      {"self_attn.o_proj.weight", "attn_output.weight", Fix::kNone},
      {"self_attn.q_norm.weight", "attn_q_norm.weight", Fix::kNormMinusOne},
      {"self_attn.k_norm.weight", "attn_k_norm.weight", Fix::kNormMinusOne}};
  auto with = [](std::vector<TensorRule> a, const std::vector<TensorRule>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  static const std::vector<ArchRow> rows = {
      {"qwen35", "qwen3_5_text", qwen35_config, q35_global,
       with(q35_mixers, {{"mlp.gate_proj.weight", "ffn_gate.weight", Fix::kNone},
                         {"mlp.up_proj.weight", "ffn_up.weight", Fix::kNone},
                         {"mlp.down_proj.weight", "ffn_down.weight", Fix::kNone}})},
      {"qwen35moe", "qwen3_5_moe_text", qwen35moe_config, q35_global,
       with(q35_mixers, {{"mlp.gate.weight", "ffn_gate_inp.weight", Fix::kNone},
                         {"mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", Fix::kExpert},
                         {"mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", Fix::kExpert},
                         {"mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", Fix::kExpert},
                         {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", Fix::kNone},
                         {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", Fix::kNone},
                         {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", Fix::kNone},
                         {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", Fix::kSqueezed}})},
  };
  return rows;
}

const ArchRow* find_arch(const std::string& arch) {
  for (const ArchRow& r : arch_table())
    if (arch == r.arch) return &r;
  return nullptr;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_float_type(gguf::GgmlType t) {
  return t == gguf::GgmlType::F32 || t == gguf::GgmlType::F16 || t == gguf::GgmlType::BF16;
}

}  // namespace

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 && !std::filesystem::is_directory(path, ec);
}

std::vector<std::string> gguf_supported_archs() {
  std::vector<std::string> out;
  for (const ArchRow& r : arch_table()) out.emplace_back(r.arch);
  return out;
}

std::string gguf_config_json(const GgufModel& m) {
  const GgufFile& f = m.main();
  const std::string arch = f.get_string("general.architecture");
  const ArchRow* row = find_arch(arch);
  if (!row) {
    std::string names;
    for (const std::string& a : gguf_supported_archs()) names += (names.empty() ? "" : ", ") + a;
    throw Error("GGUF file '" + f.path() + "': key 'general.architecture' is '" + arch +
                "', which hanpu cannot run (supported: " + names + ")");
  }
  json c = json::object();
  c["model_type"] = row->model_type;
  row->config(f, arch, c);
  const GgufTensorInfo& embd = m.tensor("token_embd.weight");
  c["vocab_size"] = embd.dims[1];
  c["tie_word_embeddings"] = m.find_tensor("output.weight") == nullptr;
  if (const GgufValue* eos = f.find("tokenizer.ggml.eos_token_id")) {
    if (!eos->is_integer())
      throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.eos_token_id' is " + eos->describe() + ", expected an integer");
    c["eos_token_id"] = f.get_uint("tokenizer.ggml.eos_token_id");
  }
  return c.dump();
}

namespace {

const std::vector<GgufValue>& array_key(const GgufFile& f, const std::string& key, GgufType elem) {
  const GgufValue* v = f.find(key);
  if (!v) throw Error("GGUF file '" + f.path() + "': key '" + key + "' is missing");
  const auto* arr = std::get_if<std::vector<GgufValue>>(&v->value);
  if (v->type != GgufType::ARRAY || !arr || v->elem_type != elem)
    throw Error("GGUF file '" + f.path() + "': key '" + key + "' is " + v->describe() + ", expected an array of " +
                gguf_type_name(elem));
  return *arr;
}

// llama.cpp's token types (llama_token_type / gguf-py TokenType).
constexpr int64_t kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4;

}  // namespace

std::string gguf_tokenizer_json(const GgufFile& f, std::optional<int32_t>* eos) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.model' is '" + model +
                "', expected 'gpt2' (byte-level BPE, the only tokenizer model hanpu reads from GGUF)");
  const std::string pre = f.find("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "";
  // The split regexes of the Hugging Face tokenizer.json files these names stand for (Qwen2's and
  // Qwen3.5's; llama.cpp's llama-vocab.cpp has the same expressions for LLAMA_VOCAB_PRE_TYPE_QWEN2 / _QWEN35).
  std::string regex;
  if (pre == "qwen2")
    regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  else if (pre == "qwen35")
    regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  else
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.pre' is '" + pre +
                "', expected one of the pre-tokenizers hanpu knows: qwen2, qwen35");
  const auto& tokens = array_key(f, "tokenizer.ggml.tokens", GgufType::STRING);
  const auto& types = array_key(f, "tokenizer.ggml.token_type", GgufType::I32);
  const auto& merges = array_key(f, "tokenizer.ggml.merges", GgufType::STRING);
  if (types.size() != tokens.size())
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.token_type' has " + std::to_string(types.size()) +
                " entries, expected one per token of 'tokenizer.ggml.tokens' (" + std::to_string(tokens.size()) + ")");
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array(), merge_list = nlohmann::json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = std::get<std::string>(tokens[i].value);
    const int64_t type = std::get<int64_t>(types[i].value);
    if (type == kTokenControl || type == kTokenUserDefined)
      added.push_back({{"id", i}, {"content", t}, {"special", type == kTokenControl}, {"normalized", false},
                       {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
    else if (type == kTokenNormal || type == 5 /* UNUSED */ || type == 6 /* BYTE */)
      vocab[t] = i;
    else
      throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.token_type'[" + std::to_string(i) + "] is " +
                  std::to_string(type) + ", expected 1 (normal), 3 (control), 4 (user-defined), 5 (unused) or 6 (byte)");
  }
  for (const GgufValue& m : merges) merge_list.push_back(std::get<std::string>(m.value));
  nlohmann::json root = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", added}};
  if (eos) {
    eos->reset();
    if (f.find("tokenizer.ggml.eos_token_id")) {
      const uint64_t id = f.get_uint("tokenizer.ggml.eos_token_id");
      if (id >= tokens.size())
        throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.eos_token_id' is " + std::to_string(id) +
                    ", expected a token id below " + std::to_string(tokens.size()));
      *eos = static_cast<int32_t>(id);
    }
  }
  try {
    return root.dump();
  } catch (const nlohmann::json::exception&) {  // type_error 316: a string that is not UTF-8
    throw Error("GGUF file '" + f.path() +
                "': key 'tokenizer.ggml.tokens' or 'tokenizer.ggml.merges' holds a string that is not valid UTF-8, "
                "expected byte-level BPE tokens (always UTF-8)");
  }
}

bool gguf_has_tokenizer(const std::string& path) {
  return GgufModel::open(path).main().find("tokenizer.ggml.tokens") != nullptr;
}

std::string gguf_chat_template(const GgufFile& f) {
  return f.find("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : std::string();
}

struct GgufCheckpoint::Resolved {
  const GgufTensorInfo* info = nullptr;  // null: no such tensor
  std::string gguf_name;
  Fix fix = Fix::kNone;
  int64_t expert = -1;  // kExpert: the slice
};

namespace {
// `rest` against a layer rule's HF name, where "*" stands for an expert index (digits).
bool rule_matches(const std::string& pattern, const std::string& rest, int64_t* expert) {
  const size_t star = pattern.find('*');
  if (star == std::string::npos) return pattern == rest;
  const std::string head = pattern.substr(0, star), tail = pattern.substr(star + 1);
  if (rest.size() <= head.size() + tail.size() || rest.compare(0, head.size(), head) != 0 ||
      rest.compare(rest.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const std::string digits = rest.substr(head.size(), rest.size() - head.size() - tail.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return false;
  *expert = std::stoll(digits);
  return true;
}
}  // namespace

GgufCheckpoint::GgufCheckpoint(const std::string& path) : path_(path) {
  file_ = std::make_shared<GgufModel>(GgufModel::open(path));
  arch_ = file_->main().get_string("general.architecture");
  config_ = parse_model_config(gguf_config_json(*file_), "GGUF file '" + path + "' (its metadata as config.json)");
}

uint64_t GgufCheckpoint::data_bytes() const {
  uint64_t n = 0;
  for (const GgufFile& f : file_->files())
    for (const GgufTensorInfo& t : f.tensors()) n += t.bytes;
  return n;
}

bool GgufCheckpoint::has_lm_head() const { return file_->find_tensor("output.weight") != nullptr; }

GgufCheckpoint::Resolved GgufCheckpoint::resolve(const std::string& hf) const {
  const ArchRow& row = *find_arch(arch_);
  Resolved r;
  for (const TensorRule& g : row.global)
    if (hf == g.hf) {
      r.gguf_name = g.gguf;
      r.fix = g.fix;
    }
  const std::string lp = "model.layers.";
  if (r.gguf_name.empty() && hf.rfind(lp, 0) == 0) {
    const size_t dot = hf.find('.', lp.size());
    if (dot != std::string::npos && dot > lp.size()) {
      const std::string idx = hf.substr(lp.size(), dot - lp.size()), rest = hf.substr(dot + 1);
      if (std::all_of(idx.begin(), idx.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        for (const TensorRule& l : row.layer)
          if (rule_matches(l.hf, rest, &r.expert)) {
            r.gguf_name = "blk." + idx + "." + l.gguf;
            r.fix = l.fix;
          }
    }
  }
  if (!r.gguf_name.empty()) r.info = file_->find_tensor(r.gguf_name);
  // An expert beyond the stacked tensor's last: no such tensor.
  if (r.info && r.fix == Fix::kExpert && (r.info->n_dims != 3 || r.expert >= r.info->dims[2])) r.info = nullptr;
  return r;
}

bool GgufCheckpoint::has(const std::string& hf_name) const { return resolve(hf_name).info != nullptr; }

namespace {

// Index in the file of element `i` along a value-head-tiled axis: positions before `offset` are
// not reordered; after it, HF's head h = g * r + j (key group g, j-th value head of the group)
// is the converter's head j * nk + g.
int64_t tiled_index(int64_t i, int64_t offset, int64_t nk, int64_t r, int64_t head_dim) {
  if (i < offset || r <= 1) return i;
  const int64_t k = i - offset, h = k / head_dim, d = k % head_dim;
  return offset + ((h % r) * nk + h / r) * head_dim + d;
}

struct Reorder {
  bool rows = false, cols = false;  // which axis is tiled
  int64_t offset = 0, head_dim = 1;
};

Reorder reorder_of(Fix fix, const ModelConfig& c) {
  const int64_t qk = 2 * c.gdn.num_key_heads * c.gdn.key_head_dim, hv = c.gdn.value_head_dim;
  switch (fix) {
    case Fix::kALog:
    case Fix::kDtBias:
    case Fix::kBetaAlphaRows: return {true, false, 0, 1};
    case Fix::kQkvRows: return {true, false, qk, hv};
    case Fix::kZRows: return {true, false, 0, hv};
    case Fix::kConv: return {true, false, qk, hv};
    case Fix::kOutCols: return {false, true, 0, hv};
    default: return {};
  }
}

}  // namespace

std::optional<GgufExportedTensor> gguf_export_tensor(const std::string& arch, const ModelConfig& c,
                                                     const std::string& hf, const std::vector<int64_t>& hf_shape,
                                                     std::vector<float>& data) {
  const ArchRow* row = find_arch(arch);
  if (!row || arch != "qwen35")
    throw Error("writing GGUF architecture '" + arch + "' is not supported by hanpu (it writes qwen35)");
  std::string name;
  Fix fix = Fix::kNone;
  for (const TensorRule& g : row->global)
    if (hf == g.hf) {
      name = g.gguf;
      fix = g.fix;
    }
  const std::string lp = "model.layers.";
  if (name.empty() && hf.rfind(lp, 0) == 0) {
    const size_t dot = hf.find('.', lp.size());
    if (dot != std::string::npos && dot > lp.size()) {
      const std::string idx = hf.substr(lp.size(), dot - lp.size()), rest = hf.substr(dot + 1);
      int64_t expert = -1;
      if (std::all_of(idx.begin(), idx.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        for (const TensorRule& l : row->layer)
          if (rule_matches(l.hf, rest, &expert)) {
            name = "blk." + idx + "." + l.gguf;
            fix = l.fix;
          }
    }
  }
  if (name.empty()) return std::nullopt;
  int64_t n = 1;
  for (int64_t d : hf_shape) n *= d;
  if (static_cast<int64_t>(data.size()) != n || hf_shape.empty())
    throw Error("writing GGUF tensor '" + name + "' (HF '" + hf + "'): " + std::to_string(data.size()) +
                " values for shape " + shape_str(hf_shape));
  std::vector<int64_t> shape = hf_shape;
  if (fix == Fix::kConv) {
    if (shape.size() != 3 || shape[1] != 1)
      throw Error("writing GGUF tensor '" + name + "' (HF '" + hf + "'): shape " + shape_str(hf_shape) +
                  ", expected [channels, 1, kernel]");
    shape = {shape[0], shape[2]};
  }
  if (fix == Fix::kNormMinusOne)
    for (float& v : data) v += 1.0f;  // conversion/qwen.py: norm weights stored as 1 + w (float32)
  if (fix == Fix::kALog)
    for (float& v : data) v = -std::exp(v);  // conversion/qwen.py: ssm_a = -exp(A_log)
  const Reorder ro = reorder_of(fix, c);
  const int64_t nk = c.gdn.num_key_heads, ratio = nk > 0 ? c.gdn.num_value_heads / nk : 1;
  if ((ro.rows || ro.cols) && ratio > 1) {
    const int64_t rows = shape[0], cols = n / rows;
    std::vector<float> out(data.size());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t di = ro.rows ? tiled_index(i, ro.offset, nk, ratio, ro.head_dim) : i;
      for (int64_t j = 0; j < cols; ++j)
        out[di * cols + (ro.cols ? tiled_index(j, ro.offset, nk, ratio, ro.head_dim) : j)] = data[i * cols + j];
    }
    data.swap(out);
  }
  GgufExportedTensor t{name, {}};
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) t.dims.push_back(*it);
  return t;
}

TensorView GgufCheckpoint::get(const std::string& hf, const std::vector<int64_t>& shape, std::vector<ByteBuffer>& owned) const {
  const Resolved r = resolve(hf);
  if (!r.info) {
    if (r.gguf_name.empty())
      throw Error("GGUF file '" + path_ + "': hanpu's tensor '" + hf + "' has no GGUF name in the " + arch_ +
                  " mapping (src/model/gguf_arch.cpp)");
    throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' (hanpu's '" + hf + "') is missing");
  }
  const GgufTensorInfo& t = *r.info;
  // The file's shape in HF order (dims reversed); conv1d is stored squeezed [C, K] for HF's [C, 1, K].
  std::vector<int64_t> want = shape;
  if (r.fix == Fix::kConv && want.size() == 3 && want[1] == 1) want = {shape[0], shape[2]};
  if (r.fix == Fix::kSqueezed && t.n_dims == 1 && want.size() == 2 && want[0] == 1) want = {shape[1]};
  std::vector<int64_t> got;
  for (int d = t.n_dims - 1; d >= 0; --d) got.push_back(t.dims[d]);
  const std::byte* data = t.data;
  int64_t n = t.numel();
  if (r.fix == Fix::kExpert) {  // [E, rows, cols] in HF order: expert r.expert's [rows, cols]
    got.erase(got.begin());
    n = t.dims[0] * t.dims[1];
    const gguf::BlockFormat& bf = gguf::block_format(t.type);
    data += static_cast<size_t>(r.expert * (n / bf.block_elems) * bf.block_bytes);
  }
  if (got != want)
    throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' (hanpu's '" + hf + "') has shape " +
                shape_str(got) + " (GGUF dims reversed), expected " + shape_str(want) + " from the metadata");
  if (!gguf::block_format(t.type).dequantize)
    throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' has type " + gguf::block_format(t.type).name +
                ", which hanpu cannot decode (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS)");
  if ((r.fix == Fix::kNone || r.fix == Fix::kExpert || r.fix == Fix::kSqueezed) && is_float_type(t.type)) {
    const DType dt = t.type == gguf::GgmlType::F32 ? DType::F32 : t.type == gguf::GgmlType::F16 ? DType::F16 : DType::BF16;
    return TensorView::contiguous(const_cast<std::byte*>(data), dt, shape);
  }
  ByteBuffer src(static_cast<size_t>(n) * sizeof(float));
  auto* v = reinterpret_cast<float*>(src.data());
  gguf::dequantize(t.type, data, v, n);
  if (r.fix == Fix::kNormMinusOne)
    for (int64_t i = 0; i < n; ++i) v[i] -= 1.0f;  // exact for stored weights in [0.5, 2] (Sterbenz)
  if (r.fix == Fix::kALog)
    for (int64_t i = 0; i < n; ++i) v[i] = std::log(-v[i]);  // A_log = log(-ssm_a); exp() of it is ssm_a within an ulp or two
  const Reorder ro = reorder_of(r.fix, config_);
  const int64_t nk = config_.gdn.num_key_heads, ratio = nk > 0 ? config_.gdn.num_value_heads / nk : 1;
  if ((ro.rows || ro.cols) && ratio > 1) {
    const int64_t rows = got[0], cols = n / rows;
    ByteBuffer out(src.size());
    auto* o = reinterpret_cast<float*>(out.data());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t si = ro.rows ? tiled_index(i, ro.offset, nk, ratio, ro.head_dim) : i;
      for (int64_t j = 0; j < cols; ++j)
        o[i * cols + j] = v[si * cols + (ro.cols ? tiled_index(j, ro.offset, nk, ratio, ro.head_dim) : j)];
    }
    src = std::move(out);
  }
  owned.push_back(std::move(src));
  return TensorView::contiguous(owned.back().data(), DType::F32, shape);
}

std::optional<BlockWeight> GgufCheckpoint::get_blocks(const std::string& hf, const std::vector<int64_t>& shape,
                                                      std::vector<ByteBuffer>& owned) const {
  const Resolved r = resolve(hf);
  if (!r.info || is_float_type(r.info->type) || shape.size() != 2) return std::nullopt;
  const GgufTensorInfo& t = *r.info;
  if (r.fix == Fix::kExpert) {
    if (t.dims[1] != shape[0] || t.dims[0] != shape[1]) return std::nullopt;  // get() reports it
    if (!gguf::block_format(t.type).dequantize) return std::nullopt;
    const gguf::BlockFormat& bf = gguf::block_format(t.type);
    const auto* base = reinterpret_cast<const std::byte*>(t.data);
    return BlockWeight{t.type, base + r.expert * (shape[0] * shape[1] / bf.block_elems) * bf.block_bytes, shape[0], shape[1]};
  }
  if (t.n_dims != 2 || t.dims[1] != shape[0] || t.dims[0] != shape[1]) return std::nullopt;  // get() reports it
  const Reorder ro = reorder_of(r.fix, config_);
  const int64_t nk = config_.gdn.num_key_heads, ratio = nk > 0 ? config_.gdn.num_value_heads / nk : 1;
  const bool reorder = (ro.rows || ro.cols) && ratio > 1;
  if (!(r.fix == Fix::kNone || r.fix == Fix::kQkvRows || r.fix == Fix::kZRows || r.fix == Fix::kBetaAlphaRows ||
        r.fix == Fix::kOutCols))
    return std::nullopt;  // not a projection's transform
  if (!gguf::block_format(t.type).dequantize) return std::nullopt;  // get() names the type
  const int64_t rows = shape[0], cols = shape[1];
  if (!reorder) return BlockWeight{t.type, t.data, rows, cols};
  const gguf::BlockFormat& bf = gguf::block_format(t.type);
  const int64_t be = bf.block_elems, row_bytes = cols / be * bf.block_bytes;
  if (ro.cols && ro.head_dim % be != 0) return std::nullopt;  // a head is not whole blocks: get() dequantizes
  ByteBuffer out(static_cast<size_t>(rows * row_bytes));
  const auto* in = reinterpret_cast<const std::byte*>(t.data);
  for (int64_t i = 0; i < rows; ++i) {
    if (ro.rows) {
      const int64_t si = tiled_index(i, ro.offset, nk, ratio, ro.head_dim);
      std::memcpy(out.data() + i * row_bytes, in + si * row_bytes, static_cast<size_t>(row_bytes));
    } else {  // columns: whole blocks of a head move together
      for (int64_t b = 0; b < cols / be; ++b) {
        const int64_t sb = tiled_index(b * be, ro.offset, nk, ratio, ro.head_dim) / be;
        std::memcpy(out.data() + i * row_bytes + b * bf.block_bytes, in + i * row_bytes + sb * bf.block_bytes, bf.block_bytes);
      }
    }
  }
  owned.push_back(std::move(out));
  return BlockWeight{t.type, owned.back().data(), rows, cols};
}

}  // namespace hanpu::model
