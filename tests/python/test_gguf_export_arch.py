"""`hanpu quantize --format` for qwen3next, qwen35moe, kimi-linear and bailingmoe3 (src/model/gguf_export.cpp:
the families' GGUF mappings run backwards: Qwen3-Next's fused in_proj_qkvz split into attn_qkv / attn_gate, experts stacked 3-D, MLA kv_b_proj split into attn_k_b /
attn_v_b, A_log as -exp / exp, KDA convs [1, C, 1, K]).

- f16 and q8_0 of the tiny goldens equal, tensor by tensor (name, type, shape, bytes) and key by key,
  the fixtures: qwen35moe_tiny-f16 from llama.cpp's own converter; the others from
  tools/make_gguf_arch_fixtures.py, which follows llama.cpp's converters with PyPI gguf (their
  tensors are byte-identical to llama.cpp's converter's on prepared copies: docs/GGUF.md). The keys
  that differ are named: general.* bookkeeping; tokenizer.ggml.model "no_vocab" where the golden
  has no tokenizer (llama.cpp needs the key to load a vocabulary-less file); the tokenizer keys
  hanpu writes from qwen3next_tiny's tokenizer.json, which the fixture script leaves out.
- Round trip: hanpu runs the file it wrote. F16 holds the goldens' bf16 weights exactly, so its
  logits at every position are those of the safetensors checkpoint (hanpu run on the directory)
  within f32 summation order, and the greedy continuation is the golden's. Q8_0: the logits equal
  those of a copy whose Q8_0 tensors gguf-py dequantized to F32 (same weights), and stay within
  the measured distance of the safetensors checkpoint's.

HANPU_EXE names the hanpu binary (set by ctest).
"""
import os
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as T
from gguf.quants import dequantize
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
FIXTURES = os.path.join(ROOT, "tests", "data", "gguf")
HANPU = os.environ.get("HANPU_EXE", os.path.join(ROOT, "build", "release", "hanpu"))

FAMILIES = [("kimi_linear_tiny", "kimi-linear"), ("bailing_hybrid_tiny", "bailingmoe3"), ("qwen3next_tiny", "qwen3next"),
            ("qwen35moe_tiny", "qwen35moe")]
# Keys that are bookkeeping, not the model: the fixture script's GGUFWriter writes none of these,
# and llama.cpp's converter title-cases general.name and adds a size label.
BOOKKEEPING = {"general.name", "general.type", "general.quantization_version", "general.size_label"}
# (golden, format): the fixture has the converter's tokenizer keys (only qwen35moe's, from llama.cpp).
FIXTURE_CASES = [(g, a, fmt) for g, a in FAMILIES for fmt in ("f16", "q8_0") if (g, fmt) != ("qwen35moe_tiny", "q8_0")]


def quantize(model, out, fmt):
    subprocess.run([HANPU, "quantize", "--model", model, "--out", out, "--format", fmt], capture_output=True, text=True,
                   check=True)


def fields(r):
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def raw(t):
    return np.array(t.data).view(np.uint8).reshape(-1)


def golden_ids(golden):
    d = load_file(os.path.join(GOLDEN, golden, "expected.safetensors"))
    return d["prompt_ids"].tolist(), d["greedy_ids"].tolist(), d["logits"].astype(np.float64)


def run_logits(model, ids, out, prefill=None):
    """prefill: HANPU_GGUF_PREFILL for the run ("f32": the exact f32 tiles; None: the default, which
    for Q8_0, the K-quants and IQ4_XS on AVX2 and AVX-512 targets is the integer prefill on int8
    activations)."""
    env = dict(os.environ)
    if prefill:
        env["HANPU_GGUF_PREFILL"] = prefill
    subprocess.run([HANPU, "run", "--model", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "0", "--threads", "2",
                    "--logits-out", out], capture_output=True, text=True, check=True, env=env)
    return load_file(out)["logits"].astype(np.float64)


def nmse(a, b):
    return ((a - b) ** 2).sum(axis=1) / (b ** 2).sum(axis=1)


