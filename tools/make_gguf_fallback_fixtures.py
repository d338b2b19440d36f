#!/usr/bin/env python3
"""GGUF fixtures with llama-quantize's 32-element block types, for tests/test_gguf_model.cpp
(GgufSmallBlocks): llama.cpp's own llama-quantize run on tests/data/gguf/qwen35_tiny-f16.gguf.

The tiny golden's rows are 64, 96 or 128 wide, never whole 256-element super-blocks, so
llama-quantize falls back on every K-quant and IQ4_XS tensor (src/llama-quant.cpp, the "fallback
quantization" for ncols % QK_K != 0: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL),
which is what a user's Q4_K_M / Q5_K_M / IQ4_XS of a model with such rows contains. Writes into tests/data/gguf/:
  qwen35_tiny-q4_k_m.gguf   Q4_K_M: Q5_0 and Q8_0 (plus F32 norms)
  qwen35_tiny-q5_k_m.gguf   Q5_K_M: Q5_1 and Q8_0
  qwen35_tiny-q4_0.gguf     Q4_0 (and Q8_0 where llama-quantize keeps Q6_K's fallback)
  qwen35_tiny-q4_1.gguf     Q4_1
  qwen35_tiny-iq4_xs.gguf   IQ4_XS: every IQ4_XS tensor falls back to IQ4_NL (and Q8_0 for the head)
  llama_quantize_digests.json   for each tiny golden's F16 fixture (qwen35, qwen35moe, qwen3next,
                            kimi-linear, bailingmoe3) and Q4_K_M / Q5_K_M: every tensor's type and
                            the SHA-256 of its bytes in llama-quantize's file (tests/python/
                            test_gguf_export_arch.py holds `hanpu quantize --format` to them; the
                            files themselves would be 1.2 MB)

Usage: python3 tools/make_gguf_fallback_fixtures.py --llama-quantize PATH [--out tests/data/gguf]
(PATH: the peer build's llama-quantize, e.g. vendor/llama.cpp/build-noamx/bin/llama-quantize.)
"""

import argparse
import hashlib
import json
import os
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ("Q4_K_M", "Q5_K_M", "Q4_0", "Q4_1", "IQ4_XS")
DIGEST_GOLDENS = ("qwen35_tiny", "qwen35moe_tiny", "qwen3next_tiny", "kimi_linear_tiny", "bailing_hybrid_tiny")
DIGEST_TYPES = ("Q4_K_M", "Q5_K_M")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-quantize", required=True)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "gguf"))
    args = ap.parse_args()
    src = os.path.join(REPO, "tests", "data", "gguf", "qwen35_tiny-f16.gguf")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(os.path.abspath(args.llama_quantize)) + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    for t in TYPES:
        dst = os.path.join(args.out, f"qwen35_tiny-{t.lower()}.gguf")
        subprocess.run([args.llama_quantize, src, dst, t, "1"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        print("wrote", dst)
    from gguf import GGUFReader  # PyPI gguf (python/requirements-test.txt)
    digests = {}
    with tempfile.TemporaryDirectory() as tmp:
        for g in DIGEST_GOLDENS:
            for t in DIGEST_TYPES:
                dst = os.path.join(tmp, f"{g}-{t}.gguf")
                subprocess.run([args.llama_quantize, os.path.join(REPO, "tests", "data", "gguf", f"{g}-f16.gguf"), dst,
                                t, "1"], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                digests.setdefault(g, {})[t.lower()] = {
                    x.name: [x.tensor_type.name, hashlib.sha256(bytes(x.data.view("uint8").reshape(-1))).hexdigest()]
                    for x in GGUFReader(dst).tensors}
    dst = os.path.join(args.out, "llama_quantize_digests.json")
    with open(dst, "w") as f:
        json.dump(digests, f, indent=1, sort_keys=True)
    print("wrote", dst)


if __name__ == "__main__":
    main()
