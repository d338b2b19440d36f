// A safetensors checkpoint written as GGUF (gguf_export.hpp). The tensor mapping is the GGUF
// loader's table run backwards (src/model/gguf_arch.cpp: gguf_export_tensor); the metadata keys
// and the tokenizer keys are those llama.cpp's converter writes (convert_hf_to_gguf.py with
// conversion/qwen.py, conversion/kimi_linear.py for Kimi's tiktoken vocabulary, gguf-py's
// gguf_writer.py and vocab.py); the per-tensor types of the
// mixes follow llama.cpp's src/llama-quant.cpp (llama_tensor_get_type_impl).
#include "model/gguf_export.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "hanpu/model.hpp"
#include "hanpu/tokenizer.hpp"
#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
#include "io/gguf_writer.hpp"
#include "io/json_io.hpp"
#include "io/safetensors.hpp"
#include "model/gguf_arch.hpp"
#include "model/tokenizer_bpe.hpp"

namespace hanpu {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using gguf::GgmlType;

struct FormatRow {
  GgufFileFormat format;
  const char* name;
  uint32_t file_type;  // llama_ftype (llama.h)
  GgmlType base;       // the type of a quantized tensor before the mix's rules
};
constexpr FormatRow kFormats[] = {
    {GgufFileFormat::kF16, "f16", 1, GgmlType::F16},
    {GgufFileFormat::kQ8_0, "q8_0", 7, GgmlType::Q8_0},
    {GgufFileFormat::kQ4_K_M, "q4_k_m", 15, GgmlType::Q4_K},
    // Every quantized tensor Q4_K: what `llama-quantize --pure ... Q4_K_S` writes (ftype Q4_K_S).
    {GgufFileFormat::kQ4_K, "q4_k", 14, GgmlType::Q4_K},
    {GgufFileFormat::kQ6_K, "q6_k", 18, GgmlType::Q6_K},
    {GgufFileFormat::kQ5_K_M, "q5_k_m", 17, GgmlType::Q5_K},
    // Every quantized tensor Q5_K: what `llama-quantize --pure ... Q5_K_S` writes (ftype Q5_K_S).
    {GgufFileFormat::kQ5_K, "q5_k", 16, GgmlType::Q5_K},
};

const FormatRow& row_of(GgufFileFormat f) {
  for (const FormatRow& r : kFormats)
    if (r.format == f) return r;
  throw Error("unknown GGUF file format");
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// llama-quant.cpp tensor_allows_quantization, the rules that can apply to the architectures hanpu
// writes: tensors of 2 or more dims whose name ends in "weight", except norms, the router
// (ffn_gate_inp, also ffn_gate_inp_shexp) and the small convs (ssm_conv1d, ssm_conv1d_{q,k,v}).
bool allows_quantization(const std::string& name, const std::vector<int64_t>& dims) {
  int64_t wide = 0;  // dims other than 1: the converter's "n_dims <= 1" test is on the squeezed data
  for (int64_t d : dims) wide += d != 1;
  return dims.size() >= 2 && wide >= 2 && ends_with(name, "weight") && name.find("_norm.weight") == std::string::npos &&
         name.find("ffn_gate_inp") == std::string::npos && name.find("ssm_conv1d") == std::string::npos;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

float to_float(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::F32: return static_cast<const float*>(v.data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
    default: throw Error("tensor of dtype " + std::string(dtype_name(v.dtype)) + " cannot be written as GGUF (float tensors only)");
  }
}

std::string token_content(const json& j) {  // tokenizer_config's "eos_token": "<x>" or {"content": "<x>"}
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

// The keys llama.cpp's kimi-linear and bailingmoe3 converters write (conversion/kimi_linear.py
// KimiLinearModel.set_gguf_parameters, conversion/bailingmoe3.py BailingMoeV3Model), from the
// parsed config: the inverse of gguf_meta::kda_mla_decoder and the families' GGUF config
// functions (model/family_kimi_linear.cpp, family_bailing_hybrid.cpp). `tc` gives the few values
// the model description does not keep (context length, Kimi's head_dim, the shared-expert count).
void write_kda_mla_metadata(const std::string& arch, const ModelConfig& c, const json& tc, const std::string& config_path,
                            GgufWriter& w) {
  const bool ling = arch == "bailingmoe3";
  const auto u32 = [&](const std::string& key, int64_t v) { w.add_u32(arch + "." + key, static_cast<uint32_t>(v)); };
  const auto json_uint = [&](std::initializer_list<const char*> keys, int64_t fallback) -> int64_t {
    for (const char* k : keys)
      if (tc.contains(k) && tc[k].is_number_integer() && tc[k].get<int64_t>() >= 0) return tc[k].get<int64_t>();
    return fallback;
  };
  if (c.moe.router_scoring != RouterScoring::kSigmoid && c.num_moe_layers() > 0)
    throw Error("quantize --format: '" + config_path + "': the router is not sigmoid-scored, which llama.cpp's " + arch +
                " (expert_gating_func 2) expects");
  u32("block_count", c.num_layers);
  u32("context_length", json_uint({"max_position_embeddings", "model_max_length"}, 0));
  u32("embedding_length", c.hidden_size);
  u32("feed_forward_length", c.mlp.intermediate_size);
  u32("attention.head_count", c.mla.num_heads);
  std::vector<int32_t> kv_per_layer;
  for (bool full : c.is_full_attention) kv_per_layer.push_back(full ? 1 : 0);  // 0 = a KDA layer
  w.add_i32s(arch + ".attention.head_count_kv", kv_per_layer);
  if (ling) w.add_f32(arch + ".rope.freq_base", static_cast<float>(c.mla.rope_theta));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  int64_t dense_lead = 0;
  while (dense_lead < c.num_layers && !c.layer_is_moe(dense_lead)) ++dense_lead;
  const int64_t shared = json_uint({"num_shared_experts", "n_shared_experts"}, 0);
  if (c.num_moe_layers() > 0) {
    u32("expert_count", c.moe.num_experts);
    u32("expert_used_count", c.moe.num_experts_per_tok);
    u32("expert_group_count", c.moe.num_expert_groups);
    u32("expert_group_used_count", c.moe.topk_groups);
    u32("expert_gating_func", 2);  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
  }
  u32("attention.key_length", c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
  u32("attention.value_length", ling ? c.kda.head_dim : json_uint({"head_dim"}, c.kda.head_dim));
  u32("vocab_size", c.vocab_size);
  u32("ssm.conv_kernel", c.kda.conv_kernel);
  u32("kda.head_dim", c.kda.head_dim);
  if (ling) {
    w.add_bool(arch + ".kda.safe_gate", c.kda.safe_gate);
    w.add_f32(arch + ".kda.gate_lower_bound", static_cast<float>(c.kda.lower_bound));
  }
  if (c.mla.q_lora_rank > 0) u32("attention.q_lora_rank", c.mla.q_lora_rank);
  u32("attention.kv_lora_rank", c.mla.kv_lora_rank);
  u32("rope.dimension_count", c.mla.qk_rope_head_dim);
  u32("attention.key_length_mla", c.mla.qk_head_dim());
  u32("attention.value_length_mla", c.mla.v_head_dim);
  if (c.num_moe_layers() > 0) {
    u32("expert_feed_forward_length", c.moe.intermediate_size);
    // llama.cpp's n_ff_shexp is the shared experts' total width
    if (ling) u32("expert_shared_feed_forward_length", c.moe.shared_expert_intermediate_size);
    u32("expert_shared_count", shared);
  }
  u32("leading_dense_block_count", dense_lead);
  if (c.num_moe_layers() > 0) {
    w.add_f32(arch + ".expert_weights_scale", static_cast<float>(c.moe.routed_scaling_factor));
    if (ling) w.add_bool(arch + ".expert_weights_norm", c.moe.norm_topk_prob);
  }
}

}  // namespace

GgufFileFormat parse_gguf_file_format(const std::string& name) {
  std::string names;
  for (const FormatRow& r : kFormats) {
    if (name == r.name) return r.format;
    names += (names.empty() ? "" : ", ") + std::string(r.name);
  }
  throw Error("GGUF format '" + name + "' is not one hanpu writes (" + names + ")");
}

uint32_t gguf_file_type(GgufFileFormat f) { return row_of(f).file_type; }

GgmlType gguf_tensor_type(GgufFileFormat f, const std::string& name, const std::vector<int64_t>& dims, int i_attn_v,
                          int n_attn_v, int64_t n_layer, bool tied, int64_t n_expert) {
  if (!allows_quantization(name, dims)) return GgmlType::F32;  // as the converter writes them
  const FormatRow& row = row_of(f);
  GgmlType t = row.base;
  // Q4_K_M and Q5_K_M share these rules in llama-quant.cpp (the output, attn_v-like tensors and
  // ffn_down of the use_more_bits layers in Q6_K); the rest stays the mix's base type.
  if (f == GgufFileFormat::kQ4_K_M || f == GgufFileFormat::kQ5_K_M) {
    const bool output = name == "output.weight" || (tied && name == "token_embd.weight");
    if (output) {
      t = GgmlType::Q6_K;
    } else if (ends_with(name, "attn_v.weight") || ends_with(name, "attn_qkv.weight")) {
      // attn_qkv counts as attn_v in llama.cpp (category_is_attn_v), so qwen35's linear-attention
      // in_proj_qkv follows the attn_v rule, counted over both kinds in file order.
      if (use_more_bits(i_attn_v, n_attn_v)) t = GgmlType::Q6_K;
      if (n_expert == 8) t = GgmlType::Q8_0;  // llama.cpp: "for the 8-expert model, bumping this to Q8_0"
    } else if (name.find("attn_k.weight") != std::string::npos) {
      if (n_expert == 8) t = GgmlType::Q8_0;  // the same rule for attn_k
    } else if (name.find("ffn_down") != std::string::npos) {
      int layer = 0;
      if (std::sscanf(name.c_str(), "blk.%d.", &layer) == 1 && use_more_bits(layer, n_layer)) t = GgmlType::Q6_K;
    } else if (name.find("attn_output.weight") != std::string::npos) {
      if (n_expert == 8 && f == GgufFileFormat::kQ4_K_M) t = GgmlType::Q5_K;  // Q4_K_M (not Q5_K_M) of 8 experts
    }
  }
  // llama.cpp's tensor_type_fallback for rows that are not whole blocks: Q4_K -> Q5_0, Q5_K ->
  // Q5_1, Q6_K -> Q8_0; rows that are not whole blocks of 32 -> F16, as there.
  const gguf::BlockFormat& bf = gguf::block_format(t);
  if (dims[0] % bf.block_elems != 0) {
    const GgmlType fallback = t == GgmlType::Q4_K ? GgmlType::Q5_0 : t == GgmlType::Q5_K ? GgmlType::Q5_1 : GgmlType::Q8_0;
    t = dims[0] % 32 == 0 ? fallback : GgmlType::F16;
  }
  (void)n_layer;
  return t;
}

namespace {

// The split regex and normalizer of a tokenizer.json whose pre-tokenizer is one Split (regex,
// isolated) then ByteLevel, as Qwen's and Ling's are; "" when it is shaped otherwise.
std::pair<std::string, bool> split_of(const json& tok) {
  std::string regex;
  const json& pre = tok.contains("pre_tokenizer") ? tok["pre_tokenizer"] : json();
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const json& split = pre["pretokenizers"][0];
    if (split.is_object() && split.value("type", "") == "Split" && split.value("behavior", "") == "Isolated" &&
        !split.value("invert", false) && split.contains("pattern") && split["pattern"].is_object() &&
        split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() &&
        pre["pretokenizers"][1].is_object() && pre["pretokenizers"][1].value("type", "") == "ByteLevel")
      regex = split["pattern"]["Regex"].get<std::string>();
  }
  const json& norm = tok.contains("normalizer") ? tok["normalizer"] : json();
  return {regex, norm.is_object() && norm.value("type", "") == "NFC"};
}

// gguf-py's SpecialVocab keys taken from tokenizer_config.json for every vocabulary: the
// add_bos_token flag, and the chat template (tokenizer_config.json's string, else the
// checkpoint's chat_template.jinja).
void write_bos_flag_and_chat_template(GgufWriter& w, const json& tcfg, const fs::path& dir) {
  if (tcfg.contains("add_bos_token") && tcfg["add_bos_token"].is_boolean()) w.add_bool("tokenizer.ggml.add_bos_token", tcfg["add_bos_token"].get<bool>());
  std::string chat_template;
  if (tcfg.contains("chat_template") && tcfg["chat_template"].is_string()) chat_template = tcfg["chat_template"].get<std::string>();
  const fs::path jinja = dir / "chat_template.jinja";
  if (chat_template.empty() && fs::exists(jinja)) chat_template = read_regular_file(jinja.string(), "chat template", kMaxJsonFileBytes);
  if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
}

// Kimi's tiktoken tokenizer as llama.cpp's conversion/kimi_linear.py writes it (its set_vocab,
// the tiktoken branch): ids 0..vocab_size-1 as the ranks in GPT-2's byte-level spelling (NORMAL),
// the special tokens (CONTROL), "[PAD<id>]" (UNUSED) elsewhere; the merges recovered from the
// ranks (tok::tiktoken_merges); pre "kimi-k2"; gguf-py's SpecialVocab from tokenizer_config.json
// (no tokenizer.json, so no token ids from it: add_bos_token and the chat template) and from
// config.json (bos/eos/pad_token_id), then the eos id replaced by the tokenizer's own eos.
void add_tiktoken_keys(const fs::path& dir, int64_t vocab_size, GgufWriter& w) {
  const Tokenizer t = Tokenizer::from_tiktoken((dir / "tiktoken.model").string(), (dir / "tokenizer_config.json").string());
  const tok::ByteLevelAlphabet alphabet;
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size)), ranks;
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), 5);  // UNUSED
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (!t.is_special(id)) ranks.push_back(t.token_bytes(id));  // the ranks come first, id = rank
    if (id >= vocab_size) continue;                              // the converter stops at vocab_size
    tokens[static_cast<size_t>(id)] = t.is_special(id) ? t.token_bytes(id) : alphabet.from_bytes(t.token_bytes(id));
    types[static_cast<size_t>(id)] = t.is_special(id) ? 3 : 1;
  }
  for (int64_t i = t.vocab_size(); i < vocab_size; ++i) tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", model::kGgufKimiPre);
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_strings("tokenizer.ggml.merges", tok::tiktoken_merges(ranks));
  const fs::path tcfg_path = dir / "tokenizer_config.json", config_path = dir / "config.json";
  const json tcfg = parse_json(read_regular_file(tcfg_path.string(), "tokenizer config", kMaxJsonFileBytes), tcfg_path.string());
  std::optional<uint32_t> eos;
  if (fs::exists(config_path)) {
    const json top = parse_json(read_regular_file(config_path.string(), "config", kMaxJsonFileBytes), config_path.string());
    const json& tc = top.contains("text_config") && !top.contains("bos_token_id") ? top["text_config"] : top;
    for (const auto& [key, gguf_key] : {std::pair<const char*, const char*>{"bos_token_id", "tokenizer.ggml.bos_token_id"},
                                        {"eos_token_id", "tokenizer.ggml.eos_token_id"},
                                        {"pad_token_id", "tokenizer.ggml.padding_token_id"}}) {
      if (!tc.contains(key) || !tc[key].is_number_integer()) continue;  // SpecialVocab takes integers only
      const int64_t id = tc[key].get<int64_t>();
      if (id < 0 || id >= vocab_size) continue;  // as SpecialVocab._set_special_token (out of range: ignored)
      if (std::string(key) == "eos_token_id") eos = static_cast<uint32_t>(id);
      else w.add_u32(gguf_key, static_cast<uint32_t>(id));
    }
  }
  if (t.eos_token_id()) eos = static_cast<uint32_t>(*t.eos_token_id());
  if (eos) w.add_u32("tokenizer.ggml.eos_token_id", *eos);
  write_bos_flag_and_chat_template(w, tcfg, dir);
}

