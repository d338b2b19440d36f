"""Whole-model vLLM-CPU throughput with and without hanpu's plugin (docs/VLLM.md).

Run in the venv of scripts/setup_vllm.sh:

    build/vllm-venv/bin/python benchmarks/vllm_model.py --make-checkpoint build/qwen35-0.8b-random
    build/vllm-venv/bin/python benchmarks/vllm_model.py --make-kimi-checkpoint build/kimi-linear-slice-random
    OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
        HANPU_VLLM=1 build/vllm-venv/bin/python benchmarks/vllm_model.py build/qwen35-0.8b-random

The checkpoint has Qwen3.5-0.8B's shapes (docs/MODEL.md: hidden 1024, 24 layers of which every
4th is full attention, 16 GDN heads of K = V = 128, vocab 248320, tied embeddings, an fp32
recurrent state as the published config asks with mamba_ssm_dtype) and random bf16 weights
(transformers' initialisation). One request (or --concurrent N submitted together, every
request's tokens counted): a prompt of --prompt random tokens, timed as a
generate() of one token (prefill), then as a generate() of 1 + --decode tokens, whose extra time
over the first is the decode (--time-gdn: also the GDN core's time in each, per call). Eager mode (enforce_eager) for both sides: vLLM's compiled mode
first compiles with inductor for minutes on 2 cores. Prints one JSON line (tokens/s, medians
of --repeats).
"""

import argparse
import json
import os
import statistics
import time

QWEN35_08B = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=248320, hidden_size=1024,
    intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, full_attention_interval=4, hidden_act="silu", rms_norm_eps=1e-6,
    max_position_embeddings=4096, tie_word_embeddings=True, attn_output_gate=True, mamba_ssm_dtype="float32",
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    eos_token_id=248044, torch_dtype="bfloat16")

# Kimi-Linear-48B-A3B's layer shapes at reduced depth: hanpu's `kimi-linear-48b-a3b-slice`
# (src/model/family_kimi_linear.cpp): dense KDA layer 0, two MoE KDA layers, one MoE MLA layer;
# 64 of the 256 experts, top-8. transformers' config spelling (as tests/golden/kimi_linear_tiny).
KIMI_LINEAR_SLICE = dict(
    architectures=["KimiLinearForCausalLM"], model_type="kimi_linear", vocab_size=163840, hidden_size=2304,
    intermediate_size=9216, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=32, head_dim=64,
    kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, qk_head_dim=192,
    v_head_dim=128, linear_num_heads=32, linear_head_dim=128, linear_conv_kernel_dim=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"], mlp_layer_types=["dense"] + ["sparse"] * 3,
    num_experts=64, num_experts_per_token=8, moe_intermediate_size=1024, num_shared_experts=1,
    num_expert_group=1, topk_group=1, moe_renormalize=True, routed_scaling_factor=2.446, hidden_act="silu",
    rms_norm_eps=1e-5, tie_word_embeddings=False, eos_token_id=163586, bos_token_id=163584, pad_token_id=163839,
    max_position_embeddings=4096, dtype="bfloat16")


