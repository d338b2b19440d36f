"""Issue 15 regression tests for the Python package, one per class: non-finite gates are an error
(NaN/Inf policy, docs/RELIABILITY.md) on every entry point, cu_seqlens lists of floats are a
TypeError instead of being truncated, and a deeply nested device file is a HanpuError (it used to
kill the interpreter)."""

import numpy as np
import pytest

import hanpu
from conftest import make_inputs


@pytest.mark.parametrize("fn,variant", [
    (hanpu.chunk_gated_delta_rule, "gdn"),
    (hanpu.fused_recurrent_gated_delta_rule, "gdn"),
    (hanpu.chunk_kda, "kda"),
    (hanpu.fused_recurrent_kda, "kda"),
])
@pytest.mark.parametrize("bad,word", [(np.nan, "NaN"), (np.inf, r"\+Inf"), (-np.inf, "-Inf")])
def test_silent_non_finite_gate_is_an_error(fn, variant, bad, word):
    x = make_inputs(variant, 1, 70, 2, 2, 16, 16, h0=False)
    g = x["g"].copy()
    idx = (0, 65, 1) if variant == "gdn" else (0, 65, 1, 3)
    g[idx] = bad
    where = ",".join(str(i) for i in idx)
    with pytest.raises(hanpu.HanpuError, match=rf"tensor 'g' has {word} at index \[{where}\]") as e:
        fn(**dict(x, g=g))
    assert isinstance(e.value, ValueError)


def test_silent_cu_seqlens_floats_are_rejected_not_truncated():
    x = make_inputs("gdn", 1, 20, 2, 2, 16, 16, h0=False)
    with pytest.raises(TypeError, match=r"`cu_seqlens\[1\]` is 7\.5 \(float\), expected an integer offset"):
        hanpu.chunk_gated_delta_rule(**x, cu_seqlens=[0, 7.5, 20])
    with pytest.raises(TypeError, match=r"`cu_seqlens\[1\]` is True"):
        hanpu.chunk_gated_delta_rule(**x, cu_seqlens=[0, True, 20])
    with pytest.raises(TypeError):  # a float array is refused by the dtype check
        hanpu.chunk_gated_delta_rule(**x, cu_seqlens=np.array([0.0, 7.0, 20.0]))
    o, _ = hanpu.chunk_gated_delta_rule(**x, cu_seqlens=[0, 7, 20])
    assert np.isfinite(o).all()


def test_crash_deeply_nested_device_file_is_an_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(hanpu.HanpuError, match=r"deep\.json: JSON nested deeper than 256 levels"):
        hanpu.device(str(path))


def test_hang_huge_problem_sizes_are_refused():
    with pytest.raises(hanpu.HanpuError, match=r"problem\.seqlens\[0\] \(T\): got 1000000000, expected at most 2097152"):
        hanpu.plan(T=10**9)
    with pytest.raises(hanpu.HanpuError, match=r"problem\.V: got 1000000000"):
        hanpu.simulate(V=10**9)
