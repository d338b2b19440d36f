"""hanpu's GGML block dequantizers (src/cpu/gguf_blocks.cpp) against gguf-py's numpy reference
(gguf.quants.dequantize / quantize), bit for bit.

Run by ctest (GgufBlocksVsGgufPy) with HANPU_GGUF_BLOCKS_TOOL naming the built
tests/gguf_blocks_tool. Values are compared as float32 bit patterns; the only allowance is that a
NaN equals any NaN (its payload after inf*0 is not part of the format).
"""

import os
import subprocess
import tempfile

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402

TOOL = os.environ.get("HANPU_GGUF_BLOCKS_TOOL")
if not TOOL:
    pytest.fail("HANPU_GGUF_BLOCKS_TOOL is not set (run through ctest)", pytrace=False)

# f16 scales at the edges: max, -max, smallest normal, largest/smallest subnormal, +-0, 1, -1,
# +-inf, NaN.
EXTREME_F16 = [0x7BFF, 0xFBFF, 0x0400, 0x03FF, 0x0001, 0x8001, 0x0000, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00]
# Byte offsets of the f16 scales inside a block.
SCALE_OFFSETS = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0]}
BLOCK_TYPES = list(SCALE_OFFSETS)


def run_tool(*args):
    subprocess.run([TOOL, *args], check=True)


def hanpu_dequantize(qtype, raw):
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        raw.tofile(src)
        run_tool("dequantize", qtype.name, src, dst)
        return np.fromfile(dst, dtype=np.float32)


def hanpu_quantize(qtype, x):
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        x.astype(np.float32).tofile(src)
        run_tool("quantize", qtype.name, src, dst)
        return np.fromfile(dst, dtype=np.uint8)


def hanpu_quantize_q8_0(x):
    return hanpu_quantize(T.Q8_0, x)


def reference_dequantize(qtype, raw):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    with np.errstate(all="ignore"):  # inf/NaN scales are part of the test
        return gguf.quants.dequantize(raw.reshape(-1, block_bytes), qtype).reshape(-1)


def assert_bits_equal(got, want):
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    both_nan = np.isnan(got) & np.isnan(want)
    differ = (got.view(np.uint32) != want.view(np.uint32)) & ~both_nan
    if differ.any():
        i = int(np.flatnonzero(differ)[0])
        raise AssertionError(f"{int(differ.sum())} of {got.size} values differ; first at {i}: hanpu {got[i]!r} "
                             f"(0x{got.view(np.uint32)[i]:08x}), gguf-py {want[i]!r} (0x{want.view(np.uint32)[i]:08x})")


def test_registry_matches_gguf_py():
    lines = subprocess.run([TOOL, "formats"], check=True, capture_output=True, text=True).stdout.split("\n")
    rows = [line.split() for line in lines if line]
    assert len(rows) >= 30
    for code, name, elems, nbytes, _ in rows:
        qtype = T(int(code))
        assert qtype.name == name
        assert GGML_QUANT_SIZES[qtype] == (int(elems), int(nbytes)), name
    dequantizable = {name for _, name, _, _, flag in rows if flag == "1"}
    assert dequantizable == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_random_blocks(qtype):
    rng = np.random.default_rng(int(qtype))
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = 4096
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    # Keep most scales finite and moderate (random bytes give many inf/NaN f16s), then put every
    # extreme value at every scale position in some blocks.
    for off in SCALE_OFFSETS[qtype]:
        moderate = rng.uniform(-2.0, 2.0, size=n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw[:, off:off + 2] = moderate
    for i, v in enumerate(EXTREME_F16):
        for k, off in enumerate(SCALE_OFFSETS[qtype]):
            rows = slice(i * 8 + k * 4, i * 8 + k * 4 + 4)  # 4 blocks per (value, scale position)
            raw[rows, off] = v & 0xFF
            raw[rows, off + 1] = v >> 8
    # all-zero and all-0xff payloads
    raw[200] = 0
    raw[201] = 0xFF
    raw = raw.reshape(-1)
    got = hanpu_dequantize(qtype, raw)
    assert got.size == n_blocks * block_elems
    assert_bits_equal(got, reference_dequantize(qtype, raw))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K], ids=lambda t: t.name)
