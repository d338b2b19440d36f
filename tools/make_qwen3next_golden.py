#!/usr/bin/env python3
"""Build a tiny random Qwen3-Next model with Hugging Face transformers and record its logits.

Writes tests/golden/qwen3next_tiny/:
  config.json                       flat, like the official Qwen3-Next checkpoints: model_type
                                    "qwen3_next", Qwen3NextForCausalLM, full_attention_interval
                                    (no layer_types), decoder_sparse_step and mlp_only_layers
  model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
                                    the weights named as the official checkpoints name them
                                    (model.layers.*, lm_head.weight, one tensor set per expert:
                                    mlp.experts.{e}.{gate,up,down}_proj.weight, mlp.gate.weight,
                                    mlp.shared_expert.*, mlp.shared_expert_gate.weight; fused GDN
                                    projections linear_attn.in_proj_qkvz / in_proj_ba), BF16 except
                                    linear_attn.A_log and linear_attn.dt_bias (F32), plus an mtp.*
                                    tensor a text engine must skip
  tokenizer.json, tokenizer_config.json
                                    a byte-level BPE trained here with the Qwen2 pre-tokenizer
                                    (Qwen3-Next uses the Qwen2/Qwen3 tokenizer)
  expected.safetensors              prompt_ids [T0] I64, greedy_ids [N] I64, logits [T0+N, V] F32:
                                    transformers' float32 logits for every position of prompt +
                                    greedy continuation; text_prompt_ids / text_greedy_ids as in the
                                    Qwen3.5 golden; and an independent rebuild of layer 0's permuted
                                    GDN projections: perm_qkv [2*nk*dk + nv*dv, H], perm_z [nv*dv, H],
                                    perm_b [nv, H], perm_a [nv, H] (F32), the rows transformers' own
                                    fix_query_key_value_ordering yields for q|k|v, z, b and a

Model: 4 layers (GDN, attention, GDN, attention: full_attention_interval 2); GVA in the GDN layers
with r = linear_num_value_heads / linear_num_key_heads = 2 and key dim (16) != value dim (32), so
a wrong permutation cannot pass by symmetry; GQA 4 q / 2 kv heads; partial RoPE (0.25 of 32);
MoE on layers 0, 2, 3 (8 experts, top-2, norm_topk_prob, a shared expert with its sigmoid gate)
and the dense MLP on layer 1 (mlp_only_layers [1]); untied head; vocabulary 320.
The checkpoint is re-loaded with Qwen3NextForCausalLM.from_pretrained (transformers' own
checkpoint conversion) and must give the same logits, so the stored names and expert layout are
the ones transformers reads. The script also checks that no token's top-k routing is near a tie
(the k-th and (k+1)-th router probabilities differ by at least MIN_ROUTER_GAP), so a float32
engine picks the same experts.

Environment: as tools/make_qwen35_golden.py (transformers 5.24.0, torch, tokenizers).
Usage:
    python3 tools/make_qwen3next_golden.py [--out tests/golden/qwen3next_tiny]
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen_golden_tokenizer import build_tokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SEED = 3801
PROMPT_LEN = 75
NEW_TOKENS = 10
VOCAB = 320
MIN_GREEDY_GAP = 1e-2  # as in make_qwen35_golden.py
# Top-k boundary margin in router probability: far above float32 differences (~1e-7) between two
# correct implementations, so the expert choice is not decided by rounding.
MIN_ROUTER_GAP = 1e-4

CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_theta": 50000.0,
    "partial_rotary_factor": 0.25,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "norm_topk_prob": True,
    "torch_dtype": "bfloat16",
}

# The Qwen2 pre-tokenizer split (Qwen2/Qwen3 tokenizer.json).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT_PROMPT = "Hello world! The quick brown fox runs the model 42 times."
TEXT_NEW_TOKENS = 8
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.dt_bias")


# The lines the golden's tokenizer is trained on (tools/qwen_golden_tokenizer.py).
TOKENIZER_CORPUS = [
        "The quick brown fox jumps over the lazy dog. " * 4,
        "Hello world! Hello there, hello again. The model routes tokens to experts.",
        "hanpu runs Qwen3-Next on the CPU: prefill, decode, the gated delta rule and the experts.",
        "the the the and and of of to to in in is is it it that that",
]


def stored_f32(name):
    return name.endswith(F32_SUFFIXES)


def randomize(model, gen):
    """Random weights at scales where every module matters, rounded to what is stored."""
    for name, p in model.named_parameters():
        shape = p.shape
        if name.endswith("A_log"):
            val = torch.log(torch.empty(shape).uniform_(0.5, 8.0, generator=gen))
        elif name.endswith("dt_bias"):
            val = torch.randn(shape, generator=gen) * 0.5
        elif name.endswith("conv1d.weight"):
            val = torch.randn(shape, generator=gen) * 0.5
        elif name.endswith("linear_attn.norm.weight"):  # raw weight (ones-init)
            val = 1.0 + torch.randn(shape, generator=gen) * 0.2
        elif "norm" in name:  # (1 + w) norms: zero-init offsets
            val = torch.randn(shape, generator=gen) * 0.2
        elif name.endswith("embed_tokens.weight"):
            val = torch.randn(shape, generator=gen)
        elif name.endswith("mlp.gate.weight"):  # router: logits O(1-3) so the top-k is clear-cut
            val = torch.randn(shape, generator=gen) * 2.0 / shape[-1] ** 0.5
        else:  # nn.Linear [out, in] and the fused experts [E, out, in]
            val = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        if not stored_f32(name):
            val = val.to(torch.bfloat16).float()
        with torch.no_grad():
            p.copy_(val)


def stored_tensors(model, cfg):
    """The checkpoint's tensors as the official checkpoints store them: one set per expert."""
    im = cfg["moe_intermediate_size"]
    out = {}
    for name, p in model.state_dict().items():
        t = p.detach().clone().float()
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2*Im, H]: gate rows then up rows
            base = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :im].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, im:].contiguous()
            continue
        if name.endswith("mlp.experts.down_proj"):  # [E, H, Im]
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
            continue
        out[name] = t.contiguous()
    return {n: (t if stored_f32(n) else t.to(torch.bfloat16)) for n, t in out.items()}


