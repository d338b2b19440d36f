"""Shared helpers of the hanpu Python tests: FLA's input recipes (FLA's tests/ops/test_gated_delta.py, test_kda.py), the
error metric, and the optional torch / ml_dtypes / fla-core pieces (tests needing them skip when
they are absent; with HANPU_TESTS_NO_SKIP=1, as scripts/test.sh sets it after installing them all,
any skipped test fails the run)."""

import importlib.util
import os

import numpy as np
import pytest

try:
    import torch
except ImportError:  # the package itself never needs torch
    torch = None

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

# NMSE bounds of hanpu's engine against the fp64 reference on the same (rounded) inputs: fp32
# rounding inside the engine, plus the rounding of o to the output dtype for f16/bf16 (at most half
# an ulp per element, 2^-11 / 2^-8 relative; over many elements the NMSE averages about 2^-23.5 /
# 2^-18.5, and the bounds sit above that average, below the worst case 2^-22 / 2^-16).
NMSE_BOUND = {"float32": 1e-10, "float16": 1e-7, "bfloat16": 1e-5}


def nmse(x, ref):
    """Normalized mean squared error sum((x-ref)^2) / sum(ref^2), in float64."""
    x = to_f64(x)
    ref = to_f64(ref)
    den = float(np.sum(ref * ref))
    return float(np.sum((x - ref) ** 2)) / (den if den > 0 else 1.0)


def to_f64(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def make_inputs(variant, B, T, H, HV, K, V, seed=0, h0=True, N=None, raw_gate=False):
    """fp32 numpy inputs in FLA's test recipes: q randn, k randn L2-normalized, v randn,
    beta = sigmoid(rand), g = logsigmoid(rand) (GDN [B,T,HV]) or logsigmoid(randn)/4 (KDA
    [B,T,HV,K]); h0 randn [N,HV,K,V]. raw_gate: g is a raw pre-activation (randn) and A_log,
    dt_bias are added for use_gate_in_kernel."""
    rng = np.random.default_rng(seed)
    f = np.float32
    q = rng.standard_normal((B, T, H, K)).astype(f)
    k = rng.standard_normal((B, T, H, K))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(f)
    v = rng.standard_normal((B, T, HV, V)).astype(f)
    beta = _sigmoid(rng.random((B, T, HV))).astype(f)
    gshape = (B, T, HV) if variant == "gdn" else (B, T, HV, K)
    if raw_gate:
        g = rng.standard_normal(gshape).astype(f)
    elif variant == "gdn":
        g = np.log(_sigmoid(rng.random(gshape))).astype(f)
    else:
        g = (np.log(_sigmoid(rng.standard_normal(gshape))) / 4).astype(f)
    x = dict(q=q, k=k, v=v, g=g, beta=beta)
    if h0:
        x["initial_state"] = rng.standard_normal((N if N is not None else B, HV, K, V)).astype(f)
    if raw_gate:
        x["A_log"] = np.log(rng.uniform(1, 16, HV)).astype(f)
        x["dt_bias"] = rng.standard_normal(HV if variant == "gdn" else HV * K).astype(f)
    return x


def fla_root():
    """Directory holding FLA's sources (fla-core), located without importing `fla` (whose
    __init__ needs triton); None when fla-core is not installed."""
    if os.environ.get("FLA_ROOT"):
        return os.environ["FLA_ROOT"]
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def load_fla_naive(relpath):
    """FLA's naive reference module fla/ops/<relpath> loaded by file path (it imports only torch
    and einops), or a pytest skip when fla-core, torch or einops is absent."""
    if torch is None:
        pytest.skip("torch is not installed")
    if importlib.util.find_spec("einops") is None:
        pytest.skip("einops is not installed")
    root = fla_root()
    path = os.path.join(root, "fla", "ops", relpath) if root else None
    if not path or not os.path.isfile(path):
        pytest.skip("fla-core is not installed")
    name = "fla_naive_" + relpath.replace("/", "_").replace(".py", "")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_fla_function(relpath, name):
    """One function of FLA's fla/ops/<relpath> whose module imports triton (the gate references):
    its source is taken verbatim with `ast` and run in a namespace holding only torch and
    torch.nn.functional as F, as tools/make_fla_goldens.py does. Skips like load_fla_naive."""
    import ast

    load_fla_naive("gated_delta_rule/naive.py")  # the same skips
    path = os.path.join(fla_root(), "fla", "ops", relpath)
    with open(path) as f:
        source = f.read()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            namespace = {"torch": torch, "F": torch.nn.functional}
            exec(compile(ast.get_source_segment(source, node), path, "exec"), namespace)
            return namespace[name]
    pytest.skip(f"{name} not found in {path}")


def _skipped_reports(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter.stats.get("skipped", []) if reporter is not None else []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The count of skipped tests and why (also when zero), and the ISA the kernels ran on."""
    import hanpu

    skipped = _skipped_reports(config)
    isa = hanpu.isa()
    terminalreporter.write_line(f"hanpu kernels: {isa['target']} (HANPU_ISA={isa['requested'] or 'native'}); "
                                f"skipped tests: {len(skipped)}")
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"  skipped {report.nodeid}: {reason}")
    if skipped and os.environ.get("HANPU_TESTS_NO_SKIP") == "1":
        terminalreporter.write_line("HANPU_TESTS_NO_SKIP=1: a skipped test fails the run (scripts/setup_tests.sh installs "
                                    "every package the tests use)")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("HANPU_TESTS_NO_SKIP") == "1" and _skipped_reports(session.config) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
