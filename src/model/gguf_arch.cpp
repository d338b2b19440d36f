// GGUF checkpoints as hanpu models (gguf_arch.hpp): the lookup of a GGUF architecture's mapping
// in the family registry, the metadata helpers the mappings' config functions use, and the
// loader that resolves each HF tensor name to the file's tensor and undoes what llama.cpp's
// converter did to it. The mappings themselves (metadata keys, tensor names, transforms) live in
// the family files next to their registry rows (family_qwen.cpp, family_kimi_linear.cpp,
// family_bailing_hybrid.cpp).
//
// Sources (read, not copied): llama.cpp's gguf-py/gguf/constants.py (MODEL_TENSOR names per
// architecture, metadata keys), gguf-py/gguf/tensor_mapping.py (HF name <-> GGUF name),
// convert_hf_to_gguf.py with conversion/qwen.py, conversion/kimi_linear.py and
// conversion/bailingmoe3.py (the tensor transforms undone here), src/models/*.cpp (the shapes
// llama.cpp's loader accepts).
#include "model/gguf_arch.hpp"

#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "hanpu/model_family.hpp"
#include "model/fused_gdn_layout.hpp"
#include "model/tokenizer_bpe.hpp"

namespace hanpu::model {

using Fix = GgufFix;

namespace {

using json = nlohmann::ordered_json;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_float_type(gguf::GgmlType t) {
  return t == gguf::GgmlType::F32 || t == gguf::GgmlType::F16 || t == gguf::GgmlType::BF16;
}

std::vector<int64_t> without_unit_dims(std::vector<int64_t> s) {
  s.erase(std::remove(s.begin(), s.end(), int64_t{1}), s.end());
  return s;
}

// Fixes whose tensors llama.cpp stores with other unit dims than HF (conv weights, A_log, a
// shared-expert gate): their shapes are compared without the 1s (same elements, same order).
bool unit_dims_free(Fix f) {
  return f == Fix::kConv || f == Fix::kALog || f == Fix::kALogExp || f == Fix::kSqueezed || f == Fix::kDtBias;
}

}  // namespace

namespace gguf_meta {

void fail_key(const GgufFile& f, const std::string& key, const std::string& got, const std::string& expected) {
  throw Error("GGUF file '" + f.path() + "': key '" + key + "' is " + got + ", expected " + expected);
}

std::optional<uint64_t> optional_uint(const GgufFile& f, const std::string& key) {
  if (!f.find(key)) return std::nullopt;
  return f.get_uint(key);
}

std::optional<double> optional_float(const GgufFile& f, const std::string& key) {
  if (!f.find(key)) return std::nullopt;
  return f.get_float(key);
}

std::optional<bool> optional_bool(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) return std::nullopt;
  const auto* b = std::get_if<bool>(&v->value);
  if (!b) fail_key(f, key, v->describe(), "a bool");
  return *b;
}

uint64_t main_layers(const GgufFile& f, const std::string& arch) {
  const uint64_t blocks = f.get_uint(arch + ".block_count");
  const uint64_t nextn = optional_uint(f, arch + ".nextn_predict_layers").value_or(0);
  if (nextn >= blocks)
    fail_key(f, arch + ".nextn_predict_layers", std::to_string(nextn),
             "fewer than " + arch + ".block_count (" + std::to_string(blocks) + ")");
  return blocks - nextn;
}

json layer_types_from_recurrent(const GgufFile& f, const std::string& arch, uint64_t n_layer) {
  json lt = json::array();
  const std::string key = arch + ".attention.recurrent_layers";
  if (const GgufValue* v = f.find(key)) {
    const auto* arr = std::get_if<std::vector<GgufValue>>(&v->value);
    if (v->type != GgufType::ARRAY || !arr || arr->size() < n_layer)
      fail_key(f, key, v->describe(), "an array of at least " + std::to_string(n_layer) + " bools (one per layer)");
    for (uint64_t i = 0; i < n_layer; ++i) {
      const auto* b = std::get_if<bool>(&(*arr)[i].value);
      if (!b) fail_key(f, key + "'[" + std::to_string(i), (*arr)[i].describe(), "a bool");
      lt.push_back(*b ? "linear_attention" : "full_attention");
    }
    return lt;
  }
  const uint64_t interval = f.get_uint(arch + ".full_attention_interval");
  if (interval == 0) fail_key(f, arch + ".full_attention_interval", "0", ">= 1");
  for (uint64_t i = 0; i < n_layer; ++i) lt.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
  return lt;
}

json layer_types_from_head_count_kv(const GgufFile& f, const std::string& arch, uint64_t n_layer) {
  const std::string key = arch + ".attention.head_count_kv";
  const GgufValue* v = f.find(key);
  if (!v) throw Error("GGUF file '" + f.path() + "': key '" + key + "' is missing");
  const auto* arr = std::get_if<std::vector<GgufValue>>(&v->value);
  if (v->type != GgufType::ARRAY || !arr || arr->size() < n_layer)
    fail_key(f, key, v->describe(),
             "an array of at least " + std::to_string(n_layer) + " integers (per layer: 0 for a KDA layer, > 0 for MLA)");
  json lt = json::array();
  for (uint64_t i = 0; i < n_layer; ++i) {
    const GgufValue& e = (*arr)[i];
    const auto* u = std::get_if<uint64_t>(&e.value);
    const auto* s = std::get_if<int64_t>(&e.value);
    if (!u && !(s && *s >= 0)) fail_key(f, key + "'[" + std::to_string(i), e.describe(), "a non-negative integer");
    const uint64_t n = u ? *u : static_cast<uint64_t>(*s);
    lt.push_back(n == 0 ? "linear_attention" : "full_attention");
  }
  return lt;
}

void kda_mla_decoder(const GgufFile& f, const std::string& a, json& c) {
  const uint64_t n_layer = main_layers(f, a);
  c["hidden_size"] = f.get_uint(a + ".embedding_length");
  c["num_hidden_layers"] = n_layer;
  if (const auto ff = optional_uint(f, a + ".feed_forward_length")) c["intermediate_size"] = *ff;
  c["rms_norm_eps"] = f.get_float(a + ".attention.layer_norm_rms_epsilon");
  const uint64_t heads = f.get_uint(a + ".attention.head_count");
  c["num_attention_heads"] = heads;
  // The converters write head_count_kv 1 (MLA as MQA over the latent) per attention layer;
  // hanpu's parsers take the expanded form, one key/value head per query head.
  c["num_key_value_heads"] = heads;
  c["layer_types"] = layer_types_from_head_count_kv(f, a, n_layer);
  // MLA.
  c["kv_lora_rank"] = f.get_uint(a + ".attention.kv_lora_rank");
  if (const auto q = optional_uint(f, a + ".attention.q_lora_rank")) c["q_lora_rank"] = *q;
  const uint64_t rope = f.get_uint(a + ".rope.dimension_count"), k_mla = f.get_uint(a + ".attention.key_length_mla");
  if (k_mla <= rope)
    fail_key(f, a + ".attention.key_length_mla", std::to_string(k_mla),
             "more than " + a + ".rope.dimension_count (" + std::to_string(rope) + "): the MLA key is [nope | rope]");
  c["qk_rope_head_dim"] = rope;
  c["qk_nope_head_dim"] = k_mla - rope;
  c["v_head_dim"] = f.get_uint(a + ".attention.value_length_mla");
  // KDA: head_count heads of kda.head_dim (llama.cpp's loaders: n_embd_head_kda * n_head).
  c["linear_num_heads"] = heads;
  c["linear_head_dim"] = f.get_uint(a + ".kda.head_dim");
  c["linear_conv_kernel_dim"] = f.get_uint(a + ".ssm.conv_kernel");
  // Channel mixers: the first leading_dense_block_count layers dense, the rest MoE.
  const uint64_t dense = optional_uint(f, a + ".leading_dense_block_count").value_or(0);
  if (dense > n_layer)
    fail_key(f, a + ".leading_dense_block_count", std::to_string(dense), "at most the layer count " + std::to_string(n_layer));
  c["first_k_dense_replace"] = dense;
  if (dense == n_layer) return;
  c["num_experts"] = f.get_uint(a + ".expert_count");
  c["num_experts_per_token"] = f.get_uint(a + ".expert_used_count");
  c["moe_intermediate_size"] = f.get_uint(a + ".expert_feed_forward_length");
  c["num_shared_experts"] = f.get_uint(a + ".expert_shared_count");
  if (const auto g = optional_uint(f, a + ".expert_group_count")) c["num_expert_group"] = *g;
  if (const auto g = optional_uint(f, a + ".expert_group_used_count")) c["topk_group"] = *g;
  if (const auto s = optional_float(f, a + ".expert_weights_scale")) c["routed_scaling_factor"] = *s;
  if (const auto n = optional_bool(f, a + ".expert_weights_norm")) c["moe_renormalize"] = *n;
  const uint64_t gating = f.get_uint(a + ".expert_gating_func");
  if (gating != 2)  // llama.cpp's ExpertGatingFuncType: 1 softmax, 2 sigmoid, 4 sqrt-softplus
    fail_key(f, a + ".expert_gating_func", std::to_string(gating), "2 (sigmoid: the Kimi Linear and Ling 3.0 routers)");
}

}  // namespace gguf_meta

