#!/usr/bin/env python3
"""Build tiny random Qwen3.5-MoE and Kimi Linear models with Hugging Face transformers, save them
with save_pretrained, and record transformers' float32 logits.

Writes (see tests/golden/README.md):
  tests/golden/qwen35moe_tiny/   Qwen3_5MoeForConditionalGeneration (model_type qwen3_5_moe, the
                                 text model nested under text_config as the official checkpoints;
                                 a one-block vision tower whose model.visual.* tensors a text engine
                                 skips): GDN, GDN, attention, GDN; every layer MoE with 8 experts,
                                 top-2, a shared expert with its sigmoid gate; GVA 2 qk / 4 v GDN
                                 heads with key dim 16 != value dim 24; GQA 4 q / 2 kv; partial
                                 RoPE; untied head; a byte-level BPE tokenizer (Qwen3.5 split)
  tests/golden/kimi_linear_tiny/ KimiLinearForCausalLM (model_type kimi_linear): KDA, KDA, MLA,
                                 KDA, MLA; layer 0 dense, the rest MoE (8 experts in 2 groups, the
                                 best group only, top-2, sigmoid scores with a random
                                 e_score_correction_bias, routed scaling 2.446, one shared expert);
                                 3 KDA heads of 24; MLA 3 heads, kv_lora_rank 40, qk 16 nope + 8
                                 rope, v 20, no RoPE (kimi_linear has none); untied head; no
                                 tokenizer (Kimi's is tiktoken: hanpu runs it with --prompt-ids)
  tests/golden/bailing_hybrid_tiny/ BailingHybridForCausalLM (model_type bailing_hybrid, Ling 3.0):
                                 KDA, KDA, MLA, KDA, MLA; 3 KDA heads of 24 with full-rank f_proj /
                                 g_proj and the safe gate (lower bound -5); MLA 3 heads with a q
                                 LoRA of 20, kv_lora_rank 40, qk 16 + 8 with interleaved RoPE
                                 (theta 1e4), v 20, the head-wise sigmoid output gate; layer 0
                                 dense, the rest MoE (8 experts in 4 groups, best 2 groups, top-2,
                                 sigmoid + expert_bias, scaling 2.5, a shared expert); an MTP layer
                                 (layers.5.*) in its own shard that both sides skip; no tokenizer.
                                 config.json is save_pretrained's, unchanged: head_dim 8 (transformers
                                 overwrites it with qk_rope_head_dim), the KDA geometry in
                                 linear_head_dim 24 / linear_num_heads 3, as transformers reads it
Each directory holds what save_pretrained wrote (config.json, sharded model-*.safetensors and
model.safetensors.index.json, BF16 weights: transformers writes the official layouts, i.e. one
tensor set per expert, Kimi's block_sparse_moe.* / q_conv1d / k_conv1d / v_conv1d / f_a_proj
names) and expected.safetensors: prompt_ids [75] I64, greedy_ids [10] I64, logits [85, V] F32 for
every position of prompt + greedy continuation (use_cache=False full forwards, eager attention).

Checks before writing expected.safetensors: from_pretrained on the written directory gives the same
logits bit for bit (so the stored names are the ones transformers reads); cached generate() gives
the same greedy tokens; every greedy step's top-1/top-2 logit gap is >= MIN_GREEDY_GAP; and no
token's expert choice (nor Kimi's group choice) is within MIN_ROUTER_GAP of a tie, so a float32
engine picks the same experts.

Environment: as tools/make_qwen35_golden.py (transformers 5.24.0, torch, tokenizers; CPU).
Usage:
    python3 tools/make_moe_family_goldens.py [--only qwen3_5_moe|kimi_linear]
"""

import argparse
import copy
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen_golden_tokenizer import build_tokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")

PROMPT_LEN = 75  # more than one 64-token chunk of the LA engines, not a multiple of it
NEW_TOKENS = 10
VOCAB = 320
MIN_GREEDY_GAP = 1e-2  # as in make_qwen35_golden.py
MIN_ROUTER_GAP = 1e-4  # as in make_qwen3next_golden.py (in score units)
SHARD_SIZE = "400KB"   # several shards + an index, as real checkpoints

QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Hello world! Hello there, hello again. The model routes tokens to experts.",
    "hanpu runs Qwen3.5-MoE on the CPU: prefill, decode, the gated delta rule and the experts.",
    "the the the and and of of to to in in is is it it that that",
]


