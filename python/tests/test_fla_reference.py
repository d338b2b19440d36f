"""hanpu's functions against FLA's own naive references (fla-core's fla/ops/*/naive.py, loaded
by file path: importing `fla` would need triton). Skipped when fla-core or torch is absent.

FLA's naive references compute in fp32, token by token; hanpu's engine is within 1e-10 NMSE of
the fp64 recurrence, so the two agree to fp32 accumulation noise (bound 1e-10 on inputs of
FLA's test recipes)."""

import numpy as np
import pytest

import hanpu
from conftest import load_fla_function, load_fla_naive, make_inputs, nmse, torch

BOUND = 1e-10


def torch_inputs(x):
    return {n: torch.from_numpy(a) for n, a in x.items()}


def expand(t, G):
    """GVA: q/k head h serves value heads h*G .. h*G+G-1 (repeat_interleave, as FLA)."""
    return t.repeat_interleave(G, dim=2)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_gdn_against_naive_recurrent(mode):
    naive = load_fla_naive("gated_delta_rule/naive.py")
    x = torch_inputs(make_inputs("gdn", 2, 100, 2, 4, 60, 100, seed=21))
    fn = hanpu.chunk_gated_delta_rule if mode == "chunk" else hanpu.fused_recurrent_gated_delta_rule
    o, ht = fn(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["initial_state"],
               output_final_state=True)
    ro, rht = naive.naive_recurrent_gated_delta_rule(expand(x["q"], 2), expand(x["k"], 2), x["v"], x["beta"], x["g"],
                                                     initial_state=x["initial_state"], output_final_state=True)
    assert nmse(o, ro) <= BOUND and nmse(ht, rht) <= BOUND


def test_gdn_against_naive_chunk():
    naive = load_fla_naive("gated_delta_rule/naive.py")
    x = torch_inputs(make_inputs("gdn", 1, 150, 2, 2, 64, 64, seed=22))
    o, ht = hanpu.chunk_gated_delta_rule(**x, output_final_state=True)
    ro, rht = naive.naive_chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                 initial_state=x["initial_state"], output_final_state=True)
    assert nmse(o, ro) <= BOUND and nmse(ht, rht) <= BOUND


def test_gdn_varlen_against_per_sequence_naive():
    """FLA's test_chunk_varlen recipe: the reference runs each sequence on its own, concatenated."""
    naive = load_fla_naive("gated_delta_rule/naive.py")
    cu = [0, 15, 100, 300]
    x = torch_inputs(make_inputs("gdn", 1, cu[-1], 2, 4, 60, 100, seed=23, N=3))
    o, ht = hanpu.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor(cu), output_final_state=True)
    outs, states = [], []
    for n in range(3):
        s = slice(cu[n], cu[n + 1])
        ro, rht = naive.naive_recurrent_gated_delta_rule(
            expand(x["q"][:, s], 2), expand(x["k"][:, s], 2), x["v"][:, s], x["beta"][:, s], x["g"][:, s],
            initial_state=x["initial_state"][n:n + 1], output_final_state=True)
        outs.append(ro)
        states.append(rht)
    assert nmse(o, torch.cat(outs, 1)) <= BOUND and nmse(ht, torch.cat(states, 0)) <= BOUND


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_gdn_gate_in_kernel_against_naive_gate(mode):
    naive = load_fla_naive("gated_delta_rule/naive.py")
    gate = load_fla_function("gated_delta_rule/gate.py", "naive_gdn_gate")
    x = torch_inputs(make_inputs("gdn", 1, 90, 2, 2, 32, 32, seed=24, raw_gate=True))
    fn = hanpu.chunk_gated_delta_rule if mode == "chunk" else hanpu.fused_recurrent_gated_delta_rule
    o, ht = fn(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["initial_state"],
               use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], output_final_state=True)
    g = gate(x["g"], x["A_log"], x["dt_bias"])
    ro, rht = naive.naive_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["beta"], g,
                                                     initial_state=x["initial_state"], output_final_state=True)
    assert nmse(o, ro) <= BOUND and nmse(ht, rht) <= BOUND


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_kda_against_naive_recurrent(mode):
    naive = load_fla_naive("kda/naive.py")
    x = torch_inputs(make_inputs("kda", 2, 100, 2, 4, 60, 100, seed=25))
    fn = hanpu.chunk_kda if mode == "chunk" else hanpu.fused_recurrent_kda
    o, ht = fn(**x, output_final_state=True)
    ro, rht = naive.naive_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                        output_final_state=True)
    assert nmse(o, ro) <= BOUND and nmse(ht, rht) <= BOUND


