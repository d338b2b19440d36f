#!/usr/bin/env python3
"""Writes tests/data/kimi_tiktoken/: a small tiktoken BPE in Kimi Linear's format and the ids
tiktoken itself gives for a set of strings, for tests/test_tokenizer.cpp (KimiTiktoken tests).

Kimi Linear's checkpoints (moonshotai/Kimi-Linear-48B-A3B-Instruct) ship tiktoken.model (one
"<base64 of the token's bytes> <rank>" line per token), tokenizer_config.json (the special
tokens in added_tokens_decoder) and remote code tokenization_kimi.py, whose TikTokenTokenizer
builds tiktoken.Encoding(pat_str=<its pattern>, mergeable_ranks=<tiktoken.model>,
special_tokens={<256 + 2 ids after the ranks>}) and encodes with allowed_special="all" (or
disallowed_special=() when special tokens are to be read as text). The real 163,584-rank file
is not redistributable here (and there is no network), so this script trains a vocabulary of
the same shape on a synthetic multilingual corpus, deterministically:

  ranks 0..255    the single bytes, in byte order;
  ranks 256..     merges learned by byte-pair counting on the corpus (most frequent adjacent
                  pair first; ties by the pair's bytes), so the usual tiktoken merge paths occur;
  a few more      whole words and phrases that no merge produces (tiktoken encodes a piece that
                  is itself a token as that token without merging; these exercise that path);
  then 258 ids    the special tokens: the ones added_tokens_decoder names at the offsets Kimi
                  Linear uses ([BOS] +0, [EOS] +1, <|im_end|> +2, ... [PAD] +255), the others
                  "<|reserved_token_{id}|>" as tokenization_kimi.py names them.

The expected ids come from tiktoken itself (not from a re-implementation); hanpu's test needs
only the committed files. Run with the environment of tools/requirements-kimi-tokenizer.txt:

    python tools/make_kimi_tokenizer_golden.py
"""

import base64
import collections
import json
import pathlib
import platform
import random

import regex
import tiktoken

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "kimi_tiktoken"

# tokenization_kimi.py's TikTokenTokenizer.pat_str, as in the Kimi-Linear-48B-A3B-Instruct
# repository (the same in Kimi K2's): eight alternatives joined by "|".
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
NUM_RESERVED_SPECIAL_TOKENS = 256  # tokenization_kimi.py; it numbers 256 + 2 special ids
TARGET_MERGES = 3000

# Special tokens at their offsets from the first special id in Kimi Linear's
# tokenizer_config.json (163584 + offset there).
NAMED_SPECIALS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    17: "<|im_middle|>",
    255: "[PAD]",
}

ENGLISH = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their can has more when will would who so "
    "no if out into time only new some could them these may then do first any my now such like our "
    "over man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three model "
    "token tokenizer attention linear hybrid layer state decode prefill kernel matrix vector memory "
    "Kimi Moonshot Qwen hanpu tiktoken Python Rust C++ GPU NPU CPU HTTP JSON API"
).split()
CONTRACTIONS = ["don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "We'RE", "o'clock"]
HAN = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー"
HANGUL = "안녕하세요 세계 한국어 토큰 모델".split()
CYRILLIC = "привет мир модель токен слово Москва данные".split()
GREEK = "γειά σου κόσμε λόγος μοντέλο".split()
ARABIC = "مرحبا بالعالم نموذج كلمة".split()
DEVANAGARI = "नमस्ते दुनिया मॉडल".split()
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🤖"]
PUNCT = [".", ",", "!", "?", ";", ":", "...", "—", "(", ")", "\"", "'", "-", "/", "，", "。", "、", "：", "！", "？", "「", "」", "（", "）"]
CODE = [
    "def encode(self, text: str) -> list[int]:\n    return self.model.encode(text)\n",
    "for (int i = 0; i < n; ++i) {\n  out[i] = a[i] * b[i];\n}\n",
    "{\"role\": \"user\", \"content\": \"hello\"}\n",
    "if x == 0:\n\treturn None\n",
    "std::vector<int32_t> ids;\n",
]


def corpus(rng: random.Random) -> str:
    parts = []
    for _ in range(6000):
        kind = rng.random()
        if kind < 0.45:
            words = [rng.choice(ENGLISH) for _ in range(rng.randint(3, 12))]
            if rng.random() < 0.2:
                words.insert(rng.randrange(len(words) + 1), rng.choice(CONTRACTIONS))
            s = " ".join(words)
            parts.append((s[0].upper() + s[1:]) + rng.choice([".", ",", "!", "?", ""]))
        elif kind < 0.65:
            parts.append("".join(rng.choice(HAN) for _ in range(rng.randint(2, 8))) + rng.choice(["，", "。", "、", ""]))
        elif kind < 0.72:
            parts.append("".join(rng.choice(KANA) for _ in range(rng.randint(2, 6))))
        elif kind < 0.80:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))) + rng.choice(["", "%", ".5", " km", ",000"]))
        elif kind < 0.86:
            parts.append(rng.choice(CODE))
        elif kind < 0.93:
            parts.append(" ".join(rng.choice(rng.choice([HANGUL, CYRILLIC, GREEK, ARABIC, DEVANAGARI])) for _ in range(3)))
        else:
            parts.append(rng.choice(EMOJI) + rng.choice(PUNCT))
        parts.append(rng.choice([" ", " ", " ", "\n", "\n\n", "  ", "\t"]))
    return "".join(parts)


