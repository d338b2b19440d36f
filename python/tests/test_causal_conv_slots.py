"""hanpu._hanpu.causal_conv_slots: vLLM's causal convolution (depthwise, SiLU, no bias) on its
conv-state pool, read and updated in place (the vLLM plugin's GDN layers, docs/VLLM.md), against an
fp64 numpy reference run on the states gathered by hand. Several sequences per call, sequences
continuing their slot's state and ones starting from zeros, tails shorter than the state (1 and 2
tokens with width 4), padding slots, permuted slots, fp32 and bf16 pools and inputs, vLLM's two
conv-state layouts (SD [S,W-1,D]; DS [S,D,W-1] passed as the transposed view)."""

import numpy as np
import pytest

from conftest import needs_torch, torch
from hanpu import _hanpu

SLOTS = 7
W = 4
# (name, slots, sequence lengths, has_initial_state or None (every sequence continues its state))
CASES = [
    ("decode-consecutive", [1, 2, 3, 4], [1, 1, 1, 1], None),
    ("decode-permuted", [5, 0, 3], [1, 1, 1], None),
    ("prefill-mixed-starts", [2, 6, 4], [37, 2, 9], [False, True, True]),
    ("tails-from-zero", [1, 3, 5], [1, 2, 3], [False, False, True]),
    ("padding", [4, -1, 0], [5, 3, 6], [True, True, False]),
    ("one-long", [6], [300], [True]),
    # 64 tokens or more: the passes run on the engine's pool (threads > 1), sequences split over threads
    ("prefill-threads", [0, 5, -1, 2, 3], [40, 30, 10, 1, 2], [False, True, True, False, True]),
]


def reference(x, pool, taps, slots, lengths, has_init):
    """fp64: out rows and the pool after the call."""
    x = x.astype(np.float64)
    pool = pool.astype(np.float64).copy()
    D = x.shape[1]
    out = np.zeros_like(x)
    bos = np.concatenate([[0], np.cumsum(lengths)])
    for n, s in enumerate(slots):
        if s < 0:
            continue
        state = pool[s] if has_init is None or has_init[n] else np.zeros((W - 1, D))
        rows = np.concatenate([state, x[bos[n]:bos[n + 1]]])
        for t in range(lengths[n]):
            acc = (taps.astype(np.float64) * rows[t:t + W]).sum(0)
            out[bos[n] + t] = acc / (1 + np.exp(-acc))
        pool[s] = rows[-(W - 1):]
    return out, pool


def make(lengths, D, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sum(lengths), D)).astype(np.float32)
    pool = rng.standard_normal((SLOTS, W - 1, D)).astype(np.float32)
    taps = (0.5 * rng.standard_normal((W, D))).astype(np.float32)
    return x, pool, taps


