"""hanpu.integrations.transformers: tiny random transformers models of every supported family, their
linear-attention kernels routed to hanpu, give the logits of transformers' own torch fallback.

Each family is built from transformers' own config class (4 layers, hidden size 64, 3 linear-attention
layers, odd head dims where the family allows, several experts with top-2, weights drawn with
initializer_range 0.2 so that the linear-attention layers move the logits) in fp32. One run: a
70-token prefill (more than one 64-token chunk), a 30-token continuation on the cache (the chunked
kernel with an initial state) and 3 single-token decode steps (the recurrent kernel), batch 2. The
reference is the same model with the modules' kernel names set to transformers' pure-torch
functions (`__wrapped__` of transformers' dispatch wrapper), so it stays transformers' fallback
even where FLA is importable.

Checked: logits NMSE <= FP32_NMSE at every position of every phase, the same greedy tokens, and
hanpu's call counter (no call fell back, every linear-attention call went to hanpu: a test cannot
pass by silently not routing). Negative controls route a deliberately wrong kernel through the same
check and expect it to fail; the fallback tests check that an unsupported option warns, names the
option and gives the fallback's answer.
"""

import contextlib
import importlib
import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hanpu  # noqa: E402
import hanpu.integrations.transformers as ht  # noqa: E402

from conftest import NMSE_BOUND, nmse  # noqa: E402

# Both sides compute the recurrences in fp32 and differ only in summation order (~1e-7 relative
# per value), amplified by the layers after them: measured worst per family (seed 0, AVX3)
# qwen3_5 6.7e-10, qwen3_5_moe 2.1e-10, qwen3_next 3.7e-9 (first decode step; seeds 1, 2: 5.7e-10,
# 8.8e-11), kimi_linear 2.7e-12, bailing_hybrid 2.1e-12. The negative controls move the logits by
# more than 100x the bound.
FP32_NMSE = 1e-8
PREFILL, CONTINUATION, DECODE = 70, 30, 3
BATCH = 2
VOCAB = 128
LA_LAYERS = 3

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, rms_norm_eps=1e-6,
              initializer_range=0.2, tie_word_embeddings=False)
# GDN with grouped value heads (4 value heads on 2 query/key heads) and V != K.
QWEN = dict(COMMON, intermediate_size=96, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4)
QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
KDA = dict(COMMON, intermediate_size=96, num_key_value_heads=4, linear_num_heads=4, linear_head_dim=16,
           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_experts=4,
           num_experts_per_token=2, moe_intermediate_size=32, head_dim=8, pad_token_id=0, bos_token_id=None,
           eos_token_id=None, layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
           mlp_layer_types=["dense", "sparse", "sparse", "sparse"])


def _configs():
    return {
        "qwen3_5": lambda: transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**QWEN)),
        "qwen3_5_moe": lambda: transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**QWEN, **QWEN_MOE)),
        "qwen3_next": lambda: transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**QWEN, **QWEN_MOE)),
        "kimi_linear": lambda: transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**KDA)),
        # the safe gate with its lower bound (the config's defaults, spelled out), grouped top-k routing
        "bailing_hybrid": lambda: transformers.BailingHybridForCausalLM(transformers.BailingHybridConfig(
            **KDA, kda_safe_gate=True, kda_lower_bound=-5.0, num_expert_group=2, topk_group=1,
            first_k_dense_replace=1)),
    }


FAMILIES = list(ht.FAMILIES)
_models = {}


def tiny_model(family):
    if family not in _models:
        torch.manual_seed(0)
        model = _configs()[family]().float().eval()
        layers = [m for m in model.modules() if type(m).__name__.endswith(("GatedDeltaNet", "DeltaAttention"))]
        assert len(layers) == LA_LAYERS, f"{family}: {len(layers)} linear-attention layers"
        _models[family] = model
    return _models[family]


def family_module(family):
    module_name, variant = ht.FAMILIES[family]
    return importlib.import_module(module_name), list(ht.FUNCTION_NAMES[variant].values())


