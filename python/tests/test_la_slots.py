"""hanpu._hanpu.la_slots: GDN/KDA on states kept in a slot pool (vLLM's recurrent-state cache,
hanpu.integrations.vllm), read and updated in place, against the fp64 reference run on the same
states gathered by hand. Slot orders that make one view of the pool (consecutive, strided, one
sequence) and ones that do not (permuted), padding slots, sequences starting from zero
(has_initial_state False), decode tokens and prefill chunks in one call, fp32 and bf16 pools."""

import numpy as np
import pytest

import hanpu
from conftest import NMSE_BOUND, needs_torch, nmse, torch
from hanpu import _hanpu

SLOTS = 9
# (name, slots, sequence lengths, has_initial_state or None): the lengths mix single decode tokens
# (the token-by-token path) with prefill chunks (the chunked path, 70 tokens: one whole chunk and a
# tail), so one call runs both paths on one pool.
CASES = [
    ("permuted-mixed", [5, 2, 7, 0], [1, 1, 70, 3], [True, True, False, True]),
    ("consecutive-decode", [1, 2, 3, 4], [1, 1, 1, 1], None),
    ("strided-prefill", [0, 3, 6], [20, 70, 1], [False, True, True]),
    ("padding", [4, -1, 8], [1, 5, 66], [True, True, False]),
    ("one-sequence", [6], [130], [True]),
]


def make_case(variant, lengths, K=32, V=48, H=2, HV=4, seed=0):
    rng = np.random.default_rng(seed)
    T = sum(lengths)
    x = {
        "q": rng.standard_normal((1, T, H, K)).astype(np.float32),
        "k": rng.standard_normal((1, T, H, K)).astype(np.float32),
        "v": rng.standard_normal((1, T, HV, V)).astype(np.float32),
        # raw gate and beta: the in-kernel gate and sigmoid, as the vLLM layer passes them
        "g": rng.standard_normal((1, T, HV) if variant == "gdn" else (1, T, HV, K)).astype(np.float32),
        "beta": rng.standard_normal((1, T, HV)).astype(np.float32),
        "A_log": np.log(rng.uniform(0.5, 4.0, HV)).astype(np.float32),
        "dt_bias": rng.standard_normal(HV if variant == "gdn" else HV * K).astype(np.float32),
        "cu_seqlens": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
    }
    pool = (0.1 * rng.standard_normal((SLOTS, HV, K, V))).astype(np.float32)
    return x, pool


def run_reference(variant, x, pool, slots, has_init):
    """The fp64 reference on the states gathered from the pool (zero where a sequence starts)."""
    N = len(slots)
    HV, K, V = pool.shape[1:]
    h0 = np.zeros((N, HV, K, V), np.float32)
    for n, s in enumerate(slots):
        if s >= 0 and (has_init is None or has_init[n]):
            h0[n] = pool[s]
    fn = hanpu.reference.gated_delta_rule if variant == "gdn" else hanpu.reference.kda
    return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0, cu_seqlens=x["cu_seqlens"],
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
              use_beta_sigmoid_in_kernel=True)


def call(variant, x, pool, slots, has_init, o, path="auto"):
    _hanpu.la_slots(variant, x["q"], x["k"], x["v"], x["g"], x["beta"], pool, slots, has_init, x["cu_seqlens"],
                    x["A_log"], x["dt_bias"], o, None, True, True, True, False, path, 2)


