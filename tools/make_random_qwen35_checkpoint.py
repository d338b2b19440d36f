#!/usr/bin/env python3
"""Writes a Qwen3.5 safetensors checkpoint with random float16 weights and published shapes, for
`hanpu quantize --format` benchmarks and comparisons with llama.cpp (issue 34; not part of the suite).

    tools/make_random_qwen35_checkpoint.py --shapes 0.8b OUT_DIR

Shapes: Qwen3.5-0.8B / 2B (the presets of src/model/family_qwen.cpp, docs/MODEL.md). The tokenizer
is the tiny test tokenizer of tests/golden/qwen35_tiny (320 tokens); the GGUF writer pads the
vocabulary to vocab_size with "[PADi]" tokens as llama.cpp's converter does. Weights: N(0, 0.02)
projections, norm weights near 0 (Qwen's zero-centred RMSNorm), A_log = log U(1, 16).
"""
import argparse
import json
import os
import shutil

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "golden", "qwen35_tiny")
# hidden, layers, heads, kv heads, linear value heads, intermediate (family_qwen.cpp kPresets)
SHAPES = {"0.8b": (1024, 24, 8, 2, 16, 3584), "2b": (2048, 24, 8, 2, 16, 6144)}


def qwen35_tensors(w, rng, *, hidden, intermediate, vocab, layers, full_layers, heads, kv_heads, head_dim,
                   linear_key_heads, linear_value_heads, key_dim, value_dim, conv_kernel, lm_head=False):
    """The text model's tensors under transformers' Qwen3.5 names: `w(*shape, scale=...)` draws a
    projection, `rng` the A_log values; full attention in `full_layers`, Gated DeltaNet elsewhere.
    Also used by tests/python/test_gguf_export.py."""
    H, I, NK, NV, DK, DV = hidden, intermediate, linear_key_heads, linear_value_heads, key_dim, value_dim
    p = "model.language_model."
    t = {p + "embed_tokens.weight": w(vocab, H), p + "norm.weight": w(H)}
    if lm_head:
        t["lm_head.weight"] = w(vocab, H)
    for i in range(layers):
        pre = f"{p}layers.{i}."
        t[pre + "input_layernorm.weight"] = w(H)
        t[pre + "post_attention_layernorm.weight"] = w(H)
        t[pre + "mlp.gate_proj.weight"] = w(I, H)
        t[pre + "mlp.up_proj.weight"] = w(I, H)
        t[pre + "mlp.down_proj.weight"] = w(H, I)
        if i in full_layers:
            t[pre + "self_attn.q_proj.weight"] = w(2 * heads * head_dim, H)
            t[pre + "self_attn.k_proj.weight"] = w(kv_heads * head_dim, H)
            t[pre + "self_attn.v_proj.weight"] = w(kv_heads * head_dim, H)
            t[pre + "self_attn.o_proj.weight"] = w(H, heads * head_dim)
            t[pre + "self_attn.q_norm.weight"] = w(head_dim)
            t[pre + "self_attn.k_norm.weight"] = w(head_dim)
        else:
            conv = 2 * NK * DK + NV * DV
            t[pre + "linear_attn.A_log"] = np.log(rng.uniform(1, 16, NV)).astype(np.float32)
            t[pre + "linear_attn.dt_bias"] = w(NV, scale=1.0)
            t[pre + "linear_attn.conv1d.weight"] = w(conv, 1, conv_kernel, scale=0.3)
            t[pre + "linear_attn.in_proj_qkv.weight"] = w(conv, H)
            t[pre + "linear_attn.in_proj_z.weight"] = w(NV * DV, H)
            t[pre + "linear_attn.in_proj_b.weight"] = w(NV, H)
            t[pre + "linear_attn.in_proj_a.weight"] = w(NV, H)
            t[pre + "linear_attn.norm.weight"] = (1 + w(DV)).astype(np.float16)
            t[pre + "linear_attn.out_proj.weight"] = w(H, NV * DV)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="0.8b")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("out")
    a = ap.parse_args()
    H, L, NH, NKV, NV, I = SHAPES[a.shapes]
    V, HD, NK, DK, DV, K = 248320, 256, 16, 128, 128, 4
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(TINY, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg["text_config"]
    tc.update(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
              num_key_value_heads=NKV, head_dim=HD, linear_num_key_heads=NK, linear_num_value_heads=NV,
              linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=K, tie_word_embeddings=True,
              max_position_embeddings=262144, full_attention_interval=4,
              layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)])
    tc["rope_parameters"].update(rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[11, 11, 10])
    cfg["tie_word_embeddings"] = True
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, name), a.out)

    def w(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float16)

    t = qwen35_tensors(w, rng, hidden=H, intermediate=I, vocab=V, layers=L,
                       full_layers={i for i in range(L) if (i + 1) % 4 == 0}, heads=NH, kv_heads=NKV, head_dim=HD,
                       linear_key_heads=NK, linear_value_heads=NV, key_dim=DK, value_dim=DV, conv_kernel=K)
    save_file(t, os.path.join(a.out, "model.safetensors"))
    print(a.out)


if __name__ == "__main__":
    main()
