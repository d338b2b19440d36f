#!/usr/bin/env python3
"""Convert one of the tiny golden checkpoints (tests/golden/*_tiny) to GGUF with llama.cpp's own
converter (convert_hf_to_gguf.py, with its conversion/ package and gguf-py), so that hanpu's GGUF
loader is tested against files written exactly as llama.cpp writes them.

Two things differ from running convert_hf_to_gguf.py by hand, both about the tiny checkpoints,
not about the weights:
  - their tokenizer is a small BPE trained for the test with Qwen's pre-tokenizer; llama.cpp
    recognizes pre-tokenizers by hashing a published model's output, so it does not know this
    one. It is declared here (--pre, default "qwen35") instead of being guessed.
  - their mtp.* tensors are a partial set (fc, norm) for the loader to skip; the converter is
    run with --no-mtp.

Usage (llama.cpp's sources: the peer build's vendor/llama.cpp, see docs/GGUF.md):
    python3 tools/convert_tiny_to_gguf.py --llama-cpp DIR tests/golden/qwen35_tiny OUT.gguf [--outtype f32|f16|bf16|q8_0]
"""

import argparse
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source directory (has convert_hf_to_gguf.py)")
    ap.add_argument("--pre", default="qwen35", help="llama.cpp pre-tokenizer name to write (tokenizer.ggml.pre)")
    ap.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    args = ap.parse_args()

    src = os.path.abspath(args.llama_cpp)
    if not os.path.isfile(os.path.join(src, "convert_hf_to_gguf.py")):
        sys.exit(f"--llama-cpp {src}: no convert_hf_to_gguf.py there")
    sys.path.insert(0, src)
    sys.path.insert(1, os.path.join(src, "gguf-py"))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's script, imported as a module)
    from conversion import base  # noqa: E402

    pre = args.pre
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = ["convert_hf_to_gguf.py", args.model_dir, "--no-mtp", "--outtype", args.outtype, "--outfile", args.out]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