@pytest.mark.parametrize("golden,arch,fmt", FIXTURE_CASES)
def test_equals_converter_fixture(tmp_path, golden, arch, fmt):
    out = str(tmp_path / f"{golden}-{fmt}.gguf")
    quantize(os.path.join(GOLDEN, golden), out, fmt)
    mine, theirs = GGUFReader(out), GGUFReader(os.path.join(FIXTURES, f"{golden}-{fmt}.gguf"))
    fm, ft = fields(mine), fields(theirs)
    has_tokenizer = os.path.exists(os.path.join(GOLDEN, golden, "tokenizer.json"))
    if not has_tokenizer:
        assert fm.pop("tokenizer.ggml.model") == "no_vocab"
    elif not any(k.startswith("tokenizer.") for k in ft):  # the fixture script writes no tokenizer
        assert fm["tokenizer.ggml.model"] == "gpt2" and fm["tokenizer.ggml.pre"] == "qwen2"
        fm = {k: v for k, v in fm.items() if not k.startswith("tokenizer.")}
    for k in BOOKKEEPING:
        fm.pop(k, None)
        ft.pop(k, None)
    assert fm == ft
    assert fm["general.architecture"] == arch
    tm, tt = {t.name: t for t in mine.tensors}, {t.name: t for t in theirs.tensors}
    assert sorted(tm) == sorted(tt)
    for name, t in tt.items():
        assert tm[name].tensor_type == t.tensor_type, name
        assert list(tm[name].shape) == list(t.shape), name
        if name.endswith("ssm_a"):
            # -exp(A_log) / exp(A_log) in float32: hanpu's std::exp is correctly rounded, torch's
            # (which the fixtures use, as the converters do) is off by one ulp now and then (qwen3next
            # layer 2 head 0: torch ...566, hanpu and float64 rounded to float32 ...565).
            diff = raw(tm[name]).view(np.int32).astype(np.int64) - raw(t).view(np.int32).astype(np.int64)
            assert np.abs(diff).max() <= 1, name
            continue
        assert np.array_equal(raw(tm[name]), raw(t)), name