def permuted_rows(layer, cfg):
    """Layer 0's GDN projection rows in the Qwen3.5 order, rebuilt with transformers' own split:
    feeding W^T as the 'projected states' of H tokens makes token i's output the i-th column of W."""
    la = layer.linear_attn
    qkvz = la.in_proj_qkvz.weight.detach().float()
    ba = la.in_proj_ba.weight.detach().float()
    q, k, v, z, b, a = la.fix_query_key_value_ordering(qkvz.t()[None], ba.t()[None])
    flat = lambda x: x.reshape(x.shape[1], -1).t().contiguous()  # [1, H, heads, d] -> [heads*d, H]
    return {"perm_qkv": torch.cat([flat(q), flat(k), flat(v)]), "perm_z": flat(z),
            "perm_b": b[0].t().contiguous(), "perm_a": a[0].t().contiguous()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden", "qwen3next_tiny"))
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import transformers
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    specials = build_tokenizer(args.out, QWEN2_SPLIT, TOKENIZER_CORPUS, VOCAB, SPECIAL_TOKENS)

    cfg = dict(CONFIG)
    cfg["eos_token_id"] = specials["<|endoftext|>"]
    cfg["bos_token_id"] = specials["<|endoftext|>"]
    kwargs = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype", "rope_theta",
                                                        "partial_rotary_factor")}
    kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                 "partial_rotary_factor": cfg["partial_rotary_factor"]}
    config = Qwen3NextConfig(**kwargs)
    config._attn_implementation = "eager"
    assert config.layer_types == ["linear_attention", "full_attention"] * 2, config.layer_types
    model = Qwen3NextForCausalLM(config).float().eval()
    randomize(model, gen)

    # --- checkpoint ---------------------------------------------------------------------------
    tensors = stored_tensors(model, cfg)
    tensors["mtp.fc.weight"] = torch.randn(64, 128, generator=gen).to(torch.bfloat16)  # to be skipped
    names = sorted(tensors)
    first = [n for n in names if n.startswith("model.embed_tokens") or
             any(n.startswith(f"model.layers.{i}.") for i in (0, 1))]
    second = [n for n in names if n not in first]
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    weight_map = {}
    total = 0
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, os.path.join(args.out, fname), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # --- reference logits ---------------------------------------------------------------------
    low, high = 0, min(specials.values())
    prompt = torch.randint(low, high, (PROMPT_LEN,), generator=gen)
    seq = prompt.clone()
    gaps = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=seq[None], use_cache=False).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gaps.append(float(top2[0] - top2[1]))
            seq = torch.cat([seq, logits.argmax().view(1)])
        out = model(input_ids=seq[None], use_cache=False, output_router_logits=True)
        full_logits = out.logits[0].float().contiguous()
        router_gap = min_router_gap(out.router_logits, cfg["num_experts_per_tok"])
        cached = model.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                pad_token_id=specials["<|endoftext|>"])[0]
        reloaded = Qwen3NextForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
        reloaded.config._attn_implementation = "eager"
        reloaded_logits = reloaded(input_ids=seq[None], use_cache=False).logits[0].float()
        from tokenizers import Tokenizer
        text_ids = torch.tensor(Tokenizer.from_file(os.path.join(args.out, "tokenizer.json")).encode(TEXT_PROMPT).ids)
        text_seq = text_ids.clone()
        for _ in range(TEXT_NEW_TOKENS):
            o = model(input_ids=text_seq[None], use_cache=False, output_router_logits=True)
            router_gap = min(router_gap, min_router_gap(o.router_logits, cfg["num_experts_per_tok"]))
            top2 = torch.topk(o.logits[0, -1], 2).values
            gaps.append(float(top2[0] - top2[1]))
            text_seq = torch.cat([text_seq, o.logits[0, -1].argmax().view(1)])
        perm = permuted_rows(model.model.layers[0], cfg)
    greedy = seq[PROMPT_LEN:]
    if not torch.equal(cached[PROMPT_LEN:], greedy):
        sys.exit(f"transformers' cached generate() disagrees with full forwards: {cached[PROMPT_LEN:].tolist()} "
                 f"vs {greedy.tolist()}")
    if not torch.equal(reloaded_logits, full_logits):
        sys.exit(f"from_pretrained on the written checkpoint gives other logits (max diff "
                 f"{(reloaded_logits - full_logits).abs().max():.3g}): the stored names/layout are wrong")
    if min(gaps) < MIN_GREEDY_GAP:
        sys.exit(f"greedy step gap {min(gaps):.3g} below {MIN_GREEDY_GAP}: pick another SEED")
    if router_gap < MIN_ROUTER_GAP:
        sys.exit(f"router top-k margin {router_gap:.3g} below {MIN_ROUTER_GAP}: pick another SEED")
    meta = {
        "generator": "tools/make_qwen3next_golden.py",
        "seed": str(args.seed),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "reference": "Qwen3NextForCausalLM float32, eager attention, use_cache=False full forwards",
        "min_greedy_gap": repr(min(gaps)),
        "min_router_gap": repr(router_gap),
        "text_prompt": TEXT_PROMPT,
    }
    save_file({"prompt_ids": prompt.to(torch.int64).contiguous(), "greedy_ids": greedy.to(torch.int64).contiguous(),
               "logits": full_logits, "text_prompt_ids": text_ids.to(torch.int64).contiguous(),
               "text_greedy_ids": text_seq[len(text_ids):].to(torch.int64).contiguous(), **perm},
              os.path.join(args.out, "expected.safetensors"), metadata=meta)
    print(f"wrote {args.out}: prompt {PROMPT_LEN} tokens, greedy {greedy.tolist()}, min gap {min(gaps):.4f}, "
          f"router margin {router_gap:.4g}, logit std {full_logits.std():.3f}")


def min_router_gap(router_logits, k):
    """Smallest difference between the k-th and (k+1)-th router probability over tokens and layers."""
    gap = float("inf")
    for logits in router_logits:
        if logits is None:
            continue
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, k + 1, dim=-1).values
        gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
    return gap


if __name__ == "__main__":
    main()
