#!/usr/bin/env python3
"""hanpu's logits against llama.cpp's on the same GGUF file and token ids (not part of the test
suite: it needs a llama.cpp build).

For each FILE: llama.cpp's logits at every prompt position come from tools/llama_logits (a few
lines against libllama's public API, compiled by tools/llama_logits/build.sh against the given
llama.cpp tree on first use), hanpu's from `hanpu run --model FILE --prompt-ids IDS --logits-out`
(one whole-sequence forward: hanpu's prefill path). Per position: NMSE = sum((h - l)^2) / sum(l^2)
over the vocabulary, and whether the argmax (the greedy token) agrees. Prints one row per file:
worst / median NMSE, greedy agreement, and the positions that disagree with both top-2 margins.

  python3 tools/compare_logits_with_llama_cpp.py --llama-cpp DIR [--hanpu EXE] \
      [--ids 1,2,3 | --ids-from GOLDEN/expected.safetensors | --random-ids N] \
      [--quantize TYPE] [--llama-step] [--hanpu-step] [--cache-type f16|f32] [--threads 2] [--json OUT] FILE.gguf ...

DIR: llama.cpp's sources with include/ and a build (default subdir build-noamx, --build-subdir) whose
bin/ has libllama.so and llama-quantize. --ids-from: the golden's prompt_ids followed by its
greedy_ids (the tiny goldens' 85 positions). --quantize TYPE: first run llama-quantize FILE -> TYPE
(e.g. Q4_K_M, Q8_0) into a temporary directory and compare on that file; tensors whose rows are not
whole 256-blocks get llama.cpp's fallback types (the tool prints the types the file ended up with).
--llama-dequantized: llama.cpp gets the file with its tensors dequantized to F32 (same weight values,
no activation quantization), hanpu the file itself: what is left is hanpu's own error.
--llama-step: llama.cpp evaluates one token per llama_decode (its decode path) instead of the
whole prompt in one batch. --hanpu-step: the same for hanpu (`hanpu run --logits-per-token`); both
together compare the two decode paths. A file without a tokenizer (`tokenizer.ggml.model` absent, as the tiny
arch fixtures) is given llama.cpp overrides `tokenizer.ggml.model=no_vocab` and
`<arch>.vocab_size` (the embedding's rows); hanpu needs no tokenizer for token ids.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama_quantize(bin_dir, src, dst, qtype):
    """llama-quantize SRC DST TYPE (--allow-requantize: a quantized SRC is dequantized first); None or the error."""
    q = subprocess.run(["nice", "-n", "19", os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", src, dst, qtype],
                       capture_output=True, text=True)
    return None if q.returncode == 0 else q.stderr.strip()[-400:]


def build_tool(llama_cpp, subdir):
    exe = os.path.join(REPO, "build", "llama_logits")
    src = os.path.join(REPO, "tools", "llama_logits", "llama_logits.cpp")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run(["bash", os.path.join(REPO, "tools", "llama_logits", "build.sh"), llama_cpp, subdir, exe],
                       check=True, stdout=subprocess.DEVNULL)
    return exe


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def describe(path):
    """architecture, vocabulary rows, has-tokenizer, tensor type histogram"""
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    embd = next((t for t in r.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        sys.exit(f"{path}: no token_embd.weight")
    vocab = int(embd.shape[1])  # gguf-py's shape is ggml's ne: [n_embd, n_vocab]
    types = collections.Counter(t.tensor_type.name for t in r.tensors)
    return arch, vocab, field(r, "tokenizer.ggml.model") is not None, dict(sorted(types.items()))


def token_ids(args, vocab):
    if args.ids:
        return [int(x) for x in args.ids.split(",")]
    if args.ids_from:
        from safetensors.numpy import load_file
        d = load_file(args.ids_from)
        return [int(x) for x in np.concatenate([d["prompt_ids"], d.get("greedy_ids", np.zeros(0, np.int64))])]
    rng = np.random.default_rng(args.seed)
    return [int(x) for x in rng.integers(0, vocab, size=args.random_ids)]


def llama_logits(exe, path, ids, args, arch, vocab, has_tok, out):
    cmd = [exe, path, ",".join(map(str, ids)), out, "--threads", str(args.threads), "--cache-type", args.cache_type,
           "--flash-attn", args.flash_attn]
    if args.llama_step:
        cmd.append("--step")
    if not has_tok:
        cmd += ["--override-kv", "tokenizer.ggml.model=str:no_vocab", "--override-kv", f"{arch}.vocab_size=int:{vocab}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        # llama.cpp's own words: the line that says why it refused
        lines = [l for l in p.stderr.splitlines() if "error" in l.lower() or "llama_logits:" in l]
        return None, "; ".join(lines[:2]) or p.stderr.strip()[-400:]
    return np.load(out), None


def hanpu_logits(hanpu, path, ids, args, out):
    cmd = ["nice", "-n", "19", hanpu, "run", "--model", path, "--prompt-ids", ",".join(map(str, ids)), "-n", "0",
           "--threads", str(args.threads), "--logits-out", out] + (["--logits-per-token"] if args.hanpu_step else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()[-400:]
    from safetensors.numpy import load_file
    return load_file(out)["logits"].astype(np.float32), None


def compare(h, l):
    h64, l64 = h.astype(np.float64), l.astype(np.float64)
    nmse = ((h64 - l64) ** 2).sum(axis=1) / (l64 ** 2).sum(axis=1)
    ah, al = h.argmax(axis=1), l.argmax(axis=1)
    disagree = []
    for i in np.nonzero(ah != al)[0]:
        top_l = np.sort(l64[i])[-2:]
        top_h = np.sort(h64[i])[-2:]
        disagree.append({"position": int(i), "hanpu": int(ah[i]), "llama": int(al[i]),
                         "llama_top2_margin": float(top_l[1] - top_l[0]), "hanpu_top2_margin": float(top_h[1] - top_h[0])})
    return {"nmse": [float(x) for x in nmse], "positions": int(len(nmse)), "nmse_worst": float(nmse.max()), "nmse_median": float(np.median(nmse)),
            "worst_position": int(nmse.argmax()), "greedy_agree": int((ah == al).sum()), "disagree": disagree,
            "max_abs_diff": float(np.abs(h64 - l64).max()), "logit_range": float(np.abs(l64).max())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--build-subdir", default="build-noamx")
    ap.add_argument("--hanpu", default=os.path.join(REPO, "build", "release", "hanpu"))
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ids")
    g.add_argument("--ids-from")
    g.add_argument("--random-ids", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quantize", help="llama-quantize type to make from each FILE first (Q8_0, Q4_K_M, F32, ...)")
    ap.add_argument("--llama-step", action="store_true")
    ap.add_argument("--hanpu-step", action="store_true",
                    help="hanpu runs the prompt one token per forward (`hanpu run --logits-per-token`: its decode path, "
                         "e.g. the GGUF GEMVs on int8 activations) instead of one whole-sequence forward")
    ap.add_argument("--llama-dequantized", action="store_true",
                    help="llama.cpp runs a copy of the file with every tensor dequantized to F32 (llama-quantize "
                         "--allow-requantize FILE F32: the same weight values, f32 activations), hanpu the file itself")
    ap.add_argument("--cache-type", default="f16", choices=["f16", "f32"])
    ap.add_argument("--flash-attn", default="auto", choices=["auto", "on", "off"],
                    help="llama.cpp's flash-attention switch (its default: auto)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="append one JSON object per file to this file")
    ap.add_argument("--reference", action="store_true",
                    help="with --ids-from: also compare each side with the golden's transformers logits (meaningful for "
                         "files with the golden's weights, F16/F32)")
    ap.add_argument("--per-position", action="store_true", help="print every position's NMSE")
    args = ap.parse_args()

    exe = build_tool(args.llama_cpp, args.build_subdir)
    bin_dir = os.path.join(args.llama_cpp, args.build_subdir, "bin")
    with tempfile.TemporaryDirectory() as tmp:
        for src in args.files:
            path = src
            if args.quantize:
                path = os.path.join(tmp, os.path.basename(src).replace(".gguf", f"-{args.quantize.lower()}.gguf"))
                err = llama_quantize(bin_dir, src, path, args.quantize)
                if err:
                    print(f"{src}: llama-quantize {args.quantize} failed: {err}")
                    continue
            llama_path = path
            if args.llama_dequantized:
                llama_path = os.path.join(tmp, "dequantized-f32.gguf")
                err = llama_quantize(bin_dir, path, llama_path, "F32")
                if err:
                    print(f"{path}: llama-quantize F32 failed: {err}")
                    continue
            arch, vocab, has_tok, types = describe(path)
            ids = token_ids(args, vocab)
            l, lerr = llama_logits(exe, llama_path, ids, args, arch, vocab, has_tok, os.path.join(tmp, "llama.npy"))
            h, herr = hanpu_logits(args.hanpu, path, ids, args, os.path.join(tmp, "hanpu.safetensors"))
            row = {"file": os.path.basename(src), "quantize": args.quantize, "arch": arch, "types": types,
                   "llama_mode": "step" if args.llama_step else "batch", "hanpu_mode": "step" if args.hanpu_step else "batch", "llama_dequantized": args.llama_dequantized, "cache_type": args.cache_type, "flash_attn": args.flash_attn,
                   "tokens": len(ids)}
            if lerr or herr:
                row["error"] = {"llama.cpp": lerr, "hanpu": herr}
                print(f"{row['file']} {args.quantize or ''} [{arch}] types {types}\n  llama.cpp: {lerr or 'ok'}\n  hanpu: {herr or 'ok'}")
            else:
                if h.shape != l.shape:
                    sys.exit(f"{path}: hanpu's logits are {h.shape}, llama.cpp's {l.shape}")
                row.update(compare(h, l))
                print(f"{row['file']} {args.quantize or ''} [{arch}] types {types}\n"
                      f"  {row['positions']} positions: NMSE worst {row['nmse_worst']:.2e} (position {row['worst_position']}),"
                      f" median {row['nmse_median']:.2e}; greedy agreement {row['greedy_agree']}/{row['positions']};"
                      f" max |diff| {row['max_abs_diff']:.3g} (logits up to {row['logit_range']:.3g})")
                if args.reference and args.ids_from:
                    from safetensors.numpy import load_file
                    ref = load_file(args.ids_from)["logits"].astype(np.float32)
                    for side, x in (("llama.cpp", l), ("hanpu", h)):
                        c = compare(x, ref)
                        row[f"{side}_vs_transformers"] = {k: c[k] for k in ("nmse_worst", "nmse_median", "greedy_agree")}
                        print(f"  {side} vs transformers: NMSE worst {c['nmse_worst']:.2e}, median {c['nmse_median']:.2e},"
                              f" argmax agreement {c['greedy_agree']}/{c['positions']}")
                if args.per_position:
                    print("  NMSE per position: " + " ".join(f"{i}:{x:.1e}" for i, x in enumerate(row["nmse"])))
                for d in row["disagree"]:
                    print(f"    position {d['position']}: hanpu {d['hanpu']} llama.cpp {d['llama']}"
                          f" (top-2 margins: llama.cpp {d['llama_top2_margin']:.3g}, hanpu {d['hanpu_top2_margin']:.3g})")
            sys.stdout.flush()
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
