"""`hanpu quantize --format` (src/model/gguf_export.cpp) against llama.cpp's own files and gguf-py.

- f16 and q8_0 of tests/golden/qwen35_tiny equal, key by key and byte by byte, the files
  llama.cpp's converter wrote from the same checkpoint (tests/data/gguf, tools/convert_tiny_to_gguf.py;
  its q8_0 uses gguf-py's Q8_0 quantizer). Only general.name differs (llama.cpp title-cases it).
- A synthetic Qwen3.5 checkpoint whose rows are whole 256-blocks (so Q4_K / Q5_K / Q6_K apply) written as
  q4_k_m, q4_k, q6_k, q5_k_m and q5_k: gguf-py reads the files, every tensor has the type llama.cpp's rules give
  (coded here again from llama-quant.cpp), the unquantized tensors equal the f16 file's, and the
  quantized ones dequantize (gguf-py's numpy dequantizers) close to the f16 file's values.
- Errors leave no file behind.

HANPU_EXE names the hanpu binary (set by ctest).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize
from safetensors.numpy import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
from make_random_qwen35_checkpoint import qwen35_tensors  # noqa: E402  (the same tensors as the benchmarks')

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "golden", "qwen35_tiny")
FIXTURES = os.path.join(ROOT, "tests", "data", "gguf")
HANPU = os.environ.get("HANPU_EXE", os.path.join(ROOT, "build", "release", "hanpu"))


def quantize(model, out, fmt, check=True):
    return subprocess.run([HANPU, "quantize", "--model", model, "--out", out, "--format", fmt],
                          capture_output=True, text=True, check=check)


def fields(r):
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def tensors(r):
    return {t.name: t for t in r.tensors}


def raw(t):
    return np.array(t.data).view(np.uint8).reshape(-1)


def values(t):
    """float32 values of a tensor as gguf-py decodes them."""
    if t.tensor_type in (T.F32, T.F16):
        return np.array(t.data, dtype=np.float32).reshape(-1)
    return dequantize(np.array(t.data), t.tensor_type).astype(np.float32).reshape(-1)


@pytest.mark.parametrize("fmt,fixture", [("f16", "qwen35_tiny-f16.gguf"), ("q8_0", "qwen35_tiny-q8_0.gguf")])
def test_tiny_equals_llama_cpp_converter(tmp_path, fmt, fixture):
    out = str(tmp_path / f"tiny-{fmt}.gguf")
    quantize(TINY, out, fmt)
    mine, theirs = GGUFReader(out), GGUFReader(os.path.join(FIXTURES, fixture))
    fm, ft = fields(mine), fields(theirs)
    for k in ("general.name", "general.size_label"):
        fm.pop(k, None)
        ft.pop(k, None)
    assert fm == ft
    tm, tt = tensors(mine), tensors(theirs)
    assert sorted(tm) == sorted(tt)
    for name, t in tt.items():
        assert tm[name].tensor_type == t.tensor_type, name
        assert list(tm[name].shape) == list(t.shape), name
        assert np.array_equal(raw(tm[name]), raw(t)), name


# A Qwen3.5 text model whose projections have rows of whole 256-element blocks; 8 layers so that
# llama.cpp's use_more_bits picks some layers and not others (n = 8: layers 0, 3, 6, 7).
H, I, V, LAYERS, NK, NV, DK, DV, HEADS, KV_HEADS, HD, K = 256, 512, 320, 8, 2, 4, 64, 64, 4, 2, 64, 4
FULL = {3, 7}


def write_checkpoint(d, rng):
    os.makedirs(d)
    with open(os.path.join(TINY, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg["text_config"]
    tc.update(hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, head_dim=HD, linear_num_key_heads=NK, linear_num_value_heads=NV,
              linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=K,
              layer_types=["full_attention" if i in FULL else "linear_attention" for i in range(LAYERS)])
    tc["rope_parameters"]["mrope_section"] = [2, 2, 4]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, name), d)

    def w(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    t = qwen35_tensors(w, rng, hidden=H, intermediate=I, vocab=V, layers=LAYERS, full_layers=FULL, heads=HEADS,
                       kv_heads=KV_HEADS, head_dim=HD, linear_key_heads=NK, linear_value_heads=NV, key_dim=DK,
                       value_dim=DV, conv_kernel=K, lm_head=True)
    save_file(t, os.path.join(d, "model.safetensors"))


def more_bits(i, n):  # llama-quant.cpp use_more_bits
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_type(fmt, name, n_dims, attn_v_index, n_attn_v):
    quantizable = n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ssm_conv1d" not in name
    if not quantizable:
        return T.F32
    if fmt == "q4_k":
        return T.Q4_K
    if fmt == "q5_k":
        return T.Q5_K
    if fmt == "q6_k":
        return T.Q6_K
    base = T.Q5_K if fmt == "q5_k_m" else T.Q4_K  # q4_k_m and q5_k_m share the rules below
    if name == "output.weight":
        return T.Q6_K
    if name.endswith("attn_v.weight") or name.endswith("attn_qkv.weight"):
        return T.Q6_K if more_bits(attn_v_index, n_attn_v) else base
    if "ffn_down" in name:
        return T.Q6_K if more_bits(int(name.split(".")[1]), LAYERS) else base
    return base


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ckpt") / "qwen35_256")
    write_checkpoint(d, np.random.default_rng(34))
    f16 = os.path.join(os.path.dirname(d), "f16.gguf")
    quantize(d, f16, "f16")
    return d, GGUFReader(f16)


@pytest.mark.parametrize("fmt,file_type,nmse_bound", [("q4_k_m", 15, 0.006), ("q4_k", 14, 0.0075), ("q6_k", 18, 0.0005),
                                                      ("q5_k_m", 17, 0.002), ("q5_k", 16, 0.002)])  # Q5_K measured 0.0014
def test_k_quant_files(tmp_path, synthetic, fmt, file_type, nmse_bound):
    d, f16 = synthetic
    out = str(tmp_path / f"{fmt}.gguf")
    quantize(d, out, fmt)
    r = GGUFReader(out)
    assert r.fields["general.file_type"].contents() == file_type
    ref = tensors(f16)
    got = tensors(r)
    assert sorted(got) == sorted(ref)
    # llama.cpp counts attn_v / attn_qkv tensors in file order (layer order).
    attn_v = [n for n in sorted(got, key=lambda n: (int(n.split(".")[1]) if n.startswith("blk.") else -1, n))
              if n.endswith("attn_v.weight") or n.endswith("attn_qkv.weight")]
    seen_types = set()
    for name, t in got.items():
        want = expected_type(fmt, name, len(t.shape), attn_v.index(name) if name in attn_v else -1, len(attn_v))
        assert t.tensor_type == want, (name, t.tensor_type, want)
        seen_types.add(t.tensor_type)
        x = values(ref[name]).astype(np.float64)
        y = values(t).astype(np.float64)
        if t.tensor_type == T.F32:
            assert np.array_equal(x, y), name
        else:
            err = np.mean((x - y) ** 2) / np.mean(x ** 2)
            assert err < nmse_bound, (name, err)
    if fmt == "q4_k_m":
        assert seen_types == {T.F32, T.Q4_K, T.Q6_K}
    if fmt == "q5_k_m":
        assert seen_types == {T.F32, T.Q5_K, T.Q6_K}


def run_logits(model, path, prefill=None):
    """prefill: HANPU_GGUF_PREFILL for the run ("f32": the exact f32 tiles; None: the default)."""
    ids = ",".join(str(i) for i in (5, 17, 42, 99, 123, 7, 250, 64))
    env = dict(os.environ)
    if prefill is not None:
        env["HANPU_GGUF_PREFILL"] = prefill
    subprocess.run([HANPU, "run", "--model", model, "--prompt-ids", ids, "-n", "1", "--greedy", "--logits-out", path],
                   capture_output=True, text=True, check=True, env=env)
    from safetensors.numpy import load_file
    return load_file(path)["logits"].astype(np.float64)


def dequantized_copy(src, dst):
    """The GGUF file `src` with every quantized tensor replaced by its gguf-py dequantization (F32)."""
    from gguf import GGUFWriter
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, values(t).reshape(list(reversed([int(x) for x in t.shape]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("fmt", ["q4_k_m", "q6_k", "q8_0"])
def test_hanpu_reads_its_own_files(tmp_path, synthetic, fmt):
    """hanpu runs the file it wrote with exactly the quantized weights: its logits at every prompt
    position equal (up to summation order) its logits on a copy whose quantized tensors gguf-py
    dequantized to F32. (Against the f16 file they differ by the format's error times this random
    8-layer model's amplification, about 100x: NMSE 0.007 for Q8_0, 0.04 Q6_K, 0.6 Q4_K_M.) The
    prompt's prefill runs the exact f32 tiles (HANPU_GGUF_PREFILL=f32): the integer prefill rounds
    the activations to int8, which this comparison is not about (tests/test_linear_gguf.cpp bounds it)."""
    d, _ = synthetic
    out = str(tmp_path / f"{fmt}.gguf")
    quantize(d, out, fmt)
    dequantized_copy(out, str(tmp_path / "f32.gguf"))
    got = run_logits(out, str(tmp_path / "q.safetensors"), prefill="f32")
    ref = run_logits(str(tmp_path / "f32.gguf"), str(tmp_path / "f32.safetensors"), prefill="f32")
    assert got.shape == ref.shape == (8, V)
    for pos in range(got.shape[0]):
        err = np.mean((got[pos] - ref[pos]) ** 2) / np.mean(ref[pos] ** 2)
        assert err < 1e-6, (fmt, pos, err)


@pytest.mark.parametrize("fmt", ["q4_k_m", "q8_0", "q4_k", "q6_k"])
def test_weights_quantized_at_load_equal_the_file(tmp_path, synthetic, fmt):
    """`run --weights FMT` on the safetensors checkpoint quantizes at load into the representation
    the GGUF loader builds: its logits at every position are bit-equal to running the file
    `hanpu quantize --format FMT` wrote."""
    d, _ = synthetic
    out = str(tmp_path / f"{fmt}.gguf")
    quantize(d, out, fmt)
    from_file = run_logits(out, str(tmp_path / "file.safetensors"))
    ids = ",".join(str(i) for i in (5, 17, 42, 99, 123, 7, 250, 64))
    subprocess.run([HANPU, "run", "--model", d, "--weights", fmt, "--prompt-ids", ids, "-n", "1", "--greedy",
                    "--logits-out", str(tmp_path / "load.safetensors")], capture_output=True, text=True, check=True)
    from safetensors.numpy import load_file
    at_load = load_file(str(tmp_path / "load.safetensors"))["logits"].astype(np.float64)
    assert np.array_equal(from_file, at_load)
    # A GGUF file is already quantized: refused by name.
    res = subprocess.run([HANPU, "run", "--model", out, "--weights", fmt, "--prompt-ids", ids, "-n", "1"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "GGUF file already" in res.stderr, res.stderr


def test_errors_leave_no_file(tmp_path):
    d = str(tmp_path / "ckpt")
    shutil.copytree(TINY, d)
    # A tensor the qwen35 mapping has no GGUF name for: refused by name, nothing written.
    bogus = "model.language_model.layers.0.mlp.bogus.weight"
    save_file({bogus: np.zeros((4, 4), np.float32)}, os.path.join(d, "model-extra.safetensors"))
    index_path = os.path.join(d, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    index["weight_map"][bogus] = "model-extra.safetensors"
    with open(index_path, "w") as f:
        json.dump(index, f)
    out = str(tmp_path / "out.gguf")
    res = quantize(d, out, "q4_k_m", check=False)
    assert res.returncode != 0
    assert "model.language_model.layers.0.mlp.bogus.weight" in res.stderr
    assert os.listdir(tmp_path) == ["ckpt"]
    res = quantize(TINY, out, "q3_k_m", check=False)
    assert res.returncode != 0 and "q3_k_m" in res.stderr and "q4_k_m" in res.stderr