def dequantized_copy(src, dst):
    """The file with every quantized tensor dequantized to F32 by gguf-py (same keys)."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=fields(r)["general.architecture"])
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = f.contents()
        w.add_key_value(k, v, f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        shape = [int(x) for x in reversed(list(t.shape))]
        if t.tensor_type in (T.F32, T.F16):
            data = np.array(t.data).reshape(shape)
        else:
            data = dequantize(np.array(t.data), t.tensor_type).astype(np.float32).reshape(shape)
        w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=T.F32 if data.dtype == np.float32 else T.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("golden,arch", FAMILIES)
def test_f16_round_trip(tmp_path, golden, arch):
    out = str(tmp_path / "f16.gguf")
    quantize(os.path.join(GOLDEN, golden), out, "f16")
    prompt, greedy, ref = golden_ids(golden)
    ids = prompt + greedy
    from_gguf = run_logits(out, ids, str(tmp_path / "g.safetensors"))
    from_dir = run_logits(os.path.join(GOLDEN, golden), ids, str(tmp_path / "d.safetensors"))
    # The same weights: the F16 file's f32 path against the directory's bf16 kernel, within
    # GgufArch.F16EqualsTheSafetensorsModel's bound (3e-5 of the range: three f32 roundings per
    # multiply-add where Bf16Linear runs on AMX; this case measured 1.0e-5 there).
    assert np.abs(from_gguf - from_dir).max() <= 3e-5 * np.abs(from_dir).max()
    assert nmse(from_gguf, ref).max() <= 1e-8  # and transformers' logits
    got = subprocess.run([HANPU, "run", "--model", out, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(len(greedy)),
                          "--greedy", "--ids"], capture_output=True, text=True, check=True).stdout.split()
    assert [int(x) for x in got] == greedy


@pytest.mark.parametrize("golden,arch", FAMILIES)
def test_q8_0_round_trip(tmp_path, golden, arch):
    out = str(tmp_path / "q8_0.gguf")
    quantize(os.path.join(GOLDEN, golden), out, "q8_0")
    dequantized_copy(out, str(tmp_path / "f32.gguf"))
    prompt, greedy, ref = golden_ids(golden)
    ids = prompt + greedy
    # The file's values are exactly Q8_0's: on the exact f32 tiles its logits are those of its
    # dequantized copy (the default integer prefill rounds the activations too; its bounds are
    # tests/test_linear_gguf.cpp's GgufIntPrefill), up to f32 summation order: the worst position
    # 3.1e-11 with the AVX2 kernels, 2.0e-10 with the AVX-512 ones (qwen35moe, position 10, the same
    # file on one Xeon, 2026-12-05; medians 5e-13..7e-13); a wrong block or scale gives 1e-6 or more.
    got = run_logits(out, ids, str(tmp_path / "q.safetensors"), prefill="f32")
    same_weights = run_logits(str(tmp_path / "f32.gguf"), ids, str(tmp_path / "f.safetensors"))
    assert nmse(got, same_weights).max() <= 1e-9
    assert (got.argmax(axis=1) == same_weights.argmax(axis=1)).all()
    # Against the unquantized checkpoint: Q8_0's rounding (1/254 of a block's largest weight),
    # amplified by these random tiny models (measured: see the docstring of the bound below).
    from_dir = run_logits(os.path.join(GOLDEN, golden), ids, str(tmp_path / "d.safetensors"))
    assert np.median(nmse(got, from_dir)) <= Q8_0_MEDIAN_NMSE[golden]


# Median over the 85 positions of the Q8_0 file's NMSE against the bf16 checkpoint, measured
# 2026-12-04: kimi 3.9e-3 (worst position 1.6, argmax 65/85), ling 1.7e-3 (worst 0.75, 72/85),
# qwen3next 4.6e-4 (4.3e-2, 77/85), qwen35moe 1.1e-3 (0.27, 77/85); bound about 2x that. These
# random tiny models amplify Q8_0's weight rounding (their top-2 logit margins are small; docs/GGUF.md); the weights are fixed, so the number moves only if the quantizer or the
# mapping changes.
Q8_0_MEDIAN_NMSE = {"kimi_linear_tiny": 8e-3, "bailing_hybrid_tiny": 3.5e-3, "qwen3next_tiny": 1e-3, "qwen35moe_tiny": 2.5e-3}


def _llama_quantize_digests():
    import json
    with open(os.path.join(FIXTURES, "llama_quantize_digests.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("golden", ["qwen35_tiny", "qwen35moe_tiny", "qwen3next_tiny", "kimi_linear_tiny",
                                    "bailing_hybrid_tiny"])
@pytest.mark.parametrize("fmt", ["q4_k_m", "q5_k_m"])
def test_mixes_equal_llama_quantize(tmp_path, golden, fmt):
    """`hanpu quantize --format q4_k_m|q5_k_m` of each tiny golden against llama-quantize's Q4_K_M /
    Q5_K_M of the golden's F16 fixture (tools/make_gguf_fallback_fixtures.py stored every tensor's
    type and the SHA-256 of its bytes): the same tensors, types and bytes. The tiny rows (64-128
    wide) are never whole 256-blocks, so this holds the writer to llama-quant.cpp's fallbacks (Q4_K
    -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, rows not of 32 -> F16), its rules for 8 experts (attn_v,
    attn_qkv and attn_k Q8_0; attn_output Q5_K, hence Q5_1, in Q4_K_M) and the Q5_0 / Q5_1 / Q8_0
    quantizers' bytes; the 256-wide K-quant rules are test_gguf_export.py's."""
    import hashlib
    want = _llama_quantize_digests()[golden][fmt]
    out = str(tmp_path / f"{golden}-{fmt}.gguf")
    quantize(os.path.join(GOLDEN, golden), out, fmt)
    got = {t.name: [t.tensor_type.name, hashlib.sha256(bytes(raw(t))).hexdigest()] for t in GGUFReader(out).tensors}
    assert sorted(got) == sorted(want)
    # ssm_a is computed (-exp(A_log) in F32), where hanpu's correctly rounded exp may differ from the
    # converter's torch exp by an ulp (test_equals_converter_fixture above); every other tensor is compared whole.
    differ = [(n, got[n], want[n]) for n in sorted(want) if got[n] != want[n] and not n.endswith("ssm_a")]
    assert not differ, f"{len(differ)} of {len(want)} tensors differ, first: {differ[:3]}"
    assert all(got[n][0] == want[n][0] for n in want)  # types, ssm_a included
    assert {v[0] for v in want.values()} >= {"Q8_0", "Q5_0" if fmt == "q4_k_m" else "Q5_1"}
