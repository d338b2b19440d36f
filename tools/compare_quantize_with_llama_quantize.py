#!/usr/bin/env python3
"""`hanpu quantize --format F` against llama.cpp's llama-quantize, tensor by tensor (issue 34; not
part of the suite; needs the peer build).

For a float16 safetensors checkpoint (tools/make_random_qwen35_checkpoint.py) both quantize the
same float32 values: hanpu writes FORMAT directly; llama-quantize quantizes hanpu's f16 GGUF (which
equals llama.cpp's converter output, tests/python/test_gguf_export.py) without an importance
matrix. Every tensor must have the same type and the same bytes.

    tools/compare_quantize_with_llama_quantize.py CHECKPOINT_DIR [--formats q4_k_m,q8_0,q4_k,q6_k]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader

LLAMA_FTYPE = {"q4_k_m": ["Q4_K_M"], "q8_0": ["Q8_0"], "q4_k": ["--pure", "Q4_K_S"], "q6_k": ["--pure", "Q6_K"],
               "q5_k_m": ["Q5_K_M"], "q5_k": ["--pure", "Q5_K_S"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--formats", default="q4_k_m,q8_0,q4_k,q6_k")
    ap.add_argument("--hanpu", default="build/release/hanpu")
    ap.add_argument("--llama-bin", default=os.path.expanduser(
        "~/.cache/hanpu-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build-noamx/bin"))
    a = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.checkpoint))) as tmp:
        f16 = os.path.join(tmp, "f16.gguf")
        subprocess.run([a.hanpu, "quantize", "--model", a.checkpoint, "--out", f16, "--format", "f16"], check=True)
        for fmt in a.formats.split(","):
            mine, theirs = os.path.join(tmp, f"hanpu-{fmt}.gguf"), os.path.join(tmp, f"llama-{fmt}.gguf")
            subprocess.run([a.hanpu, "quantize", "--model", a.checkpoint, "--out", mine, "--format", fmt], check=True)
            args = LLAMA_FTYPE[fmt]
            subprocess.run([os.path.join(a.llama_bin, "llama-quantize")] + args[:-1] + [f16, theirs, args[-1], "2"],
                           check=True, capture_output=True)
            tm = {t.name: t for t in GGUFReader(mine).tensors}
            tt = {t.name: t for t in GGUFReader(theirs).tensors}
            differ = []
            if sorted(tm) != sorted(tt):
                differ.append(f"names: {sorted(set(tm) ^ set(tt))}")
            for name in sorted(set(tm) & set(tt)):
                x, y = tm[name], tt[name]
                if x.tensor_type != y.tensor_type:
                    differ.append(f"{name}: hanpu {x.tensor_type.name}, llama.cpp {y.tensor_type.name}")
                elif not np.array_equal(np.array(x.data).view(np.uint8).ravel(), np.array(y.data).view(np.uint8).ravel()):
                    differ.append(f"{name}: {x.tensor_type.name} bytes differ")
            types = {}
            for t in tm.values():
                types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
            print(f"{fmt:7s} {len(tm)} tensors {types}: " + ("all equal to llama-quantize" if not differ else f"{len(differ)} differ"))
            for d in differ[:10]:
                print("   ", d)
            bad += bool(differ)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
