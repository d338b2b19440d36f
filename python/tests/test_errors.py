"""Bad inputs raise ValueError (FLA's messages where FLA checks; hanpu.HanpuError, a ValueError
naming the tensor, for the engine's checks) or TypeError (wrong types/dtypes, unknown keyword
arguments); options hanpu does not implement raise NotImplementedError naming the option."""

import numpy as np
import pytest

import hanpu
from conftest import make_inputs, needs_torch, torch


def gdn(**over):
    x = make_inputs("gdn", 1, 20, 2, 4, 16, 16, h0=False)
    x.update(over)
    return x


def kda(**over):
    x = make_inputs("kda", 1, 20, 2, 4, 16, 16, h0=False)
    x.update(over)
    return x


def test_fla_checks_with_fla_messages():
    x = gdn()
    with pytest.raises(ValueError, match=r"q and k must have the same number of heads"):
        hanpu.chunk_gated_delta_rule(**dict(x, k=x["k"][:, :, :1]))
    with pytest.raises(ValueError, match=r"num_v_heads \(HV=3\) must be evenly divisible by num_heads \(H=2\)"):
        hanpu.chunk_gated_delta_rule(**dict(x, v=x["v"][:, :, :3]))
    x2 = make_inputs("gdn", 2, 20, 2, 2, 16, 16)
    with pytest.raises(ValueError, match=r"batch size is expected to be 1 rather than 2 when using `cu_seqlens`"):
        hanpu.chunk_gated_delta_rule(**x2, cu_seqlens=np.array([0, 20]))
    with pytest.raises(ValueError, match=r"i\.e\., 2 rather than 1"):
        hanpu.fused_recurrent_kda(**make_inputs("kda", 1, 20, 2, 2, 16, 16), cu_seqlens=np.array([0, 5, 20]))
    with pytest.raises(ValueError, match=r"`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`"):
        hanpu.chunk_kda(**kda(), allow_neg_eigval=True)
    with pytest.raises(ValueError, match=r"`A_log` must be provided"):
        hanpu.chunk_gated_delta_rule(**x, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"`chunk_size` must be 16, 32, or 64"):
        hanpu.chunk_gated_delta_rule(**x, chunk_size=128)
    with pytest.raises(ValueError, match=r"`chunk_size` must be either 32 or 64 for KDA"):
        hanpu.chunk_kda(**kda(), chunk_size=16)
    with pytest.raises(ValueError, match=r"Cannot pass both `state_v_first`"):
        hanpu.chunk_kda(**kda(), state_v_first=True, transpose_state_layout=True)
    with pytest.raises(ValueError, match=r"`g` \(raw pre-activation\) must be provided"):
        hanpu.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], beta=x["beta"], use_gate_in_kernel=True,
                                               A_log=np.zeros(4, np.float32))


def test_engine_checks_name_the_tensor():
    x = gdn()
    cases = [
        (dict(g=x["g"][:, :, :2]), r"tensor 'g' has shape \[1,20,2\], expected \[1,20,4\]"),
        (dict(beta=x["beta"][:, :10]), r"tensor 'beta' has shape \[1,10,4\]"),
        (dict(v=x["v"][:, :10]), r"tensor 'v' has shape \[1,10,4,16\]"),
        (dict(initial_state=np.zeros((1, 4, 16, 8), np.float32)), r"tensor 'initial_state' has shape"),
        (dict(cu_seqlens=np.array([0, 5, 19])), r"tensor 'cu_seqlens' ends at 19, expected T = 20"),
        (dict(cu_seqlens=np.array([0, 12, 5, 20])), r"tensor 'cu_seqlens' decreases at index 2"),
        (dict(q=np.zeros((1, 20, 2, 300), np.float32), k=np.zeros((1, 20, 2, 300), np.float32)),
         r"head dim K = 300, expected 1 <= K <= 256"),
        (dict(A_log=np.zeros(3, np.float32)), r"tensor 'A_log' has shape \[3\], expected \[4\]"),
    ]
    for over, msg in cases:
        kw = dict(use_gate_in_kernel=True) if "A_log" in over else {}
        with pytest.raises(hanpu.HanpuError, match=msg) as info:
            hanpu.chunk_gated_delta_rule(**dict(x, **over), **kw)
        assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match=r"tensor 'g' has shape .*\[B,T,HV,K\]"):
        hanpu.chunk_kda(**kda(g=x["g"]))
    with pytest.raises(ValueError, match=r"`q` must have shape \[B, T, H, K\], got \[20, 2, 16\]"):
        hanpu.chunk_gated_delta_rule(**dict(x, q=x["q"][0]))
    with pytest.raises(ValueError, match=r"`initial_state` must have shape \[N, HV, V, K\]"):
        hanpu.chunk_gated_delta_rule(**x, initial_state=np.zeros((1, 4, 16, 8), np.float32), state_v_first=True)