@contextlib.contextmanager
def torch_fallback(family):
    """The reference: the family's kernel names set to transformers' pure-torch functions."""
    module, names = family_module(family)
    saved = {n: getattr(module, n) for n in names}
    try:
        for n in names:
            setattr(module, n, inspect.unwrap(saved[n]))
        yield
    finally:
        for n, f in saved.items():
            setattr(module, n, f)


def run(model, ids, feed=None):
    """Logits of a prefill, a continuation and DECODE decode steps; the decoded tokens are `feed`
    (the reference's greedy picks) when given, else this run's own greedy picks."""
    with torch.no_grad():
        out = model(ids[:, :PREFILL], use_cache=True)
        cache = out.past_key_values
        logits = {"prefill": out.logits}
        out = model(ids[:, PREFILL:], past_key_values=cache, use_cache=True)
        logits["continuation"] = out.logits
        picks = []
        for step in range(DECODE):
            own = out.logits[:, -1:].argmax(-1)
            picks.append(own)
            token = own if feed is None else feed[:, step:step + 1]
            out = model(token, past_key_values=cache, use_cache=True)
            logits[f"decode {step}"] = out.logits
        picks.append(out.logits[:, -1:].argmax(-1))
    return logits, torch.cat(picks, 1)


def compare(family, seed=0):
    """NMSE of the hanpu-routed run's logits against the torch fallback's, per phase, whether the
    greedy picks agree, and hanpu's call counts."""
    model = tiny_model(family)
    ids = torch.randint(0, VOCAB, (BATCH, PREFILL + CONTINUATION), generator=torch.Generator().manual_seed(seed))
    with torch_fallback(family):
        ref, ref_picks = run(model, ids)
    ht.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ht.TransformersFallbackWarning)  # a fallback here is a failure
        with ht.routed([family]):
            got, got_picks = run(model, ids, feed=ref_picks)
    return {
        "nmse": {phase: nmse(got[phase], ref[phase]) for phase in ref},
        "greedy_equal": bool(torch.equal(got_picks, ref_picks)),
        "argmax_equal": all(torch.equal(got[p].argmax(-1), ref[p].argmax(-1)) for p in ref),
        "stats": ht.stats(),
    }


def expected_calls():
    return {"chunk": {"hanpu": 2 * LA_LAYERS, "fallback": 0}, "recurrent": {"hanpu": DECODE * LA_LAYERS, "fallback": 0}}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_torch_fallback(family):
    r = compare(family)
    print(f"{family}: logits NMSE " + ", ".join(f"{p} {x:.2e}" for p, x in r["nmse"].items()))
    for phase, x in r["nmse"].items():
        assert x <= FP32_NMSE, f"{family} {phase}: NMSE {x:.3e}"
    assert r["greedy_equal"] and r["argmax_equal"]
    assert r["stats"] == {(family, k): c for k, c in expected_calls().items()}


@pytest.mark.parametrize("family", ["qwen3_5", "kimi_linear", "bailing_hybrid"])
def test_wrong_chunk_kernel_is_caught(family, monkeypatch):
    # hanpu with half the default q scale: a plausible mistake only the logits reveal. Routed through
    # the integration itself, so the check that passes above is the one that fails here.
    name = ht._HANPU[(ht.FAMILIES[family][1], "chunk")]
    right = getattr(hanpu, name)

    def wrong(q, k, v, g, beta, **kwargs):
        return right(q, k, v, g, beta, scale=0.5 * q.shape[-1] ** -0.5, **kwargs)

    monkeypatch.setattr(hanpu, name, wrong)
    r = compare(family)
    assert r["stats"][(family, "chunk")]["hanpu"] == 2 * LA_LAYERS  # the wrong kernel ran
    assert r["nmse"]["prefill"] > 100 * FP32_NMSE
    assert r["nmse"]["continuation"] > 100 * FP32_NMSE


