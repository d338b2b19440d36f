"""Whole-model vLLM-CPU throughput with and without hanpu's plugin (docs/VLLM.md).

Run in the venv of scripts/setup_vllm.sh:

    build/vllm-venv/bin/python benchmarks/vllm_model.py --make-checkpoint build/qwen35-0.8b-random
    OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ENABLE_V1_MULTIPROCESSING=0 \\
        HANPU_VLLM=1 build/vllm-venv/bin/python benchmarks/vllm_model.py build/qwen35-0.8b-random

The checkpoint has Qwen3.5-0.8B's shapes (docs/MODEL.md: hidden 1024, 24 layers of which every
4th is full attention, 16 GDN heads of K = V = 128, vocab 248320, tied embeddings, an fp32
recurrent state as the published config asks with mamba_ssm_dtype) and random bf16 weights
(transformers' initialisation). One request: a prompt of --prompt random tokens, timed as a
generate() of one token (prefill), then as a generate() of 1 + --decode tokens, whose extra time
over the first is the decode (--time-gdn: also the GDN core's time in each). Eager mode (enforce_eager) for both sides: vLLM's compiled mode
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


def make_checkpoint(path):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(**{k: v for k, v in QWEN35_08B.items() if k != "architectures"})
    config.architectures = QWEN35_08B["architectures"]
    model = transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    print(f"wrote {path}")


def time_gdn_core(acc):
    """Sums the time of the GDN core into acc: vLLM's `_cpu_gdn_attention_nonspec` without the
    plugin, the plugin's `gdn_attention_core` with it (both include vLLM's convolution). Both are
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
            acc[0] += time.perf_counter() - t0

    setattr(module, name, timed)


def run(path, prompt_len, decode, repeats, time_gdn):
    import random

    from vllm import LLM, SamplingParams

    gdn = [0.0]
    if time_gdn:  # in-process engines only (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        time_gdn_core(gdn)

    llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=prompt_len + decode + 8,
              enforce_eager=True, enable_prefix_caching=False, max_num_seqs=1, seed=0)
    rng = random.Random(0)

    def once(tokens):
        ids = [rng.randrange(1000, 200000) for _ in range(prompt_len)]  # a new prompt: no cache hits
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        gdn[0] = 0.0
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        return time.perf_counter() - t0, gdn[0]

    once(2)  # warm-up
    prefill, total = [], []
    for _ in range(repeats):
        prefill.append(once(1))
        total.append(once(1 + decode))
    p = statistics.median(t for t, _ in prefill)
    d = statistics.median(t for t, _ in total) - p
    result = {"plugin": os.environ.get("HANPU_VLLM", "1") != "0", "prompt": prompt_len, "decode": decode,
              "prefill_tokens_per_s": prompt_len / p, "decode_tokens_per_s": decode / d,
              "prefill_s": [t for t, _ in prefill], "generate_s": [t for t, _ in total]}
    if time_gdn:  # per repeat: the GDN core's seconds in the prefill, and in the decode tokens
        result["gdn_prefill_s"] = [g for _, g in prefill]
        result["gdn_decode_s"] = [g1 - g0 for (_, g0), (_, g1) in zip(prefill, total)]
    print(json.dumps(result))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--make-checkpoint")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-gdn", action="store_true", help="also sum the GDN core's time (in-process engine only)")
    args = ap.parse_args()
    if args.make_checkpoint:
        make_checkpoint(args.make_checkpoint)
    if args.checkpoint:
        run(args.checkpoint, args.prompt, args.decode, args.repeats, args.time_gdn)


if __name__ == "__main__":
    main()