const GgufMapping* gguf_mapping(const std::string& arch) {
  for (const ModelFamily* f : model_families())
    if (f->gguf_mapping && f->gguf_architecture == arch) return f->gguf_mapping;
  return nullptr;
}

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 && !std::filesystem::is_directory(path, ec);
}

std::vector<std::string> gguf_supported_archs() {
  std::vector<std::string> out;
  for (const ModelFamily* f : model_families())
    if (f->gguf_mapping && !f->gguf_architecture.empty()) out.push_back(f->gguf_architecture);
  return out;
}

std::string gguf_config_json(const GgufModel& m) {
  const GgufFile& f = m.main();
  const std::string arch = f.get_string("general.architecture");
  const GgufMapping* row = gguf_mapping(arch);
  if (!row) {
    std::string names;
    for (const std::string& a : gguf_supported_archs()) names += (names.empty() ? "" : ", ") + a;
    throw Error("GGUF file '" + f.path() + "': key 'general.architecture' is '" + arch +
                "', which hanpu cannot run (supported: " + names + ")");
  }
  json c = json::object();
  c["model_type"] = row->model_type;
  row->config(m, arch, c);
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

const std::vector<GgufPreTokenizer>& gguf_pre_tokenizers() {
  // The Split regexes as the Hugging Face tokenizer.json files have them; llama.cpp's
  // src/llama-vocab.cpp (llm_tokenizer_bpe) quotes each as the "original regex from
  // tokenizer.json" above its own rewrite (case-insensitive groups spelled out, possessive
  // quantifiers made greedy), and maps the names onto LLAMA_VOCAB_PRE_TYPE_QWEN2 / _QWEN35 /
  // _BAILINGMOE. hanpu runs the original through PCRE2, as it does for a tokenizer.json.
  // Ling: "bailingmoe" is Ling-lite's name and "bailingmoe2" Ling 2.0's in llama.cpp's
  // conversion/base.py (get_vocab_base_pre, which names a tokenizer by a hash of its ids on a test
  // text); both map to _BAILINGMOE. Ling 3.0 (bailingmoe3) has no hash of its own there and its
  // converter (conversion/bailingmoe3.py) asks that table, so a converted Ling 3.0 file carries
  // the name of the published tokenizer its own equals (presumably Ling 2.0's; any other name is
  // refused). The writer names Ling's regex "bailingmoe2" (the first row that matches). The
  // normalizer: none, as llama.cpp applies none (Ling's tokenizer.json was not here to check).
  static const char* const kLing =
      R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
  static const std::vector<GgufPreTokenizer> rows = {
      {"qwen2", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       true},
      {"qwen35",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       true},
      {"bailingmoe2", kLing, false},
      {"bailingmoe", kLing, false},
  };
  return rows;
}

const GgufPreTokenizer* gguf_pre_tokenizer_for(const std::string& regex, bool nfc) {
  for (const GgufPreTokenizer& row : gguf_pre_tokenizers())
    if (regex == row.regex && nfc == row.nfc) return &row;
  return nullptr;
}

std::string gguf_pre_tokenizer_names() {
  std::string names;
  for (const GgufPreTokenizer& row : gguf_pre_tokenizers()) names += std::string(names.empty() ? "" : ", ") + row.name;
  return names + ", " + kGgufKimiPre;
}

namespace {

// tokenizer.ggml.model must be gpt2 (byte-level BPE); returns tokenizer.ggml.pre, which must be
// one of the names hanpu implements.
std::string checked_pre(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.model' is '" + model +
                "', expected 'gpt2' (byte-level BPE, the only tokenizer model hanpu reads from GGUF)");
  if (!f.find("tokenizer.ggml.pre"))
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.pre' is missing, expected one of the pre-tokenizers hanpu knows: " +
                gguf_pre_tokenizer_names());
  const std::string pre = f.get_string("tokenizer.ggml.pre");
  if (pre == kGgufKimiPre) return pre;
  for (const GgufPreTokenizer& row : gguf_pre_tokenizers())
    if (pre == row.name) return pre;
  throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.pre' is '" + pre +
              "', expected one of the pre-tokenizers hanpu knows: " + gguf_pre_tokenizer_names());
}