def test_k4_each_sub_block_scale_position(qtype):
    """One block per sub-block j with only that sub-block's 6-bit scale and min at 63 (and at the
    values 1, 32): catches a swapped packing in ggml's get_scale_min_k4 layout."""
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = []
    rng = np.random.default_rng(7)
    for j in range(8):
        for sc, m in [(63, 63), (1, 32), (32, 1), (63, 0), (0, 63)]:
            b = rng.integers(0, 256, size=block_bytes, dtype=np.uint8)
            b[0:2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
            b[2:4] = np.frombuffer(np.float16(-0.25).tobytes(), dtype=np.uint8)
            s = np.zeros(12, dtype=np.uint8)
            if j < 4:
                s[j] = sc
                s[j + 4] = m
            else:
                s[j + 4] = (sc & 0xF) | ((m & 0xF) << 4)
                s[j - 4] |= (sc >> 4) << 6
                s[j] |= (m >> 4) << 6
            b[4:16] = s
            blocks.append(b)
    raw = np.concatenate(blocks)
    got = hanpu_dequantize(qtype, raw)
    want = reference_dequantize(qtype, raw)
    assert_bits_equal(got, want)
    # the test is not vacuous: each block has a nonzero sub-block exactly where it was put
    per_sub = np.abs(want.reshape(len(blocks), 8, 32)).sum(axis=-1)
    for i in range(len(blocks)):
        j = i // 5
        assert per_sub[i, j] > 0 and np.all(np.delete(per_sub[i], j) == 0)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_every_16_bit_pattern(qtype):
    raw = np.arange(65536, dtype=np.uint16).view(np.uint8)
    assert_bits_equal(hanpu_dequantize(qtype, raw), reference_dequantize(qtype, raw))


def test_f32_bit_patterns():
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 2**32, size=100000, dtype=np.uint32).view(np.uint8)
    got = hanpu_dequantize(T.F32, raw)
    assert np.array_equal(got.view(np.uint32), raw.view(np.uint32))  # a copy, NaN payloads included


def q8_0_inputs():
    rng = np.random.default_rng(3)
    blocks = [rng.standard_normal((256, 32)) * 10.0 ** rng.uniform(-8, 6, size=(256, 1))]
    blocks.append(np.zeros((1, 32)))                                   # d = 0
    blocks.append(np.arange(-16, 16, dtype=np.float64).reshape(1, 32) + 0.5)  # ties after scaling
    t = np.full((1, 32), 0.5)
    t[0, 0] = 127.0  # d = 1: every other value is exactly k + 0.5
    blocks.append(t)
    blocks.append(np.full((1, 32), 1e-30))                             # d underflows to 0 in f16
    blocks.append(np.full((1, 32), 1e-7))                              # d subnormal in f16
    blocks.append(np.full((1, 32), -3e6))                              # d overflows to inf in f16
    blocks.append(np.full((1, 32), 65504.0 * 127))                     # d at the f16 maximum
    blocks.append(rng.integers(-127, 128, size=(64, 32)).astype(np.float64))  # exact integers
    return np.concatenate(blocks).astype(np.float32)


def test_q8_0_quantize_matches_gguf_py():
    x = q8_0_inputs()
    with np.errstate(all="ignore"):
        want = gguf.quants.quantize(x, T.Q8_0).reshape(-1)
    got = hanpu_quantize_q8_0(x)
    assert got.shape == want.shape
    differ = np.flatnonzero(got != want)
    assert differ.size == 0, f"{differ.size} bytes differ; first at byte {differ[0]} (block {differ[0] // 34})"


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_q5_quantizers_match_gguf_py(qtype):
    """ggml's quantize_row_q5_0_ref / _q5_1_ref (what llama-quantize writes where Q4_K / Q5_K rows are
    not whole 256-blocks): the same bytes as gguf-py's, on the Q8_0 cases plus blocks of one sign,
    constant blocks and values on the 5-bit grid."""
    rng = np.random.default_rng(5)
    x = q8_0_inputs().astype(np.float64)
    extra = [np.abs(rng.standard_normal((16, 32))) + 0.5, -np.abs(rng.standard_normal((16, 32))) - 0.5,
             np.full((1, 32), 0.37), rng.integers(-16, 16, size=(16, 32)) * 0.25]
    x = np.concatenate([x.reshape(-1, 32)] + extra).astype(np.float32)
    finite = np.isfinite(x).all(axis=1) & (np.abs(x).max(axis=1) < 6e4)  # gguf-py's f16 of d, m must not overflow
    x = x[finite]
    with np.errstate(all="ignore"):
        want = gguf.quants.quantize(x, qtype).reshape(-1)
    got = hanpu_quantize(qtype, x)
    bb = GGML_QUANT_SIZES[qtype][1]
    assert got.shape == want.shape
    differ = np.flatnonzero(got != want)
    assert differ.size == 0, f"{differ.size} bytes differ; first at byte {differ[0]} (block {differ[0] // bb})"
    # and the bytes decode to within a step d of x in every block (Q5_0's level 32 is capped at 31;
    # plus the f16 rounding of d and m), so the comparison is not between two broken quantizers
    y = reference_dequantize(qtype, got).reshape(-1, 32).astype(np.float64)
    d = np.abs(got.reshape(-1, bb)[:, 0:2].copy().view(np.float16).astype(np.float64))
    err = np.abs(y - x.astype(np.float64)).max(axis=1, keepdims=True)
    normal = d[:, 0] >= 6.1e-5  # blocks whose f16 d is normal (subnormal ones lose d's precision)
    assert normal.sum() > 100
    assert (err <= 1.01 * d + 2e-3 * np.abs(x).max(axis=1, keepdims=True))[normal].all()
