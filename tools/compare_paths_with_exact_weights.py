#!/usr/bin/env python3
"""Prefill and decode paths of hanpu and llama.cpp against the file's exact weights (not part of the
test suite: it needs a llama.cpp build; docs/GGUF.md, "Logits against llama.cpp on the same file").

For each quantized GGUF FILE and N random token ids (numpy seed 0), the logits at every position of:
hanpu's f32 tiles (`HANPU_GGUF_PREFILL=f32`: the exactly dequantized weights, f32 activations: the
reference), hanpu's default prefill (one whole-sequence forward), hanpu's decode path (`hanpu run
--logits-per-token`), llama.cpp's batch and step paths (tools/llama_logits, f32 K/V cache). Prints
each path's NMSE per position against the reference (median / worst) and how many positions keep
its argmax, and the two programs' like paths against each other. Files without a tokenizer get
llama.cpp's `no_vocab` overrides, as in compare_logits_with_llama_cpp.py (whose build_tool it uses).

  python3 tools/compare_paths_with_exact_weights.py --llama-cpp DIR [--tokens 64] FILE.gguf ...
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_logits_with_llama_cpp import REPO, build_tool, describe  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--build-subdir", default="build-noamx")
    ap.add_argument("--hanpu", default=os.path.join(REPO, "build", "release", "hanpu"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    exe = build_tool(args.llama_cpp, args.build_subdir)
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.files:
            arch, vocab, has_tok, _ = describe(path)
            ids = ",".join(str(int(x)) for x in np.random.default_rng(0).integers(0, vocab, size=args.tokens))

            def hanpu(step, env=None):
                out = os.path.join(tmp, "hanpu.safetensors")
                subprocess.run(["nice", "-n", "10", args.hanpu, "run", "--model", path, "--prompt-ids", ids, "-n", "0",
                                "--threads", str(args.threads), "--logits-out", out] + (["--logits-per-token"] if step else []),
                               env=dict(os.environ, **(env or {})), check=True, capture_output=True)
                return load_file(out)["logits"].astype(np.float64)

            def llama(step):
                out = os.path.join(tmp, "llama.npy")
                cmd = ["nice", "-n", "10", exe, path, ids, out, "--threads", str(args.threads), "--cache-type", "f32"]
                if not has_tok:
                    cmd += ["--override-kv", "tokenizer.ggml.model=str:no_vocab", "--override-kv", f"{arch}.vocab_size=int:{vocab}"]
                subprocess.run(cmd + (["--step"] if step else []), check=True, capture_output=True)
                return np.load(out).astype(np.float64)

            def row(x, y):
                n = ((x - y) ** 2).sum(1) / (y ** 2).sum(1)
                return f"{np.median(n):.2e} / {n.max():.2e}, argmax {(x.argmax(1) == y.argmax(1)).sum()}/{len(n)}"

            exact = hanpu(False, {"HANPU_GGUF_PREFILL": "f32"})
            paths = {"hanpu prefill (default)": hanpu(False), "hanpu decode": hanpu(True),
                     "llama.cpp batch": llama(False), "llama.cpp step": llama(True)}
            print(os.path.basename(path))
            for name, x in paths.items():
                print(f"  {name:24s} vs exact weights: {row(x, exact)}")
            print(f"  hanpu decode vs llama.cpp step: {row(paths['hanpu decode'], paths['llama.cpp step'])}")
            print(f"  hanpu prefill vs llama.cpp batch: {row(paths['hanpu prefill (default)'], paths['llama.cpp batch'])}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
