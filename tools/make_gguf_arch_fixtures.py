#!/usr/bin/env python3
"""GGUF fixtures of the architectures qwen3next, kimi-linear and bailingmoe3 for
tests/test_gguf_arch.cpp, written with PyPI's `gguf` (GGUFWriter, gguf.quants) from the tiny
safetensors goldens (tests/golden/qwen3next_tiny, kimi_linear_tiny, bailing_hybrid_tiny).

llama.cpp's own converter cannot take these goldens as they are (the qwen35 fixtures are made by it,
tools/make_gguf_model_fixtures.py): Qwen3NextModel has no dense-MLP layer (the golden's
mlp_only_layers [1]); KimiLinearModel reads linear_attn_config, which transformers' save_pretrained
does not write; BailingMoeV3Model derives the layer pattern from layer_group_size (the golden's
layer_types disagree with it) and needs keys the golden lacks. So this script does what those
converters do, step by step, citing each (llama.cpp's convert_hf_to_gguf.py with conversion/base.py,
conversion/qwen.py, conversion/kimi_linear.py, conversion/bailingmoe3.py; metadata key names from
gguf-py's Keys, tensor names from its TENSOR_NAMES), and states where it departs:

  all:          tensors converted to float32 first; 1-D tensors, *_norm.weight, ffn_gate_inp(_shexp),
                conv weights and non-.weight tensors stay F32; the rest F16 or Q8_0, and Q8_0 falls back
                to F16 where a row is not whole 32-element blocks (TextModel.prepare_tensors). The MTP
                tensors are left out (--no-mtp). No tokenizer.ggml.* keys (the Kimi and Ling goldens
                have no tokenizer; llama.cpp reads vocab-less files too).
  qwen3next:    Qwen3NextModel: recurrent_layers and full_attention_interval (the golden's 2; the
                converter writes 4 when transformers' config object lacks the key), A_log -> -exp(A_log), dt_bias -> ssm_dt.bias, conv squeezed, norm
                weights (not linear_attn.norm) + 1, in_proj_qkvz split into attn_qkv ([q | k | v]) and
                attn_gate (z), in_proj_ba kept as ssm_ba, experts stacked. Departure: the dense layer
                (mlp_only_layers) is written as ffn_gate/ffn_up/ffn_down with feed_forward_length.
  kimi-linear:  KimiLinearModel: head_count_kv per layer (0 = KDA), A_log -> -exp(A_log) [1,1,H,1],
                convs as [1, C, 1, K], experts w1/w2/w3 stacked, kv_b_proj split into attn_k_b
                (transposed per head) and attn_v_b. Departures: expert_group_count written (the
                converter reads only `n_group`; the golden has num_expert_group 2, which llama.cpp's
                loader reads from this key), expert_gating_func 2 (sigmoid; the published config's
                moe_router_activation_func, absent from the golden).
  bailingmoe3:  BailingMoeV3Model: as Kimi, but A_log -> exp(A_log) [H, 1], f_proj -> ssm_f_a, g_proj ->
                ssm_g_a (KDA layers) or attn_gate (MLA layers), expert_bias -> exp_probs_b.bias, kda.*
                keys. Departures: the layer kinds from the golden's layer_types, kda.head_dim from
                linear_head_dim (the golden's head_dim is the rope dim), expert_group_count and
                expert_gating_func as for Kimi, expert_shared_feed_forward_length = moe_intermediate_size
                x num_shared_experts (the golden has no moe_shared_expert_intermediate_size).

PyPI gguf 0.19.0 has no MODEL_ARCH.BAILINGMOE3 nor the kda.safe_gate / kda.gate_lower_bound keys;
their names come from llama.cpp's gguf-py/gguf/constants.py and are written here as strings.

Writes tests/data/gguf/{qwen3next,kimi_linear,bailing_hybrid}_tiny-{f16,q8_0}.gguf.
Usage: python3 tools/make_gguf_arch_fixtures.py [--out DIR]   (PyPI gguf, numpy, torch, safetensors)
"""