def check(variant, x, pool_before, pool_after_f32, o, slots, has_init, bound):
    ref_o, ref_ht = run_reference(variant, x, pool_before, slots, has_init)
    cu = x["cu_seqlens"]
    for n, s in enumerate(slots):
        rows = slice(cu[n], cu[n + 1])
        if s < 0:  # padding: outputs and every slot untouched
            assert np.all(o[0, rows] == 7.0), f"sequence {n} (padding) wrote outputs"
            continue
        assert nmse(o[0, rows], ref_o[0, rows]) < bound, f"sequence {n} (slot {s}): o"
        assert nmse(pool_after_f32[s], ref_ht[n]) < bound, f"sequence {n} (slot {s}): state"
    for s in set(range(SLOTS)) - {s for s in slots if s >= 0}:
        assert np.array_equal(pool_after_f32[s], pool_before[s]), f"slot {s} (unused) changed"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_f32_pool_in_place(variant, case):
    _, slots, lengths, has_init = case
    x, pool = make_case(variant, lengths, seed=len(lengths))
    before = pool.copy()
    o = np.full((1, sum(lengths), 4, 48), 7.0, np.float32)
    address = pool.ctypes.data
    call(variant, x, pool, np.asarray(slots, np.int64), None if has_init is None else np.asarray(has_init), o)
    assert pool.ctypes.data == address
    check(variant, x, before, pool, o, slots, has_init, NMSE_BOUND["float32"])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kda_safe_gate_lower_bound(case):
    """KDA with Ling's safe gate (lower_bound * sigmoid(exp(A_log) (g + dt_bias)), the vLLM plugin's
    Ling layer) at the Ling golden's KDA shape (3 heads of 24)."""
    _, slots, lengths, has_init = case
    x, pool = make_case("kda", lengths, K=24, V=24, H=3, HV=3, seed=3)
    before = pool.copy()
    o = np.full((1, sum(lengths), 3, 24), 7.0, np.float32)
    hi = None if has_init is None else np.asarray(has_init)
    _hanpu.la_slots("kda", x["q"], x["k"], x["v"], x["g"], x["beta"], pool, np.asarray(slots, np.int64), hi,
                    x["cu_seqlens"], x["A_log"], x["dt_bias"], o, None, True, True, True, False, "auto", 2,
                    lower_bound=-5.0)
    N = len(slots)
    h0 = np.zeros((N, 3, 24, 24), np.float32)
    for n, s in enumerate(slots):
        if s >= 0 and (has_init is None or has_init[n]):
            h0[n] = before[s]
    ref_o, ref_ht = hanpu.reference.kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0,
                                        cu_seqlens=x["cu_seqlens"], use_qk_l2norm_in_kernel=True,
                                        use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                        use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)
    cu = x["cu_seqlens"]
    for n, s in enumerate(slots):
        if s < 0:
            continue
        rows = slice(cu[n], cu[n + 1])
        assert nmse(o[0, rows], ref_o[0, rows]) < NMSE_BOUND["float32"], f"sequence {n} (slot {s}): o"
        assert nmse(pool[s], ref_ht[n]) < NMSE_BOUND["float32"], f"sequence {n} (slot {s}): state"


@pytest.mark.parametrize("path", ["recurrent", "hanpu"])
def test_forced_paths_agree(path):
    """Each path alone (the "auto" choice per run is covered above) gives the reference result."""
    _, slots, lengths, has_init = CASES[0]
    x, pool = make_case("gdn", lengths, seed=11)
    before = pool.copy()
    o = np.full((1, sum(lengths), 4, 48), 7.0, np.float32)
    call("gdn", x, pool, np.asarray(slots, np.int32), np.asarray(has_init), o, path=path)
    check("gdn", x, before, pool, o, slots, has_init, NMSE_BOUND["float32"])


