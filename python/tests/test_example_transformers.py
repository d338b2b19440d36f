"""Smoke test of examples/qwen35_transformers.py: a tiny transformers Qwen3.5 with its GDN calls
routed to hanpu gives the logits of transformers' own torch fallback, prefill and decode.

Skipped (not failed) when torch, transformers (with Qwen3.5) or hanpu is not importable. Each case
loads the repo's 4-layer test checkpoint tests/golden/qwen35_tiny (hidden size 64, 3 GDN layers with
GVA, weights scaled so that every part moves the logits), runs 100 tokens (more than one 64-token
chunk) and decodes TEST_DECODE_TOKENS, so the file takes seconds; most of it is importing
transformers. Every GDN call is also checked against the fp64 reference on its own inputs (the
example's LayerCheck), with a bound derived from the output dtype's rounding. The negative controls route a deliberately wrong function and expect
the example's check to fail, so a check that could never fail would be caught here.
"""

import importlib.util
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hanpu = pytest.importorskip("hanpu")
if not hasattr(transformers, "Qwen3_5ForCausalLM"):
    pytest.skip(f"transformers {transformers.__version__} has no Qwen3.5", allow_module_level=True)

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(REPO, "examples", "qwen35_transformers.py")
CHECKPOINT = os.path.join(REPO, "tests", "golden", "qwen35_tiny")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("qwen35_transformers_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_args(example, tmp_path, *extra):
    out = tmp_path / "result.json"
    args = example.parse_args(["--model", CHECKPOINT, "--tokens", "100", "--repeats", "1",
                               "--decode", str(example.TEST_DECODE_TOKENS), "--threads", "2", "--json", str(out),
                               *extra])
    return args, out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_routed_model_matches_torch_fallback(example, tmp_path, dtype):
    args, out = tiny_args(example, tmp_path, "--dtype", dtype)
    assert example.run(args) == 0
    result = json.loads(out.read_text())
    assert result["failures"] == []
    assert result["gdn_layers"] == 3
    assert result["prefill_check"]["positions"] == 100
    for check in (result["prefill_check"], result["decode_check"]):
        if dtype == "fp32":
            assert check["nmse"] <= example.FP32_NMSE
        else:  # no further from transformers' own bf16 run than that run is from the fp32 model
            assert check["discrepancy"] <= example.BF16_DISCREPANCY
            assert check["nmse_vs_fp32"]["hanpu"] > 0
    assert len(result["decode_tokens"]) == example.TEST_DECODE_TOKENS
    # Every GDN call was checked against the fp64 reference on its own inputs (the per-CPU claim):
    layers = result["layer_check"]
    assert layers["chunk"]["calls"] == 3
    assert layers["recurrent"]["calls"] == 3 * example.TEST_DECODE_TOKENS
    for kind in ("chunk", "recurrent"):
        assert layers[kind]["worst_o_nmse"] <= layers[kind]["worst_o_bound"]
        assert layers[kind]["worst_state_nmse"] <= example.LAYER_F32_NMSE
        if dtype == "bf16":  # the bound is the exact result's own rounding, not a loose constant
            assert 0 < layers[kind]["worst_o_rounding_nmse"] < 1e-5
            assert layers[kind]["worst_o_bound"] < 1.2 * layers[kind]["worst_o_rounding_nmse"]
    for path in ("torch", "hanpu"):
        assert result["timing"][path]["prefill_s"] > result["timing"][path]["gdn_s"] > 0


def test_routing_is_undone(example, tmp_path):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    before = (modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule)
    args, _ = tiny_args(example, tmp_path, "--decode", "1")
    assert example.run(args) == 0
    assert (modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule) == before


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_wrong_prefill_function_is_caught(example, tmp_path, dtype):
    # hanpu with half the default q scale: a plausible mistake that only the logits reveal.
    def wrong_chunk(q, k, v, g, beta, **kwargs):
        return hanpu.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, scale=0.5 * q.shape[-1] ** -0.5,
                                            initial_state=kwargs.get("initial_state"),
                                            output_final_state=kwargs.get("output_final_state", False),
                                            use_qk_l2norm_in_kernel=kwargs.get("use_qk_l2norm_in_kernel", False))

    args, out = tiny_args(example, tmp_path, "--dtype", dtype)
    args.route_override = (wrong_chunk, example.hanpu_functions()[1])
    assert example.run(args) == 1
    result = json.loads(out.read_text())
    if dtype == "fp32":
        assert result["prefill_check"]["nmse"] > example.FP32_NMSE
    else:
        assert result["prefill_check"]["discrepancy"] > example.BF16_DISCREPANCY
    assert any(f.startswith("prefill logits") for f in result["failures"])
    assert any(f.startswith("GDN chunk calls against the fp64 reference") for f in result["failures"])


def test_truncated_bf16_outputs_are_caught(example, tmp_path):
    # The prefill's bf16 outputs truncated instead of rounded to nearest (the kind of bug Highway's
    # emulated f16 conversion had on SSE4): the per-call bound from the exact result's own rounding
    # sees ~4x that rounding's error in every chunk call (measured 3.7-4.5x), on any CPU.
    def truncating_chunk(q, k, v, g, beta, **kwargs):
        # The same computation in fp32 (the bf16 inputs widen exactly), then cut to bf16.
        o, state = example.hanpu_functions()[0](q.float(), k.float(), v.float(), g.float(), beta.float(), **kwargs)
        bits = o.view(torch.int32) & ~0xFFFF
        return bits.view(torch.float32).to(q.dtype), state

    args, out = tiny_args(example, tmp_path, "--dtype", "bf16")
    args.route_override = (truncating_chunk, example.hanpu_functions()[1])
    assert example.run(args) == 1
    result = json.loads(out.read_text())
    chunk = result["layer_check"]["chunk"]
    assert chunk["worst_o_nmse"] > chunk["worst_o_bound"]
    assert min(chunk["o_over_rounding"]) > 2  # truncation: ~4x the rounding's error
    assert any(f.startswith("GDN chunk calls against the fp64 reference") for f in result["failures"])
    assert result["layer_check"]["recurrent"]["worst_o_nmse"] <= result["layer_check"]["recurrent"]["worst_o_bound"]


def test_lost_decode_state_is_caught(example, tmp_path):
    # The prefill is right but decode ignores the state the prefill handed over.
    def stateless_recurrent(q, k, v, g, beta, **kwargs):
        return hanpu.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)

    args, out = tiny_args(example, tmp_path)
    args.route_override = (example.hanpu_functions()[0], stateless_recurrent)
    assert example.run(args) == 1
    result = json.loads(out.read_text())
    assert result["prefill_check"]["nmse"] <= example.FP32_NMSE
    assert any(f.startswith("decode logits differ") for f in result["failures"])
    assert any(f.startswith("GDN recurrent calls against the fp64 reference") for f in result["failures"])
