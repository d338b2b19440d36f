"""The FLA-named functions against the package's fp64 reference (hanpu.reference): shapes with
tails, odd head dims, GVA, varlen, state in/out and the V-first state layout, every in-kernel
option, decode after prefill, f16/bf16 inputs, numpy and torch."""

import json

import numpy as np
import pytest

import hanpu
from conftest import NMSE_BOUND, make_inputs, ml_dtypes, needs_torch, nmse, torch

CHUNK = {"gdn": hanpu.chunk_gated_delta_rule, "kda": hanpu.chunk_kda}
RECURRENT = {"gdn": hanpu.fused_recurrent_gated_delta_rule, "kda": hanpu.fused_recurrent_kda}
REFERENCE = {"gdn": hanpu.reference.gated_delta_rule, "kda": hanpu.reference.kda}


def call(fn, x, **kw):
    """Calls an FLA-named function with the inputs of make_inputs by keyword (the recurrent GDN
    function takes beta after gk/gv, so positional calls would differ)."""
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    for n in ("initial_state", "A_log", "dt_bias", "cu_seqlens"):
        if n in x:
            args[n] = x[n]
    return fn(**args, **kw)


def reference(variant, x, **kw):
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    for n in ("initial_state", "A_log", "dt_bias", "cu_seqlens"):
        if n in x:
            args[n] = x[n]
    return REFERENCE[variant](**args, **kw)


