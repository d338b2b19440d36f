#!/usr/bin/env python3
"""Writes the GGUF test fixtures of tests/test_gguf.cpp with gguf-py's GGUFWriter (the reference
writer, pinned in python/requirements-test.txt), and next to each a .expected.json with what a
reader must find: every metadata key (type and value), every tensor (ggml type, dims in ggml order,
offset) and its values dequantized by gguf-py's numpy reference (gguf.quants.dequantize), as float32
bit patterns so that the comparison is exact.

    python3 tools/make_gguf_fixtures.py tests/data/gguf
"""

import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

# Byte offsets of f16 scales inside a block: random bytes there would give inf/NaN, so they are
# overwritten with moderate values (the scale edge cases are tests/python/test_gguf_blocks.py's job).
SCALES = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_XS: [0]}


def block_bytes(rng, qtype, rows, row_elems):
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * row_elems // elems, nbytes), dtype=np.uint8)
    for off in SCALES[qtype]:
        raw[:, off:off + 2] = rng.uniform(-0.1, 0.1, size=raw.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def f32_bits(a):
    return [int(v) for v in np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


NAMES = {"UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16", "UINT32": "u32", "INT32": "i32",
         "UINT64": "u64", "INT64": "i64", "BOOL": "bool", "STRING": "string", "FLOAT32": "f32", "FLOAT64": "f64"}


def value_json(v, vtype, sub_type=None):
    if vtype == gguf.GGUFValueType.ARRAY:
        items = list(v)
        et = sub_type or gguf.GGUFValueType.get_type(items[0])
        return {"type": "array", "elem_type": NAMES.get(et.name, "array"), "value": [value_json(x, et) for x in items]}
    if vtype in (gguf.GGUFValueType.FLOAT32,):
        return {"type": "f32", "value": float(np.float32(v))}
    if vtype == gguf.GGUFValueType.FLOAT64:
        return {"type": "f64", "value": float(v)}
    return {"type": NAMES[vtype.name], "value": v}


def write(path, writer_kwargs, metadata, tensors, alignment=None):
    """metadata: [(key, value, GGUFValueType)], tensors: [(name, array or uint8 block bytes, qtype)]"""
    w = gguf.GGUFWriter(str(path), "hanpu-test", **writer_kwargs)
    expected = {"metadata": {"general.architecture": {"type": "string", "value": "hanpu-test"}}, "tensors": []}
    if alignment is not None:  # sets general.alignment (u32) and pads the data to it
        w.add_custom_alignment(alignment)
        expected["metadata"]["general.alignment"] = {"type": "u32", "value": alignment}
    for key, value, vtype in metadata:
        w.add_key_value(key, value, vtype)
        expected["metadata"][key] = value_json(value, vtype)
    for name, data, qtype in tensors:
        if qtype in (T.F32, T.F16, T.BF16):
            values = data.astype(np.float32)
            if qtype == T.BF16:
                stored = gguf.quants.quantize(values, T.BF16)
                w.add_tensor(name, stored, raw_dtype=T.BF16)
            else:
                stored = data
                w.add_tensor(name, stored)
            dims = list(reversed(data.shape))
            deq = gguf.quants.dequantize(stored, qtype) if qtype != T.F32 else values
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
            elems, nbytes = GGML_QUANT_SIZES[qtype]
            dims = [data.shape[1] // nbytes * elems] + list(reversed(data.shape[:-1]))
            deq = gguf.quants.dequantize(data, qtype)
        expected["tensors"].append({"name": name, "type": qtype.name, "dims": dims, "values_f32_bits": f32_bits(deq)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(34)
    V = gguf.GGUFValueType
    metadata = [
        ("test.u8", 200, V.UINT8), ("test.i8", -100, V.INT8), ("test.u16", 60000, V.UINT16),
        ("test.i16", -30000, V.INT16), ("test.u32", 4000000000, V.UINT32), ("test.i32", -2000000000, V.INT32),
        ("test.f32", 0.1, V.FLOAT32), ("test.bool", True, V.BOOL), ("test.string", "héllo\tgguf", V.STRING),
        ("test.u64", 2**63 + 5, V.UINT64), ("test.i64", -2**62, V.INT64), ("test.f64", 1e-300, V.FLOAT64),
        ("test.array_i32", [1, -2, 3], V.ARRAY), ("test.array_str", ["a", "", "ccc"], V.ARRAY),
        ("test.nested", [[1, 2], [3], [4, 5, 6]], V.ARRAY),
    ]
    tensors = [
        ("f32.weight", rng.standard_normal((5, 3)).astype(np.float32), T.F32),
        ("f16.weight", rng.standard_normal((2, 8)).astype(np.float16), T.F16),
        ("bf16.weight", rng.standard_normal((2, 4)).astype(np.float32), T.BF16),
        ("q8_0.weight", block_bytes(rng, T.Q8_0, 3, 64), T.Q8_0),
        ("q4_0.weight", block_bytes(rng, T.Q4_0, 2, 32), T.Q4_0),
        ("q4_k.weight", block_bytes(rng, T.Q4_K, 2, 256), T.Q4_K),
        ("q5_k.weight", block_bytes(rng, T.Q5_K, 1, 512), T.Q5_K),
        ("q6_k.weight", block_bytes(rng, T.Q6_K, 2, 256), T.Q6_K),
        ("iq4_xs.weight", block_bytes(rng, T.IQ4_XS, 1, 256), T.IQ4_XS),
    ]
    expected = write(out / "tiny.gguf", {}, metadata, tensors)
    (out / "tiny.expected.json").write_text(json.dumps(expected, indent=0) + "\n")

    # general.alignment = 64, a 3-D tensor
    t3 = [("a", rng.standard_normal((2, 3, 4)).astype(np.float32), T.F32),
          ("b", block_bytes(rng, T.Q8_0, 2, 32), T.Q8_0)]
    expected = write(out / "aligned64.gguf", {}, [], t3, alignment=64)
    (out / "aligned64.expected.json").write_text(json.dumps(expected, indent=0) + "\n")

    # a model split over three files, one tensor each
    split = [(f"blk.{i}.weight", rng.standard_normal((2, 4)).astype(np.float32), T.F32) for i in range(3)]
    expected = write(out / "split.gguf", {"split_max_tensors": 1}, [], split)
    (out / "split.expected.json").write_text(json.dumps(expected, indent=0) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/gguf")