import argparse
import json
import os
import sys

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")
T = gguf.GGMLQuantizationType


def load_golden(name):
    d = os.path.join(GOLDEN, name)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for s in shards:
        for k, v in load_file(os.path.join(d, s)).items():
            state[k] = v.float().numpy()  # TextModel.prepare_tensors: unsupported dtypes to float32
    return cfg, state


class Writer:
    """GGUFWriter plus the converter's choice of tensor type (TextModel.prepare_tensors)."""

    def __init__(self, path, arch, ftype):
        self.w = gguf.GGUFWriter(path, arch)
        self.arch = arch
        self.ftype = ftype
        self.w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if ftype == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)

    def key(self, k):
        return k.replace("{arch}", self.arch)

    def u32(self, k, v):
        self.w.add_uint32(self.key(k), int(v))

    def f32(self, k, v):
        self.w.add_float32(self.key(k), float(v))

    def bool(self, k, v):
        self.w.add_bool(self.key(k), bool(v))

    def i32s(self, k, v):
        self.w.add_array(self.key(k), [int(x) for x in v])

    def tensor(self, name, data):
        data = np.ascontiguousarray(data, dtype=np.float32)
        f32_kinds = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight", "ssm_conv1d_q.weight",
                     "ssm_conv1d_k.weight", "ssm_conv1d_v.weight")
        if data.ndim <= 1 or name.endswith("_norm.weight") or name.endswith(f32_kinds) or not name.endswith(".weight"):
            qtype = T.F32
        else:
            qtype = T.Q8_0 if self.ftype == "q8_0" else T.F16
        try:
            q = gguf.quants.quantize(data, qtype)
        except gguf.QuantError:  # rows not whole blocks: the converter falls back to F16
            qtype = T.F16
            q = gguf.quants.quantize(data, qtype)
        self.w.add_tensor(name, q, raw_dtype=qtype)

    def close(self):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def exp(x):
    """torch's float32 exp, as the converters compute it (numpy's differs in the last bit here and there)."""
    return torch.exp(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()


def stack_experts(state, prefix, n, names):
    """{gguf_suffix: [E, out, in]} from per-expert tensors prefix + '{e}.' + hf + '.weight'."""
    return {g: np.stack([state.pop(f"{prefix}{e}.{hf}.weight") for e in range(n)]) for hf, g in names}


def split_kv_b(w, n_head, nope, v):
    """kv_b_proj [H*(nope+v), r] -> attn_k_b [H, r, nope] (k_b transposed), attn_v_b [H, v, r]."""
    kv = w.reshape(n_head, nope + v, w.shape[-1])
    return np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1)), np.ascontiguousarray(kv[:, nope:, :])


# ---- qwen3next ----------------------------------------------------------------------------------