@pytest.mark.parametrize("family", ["qwen3_next", "bailing_hybrid"])
def test_lost_decode_state_is_caught(family, monkeypatch):
    # The prefill is right, decode ignores the state the prefill handed over.
    name = ht._HANPU[(ht.FAMILIES[family][1], "recurrent")]
    right = getattr(hanpu, name)

    def stateless(q, k, v, g=None, beta=None, initial_state=None, **kwargs):
        return right(q, k, v, g=g, beta=beta, initial_state=None, **kwargs)

    monkeypatch.setattr(hanpu, name, stateless)
    r = compare(family)
    assert r["nmse"]["prefill"] <= FP32_NMSE
    assert r["stats"][(family, "recurrent")]["hanpu"] == DECODE * LA_LAYERS
    for step in range(DECODE):
        assert r["nmse"][f"decode {step}"] > 100 * FP32_NMSE


def test_routing_is_undone():
    modules = {f: family_module(f) for f in FAMILIES}
    before = {f: [getattr(m, n) for n in names] for f, (m, names) in modules.items()}
    assert not any(ht.is_enabled(f) for f in FAMILIES)
    with ht.routed():
        for f, (m, names) in modules.items():
            assert ht.is_enabled(f)
            now = [getattr(m, n) for n in names]
            assert all(a is not b for a, b in zip(now, before[f]))
            assert [fn.hanpu_original for fn in now] == before[f]
        with ht.routed(["kimi_linear"]):  # nested: leaving the inner block keeps the outer routing
            pass
        assert ht.is_enabled("kimi_linear")
    for f, (m, names) in modules.items():
        assert [getattr(m, n) for n in names] == before[f] and not ht.is_enabled(f)
    # undone after an exception too, and enable() twice wraps once
    with pytest.raises(KeyError):
        with ht.routed(["qwen3_5_text"]):  # the text tower's alias
            assert ht.is_enabled("qwen3_5")
            raise KeyError("inside")
    assert not ht.is_enabled("qwen3_5")
    ht.enable(["bailing_hybrid"])
    ht.enable(["bailing_hybrid"])
    m, names = modules["bailing_hybrid"]
    assert [getattr(m, n).hanpu_original for n in names] == before["bailing_hybrid"]
    ht.disable()
    assert [getattr(m, n) for n in names] == before["bailing_hybrid"]
    with pytest.raises(ValueError, match="unknown transformers family 'llama'"):
        ht.enable(["llama"])


def _kernel_inputs(variant, T=20, B=2, H=2, HV=2, K=16, V=8, seed=0, g_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g_shape = (B, T, HV) if variant == "gdn" else (B, T, HV, K)
    g = -g_scale * torch.rand(g_shape, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    return q, k, v, g, beta, h0


@pytest.mark.parametrize("family", ["qwen3_5", "bailing_hybrid"])
def test_unsupported_chunk_size_falls_back_with_warning(family):
    module, (chunk_name, _) = family_module(family)
    torch_chunk = inspect.unwrap(getattr(module, chunk_name))
    q, k, v, g, beta, h0 = _kernel_inputs(ht.FAMILIES[family][1])
    expected = torch_chunk(q, k, v, g=g, beta=beta, chunk_size=32, initial_state=h0, output_final_state=True,
                           use_qk_l2norm_in_kernel=True)
    ht.reset_stats()
    with ht.routed([family]):
        with pytest.warns(ht.TransformersFallbackWarning, match="`chunk_size`=32"):
            o, state = getattr(module, chunk_name)(q, k, v, g=g, beta=beta, chunk_size=32, initial_state=h0,
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert torch.equal(o, expected[0]) and torch.equal(state, expected[1])
    assert ht.stats() == {(family, "chunk"): {"hanpu": 0, "fallback": 1}}


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
def test_unknown_keyword_and_packed_sequences_fall_back(family):
    module, names = family_module(family)
    q, k, v, g, beta, h0 = _kernel_inputs(ht.FAMILIES[family][1], T=1)
    with ht.routed([family]):
        fn = getattr(module, names[1])
        with pytest.warns(ht.TransformersFallbackWarning, match="`some_new_option`"):
            fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, some_new_option=3)
        # transformers' own torch path refuses packed sequences (integrations/hub_kernels.py): the
        # fallback hands the call to it, which raises, rather than hanpu computing what the causal
        # convolution in front of the kernel already mixed across the sequences.
        with pytest.warns(ht.TransformersFallbackWarning, match="`seq_idx` \\(packed sequences\\)"):
            with pytest.raises(ValueError, match="can't keep packed sequences apart"):
                fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, seq_idx=torch.zeros(1, 1, dtype=torch.int32))
        ht.reset_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("error", ht.TransformersFallbackWarning)
            # None packed-sequence arguments and the layers' extra TransformersKwargs are not options
            o, _ = fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=None,
                      position_ids=None)
    assert ht.stats() == {(family, "recurrent"): {"hanpu": 1, "fallback": 0}}
    ref, _ = inspect.unwrap(getattr(module, names[1]))(q, k, v, g=g, beta=beta, initial_state=h0,
                                                       output_final_state=True)
    assert nmse(o, ref) <= FP32_NMSE