def check(out, pool_after, x, pool_before, taps, slots, lengths, has_init, tol):
    ref_out, ref_pool = reference(x, pool_before, taps, slots, lengths, has_init)
    bos = np.concatenate([[0], np.cumsum(lengths)])
    for n, s in enumerate(slots):
        rows = slice(bos[n], bos[n + 1])
        if s < 0:
            assert np.all(out[rows] == 0), f"sequence {n} (padding): out rows not zeroed"
            continue
        np.testing.assert_allclose(out[rows], ref_out[rows], rtol=tol, atol=tol, err_msg=f"sequence {n}: out")
        np.testing.assert_allclose(pool_after[s], ref_pool[s], rtol=tol, atol=tol, err_msg=f"sequence {n}: state")
    for s in set(range(SLOTS)) - {s for s in slots if s >= 0}:
        assert np.array_equal(pool_after[s], pool_before[s]), f"slot {s} (unused) changed"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("D", [40, 13])  # 13: no whole SIMD vector, the scalar tail alone
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_f32_sd_pool(case, D, threads):
    _, slots, lengths, has_init = case
    x, pool, taps = make(lengths, D, seed=len(lengths) + D)
    before = pool.copy()
    out = np.full(x.shape, 7.0, np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    hi = None if has_init is None else np.asarray(has_init)
    _hanpu.causal_conv_slots(x, pool, np.asarray(slots, np.int64), hi, cu, taps, out, threads)
    check(out, pool, x, before, taps, slots, lengths, has_init, 2e-6)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_f32_ds_pool_view(case):
    """vLLM's "DS" layout: the pool is [S,D,W-1]; the plugin passes its transpose (strided rows)."""
    _, slots, lengths, has_init = case
    x, pool, taps = make(lengths, 24, seed=3)
    ds = np.ascontiguousarray(pool.transpose(0, 2, 1))
    before = pool.copy()
    out = np.zeros(x.shape, np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    hi = None if has_init is None else np.asarray(has_init)
    _hanpu.causal_conv_slots(x, ds.transpose(0, 2, 1), np.asarray(slots, np.int32), hi, cu, taps, out, 2)
    check(out, ds.transpose(0, 2, 1), x, before, taps, slots, lengths, has_init, 2e-6)


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bf16_pool_and_inputs_torch(case):
    """bf16 x and a bf16 pool (a bf16 model's, vLLM's default), as torch tensors: out is computed in
    fp32 from the bf16 values; the new states are bf16 inputs, so they are stored exactly."""
    _, slots, lengths, has_init = case
    x, pool, taps = make(lengths, 48, seed=9)
    tx = torch.from_numpy(x).bfloat16()
    tpool = torch.from_numpy(pool).bfloat16()
    before = tpool.float().numpy().copy()
    out = torch.zeros(x.shape, dtype=torch.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    hi = None if has_init is None else np.asarray(has_init)
    _hanpu.causal_conv_slots((tx.view(torch.uint16).numpy(), "bf16"), (tpool.view(torch.uint16).numpy(), "bf16"),
                             np.asarray(slots, np.int64), hi, cu, taps, out.numpy(), 2)
    after = tpool.float().numpy()
    check(out.numpy(), after, tx.float().numpy(), before, taps, slots, lengths, has_init, 2e-6)
    for n, s in enumerate(slots):  # the states are bf16 inputs: bit-exact
        if s >= 0:
            ref = reference(tx.float().numpy(), before, taps, slots, lengths, has_init)[1][s]
            assert np.array_equal(after[s], ref.astype(np.float32)), f"sequence {n}: state not exact"


def test_errors_name_the_argument():
    x, pool, taps = make([3], 8, seed=0)
    out = np.zeros(x.shape, np.float32)
    cu = np.array([0, 3], np.int32)
    slots = np.array([1], np.int64)
    with pytest.raises(ValueError, match="slots\\[0\\] = 7, expected < 7"):
        _hanpu.causal_conv_slots(x, pool, np.array([7], np.int64), None, cu, taps, out, 1)
    with pytest.raises(ValueError, match="'taps'"):
        _hanpu.causal_conv_slots(x, pool, slots, None, cu, taps[:, :5].copy(), out, 1)
    with pytest.raises(ValueError, match="'conv_pool'"):
        _hanpu.causal_conv_slots(x, pool[:, :2], slots, None, cu, taps, out, 1)
    with pytest.raises(ValueError, match="'out'"):
        _hanpu.causal_conv_slots(x, pool, slots, None, cu, taps, out.astype(np.float64), 1)
    with pytest.raises(ValueError, match="'cu_seqlens'.*beyond T = 3"):
        _hanpu.causal_conv_slots(x, pool, slots, None, np.array([0, 4], np.int32), taps, out, 1)
    with pytest.raises(TypeError, match="has_initial_state"):
        _hanpu.causal_conv_slots(x, pool, slots, np.array([1, 0]), cu, taps, out, 1)
    with pytest.raises(ValueError, match="threads: got 0"):
        _hanpu.causal_conv_slots(x, pool, slots, None, cu, taps, out, 0)
    with pytest.raises(ValueError, match="'slots'"):
        _hanpu.causal_conv_slots(x, pool, np.array([1, 2], np.int64), None, cu, taps, out, 1)


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# bf16 rows out (what the vLLM plugin hands the engine with bf16 activations on an AMX CPU): the
# fp32 result, within 2e-6 (1 + |ref|) of the fp64 reference as above, rounded once to nearest
# bf16 (relative error <= 2^-8): |out - ref| <= 2^-8 |ref| + 2e-6 (1 + 2^-8) (1 + |ref|).
BF16_RTOL = 2.0**-8 + 2e-6 * (1 + 2.0**-8)
BF16_ATOL = 2e-6 * (1 + 2.0**-8)


@needs_torch
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("D", [48, 13])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bf16_out_rows(case, D, threads):
    """bf16 x, a bf16 pool and bf16 out, read and written where they are (no fp32 staging)."""
    _, slots, lengths, has_init = case
    x, pool, taps = make(lengths, D, seed=11 + D)
    tx, tpool = torch.from_numpy(x).bfloat16(), torch.from_numpy(pool).bfloat16()
    before = tpool.float().numpy().copy()
    out = np.full(x.shape, 0x4040, np.uint16)  # 3.0 in bf16: padding rows must become zeros
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    hi = None if has_init is None else np.asarray(has_init)
    _hanpu.causal_conv_slots((tx.view(torch.uint16).numpy(), "bf16"), (tpool.view(torch.uint16).numpy(), "bf16"),
                             np.asarray(slots, np.int64), hi, cu, taps, (out, "bf16"), threads)
    xs = tx.float().numpy()
    ref_out, ref_pool = reference(xs, before, taps, slots, lengths, has_init)
    got, after = bf16_bits_to_f32(out), tpool.float().numpy()
    bos = np.concatenate([[0], np.cumsum(lengths)])
    for n, s in enumerate(slots):
        rows = slice(bos[n], bos[n + 1])
        if s < 0:
            assert np.all(got[rows] == 0), f"sequence {n} (padding): out rows not zeroed"
            continue
        np.testing.assert_allclose(got[rows], ref_out[rows], rtol=BF16_RTOL, atol=BF16_ATOL, err_msg=f"sequence {n}")
        assert np.array_equal(after[s], ref_pool[s].astype(np.float32)), f"sequence {n}: state not exact"
    for s in set(range(SLOTS)) - {s for s in slots if s >= 0}:
        assert np.array_equal(after[s], before[s]), f"slot {s} (unused) changed"


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mixed_dtypes(case):
    """Inputs the kernel cannot read in place: f16 x (widened to fp32 first) with an fp32 pool and
    bf16 out; bf16 x with an fp32 pool in the DS layout (strided rows) and fp32 out."""
    _, slots, lengths, has_init = case
    x, pool, taps = make(lengths, 40, seed=5)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    hi = None if has_init is None else np.asarray(has_init)
    x16 = x.astype(np.float16)
    before = pool.copy()
    out = np.zeros(x.shape, np.uint16)
    _hanpu.causal_conv_slots(x16, pool, np.asarray(slots, np.int64), hi, cu, taps, (out, "bf16"), 2)
    ref_out, ref_pool = reference(x16.astype(np.float32), before, taps, slots, lengths, has_init)
    bos = np.concatenate([[0], np.cumsum(lengths)])
    for n, s in enumerate(slots):
        if s >= 0:
            rows = slice(bos[n], bos[n + 1])
            np.testing.assert_allclose(bf16_bits_to_f32(out[rows]), ref_out[rows], rtol=BF16_RTOL, atol=BF16_ATOL)
            assert np.array_equal(pool[s], ref_pool[s].astype(np.float32)), f"sequence {n}: f16 rows in an fp32 pool"
    tx = torch.from_numpy(x).bfloat16()
    ds = np.ascontiguousarray(before.transpose(0, 2, 1))
    out32 = np.zeros(x.shape, np.float32)
    _hanpu.causal_conv_slots((tx.view(torch.uint16).numpy(), "bf16"), ds.transpose(0, 2, 1), np.asarray(slots, np.int64),
                             hi, cu, taps, out32, 1)
    check(out32, ds.transpose(0, 2, 1), tx.float().numpy(), before, taps, slots, lengths, has_init, 2e-6)


def test_silu_of_large_negative_sums():
    """The sigmoid's exp argument is clamped at 80: below -80 the output is acc / (1 + e^80), within
    1e-33 |acc| of silu(acc) (which underflows to zero or a denormal)."""
    D = 37
    x = np.full((2, D), -30.0, np.float32)
    x[:, ::2] = 30.0
    pool = np.zeros((1, W - 1, D), np.float32)
    taps = np.full((W, D), 4.0, np.float32)  # acc = +-120 at the second token, +-240 later
    out = np.zeros(x.shape, np.float32)
    _hanpu.causal_conv_slots(x, pool, np.array([0], np.int64), None, np.array([0, 2], np.int32), taps, out, 1)
    acc = np.array([x[0] * 4, x[0] * 8])
    ref = acc / (1 + np.exp(-acc.astype(np.float64)))
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-30)
    assert np.all(np.isfinite(out))