def write_qwen3next(path, ftype):
    cfg, st = load_golden("qwen3next_tiny")
    w = Writer(path, "qwen3next", ftype)
    n = cfg["num_hidden_layers"]
    nk, nv, dk, dv = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                      cfg["linear_value_head_dim"])
    H = cfg["hidden_size"]
    w.u32("{arch}.block_count", n)
    w.u32("{arch}.context_length", cfg["max_position_embeddings"])
    w.u32("{arch}.embedding_length", H)
    w.u32("{arch}.feed_forward_length", cfg["intermediate_size"])
    w.u32("{arch}.attention.head_count", cfg["num_attention_heads"])
    w.u32("{arch}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.f32("{arch}.rope.freq_base", cfg["rope_theta"])
    w.f32("{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.u32("{arch}.expert_count", cfg["num_experts"])
    w.u32("{arch}.expert_used_count", cfg["num_experts_per_tok"])
    w.u32("{arch}.attention.key_length", cfg["head_dim"])
    w.u32("{arch}.attention.value_length", cfg["head_dim"])
    w.u32("{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    w.u32("{arch}.expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"])
    w.u32("{arch}.ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    w.u32("{arch}.ssm.state_size", dk)
    w.u32("{arch}.ssm.group_count", nk)
    w.u32("{arch}.ssm.time_step_rank", nv)
    w.u32("{arch}.ssm.inner_size", dv * nv)
    # Qwen3NextModel writes the layer pattern as recurrent_layers (transformers' config gives it
    # layer_types) and full_attention_interval; llama.cpp reads the first, falls back to the second.
    interval = cfg["full_attention_interval"]
    w.w.add_array(w.key("{arch}.attention.recurrent_layers"), [(i + 1) % interval != 0 for i in range(n)])
    w.u32("{arch}.full_attention_interval", interval)
    w.u32("{arch}.rope.dimension_count", int(cfg["head_dim"] * cfg["partial_rotary_factor"]))

    w.tensor("token_embd.weight", st.pop("model.embed_tokens.weight"))
    w.tensor("output_norm.weight", st.pop("model.norm.weight") + 1)
    w.tensor("output.weight", st.pop("lm_head.weight"))
    r = nv // nk
    for i in range(n):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.tensor(b + "attn_norm.weight", st.pop(p + "input_layernorm.weight") + 1)
        w.tensor(b + "post_attention_norm.weight", st.pop(p + "post_attention_layernorm.weight") + 1)
        if p + "linear_attn.A_log" in st:
            a = p + "linear_attn."
            qkvz = st.pop(a + "in_proj_qkvz.weight").reshape(nk, 2 * dk + 2 * r * dv, H)
            q, k = qkvz[:, :dk], qkvz[:, dk:2 * dk]
            v, z = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
            w.tensor(b + "attn_qkv.weight", np.concatenate([x.reshape(-1, H) for x in (q, k, v)]))
            w.tensor(b + "attn_gate.weight", z.reshape(-1, H))
            w.tensor(b + "ssm_ba.weight", st.pop(a + "in_proj_ba.weight"))
            w.tensor(b + "ssm_conv1d.weight", st.pop(a + "conv1d.weight").squeeze())
            w.tensor(b + "ssm_dt.bias", st.pop(a + "dt_bias"))
            w.tensor(b + "ssm_a", -exp(st.pop(a + "A_log")))
            w.tensor(b + "ssm_norm.weight", st.pop(a + "norm.weight"))
            w.tensor(b + "ssm_out.weight", st.pop(a + "out_proj.weight"))
        else:
            a = p + "self_attn."
            for hf, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                w.tensor(b + g + ".weight", st.pop(a + hf + ".weight"))
            w.tensor(b + "attn_q_norm.weight", st.pop(a + "q_norm.weight") + 1)
            w.tensor(b + "attn_k_norm.weight", st.pop(a + "k_norm.weight") + 1)
        m = p + "mlp."
        if m + "gate.weight" in st:
            w.tensor(b + "ffn_gate_inp.weight", st.pop(m + "gate.weight"))
            ex = stack_experts(st, m + "experts.", cfg["num_experts"],
                               [("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")])
            for g, t in ex.items():
                w.tensor(b + g + ".weight", t)
            for hf, g in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
                w.tensor(b + g + ".weight", st.pop(m + "shared_expert." + hf + ".weight"))
            w.tensor(b + "ffn_gate_inp_shexp.weight", st.pop(m + "shared_expert_gate.weight"))
        else:  # mlp_only_layers: a dense MLP (see the docstring)
            for hf, g in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                w.tensor(b + g + ".weight", st.pop(m + hf + ".weight"))
    left = [k for k in st if not k.startswith("mtp.")]
    if left:
        sys.exit(f"qwen3next: tensors not written: {left}")
    w.close()


# ---- kimi-linear and bailingmoe3 -----------------------------------------------------------------

def write_kda_mla(path, ftype, golden, arch):
    kimi = arch == "kimi-linear"
    cfg, st = load_golden(golden)
    w = Writer(path, arch, ftype)
    n, H, nh = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    full = [t == "full_attention" for t in cfg["layer_types"]]
    dense_lead = cfg["mlp_layer_types"].index("sparse")
    nope, rope, dv, kr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    w.u32("{arch}.block_count", n)
    w.u32("{arch}.context_length", cfg["model_max_length"])
    w.u32("{arch}.embedding_length", H)
    w.u32("{arch}.feed_forward_length", cfg["intermediate_size"])
    w.u32("{arch}.attention.head_count", nh)
    w.i32s("{arch}.attention.head_count_kv", [1 if f else 0 for f in full])
    if not kimi:
        w.f32("{arch}.rope.freq_base", cfg["rope_parameters"]["rope_theta"])
    w.f32("{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.u32("{arch}.expert_count", cfg["num_experts"])
    w.u32("{arch}.expert_used_count", cfg["num_experts_per_token"])
    w.u32("{arch}.expert_group_count", cfg["num_expert_group"])
    w.u32("{arch}.expert_group_used_count", cfg["topk_group"])
    w.u32("{arch}.expert_gating_func", gguf.ExpertGatingFuncType.SIGMOID)
    w.u32("{arch}.attention.key_length", kr + rope)
    # TextModel writes head_dim; the published Ling config's head_dim is the KDA head dim (the golden's is the rope dim)
    w.u32("{arch}.attention.value_length", cfg["head_dim"] if kimi else cfg["linear_head_dim"])
    w.u32("{arch}.vocab_size", cfg["vocab_size"])
    w.u32("{arch}.ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    w.u32("{arch}.kda.head_dim", cfg["linear_head_dim"])
    if not kimi:
        w.bool("{arch}.kda.safe_gate", cfg["kda_safe_gate"])
        w.f32("{arch}.kda.gate_lower_bound", cfg["kda_lower_bound"])
    if cfg.get("q_lora_rank") is not None:
        w.u32("{arch}.attention.q_lora_rank", cfg["q_lora_rank"])
    w.u32("{arch}.attention.kv_lora_rank", kr)
    w.u32("{arch}.rope.dimension_count", rope)
    w.u32("{arch}.attention.key_length_mla", nope + rope)
    w.u32("{arch}.attention.value_length_mla", dv)
    w.u32("{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    if not kimi:
        w.u32("{arch}.expert_shared_feed_forward_length", cfg["moe_intermediate_size"] * cfg["num_shared_experts"])
    w.u32("{arch}.expert_shared_count", cfg["num_shared_experts"])
    w.u32("{arch}.leading_dense_block_count", dense_lead)
    w.f32("{arch}.expert_weights_scale", cfg["routed_scaling_factor"])
    if not kimi:
        w.bool("{arch}.expert_weights_norm", cfg["moe_renormalize"])

    w.tensor("token_embd.weight", st.pop("model.embed_tokens.weight" if kimi else "model.word_embeddings.weight"))
    w.tensor("output_norm.weight", st.pop("model.norm.weight"))
    w.tensor("output.weight", st.pop("lm_head.weight"))
    for i in range(n):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a = p + ("self_attn." if kimi else "attention.")
        w.tensor(b + "attn_norm.weight", st.pop(p + "input_layernorm.weight"))
        w.tensor(b + "ffn_norm.weight", st.pop(p + "post_attention_layernorm.weight"))
        out_name = a + ("o_proj.weight" if kimi else "dense.weight")
        if not full[i]:
            for x in "qkv":
                w.tensor(b + f"attn_{x}.weight", st.pop(a + f"{x}_proj.weight"))
                c = st.pop(a + f"{x}_conv1d.weight")
                w.tensor(b + f"ssm_conv1d_{x}.weight", c.reshape(1, c.shape[0], 1, c.shape[-1]))
            if kimi:
                for hf, g in (("f_a_proj", "ssm_f_a"), ("f_b_proj", "ssm_f_b"), ("g_a_proj", "ssm_g_a"), ("g_b_proj", "ssm_g_b")):
                    w.tensor(b + g + ".weight", st.pop(a + hf + ".weight"))
                w.tensor(b + "ssm_a", -exp(st.pop(a + "A_log")))
            else:
                w.tensor(b + "ssm_f_a.weight", st.pop(a + "f_proj.weight"))
                w.tensor(b + "ssm_g_a.weight", st.pop(a + "g_proj.weight"))
                w.tensor(b + "ssm_a", exp(st.pop(a + "A_log")).reshape(-1, 1))
            w.tensor(b + "ssm_beta.weight", st.pop(a + "b_proj.weight"))
            w.tensor(b + "ssm_dt.bias", st.pop(a + "dt_bias"))
            w.tensor(b + "ssm_norm.weight", st.pop(a + "o_norm.weight"))
        else:
            if cfg.get("q_lora_rank") is not None:
                w.tensor(b + "attn_q_a.weight", st.pop(a + "q_a_proj.weight"))
                w.tensor(b + "attn_q_a_norm.weight", st.pop(a + "q_a_layernorm.weight"))
                w.tensor(b + "attn_q_b.weight", st.pop(a + "q_b_proj.weight"))
            else:
                w.tensor(b + "attn_q.weight", st.pop(a + "q_proj.weight"))
            w.tensor(b + "attn_kv_a_mqa.weight", st.pop(a + "kv_a_proj_with_mqa.weight"))
            w.tensor(b + "attn_kv_a_norm.weight", st.pop(a + "kv_a_layernorm.weight"))
            k_b, v_b = split_kv_b(st.pop(a + "kv_b_proj.weight"), nh, nope, dv)
            w.tensor(b + "attn_k_b.weight", k_b)
            w.tensor(b + "attn_v_b.weight", v_b)
            if not kimi:
                w.tensor(b + "attn_gate.weight", st.pop(a + "g_proj.weight"))
        w.tensor(b + "attn_output.weight", st.pop(out_name))
        m = p + ("block_sparse_moe." if kimi else "mlp.")
        if i < dense_lead:
            for hf, g in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                w.tensor(b + g + ".weight", st.pop(m + hf + ".weight"))
            continue
        w.tensor(b + "ffn_gate_inp.weight", st.pop(m + "gate.weight"))
        w.tensor(b + "exp_probs_b.bias", st.pop(m + ("gate.e_score_correction_bias" if kimi else "gate.expert_bias")))
        names = ([("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")] if kimi else
                 [("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")])
        for g, t in stack_experts(st, m + "experts.", cfg["num_experts"], names).items():
            w.tensor(b + g + ".weight", t)
        for hf, g in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
            w.tensor(b + g + ".weight", st.pop(m + "shared_experts." + hf + ".weight"))
    left = [k for k in st if not k.startswith(f"model.layers.{n}.")]  # Ling's MTP layer is left out
    if left:
        sys.exit(f"{arch}: tensors not written: {left}")
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "gguf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for ftype in ("f16", "q8_0"):
        write_qwen3next(os.path.join(args.out, f"qwen3next_tiny-{ftype}.gguf"), ftype)
        write_kda_mla(os.path.join(args.out, f"kimi_linear_tiny-{ftype}.gguf"), ftype, "kimi_linear_tiny", "kimi-linear")
        write_kda_mla(os.path.join(args.out, f"bailing_hybrid_tiny-{ftype}.gguf"), ftype, "bailing_hybrid_tiny", "bailingmoe3")
    print("gguf", gguf.__version__ if hasattr(gguf, "__version__") else "", "->", args.out)


if __name__ == "__main__":
    main()
