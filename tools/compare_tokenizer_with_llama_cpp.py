#!/usr/bin/env python3
"""hanpu's GGUF tokenizer against llama.cpp's on the same file (outside the suite; issue 34).

    tools/compare_tokenizer_with_llama_cpp.py --llama-tokenize build/llama_tokenize \\
        [--expected tests/data/ling_tokenizer/expected.json] FILE.gguf

Tokenizes texts with `hanpu tokenize --tokenizer FILE.gguf --ids` and with llama.cpp
(tools/llama_logits/llama_tokenize.cpp, built by tools/llama_logits/build.sh against the peer's
libllama, vocabulary-only load), special tokens parsed and read as text, and prints per text
whether the ids agree; with --expected, also against the reference ids of a golden file
(tests/data/*/expected.json: "ids" and "ids_no_special" or "ids_specials_as_text"). The texts:
the golden's cases when given, else a built-in list (CJK, digit runs, contractions, whitespace
runs, emoji). Exit status 0 whatever the outcome: this reports, it does not judge.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [
    "你好，世界！今天天气很好。", "1234567890 3.14159 1,000,000",
    "I'm sure they'll say we've DONE it, it's John's; I'D've",
    "spaces    and\ttabs\t\t\nnewlines\n\n\n   \n", "emoji 👍🏽 👨‍👩‍👧 🇯🇵 ❤️", "mixed Ünïcödé café naïve",
]


def hanpu_ids(hanpu, model, text, plain):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:  # --file: any text, NULs too
        f.write(text.encode("utf-8"))
    args = [hanpu, "tokenize", "--tokenizer", model, "--ids", "--file", f.name] + (["--no-special"] if plain else [])
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
    finally:
        os.unlink(f.name)
    return [int(x) for x in out.split(",")] if out else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--llama-tokenize", required=True, help="tools/llama_logits/llama_tokenize built by build.sh")
    ap.add_argument("--hanpu", default=os.path.join(ROOT, "build", "release", "hanpu"))
    ap.add_argument("--expected", help="a golden expected.json whose cases give the texts and reference ids")
    ap.add_argument("--limit", type=int, default=0, help="only the first N texts")
    args = ap.parse_args()
    cases = []
    if args.expected:
        with open(args.expected, encoding="utf-8") as f:
            for c in json.load(f)["cases"]:
                if "text" in c:
                    plain = c.get("ids_no_special", c.get("ids_specials_as_text"))
                    cases.append((c["name"], c["text"], c["ids"], plain))
    else:
        cases = [(f"text_{i}", t, None, None) for i, t in enumerate(TEXTS)]
    if args.limit:
        cases = cases[:args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        texts = os.path.join(tmp, "texts.txt")
        with open(texts, "w") as f:
            for _, text, _, _ in cases:
                f.write(text.encode("utf-8").hex() + "\n")
        out = os.path.join(tmp, "ids.txt")
        subprocess.run([args.llama_tokenize, args.model, texts, out], check=True, capture_output=True)
        with open(out) as f:
            llama = [[[int(x) for x in part.split(",")] if part else [] for part in line.rstrip("\n").split(";")]
                     for line in f]
    agree = {"special": 0, "plain": 0}
    ref_agree = {"hanpu": 0, "llama.cpp": 0}
    for (name, text, ref, ref_plain), (l_special, l_plain) in zip(cases, llama):
        h_special, h_plain = hanpu_ids(args.hanpu, args.model, text, False), hanpu_ids(args.hanpu, args.model, text, True)
        agree["special"] += h_special == l_special
        agree["plain"] += h_plain == l_plain
        if ref is not None:
            ref_agree["hanpu"] += h_special == ref and h_plain == ref_plain
            ref_agree["llama.cpp"] += l_special == ref and l_plain == ref_plain
        if h_special != l_special or h_plain != l_plain:
            print(f"{name}: {json.dumps(text, ensure_ascii=False)[:80]}")
            if h_special != l_special:
                print(f"  specials parsed: hanpu {h_special[:16]} llama.cpp {l_special[:16]}" +
                      ("" if ref is None else f" reference {ref[:16]}"))
            if h_plain != l_plain:
                print(f"  as text:         hanpu {h_plain[:16]} llama.cpp {l_plain[:16]}" +
                      ("" if ref_plain is None else f" reference {ref_plain[:16]}"))
    n = len(cases)
    print(f"{args.model}: {n} texts; hanpu = llama.cpp with specials parsed {agree['special']}/{n}, "
          f"as text {agree['plain']}/{n}")
    if args.expected:
        print(f"  = reference ids (both ways): hanpu {ref_agree['hanpu']}/{n}, llama.cpp {ref_agree['llama.cpp']}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
