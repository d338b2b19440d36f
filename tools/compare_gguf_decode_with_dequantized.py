#!/usr/bin/env python3
"""Decode-path logits of a quantized GGUF file against the same weights dequantized to F32.

Writes (once, with gguf-py) an F32 copy of FILE with every quantized tensor dequantized, then runs
`hanpu run --prompt-ids P -n 0 --logits-out` for each prompt of 3 tokens (M = 3 rows: below
GgufLinear's prefill threshold of 4, so every projection runs the decode GEMV) with each hanpu
binary given, and the F32 copy with the first one (the f32 path: the weights' own values with f32
activations). Prints the NMSE of each binary's logits against the F32 copy's, per position and
mean / median / worst. Used for the Q4_K min-term change (docs/GGUF.md, "Decode GEMV").

  tools/compare_gguf_decode_with_dequantized.py --model F.gguf --work DIR --hanpu A/hanpu [--hanpu B/hanpu]
"""
import argparse
import json
import os
import struct
import subprocess

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter

PROMPTS = ["1000,2000,3000", "17,52000,9", "123456,77,4242", "200000,31,888"]


def dequantized_copy(src, dst):
    r = GGUFReader(src)
    arch = r.fields["general.architecture"]
    w = GGUFWriter(dst, bytes(arch.parts[arch.data[0]]).decode())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            et = f.types[1]
            if et == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                val = [f.parts[i][0].item() for i in f.data]
            w.add_key_value(name, val, t, sub_type=et)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode("utf-8", errors="surrogateescape"), t)
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), t)
    for t in r.tensors:
        if t.tensor_type in (Q.F32, Q.F16, Q.BF16):
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_logits(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    k = next(k for k in h if k != "__metadata__")
    o = h[k]["data_offsets"]
    return np.frombuffer(b[8 + n + o[0]:8 + n + o[1]], dtype=np.float32).reshape(-1, h[k]["shape"][-1]).astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--hanpu", action="append", required=True)
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    ref_model = os.path.join(a.work, "dequantized-f32.gguf")
    if not os.path.exists(ref_model):
        dequantized_copy(a.model, ref_model)

    def run(binary, model, prompt, out):
        subprocess.run([binary, "run", "--model", model, "--prompt-ids", prompt, "-n", "0", "--threads", a.threads,
                        "--logits-out", out], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return load_logits(out)

    errs = {b: [] for b in a.hanpu}
    for p in PROMPTS:
        ref = run(a.hanpu[0], ref_model, p, os.path.join(a.work, "ref.safetensors"))
        for b in a.hanpu:
            got = run(b, a.model, p, os.path.join(a.work, "got.safetensors"))
            errs[b] += [float(((g - r) ** 2).sum() / (r ** 2).sum()) for g, r in zip(got, ref)]
    for b, e in errs.items():
        e = np.array(e)
        print(f"{b}: {len(e)} positions, NMSE vs the F32 copy mean {e.mean():.3g}, median {np.median(e):.3g}, "
              f"worst {e.max():.3g}; per position {' '.join(f'{v:.3g}' for v in e)}")


if __name__ == "__main__":
    main()
