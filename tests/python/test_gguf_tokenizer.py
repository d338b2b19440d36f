"""Kimi's and Ling's tokenizers through `hanpu quantize --format` and back (issue 34).

The tiny goldens kimi_linear_tiny and bailing_hybrid_tiny have no tokenizer and 320 ids, fewer
than a byte-level vocabulary needs. Each test copies its golden, pads the embedding and the LM
head to the tokenizer's size (seeded random rows; the golden's rows unchanged), sets
config.json's vocab_size, and adds a tokenizer: Kimi's tiktoken files (tests/data/kimi_tiktoken)
or one in Ling's form (tests/data/ling_tokenizer). It writes the checkpoint as GGUF and checks:

- tokenizer.ggml.pre is llama.cpp's name ("kimi-k2", "bailingmoe2");
- `hanpu tokenize` on the GGUF file gives the ids `hanpu tokenize` gives on the checkpoint
  directory (which tests/test_tokenizer.cpp and test_gguf_model.cpp check against tiktoken and
  Hugging Face tokenizers) for CJK, digit runs, contractions, whitespace runs, emoji and the chat
  markers, with special tokens parsed and (--no-special) read as text;
- `hanpu run --prompt` on the GGUF file generates what it generates on the directory (the text goes
  through the GGUF's tokenizer into the model);
- for Kimi, the merges are those llama.cpp's converter recovers from the ranks (conversion/qwen.py
  QwenModel.bpe with max_rank, written again here from its description).

HANPU_EXE names the hanpu binary (set by ctest).
"""
import base64
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from gguf import GGUFReader
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
DATA = os.path.join(ROOT, "tests", "data")
HANPU = os.environ.get("HANPU_EXE", os.path.join(ROOT, "build", "release", "hanpu"))

sys.path.insert(0, os.path.join(ROOT, "tools"))
from byte_level_bpe import bytes_to_unicode  # noqa: E402

TRICKY = [
    "你好，世界！今天天气很好。",
    "1234567890 3.14159 1,000,000",
    "I'm sure they'll say we've DONE it, it's John's; I'D've",
    "spaces    and\ttabs\t\t\nnewlines\n\n\n   \n",
    "emoji 👍🏽 👨‍👩‍👧 🇯🇵 ❤️",
    "mixed Ünïcödé café naïve ℌ𝔢𝔩𝔩𝔬",
]


def run(*args):
    return subprocess.run([HANPU, *args], capture_output=True, text=True, check=True).stdout


def run_bytes(*args):  # a random model's continuation need not be UTF-8
    return subprocess.run([HANPU, *args], capture_output=True, check=True).stdout


def padded_checkpoint(tmp_path, golden, vocab, tokenizer_files):
    """The golden with embedding and LM head padded to `vocab` rows and the tokenizer files added."""
    out = tmp_path / golden
    shutil.copytree(os.path.join(GOLDEN, golden), out)
    os.remove(out / "expected.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    old = cfg["vocab_size"]
    cfg["vocab_size"] = vocab
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = torch.Generator().manual_seed(34)
    for shard in sorted(p for p in os.listdir(out) if p.endswith(".safetensors")):
        tensors = load_file(str(out / shard))
        changed = False
        for name, t in tensors.items():
            if t.dim() == 2 and t.shape[0] == old and ("embed" in name or "lm_head" in name):
                extra = (torch.randn(vocab - old, t.shape[1], generator=gen) * 0.02).to(t.dtype)
                tensors[name] = torch.cat([t, extra])
                changed = True
        if changed:
            save_file(tensors, str(out / shard), metadata={"format": "pt"})
    for f in tokenizer_files:
        shutil.copy(f, out)
    return out


def ids(tokenizer, text, *flags):
    return run("tokenize", "--tokenizer", str(tokenizer), "--ids", "--text", text, *flags).strip()


def converter_merges(ranks):
    """conversion/kimi_linear.py's merges: for each rank in order, QwenModel.bpe(ranks, token, max_rank=rank)."""
    byte_char = bytes_to_unicode()
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best[1]):
                    best = (i, r)
            if best is None or best[1] >= rank:
                break
            i = best[0]
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
        if len(parts) == 2:
            merges.append(" ".join("".join(byte_char[b] for b in p) for p in parts))
    return merges



def field(reader, key):
    return reader.fields[key].contents()


FAMILIES = {
    "kimi": ("kimi_linear_tiny", "kimi-k2", 3009 + 7, ["tiktoken.model", "tokenizer_config.json"], "kimi_tiktoken",
             "<|im_user|>user<|im_middle|>你好 it's 2024<|im_end|><|im_assistant|>assistant<|im_middle|>"),
    "ling": ("bailing_hybrid_tiny", "bailingmoe2", 1006, ["tokenizer.json", "tokenizer_config.json"], "ling_tokenizer",
             "<role>HUMAN</role>你好 it's 2024<|role_end|><role>ASSISTANT</role><think>\n\n</think>"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_tokenizes_as_checkpoint(tmp_path, family):
    golden, pre, vocab, files, data, chat = FAMILIES[family]
    ckpt = padded_checkpoint(tmp_path, golden, vocab, [os.path.join(DATA, data, f) for f in files])
    out = tmp_path / f"{golden}.gguf"
    run("quantize", "--model", str(ckpt), "--out", str(out), "--format", "f16")
    r = GGUFReader(str(out))
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == pre
    assert len(field(r, "tokenizer.ggml.tokens")) == vocab
    for text in TRICKY + [chat]:
        for flags in ([], ["--no-special"]):
            want = ids(ckpt, text, *flags)
            assert ids(out, text, *flags) == want, (text, flags)
            assert want  # not a vacuous comparison
    # The chat markers are one special token each when parsed.
    assert len(ids(out, chat).split(",")) < len(ids(out, chat, "--no-special").split(","))
    # Text through the GGUF's tokenizer into the model: the same continuation as the directory.
    prompt = TRICKY[0] + " " + TRICKY[2]
    gen = ["run", "--prompt", prompt, "-n", "6", "--greedy", "--threads", "2"]
    assert run_bytes(*gen, "--model", str(out)) == run_bytes(*gen, "--model", str(ckpt))


def test_kimi_merges_are_the_converters(tmp_path):
    golden, _, vocab, files, data, _ = FAMILIES["kimi"]
    ckpt = padded_checkpoint(tmp_path, golden, vocab, [os.path.join(DATA, data, f) for f in files])
    out = tmp_path / "kimi.gguf"
    run("quantize", "--model", str(ckpt), "--out", str(out), "--format", "f16")
    ranks = {}
    with open(os.path.join(DATA, data, "tiktoken.model")) as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
    want = converter_merges(ranks)
    assert len(want) > 1000
    assert list(field(GGUFReader(str(out)), "tokenizer.ggml.merges")) == want
