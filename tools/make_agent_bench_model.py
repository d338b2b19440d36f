#!/usr/bin/env python3
"""Writes a Qwen3.5 checkpoint with random weights of published shapes AND a byte-level BPE
tokenizer of the real vocabulary size with a Qwen3.5-style chat template (tools, tool calls,
<think>), so that `hanpu serve` and llama.cpp's llama-server can both serve it through
/v1/chat/completions with the same template (scripts/bench_agent.py, docs/SERVE.md "Benchmark").

    tools/make_agent_bench_model.py OUT_DIR [--shapes 0.8b] [--gguf f16]

OUT_DIR gets config.json, model.safetensors (bfloat16: N(0, 0.02) as
tools/make_random_qwen35_checkpoint.py draws them, rounded to bf16), tokenizer.json, tokenizer_config.json (with the
chat template) and, with --gguf FORMAT, OUT_DIR/model-FORMAT.gguf written by `hanpu quantize
--format` (tokenizer.ggml.* keys and tokenizer.chat_template included, which llama-server needs:
a GGUF without a vocabulary crashes it at its first sampled token).

The tokenizer: Qwen3.5's pre-tokenizer (the split regex of the real tokenizer.json, as in
tests/golden/qwen35_tiny), a byte-level BPE trained (PyPI tokenizers) on the Python sources
installed on the machine (/usr/lib/python3*), filled with CJK tokens up to 248,044 regular tokens,
then Qwen's added tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <tool_call>, <think>, ...) from id 248,044 on; the
embedding has 248,320 rows as Qwen3.5's. Text therefore splits into word-sized tokens as with a real
tokenizer (about 4 bytes a token on English and JSON), not byte by byte. The chat template is hanpu's
own Qwen3.5-style test template (python/tests/chat_templates/qwen35_xml_tools.jinja: tools as JSON
lines in the system turn, XML-parameter tool calls, <tool_response> turns, <think> blocks dropped
before the last user query), not Qwen's file.
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from json_schema_vocab import byte_alphabet  # noqa: E402
import make_random_qwen35_checkpoint as random_ckpt  # noqa: E402

TINY = os.path.join(ROOT, "tests", "golden", "qwen35_tiny")
TEMPLATE = os.path.join(ROOT, "python", "tests", "chat_templates", "qwen35_xml_tools.jinja")
REGULAR_TOKENS = 248044  # Qwen3.5's regular vocabulary; its added tokens start here
VOCAB_ROWS = 248320      # config vocab_size (embedding rows)
# Qwen's added tokens in their order (special: the <|...|> control tokens; the tags are not special).
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
         "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
         "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
         "<tool_response>", "</tool_response>", "<think>", "</think>"]


def build_tokenizer(regular=REGULAR_TOKENS):
    """Trains a byte-level BPE (PyPI tokenizers' BpeTrainer) with Qwen3.5's pre-tokenizer on the
    Python sources installed here, then fills the vocabulary up to `regular` with CJK tokens."""
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
    with open(os.path.join(TINY, "tokenizer.json")) as f:
        tiny = json.load(f)
    regex = tiny["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    tk = tokenizers.Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    sources = sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True) +
                     glob.glob("/usr/local/lib/python3*/**/*.py", recursive=True))

    def texts():
        for f in sources:
            try:
                yield open(f, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError):
                continue

    trainer = trainers.BpeTrainer(vocab_size=regular, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts(), trainer)
    trained = json.loads(tk.to_str())["model"]
    vocab, merges = dict(trained["vocab"]), trained["merges"]
    b2u = byte_alphabet()
    enc = lambda s: "".join(b2u[b] for b in s.encode())
    # The corpus gives fewer merges than Qwen's vocabulary has tokens: CJK characters, Hangul
    # syllables and CJK pairs fill the rest (tokens without merges: only the vocabulary's size
    # and the LM head matter for them here).
    fill = [chr(c) for c in list(range(0x4E00, 0xA000)) + list(range(0xAC00, 0xD7A4))]
    r = random.Random(1)
    while len(vocab) < regular:
        t = enc(fill.pop(0)) if fill else enc(chr(0x4E00 + r.randrange(3000)) + chr(0x4E00 + r.randrange(3000)))
        vocab.setdefault(t, len(vocab))
    added = [{"id": regular + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t.startswith("<|")} for i, t in enumerate(ADDED)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": tiny["normalizer"], "pre_tokenizer": tiny["pre_tokenizer"], "post_processor": None,
           "decoder": tiny["decoder"],
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": merges}}
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--shapes", choices=sorted(random_ckpt.SHAPES), default="0.8b")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gguf", choices=["f16", "q8_0"], help="also write OUT/model-FORMAT.gguf with `hanpu quantize`")
    ap.add_argument("--keep-weights", action="store_true", help="keep an existing OUT/model.safetensors (new tokenizer only)")
    ap.add_argument("--hanpu", default=os.path.join(ROOT, "build", "release", "hanpu"), help="hanpu binary (for --gguf)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    tok = build_tokenizer()
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(TEMPLATE) as f:
        template = f.read()
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "model_max_length": 262144, "chat_template": template}, f, indent=1)
    im_end = REGULAR_TOKENS + ADDED.index("<|im_end|>")

    H, L, NH, NKV, NV, I = random_ckpt.SHAPES[a.shapes]
    HD, NK, DK, DV, K = 256, 16, 128, 128, 4
    with open(os.path.join(TINY, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg["text_config"]
    tc.update(vocab_size=VOCAB_ROWS, hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
              num_key_value_heads=NKV, head_dim=HD, linear_num_key_heads=NK, linear_num_value_heads=NV,
              linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=K, tie_word_embeddings=True,
              max_position_embeddings=262144, full_attention_interval=4, eos_token_id=im_end,
              layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)])
    tc["rope_parameters"].update(rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[11, 11, 10])
    cfg["tie_word_embeddings"] = True
    cfg["image_token_id"] = REGULAR_TOKENS + ADDED.index("<|image_pad|>")
    cfg["video_token_id"] = REGULAR_TOKENS + ADDED.index("<|video_pad|>")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    rng = np.random.default_rng(a.seed)
    weights = os.path.join(a.out, "model.safetensors")
    if a.keep_weights and os.path.exists(weights):
        with open(weights, "rb") as f:
            if b'"F16"' in f.read(int.from_bytes(f.read(8), "little")):  # an older float16 file: convert it
                from safetensors.numpy import load_file
                save_bf16_safetensors(load_file(weights), weights)
        print(f"{a.out}: {len(tok['model']['vocab'])} regular + {len(ADDED)} added tokens, "
              f"{len(tok['model']['merges'])} merges; weights kept")
        write_gguf(a)
        return

    def w(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float16)

    t = random_ckpt.qwen35_tensors(w, rng, hidden=H, intermediate=I, vocab=VOCAB_ROWS, layers=L,
                                   full_layers={i for i in range(L) if (i + 1) % 4 == 0}, heads=NH, kv_heads=NKV,
                                   head_dim=HD, linear_key_heads=NK, linear_value_heads=NV, key_dim=DK, value_dim=DV,
                                   conv_kernel=K)
    save_bf16_safetensors(t, weights)
    print(f"{a.out}: {len(tok['model']['vocab'])} regular + {len(ADDED)} added tokens, "
          f"{len(tok['model']['merges'])} merges, {sum(v.size for v in t.values()) / 1e6:.0f} M parameters")
    write_gguf(a)


def save_bf16_safetensors(tensors, path):
    """Float16 tensors rounded to bfloat16 (nearest even) and written as BF16, the rest as stored:
    hanpu runs bf16 checkpoints on its fast kernels, and every such value is exact in the F16 GGUF
    written from it (bar f16 subnormals: |w| < 6.1e-5, about 0.2% of N(0, 0.02) draws, lose low bits).
    numpy has no bfloat16, so the file is written by hand (safetensors: u64 header size, JSON header, data)."""
    header, blobs, offset = {}, [], 0
    for name, v in tensors.items():
        if v.dtype == np.float16:
            bits = v.astype(np.float32).view(np.uint32)
            data = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
            dtype = "BF16"
        else:
            data, dtype = np.ascontiguousarray(v).tobytes(), {np.dtype(np.float32): "F32"}[v.dtype]
        header[name] = {"dtype": dtype, "shape": list(v.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for b in blobs:
            f.write(b)


def write_gguf(a):
    if a.gguf:
        out = os.path.join(a.out, f"model-{a.gguf}.gguf")
        subprocess.run([a.hanpu, "quantize", "--model", a.out, "--out", out, "--format", a.gguf], check=True)
        print(out)


if __name__ == "__main__":
    main()