def test_kda_gate_in_kernel_against_naive_gate():
    naive = load_fla_naive("kda/naive.py")
    gate = load_fla_function("kda/gate.py", "naive_kda_gate")
    x = torch_inputs(make_inputs("kda", 1, 80, 2, 4, 32, 48, seed=26, raw_gate=True))
    o, ht = hanpu.chunk_kda(**x, use_gate_in_kernel=True, output_final_state=True)
    g = gate(x["g"], x["A_log"], x["dt_bias"])
    ro, rht = naive.naive_recurrent_kda(x["q"], x["k"], x["v"], g, x["beta"], initial_state=x["initial_state"],
                                        output_final_state=True)
    assert nmse(o, ro) <= BOUND and nmse(ht, rht) <= BOUND


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("with_a_log", [True, False])
def test_kda_lower_bound_gate_against_naive(mode, with_a_log):
    """Ling's safe gate in kernel: g = lower_bound * sigmoid(exp(A_log) (g + dt_bias)) (rate 1 without
    A_log), against FLA's naive_kda_lowerbound_gate + naive_recurrent_kda; T not a multiple of 64,
    HV > H, odd head dims."""
    naive = load_fla_naive("kda/naive.py")
    gate = load_fla_function("kda/gate.py", "naive_kda_lowerbound_gate")
    x = torch_inputs(make_inputs("kda", 2, 90, 2, 4, 36, 20, seed=27, raw_gate=True))
    x["g"] = x["g"] * 3  # raw pre-activations wide enough to reach both ends of (lower_bound, 0)
    if not with_a_log:
        x["A_log"] = None
    fn = hanpu.chunk_kda if mode == "chunk" else hanpu.fused_recurrent_kda
    extra = dict(safe_gate=True) if mode == "chunk" else {}
    o, ht = fn(**x, use_gate_in_kernel=True, lower_bound=-5.0, output_final_state=True, **extra)
    g = gate(x["g"], x["A_log"], x["dt_bias"], lower_bound=-5.0)
    assert float(g.min()) < -4.5 and float(g.max()) > -0.5  # the test spans the gate's range
    ro, rht = naive.naive_recurrent_kda(x["q"], x["k"], x["v"], g, x["beta"], initial_state=x["initial_state"],
                                        output_final_state=True)
    assert nmse(o, ro) <= BOUND and nmse(ht, rht) <= BOUND
    # and the fp64 reference with the same bound agrees with the engine
    r = {n: (t.numpy() if t is not None else None) for n, t in x.items()}
    fo, fht = hanpu.reference.kda(**r, use_gate_in_kernel=True, lower_bound=-5.0)
    assert nmse(o, torch.from_numpy(fo)) <= 1e-10 and nmse(ht, torch.from_numpy(fht)) <= 1e-10


def test_kda_bf16_like_fla_tests():
    """bf16 q/k/v as in FLA's bf16 KDA grid: FLA's naive casts to fp32 and returns v's dtype."""
    naive = load_fla_naive("kda/naive.py")
    x = torch_inputs(make_inputs("kda", 1, 128, 2, 4, 64, 64, seed=27))
    for n in ("q", "k", "v"):
        x[n] = x[n].to(torch.bfloat16)
    o, ht = hanpu.chunk_kda(**x, output_final_state=True)
    ro, rht = naive.naive_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                        output_final_state=True)
    assert o.dtype == torch.bfloat16 and ro.dtype == torch.bfloat16
    # both round o to bf16 (half an ulp each: NMSE about 2 x 1.3e-6 at most)
    assert nmse(o, ro) <= 1e-5 and nmse(ht, rht) <= BOUND


@pytest.mark.parametrize("relpath, name", [
    ("gated_delta_rule/chunk.py", "chunk_gated_delta_rule"),
    ("gated_delta_rule/fused_recurrent.py", "fused_recurrent_gated_delta_rule"),
    ("kda/chunk.py", "chunk_kda"),
    ("kda/fused_recurrent.py", "fused_recurrent_kda"),
])
def test_signatures_match_fla(relpath, name):
    """Same parameters in the same order with the same defaults as FLA's function (read from its
    source with `ast`: the module imports triton)."""
    import ast
    import inspect
    import os

    from conftest import fla_root

    root = fla_root()
    path = os.path.join(root, "fla", "ops", relpath) if root else None
    if not path or not os.path.isfile(path):
        pytest.skip("fla-core is not installed")
    with open(path) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    args = fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    fla = [(a.arg, ast.literal_eval(d) if d is not None else inspect.Parameter.empty) for a, d in zip(args, defaults)]
    ours = [(p.name, p.default) for p in inspect.signature(getattr(hanpu, name)).parameters.values()
            if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert ours == fla
