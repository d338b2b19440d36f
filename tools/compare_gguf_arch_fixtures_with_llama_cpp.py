#!/usr/bin/env python3
"""Checks tools/make_gguf_arch_fixtures.py against llama.cpp's own converter (not part of the test
suite): runs convert_hf_to_gguf.py from llama.cpp's sources on a copy of each tiny golden, prepared
only as far as the converter needs to take it, and compares every tensor (name, type, shape,
bytes) and every metadata key with the committed fixture.

The preparation, per golden (nothing touches a weight value):
  qwen3next_tiny:       --no-mtp; the dense layer 1's mlp.* is left out of the conversion (llama.cpp's
                        qwen3next has no dense layer; the fixture writes it as ffn_gate/up/down).
  kimi_linear_tiny:     config gets linear_attn_config (full_attn_layers, kda_layers, num_heads,
                        head_dim, short_conv_kernel_size from the golden's layer_types / linear_*),
                        first_k_dense_replace, moe_router_activation_func "sigmoid"; layer 0's dense MLP
                        renamed from save_pretrained's block_sparse_moe.* to the official mlp.*.
  bailing_hybrid_tiny:  config gets architectures BailingMoeV3ForCausalLM, no_kda_lora,
                        gated_attention_proj_granularity_type "head_wise", norm_topk_prob,
                        moe_shared_expert_intermediate_size, and head_dim = linear_head_dim (the KDA head
                        dim the converter reads from head_dim); the converter's is_full_attention is
                        given the golden's layer_types (its layer_group_size rule cannot express them);
                        --no-mtp.
  all:                  no vocabulary (the Kimi and Ling goldens have no tokenizer; set_vocab skipped).

Usage: python3 tools/compare_gguf_arch_fixtures_with_llama_cpp.py --llama-cpp DIR [--outtype f16|q8_0]
(DIR: llama.cpp's sources with convert_hf_to_gguf.py, conversion/ and gguf-py/, e.g. the peer
build's vendor/llama.cpp; needs torch and safetensors.) Prints the differences; exit 1 if a tensor
differs.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = r'''
import json, sys
src, model_dir, outtype, out, golden = sys.argv[1:6]
sys.path.insert(0, src)
sys.path.insert(1, src + "/gguf-py")
import convert_hf_to_gguf
from conversion import base, bailingmoe3, kimi_linear, qwen
for cls in (base.TextModel, kimi_linear.KimiLinearModel, bailingmoe3.BailingMoeV3Model, qwen.Qwen3NextModel):
    cls.set_vocab = lambda self: None
cfg = json.load(open(model_dir + "/config.json"))
if golden == "bailing_hybrid_tiny":
    types = cfg["layer_types"]
    bailingmoe3.BailingMoeV3Model.is_full_attention = lambda self, bid: bid >= len(types) or types[bid] == "full_attention"
    # transformers' config object (the converter's hparams) drops keys its class does not know
    orig = bailingmoe3.BailingMoeV3Model.set_gguf_parameters
    def set_gguf_parameters(self):
        for k in ("no_kda_lora", "gated_attention_proj_granularity_type", "norm_topk_prob",
                  "moe_shared_expert_intermediate_size", "head_dim"):
            self.hparams[k] = cfg[k]
        orig(self)
    bailingmoe3.BailingMoeV3Model.set_gguf_parameters = set_gguf_parameters
if golden == "qwen3next_tiny":
    keep = qwen.Qwen3NextModel.filter_tensors.__func__
    qwen.Qwen3NextModel.filter_tensors = classmethod(
        lambda cls, item: None if item[0].startswith("model.layers.1.mlp.") else keep(cls, item))
mtp = [] if golden == "kimi_linear_tiny" else ["--no-mtp"]  # Kimi's converter has no MTP switch
sys.argv = ["convert_hf_to_gguf.py", model_dir, *mtp, "--outtype", outtype, "--outfile", out]
convert_hf_to_gguf.main()
'''


def prepare(golden, dst):
    src = os.path.join(REPO, "tests", "golden", golden)
    for f in os.listdir(src):
        if f.endswith((".safetensors", ".json")) and f != "expected.safetensors":
            shutil.copy(os.path.join(src, f), dst)
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if golden == "kimi_linear_tiny":
        lt = cfg["layer_types"]
        cfg["linear_attn_config"] = {
            "full_attn_layers": [i + 1 for i, t in enumerate(lt) if t == "full_attention"],
            "kda_layers": [i + 1 for i, t in enumerate(lt) if t != "full_attention"],
            "num_heads": cfg["linear_num_heads"], "head_dim": cfg["linear_head_dim"],
            "short_conv_kernel_size": cfg["linear_conv_kernel_dim"]}
        cfg["first_k_dense_replace"] = cfg["mlp_layer_types"].index("sparse")
        cfg["moe_router_activation_func"] = "sigmoid"
        from safetensors.torch import load_file, save_file
        idx_path = os.path.join(dst, "model.safetensors.index.json")
        with open(idx_path) as f:
            idx = json.load(f)
        ren = lambda k: k.replace("layers.0.block_sparse_moe.", "layers.0.mlp.")
        idx["weight_map"] = {ren(k): v for k, v in idx["weight_map"].items()}
        with open(idx_path, "w") as f:
            json.dump(idx, f)
        for shard in set(idx["weight_map"].values()):
            p = os.path.join(dst, shard)
            save_file({ren(k): v for k, v in load_file(p).items()}, p, metadata={"format": "pt"})
    if golden == "bailing_hybrid_tiny":
        cfg["architectures"] = ["BailingMoeV3ForCausalLM"]
        cfg["no_kda_lora"] = True
        cfg["gated_attention_proj_granularity_type"] = "head_wise"
        cfg["norm_topk_prob"] = cfg["moe_renormalize"]
        cfg["moe_shared_expert_intermediate_size"] = cfg["moe_intermediate_size"]
        cfg["head_dim"] = cfg["linear_head_dim"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


def compare(llama_path, ours_path):
    import numpy as np
    import gguf
    a, b = gguf.GGUFReader(llama_path), gguf.GGUFReader(ours_path)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    bad = 0
    for n in sorted(set(ta) | set(tb)):
        if n not in ta or n not in tb:
            print(f"  only in {'ours' if n in tb else 'llama.cpp'}: {n}")
            bad += n in ta
            continue
        x, y = ta[n], tb[n]
        if list(x.shape) != list(y.shape) or x.tensor_type != y.tensor_type or not np.array_equal(x.data, y.data):
            bad += 1
            print(f"  DIFF {n}: llama.cpp {x.tensor_type.name} {list(map(int, x.shape))}, ours {y.tensor_type.name} {list(map(int, y.shape))}")

    def keys(r):
        return {f.name: f.contents() for f in r.fields.values() if not f.name.startswith(("GGUF.", "general."))}
    ka, kb = keys(a), keys(b)
    for k in sorted(set(ka) | set(kb)):
        if ka.get(k) != kb.get(k):
            print(f"  key {k}: llama.cpp {ka.get(k)!r}, ours {kb.get(k)!r}")
    print(f"  {len(set(ta) & set(tb))} tensors in both, {bad} differing or missing from ours")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--outtype", default="f16", choices=["f16", "q8_0"])
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.llama_cpp), "gguf-py"))
    bad = 0
    for golden in ("qwen3next_tiny", "kimi_linear_tiny", "bailing_hybrid_tiny"):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "model")
            os.makedirs(model)
            prepare(golden, model)
            out = os.path.join(tmp, "llama.gguf")
            r = subprocess.run([sys.executable, "-c", RUN, os.path.abspath(args.llama_cpp), model, args.outtype, out, golden],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                sys.exit(f"{golden}: llama.cpp's converter failed:\n{r.stderr[-3000:]}")
            print(f"{golden} ({args.outtype}):")
            bad += compare(out, os.path.join(REPO, "tests", "data", "gguf", f"{golden}-{args.outtype}.gguf"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
