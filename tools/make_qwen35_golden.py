#!/usr/bin/env python3
"""Build a tiny random Qwen3.5 text model with Hugging Face transformers and record its logits.

Writes tests/golden/qwen35_tiny/ (see tests/golden/README.md):
  config.json                       nested like the official Qwen3_5ForConditionalGeneration
                                    checkpoints: top-level model_type "qwen3_5", the text model
                                    under "text_config" (model_type "qwen3_5_text")
  model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
                                    the weights, sharded in two files, named as the official
                                    checkpoints name them (model.language_model.*, lm_head.weight),
                                    BF16 except linear_attn.A_log and linear_attn.norm.weight (F32),
                                    plus a few model.visual.* and mtp.* tensors a text engine must skip
  tokenizer.json, tokenizer_config.json
                                    a byte-level BPE trained here with the Qwen3.5 pre-tokenizer
                                    (not used by the logits; lets `hanpu run --prompt` work on it)
  expected.safetensors              prompt_ids [T0] I64, greedy_ids [N] I64, logits [T0+N, V] F32:
                                    transformers' logits for every position of prompt + greedy
                                    continuation, computed in float32 on exactly the stored weights;
                                    text_prompt_ids / text_greedy_ids I64: TEXT_PROMPT (metadata
                                    "text_prompt") encoded by the tokenizers library, and its greedy
                                    continuation (for an end-to-end test of `hanpu run --prompt`)

The model has both layer kinds (layer_types given explicitly), GVA in the GDN layers
(linear_num_value_heads 4 > linear_num_key_heads 2), GQA in the attention layers (4 q / 2 kv
heads), partial RoPE (0.25 of head_dim 32 = 8 dims) with a non-default theta, an untied LM head,
and a prompt of 75 tokens (more than one 64-token GDN chunk, not a multiple of it).
Weights are random with scales chosen so that every part of the model visibly moves the logits
(norm offsets, conv weights, A_log, dt_bias are all random, not their init values).

The greedy continuation is computed by repeated full forward passes (no cache), taking the argmax
of the last position; the script checks that transformers' own cached generate() agrees, and that
the top-1/top-2 logit gap at each greedy step is large enough for a float32 engine to reproduce.

Environment (CPU only, Python 3.11.7): torch as tools/requirements-goldens.txt explains, then
    pip install --no-deps -r tools/requirements-qwen-golden.txt
Usage:
    python3 tools/make_qwen35_golden.py [--out tests/golden/qwen35_tiny]
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

SEED = 3502
PROMPT_LEN = 75
NEW_TOKENS = 10
VOCAB = 320
# Minimum top-1 minus top-2 logit gap accepted at a greedy step: far above float32 accumulation
# differences between two correct implementations (~1e-5 on logits of size ~1-10).
MIN_GREEDY_GAP = 1e-2

TEXT_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 50000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 2],
        "mrope_interleaved": True,
    },
    "attention_bias": False,
    "attn_output_gate": True,
    "tie_word_embeddings": False,
    "full_attention_interval": 4,
    "mamba_ssm_dtype": "float32",
}

# The Qwen3.5 pre-tokenizer split (its tokenizer.json's pre_tokenizer regex).
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT_PROMPT = "Hello world! The quick brown fox runs the model 42 times."
TEXT_NEW_TOKENS = 8


# The lines the golden's tokenizer is trained on (tools/qwen_golden_tokenizer.py).
TOKENIZER_CORPUS = [
        "The quick brown fox jumps over the lazy dog. " * 4,
        "Hello world! Hello there, hello again. The model runs the linear attention layers.",
        "hanpu runs Qwen3.5 on the CPU: prefill, decode, the gated delta rule and the state.",
        "the the the and and of of to to in in is is it it that that",
]


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
        else:  # nn.Linear [out, in]
            val = torch.randn(shape, generator=gen) / shape[1] ** 0.5
        stored_f32 = name.endswith("A_log") or name.endswith("linear_attn.norm.weight")
        if not stored_f32:
            val = val.to(torch.bfloat16).float()
        with torch.no_grad():
            p.copy_(val)


def stored_tensors(model):
    """The checkpoint's tensors: official names (model.language_model.*), stored dtypes."""
    out = {}
    for name, p in model.state_dict().items():
        stored_f32 = name.endswith("A_log") or name.endswith("linear_attn.norm.weight")
        t = p.detach().clone().contiguous()
        t = t.float() if stored_f32 else t.to(torch.bfloat16)
        if name.startswith("model."):
            name = "model.language_model." + name[len("model."):]
        out[name] = t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden", "qwen35_tiny"))
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import transformers
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    specials = build_tokenizer(args.out, QWEN35_SPLIT, TOKENIZER_CORPUS, VOCAB, SPECIAL_TOKENS)

    text_config = dict(TEXT_CONFIG)
    text_config["eos_token_id"] = specials["<|endoftext|>"]
    cfg_kwargs = {k: v for k, v in text_config.items() if k not in ("model_type", "attn_output_gate",
                                                                     "full_attention_interval", "mamba_ssm_dtype")}
    config = Qwen3_5TextConfig(**cfg_kwargs)
    config._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(config).float().eval()
    randomize(model, gen)

    # --- checkpoint ---------------------------------------------------------------------------
    tensors = stored_tensors(model)
    # Tensors of the other towers that a text-only loader must skip (shapes like the real ones).
    tensors["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 4, 4, generator=gen).to(torch.bfloat16)
    tensors["model.visual.merger.linear_fc1.weight"] = torch.randn(16, 8, generator=gen).to(torch.bfloat16)
    tensors["mtp.fc.weight"] = torch.randn(64, 128, generator=gen).to(torch.bfloat16)
    tensors["mtp.norm.weight"] = torch.zeros(64).to(torch.bfloat16)
    names = sorted(tensors)
    first = [n for n in names if n.startswith("model.language_model.embed_tokens") or
             any(n.startswith(f"model.language_model.layers.{i}.") for i in (0, 1))]
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
    config_json = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "image_token_id": 248056,
        "video_token_id": 248057,
        "text_config": text_config,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 8},
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2)
        f.write("\n")

    # --- reference logits ---------------------------------------------------------------------
    # Prompt ids avoid the special tokens (they carry no meaning for a random model, but keep the
    # prompt ordinary text for tools that detokenize it).
    low = 0
    high = min(specials.values())
    prompt = torch.randint(low, high, (PROMPT_LEN,), generator=gen)
    seq = prompt.clone()
    gaps = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=seq[None], use_cache=False).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gaps.append(float(top2[0] - top2[1]))
            seq = torch.cat([seq, logits.argmax().view(1)])
        full_logits = model(input_ids=seq[None], use_cache=False).logits[0].float().contiguous()
        cached = model.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                pad_token_id=specials["<|endoftext|>"])[0]
        from tokenizers import Tokenizer
        text_ids = torch.tensor(Tokenizer.from_file(os.path.join(args.out, "tokenizer.json")).encode(TEXT_PROMPT).ids)
        text_seq = text_ids.clone()
        for _ in range(TEXT_NEW_TOKENS):
            logits = model(input_ids=text_seq[None], use_cache=False).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gaps.append(float(top2[0] - top2[1]))
            text_seq = torch.cat([text_seq, logits.argmax().view(1)])
    greedy = seq[PROMPT_LEN:]
    if not torch.equal(cached[PROMPT_LEN:], greedy):
        sys.exit(f"transformers' cached generate() disagrees with full forwards: {cached[PROMPT_LEN:].tolist()} "
                 f"vs {greedy.tolist()}")
    if min(gaps) < MIN_GREEDY_GAP:
        sys.exit(f"greedy step gap {min(gaps):.3g} below {MIN_GREEDY_GAP}: pick another SEED")
    meta = {
        "generator": "tools/make_qwen35_golden.py",
        "seed": str(args.seed),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "reference": "Qwen3_5ForCausalLM float32, eager attention, use_cache=False full forwards",
        "min_greedy_gap": repr(min(gaps)),
        "text_prompt": TEXT_PROMPT,
    }
    save_file({"prompt_ids": prompt.to(torch.int64).contiguous(), "greedy_ids": greedy.to(torch.int64).contiguous(),
               "logits": full_logits, "text_prompt_ids": text_ids.to(torch.int64).contiguous(),
               "text_greedy_ids": text_seq[len(text_ids):].to(torch.int64).contiguous()}, os.path.join(args.out, "expected.safetensors"), metadata=meta)
    print(f"wrote {args.out}: prompt {PROMPT_LEN} tokens, greedy {greedy.tolist()}, min gap {min(gaps):.4f}, "
          f"logit std {full_logits.std():.3f}")


if __name__ == "__main__":
    main()