def randomize(model, gen, plus_one_norms):
    """Random weights at scales where every module matters, rounded to bf16 (what is stored)."""
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        shape = p.shape
        if name.endswith("A_log"):
            val = torch.log(torch.empty(shape).uniform_(0.5, 8.0, generator=gen))
        elif name.endswith("dt_bias"):
            val = torch.randn(shape, generator=gen) * 0.5
        elif name.endswith("conv1d.weight"):
            val = torch.randn(shape, generator=gen) * 0.5
        elif name.endswith("e_score_correction_bias"):
            val = torch.randn(shape, generator=gen) * 0.1
        elif name.endswith(("linear_attn.norm.weight", "o_norm.weight")):  # raw weights (ones-init)
            val = 1.0 + torch.randn(shape, generator=gen) * 0.2
        elif "norm" in name and name.endswith("weight"):
            val = torch.randn(shape, generator=gen) * 0.2 + (0.0 if plus_one_norms else 1.0)
        elif name.endswith("embed_tokens.weight"):
            val = torch.randn(shape, generator=gen)
        elif name.endswith("mlp.gate.weight"):  # router: scores O(1) so the top-k is clear-cut
            val = torch.randn(shape, generator=gen) * 2.0 / shape[-1] ** 0.5
        elif p.dtype.is_floating_point and len(shape) >= 2:  # nn.Linear [out, in], fused experts [E, out, in]
            val = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        else:
            continue  # integer buffers (none expected) keep their values
        with torch.no_grad():
            p.copy_(val.to(torch.bfloat16).float())


def greedy_run(model, prompt):
    seq = prompt.clone()
    gaps = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=seq[None], use_cache=False).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gaps.append(float(top2[0] - top2[1]))
            seq = torch.cat([seq, logits.argmax().view(1)])
        out = model(input_ids=seq[None], use_cache=False, output_router_logits=True)
    return seq, gaps, out


def softmax_router_gap(router_logits, k):
    gap = float("inf")
    for logits in router_logits:
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, k + 1, dim=-1).values
        gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
    return gap


def kimi_router_gap(model, router_logits, cfg):
    """Margins of Kimi's grouped sigmoid routing: the kept groups' scores against the first dropped
    group's, and the k-th eligible expert's choice score against the next one's."""
    gap = float("inf")
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    assert len(gates) == len(router_logits), (len(gates), len(router_logits))
    G, tg, k = cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok
    for gate, logits in zip(gates, router_logits):
        choice = logits.float().sigmoid() + gate.e_score_correction_bias.float()
        grouped = choice.view(choice.shape[0], G, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        if G > tg:
            top = torch.topk(group_scores, tg + 1, dim=-1).values
            gap = min(gap, float((top[:, tg - 1] - top[:, tg]).min()))
        keep = torch.zeros_like(group_scores).scatter_(1, torch.topk(group_scores, tg, dim=-1).indices, 1.0)
        masked = choice.masked_fill(~keep.bool().repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        top = torch.topk(masked, k + 1, dim=-1).values
        gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
    return gap


def write_golden(name, model, model_cls, out, gen, router_gap_fn, specials=None, meta_extra=None, fix_checkpoint=None):
    import transformers

    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):  # a stale shard from an earlier layout must not stay behind
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(out, f))
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out, max_shard_size=SHARD_SIZE)
    if fix_checkpoint:
        fix_checkpoint(out)

    high = min(specials.values()) if specials else model.config.get_text_config().vocab_size
    prompt = torch.randint(0, high, (PROMPT_LEN,), generator=gen)
    seq, gaps, out_full = greedy_run(model, prompt)
    full_logits = out_full.logits[0].float().contiguous()
    router_gap = router_gap_fn(out_full.router_logits)
    with torch.no_grad():
        pad = specials["<|endoftext|>"] if specials else 0
        cached = model.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                pad_token_id=pad)[0]
        reloaded = model_cls.from_pretrained(out, dtype=torch.float32).eval()
        reloaded.config._attn_implementation = "eager"
        reloaded_logits = reloaded(input_ids=seq[None], use_cache=False).logits[0].float()
    greedy = seq[PROMPT_LEN:]
    if not torch.equal(cached[PROMPT_LEN:], greedy):
        sys.exit(f"{name}: cached generate() disagrees with full forwards: {cached[PROMPT_LEN:].tolist()} vs "
                 f"{greedy.tolist()}")
    if not torch.equal(reloaded_logits, full_logits):
        sys.exit(f"{name}: from_pretrained on the written checkpoint gives other logits (max diff "
                 f"{(reloaded_logits - full_logits).abs().max():.3g})")
    if min(gaps) < MIN_GREEDY_GAP:
        sys.exit(f"{name}: greedy step gap {min(gaps):.3g} below {MIN_GREEDY_GAP}: pick another seed")
    if router_gap < MIN_ROUTER_GAP:
        sys.exit(f"{name}: router margin {router_gap:.3g} below {MIN_ROUTER_GAP}: pick another seed")
    meta = {
        "generator": "tools/make_moe_family_goldens.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "reference": f"{model_cls.__name__} float32, eager attention, use_cache=False full forwards",
        "min_greedy_gap": repr(min(gaps)),
        "min_router_gap": repr(router_gap),
        **(meta_extra or {}),
    }
    save_file({"prompt_ids": prompt.to(torch.int64).contiguous(), "greedy_ids": greedy.to(torch.int64).contiguous(),
               "logits": full_logits}, os.path.join(out, "expected.safetensors"), metadata=meta)
    print(f"wrote {out}: greedy {greedy.tolist()}, min gap {min(gaps):.4f}, router margin {router_gap:.4g}, "
          f"logit std {full_logits.std():.3f}")