std::optional<int32_t> eos_of(const GgufFile& f, size_t n_tokens) {
  if (!f.find("tokenizer.ggml.eos_token_id")) return std::nullopt;
  const uint64_t id = f.get_uint("tokenizer.ggml.eos_token_id");
  if (id >= n_tokens)
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.eos_token_id' is " + std::to_string(id) +
                ", expected a token id below " + std::to_string(n_tokens));
  return static_cast<int32_t>(id);
}

}  // namespace

bool gguf_tokenizer_is_tiktoken(const GgufFile& f) { return checked_pre(f) == kGgufKimiPre; }

GgufTiktokenVocab gguf_tiktoken_vocab(const GgufFile& f) {
  if (checked_pre(f) != kGgufKimiPre)
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.pre' is not '" + kGgufKimiPre + "' (not a tiktoken vocabulary)");
  // llama.cpp's conversion/kimi_linear.py (KimiLinearModel.set_vocab) writes, for id 0..vocab_size-1:
  // the tiktoken ranks in GPT-2's byte-level spelling (NORMAL; id = rank), then tokenization_kimi.py's
  // special tokens (CONTROL), "[PAD<id>]" (UNUSED) where an id has no token. Merges are recovered
  // from the ranks for llama.cpp's BPE; tiktoken merges by rank, so they are not read back here.
  const auto& tokens = array_key(f, "tokenizer.ggml.tokens", GgufType::STRING);
  const auto& types = array_key(f, "tokenizer.ggml.token_type", GgufType::I32);
  if (types.size() != tokens.size())
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.token_type' has " + std::to_string(types.size()) +
                " entries, expected one per token of 'tokenizer.ggml.tokens' (" + std::to_string(tokens.size()) + ")");
  GgufTiktokenVocab v;
  const tok::ByteLevelAlphabet alphabet;
  bool ranks_done = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = std::get<std::string>(tokens[i].value);
    const int64_t type = std::get<int64_t>(types[i].value);
    const std::string where = "GGUF file '" + f.path() + "': key 'tokenizer.ggml.tokens'[" + std::to_string(i) + "]";
    if (type == kTokenNormal) {
      if (ranks_done)
        throw Error(where + " is a normal token after the special and unused ones, expected the tiktoken ranks first "
                    "(a kimi-k2 vocabulary has id = rank)");
      auto bytes = alphabet.to_bytes(t);
      if (!bytes || bytes->empty())
        throw Error(where + " is not in GPT-2's byte-level spelling, expected a tiktoken rank's bytes so spelt");
      v.ranks.push_back(std::move(*bytes));
    } else if (type == kTokenControl) {
      ranks_done = true;
      if (t.empty()) throw Error(where + " is an empty special token, expected its text");
      v.specials.emplace_back(static_cast<int32_t>(i), t);
    } else if (type == 5 /* UNUSED */) {
      ranks_done = true;
    } else {
      throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.token_type'[" + std::to_string(i) + "] is " +
                  std::to_string(type) + ", expected 1 (normal), 3 (control) or 5 (unused) in a kimi-k2 vocabulary");
    }
  }
  tok::check_tiktoken_ranks(v.ranks, "GGUF file '" + f.path() + "': key 'tokenizer.ggml.tokens' (kimi-k2 ranks)");
  v.eos = eos_of(f, tokens.size());
  return v;
}