@pytest.mark.parametrize("family", ["qwen3_5_moe", "kimi_linear"])
def test_autograd_falls_back_with_the_fallbacks_answer(family):
    # Training on the CPU: the inputs need a gradient, which hanpu's outputs do not carry, so every
    # call falls back, warns, and the logits (and their gradient) are the torch fallback's own.
    model = tiny_model(family)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch_fallback(family):
        ref = model(ids).logits
    ht.reset_stats()
    with ht.routed([family]):
        with pytest.warns(ht.TransformersFallbackWarning, match="autograd"):
            got = model(ids).logits
    assert got.requires_grad and torch.equal(got, ref)
    assert ht.stats() == {(family, "chunk"): {"hanpu": 0, "fallback": LA_LAYERS}}


@pytest.mark.parametrize("family,g_scale", [("qwen3_5", 8.0), ("kimi_linear", 8.0), ("bailing_hybrid", 5.0)])
def test_strong_decays_match_the_fp64_reference(family, g_scale):
    # Decays as strong as the gates allow (bailing's lower bound -5 per step; softplus gates have no
    # bound): over a 64-token chunk the cumulative log decay reaches hundreds, where a kernel that
    # exponentiated cumulative sums instead of their differences would overflow. The routed
    # functions, chunked and token by token, against hanpu's fp64 reference at the fp32 bound.
    variant = ht.FAMILIES[family][1]
    module, (chunk_name, recurrent_name) = family_module(family)
    q, k, v, g, beta, h0 = _kernel_inputs(variant, T=150, g_scale=g_scale)
    reference = hanpu.reference.gated_delta_rule if variant == "gdn" else hanpu.reference.kda
    ref_o, ref_state = reference(q, k, v, g, beta, initial_state=h0, use_qk_l2norm_in_kernel=True)
    ht.reset_stats()
    with ht.routed([family]):
        for name in (chunk_name, recurrent_name):
            o, state = getattr(module, name)(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
            assert nmse(o, ref_o) <= NMSE_BOUND["float32"], name
            assert nmse(state, ref_state) <= NMSE_BOUND["float32"], name
    assert all(c == {"hanpu": 1, "fallback": 0} for c in ht.stats().values()) and len(ht.stats()) == 2


def test_routed_functions_do_not_install_themselves():
    # What examples/qwen35_transformers.py uses: the hanpu-backed pair, with the module left alone.
    module, names = family_module("qwen3_5")
    before = [getattr(module, n) for n in names]
    fns = ht.routed_functions("qwen3_5")
    assert [getattr(module, n) for n in names] == before and not ht.is_enabled("qwen3_5")
    q, k, v, g, beta, h0 = _kernel_inputs("gdn", T=70, H=2, HV=4, V=24)
    ht.reset_stats()
    o, state = fns["chunk"](q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                            use_qk_l2norm_in_kernel=True)
    ref_o, ref_state = inspect.unwrap(before[0])(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    assert nmse(o, ref_o) <= FP32_NMSE and nmse(state, ref_state) <= FP32_NMSE
    assert ht.stats() == {("qwen3_5", "chunk"): {"hanpu": 1, "fallback": 0}}
    assert fns["chunk"].hanpu_original is before[0]
