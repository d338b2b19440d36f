#!/usr/bin/env python3
"""Generate the tokenizer golden files for hanpu (tests/golden/tokenizer/).

Trains a small byte-level BPE tokenizer (a few thousand tokens) with the Hugging Face `tokenizers`
library, configured exactly like Qwen3.5's tokenizer.json (transformers'
models/qwen3_5/tokenization_qwen3_5.py): normalizer NFC; pre-tokenizer Sequence[Split(Qwen3.5
regex, behavior "isolated"), ByteLevel(add_prefix_space=False, use_regex=False)]; decoder
ByteLevel; BPE without unk token. Qwen's special tokens are added after the learned vocabulary
(as in Qwen, where they sit at the end), plus non-special added tokens (<think>, </think>,
<tool_call>, </tool_call>, like Qwen) and one `normalized` added token to exercise that path.

Writes:
  tests/golden/tokenizer/tokenizer.json   the trained tokenizer (as tokenizers saves it)
  tests/golden/tokenizer/expected.json    for every hard string: the ids tokenizers produces with
                                          special tokens parsed and with encode_special_tokens
                                          (hanpu's parse_special=false), the tokenizers decode of
                                          the ids, and the raw bytes of every vocabulary id.

Invalid UTF-8: a Python str cannot hold invalid UTF-8, so `tokenizers` never sees it (its
Rust core takes &str): bytes decoded with errors="surrogateescape" are refused ("TypeError:
TextInputSequence must be str", tokenizers 0.23.3), and with errors="replace" every bad sequence
becomes U+FFFD, which loses the bytes (b"abc\xffdef" -> ids of "abc", "\ufffd", "def"). hanpu
keeps the bytes instead: a maximal run of bytes that are not part of a valid UTF-8
sequence is one pre-token of its own; it is not normalized or regex-split, its bytes go through
the byte-level alphabet and BPE like any pre-token, and it ends the valid text around it (the
text before and after is normalized and split on its own). The expected ids for such inputs are
composed here from tokenizers itself: encode(valid part) for the valid parts and
model.tokenize(byte-level(run)) for each invalid run.

Usage (the environment is in tools/requirements-tokenizer.txt):
    pip install -r tools/requirements-tokenizer.txt
    python3 tools/make_tokenizer_golden.py [--out tests/golden/tokenizer]
The corpus is built from this file's own strings plus Python's standard library sources, so
the trained vocabulary depends on the Python version (3.11.7 was used); the expected ids are
always those of the committed tokenizer.json, so the test stays valid whatever the corpus.
"""

import argparse
import json
import os
import random
import sys
import sysconfig
import unicodedata
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from byte_level_bpe import bytes_to_unicode  # noqa: E402

# Qwen3.5's split regex (transformers models/qwen3_5/tokenization_qwen3_5.py, PRETOKENIZE_REGEX;
# Qwen3.5's tokenizer.json pre_tokenizer).
QWEN35_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
NON_SPECIAL_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
NORMALIZED_TOKEN = "Ångström"  # matched after NFC, so its NFD spelling is found too

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's fine, we've done it.",
    "你好，世界！这是一个测试。我们正在训练一个小型的分词器，用于检查实现是否正确。",
    "中文、日本語、한국어が混在する文章です。東京は日本の首都です。",
    "こんにちは世界、カタカナとひらがなの練習をしましょう。",
    "안녕하세요 세계, 오늘은 날씨가 좋습니다. 한국어 형태소 분석.",
    "مرحبا بالعالم، هذه جملة عربية للاختبار. اللغة العربية جميلة.",
    "שָׁלוֹם עוֹלָם, זה משפט בעברית לבדיקה.",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทยสำหรับการทดสอบ",
    "नमस्ते दुनिया, यह हिंदी में एक परीक्षण वाक्य है। क्षत्रिय",
    "Привет, мир! Это тестовое предложение на русском языке. Добрый день.",
    "Γειά σου Κόσμε! Αυτή είναι μια ελληνική πρόταση.",
    "Café, naïve, résumé, façade, coöperate, Ångström, Zürich, São Paulo, Kraków.",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇯🇵 🇺🇸 ❤️ 🏳️‍🌈 1️⃣ 😀😃😄 🚀✨",
    "Numbers 1234567890, 3.14159, 1,000,000, ٣٤٥, ２０２６, Ⅻ, ½, ²",
    "def tokenize(text):\n    return [t for t in text.split() if t]\n\nclass Foo:\n\tpass\n",
    "Windows line\r\nendings\r\n\r\nand\ttabs\t\there.",
]