std::string gguf_tokenizer_json(const GgufFile& f, std::optional<int32_t>* eos) {
  const std::string pre = checked_pre(f);
  const GgufPreTokenizer* row = nullptr;
  for (const GgufPreTokenizer& r : gguf_pre_tokenizers())
    if (pre == r.name) row = &r;
  if (!row)
    throw Error("GGUF file '" + f.path() + "': key 'tokenizer.ggml.pre' is '" + pre +
                "', a tiktoken vocabulary (read by gguf_tiktoken_vocab), not a tokenizer.json");
  const std::string regex = row->regex;
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
      {"normalizer", row->nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json(nullptr)},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", added}};
  if (eos) *eos = eos_of(f, tokens.size());
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
  const GgufTensorInfo* second = nullptr;  // kKvB: attn_v_b (info is attn_k_b)
  std::string second_name;
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

struct RuleHit {
  std::string gguf_name;  // empty: no rule
  Fix fix = Fix::kNone;
  int64_t expert = -1, layer = -1;
};

// The first rule of `row` for HF name `hf`: global rules by the full name, layer rules by the part
// after "model.layers.{i}." on a layer of the kind the rule is for (per `c`).
RuleHit find_rule(const GgufMapping& row, const std::string& hf, const ModelConfig& c) {
  RuleHit hit;
  for (const GgufTensorRule& g : row.global)
    if (hf == g.hf) return {g.gguf, g.fix, -1, -1};
  const std::string lp = "model.layers.";
  if (hf.rfind(lp, 0) != 0) return hit;
  const size_t dot = hf.find('.', lp.size());
  if (dot == std::string::npos || dot == lp.size() || dot - lp.size() > 9) return hit;
  const std::string idx = hf.substr(lp.size(), dot - lp.size()), rest = hf.substr(dot + 1);
  if (!std::all_of(idx.begin(), idx.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return hit;
  const int64_t layer = std::stoll(idx);
  const bool in_range = layer < static_cast<int64_t>(c.is_full_attention.size());
  for (const GgufTensorRule& l : row.layer) {
    if (l.only != GgufLayerKind::kAny) {
      if (!in_range) continue;
      const bool full = c.is_full_attention[static_cast<size_t>(layer)];
      if (full != (l.only == GgufLayerKind::kAttention)) continue;
    }
    int64_t expert = -1;
    if (rule_matches(l.hf, rest, &expert)) return {"blk." + idx + "." + l.gguf, l.fix, expert, layer};
  }
  return hit;
}

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

// The value-head tiling of `fix` (none unless the mapping tiles and there are more value heads
// than key heads).
Reorder reorder_of(Fix fix, const ModelConfig& c, bool tiled) {
  const int64_t nk = c.gdn.num_key_heads;
  if (!tiled || nk <= 0 || c.gdn.num_value_heads / nk <= 1) return {};
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

// For fixes that move whole rows: the file row of each of the `rows` HF rows; empty when rows
// stay where they are.
std::vector<int64_t> source_rows(Fix fix, const ModelConfig& c, bool tiled, int64_t rows) {
  const int64_t nk = c.gdn.num_key_heads, nv = c.gdn.num_value_heads;
  if (fix == Fix::kBetaOfBa || fix == Fix::kAlphaOfBa) {  // [b (nv) | a (nv)] from the fused per-group rows
    const std::vector<int64_t> all = qwen3next_ba_source_rows(nk, nv);
    const auto from = all.begin() + (fix == Fix::kBetaOfBa ? 0 : nv);
    return std::vector<int64_t>(from, from + nv);
  }
  const Reorder ro = reorder_of(fix, c, tiled);
  if (!ro.rows) return {};
  std::vector<int64_t> src(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) src[static_cast<size_t>(i)] = tiled_index(i, ro.offset, nk, nv / nk, ro.head_dim);
  return src;
}

// Rows the file holds for an HF tensor of `hf_rows` rows: Qwen3-Next's b and a are halves of ssm_ba.
int64_t file_rows(Fix fix, int64_t hf_rows) { return fix == Fix::kBetaOfBa || fix == Fix::kAlphaOfBa ? 2 * hf_rows : hf_rows; }

}  // namespace

GgufCheckpoint::GgufCheckpoint(const std::string& path) : path_(path) {
  file_ = std::make_shared<GgufModel>(GgufModel::open(path));
  arch_ = file_->main().get_string("general.architecture");
  config_ = parse_model_config(gguf_config_json(*file_), "GGUF file '" + path + "' (its metadata as config.json)");
  mapping_ = gguf_mapping(arch_);  // non-null: gguf_config_json refused the others
  if (mapping_->adjust) mapping_->adjust(config_);
}

uint64_t GgufCheckpoint::data_bytes() const {
  uint64_t n = 0;
  for (const GgufFile& f : file_->files())
    for (const GgufTensorInfo& t : f.tensors()) n += t.bytes;
  return n;
}

bool GgufCheckpoint::has_lm_head() const { return file_->find_tensor("output.weight") != nullptr; }

GgufCheckpoint::Resolved GgufCheckpoint::resolve(const std::string& hf) const {
  const RuleHit hit = find_rule(*mapping_, hf, config_);
  Resolved r;
  r.gguf_name = hit.gguf_name;
  r.fix = hit.fix;
  r.expert = hit.expert;
  if (r.gguf_name.empty()) return r;
  if (r.fix == Fix::kKvB) {
    // llama.cpp's converters split kv_b_proj into attn_k_b and attn_v_b; older files keep attn_kv_b.
    const std::string blk = "blk." + std::to_string(hit.layer) + ".";
    if (const GgufTensorInfo* whole = file_->find_tensor(blk + "attn_kv_b.weight")) {
      r.gguf_name = blk + "attn_kv_b.weight";
      r.fix = Fix::kNone;
      r.info = whole;
      return r;
    }
    r.second_name = blk + "attn_v_b.weight";
    r.second = file_->find_tensor(r.second_name);
  }
  r.info = file_->find_tensor(r.gguf_name);
  if (r.fix == Fix::kKvB && !r.second) r.info = nullptr;
  // An expert beyond the stacked tensor's last: no such tensor.
  if (r.info && r.fix == Fix::kExpert && (r.info->n_dims != 3 || r.expert >= r.info->dims[2])) r.info = nullptr;
  return r;
}

bool GgufCheckpoint::has(const std::string& hf_name) const { return resolve(hf_name).info != nullptr; }

std::vector<std::string> gguf_writable_archs() { return {"qwen35", "qwen35moe", "qwen3next", "kimi-linear", "bailingmoe3"}; }

std::vector<GgufExportedTensor> gguf_export_tensor(const std::string& arch, const ModelConfig& c, const std::string& hf,
                                                   const std::vector<int64_t>& hf_shape, std::vector<float> data) {
  const GgufMapping* row = gguf_mapping(arch);
  const std::vector<std::string> writable = gguf_writable_archs();
  if (!row || std::find(writable.begin(), writable.end(), arch) == writable.end())
    throw Error("writing GGUF architecture '" + arch + "' is not supported by hanpu (it writes qwen35, qwen35moe, qwen3next, "
                "kimi-linear, bailingmoe3)");
  const auto ggml_dims = [](const std::vector<int64_t>& shape) { return std::vector<int64_t>(shape.rbegin(), shape.rend()); };
  if (arch == "qwen3next") {
    // The checkpoint's fused GDN projections (conversion/qwen.py Qwen3NextModel.modify_tensors):
    // in_proj_qkvz, per key-head group [q (dk) | k (dk) | v (r dv) | z (r dv)] rows, is split into
    // attn_qkv = [all q | all k | all v] and attn_gate = [all z]; in_proj_ba stays whole as ssm_ba.
    const std::string lp = "model.layers.";
    const size_t dot = hf.find('.', lp.size());
    const std::string rest = hf.rfind(lp, 0) == 0 && dot != std::string::npos ? hf.substr(dot + 1) : "";
    const std::string blk = rest.empty() ? "" : "blk." + hf.substr(lp.size(), dot - lp.size()) + ".";
    if (rest == "linear_attn.in_proj_ba.weight") return {{blk + "ssm_ba.weight", ggml_dims(hf_shape), std::move(data)}};
    if (rest == "linear_attn.in_proj_qkvz.weight") {
      const int64_t nk = c.gdn.num_key_heads, dk = c.gdn.key_head_dim, dv = c.gdn.value_head_dim;
      const int64_t r = nk > 0 ? c.gdn.num_value_heads / nk : 0, group = 2 * dk + 2 * r * dv;
      if (hf_shape.size() != 2 || hf_shape[0] != nk * group)
        throw Error("writing GGUF tensor (HF '" + hf + "'): shape " + shape_str(hf_shape) + ", expected [" +
                    std::to_string(nk * group) + ", hidden] from the config");
      const int64_t cols = hf_shape[1];
      std::vector<float> qkv, z;
      const auto rows = [&](std::vector<float>& to, int64_t g, int64_t from, int64_t count) {
        const float* p = data.data() + (g * group + from) * cols;
        to.insert(to.end(), p, p + count * cols);
      };
      for (int64_t g = 0; g < nk; ++g) rows(qkv, g, 0, dk);
      for (int64_t g = 0; g < nk; ++g) rows(qkv, g, dk, dk);
      for (int64_t g = 0; g < nk; ++g) rows(qkv, g, 2 * dk, r * dv);
      for (int64_t g = 0; g < nk; ++g) rows(z, g, 2 * dk + r * dv, r * dv);
      const int64_t qkv_rows = static_cast<int64_t>(qkv.size()) / cols, z_rows = static_cast<int64_t>(z.size()) / cols;
      std::vector<GgufExportedTensor> out;
      out.push_back({blk + "attn_qkv.weight", {cols, qkv_rows}, std::move(qkv)});
      out.push_back({blk + "attn_gate.weight", {cols, z_rows}, std::move(z)});
      return out;
    }
  }
  const RuleHit hit = find_rule(*row, hf, c);
  const std::string& name = hit.gguf_name;
  const Fix fix = hit.fix;
  if (name.empty()) return {};
  int64_t n = 1;
  for (int64_t d : hf_shape) n *= d;
  if (static_cast<int64_t>(data.size()) != n || hf_shape.empty())
    throw Error("writing GGUF tensor '" + name + "' (HF '" + hf + "'): " + std::to_string(data.size()) +
                " values for shape " + shape_str(hf_shape));
  std::vector<int64_t> shape = hf_shape;
  const bool kda = c.linear_mixer == TokenMixer::kKda;
  if (fix == Fix::kConv) {
    if (shape.size() != 3 || shape[1] != 1)
      throw Error("writing GGUF tensor '" + name + "' (HF '" + hf + "'): shape " + shape_str(hf_shape) +
                  ", expected [channels, 1, kernel]");
    // GDN convs squeezed to [C, K] (conversion/qwen.py); the three KDA convs as [1, C, 1, K]
    // (conversion/kimi_linear.py, bailingmoe3.py), the shape llama.cpp's loaders ask for.
    shape = kda ? std::vector<int64_t>{1, shape[0], 1, shape[2]} : std::vector<int64_t>{shape[0], shape[2]};
  }
  if (fix == Fix::kKvB) {
    // MLA kv_b_proj [nh * (nope + v), r] -> attn_k_b [nh, r, nope] (k_b transposed per head) and
    // attn_v_b [nh, v, r] (conversion/kimi_linear.py, bailingmoe3.py); GgufCheckpoint::get undoes it.
    const int64_t nh = c.mla.num_heads, kr = c.mla.kv_lora_rank, nope = c.mla.qk_nope_head_dim, dv = c.mla.v_head_dim;
    if (shape != std::vector<int64_t>{nh * (nope + dv), kr})
      throw Error("writing GGUF tensor '" + name + "' (HF '" + hf + "'): shape " + shape_str(hf_shape) + ", expected " +
                  shape_str({nh * (nope + dv), kr}) + " from the config");
    std::vector<float> kb(static_cast<size_t>(nh * kr * nope)), vb(static_cast<size_t>(nh * dv * kr));
    for (int64_t h = 0; h < nh; ++h) {
      const float* head = data.data() + h * (nope + dv) * kr;
      for (int64_t j = 0; j < nope; ++j)
        for (int64_t r = 0; r < kr; ++r) kb[static_cast<size_t>((h * kr + r) * nope + j)] = head[j * kr + r];
      std::copy(head + nope * kr, head + (nope + dv) * kr, vb.begin() + h * dv * kr);
    }
    std::string v_name = name;
    v_name.replace(v_name.rfind("attn_k_b"), 8, "attn_v_b");
    std::vector<GgufExportedTensor> out;
    out.push_back({name, ggml_dims({nh, kr, nope}), std::move(kb)});
    out.push_back({v_name, ggml_dims({nh, dv, kr}), std::move(vb)});
    return out;
  }
  if (fix == Fix::kNormMinusOne)
    for (float& v : data) v += 1.0f;  // conversion/qwen.py: norm weights stored as 1 + w (float32)
  if (fix == Fix::kALog)
    for (float& v : data) v = -std::exp(v);  // conversion/qwen.py, kimi_linear.py: ssm_a = -exp(A_log)
  if (fix == Fix::kALogExp) {
    for (float& v : data) v = std::exp(v);  // conversion/bailingmoe3.py: ssm_a = exp(A_log), [H, 1]
    shape = {n, 1};
  }
  const Reorder ro = reorder_of(fix, c, row->tiled_value_heads);
  const int64_t nk = c.gdn.num_key_heads, ratio = nk > 0 ? c.gdn.num_value_heads / nk : 1;
  if (ro.rows || ro.cols) {
    const int64_t rows = shape[0], cols = n / rows;
    std::vector<float> out(data.size());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t di = ro.rows ? tiled_index(i, ro.offset, nk, ratio, ro.head_dim) : i;
      for (int64_t j = 0; j < cols; ++j)
        out[di * cols + (ro.cols ? tiled_index(j, ro.offset, nk, ratio, ro.head_dim) : j)] = data[i * cols + j];
    }
    data.swap(out);
  }
  std::vector<GgufExportedTensor> out;
  out.push_back({name, ggml_dims(shape), std::move(data), fix == Fix::kExpert ? hit.expert : -1});
  return out;
}

namespace {

// The GGML types hanpu decodes, from the block-format registry: "F32, F16, Q4_0, ...".
std::string decodable_types() {
  std::string s;
  for (const gguf::BlockFormat& f : gguf::block_formats())
    if (f.dequantize) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// A tensor's dims in HF order (GGUF's reversed).
std::vector<int64_t> hf_dims(const GgufTensorInfo& t) {
  std::vector<int64_t> got;
  for (int d = t.n_dims - 1; d >= 0; --d) got.push_back(t.dims[d]);
  return got;
}

// HANPU_GGUF_WEIGHTS: where the quantized projections a model streams per token live.
//   copy (default): copied at load into anonymous memory advised for transparent huge pages
//     (ByteBuffer: 2 MiB aligned, MADV_HUGEPAGE), the file's pages then released from the process.
//   map: read from the file mapping itself, i.e. from the page cache.
// A file's page cache is usually in 4 KiB pages (written by llama-quantize or cp; Linux maps it with
// 2 MiB entries only when it was read into large folios, which CONFIG_READ_ONLY_THP_FOR_FS or a
// file system with large folios and a cold cache decide, not the reader); the hardware prefetchers
// stop at each 4 KiB page and the TLB misses every 4 KiB, which cost the decode GEMV 25-40%
// (docs/GGUF.md "Decode GEMV", "Weights in huge pages"). Measured on Zen 3: 2-24% less decode CPU
// per token, for 1.1-2.4 s of system time at load (zeroing the fresh huge pages) and a transient
// peak of one tensor; the steady resident set is the same, since the copied file pages leave the
// process (they stay in the page cache, reclaimable).
bool gguf_weights_copied() {
  static const bool copy = [] {
    const char* v = std::getenv("HANPU_GGUF_WEIGHTS");
    if (v == nullptr || *v == '\0' || std::string(v) == "copy") return true;
    if (std::string(v) == "map") return false;
    throw Error(std::string("HANPU_GGUF_WEIGHTS: got '") + v +
                "', expected 'copy' (quantized weights copied into huge pages at load) or 'map' (read from the file "
                "mapping)");
  }();
  return copy;
}

// Whether the file's pages are shmem (a tmpfs such as /dev/shm, or the memfd of `--weights q4_k_m`
// etc., HybridModel::load, reached under /proc/self/fd/): they are not reclaimable and stay while
// the file exists, so dropping them from the process frees nothing and a copy would hold the
// weights twice. statfs failing (it should not, the file is open) counts as not shmem: a copy.
bool file_is_shmem(const std::string& path) {
  struct statfs fs{};
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

// Whether kept_blocks copies a tensor of `bytes` of the file at `path`.
bool blocks_copied(size_t bytes, const std::string& path) {
  return gguf_weights_copied() && bytes != 0 && path.rfind("/proc/self/fd/", 0) != 0 && !file_is_shmem(path);
}

// The file's whole pages inside a copied tensor leave the process (they stay in the page cache):
// the resident set then holds the weights once. A hint: failure leaves them mapped, nothing more.
void release_mapped(const std::byte* data, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// A copied tensor's bytes (GgufCheckpoint::weight_copy): a function from size to writable memory.
using CopyAlloc = std::function<std::byte*(size_t)>;

// The blocks at `data` as the model keeps them: copied into huge pages (see gguf_weights_copied) or
// left in the mapping. Files in shmem (file_is_shmem) stay in the mapping.
const std::byte* kept_blocks(const std::byte* data, size_t bytes, const std::string& path, const CopyAlloc& alloc) {
  if (!blocks_copied(bytes, path)) return data;
  std::byte* copy = alloc(bytes);
  std::memcpy(copy, data, bytes);
  release_mapped(data, bytes);
  return copy;
}

// HANPU_GGUF_LAYOUT: how copied Q4_K projections are laid out for the decode GEMV.
//   lanes (default): GgufLinear's row-lane layout (groups of 8 rows interleaved; the copy at load
//     writes it instead of the file's rows, the same number of bytes, no second copy), where the AVX2 forms
//     run and the projection has at least 8 rows; docs/GGUF.md "Decode GEMV on row lanes".
//   file: the file's rows (the layout before; for comparison).
// Only where the weights are copied anyway (gguf_weights_copied, not shmem): a mapped file stays
// as it is.
bool gguf_row_lanes_wanted(gguf::GgmlType type, int64_t rows) {
  static const bool lanes = [] {
    const char* v = std::getenv("HANPU_GGUF_LAYOUT");
    if (v == nullptr || *v == '\0' || std::string(v) == "lanes") return true;
    if (std::string(v) == "file") return false;
    throw Error(std::string("HANPU_GGUF_LAYOUT: got '") + v +
                "', expected 'lanes' (Q4_K projections in row lanes for the decode GEMV) or 'file' (the file's rows)");
  }();
  return lanes && GgufLinear::row_lanes_available(type, rows);
}

// kept_blocks as a BlockWeight [rows, cols]; where the blocks are copied and row_lanes_ok, the copy
// is the row-lane layout instead, packed straight from the mapping, whose pages are then released
// as kept_blocks releases them (so the resident set holds the packed layout only, no transient).
BlockWeight kept_block_weight(gguf::GgmlType type, const std::byte* data, int64_t rows, int64_t cols, const std::string& path,
                              const CopyAlloc& alloc, bool row_lanes_ok) {
  const gguf::BlockFormat& bf = gguf::block_format(type);
  const size_t bytes = static_cast<size_t>(rows * (cols / bf.block_elems) * bf.block_bytes);
  if (!row_lanes_ok || !blocks_copied(bytes, path) || !gguf_row_lanes_wanted(type, rows))
    return BlockWeight{type, kept_blocks(data, bytes, path, alloc), rows, cols};
  std::byte* packed = alloc(GgufLinear::row_lanes_bytes(type, rows, cols));
  GgufLinear::pack_row_lanes(type, data, rows, cols, packed);
  release_mapped(data, bytes);
  return BlockWeight{type, packed, rows, cols, GgufLayout::kRowLanes};
}

std::vector<float> dequantized(const GgufTensorInfo& t, const std::string& path) {
  if (!gguf::block_format(t.type).dequantize)
    throw Error("GGUF file '" + path + "': tensor '" + t.name + "' has type " + gguf::block_format(t.type).name +
                ", which hanpu cannot decode (it decodes " + decodable_types() + ")");
  std::vector<float> v(static_cast<size_t>(t.numel()));
  gguf::dequantize(t.type, t.data, v.data(), t.numel());
  return v;
}

}  // namespace

TensorView GgufCheckpoint::get(const std::string& hf, const std::vector<int64_t>& shape, std::vector<ByteBuffer>& owned) const {
  const Resolved r = resolve(hf);
  if (!r.info) {
    if (r.gguf_name.empty())
      throw Error("GGUF file '" + path_ + "': hanpu's tensor '" + hf + "' has no GGUF name in the " + arch_ +
                  " mapping (src/model/gguf_arch.hpp, the family's GgufMapping)");
    if (r.fix == Fix::kKvB && file_->find_tensor(r.gguf_name))
      throw Error("GGUF file '" + path_ + "': tensor '" + r.second_name + "' (with '" + r.gguf_name + "', hanpu's '" + hf +
                  "') is missing");
    throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' (hanpu's '" + hf + "') is missing");
  }
  const GgufTensorInfo& t = *r.info;
  if (r.fix == Fix::kKvB) {
    // MLA kv_b_proj [nh * (nope + v), r]: llama.cpp stores per head k_b transposed (ne {nope, r, nh},
    // HF order [nh, r, nope]) and v_b (ne {r, v, nh}: [nh, v, r]) (conversion/kimi_linear.py,
    // conversion/bailingmoe3.py); both are put back into HF's rows: per head nope key rows, then v rows.
    const int64_t nh = config_.mla.num_heads, kr = config_.mla.kv_lora_rank, nope = config_.mla.qk_nope_head_dim,
                  dv = config_.mla.v_head_dim;
    const std::vector<int64_t> want_k = {nh, kr, nope}, want_v = {nh, dv, kr};
    if (hf_dims(t) != want_k)
      throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' (hanpu's '" + hf + "', keys) has shape " +
                  shape_str(hf_dims(t)) + " (GGUF dims reversed), expected " + shape_str(want_k) + " from the metadata");
    if (hf_dims(*r.second) != want_v)
      throw Error("GGUF file '" + path_ + "': tensor '" + r.second_name + "' (hanpu's '" + hf + "', values) has shape " +
                  shape_str(hf_dims(*r.second)) + " (GGUF dims reversed), expected " + shape_str(want_v) + " from the metadata");
    if (shape != std::vector<int64_t>{nh * (nope + dv), kr})
      throw Error("GGUF file '" + path_ + "': hanpu's '" + hf + "' asked as " + shape_str(shape) + ", the file's '" +
                  r.gguf_name + "' and '" + r.second_name + "' make " + shape_str({nh * (nope + dv), kr}));
    const std::vector<float> kb = dequantized(t, path_), vb = dequantized(*r.second, path_);
    ByteBuffer out(static_cast<size_t>(nh * (nope + dv) * kr) * sizeof(float));
    auto* o = reinterpret_cast<float*>(out.data());
    for (int64_t h = 0; h < nh; ++h) {
      float* head = o + h * (nope + dv) * kr;
      for (int64_t j = 0; j < nope; ++j)
        for (int64_t c = 0; c < kr; ++c) head[j * kr + c] = kb[static_cast<size_t>((h * kr + c) * nope + j)];
      std::memcpy(head + nope * kr, vb.data() + h * dv * kr, static_cast<size_t>(dv * kr) * sizeof(float));
    }
    owned.push_back(std::move(out));
    return TensorView::contiguous(owned.back().data(), DType::F32, shape);
  }
  std::vector<int64_t> want = shape;
  if (!want.empty()) want[0] = file_rows(r.fix, want[0]);
  std::vector<int64_t> got = hf_dims(t);
  const std::byte* data = t.data;
  int64_t n = t.numel();
  if (r.fix == Fix::kExpert) {  // [E, rows, cols] in HF order: expert r.expert's [rows, cols]
    got.erase(got.begin());
    n = t.dims[0] * t.dims[1];
    const gguf::BlockFormat& bf = gguf::block_format(t.type);
    data += static_cast<size_t>(r.expert * (n / bf.block_elems) * bf.block_bytes);
  }
  const bool same = unit_dims_free(r.fix) ? without_unit_dims(got) == without_unit_dims(want) : got == want;
  if (!same)
    throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' (hanpu's '" + hf + "') has shape " +
                shape_str(got) + " (GGUF dims reversed), expected " + shape_str(want) + " from the metadata");
  if (!gguf::block_format(t.type).dequantize)
    throw Error("GGUF file '" + path_ + "': tensor '" + r.gguf_name + "' has type " + gguf::block_format(t.type).name +
                ", which hanpu cannot decode (it decodes " + decodable_types() + ")");
  const bool tiled = mapping_->tiled_value_heads;
  const Reorder ro = reorder_of(r.fix, config_, tiled);
  const std::vector<int64_t> rows_from = source_rows(r.fix, config_, tiled, shape.empty() ? 0 : shape[0]);
  const bool values_change = r.fix == Fix::kNormMinusOne || r.fix == Fix::kALog || r.fix == Fix::kALogExp;
  if (!values_change && !ro.cols && rows_from.empty() && is_float_type(t.type)) {
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
  if (r.fix == Fix::kALogExp)
    for (int64_t i = 0; i < n; ++i) v[i] = std::log(v[i]);  // A_log = log(ssm_a) (bailingmoe3 stores exp(A_log))
  if (ro.cols || !rows_from.empty()) {
    const int64_t rows = shape[0], cols = n / file_rows(r.fix, rows);
    ByteBuffer out(static_cast<size_t>(rows * cols) * sizeof(float));
    auto* o = reinterpret_cast<float*>(out.data());
    const int64_t nk = config_.gdn.num_key_heads, ratio = nk > 0 ? config_.gdn.num_value_heads / nk : 1;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t si = rows_from.empty() ? i : rows_from[static_cast<size_t>(i)];
      for (int64_t j = 0; j < cols; ++j)
        o[i * cols + j] = v[si * cols + (ro.cols ? tiled_index(j, ro.offset, nk, ratio, ro.head_dim) : j)];
    }
    src = std::move(out);
  }
  owned.push_back(std::move(src));
  return TensorView::contiguous(owned.back().data(), DType::F32, shape);
}

