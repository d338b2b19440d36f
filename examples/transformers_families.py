#!/usr/bin/env python3
"""Prefill speed of transformers' hybrid families on the CPU, torch fallback vs routed to hanpu.

For each family hanpu.integrations.transformers supports, builds a random model from transformers'
own config class (moderate shapes, below; nothing downloaded), runs a `--tokens` prefill with the
linear-attention kernels left to transformers' pure-torch functions and again routed to hanpu
(the functions `hanpu.integrations.transformers.routed()` installs), checks that the last
position's logits agree (NMSE <= 1e-8, fp32), and prints the medians of `--repeats` timed prefills
(after one untimed warm-up each, the two paths interleaved): the whole prefill and the
linear-attention calls alone (each call wrapped with a timer).

Shapes (all families): hidden 512, 4 layers of which 3 linear attention, linear-attention heads
with head dim 128 (GDN: 4 query/key heads, 8 value heads; KDA: 4 heads), 8 experts top-2 where the
family has MoE. These are not the released models' shapes: the linear-attention share of the
prefill, and so the whole-prefill speedup, depends on them; the per-call speedup much less.

    python3 examples/transformers_families.py                 # every family, 512 tokens
    python3 examples/transformers_families.py --families kimi_linear --tokens 2048

Exit code 0 when every family's logits agree, 1 otherwise.
"""

import argparse
import importlib
import inspect
import statistics
import sys
import time
import warnings

FP32_NMSE = 1e-8
COMMON = dict(vocab_size=1024, hidden_size=512, num_hidden_layers=4, num_attention_heads=4, rms_norm_eps=1e-6,
              tie_word_embeddings=False)
QWEN = dict(COMMON, intermediate_size=1024, num_key_value_heads=2, head_dim=128, linear_num_key_heads=4,
            linear_num_value_heads=8, linear_key_head_dim=128, linear_value_head_dim=128)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256)
KDA = dict(COMMON, intermediate_size=1024, num_key_value_heads=4, linear_num_heads=4, linear_head_dim=128,
           kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, num_experts=8,
           num_experts_per_token=2, moe_intermediate_size=256, head_dim=32, pad_token_id=0, bos_token_id=None,
           eos_token_id=None, layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
           mlp_layer_types=["dense", "sparse", "sparse", "sparse"])


def build(family, transformers):
    t = transformers
    return {
        "qwen3_5": lambda: t.Qwen3_5ForCausalLM(t.Qwen3_5TextConfig(**QWEN)),
        "qwen3_5_moe": lambda: t.Qwen3_5MoeForCausalLM(t.Qwen3_5MoeTextConfig(**QWEN, **MOE)),
        "qwen3_next": lambda: t.Qwen3NextForCausalLM(t.Qwen3NextConfig(**QWEN, **MOE)),
        "kimi_linear": lambda: t.KimiLinearForCausalLM(t.KimiLinearConfig(**KDA)),
        "bailing_hybrid": lambda: t.BailingHybridForCausalLM(t.BailingHybridConfig(
            **KDA, num_expert_group=2, topk_group=1, first_k_dense_replace=1)),
    }[family]()


def measure(family, args, torch, transformers, ht):
    torch.manual_seed(args.seed)
    model = build(family, transformers).float().eval()
    module = importlib.import_module(ht.FAMILIES[family][0])
    names = ht.FUNCTION_NAMES[ht.FAMILIES[family][1]]  # kind -> module-level name
    original = {kind: getattr(module, n) for kind, n in names.items()}
    # Taken before any swap below: the fallback of hanpu's functions is transformers' own function.
    paths = {"torch": {kind: inspect.unwrap(f) for kind, f in original.items()}, "hanpu": ht.routed_functions(family)}
    la_seconds = [0.0]

    def timed(fn):
        def call(*a, **k):
            start = time.perf_counter()
            result = fn(*a, **k)
            la_seconds[0] += time.perf_counter() - start
            return result
        return call

    ids = torch.randint(0, COMMON["vocab_size"], (1, args.tokens), generator=torch.Generator().manual_seed(args.seed))
    times = {p: {"prefill": [], "la": []} for p in paths}
    logits = {}
    ht.reset_stats()
    try:
        with torch.inference_mode():
            for rep in range(args.repeats + 1):
                for path, fns in paths.items():
                    for kind, n in names.items():
                        setattr(module, n, timed(fns[kind]))
                    la_seconds[0] = 0.0
                    start = time.perf_counter()
                    out = model(ids, use_cache=False, logits_to_keep=1)
                    total = time.perf_counter() - start
                    if rep == 0:
                        logits[path] = out.logits.double()
                    else:
                        times[path]["prefill"].append(total)
                        times[path]["la"].append(la_seconds[0])
    finally:
        for kind, n in names.items():
            setattr(module, n, original[kind])
    ref = logits["torch"]
    err = float(((logits["hanpu"] - ref) ** 2).sum() / (ref ** 2).sum())
    calls = ht.stats().get((family, "chunk"), {})
    med = {p: {k: statistics.median(v) for k, v in t.items()} for p, t in times.items()}
    ok = err <= FP32_NMSE and calls.get("fallback", 0) == 0 and calls.get("hanpu", 0) > 0
    print(f"{family:15} T={args.tokens}: prefill torch {med['torch']['prefill']:.3f} s, hanpu "
          f"{med['hanpu']['prefill']:.3f} s ({med['torch']['prefill'] / med['hanpu']['prefill']:.2f}x); "
          f"linear-attention calls torch {med['torch']['la']:.3f} s, hanpu {med['hanpu']['la']:.4f} s "
          f"({med['torch']['la'] / med['hanpu']['la']:.1f}x); logits NMSE {err:.1e}; hanpu calls "
          f"{calls.get('hanpu', 0)}, fallbacks {calls.get('fallback', 0)}{'' if ok else '  FAILED'}", flush=True)
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", nargs="+", help="default: every family hanpu.integrations.transformers supports")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="timed prefills per path (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="threads for torch and hanpu (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1 or args.threads < 0:
        ap.error("--tokens and --repeats must be at least 1, --threads not negative")
    import torch
    import transformers

    import hanpu
    import hanpu.integrations.transformers as ht

    families = args.families or list(ht.FAMILIES)
    for f in families:
        if f not in ht.FAMILIES:
            ap.error(f"unknown family {f!r}; choose from {', '.join(ht.FAMILIES)}")
    if args.threads:
        torch.set_num_threads(args.threads)
        hanpu.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} torch threads, {hanpu.get_num_threads()} hanpu threads, "
          f"hanpu kernels {hanpu.isa()['target']}", flush=True)
    warnings.filterwarnings("ignore", category=FutureWarning)
    return 0 if all([measure(f, args, torch, transformers, ht) for f in families]) else 1


if __name__ == "__main__":
    sys.exit(main())