@needs_torch
@pytest.mark.parametrize("K,V", [(32, 48), (16, 24)])  # (16, 24): the Qwen3.5-MoE golden's GDN heads
@pytest.mark.parametrize("variant", ["gdn", "kda"])
def test_bf16_pool_and_inputs_torch(variant, K, V):
    """A bf16 state pool (vLLM's default state dtype for bf16 models without mamba_ssm_dtype) and
    bf16 q/k/v, as torch tensors; the pool in vLLM's declared [S,HV,V,K] shape viewed as [S,HV,K,V]."""
    _, slots, lengths, has_init = CASES[0]
    x, pool = make_case(variant, lengths, K=K, V=V, seed=5)
    tx = {n: torch.from_numpy(a) for n, a in x.items()}
    for n in ("q", "k", "v"):
        tx[n] = tx[n].bfloat16()
    declared = torch.from_numpy(pool).bfloat16().transpose(-1, -2).contiguous()  # [S,HV,V,K] storage
    view = declared.view(SLOTS, 4, K, V)  # what vLLM's kernels (and hanpu) read: [S,HV,K,V]
    view.copy_(torch.from_numpy(pool).bfloat16())
    before = view.float().numpy().copy()
    o = torch.full((1, sum(lengths), 4, V), 7.0, dtype=torch.bfloat16)
    _hanpu.la_slots(variant, tx["q"], tx["k"], tx["v"], tx["g"], tx["beta"], view, torch.tensor(slots, dtype=torch.int32),
                    torch.tensor(has_init), tx["cu_seqlens"], tx["A_log"], tx["dt_bias"], o, None, True, True, True,
                    False, "auto", 2)
    rx = dict(x, q=tx["q"], k=tx["k"], v=tx["v"])
    check(variant, rx, before, view.float().numpy(), o.float().numpy(), slots, has_init, NMSE_BOUND["bfloat16"])


def test_bad_slots_and_flags_are_named():
    x, pool = make_case("gdn", [1, 2])
    o = np.zeros((1, 3, 4, 48), np.float32)
    with pytest.raises(ValueError, match=r"slots\[1\] = 9, expected < 9"):
        call("gdn", x, pool, np.asarray([0, 9]), None, o)
    with pytest.raises(ValueError, match=r"'slots': expected int32/int64 \[N\] with N = 2"):
        call("gdn", x, pool, np.asarray([0]), None, o)
    with pytest.raises(TypeError, match="'has_initial_state'"):
        call("gdn", x, pool, np.asarray([0, 1]), np.asarray([1, 0], np.int32), o)
    with pytest.raises(ValueError, match="'state_pool'"):
        call("gdn", x, pool[0], np.asarray([0, 1]), None, o)
    with pytest.raises(ValueError, match='path: got "fla"'):
        call("gdn", x, pool, np.asarray([0, 1]), None, o, path="fla")


# The chunked runs' GEMMs on AMX (amx="split" / "round", what the vLLM plugin asks for with bf16
# rows): bounds of docs/ACCURACY.md ("The engine's GEMMs on AMX"): Split keeps every bf16 path's
# bounds (o 1e-5, states 1e-10), Round (bf16 operands, FLA's arithmetic) 1e-4 for both. On a CPU
# without usable AMX the same call runs the f32 engine and says why.
AMX_BOUND = {"split": (NMSE_BOUND["bfloat16"], NMSE_BOUND["float32"]), "round": (1e-4, 1e-4)}


@needs_torch
@pytest.mark.parametrize("K,V,H,HV", [(64, 64, 2, 4), (128, 128, 2, 2), (60, 33, 1, 2)])
@pytest.mark.parametrize("amx", ["split", "round"])
def test_gdn_bf16_rows_with_amx_gemms(amx, K, V, H, HV):
    slots, lengths, has_init = [5, 2, 7, 0, 3], [1, 70, 130, 1, 33], [True, False, True, True, False]
    x, pool = make_case("gdn", lengths, K=K, V=V, H=H, HV=HV, seed=K + V)
    tx = {n: torch.from_numpy(a) for n, a in x.items()}
    for n in ("q", "k", "v"):
        tx[n] = tx[n].bfloat16()
    before = pool.copy()
    o = np.full((1, sum(lengths), HV, V), 7.0, np.float32)
    ran = _hanpu.la_slots("gdn", tx["q"], tx["k"], tx["v"], x["g"], x["beta"], pool, np.asarray(slots, np.int32),
                          np.asarray(has_init), x["cu_seqlens"], x["A_log"], x["dt_bias"], o, None, True, True, True,
                          False, "auto", 2, amx=amx)
    if _hanpu.la_amx_usable():
        assert ran == f"amx-{amx}"
    else:
        assert ran.startswith("f32 (amx: no usable AMX-BF16"), ran
    rx = dict(x, q=tx["q"].float().numpy(), k=tx["k"].float().numpy(), v=tx["v"].float().numpy())
    o_bound, state_bound = AMX_BOUND[amx]
    ref_o, ref_ht = run_reference("gdn", rx, before, slots, has_init)
    cu = x["cu_seqlens"]
    for n, s in enumerate(slots):
        rows = slice(cu[n], cu[n + 1])
        assert nmse(o[0, rows], ref_o[0, rows]) < o_bound, f"sequence {n} (slot {s}): o"
        assert nmse(pool[s], ref_ht[n]) < state_bound, f"sequence {n} (slot {s}): state"


