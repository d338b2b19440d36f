"""What a new user does: build a small random model of each family with transformers 5.24 from
non-default dimensions, save it unchanged with save_pretrained, and run the directory with hanpu.

Each family's config class derives fields in __post_init__ and saves them under other names
(BailingHybridConfig: head_dim -> linear_head_dim, then head_dim = qk_rope_head_dim; Qwen3.5 /
Qwen3-Next: full_attention_interval -> layer_types, partial_rotary_factor -> rope_parameters;
KimiLinearConfig: head_dim = qk_rope_head_dim, linear_attn_config -> linear_*, first_k_dense_replace
-> mlp_layer_types), so every derived value here differs from its default and from the value of the
key it came from. Checked: logits NMSE <= 1e-8 (f32 weights, f32 reference: transformers' eager
full forwards) overall and at every position, and the same greedy tokens. Ling 3.0 is also written
in the published checkpoints' layout (config keys of Ling-3.0-tiny/-flash, the KDA output
projection named o_proj) and read back by transformers and by hanpu.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import hanpu  # noqa: E402

VOCAB = 96
PROMPT, NEW = 70, 6  # more than one 64-token chunk of hanpu's linear-attention engine
BOUND = 1e-8

# Dimensions chosen so that no derived value equals its default or its source key's value.
QWEN = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=12, linear_value_head_dim=20, linear_conv_kernel_dim=3, rms_norm_eps=1e-5,
            full_attention_interval=2, partial_rotary_factor=0.5, rope_theta=5000.0, tie_word_embeddings=False,
            initializer_range=0.2, pad_token_id=0, eos_token_id=1, bos_token_id=None)
QWEN_MOE = dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=20, shared_expert_intermediate_size=28)
KIMI = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, moe_intermediate_size=20, num_hidden_layers=4,
            num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=24, q_lora_rank=None, qk_rope_head_dim=6,
            qk_nope_head_dim=10, v_head_dim=14, num_local_experts=6, num_experts_per_tok=2, n_group=2, topk_group=1,
            n_shared_experts=1, routed_scaling_factor=1.7, rms_norm_eps=1e-5, tie_word_embeddings=False,
            initializer_range=0.2, pad_token_id=0, bos_token_id=None, eos_token_id=1,
            # the official checkpoints' nested keys (1-indexed layers), as KimiLinearConfig reads them
            linear_attn_config={"kda_layers": [1, 2, 4], "full_attn_layers": [3], "head_dim": 20, "num_heads": 3,
                                "short_conv_kernel_size": 3},
            first_k_dense_replace=2)
# The Ling 3.0 shapes: KDA head dim 32 in head_dim, MLA qk 32 + 16, v 32.
LING = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, moe_intermediate_size=20, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, head_dim=32, qk_rope_head_dim=16, qk_nope_head_dim=32,
            v_head_dim=32, kv_lora_rank=24, q_lora_rank=20, short_conv_kernel_size=3, layer_group_size=2,
            first_k_dense_replace=1, num_local_experts=6, num_experts_per_tok=2, n_group=2, topk_group=1,
            n_shared_experts=1, routed_scaling_factor=1.5, kda_safe_gate=True, kda_lower_bound=-3.0,
            rope_theta=20000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
            pad_token_id=0, eos_token_id=1)


def build(family):
    t = transformers
    return {
        "qwen3_5": lambda: t.Qwen3_5ForCausalLM(t.Qwen3_5TextConfig(**QWEN)),
        "qwen3_5_moe": lambda: t.Qwen3_5MoeForCausalLM(t.Qwen3_5MoeTextConfig(**QWEN, **QWEN_MOE)),
        "qwen3_next": lambda: t.Qwen3NextForCausalLM(t.Qwen3NextConfig(**QWEN, **QWEN_MOE, decoder_sparse_step=1,
                                                                       mlp_only_layers=[1], norm_topk_prob=False)),
        "kimi_linear": lambda: t.KimiLinearForCausalLM(t.KimiLinearConfig(**KIMI)),
        "bailing_hybrid": lambda: t.BailingHybridForCausalLM(t.BailingHybridConfig(**LING)),
    }[family]()


# What each family's saved config.json must hold for the test to exercise a derived field (checked,
# so a transformers that stops deriving it cannot leave the test vacuous).
DERIVED = {
    "qwen3_5": {"layer_types": ["linear_attention", "full_attention"] * 2},
    "qwen3_5_moe": {"layer_types": ["linear_attention", "full_attention"] * 2},
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"] * 2, "mlp_only_layers": [1]},
    "kimi_linear": {"head_dim": 6, "linear_head_dim": 20, "linear_num_heads": 3, "linear_conv_kernel_dim": 3,
                    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                    "mlp_layer_types": ["dense", "dense", "sparse", "sparse"]},
    "bailing_hybrid": {"head_dim": 16, "linear_head_dim": 32, "linear_num_heads": 4, "linear_conv_kernel_dim": 3,
                       "layer_types": ["linear_attention", "full_attention"] * 2},
}

_cache = {}


def reference(family):
    """(model, prompt, greedy ids, logits [PROMPT + NEW, V]) from transformers, f32, eager."""
    if family not in _cache:
        torch.manual_seed(7)
        model = build(family).float().eval()
        model.config._attn_implementation = "eager"
        with torch.no_grad():
            for name, p in model.named_parameters():  # the biases / A_log init are not random enough alone
                if name.endswith(("expert_bias", "e_score_correction_bias")):
                    p.copy_(torch.randn(p.shape) * 0.1)
        prompt = torch.randint(2, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(3))
        seq = prompt.clone()
        with torch.no_grad():
            for _ in range(NEW):
                logits = model(input_ids=seq[None], use_cache=False).logits[0, -1]
                top2 = torch.topk(logits, 2).values
                assert float(top2[0] - top2[1]) > 1e-3, "a near-tie in the greedy reference: pick another seed"
                seq = torch.cat([seq, logits.argmax().view(1)])
            full = model(input_ids=seq[None], use_cache=False).logits[0].float().numpy()
        _cache[family] = (model, prompt.numpy(), seq[PROMPT:].numpy(), full)
    return _cache[family]


def nmse(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(((x - ref) ** 2).sum() / (ref ** 2).sum())


def check_hanpu(directory, prompt, greedy, logits):
    m = hanpu.Model.load(directory)
    ids = np.concatenate([prompt, greedy]).astype(np.int64)
    got = m.forward(m.new_state(), ids, all_logits=True)
    assert got.shape == logits.shape
    assert nmse(got, logits) <= BOUND, nmse(got, logits)
    worst = max(nmse(got[t], logits[t]) for t in range(len(ids)))
    assert worst <= BOUND, worst
    assert m.generate(prompt, max_new_tokens=NEW, stop_ids=[]) == greedy.tolist()
    return m


@pytest.mark.parametrize("family", list(DERIVED))
def test_save_pretrained_output_runs_unchanged(family, tmp_path):
    model, prompt, greedy, logits = reference(family)
    model.save_pretrained(tmp_path)  # f32, as built: nothing edited afterwards
    saved = json.loads((tmp_path / "config.json").read_text())
    for key, value in DERIVED[family].items():
        assert saved.get(key) == value, (key, saved.get(key))
    m = check_hanpu(tmp_path, prompt, greedy, logits)
    linear, full = ("KDA", "MLA") if family in ("kimi_linear", "bailing_hybrid") else ("GDN", "attention")
    assert m.config["layer_kinds"] == [linear if t == "linear_attention" else full for t in saved["layer_types"]]
    if "linear_head_dim" in saved:
        assert f"KDA {saved['linear_num_heads']} heads x {saved['linear_head_dim']}" in m.config["description"]


PUBLISHED_LING = {  # keys of the published Ling 3.0 config.json that transformers' save does not write
    "architectures": ["BailingMoeV3ForCausalLM"], "no_kda_lora": True, "use_kda_lora": False,
    "gated_attention_proj_granularity_type": "head_wise", "rope_interleave": True, "partial_rotary_factor": 0.5,
    "rope_scaling": None, "use_mla_nope": False, "use_qkv_bias": False, "use_bias": False,
    "scoring_func": "sigmoid", "score_function": "sigmoid", "topk_method": "noaux_tc",
    "moe_router_enable_expert_bias": True, "moe_shared_expert_intermediate_size": 20,
    "expert_swiglu_limit_list": None, "share_expert_swiglu_limit_list": [0, 0, 0, 0],
    "num_nextn_predict_layers": 0,
}


def published_ling(src, dst):
    """The published checkpoints' layout of a save_pretrained directory: the KDA head dim back in
    head_dim, no linear_* / layer_types / mlp_layer_types (layer_group_size and
    first_k_dense_replace decide), and the KDA layers' output projection named o_proj."""
    cfg = json.loads((src / "config.json").read_text())
    kda_layers = [i for i, t in enumerate(cfg["layer_types"]) if t == "linear_attention"]
    cfg["head_dim"] = cfg.pop("linear_head_dim")
    for key in ("linear_num_heads", "linear_conv_kernel_dim", "layer_types", "mlp_layer_types", "qk_head_dim"):
        cfg.pop(key)
    cfg.update(PUBLISHED_LING)
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = safetensors_torch.load_file(str(src / "model.safetensors"))
    for i in kda_layers:
        tensors[f"model.layers.{i}.attention.o_proj.weight"] = tensors.pop(f"model.layers.{i}.attention.dense.weight")
    safetensors_torch.save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return cfg