def test_wrong_types_and_dtypes():
    x = gdn()
    with pytest.raises(TypeError, match=r"`q` must be a numpy array or a torch tensor, got list"):
        hanpu.chunk_gated_delta_rule(**dict(x, q=x["q"].tolist()))
    with pytest.raises(TypeError, match=r"`k` must have dtype float32, float16, bfloat16 or float64, got int64"):
        hanpu.chunk_gated_delta_rule(**dict(x, k=x["k"].astype(np.int64)))
    with pytest.raises(TypeError, match=r"`beta` must have dtype .* got complex64"):
        hanpu.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=x["beta"].astype(np.complex64))
    with pytest.raises(TypeError, match=r"`cu_seqlens` must have dtype int32 or int64, got float32"):
        hanpu.chunk_gated_delta_rule(**x, cu_seqlens=np.array([0.0, 20.0], np.float32))
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'use_gate'"):
        hanpu.chunk_gated_delta_rule(**x, use_gate=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'A_log_'"):
        hanpu.fused_recurrent_kda(**kda(), A_log_=None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'foo'"):
        hanpu.chunk_kda(**kda(), foo=1)
    with pytest.raises(DeprecationWarning, match=r"head_first has been removed"):
        hanpu.chunk_gated_delta_rule(**x, head_first=False)


@needs_torch
def test_torch_wrong_dtype_and_int32_q():
    x = {n: torch.from_numpy(a) for n, a in gdn().items()}
    with pytest.raises(TypeError, match=r"`v` must have dtype .* got int32"):
        hanpu.chunk_gated_delta_rule(**dict(x, v=x["v"].to(torch.int32)))
    with pytest.raises(TypeError, match=r"`cu_seqlens` must have dtype int32 or int64, got int16"):
        hanpu.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 20], dtype=torch.int16))


def test_unsupported_options_raise_not_implemented():
    x, y = gdn(), kda()
    cases = [
        (lambda: hanpu.chunk_gated_delta_rule(**x, chunk_size=32), "chunk_size"),
        (lambda: hanpu.chunk_gated_delta_rule(**x, cp_context=object()), "cp_context"),
        (lambda: hanpu.chunk_kda(**y, return_intermediate_states=True), "return_intermediate_states"),
        (lambda: hanpu.chunk_kda(**y, chunk_size=32), "chunk_size"),
        (lambda: hanpu.chunk_kda(**y, cp_context=object()), "cp_context"),
        (lambda: hanpu.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], gv=x["v"], beta=x["beta"]),
         "gv"),
        (lambda: hanpu.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=x["v"]), "beta"),
        (lambda: hanpu.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], gk=y["g"], beta=x["beta"],
                                                        use_gate_in_kernel=True, A_log=np.zeros(4, np.float32)),
         "gk"),
    ]
    for fn, option in cases:
        with pytest.raises(NotImplementedError, match=f"`{option}`"):
            fn()


def test_lower_bound_checks():
    """The lower-bounded KDA gate: FLA's checks and messages where FLA checks; a bound that would do
    nothing (no in-kernel gate) or a bound that is not negative is refused, naming lower_bound."""
    y = kda()
    raw = dict(y, A_log=np.zeros(y["v"].shape[2], np.float32))
    with pytest.raises(ValueError, match="`lower_bound` must be specified when `safe_gate=True`"):
        hanpu.chunk_kda(**raw, use_gate_in_kernel=True, safe_gate=True)
    with pytest.raises(ValueError, match=r"safe range \[-5, 0\), got -6"):
        hanpu.chunk_kda(**raw, use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0)
    for fn in (hanpu.chunk_kda, hanpu.fused_recurrent_kda):
        with pytest.raises(ValueError, match="`lower_bound` bounds the gate computed in kernel"):
            fn(**y, lower_bound=-5.0)
        with pytest.raises(ValueError, match="lower_bound is 0.5.*expected a finite negative number"):
            fn(**raw, use_gate_in_kernel=True, lower_bound=0.5)
    # GDN's functions have no lower_bound parameter (as in FLA); the engine refuses one by name.
    from hanpu import _hanpu
    x = gdn()
    with pytest.raises(ValueError, match="lower_bound is KDA's lower-bounded gate; GDN has none"):
        _hanpu.la_reference("gdn", x["q"], x["k"], x["v"], x["g"], x["beta"], None, None,
                            np.zeros(x["v"].shape[2], np.float32), None, None, False, True, False, False, -1.0)


def test_accepted_hints():
    """FLA's GPU-side hints are accepted (nothing to precompute on the CPU) and change nothing."""
    x = make_inputs("gdn", 1, 40, 2, 2, 16, 16, N=2)
    cu = np.array([0, 25, 40])
    o, _ = hanpu.chunk_gated_delta_rule(**x, cu_seqlens=cu)
    o2, _ = hanpu.chunk_gated_delta_rule(**x, cu_seqlens=cu, cu_seqlens_cpu=cu, chunk_indices=None, chunk_size=64)
    np.testing.assert_array_equal(o, o2)
    y = make_inputs("kda", 1, 40, 2, 2, 16, 16)
    o, _ = hanpu.chunk_kda(**y)
    o2, _ = hanpu.chunk_kda(**y, disable_recompute=True, use_graph=False, max_num_seqs=None)
    np.testing.assert_array_equal(o, o2)
