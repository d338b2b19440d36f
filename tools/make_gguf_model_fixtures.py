#!/usr/bin/env python3
"""GGUF model fixtures for tests/test_gguf_model.cpp: the tiny Qwen3.5 golden (tests/golden/qwen35_tiny)
converted by llama.cpp's own convert_hf_to_gguf.py (tools/convert_tiny_to_gguf.py), and the logits a
Q8_0 file must give.

Writes into tests/data/gguf/:
  qwen35_tiny-f16.gguf, qwen35_tiny-q8_0.gguf     llama.cpp's converter, --outtype f16 / q8_0
  qwen35moe_tiny-f16.gguf                        the same for tests/golden/qwen35moe_tiny (arch qwen35moe)
  qwen35_tiny-q8_0.expected.safetensors          ids [T] I64 (the golden's prompt + greedy ids) and
                                                  logits [T, V] F64: transformers' Qwen3_5ForCausalLM in
                                                  float64 on the golden's weights with every tensor the
                                                  Q8_0 file stores as Q8_0 replaced by gguf-py's
                                                  dequantize(quantize(w, Q8_0)) (the converter quantizes
                                                  with gguf-py, after its row/column reorders, which
                                                  move whole 32-element blocks here, so the values are
                                                  the file's), all positions, one full forward.
The F16 files are checked against the goldens' own transformers logits (expected.safetensors).

Usage: python3 tools/make_gguf_model_fixtures.py --llama-cpp DIR [--out tests/data/gguf]
(DIR: llama.cpp's sources, e.g. the peer build's vendor/llama.cpp; PyPI gguf, torch, transformers
as tools/requirements-qwen-golden.txt.)
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden", "qwen35_tiny")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "gguf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    conv = os.path.join(REPO, "tools", "convert_tiny_to_gguf.py")
    for t in ("f16", "q8_0"):
        subprocess.run([sys.executable, conv, "--llama-cpp", args.llama_cpp, GOLDEN,
                        os.path.join(args.out, f"qwen35_tiny-{t}.gguf"), "--outtype", t], check=True)
    subprocess.run([sys.executable, conv, "--llama-cpp", args.llama_cpp, os.path.join(REPO, "tests", "golden", "qwen35moe_tiny"),
                    os.path.join(args.out, "qwen35moe_tiny-f16.gguf"), "--outtype", "f16"], check=True)

    import gguf  # PyPI gguf (python/requirements-test.txt)
    from gguf.quants import dequantize, quantize
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    reader = gguf.GGUFReader(os.path.join(args.out, "qwen35_tiny-q8_0.gguf"))
    q8_names = {t.name for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q8_0}

    # HF name -> GGUF name for the tensors the converter quantizes (2-D weights).
    def gguf_name(hf: str) -> str:
        hf = hf.replace("model.language_model.", "model.")
        table = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight"}
        if hf in table:
            return table[hf]
        layer = {"linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
                 "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
                 "linear_attn.out_proj.weight": "ssm_out.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
        parts = hf.split(".", 3)
        if len(parts) == 4 and parts[1] == "layers" and parts[3] in layer:
            return f"blk.{parts[2]}.{layer[parts[3]]}"
        return ""

    with open(os.path.join(GOLDEN, "config.json")) as f:
        text = json.load(f)["text_config"]
    kwargs = {k: v for k, v in text.items() if k not in ("model_type", "attn_output_gate", "full_attention_interval",
                                                         "mamba_ssm_dtype")}
    config = Qwen3_5TextConfig(**kwargs)
    config._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(config).double().eval()
    state = {}
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        state.update(load_file(os.path.join(GOLDEN, shard)))
    rounded = 0
    new_state = {}
    for name, t in state.items():
        if name.startswith("model.visual.") or name.startswith("mtp."):
            continue
        key = name.replace("model.language_model.", "model.")
        w = t.float().numpy()
        if gguf_name(name) in q8_names:
            w = dequantize(quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
            rounded += 1
        new_state[key] = torch.from_numpy(np.ascontiguousarray(w)).double()
    missing, unexpected = model.load_state_dict(new_state, strict=False)
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if rounded != len(q8_names):
        sys.exit(f"rounded {rounded} tensors, the file has {len(q8_names)} Q8_0 tensors")

    exp = load_file(os.path.join(GOLDEN, "expected.safetensors"))
    ids = torch.cat([exp["prompt_ids"], exp["greedy_ids"]]).long()
    with torch.no_grad():
        logits = model(ids[None], use_cache=False).logits[0]
    save_file({"ids": ids.numpy(), "logits": logits.numpy()},
              os.path.join(args.out, "qwen35_tiny-q8_0.expected.safetensors"),
              metadata={"reference": "transformers Qwen3_5ForCausalLM float64 on Q8_0-rounded weights"})
    print(f"{rounded} tensors rounded to Q8_0; logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