GgufExportStats build_gguf_unchecked(const std::string& model_dir, GgufFileFormat f, GgufWriter& w);

// The JSON files' fields are read with nlohmann's accessors below; a field of another type than
// the writer expects (in tokenizer.json, tokenizer_config.json or the index) becomes an error
// naming the checkpoint and nlohmann's description of the field.
GgufExportStats build_gguf(const std::string& model_dir, GgufFileFormat f, GgufWriter& w) {
  try {
    return build_gguf_unchecked(model_dir, f, w);
  } catch (const nlohmann::json::exception& e) {
    throw Error("quantize --format: checkpoint '" + model_dir +
                "': a field of config.json, tokenizer.json, tokenizer_config.json or the index is not what a "
                "checkpoint of its family has: " + e.what());
  }
}

}  // namespace

bool add_gguf_tokenizer_keys(const std::string& model_dir, int64_t vocab_size, GgufWriter& w) {
  // Tokenizer (gguf-py vocab.py / convert_hf_to_gguf.py get_vocab_base for a byte-level BPE):
  // tokens by id up to vocab_size (gaps "[PADi]", UNUSED), added special tokens CONTROL, other
  // added tokens USER_DEFINED, merges as "a b".
  const fs::path dir(model_dir);
  const std::string tok_path = (dir / "tokenizer.json").string();
  if (!fs::exists(tok_path)) {
    if (!fs::exists(dir / "tiktoken.model")) return false;
    add_tiktoken_keys(dir, vocab_size, w);
    return true;
  }
  const json tok = parse_json(read_regular_file(tok_path, "tokenizer", 1ull << 30), tok_path);
  if (!tok.contains("model") || tok["model"].value("type", "") != "BPE")
    throw Error("quantize --format: '" + tok_path + "': model.type is not BPE (GGUF tokenizer.ggml.model gpt2 needs a byte-level BPE)");
  // llama.cpp names the pre-tokenizer (its converter by a hash of the tokenizer's ids on a test
  // text); hanpu by the split regex and normalizer, which are what the name stands for.
  const auto [regex, nfc] = split_of(tok);
  const model::GgufPreTokenizer* pre = model::gguf_pre_tokenizer_for(regex, nfc);
  if (!pre)
    throw Error("quantize --format: '" + tok_path + "': the pre-tokenizer (split regex " + json(regex).dump() +
                ", normalizer " + (nfc ? "NFC" : "not NFC") + ") is none of llama.cpp's that hanpu knows (" +
                model::gguf_pre_tokenizer_names() + "), so no tokenizer.ggml.pre can be written for it");
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), 5);  // UNUSED
  std::vector<bool> seen(static_cast<size_t>(vocab_size), false);
  std::map<std::string, int64_t> id_of;
  const auto place = [&](const std::string& t, int64_t id, int32_t type) {
    if (id < 0 || id >= vocab_size)
      throw Error("quantize --format: '" + tok_path + "': token '" + t + "' has id " + std::to_string(id) +
                  ", expected below vocab_size " + std::to_string(vocab_size));
    tokens[static_cast<size_t>(id)] = t;
    types[static_cast<size_t>(id)] = type;
    seen[static_cast<size_t>(id)] = true;
    id_of[t] = id;
  };
  for (auto it = tok["model"]["vocab"].begin(); it != tok["model"]["vocab"].end(); ++it) place(it.key(), it.value().get<int64_t>(), 1);
  if (tok.contains("added_tokens"))
    for (const json& a : tok["added_tokens"]) place(a["content"].get<std::string>(), a["id"].get<int64_t>(), a.value("special", false) ? 3 : 4);
  for (int64_t i = 0; i < vocab_size; ++i)
    if (!seen[static_cast<size_t>(i)]) tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
  std::vector<std::string> merges;
  for (const json& m : tok["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre->name);
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_strings("tokenizer.ggml.merges", merges);
  json tcfg = json::object();
  const fs::path tcfg_path = dir / "tokenizer_config.json";
  if (fs::exists(tcfg_path)) tcfg = parse_json(read_regular_file(tcfg_path.string(), "tokenizer config", kMaxJsonFileBytes), tcfg_path.string());
  for (const auto& [key, gguf_key] : {std::pair<const char*, const char*>{"bos_token", "tokenizer.ggml.bos_token_id"},
                                      {"eos_token", "tokenizer.ggml.eos_token_id"},
                                      {"pad_token", "tokenizer.ggml.padding_token_id"}}) {
    if (!tcfg.contains(key)) continue;
    const std::string content = token_content(tcfg[key]);
    auto it = id_of.find(content);
    if (it == id_of.end()) throw Error("quantize --format: '" + tcfg_path.string() + "': " + key + " '" + content + "' is not a token of " + tok_path);
    w.add_u32(gguf_key, static_cast<uint32_t>(it->second));
  }
  write_bos_flag_and_chat_template(w, tcfg, dir);
  return true;
}

namespace {

GgufExportStats build_gguf_unchecked(const std::string& model_dir, GgufFileFormat f, GgufWriter& w) {
  const fs::path dir(model_dir);
  const std::string config_path = (dir / "config.json").string();
  const std::string config_text = read_regular_file(config_path, "config", kMaxJsonFileBytes);
  const ModelConfig config = parse_model_config(config_text, config_path);
  // The GGUF architecture whose mapping (the family registry's) reads this model_type back.
  std::string arch, writable;
  for (const std::string& a : model::gguf_writable_archs()) {
    const model::GgufMapping* m = model::gguf_mapping(a);
    if (m && config.model_type == m->model_type) arch = a;
    writable += (writable.empty() ? "" : ", ") + a + (m ? std::string(" (") + m->model_type + ")" : "");
  }
  if (arch.empty())
    throw Error("quantize --format: '" + config_path + "' is a " + config.model_type +
                " model; hanpu writes GGUF for " + writable + " only");
  const json top = parse_json(config_text, config_path);
  const json& tc = top.contains("text_config") ? top["text_config"] : top;
  const auto field = [&](const char* key) -> const json& {
    if (!tc.contains(key)) throw Error("quantize --format: '" + config_path + "' has no '" + key + "'");
    return tc[key];
  };
  const auto bad = [&](const std::string& key, const json& v, const char* expected) {
    return Error("quantize --format: '" + config_path + "': field '" + key + "' is " + v.dump() + ", expected " + expected);
  };
  const auto uint_field = [&](const char* key) -> int64_t {
    const json& v = field(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > int64_t{UINT32_MAX})
      throw bad(key, v, "a non-negative integer below 2^32");
    return v.get<int64_t>();
  };
  const auto float_of = [&](const json& v, const std::string& key) -> double {
    if (!v.is_number()) throw bad(key, v, "a number");
    return v.get<double>();
  };
  const int64_t n_layer = uint_field("num_hidden_layers");

  w.add_string("general.architecture", arch);
  w.add_string("general.type", "model");
  w.add_string("general.name", fs::path(fs::absolute(dir).lexically_normal()).filename().string());
  const bool qwen = arch == "qwen35" || arch == "qwen35moe" || arch == "qwen3next";
  if (qwen) {
  const int64_t head_dim = uint_field("head_dim");
  w.add_u32(arch + ".block_count", static_cast<uint32_t>(n_layer));
  w.add_u32(arch + ".context_length", static_cast<uint32_t>(uint_field("max_position_embeddings")));
  w.add_u32(arch + ".embedding_length", static_cast<uint32_t>(uint_field("hidden_size")));
  if (tc.contains("intermediate_size"))  // dense MLP width (absent from Qwen3.5-MoE's config)
    w.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(uint_field("intermediate_size")));
  if (arch != "qwen35") {  // the experts' keys (conversion/qwen.py: Qwen3NextModel, Qwen3_5MoeModel)
    w.add_u32(arch + ".expert_count", static_cast<uint32_t>(uint_field("num_experts")));
    w.add_u32(arch + ".expert_used_count", static_cast<uint32_t>(uint_field("num_experts_per_tok")));
    w.add_u32(arch + ".expert_feed_forward_length", static_cast<uint32_t>(uint_field("moe_intermediate_size")));
    w.add_u32(arch + ".expert_shared_feed_forward_length", static_cast<uint32_t>(uint_field("shared_expert_intermediate_size")));
  }
  w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(uint_field("num_attention_heads")));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(uint_field("num_key_value_heads")));
  const json& rope = tc.contains("rope_parameters") ? tc["rope_parameters"] : tc;
  if (rope.contains("mrope_section")) {  // padded to 4 sections as the converter does
    std::vector<int32_t> sections;
    for (const json& v : rope["mrope_section"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        throw bad("rope_parameters.mrope_section", rope["mrope_section"], "an array of non-negative integers");
      sections.push_back(v.get<int32_t>());
    }
    sections.resize(std::max<size_t>(4, sections.size()), 0);
    w.add_i32s(arch + ".rope.dimension_sections", sections);
  }
  if (!rope.contains("rope_theta")) throw Error("quantize --format: '" + config_path + "' has no rope_theta");
  w.add_f32(arch + ".rope.freq_base", static_cast<float>(float_of(rope["rope_theta"], "rope_theta")));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(float_of(field("rms_norm_eps"), "rms_norm_eps")));
  w.add_u32(arch + ".attention.key_length", static_cast<uint32_t>(head_dim));
  w.add_u32(arch + ".attention.value_length", static_cast<uint32_t>(head_dim));
  w.add_u32("general.file_type", gguf_file_type(f));
  const int64_t nv = uint_field("linear_num_value_heads");
  w.add_u32(arch + ".ssm.conv_kernel", static_cast<uint32_t>(uint_field("linear_conv_kernel_dim")));
  w.add_u32(arch + ".ssm.state_size", static_cast<uint32_t>(uint_field("linear_key_head_dim")));
  w.add_u32(arch + ".ssm.group_count", static_cast<uint32_t>(uint_field("linear_num_key_heads")));
  w.add_u32(arch + ".ssm.time_step_rank", static_cast<uint32_t>(nv));
  w.add_u32(arch + ".ssm.inner_size", static_cast<uint32_t>(uint_field("linear_value_head_dim") * nv));
  std::vector<bool> recurrent;
  for (int64_t i = 0; i < n_layer; ++i) recurrent.push_back(!config.is_full_attention.at(static_cast<size_t>(i)));
  w.add_bools(arch + ".attention.recurrent_layers", recurrent);
  // The converter writes the config's interval or 4 when it has none (conversion/qwen.py
  // Qwen3NextModel.set_gguf_parameters); llama.cpp reads recurrent_layers first.
  w.add_u32(arch + ".full_attention_interval",
            tc.contains("full_attention_interval") ? static_cast<uint32_t>(uint_field("full_attention_interval")) : 4u);
  const double partial = rope.contains("partial_rotary_factor") ? float_of(rope["partial_rotary_factor"], "partial_rotary_factor") : 1.0;
  w.add_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(static_cast<double>(head_dim) * partial));
  } else {
    write_kda_mla_metadata(arch, config, tc, config_path, w);
    w.add_u32("general.file_type", gguf_file_type(f));
  }
  w.add_u32("general.quantization_version", 2);

  if (!add_gguf_tokenizer_keys(model_dir, config.vocab_size, w)) {
    // No tokenizer (as the tiny test checkpoints): a vocabulary-less file, which llama.cpp loads
    // (llama-vocab.cpp: tokenizer.ggml.model "no_vocab" with <arch>.vocab_size); run it on token ids.
    w.add_string("tokenizer.ggml.model", "no_vocab");
    if (qwen) w.add_u32(arch + ".vocab_size", static_cast<uint32_t>(config.vocab_size));
  }

  // Tensors, shard by shard in the index's order of shards and each shard's order of names.
  std::vector<std::string> shards;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    const json index = parse_json(read_regular_file(index_path.string(), "index", kMaxJsonFileBytes), index_path.string());
    std::set<std::string> seen_shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it)
      if (seen_shards.insert(it.value().get<std::string>()).second) shards.push_back(it.value().get<std::string>());
    std::sort(shards.begin(), shards.end());
  } else {
    shards.push_back("model.safetensors");
  }
  struct Pending {
    std::string name;
    std::vector<int64_t> dims;
    std::vector<float> data;
  };
  std::vector<Pending> pending;
  // Experts arrive one [out, in] slice at a time and are stacked into [E, out, in] per GGUF name.
  struct Stack {
    std::vector<int64_t> dims;
    std::vector<std::vector<float>> slices;
    std::string first_hf;
  };
  std::map<std::string, Stack> stacks;
  const int64_t n_experts = config.moe.num_experts;
  for (const std::string& shard : shards) {
    const SafetensorsFile st = SafetensorsFile::map((dir / shard).string());
    for (const std::string& hf_name : st.names()) {
      std::string name = hf_name;
      if (name.rfind("model.language_model.", 0) == 0) name = "model." + name.substr(21);
      if (name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0) continue;  // not the text model (llama.cpp: --no-mtp, mmproj)
      // MTP layers appended after the decoder (Ling's model.layers.{num_hidden_layers}.*): --no-mtp.
      int layer = -1;
      if (std::sscanf(name.c_str(), "model.layers.%d.", &layer) == 1 && layer >= config.num_layers) continue;
      if (name == "lm_head.weight" && config.tie_word_embeddings) continue;
      const TensorView v = st.get(hf_name);
      std::vector<float> data(static_cast<size_t>(v.numel()));
      for (int64_t i = 0; i < v.numel(); ++i) data[static_cast<size_t>(i)] = to_float(v, i);
      std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.rank);
      std::vector<model::GgufExportedTensor> out = model::gguf_export_tensor(arch, config, name, shape, std::move(data));
      if (out.empty())
        throw Error("quantize --format: tensor '" + hf_name + "' of '" + (dir / shard).string() + "' has no GGUF name in the " +
                    arch + " mapping (src/model/gguf_arch.cpp, the family's GgufMapping)");
      for (model::GgufExportedTensor& t : out) {
        if (t.expert < 0) {
          pending.push_back({t.name, t.dims, std::move(t.data)});
          continue;
        }
        if (t.expert >= n_experts)
          throw Error("quantize --format: tensor '" + hf_name + "' is expert " + std::to_string(t.expert) +
                      ", expected below num_experts " + std::to_string(n_experts));
        Stack& s = stacks[t.name];
        if (s.slices.empty()) {
          s.slices.resize(static_cast<size_t>(n_experts));
          s.dims = t.dims;
          s.first_hf = hf_name;
        } else if (s.dims != t.dims) {
          throw Error("quantize --format: tensor '" + hf_name + "' has another shape than '" + s.first_hf +
                      "', stacked with it into '" + t.name + "'");
        }
        s.slices[static_cast<size_t>(t.expert)] = std::move(t.data);
      }
    }
  }
  for (auto& [name, s] : stacks) {
    Pending p{name, s.dims, {}};
    p.dims.push_back(n_experts);
    for (int64_t e = 0; e < n_experts; ++e) {
      std::vector<float>& slice = s.slices[static_cast<size_t>(e)];
      if (slice.empty())
        throw Error("quantize --format: '" + model_dir + "' has no expert " + std::to_string(e) + " for '" + name +
                    "' (it has '" + s.first_hf + "')");
      p.data.insert(p.data.end(), slice.begin(), slice.end());
      std::vector<float>().swap(slice);
    }
    pending.push_back(std::move(p));
  }
  const bool tied = std::none_of(pending.begin(), pending.end(), [](const Pending& p) { return p.name == "output.weight"; });
  int n_attn_v = 0;
  for (const Pending& p : pending) n_attn_v += ends_with(p.name, "attn_v.weight") || ends_with(p.name, "attn_qkv.weight");
  // Layer order for the attn_v counter (llama.cpp counts in file order, which is the converter's
  // layer order): sort by (layer, name) with the global tensors first.
  const auto layer_of = [](const std::string& n) {
    int l = -1;
    return std::sscanf(n.c_str(), "blk.%d.", &l) == 1 ? l : -1;
  };
  std::stable_sort(pending.begin(), pending.end(), [&](const Pending& a, const Pending& b) {
    return std::make_pair(layer_of(a.name), a.name) < std::make_pair(layer_of(b.name), b.name);
  });
  GgufExportStats stats;
  int i_attn_v = 0;
  struct Job {
    Pending* p;
    GgmlType type;
    std::vector<uint8_t> bytes;
  };
  std::vector<Job> jobs;
  for (Pending& p : pending) {
    const GgmlType t = gguf_tensor_type(f, p.name, p.dims, i_attn_v, n_attn_v, n_layer, tied, n_experts);
    i_attn_v += ends_with(p.name, "attn_v.weight") || ends_with(p.name, "attn_qkv.weight");
    const gguf::BlockFormat& bf = gguf::block_format(t);
    jobs.push_back({&p, t, std::vector<uint8_t>(p.data.size() / bf.block_elems * bf.block_bytes)});
  }
  // The tensors are independent: quantized on all cores, largest first (the LM head / embedding
  // would otherwise finish last on one core).
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return jobs[a].p->data.size() > jobs[b].p->data.size(); });
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::string error;
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) {
      Job& j = jobs[order[k]];
      try {
        gguf::quantize(j.type, j.p->data.data(), j.bytes.data(), static_cast<int64_t>(j.p->data.size()));
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = "quantize --format: tensor '" + j.p->name + "': " + e.what();
      }
      std::vector<float>().swap(j.p->data);
    }
  };
  std::vector<std::thread> threads;
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < n_threads; ++i) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (!error.empty()) throw Error(error);
  for (Job& j : jobs) {
    stats.bytes += j.bytes.size();
    stats.types.emplace_back(j.p->name, j.type);
    w.add_tensor(j.p->name, j.type, j.p->dims, std::move(j.bytes));
  }
  stats.tensors = pending.size();
  return stats;
}

}  // namespace

GgufExportStats write_checkpoint_as_gguf(const std::string& model_dir, const std::string& out_path, GgufFileFormat f) {
  GgufWriter w;
  const GgufExportStats stats = build_gguf(model_dir, f, w);
  w.write(out_path);
  return stats;
}

int write_checkpoint_as_gguf_memfd(const std::string& model_dir, GgufFileFormat f, GgufExportStats* stats) {
  GgufWriter w;
  const GgufExportStats s = build_gguf(model_dir, f, w);
  const int fd = ::memfd_create("hanpu-quantized.gguf", MFD_CLOEXEC);
  if (fd < 0) throw Error(std::string("quantizing '") + model_dir + "' at load: memfd_create failed: " + std::strerror(errno));
  try {
    w.write_fd(fd, "the GGUF of '" + model_dir + "' quantized at load");
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (stats) *stats = s;
  return fd;
}

}  // namespace hanpu