def test_amx_setting_and_report():
    """amx="off" (the default) runs the f32 engine; every sequence token by token reports None; a bad
    setting is named."""
    x, pool = make_case("gdn", [1, 70])
    o = np.zeros((1, 71, 4, 48), np.float32)
    args = ("gdn", x["q"], x["k"], x["v"], x["g"], x["beta"], pool, np.asarray([0, 1]), None, x["cu_seqlens"],
            x["A_log"], x["dt_bias"], o, None, True, True, True, False)
    assert _hanpu.la_slots(*args, "auto", 2) == "f32"
    assert _hanpu.la_slots(*args, "recurrent", 2, amx="split") is None
    # f32 q and k: the AMX GEMMs need bf16 rows
    assert _hanpu.la_slots(*args, "auto", 2, amx="split").startswith("f32 (amx: ")
    with pytest.raises(ValueError, match='amx: got "fast"'):
        _hanpu.la_slots(*args, "auto", 2, amx="fast")


@needs_torch
def test_on_torch_openmp_team():
    """The engine's parallel runs on torch's OpenMP team (the vLLM plugin's setting): the same results
    as on hanpu's pool, for the chunked and the token-by-token path and the convolution."""
    from hanpu.integrations.vllm.gdn import _torch_openmp_path

    path = _torch_openmp_path()
    assert path is not None, "torch loaded no OpenMP runtime"
    with pytest.raises(ValueError, match="is not loaded in this process"):
        _hanpu.use_openmp_team("/nonexistent/libgomp.so.1")
    torch.set_num_threads(2)
    assert _hanpu.use_openmp_team(path)
    try:
        for variant in ("gdn", "kda"):
            for _, slots, lengths, has_init in CASES:
                x, pool = make_case(variant, lengths, seed=7)
                before = pool.copy()
                o = np.full((1, sum(lengths), 4, 48), 7.0, np.float32)
                call(variant, x, pool, np.asarray(slots, np.int64), None if has_init is None else np.asarray(has_init), o)
                check(variant, x, before, pool, o, slots, has_init, NMSE_BOUND["float32"])
        # the convolution, 70 tokens over three sequences on 2 threads
        rng = np.random.default_rng(1)
        lengths, slots = [40, 1, 29], [3, 0, 5]
        xc = rng.standard_normal((70, 24)).astype(np.float32)
        cpool = rng.standard_normal((6, 3, 24)).astype(np.float32)
        taps = rng.standard_normal((4, 24)).astype(np.float32)
        out_team, pool_team = np.zeros_like(xc), cpool.copy()
        cu = np.array([0, 40, 41, 70], np.int32)
        _hanpu.causal_conv_slots(xc, pool_team, np.asarray(slots, np.int32), None, cu, taps, out_team, 2)
    finally:
        assert not _hanpu.use_openmp_team(None)
    out_pool, pool_pool = np.zeros_like(xc), cpool.copy()
    _hanpu.causal_conv_slots(xc, pool_pool, np.asarray(slots, np.int32), None, cu, taps, out_pool, 2)
    assert np.array_equal(out_team, out_pool) and np.array_equal(pool_team, pool_pool)
