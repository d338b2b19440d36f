#!/usr/bin/env python3
"""Compares hanpu's GGML quantizers with llama.cpp's, byte for byte (issue 34; not part of the suite).

llama-quantize without an importance matrix quantizes each tensor with ggml's quantize_row_*_ref
(ggml_quantize_chunk with imatrix = NULL). This script compiles a few lines of C against the peer
build's public ggml.h / libggml-base (llama.cpp built by the peer scripts, default
~/.cache/hanpu-peers), runs ggml_quantize_chunk and hanpu's tests/gguf_blocks_tool on the same
float32 inputs, and reports the first differing block of each case.

    tools/compare_quantizers_with_ggml.py [--tool build/release/tests/gguf_blocks_tool]
        [--llama-dir ~/.cache/hanpu-peers/llama_cpp_python-0.3.36/vendor/llama.cpp] [--build build-noamx]

Cases: Gaussian rows, rows with outliers, all-positive and all-negative blocks, all-zero blocks,
a single non-zero element per block, tiny (f16-subnormal scales) and large magnitudes, constant
blocks, and values that are already on a quantization grid.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

GGML_TYPES = {"Q8_0": (8, 32, 34), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
              "Q6_K": (14, 256, 210)}

C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
int main(int argc, char **argv) {
  if (argc != 5) return 2;
  int type = atoi(argv[1]); long n_per_row = atol(argv[2]);
  FILE *f = fopen(argv[3], "rb"); fseek(f, 0, SEEK_END); long bytes = ftell(f); fseek(f, 0, SEEK_SET);
  float *x = malloc(bytes); if (fread(x, 1, bytes, f) != (size_t)bytes) return 3; fclose(f);
  long n = bytes / 4, rows = n / n_per_row;
  size_t out_bytes = ggml_row_size(type, n_per_row) * rows;
  void *y = malloc(out_bytes);
  size_t got = ggml_quantize_chunk(type, x, y, 0, rows, n_per_row, NULL);
  if (got != out_bytes) return 4;
  f = fopen(argv[4], "wb"); fwrite(y, 1, out_bytes, f); fclose(f);
  return 0;
}
"""


def cases(block, rng):
    n = block * 64
    g = rng.standard_normal(n).astype(np.float32)
    yield "gaussian", g * 0.02
    o = g.copy()
    o[rng.integers(0, n, n // 50)] *= 40
    yield "outliers", o
    yield "all positive", np.abs(g) + 0.5
    yield "all negative", -np.abs(g) - 0.5
    z = g.copy()
    z[: n // 2] = 0
    yield "half all-zero blocks", z
    s = np.zeros(n, np.float32)
    s[:: block // 2 + 3] = rng.standard_normal(len(s[:: block // 2 + 3]))
    yield "sparse", s
    yield "tiny (subnormal f16 scales)", g * 1e-6
    yield "large", g * 3e3
    yield "constant", np.full(n, 0.37, np.float32)
    grid = (rng.integers(-8, 8, n) * 0.125).astype(np.float32)
    yield "on a grid", grid
    yield "uniform", rng.uniform(-1, 1, n).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default="build/release/tests/gguf_blocks_tool")
    ap.add_argument("--llama-dir", default=os.path.expanduser(
        "~/.cache/hanpu-peers/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    ap.add_argument("--build", default="build-noamx")
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--write-fixture", metavar="DIR",
                    help="also write DIR/ggml_k_quants.{f32,q4_k,q5_k,q6_k}: 4 blocks of each input kind and ggml's "
                         "bytes for them (tests/test_gguf_quantize.cpp compares against these without the peer)")
    a = ap.parse_args()
    libdir = os.path.join(a.llama_dir, a.build, "bin")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "q.c")
        exe = os.path.join(tmp, "ggml_quantize")
        with open(src, "w") as f:
            f.write(C_SOURCE)
        subprocess.run(["cc", "-O2", src, "-I", os.path.join(a.llama_dir, "ggml", "include"), "-L", libdir,
                        "-lggml-base", "-lggml", f"-Wl,-rpath,{libdir}", "-o", exe], check=True)
        rng = np.random.default_rng(a.seed)
        for name, (code, block, bytes_per_block) in GGML_TYPES.items():
            for case, x in cases(block, rng):
                inp, ref, got = (os.path.join(tmp, p) for p in ("x.f32", "ref.bin", "got.bin"))
                x.astype(np.float32).tofile(inp)
                subprocess.run([exe, str(code), str(block * 4), inp, ref], check=True)
                subprocess.run([a.tool, "quantize", name, inp, got], check=True)
                r = np.fromfile(ref, np.uint8).reshape(-1, bytes_per_block)
                h = np.fromfile(got, np.uint8).reshape(-1, bytes_per_block)
                diff = np.nonzero((r != h).any(axis=1))[0]
                status = "equal" if len(diff) == 0 else f"{len(diff)} of {len(r)} blocks differ (first: {diff[0]})"
                failures += len(diff) > 0
                print(f"{name:5s} {case:30s} {len(r):4d} blocks: {status}")
        if a.write_fixture:
            fixture_rng = np.random.default_rng(a.seed)
            x = np.concatenate([c[: 256 * 4] for _, c in cases(256, fixture_rng)]).astype(np.float32)
            base = os.path.join(a.write_fixture, "ggml_k_quants")
            x.tofile(base + ".f32")
            for name in ("Q4_K", "Q5_K", "Q6_K"):
                subprocess.run([exe, str(GGML_TYPES[name][0]), "256", base + ".f32", base + "." + name.lower()], check=True)
            print("wrote", base + ".{f32,q4_k,q5_k,q6_k}", len(x) // 256, "blocks")
    print("all equal" if failures == 0 else f"{failures} case(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