// Weight arena. ByteBuffer gives huge pages only to buffers of 2 MiB and more (smaller ones come
// from the heap, in 4 KiB pages) and rounds those up to whole huge pages. A Qwen3.5-0.8B Q4_K_M
// file has 177 of its 518 MB per token in projections just under 2 MiB (the MLP's 3584 x 1024 Q4_K,
// 2,064,384 bytes; attn_gate, ssm_out, attn_output), which the decode GEMV then streamed from 4 KiB
// pages: on the AVX-512 Xeon of docs/GGUF.md, 20% slower than from huge pages ("Decode in the model
// on the AVX-512 Xeon"). So the copies share chunks of kArenaChunk (2 MiB aligned, advised for huge
// pages), in load order, 64-byte aligned; a tensor of kArenaLimit or more keeps a buffer of its own.
// A chunk's unused tail is at most one partly touched huge page of resident memory, against up to
// one per tensor when each is rounded up on its own (the 0.8B Q8_0's 2.2 MB projections took 4 MiB each).
namespace {
constexpr size_t kArenaChunk = size_t{32} << 20;
constexpr size_t kArenaLimit = size_t{16} << 20;
}  // namespace

std::byte* GgufCheckpoint::weight_copy(size_t bytes, std::vector<ByteBuffer>& owned) const {
  if (bytes >= kArenaLimit) {
    owned.emplace_back(bytes);
    return owned.back().data();
  }
  const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (arena_.owner != &owned || arena_.left < need) {
    owned.emplace_back(kArenaChunk);
    arena_ = Arena{&owned, owned.back().data(), kArenaChunk};
  }
  std::byte* p = arena_.next;
  arena_.next += need;
  arena_.left -= need;
  return p;
}