def make_kimi_checkpoint(path, config=None, seed=0):
    """Random bf16 weights under transformers' Kimi Linear names, written directly (transformers'
    own initialisation of 3 billion parameters takes many minutes on 2 cores). `config`: the
    shapes, KIMI_LINEAR_SLICE by default (python/tests_vllm makes a tiny one with heads that split
    in two for tensor parallelism)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    c = config or KIMI_LINEAR_SLICE
    hidden, heads, hd = c["hidden_size"], c["linear_num_heads"], c["linear_head_dim"]
    proj = heads * hd
    bf16 = torch.bfloat16

    def w(*shape, std=0.02):
        return (torch.randn(*shape) * std).to(bf16)

    def ones(n):
        return torch.ones(n, dtype=bf16)

    t = {"model.embed_tokens.weight": w(c["vocab_size"], hidden), "lm_head.weight": w(c["vocab_size"], hidden),
         "model.norm.weight": ones(hidden)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ones(hidden)
        t[p + "post_attention_layernorm.weight"] = ones(hidden)
        a = p + "self_attn."
        if c["layer_types"][i] == "linear_attention":
            for n in ("q", "k", "v"):
                t[a + f"{n}_proj.weight"] = w(proj, hidden)
                t[a + f"{n}_conv1d.weight"] = w(proj, 1, 4, std=0.3)
            t[a + "b_proj.weight"] = w(heads, hidden)
            t[a + "f_a_proj.weight"] = w(hd, hidden)
            t[a + "f_b_proj.weight"] = w(proj, hd)
            t[a + "g_a_proj.weight"] = w(hd, hidden)
            t[a + "g_b_proj.weight"] = w(proj, hd)
            t[a + "A_log"] = torch.log(torch.empty(1, 1, heads, 1).uniform_(1, 16)).to(bf16)
            t[a + "dt_bias"] = w(proj, std=1.0)
            t[a + "o_norm.weight"] = ones(hd)
            t[a + "o_proj.weight"] = w(hidden, proj)
        else:
            mh, qk, v, rank = c["num_attention_heads"], c["qk_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
            t[a + "q_proj.weight"] = w(mh * qk, hidden)
            t[a + "kv_a_proj_with_mqa.weight"] = w(rank + c["qk_rope_head_dim"], hidden)
            t[a + "kv_a_layernorm.weight"] = ones(rank)
            t[a + "kv_b_proj.weight"] = w(mh * (c["qk_nope_head_dim"] + v), rank)
            t[a + "o_proj.weight"] = w(hidden, mh * v)
        m = p + "block_sparse_moe."
        if c["mlp_layer_types"][i] == "dense":
            t[m + "gate_proj.weight"] = w(c["intermediate_size"], hidden)
            t[m + "up_proj.weight"] = w(c["intermediate_size"], hidden)
            t[m + "down_proj.weight"] = w(hidden, c["intermediate_size"])
        else:
            inter = c["moe_intermediate_size"]
            t[m + "gate.weight"] = w(c["num_experts"], hidden)
            t[m + "gate.e_score_correction_bias"] = torch.zeros(c["num_experts"])
            for e in range(c["num_experts"]):
                t[m + f"experts.{e}.w1.weight"] = w(inter, hidden)
                t[m + f"experts.{e}.w3.weight"] = w(inter, hidden)
                t[m + f"experts.{e}.w2.weight"] = w(hidden, inter)
            for n, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
                t[m + f"shared_experts.{n}.weight"] = w(*shape)
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    print(f"wrote {path}")


def make_checkpoint(path):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(**{k: v for k, v in QWEN35_08B.items() if k != "architectures"})
    config.architectures = QWEN35_08B["architectures"]
    model = transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    print(f"wrote {path}")


def time_gdn_core(calls):
    """Appends the time of each call of the GDN core to `calls`: vLLM's `_cpu_gdn_attention_nonspec` without the
    plugin, the plugin's `gdn_attention_core` with it (both include the causal convolution: vLLM's,
    hanpu's `causal_conv_slots`). Both are
    looked up as module globals at each call, so replacing them times every layer."""
    if os.environ.get("HANPU_VLLM", "1") == "0":
        import vllm.model_executor.layers.mamba.ops.cpu.gdn_attention as module
        name = "_cpu_gdn_attention_nonspec"
    else:
        import hanpu.integrations.vllm.gdn as module
        name = "gdn_attention_core"
    inner = getattr(module, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - t0)

    setattr(module, name, timed)


def run(path, prompt_len, decode, repeats, time_gdn, concurrent=1):
    """`concurrent` requests of `prompt_len` new random tokens each, submitted together (vLLM batches
    them: max_num_seqs = concurrent); prefill = the time to each request's first token, decode = the
    extra time of `decode` more tokens each; tokens/s count every request's tokens."""
    import random

    from vllm import LLM, SamplingParams

    gdn = []  # seconds of each GDN-core call of the current generate()
    if time_gdn:  # in-process engines only (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        time_gdn_core(gdn)

    llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=prompt_len + decode + 8,
              enforce_eager=True, enable_prefix_caching=False, max_num_seqs=concurrent, seed=0)
    rng = random.Random(0)
    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]

    def once(tokens):
        # new prompts: no cache hits
        prompts = [{"prompt_token_ids": [rng.randrange(1000, vocab) for _ in range(prompt_len)]}
                   for _ in range(concurrent)]
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        gdn.clear()
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0, list(gdn)

    once(2)  # warm-up
    prefill, total = [], []
    for _ in range(repeats):
        prefill.append(once(1))
        total.append(once(1 + decode))
    p = statistics.median(t for t, _ in prefill)
    d = statistics.median(t for t, _ in total) - p
    result = {"plugin": os.environ.get("HANPU_VLLM", "1") != "0", "prompt": prompt_len, "decode": decode,
              "concurrent": concurrent, "prefill_tokens_per_s": concurrent * prompt_len / p,
              "decode_tokens_per_s": concurrent * decode / d,
              "prefill_s": [t for t, _ in prefill], "generate_s": [t for t, _ in total]}
    if time_gdn:
        # Per repeat: the GDN core's seconds in the prefill-only generate(), and in the calls of the
        # longer generate() after as many calls as the prefill made (its decode steps; counting calls
        # rather than subtracting two runs' sums keeps the prefill's spread out of the decode figure).
        result["gdn_prefill_s"] = [sum(g) for _, g in prefill]
        result["gdn_decode_s"] = [sum(g1[len(g0):]) for (_, g0), (_, g1) in zip(prefill, total)]
        decode_calls = [len(g1) - len(g0) for (_, g0), (_, g1) in zip(prefill, total)]
        result["gdn_decode_calls"] = decode_calls
        result["gdn_decode_call_us"] = statistics.median(
            1e6 * sum(g1[len(g0):]) / max(1, len(g1) - len(g0)) for (_, g0), (_, g1) in zip(prefill, total))
        result["gdn_prefill_calls"] = [len(g) for _, g in prefill]
    print(json.dumps(result))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--make-checkpoint")
    ap.add_argument("--make-kimi-checkpoint", help="a Kimi Linear checkpoint (reduced depth, random weights)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-gdn", action="store_true", help="also sum the GDN core's time (in-process engine only)")
    ap.add_argument("--concurrent", type=int, default=1, help="requests submitted together (default 1)")
    args = ap.parse_args()
    if args.time_gdn and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        # The timers patch this process's GDN core; with an engine process of its own they would
        # count nothing and print zeros.
        ap.error("--time-gdn needs the in-process engine: set VLLM_ENABLE_V1_MULTIPROCESSING=0")
    if args.make_checkpoint:
        make_checkpoint(args.make_checkpoint)
    if args.make_kimi_checkpoint:
        make_kimi_checkpoint(args.make_kimi_checkpoint)
    if args.checkpoint:
        run(args.checkpoint, args.prompt, args.decode, args.repeats, args.time_gdn, args.concurrent)


if __name__ == "__main__":
    main()