# (B, T, H, HV, K, V, cu_seqlens): T not a multiple of 64, odd head dims, GVA 2x and 4x, varlen
# with a one-token and an empty sequence, a single token.
SHAPES = {
    "tails-odd-dims": (2, 100, 2, 2, 60, 100, None),
    "gva2": (1, 130, 2, 4, 64, 64, None),
    "gva4-odd": (2, 65, 1, 4, 32, 48, None),
    "varlen": (1, 300, 2, 4, 60, 100, [0, 15, 100, 101, 101, 300]),
    "one-token": (3, 1, 2, 2, 16, 16, None),
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_matches_fp64_reference(variant, mode, shape):
    B, T, H, HV, K, V, cu = SHAPES[shape]
    N = len(cu) - 1 if cu else B
    x = make_inputs(variant, B, T, H, HV, K, V, seed=list(SHAPES).index(shape), N=N)
    if cu:
        x["cu_seqlens"] = np.asarray(cu, dtype=np.int64)
    fn = (CHUNK if mode == "chunk" else RECURRENT)[variant]
    o, ht = call(fn, x, output_final_state=True)
    ro, rht = reference(variant, x)
    assert o.shape == (B, T, HV, V) and o.dtype == np.float32
    assert ht.shape == (N, HV, K, V) and ht.dtype == np.float32
    assert nmse(o, ro) <= NMSE_BOUND["float32"]
    assert nmse(ht, rht) <= NMSE_BOUND["float32"]


@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_no_initial_state_no_final_state(variant):
    x = make_inputs(variant, 2, 70, 2, 2, 32, 32, h0=False)
    o, ht = call(CHUNK[variant], x)
    assert ht is None
    assert nmse(o, reference(variant, x)[0]) <= NMSE_BOUND["float32"]


def test_int32_cu_seqlens_and_list():
    x = make_inputs("gdn", 1, 90, 2, 2, 32, 32, N=3)
    ref = reference("gdn", dict(x, cu_seqlens=np.array([0, 10, 50, 90], np.int64)))
    for cu in (np.array([0, 10, 50, 90], np.int32), [0, 10, 50, 90]):
        o, ht = call(CHUNK["gdn"], dict(x, cu_seqlens=cu), output_final_state=True)
        assert nmse(o, ref[0]) <= NMSE_BOUND["float32"] and nmse(ht, ref[1]) <= NMSE_BOUND["float32"]


# Every in-kernel option (docs/PYTHON.md), alone and all together.
OPTIONS = {
    "scale": dict(scale=0.3),
    "l2norm": dict(use_qk_l2norm_in_kernel=True),
    "beta_sigmoid": dict(use_beta_sigmoid_in_kernel=True),
    "neg_eigval": dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    "gate": dict(use_gate_in_kernel=True),
    "gate-no-dt_bias": dict(use_gate_in_kernel=True),
    "all": dict(scale=0.5, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                use_gate_in_kernel=True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_in_kernel_options(variant, mode, option):
    kw = OPTIONS[option]
    gate = kw.get("use_gate_in_kernel", False)
    x = make_inputs(variant, 1, 80, 2, 4, 48, 40, seed=7, raw_gate=gate)
    if option == "gate-no-dt_bias":
        del x["dt_bias"]
    if kw.get("use_beta_sigmoid_in_kernel"):
        x["beta"] = np.random.default_rng(3).standard_normal(x["beta"].shape).astype(np.float32)  # raw logits
    if kw.get("use_qk_l2norm_in_kernel"):
        x["k"] = (x["k"] * 3).astype(np.float32)  # un-normalized: the kernel must normalize
    fn = (CHUNK if mode == "chunk" else RECURRENT)[variant]
    o, ht = call(fn, x, output_final_state=True, **kw)
    ro, rht = reference(variant, x, **kw)
    assert nmse(o, ro) <= NMSE_BOUND["float32"]
    assert nmse(ht, rht) <= NMSE_BOUND["float32"]


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_state_v_first(variant, mode):
    """state_v_first takes and returns [N,HV,V,K]: the transpose of the default layout."""
    x = make_inputs(variant, 1, 150, 2, 4, 60, 36, N=2)
    x["cu_seqlens"] = np.array([0, 70, 150])
    fn = (CHUNK if mode == "chunk" else RECURRENT)[variant]
    o, ht = call(fn, x, output_final_state=True)
    xv = dict(x, initial_state=np.ascontiguousarray(np.swapaxes(x["initial_state"], -1, -2)))
    ov, htv = call(fn, xv, output_final_state=True, state_v_first=True)
    assert htv.shape == (2, 4, 36, 60)
    np.testing.assert_allclose(ov, o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(htv, np.swapaxes(ht, -1, -2), rtol=1e-5, atol=1e-5)
    ro, rht = reference(variant, xv, state_v_first=True)
    assert nmse(htv, rht) <= NMSE_BOUND["float32"] and nmse(ov, ro) <= NMSE_BOUND["float32"]
    with pytest.warns(DeprecationWarning):
        o2, _ = call(fn, xv, transpose_state_layout=True)
    np.testing.assert_array_equal(o2, ov)


@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_decode_after_prefill_equals_longer_prefill(variant, state_v_first):
    """chunk over 100 tokens, then 3 single-token fused_recurrent steps from its final state: the
    same outputs and state as one chunk call over 103 tokens (the FLA layers' prefill->decode)."""
    T0, steps = 100, 3
    x = make_inputs(variant, 2, T0 + steps, 2, 4, 64, 64, seed=11, h0=False)
    full_o, full_ht = call(CHUNK[variant], x, output_final_state=True, state_v_first=state_v_first)
    head = {n: a[:, :T0] for n, a in x.items()}
    o, state = call(CHUNK[variant], head, output_final_state=True, state_v_first=state_v_first)
    assert nmse(o, full_o[:, :T0]) <= NMSE_BOUND["float32"]
    for t in range(T0, T0 + steps):
        step = {n: a[:, t:t + 1] for n, a in x.items()}
        o_t, state = call(RECURRENT[variant], dict(step, initial_state=state), output_final_state=True,
                          state_v_first=state_v_first)
        assert nmse(o_t, full_o[:, t:t + 1]) <= NMSE_BOUND["float32"]
    assert nmse(state, full_ht) <= NMSE_BOUND["float32"]


def test_fused_recurrent_gdn_defaults_and_gk():
    """g=None: no decay; beta=None: ones; gk (per-key-channel decay) adds to g: KDA's recurrence."""
    x = make_inputs("kda", 1, 40, 2, 2, 32, 32, seed=5)
    q, k, v, gk, h0 = x["q"], x["k"], x["v"], x["g"], x["initial_state"]
    zeros = np.zeros(v.shape[:3], np.float32)
    ones = np.ones(v.shape[:3], np.float32)
    o, _ = hanpu.fused_recurrent_gated_delta_rule(q, k, v, initial_state=h0)
    assert nmse(o, hanpu.reference.gated_delta_rule(q, k, v, zeros, ones, initial_state=h0)[0]) <= 1e-10
    g = np.log(np.full(v.shape[:3], 0.9, np.float32))
    o, ht = hanpu.fused_recurrent_gated_delta_rule(q, k, v, g=g, gk=gk, beta=x["beta"], initial_state=h0,
                                                   output_final_state=True)
    ro, rht = hanpu.reference.kda(q, k, v, gk + g[..., None], x["beta"], initial_state=h0)
    assert nmse(o, ro) <= 1e-10 and nmse(ht, rht) <= 1e-10


def test_read_only_and_strided_numpy_inputs():
    """Inputs are read in place: read-only arrays and non-contiguous views (here q, k, v slices of
    one fused projection, as models produce them) give the same result as contiguous copies."""
    B, T, H, K, V = 1, 90, 2, 32, 48
    rng = np.random.default_rng(2)
    fused = rng.standard_normal((B, T, H, 2 * K + V)).astype(np.float32)
    fused[..., K:2 * K] /= np.linalg.norm(fused[..., K:2 * K], axis=-1, keepdims=True)
    q, k, v = fused[..., :K], fused[..., K:2 * K], fused[..., 2 * K:]
    g = np.log(np.full((B, T, H), 0.95, np.float32))
    beta = np.full((B, T, H), 0.6, np.float32)
    for a in (fused, g, beta):
        a.setflags(write=False)
    o, _ = hanpu.chunk_gated_delta_rule(q, k, v, g, beta)
    o_c, _ = hanpu.chunk_gated_delta_rule(*map(np.ascontiguousarray, (q, k, v, g, beta)))
    np.testing.assert_array_equal(o, o_c)
    o_r, _ = hanpu.chunk_gated_delta_rule(q[:, ::-1], k[:, ::-1], v[:, ::-1], g[:, ::-1], beta[:, ::-1])
    o_rc, _ = hanpu.chunk_gated_delta_rule(*(np.ascontiguousarray(a[:, ::-1]) for a in (q, k, v, g, beta)))
    np.testing.assert_array_equal(o_r, o_rc)


def test_threads():
    x = make_inputs("gdn", 1, 200, 2, 4, 64, 64)
    default = hanpu.get_num_threads()
    assert default >= 1
    o_all, _ = call(CHUNK["gdn"], x)
    try:
        hanpu.set_num_threads(1)
        assert hanpu.get_num_threads() == 1
        o_one, _ = call(CHUNK["gdn"], x)
    finally:
        hanpu.ops._num_threads = 0
    assert hanpu.get_num_threads() == default
    assert nmse(o_one, o_all) <= 1e-12
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError):
            hanpu.set_num_threads(bad)


# ---- reduced precision ------------------------------------------------------------------------

def _rounded(x, torch_dtype):
    return {n: torch.from_numpy(a).to(torch_dtype) if n in ("q", "k", "v") else torch.from_numpy(a)
            for n, a in x.items()}


@needs_torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_half_precision_inputs(variant, mode, dtype):
    """q, k, v in f16/bf16 (g, beta, h0 fp32, as FLA's tests): o in q's dtype (chunk) or v's
    (recurrent), within the NMSE bound of the fp64 reference on the same rounded inputs."""
    td = getattr(torch, dtype)
    x = _rounded(make_inputs(variant, 2, 100, 2, 4, 60, 100, seed=9), td)
    fn = (CHUNK if mode == "chunk" else RECURRENT)[variant]
    o, ht = call(fn, x, output_final_state=True)
    assert o.dtype == td and ht.dtype == torch.float32
    ro, rht = reference(variant, x)
    assert nmse(o, ro) <= NMSE_BOUND[dtype]
    assert nmse(ht, rht) <= NMSE_BOUND["float32"]


@needs_torch
def test_all_bf16_inputs():
    """Everything bf16 (g, beta and the initial state too), as models call it."""
    x = {n: torch.from_numpy(a).to(torch.bfloat16) for n, a in make_inputs("gdn", 1, 130, 2, 4, 64, 64).items()}
    o, ht = call(CHUNK["gdn"], x, output_final_state=True)
    ro, rht = reference("gdn", x)
    assert nmse(o, ro) <= NMSE_BOUND["bfloat16"] and nmse(ht, rht) <= NMSE_BOUND["float32"]


@pytest.mark.parametrize("variant,dtype,bound", [
    pytest.param("kda", np.float16, "float16", id="kda-float16"),
    pytest.param("gdn", ml_dtypes.bfloat16 if ml_dtypes is not None else None, "bfloat16",
                 marks=pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed"),
                 id="gdn-bfloat16-ml_dtypes"),
])
def test_half_precision_numpy(variant, dtype, bound):
    """q, k, v as numpy float16 or ml_dtypes bfloat16: o comes back in the same dtype."""
    x = make_inputs(variant, 1, 70, 1, 2, 32, 32)
    for n in ("q", "k", "v"):
        x[n] = x[n].astype(dtype)
    o, _ = call(CHUNK[variant], x)
    assert o.dtype == dtype
    assert nmse(o.astype(np.float32), reference(variant, x)[0]) <= NMSE_BOUND[bound]


# ---- numpy and torch --------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_numpy_and_torch_give_the_same_results(variant, mode):
    x = make_inputs(variant, 1, 140, 2, 4, 60, 40, N=2, raw_gate=True)
    x["cu_seqlens"] = np.array([0, 64, 140], np.int64)
    fn = (CHUNK if mode == "chunk" else RECURRENT)[variant]
    kw = dict(output_final_state=True, use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)
    o_np, ht_np = call(fn, x, **kw)
    xt = {n: torch.from_numpy(a) for n, a in x.items()}
    o_t, ht_t = call(fn, xt, **kw)
    assert isinstance(o_t, torch.Tensor) and isinstance(ht_t, torch.Tensor)
    np.testing.assert_array_equal(o_t.numpy(), o_np)
    np.testing.assert_array_equal(ht_t.numpy(), ht_np)


@needs_torch
def test_torch_non_contiguous_and_requires_grad():
    x = make_inputs("gdn", 2, 80, 2, 2, 32, 32)
    ref, _ = call(CHUNK["gdn"], x)
    # [B,H,T,K] storage viewed as [B,T,H,K] (FLA's old head-first layout, transposed by the caller)
    xt = {n: torch.from_numpy(np.ascontiguousarray(np.swapaxes(a, 1, 2))).transpose(1, 2) if a.ndim == 4
          else torch.from_numpy(a) for n, a in x.items()}
    xt["q"].requires_grad_(True)
    assert not xt["q"].is_contiguous()
    o, _ = call(CHUNK["gdn"], xt)
    np.testing.assert_array_equal(o.numpy(), ref)
    assert not o.requires_grad


@needs_torch
def test_state_v_first_bf16_initial_state():
    """A V-first state of another dtype than fp32 takes the converting copy."""
    x = {n: torch.from_numpy(a) for n, a in make_inputs("gdn", 1, 70, 2, 2, 32, 48).items()}
    x["initial_state"] = x["initial_state"].to(torch.bfloat16)
    o, ht = call(CHUNK["gdn"], x, output_final_state=True)
    xv = dict(x, initial_state=x["initial_state"].transpose(-1, -2).contiguous())
    ov, htv = call(CHUNK["gdn"], xv, output_final_state=True, state_v_first=True)
    np.testing.assert_array_equal(ov.numpy(), o.numpy())
    np.testing.assert_array_equal(htv.transpose(-1, -2).numpy(), ht.numpy())


def test_outputs_are_aligned():
    """o starts on a cache line (a huge page when large): the engine writes it row by row."""
    x = make_inputs("gdn", 1, 3, 2, 2, 16, 16)
    o, ht = call(CHUNK["gdn"], x, output_final_state=True)
    assert o.ctypes.data % 64 == 0 and ht.ctypes.data % 64 == 0
    big = make_inputs("gdn", 1, 2048, 4, 4, 128, 128, h0=False)  # o is 16 MiB
    o, _ = call(RECURRENT["gdn"], {n: a[:, :1] for n, a in big.items()})
    assert o.ctypes.data % 64 == 0
    if torch is not None:
        from hanpu._arrays import empty_like_kind
        t = empty_like_kind(torch.zeros(1), (2048, 4, 4, 128), dtype_of=torch.zeros(1, dtype=torch.bfloat16))
        assert t.dtype == torch.bfloat16 and t.shape == (2048, 4, 4, 128) and t.data_ptr() % (2 << 20) == 0


@pytest.mark.parametrize("strategy", ["hanpu", "fla", "fla+mapping"])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_plan_keyword_runs_a_given_host_plan(variant, strategy):
    # plan=: a plan made for these shapes on the host runs as given (here on 3 cores, 2 value heads
    # per key head: tier-2 column blocks), as a dict or as JSON text, and matches the reference.
    x = make_inputs(variant, 1, 150, 1, 2, 32, 48, seed=21)
    p = hanpu.plan(device="host", variant=variant, T=150, heads=1, value_heads=2, K=32, V=48, strategy=strategy,
                   cores=3)
    ro, rht = reference(variant, x)
    for given in (p, json.dumps(p)):
        o, ht = call(CHUNK[variant], x, output_final_state=True, plan=given)
        assert nmse(o, ro) <= NMSE_BOUND["float32"]
        assert nmse(ht, rht) <= NMSE_BOUND["float32"]


def test_plan_keyword_refuses_a_plan_for_other_shapes_or_one_the_cpu_cannot_run():
    x = make_inputs("gdn", 1, 150, 1, 2, 32, 48, seed=22)
    other = hanpu.plan(device="host", variant="gdn", T=151, heads=1, value_heads=2, K=32, V=48, cores=2)
    with pytest.raises(ValueError, match=r"sequence lengths are \[151\] in the plan, \[150\] in the inputs"):
        call(CHUNK["gdn"], x, plan=other)
    segment = hanpu.plan(device="host", variant="gdn", T=150, heads=1, value_heads=2, K=32, V=48,
                         strategy="flashqla", cores=2)
    with pytest.raises(ValueError, match=r"\.parallel: got \"segment\""):
        call(CHUNK["gdn"], x, plan=segment)
    npu = hanpu.plan(device="ascend310p", variant="gdn", T=150, heads=1, value_heads=2, K=32, V=48, cores=2)
    with pytest.raises(ValueError, match=r"plan\.layouts\.\w+: got blocked"):
        call(CHUNK["gdn"], x, plan=npu)
    with pytest.raises(TypeError, match="`plan` must be a dict"):
        call(CHUNK["gdn"], x, plan=3)