std::optional<BlockWeight> GgufCheckpoint::get_blocks(const std::string& hf, const std::vector<int64_t>& shape,
                                                      std::vector<ByteBuffer>& owned, bool row_lanes_ok) const {
  const CopyAlloc alloc = [&](size_t bytes) { return weight_copy(bytes, owned); };
  const Resolved r = resolve(hf);
  if (!r.info || is_float_type(r.info->type) || shape.size() != 2 || r.fix == Fix::kKvB) return std::nullopt;
  const GgufTensorInfo& t = *r.info;
  if (!gguf::block_format(t.type).dequantize) return std::nullopt;  // get() names the type
  const gguf::BlockFormat& bf = gguf::block_format(t.type);
  if (r.fix == Fix::kExpert) {
    if (t.dims[1] != shape[0] || t.dims[0] != shape[1]) return std::nullopt;  // get() reports it
    const auto* base = reinterpret_cast<const std::byte*>(t.data);
    const int64_t bytes = shape[0] * shape[1] / bf.block_elems * bf.block_bytes;
    return kept_block_weight(t.type, base + r.expert * bytes, shape[0], shape[1], path_, alloc, row_lanes_ok);
  }
  const int64_t rows = shape[0], cols = shape[1];
  if (t.n_dims != 2 || t.dims[1] != file_rows(r.fix, rows) || t.dims[0] != cols) return std::nullopt;  // get() reports it
  if (!(r.fix == Fix::kNone || r.fix == Fix::kQkvRows || r.fix == Fix::kZRows || r.fix == Fix::kBetaAlphaRows ||
        r.fix == Fix::kOutCols || r.fix == Fix::kBetaOfBa || r.fix == Fix::kAlphaOfBa))
    return std::nullopt;  // not a projection's transform
  const bool tiled = mapping_->tiled_value_heads;
  const Reorder ro = reorder_of(r.fix, config_, tiled);
  const std::vector<int64_t> rows_from = source_rows(r.fix, config_, tiled, rows);
  if (!ro.cols && rows_from.empty())
    return kept_block_weight(t.type, reinterpret_cast<const std::byte*>(t.data), rows, cols, path_, alloc, row_lanes_ok);
  const int64_t be = bf.block_elems, row_bytes = cols / be * bf.block_bytes;
  if (ro.cols && ro.head_dim % be != 0) return std::nullopt;  // a head is not whole blocks: get() dequantizes
  const int64_t nk = config_.gdn.num_key_heads, ratio = nk > 0 ? config_.gdn.num_value_heads / nk : 1;
  const bool packed = row_lanes_ok && gguf_row_lanes_wanted(t.type, rows);
  ByteBuffer reordered;  // only when it is packed after (the packed copy is what stays)
  if (packed) reordered = ByteBuffer(static_cast<size_t>(rows * row_bytes));
  std::byte* const out = packed ? reordered.data() : alloc(static_cast<size_t>(rows * row_bytes));
  const auto* in = reinterpret_cast<const std::byte*>(t.data);
  for (int64_t i = 0; i < rows; ++i) {
    if (!rows_from.empty()) {
      std::memcpy(out + i * row_bytes, in + rows_from[static_cast<size_t>(i)] * row_bytes, static_cast<size_t>(row_bytes));
    } else {  // columns: whole blocks of a head move together
      for (int64_t b = 0; b < cols / be; ++b) {
        const int64_t sb = tiled_index(b * be, ro.offset, nk, ratio, ro.head_dim) / be;
        std::memcpy(out + i * row_bytes + b * bf.block_bytes, in + i * row_bytes + sb * bf.block_bytes, bf.block_bytes);
      }
    }
  }
  if (packed) {  // the reordered copy packed; the copy itself dropped
    std::byte* lanes = alloc(GgufLinear::row_lanes_bytes(t.type, rows, cols));
    GgufLinear::pack_row_lanes(t.type, out, rows, cols, lanes);
    return BlockWeight{t.type, lanes, rows, cols, GgufLayout::kRowLanes};
  }
  return BlockWeight{t.type, out, rows, cols};
}

}  // namespace hanpu::model
