"""A synthetic byte-level BPE tokenizer.json of a real model's vocabulary size, for
benchmarks/json_schema_mask.cpp (docs/SERVE.md, "Structured output"): no checkpoint's tokenizer
is needed. Tokens: the 256 bytes, then the most frequent word pieces (a leading space kept, as
Qwen's pre-tokenizer splits) of the Python sources installed on the machine, then 20,000 single
CJK characters and random CJK pairs up to the size. Only the token bytes matter to the mask, so
there are no merges (the file is not for encoding text).

    python3 benchmarks/json_schema_vocab.py OUT.json [SIZE]     (SIZE: 151643, Qwen2.5/3's)
"""
import collections
import glob
import json
import random
import re
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from byte_level_bpe import bytes_to_unicode  # noqa: E402


def main():
    out = sys.argv[1]
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 151643
    b2u = bytes_to_unicode()
    enc = lambda s: "".join(b2u[b] for b in s.encode())
    pieces = collections.Counter()
    split = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+")
    for f in sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))[:40000]:
        try:
            text = open(f, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        pieces.update(p for p in split.findall(text) if len(p.encode()) <= 16)
    vocab = {b2u[b]: b for b in range(256)}
    cjk = [chr(c) for c in range(0x4E00, 0x4E00 + 20000)]
    for p, _ in pieces.most_common():
        if len(vocab) >= size - len(cjk):
            break
        vocab.setdefault(enc(p), len(vocab))
    for c in cjk:
        vocab.setdefault(enc(c), len(vocab))
    r = random.Random(1)
    while len(vocab) < size:
        vocab.setdefault(enc(chr(0x4E00 + r.randrange(3000)) + chr(0x4E00 + r.randrange(3000))), len(vocab))
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}
    with open(out, "w") as f:
        json.dump(tok, f)
    print(f"{out}: {len(vocab)} tokens")


if __name__ == "__main__":
    main()
