#!/usr/bin/env python3
"""Generate a small tokenizer in Ling's form for hanpu's tests (tests/data/ling_tokenizer/).

Ling (inclusionAI's Ling 2.0 / 3.0, llama.cpp's pre-tokenizer names "bailingmoe2" / "bailingmoe")
splits text with the regex that llama.cpp's src/llama-vocab.cpp quotes as the "original regex from
tokenizer.json" for LLAMA_VOCAB_PRE_TYPE_BAILINGMOE (possessive quantifiers, `\\s*[\\r\\n]` where
Qwen has `\\s*[\\r\\n]+`). The published tokenizer.json is not on this machine, so this script
trains a byte-level BPE of about a thousand tokens with Hugging Face `tokenizers`, configured with
that split (Split isolated, then ByteLevel without prefix space or regex; no normalizer, as
llama.cpp applies none) on the corpus of tools/make_tokenizer_golden.py, then adds Ling 2.0's chat
markers as llama.cpp's src/llama-chat.cpp (LLM_CHAT_TEMPLATE_BAILING2) writes them: `<role>`,
`</role>` and `<|role_end|>` special, with `<|endoftext|>`; `<think>` / `</think>` as plain added
tokens. tokenizer_config.json gets eos `<|role_end|>` and a chat template in that format.

Writes tokenizer.json, tokenizer_config.json and expected.json (for every hard string of
make_tokenizer_golden.py plus 200 random ones: `ids` with special tokens parsed and
`ids_no_special` with encode_special_tokens), one case per line.

Usage (environment: tools/requirements-tokenizer.txt):
    python3 tools/make_ling_tokenizer_golden.py [--out tests/data/ling_tokenizer]
"""

import argparse
import json
import sys
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tokenizer_golden as base  # noqa: E402  (its corpus, hard strings and random strings)

LING_REGEX = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = ["<|endoftext|>", "<role>", "</role>", "<|role_end|>"]
NON_SPECIAL_TOKENS = ["<think>", "</think>"]
CHAT_TEMPLATE = ("{% for message in messages %}<role>{{ message['role'] | upper }}</role>{{ message['content'] }}"
                 "<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")


def train(vocab_size):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LING_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(base.build_corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL_TOKENS])
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/data/ling_tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=1000)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train(args.vocab_size)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))  # test exactly what is committed
    config = {"eos_token": "<|role_end|>", "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    chat = "<role>HUMAN</role>你好, I'm 3 years\told!<|role_end|><role>ASSISTANT</role><think>\n\n</think>"
    strings = base.hard_strings() + [("ling_chat", chat)] + [(f"fuzz_{i}", t) for i, t in enumerate(base.fuzz_strings(200, seed=7))]
    cases = []
    for name, text in strings:
        ids, ids_plain = base.encode_both(tok, text)
        cases.append({"name": name, "text": text, "ids": ids, "ids_no_special": ids_plain})
    vocab = tok.get_vocab(with_added_tokens=True)
    expected = {"tokenizers_version": tokenizers.__version__, "python_version": sys.version.split()[0],
                "split_regex": LING_REGEX, "vocab_size": max(vocab.values()) + 1, "cases": cases}
    base.write_expected(out / "expected.json", expected)
    print(f"wrote {out}: {len(vocab)} tokens, {len(cases)} cases, tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