def build_corpus():
    lines = []
    for _ in range(40):
        lines.extend(MULTILINGUAL)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    budget = 3_000_000  # ~3 MB of Python sources: enough English/code text for a 4K vocabulary
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines.extend(text.splitlines(keepends=True))
        budget -= len(text)
        if budget <= 0:
            break
    return lines


def train(vocab_size):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(build_corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(NORMALIZED_TOKEN, special=False, normalized=True)])
    return tok


def hard_strings():
    rnd = random.Random(1234)
    letters = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2000))
    return [
        ("empty", ""),
        ("ascii", "Hello world"),
        ("leading_spaces", "   leading spaces"),
        ("trailing_spaces", "trailing   "),
        ("space_only", "     "),
        ("single_space", " "),
        ("tabs", "tabs\t\tand\ttabs\t"),
        ("newlines", "new\nlines\n\n\nmany\n"),
        ("crlf", "crlf\r\nline\r\n\r\nend\r"),
        ("mixed_ws", "mixed \t \n \r\n  end  \n\t x"),
        ("ws_before_punct", "a  !b \n!c\n\n(d)"),
        ("digits", "12345678901234567890"),
        ("numbers", "3.14159 and 1,000,000 or 0x1F; v2.0.1"),
        ("unicode_digits", "٣٤٥ ２０２６ Ⅻ ½ ² ① ๕"),
        ("contractions", "I'm, you're, he's, they've, we'll, she'd, don't, it't"),
        ("contractions_upper", "I'M YOU'RE HE'S THEY'VE WE'LL SHE'D 'S'T"),
        ("contraction_long_s", "it'\u017f x'\u212a"),
        ("curly_apostrophe", "it\u2019s they\u2019re"),
        ("cjk", "你好，世界！这是一个测试。"),
        ("japanese", "こんにちは世界、カタカナとひらがな。"),
        ("korean", "안녕하세요 세계"),
        ("cjk_ext_b", "\U00020000\U00020001 \U0002A6D6"),
        ("emoji_skin", "👍🏽 thumbs"),
        ("emoji_zwj_family", "👨‍👩‍👧‍👦 family"),
        ("emoji_flags", "🇯🇵🇺🇸🇩🇪 flags"),
        ("emoji_vs16", "❤️ heart 🏳️‍🌈 rainbow 1️⃣ keycap"),
        ("emoji_run", "😀😃😄😁😆😅🤣😂🙂"),
        ("nfc_input", "é café Å"),
        ("nfd_input", "cafe\u0301 A\u030angstro\u0308m e\u0301\u0302"),
        ("angstrom_sign", "\u212b vs \u00c5 vs A\u030a"),
        ("combining_only", "\u0301\u0302 x\u0308"),
        ("hangul_jamo_nfd", "\u1100\u1161\u11a8 \u1112\u1161\u11ab"),
        ("normalized_added_token", "Ångström and A\u030angstro\u0308m"),
        ("arabic", "مرحبا بالعالم، ١٢٣"),
        ("hebrew_niqqud", "שָׁלוֹם עוֹלָם"),
        ("thai", "สวัสดีชาวโลก นี่คือ"),
        ("devanagari", "नमस्ते दुनिया क्षत्रिय"),
        ("mixed_scripts", "Hello世界123abcДобрый день مرحبا"),
        ("punctuation", "!!! ??? ... --- ;;; ,,,"),
        ("code", "def f(x):\n    return x**2  # square\n\tif x: pass\n"),
        ("urls", "email@example.com https://x.y/z?q=1&r=2#frag"),
        ("json", '{"key": [1, 2.5, "three"], "nested": {"a": null}}'),
        ("special_chat", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
        ("special_inline", "text<|endoftext|>more text<|im_end|>"),
        ("special_adjacent", "<|im_start|><|im_end|><|endoftext|>"),
        ("special_partial", "<|im_start <|im_end| im_start|>"),
        ("special_spaced", " <|im_start|> x <|im_end|> "),
        ("think_tags", "<think>\nreasoning\n</think>\n\nanswer"),
        ("tool_call_tags", "<tool_call>{\"name\": \"f\"}</tool_call>"),
        ("nbsp", "a\u00a0b\u00a0\u00a0c"),
        ("ideographic_space", "a\u3000b\u3000\u3000c"),
        ("line_separator", "a\u2028b\u2029c"),
        ("nel", "x\u0085y \u0085 z\u0085"),
        ("mongolian_vowel_separator", "a\u180eb \u180e c\u180e\u180e"),  # not \s (PCRE2 10.42 says it is)
        ("zero_width", "zero\u200bwidth\u200d\u200cjoin\u2060"),
        ("soft_hyphen", "soft\u00adhyphen"),
        ("bom", "\ufeffhello"),
        ("controls", "\x00\x01\x1f\x7f end"),
        ("math_alnum", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛"),
        ("long_repeat_a", "a" * 3000),
        ("long_random_word", letters),
        ("long_word_repeat", "antidisestablishmentarianism" * 40),
        ("long_digits", "9" * 500),
        ("long_spaces", " " * 1000 + "x"),
        ("long_newlines", "\n" * 200),
        ("long_cjk_punct", "。" * 100),
        ("long_emoji", "👨‍👩‍👧‍👦" * 50),
    ]


# Inputs with invalid UTF-8: lists of parts, str (valid text) or bytes (one maximal invalid run).
INVALID_UTF8 = [
    ("invalid_ff", ["abc", b"\xff", "def"]),
    ("invalid_truncated_2", ["caf", b"\xc3"]),
    ("invalid_truncated_4", [b"\xf0\x9f\x98", " ok"]),
    ("invalid_overlong", ["x", b"\xc0\xaf", "y"]),
    ("invalid_surrogate", ["a ", b"\xed\xa0\x80", " b"]),
    ("invalid_above_max", [b"\xf4\x90\x80\x80", "z"]),
    ("invalid_lone_continuations", ["hello ", b"\x80\x80\xbf", " world"]),
    ("invalid_only", [b"\xfe\xff\xfe"]),
    ("invalid_before_special", [b"\xff", "<|im_end|>", b"\x80"]),
    ("invalid_in_cjk", ["你好", b"\xe4\xb8", "世界"]),
]


# Characters the random strings are drawn from: every class the split regex distinguishes
# (letters of several scripts, marks, digits incl. non-ASCII, all kinds of whitespace, \r \n,
# apostrophes and case-folding look-alikes such as U+017F and U+212A, punctuation, emoji parts).
FUZZ_POOL = (
    list("aAsStTdDmMlLrReEvVzZ09") + ["'"] * 6 + list(" \t\n\r  ") + ["\r\n"] +
    ["\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u000b", "\u000c", "\u200b", "\u2003", "\u1680"] +
    ["\u017f", "\u212a", "\u0130", "\u0131", "\u00df", "\u1e9e"] +
    list("你好世界。、カナ한글") + list("مرحبا١٢") + list("שָׁל") + list("สวัสดี") + list("नमस्ते") +
    ["\u0301", "\u0308", "\u20dd", "\u0903"] + list("²½Ⅻ①٣") +
    list(".,;:!?-_()[]{}<>/\\\"#$%&*+=@^`|~") + ["👍", "\U0001f3fd", "\u200d", "\ufe0f", "🇯", "🇵", "😀"]
)


def fuzz_strings(count, seed=99):
    rnd = random.Random(seed)
    return ["".join(rnd.choice(FUZZ_POOL) for _ in range(rnd.randint(1, 40))) for _ in range(count)]


def encode_both(tok, text):
    tok.encode_special_tokens = False
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    ids_plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids, ids_plain


def write_expected(path, expected):
    """Writes a golden's expected.json one case per line: compact, yet a changed case shows as a
    one-line diff. Also used by make_ling_tokenizer_golden.py."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for i, (key, value) in enumerate(expected.items()):
            sep = "," if i + 1 < len(expected) else ""
            if key == "cases":
                f.write(f' "{key}": [\n')
                for j, case in enumerate(value):
                    f.write("  " + json.dumps(case, ensure_ascii=False) + ("," if j + 1 < len(value) else "") + "\n")
                f.write(f" ]{sep}\n")
            else:
                f.write(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{sep}\n")
        f.write("}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/golden/tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=4000)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tok = train(args.vocab_size)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))  # test exactly what is committed

    byte_char = bytes_to_unicode()
    char_byte = {c: b for b, c in byte_char.items()}
    # The split step alone, to compare hanpu's PCRE2 reading of the regex with Oniguruma's.
    splitter = pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False)

    def pieces(text):
        return [p for p, _ in splitter.pre_tokenize_str(unicodedata.normalize("NFC", text))]

    cases = []
    strings = hard_strings() + [(f"fuzz_{i}", t) for i, t in enumerate(fuzz_strings(400))]
    for name, text in strings:
        ids, ids_plain = encode_both(tok, text)
        cases.append({"name": name, "text": text, "text_nfc": unicodedata.normalize("NFC", text),
                      "split_pieces": pieces(text), "ids": ids, "ids_no_special": ids_plain,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    for name, parts in INVALID_UTF8:
        ids, ids_plain, raw = [], [], b""
        for part in parts:
            if isinstance(part, bytes):
                word = "".join(byte_char[b] for b in part)
                run = [t.id for t in tok.model.tokenize(word)]
                ids += run
                ids_plain += run
                raw += part
            else:
                a, b = encode_both(tok, part)
                ids += a
                ids_plain += b
                raw += part.encode("utf-8")
        try:
            raw.decode("utf-8")
            sys.exit(f"{name}: parts form valid UTF-8; not an invalid-input case")
        except UnicodeDecodeError:
            pass
        cases.append({"name": name, "text_hex": raw.hex(), "ids": ids, "ids_no_special": ids_plain})

    vocab = tok.get_vocab(with_added_tokens=True)
    special = {t for t in SPECIAL_TOKENS}
    token_bytes = {}
    for token, idx in sorted(vocab.items(), key=lambda item: item[1]):  # by id: reproducible file
        if all(c in char_byte for c in token) and token not in special and token not in NON_SPECIAL_TOKENS \
                and token != NORMALIZED_TOKEN:
            token_bytes[str(idx)] = bytes(char_byte[c] for c in token).hex()
        else:  # added tokens stand for their own UTF-8 text
            token_bytes[str(idx)] = token.encode("utf-8").hex()

    expected = {
        "tokenizers_version": tokenizers.__version__,
        "python_version": sys.version.split()[0],
        "split_regex": QWEN35_REGEX,
        "vocab_size": max(vocab.values()) + 1,
        "special_tokens": SPECIAL_TOKENS,
        "cases": cases,
        "token_bytes_hex": token_bytes,
    }
    write_expected(out / "expected.json", expected)
    print(f"wrote {out}/tokenizer.json ({len(vocab)} tokens) and expected.json ({len(cases)} cases), "
          f"tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