@pytest.mark.parametrize("model_type", ["bailing_hybrid", "bailing_moe_v3", None])
def test_published_ling_layout(model_type, tmp_path):
    model, prompt, greedy, logits = reference("bailing_hybrid")
    model.save_pretrained(tmp_path / "saved")
    cfg = published_ling(tmp_path / "saved", tmp_path / "published")
    # transformers reads the layout back to the same model (so the layout is one it accepts)
    back = transformers.BailingHybridForCausalLM.from_pretrained(tmp_path / "published", dtype=torch.float32).eval()
    back.config._attn_implementation = "eager"
    with torch.no_grad():
        ids = torch.from_numpy(np.concatenate([prompt, greedy]))[None]
        assert torch.equal(back(input_ids=ids, use_cache=False).logits[0].float(), torch.from_numpy(logits))
    # ... and so does hanpu, under each model_type the published configs and their code use
    if model_type is None:
        cfg.pop("model_type")
    else:
        cfg["model_type"] = model_type
    (tmp_path / "published" / "config.json").write_text(json.dumps(cfg))
    m = check_hanpu(tmp_path / "published", prompt, greedy, logits)
    assert m.config["model_type"] == "bailing_hybrid"


@pytest.mark.parametrize("edit, named", [
    ({"no_kda_lora": False}, "no_kda_lora"),
    ({"gated_attention_proj_granularity_type": "element_wise"}, "gated_attention_proj_granularity_type"),
    ({"expert_swiglu_limit_list": [0, 7.0, 7.0, 7.0]}, "expert_swiglu_limit_list[1]"),
    ({"rope_interleave": False}, "rope_interleave"),
    ({"linear_head_dim": 16}, "linear_head_dim"),  # config and tensors disagree: the tensor and the key named
])
def test_published_ling_options_hanpu_cannot_run_are_named(edit, named, tmp_path):
    model = reference("bailing_hybrid")[0]
    model.save_pretrained(tmp_path / "saved")
    cfg = published_ling(tmp_path / "saved", tmp_path / "published")
    cfg.update(edit)
    (tmp_path / "published" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hanpu.HanpuError) as e:
        hanpu.Model.load(tmp_path / "published")
    assert named in str(e.value) and "config.json" in str(e.value), str(e.value)
    if "linear_head_dim" in edit:
        assert "q_conv1d.weight' has shape [128,1,3], expected [64,1,3]" in str(e.value), str(e.value)