def make_qwen35_moe(seed):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    out = os.path.join(GOLDEN, "qwen35moe_tiny")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    specials = build_tokenizer(out, QWEN35_SPLIT, TOKENIZER_CORPUS, VOCAB, SPECIAL_TOKENS)
    text = dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 1, 2], "mrope_interleaved": True},
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        tie_word_embeddings=False, eos_token_id=specials["<|endoftext|>"], pad_token_id=specials["<|endoftext|>"],
    )
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    model = Qwen3_5MoeForConditionalGeneration(config).float().eval()
    randomize(model, gen, plus_one_norms=True)
    k = config.text_config.num_experts_per_tok
    write_golden("qwen3_5_moe", model, Qwen3_5MoeForConditionalGeneration, out, gen,
                 lambda rl: softmax_router_gap(rl, k), specials, {"seed": str(seed)})


def make_kimi_linear(seed):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    out = os.path.join(GOLDEN, "kimi_linear_tiny")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=5,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
        num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=40, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=20, linear_num_heads=3, linear_head_dim=24, linear_conv_kernel_dim=4,
        num_local_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        routed_scaling_factor=2.446, norm_topk_prob=True, rms_norm_eps=1e-5, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    config._attn_implementation = "eager"
    model = KimiLinearForCausalLM(config).float().eval()
    randomize(model, gen, plus_one_norms=False)
    write_golden("kimi_linear", model, KimiLinearForCausalLM, out, gen,
                 lambda rl: kimi_router_gap(model, rl, config), None, {"seed": str(seed)})


def make_bailing_hybrid(seed):
    import json

    from safetensors.torch import save_file as save
    from transformers import BailingHybridConfig, BailingHybridForCausalLM

    out = os.path.join(GOLDEN, "bailing_hybrid_tiny")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = BailingHybridConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=5,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
        first_k_dense_replace=1, num_attention_heads=3, num_key_value_heads=3, head_dim=24, kv_lora_rank=40,
        q_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=20, short_conv_kernel_size=4,
        num_local_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, kda_safe_gate=True, kda_lower_bound=-5.0,
        num_mtp_layers=1, pad_token_id=0, eos_token_id=2,
    )
    config._attn_implementation = "eager"
    assert config.linear_head_dim == 24 and config.linear_num_heads == 3
    model = BailingHybridForCausalLM(config).float().eval()
    randomize(model, gen, plus_one_norms=False)

    def fix_checkpoint(directory):
        # config.json stays as save_pretrained wrote it (head_dim = qk_rope_head_dim = 8, the KDA
        # head dim in linear_head_dim): hanpu reads it as transformers does.
        # An MTP layer after the decoder, as Ling checkpoints store one (num_mtp_layers 1): both
        # transformers and hanpu skip it.
        mtp = {"model.layers.5.attention.dense.weight": torch.randn(64, 60, generator=gen).to(torch.bfloat16)}
        save(mtp, os.path.join(directory, "model-mtp.safetensors"), metadata={"format": "pt"})
        index_path = os.path.join(directory, "model.safetensors.index.json")
        with open(index_path) as f:
            index = json.load(f)
        index["weight_map"].update({k: "model-mtp.safetensors" for k in mtp})
        with open(index_path, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")

    write_golden("bailing_hybrid", model, BailingHybridForCausalLM, out, gen,
                 lambda rl: kimi_router_gap(model, rl, config), None, {"seed": str(seed)}, fix_checkpoint)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["qwen3_5_moe", "kimi_linear", "bailing_hybrid"])
    ap.add_argument("--bailing-seed", type=int, default=5301)
    ap.add_argument("--qwen-seed", type=int, default=3555)
    ap.add_argument("--kimi-seed", type=int, default=4802)
    args = ap.parse_args()
    if args.only in (None, "qwen3_5_moe"):
        make_qwen35_moe(args.qwen_seed)
    if args.only in (None, "kimi_linear"):
        make_kimi_linear(args.kimi_seed)
    if args.only in (None, "bailing_hybrid"):
        make_bailing_hybrid(args.bailing_seed)


if __name__ == "__main__":
    main()