def pre_tokens(text: str) -> list[bytes]:
    # Training only needs a plausible split; the `regex` module reads class intersections
    # ("&&") in its VERSION1 mode. The golden ids below come from tiktoken, not from this.
    return [m.group(0).encode("utf-8") for m in regex.finditer(KIMI_PAT_STR, text, flags=regex.VERSION1)]


def train(words: collections.Counter, merges: int) -> list[bytes]:
    """Byte-pair merges by frequency: returns the new tokens in rank order."""
    seqs = {w: [bytes([b]) for b in w] for w in words}
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)  # pair -> words containing it
    for w, seq in seqs.items():
        for a, b in zip(seq, seq[1:]):
            pair_counts[(a, b)] += words[w]
            where[(a, b)].add(w)
    learned = []
    for _ in range(merges):
        if not pair_counts:
            break
        best = min(pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        (a, b), _ = best
        merged = a + b
        learned.append(merged)
        for w in list(where[(a, b)]):
            seq = seqs[w]
            for x, y in zip(seq, seq[1:]):  # remove this word's old pairs
                pair_counts[(x, y)] -= words[w]
                if pair_counts[(x, y)] <= 0:
                    del pair_counts[(x, y)]
                where[(x, y)].discard(w)
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
            for x, y in zip(out, out[1:]):
                pair_counts[(x, y)] += words[w]
                where[(x, y)].add(w)
    return learned


# Tokens no merge path is meant to reach: tiktoken takes a piece that is itself a token as that
# token before merging. Some are single pre-tokens of the golden strings below.
WHOLE_TOKENS = [" tokenizer", " Moonshot", "人工智能", "東京都", " antidisestablishment", "123", "\n\n\n", "😀😀"]

CASES = [
    ("empty", ""),
    ("ascii", "Hello, world! This is a test of the tokenizer."),
    ("contractions", "I'm sure it's fine; they've said we're done, you'll see, he'd know. DON'T SHOUT: IT'S LOUD."),
    ("contraction long s", "it\u017fs it'\u017f IT'\u017f"),
    ("numbers", "1 12 123 1234 12345 123456 1234567 12345678901234567890 3.14159 1,000,000 0x1F -42"),
    ("other numbers", "٣٤٥ ١٢٣٤ ½ ² Ⅻ ①②③ 一二三 〇"),
    ("han", "你好世界。人工智能是计算机科学的一个分支，东京都の天気は晴れです。"),
    ("han with punctuation", "你好、世界！「引用」（括号）：冒号"),
    ("han iteration mark", "人々 時々 我々"),
    ("mixed scripts", "中文English混合Text和数字123结合；日本語のテキストとEnglish。"),
    ("han adjacent latin", "汉字abc北京市 Pascal上海Shanghai"),
    ("korean cyrillic greek", "안녕하세요 세계! Привет, мир! Γειά σου Κόσμε."),
    ("arabic devanagari", "مرحبا بالعالم. नमस्ते दुनिया।"),
    ("emoji", "😀 🚀🚀 👍🏽 👨‍👩‍👧 🇯🇵 ❤️ 🤖😀😀"),
    ("whitespace runs", "a  b   c    d\t\te \u00a0f\u3000g\u2003h   "),
    ("newlines", "line one\nline two\r\nline three\n\n\nend\n  \n\t\n"),
    ("leading and trailing space", "   spaced out   "),
    ("code", "def f(x):\n    return x ** 2  # square\n\nfor i in range(10):\n\tprint(f(i))\n"),
    ("json", "{\"role\": \"user\", \"content\": \"Hi!\", \"n\": [1, 22, 333]}"),
    ("camel and caps", "CamelCaseWords HTTPServer getHTTPResponseCode XMLHttpRequest ALLCAPS MiXeD"),
    ("accents and marks", "café naïve Zürich Ångström e\u0301le\u0300ve n\u0303"),
    ("symbols", "$100 €50 £3 ¥1000 © ® ™ → ← ≠ ≤ ≥ ∞ ∑ √ @user #tag 50% a&b <tag>"),
    ("special tokens", "[BOS]<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>你好<|im_end|><|im_assistant|>assistant<|im_middle|>"),
    ("special inside words", "abc[EOS]def<|im_end|>ghi [PAD] x<|im_middle|>y"),
    ("reserved special", "<|reserved_token_4005|> and <|reserved_token_9999|>"),
    ("almost special", "<|im_end| [BOS <|im_mid|> [bos]"),
    ("whole tokens", "the tokenizer of Moonshot: 人工智能 and 東京都 antidisestablishment 123\n\n\n😀😀"),
    ("long word", "pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious"),
    ("long number", "3141592653589793238462643383279502884197169399375105820974944592307816406286"),
    ("long han", "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同"),
    ("repeated pairs", "aaaaaaa aaaa hahahaha ======== ---- 1111111 \u4e00\u4e00\u4e00\u4e00\u4e00 \U0001F600\U0001F600\U0001F600"),
    ("control characters", "a\u0000b\u0007c\u001bd\u007fe\u0085f"),
    ("rare planes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀀𠀁 𝟙𝟚𝟛"),
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r\u00a0\u3000",
    ".,;:!?'\"()[]{}<>-_/\\@#$%^&*+=|~`",
    "'sStTrReEvVmMlLdD",
    HAN[:80],
    KANA[:40],
    "、。，！？「」",
    "éèñüöçåøß\u0301\u0308",
    "привет мир",
    "😀🚀👍🏽❤️",
    "٣٤١½²Ⅻ",
]
SPECIAL_SNIPPETS = ["<|im_end|>", "[BOS]", "<|im_middle|>", "<|im_user|>", "[EOS]"]


def random_cases(rng: random.Random, count: int) -> list[tuple[str, str]]:
    out = []
    for k in range(count):
        chars = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.04:
                chars.append(rng.choice(SPECIAL_SNIPPETS))
            else:
                chars.append(rng.choice(rng.choice(POOLS)))
        out.append((f"random {k}", "".join(chars)))
    return out


def main():
    rng = random.Random(20261201)
    text = corpus(rng)
    words = collections.Counter(pre_tokens(text))
    learned = train(words, TARGET_MERGES)
    tokens = [bytes([b]) for b in range(256)] + learned
    seen = set(tokens)
    for w in WHOLE_TOKENS:
        wb = w.encode("utf-8")
        if wb not in seen:
            tokens.append(wb)
            seen.add(wb)
    mergeable_ranks = {t: r for r, t in enumerate(tokens)}
    n = len(tokens)
    names = {n + off: name for off, name in NAMED_SPECIALS.items()}
    special_tokens = {
        names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + NUM_RESERVED_SPECIAL_TOKENS + 2)
    }
    # No special token is a prefix of another, so tiktoken's search (an alternation in hash-map
    # order) and hanpu's (leftmost-longest) find the same ones.
    for a in special_tokens:
        for b in special_tokens:
            assert a == b or not b.startswith(a), (a, b)

    enc = tiktoken.Encoding(
        name="kimi-golden", pat_str=KIMI_PAT_STR, mergeable_ranks=mergeable_ranks, special_tokens=special_tokens
    )

    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "tiktoken.model", "w", encoding="ascii", newline="\n") as f:
        for t, r in mergeable_ranks.items():
            f.write(f"{base64.b64encode(t).decode('ascii')} {r}\n")
    config = {
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
            for i, c in sorted(names.items())
        },
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }
    with open(OUT / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")

    cases = []
    for name, s in CASES + random_cases(rng, 300):
        ids = enc.encode(s, allowed_special="all")
        ids_plain = enc.encode(s, disallowed_special=())
        assert enc.decode_bytes(ids) == s.encode("utf-8")
        cases.append({"name": name, "text": s, "ids": ids, "ids_specials_as_text": ids_plain})
    golden = {
        "generator": "tools/make_kimi_tokenizer_golden.py",
        "tiktoken_version": tiktoken.__version__,
        "python_version": platform.python_version(),
        "pat_str": KIMI_PAT_STR,
        "base_tokens": n,
        "special_tokens": len(special_tokens),
        "bos_token_id": special_tokens["[BOS]"],
        "eos_token_id": special_tokens["<|im_end|>"],
        "cases": cases,
    }
    with open(OUT / "expected.json", "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{n} ranks ({len(learned)} merges), {len(special_tokens)} special tokens, {len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main()
