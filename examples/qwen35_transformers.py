#!/usr/bin/env python3
"""Run a transformers Qwen3.5 model on the CPU with its Gated DeltaNet calls routed to hanpu.

On a machine without a GPU, transformers runs the GDN layers of Qwen3.5 with its own pure-torch
fallbacks (`torch_chunk_gated_delta_rule` for prefill, `torch_recurrent_gated_delta_rule` for
decode) because FLA's Triton kernels need a GPU. hanpu's `chunk_gated_delta_rule` and
`fused_recurrent_gated_delta_rule` have FLA's names and arguments, so they can stand in for those
two calls without touching the rest of the model. This script:

  1. builds a Qwen3.5 model: by default the text tower of Qwen3.5-0.8B (shapes from
     Qwen3.5-0.8B's config.json) with random weights drawn by transformers' own initialisation
     (seeded), nothing downloaded; `--model DIR` loads a
     real checkpoint instead (an official Qwen3_5ForConditionalGeneration one works: transformers
     maps it to Qwen3_5ForCausalLM and skips the vision tower);
  2. runs a prefill of `--tokens` random token ids with transformers' own torch fallback and again
     with the GDN calls routed to hanpu, and checks that the logits agree (see FP32_NMSE and
     BF16_DISCREPANCY; a bf16 run also runs the same weights in fp32 once, as the reference), and
     every GDN call against the fp64 reference on its own inputs (LayerCheck);
  3. times both: median over `--repeats` prefills each, the two paths interleaved so that a slow
     spell of a shared machine hits both; the untimed checking run is the warm-up. The GDN calls
     are wrapped with a timer, so the speedup is printed for the whole prefill and for the GDN
     calls alone;
  4. decodes a few greedy tokens after the prefill (hanpu's chunk final state feeding hanpu's
     recurrent step: the prefill-to-decode handoff) and checks each step's logits against the
     torch fallback fed the same tokens.

How the routing works (transformers 5.x; nothing in transformers is edited): the GDN layer's
forward (Qwen3_5GatedDeltaNet.forward) calls the module-level names `torch_chunk_gated_delta_rule`
and `torch_recurrent_gated_delta_rule` of its modeling module, each a wrapper that transformers
resolved once at import time (FLA if importable, else the torch function, kept as `__wrapped__`).
`GdnRouting` swaps those two module globals for the duration of a `with` block and puts them
back afterwards. The hanpu side is the pair of functions `hanpu.integrations.transformers`
installs (`routed_functions`; docs/PYTHON.md): outside this script one writes
`with hanpu.integrations.transformers.routed(): model.generate(...)`, which routes every supported
family (Qwen3.5, Qwen3.5-MoE, Qwen3-Next, Kimi Linear, Ling 3.0) and hands any call whose options
hanpu does not take back to transformers with a warning. Here the script does the swapping itself
so that it can time the calls and check each against the fp64 reference. The torch side of the comparison is always the wrapper's `__wrapped__` pure-torch
function, so the baseline stays transformers' fallback even where fla is installed. Every model
class whose name ends in "GatedDeltaNet" is handled the same way (tried on Qwen3.5 dense; the
Qwen3.5-MoE modeling file uses the same two names). The causal conv1d in front of the GDN stays transformers' torch version on both sides.

Usage:
    python3 examples/qwen35_transformers.py                        # 0.8B shapes, 512 tokens, fp32
    python3 examples/qwen35_transformers.py --tokens 2048 --dtype bf16 --json out.json
    python3 examples/qwen35_transformers.py --model /path/to/Qwen3.5-0.8B
    python3 examples/qwen35_transformers.py --model tests/golden/qwen35_tiny --tokens 100 --repeats 1
                                                   # seconds: the repo's 4-layer test checkpoint
    python3 examples/qwen35_transformers.py --layers 4 --tokens 128    # 0.8B widths, 4 layers

Exit code 0 when the logits pass the check, 1 when they do not or when the routing did
not take effect (e.g. a transformers version that calls the GDN functions differently), 2 for bad
arguments or a missing package.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

# How each GDN call is checked (LayerCheck; the claim that holds on every CPU): every call the
# hanpu-routed model makes is compared with hanpu's fp64 token-by-token reference
# (hanpu.reference.gated_delta_rule) on that call's own inputs, as the model handed them over (bf16
# inputs are read at their stored values), and so is the torch fallback on the same inputs.
# - Outputs in float32, and every final state (always float32): NMSE <= LAYER_F32_NMSE, the bound of
#   the C++ accuracy grid for fp32 results (docs/ACCURACY.md; measured worst there 1.7e-13).
# - Outputs in bfloat16 (or float16): the output is rounded to that dtype, so no kernel can come
#   closer to the exact result than the exact result rounded (to nearest even) itself. The bound is
#   that rounding's own NMSE, computed per call from the reference, times LAYER_ROUNDING_FACTOR, plus
#   the fp32 arithmetic before the rounding (sqrt(LAYER_F32_NMSE) on the RMS scale):
#       nmse(o, ref) <= (LAYER_ROUNDING_FACTOR * sqrt(nmse(round(ref), ref)) + sqrt(LAYER_F32_NMSE))^2
#   The factor: hanpu rounds its fp32 value x, not the exact ref; x and ref differ by ~1e-7 of a
#   value, which moves it across a rounding boundary for ~1e-5 of the elements, and at a boundary
#   both neighbours are almost equally far, so the two roundings' errors agree to far better than the
#   5% allowed (measured: hanpu and torch both at 1.00x the rounding's NMSE). A kernel that truncated
#   instead of rounding would be at ~4x, one that rounded q or k to bf16 after the L2 norm well above.
LAYER_F32_NMSE = 1e-10
LAYER_ROUNDING_FACTOR = 1.05

# How the logits are checked.
# - float32 model: hanpu's logits against the torch fallback's, normalised MSE
#   sum((a - b)^2) / sum(b^2) at most FP32_NMSE. Both sides compute the gated delta rule in fp32
#   and differ only in summation order (~1e-7 relative per value); measured NMSE ~2e-11 on the
#   0.8B shapes at 512 and 2048 tokens, 3e-12 on tests/golden/qwen35_tiny. Zeroing the GDN outputs
#   moves the logits by NMSE 1.3 (random 0.8B-shaped model) and 0.7 (golden), and a wrong scale
#   is caught (python/tests/test_example_transformers.py).
# - bfloat16 model: two correct bf16 runs do not agree to a fixed NMSE: the bf16 rounding of every
#   layer's output is itself an error of NMSE ~3.5e-3 at the logits of the 0.8B shapes (measured
#   against the same weights in fp32), and where hanpu and torch round one GDN output differently
#   the difference travels through the following bf16 layers. The check: hanpu's bf16 logits differ
#   from transformers' own bf16 run (torch fallback) by at most BF16_DISCREPANCY times that run's
#   own distance from the fp32 model (same weights), NMSE(hanpu, torch) <= 1.0 * NMSE(torch, fp32).
#   Why it holds: the per-call check above shows hanpu's GDN outputs correctly rounded, so the two
#   runs differ only where the same values round differently, a subset of the roundings bf16's own
#   error is made of; were hanpu's deviation an independent error as large as bf16's, the ratio
#   would be 2. Measured over 20 draws (golden tiny model, 100 prefill tokens, 32 decode steps,
#   10 seeds each with HANPU_ISA native and with hanpu and torch both capped at AVX2 through
#   HANPU_ISA, ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA; AMD EPYC Zen 4): 0.004-0.17 at the
#   prefill, 0.07-0.34 at decode. Truncated bf16 GDN outputs give 3.6, a wrong scale far more.
#   The earlier check, hanpu's distance from fp32 at most 1.25x torch's, compared two errors that are
#   mostly the same torch rounding, and which run a one-ulp flip moves further from fp32 is chance:
#   a coin toss around 1 (3 decode tokens: seed 0 gave 1.253 with torch capped at AVX2, exactly the
#   2.766e-4 / 2.207e-4 reported on a Zen 3, and seed 5 gave 2.69; 64 tokens: 0.88-1.18 over 24
#   draws). That ratio is still printed ("ratio" in the JSON: error_ratio) but not checked.
FP32_NMSE = 1e-8
BF16_DISCREPANCY = 1.0
TEST_DECODE_TOKENS = 32

# The text tower of Qwen3.5-0.8B (its config.json; src/model/family_qwen.cpp).
QWEN35_0_8B = dict(
    vocab_size=248320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    tie_word_embeddings=True,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
)

CONFIGS = {"0.8b": QWEN35_0_8B}
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def log(msg):
    """Progress goes to stderr so that `--json -` keeps stdout machine-readable."""
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Routing


class CallStats:
    """Number of calls and seconds spent in the GDN functions, per kind ("chunk", "recurrent")."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.calls = {"chunk": 0, "recurrent": 0}
        self.seconds = {"chunk": 0.0, "recurrent": 0.0}

    def timed(self, kind, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            self.seconds[kind] += time.perf_counter() - start
            self.calls[kind] += 1
            return result

        return call


class GdnRouting:
    """Swaps the GDN functions that a transformers model's linear-attention layers call.

    The layers look the functions up as globals of their modeling module at every call, so
    replacing `torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule` there for the
    duration of `routed()` reroutes every layer of every model built from that module.
    """

    CHUNK_NAME = "torch_chunk_gated_delta_rule"
    RECURRENT_NAME = "torch_recurrent_gated_delta_rule"

    def __init__(self, model):
        layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
        if not layers:
            raise RuntimeError(f"{type(model).__name__} has no *GatedDeltaNet layer: nothing to route")
        self.num_layers = len(layers)
        self.modules = []
        for layer in layers:
            module = sys.modules[type(layer).__module__]
            if module in self.modules:
                continue
            for name in (self.CHUNK_NAME, self.RECURRENT_NAME):
                if not callable(getattr(module, name, None)):
                    raise RuntimeError(
                        f"{module.__name__} has no function {name}: this transformers version calls the GDN "
                        f"kernels differently ({type(layer).__name__}); the routing needs updating")
            self.modules.append(module)
        first = self.modules[0]
        # transformers wraps the torch function with functools.wraps, so __wrapped__ is the pure
        # torch fallback even when the wrapper would dispatch to FLA.
        self.torch_chunk = _unwrapped(getattr(first, self.CHUNK_NAME))
        self.torch_recurrent = _unwrapped(getattr(first, self.RECURRENT_NAME))

    @contextlib.contextmanager
    def routed(self, chunk_fn, recurrent_fn, stats):
        saved = [(m, getattr(m, self.CHUNK_NAME), getattr(m, self.RECURRENT_NAME)) for m in self.modules]
        try:
            for module in self.modules:
                setattr(module, self.CHUNK_NAME, stats.timed("chunk", chunk_fn))
                setattr(module, self.RECURRENT_NAME, stats.timed("recurrent", recurrent_fn))
            yield
        finally:
            for module, chunk, recurrent in saved:
                setattr(module, self.CHUNK_NAME, chunk)
                setattr(module, self.RECURRENT_NAME, recurrent)


def _unwrapped(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


class LayerCheck:
    """Checks every GDN call routed through it against hanpu's fp64 reference on the call's own
    inputs (bounds: LAYER_F32_NMSE, LAYER_ROUNDING_FACTOR above), next to the torch fallback run on
    the same inputs. Only scalars are kept, so a long prefill of a large model costs no memory."""

    def __init__(self, torch_chunk, torch_recurrent):
        self.torch_fns = {"chunk": torch_chunk, "recurrent": torch_recurrent}
        self.rows = {"chunk": [], "recurrent": []}

    def wrap(self, kind, fn):
        def call(query, key, value, g, beta, **kwargs):
            out = fn(query, key, value, g, beta, **kwargs)
            self._check(kind, out, (query, key, value, g, beta), kwargs)
            return out

        return call

    def _check(self, kind, out, inputs, kwargs):
        import numpy as np
        import torch

        import hanpu

        query = inputs[0]
        ref_o, ref_state = hanpu.reference.gated_delta_rule(
            *inputs, scale=kwargs.get("scale"), initial_state=kwargs.get("initial_state"),
            cu_seqlens=kwargs.get("cu_seqlens"),
            use_qk_l2norm_in_kernel=kwargs.get("use_qk_l2norm_in_kernel", False))
        ref_o_t = torch.from_numpy(ref_o)
        if query.dtype == torch.float32:
            o_bound = LAYER_F32_NMSE
            rounding = 0.0
        else:  # the exact result rounded to the output dtype, as a kernel rounds its fp32 result
            rounding = _nmse(torch.from_numpy(ref_o.astype(np.float32)).to(query.dtype), ref_o_t)
            o_bound = (LAYER_ROUNDING_FACTOR * rounding ** 0.5 + LAYER_F32_NMSE ** 0.5) ** 2
        torch_out = self.torch_fns[kind](*inputs, **{k: v for k, v in kwargs.items() if k != "chunk_size"})
        row = {
            "tokens": int(query.shape[1]),
            "o_nmse": _nmse(out[0], ref_o_t),
            "o_bound": o_bound,
            "rounding_nmse": rounding,
            "torch_o_nmse": _nmse(torch_out[0], ref_o_t),
        }
        if kwargs.get("output_final_state") and out[1] is not None:
            row["state_nmse"] = _nmse(out[1], torch.from_numpy(ref_state))
            row["torch_state_nmse"] = _nmse(torch_out[1], torch.from_numpy(ref_state))
        self.rows[kind].append(row)

    def summary(self, failures):
        """Per kind: calls, the worst call (largest NMSE over its bound), hanpu's and torch's worst
        NMSE against the reference; appends a failure for any call over a bound."""
        result = {}
        for kind, rows in self.rows.items():
            if not rows:
                continue
            worst = max(rows, key=lambda r: r["o_nmse"] / r["o_bound"])
            s = {
                "calls": len(rows),
                "worst_o_nmse": worst["o_nmse"],
                "worst_o_bound": worst["o_bound"],
                "worst_o_rounding_nmse": worst["rounding_nmse"],
                "worst_o_over_bound": worst["o_nmse"] / worst["o_bound"],
                "torch_worst_o_nmse": max(r["torch_o_nmse"] for r in rows),
                "o_over_rounding": [r["o_nmse"] / r["rounding_nmse"] for r in rows if r["rounding_nmse"] > 0],
                "torch_o_over_rounding": [r["torch_o_nmse"] / r["rounding_nmse"] for r in rows
                                          if r["rounding_nmse"] > 0],
            }
            states = [r["state_nmse"] for r in rows if "state_nmse" in r]
            if states:
                s["worst_state_nmse"] = max(states)
                s["torch_worst_state_nmse"] = max(r["torch_state_nmse"] for r in rows if "torch_state_nmse" in r)
            bad = [r for r in rows if not r["o_nmse"] <= r["o_bound"]]  # `not <=` also catches NaN
            if bad:
                failures.append(f"GDN {kind} calls against the fp64 reference: {len(bad)} of {len(rows)} over the bound, "
                                f"worst NMSE {worst['o_nmse']:.3e} > {worst['o_bound']:.3e}")
            bad_states = [x for x in states if not x <= LAYER_F32_NMSE]
            if bad_states:
                failures.append(f"GDN {kind} final states against the fp64 reference: {len(bad_states)} of "
                                f"{len(states)} over NMSE {LAYER_F32_NMSE:.0e}, worst {max(bad_states):.3e}")
            result[kind] = s
        return result


def _nmse(test, ref):
    test, ref = test.double(), ref.double()
    diff = test - ref
    return float((diff * diff).sum() / (ref * ref).sum().clamp_min(1e-300))


def hanpu_functions(family="qwen3_5"):
    """The (chunk, recurrent) functions of hanpu.integrations.transformers for `family`: what
    `hanpu.integrations.transformers.routed()` installs, taken here without installing them so
    that GdnRouting can wrap them with its timer. They check every call's options and hand any
    hanpu does not support back to transformers' own function with a warning."""
    from hanpu.integrations import transformers as hanpu_transformers

    functions = hanpu_transformers.routed_functions(family)
    return functions["chunk"], functions["recurrent"]


# ------------------------------------------------------------------------------------------------
# Model


def build_model(args, torch):
    """The model in float32 (bf16 checkpoints widen exactly); `run` narrows it to --dtype after the
    fp32 reference run."""
    import transformers

    start = time.perf_counter()
    if args.model:
        log(f"loading {args.model} ...")
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        fields = dict(CONFIGS[args.config])
        if args.layers:
            fields["num_hidden_layers"] = args.layers
            fields.pop("layer_types", None)  # derived from full_attention_interval (every 4th is attention)
        config = transformers.Qwen3_5TextConfig(**fields)
        log(f"building a random Qwen3.5 ({args.config}, {config.num_hidden_layers} layers) ...")
        torch.manual_seed(args.seed)
        model = transformers.Qwen3_5ForCausalLM(config).float()
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    log(f"  {params / 1e6:.1f} M parameters, {time.perf_counter() - start:.1f} s")
    return model


def output_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


# Share of the machine's CPU time used by other processes above which the timings are flagged: a
# few percent is background (the shell, the kernel's own threads); a compiler job on one core of
# two is 50%.
OTHERS_WARNING = 0.10


class MachineUse:
    """CPU time the whole machine and this process spent from construction to `shares()` (Linux).

    /proc/stat's first line counts every CPU's ticks by kind; getrusage counts this process's own
    (all threads). Their difference is what other processes ran on the machine meanwhile.
    """

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        import resource

        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal ...
        busy = (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / hz
        steal = (ticks[7] if len(ticks) > 7 else 0) / hz
        own = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), busy, steal, own.ru_utime + own.ru_stime

    @classmethod
    def wait_until_quiet(cls, max_seconds, window=3.0):
        """Waits until other processes use at most OTHERS_WARNING of the CPUs over `window` seconds,
        or `max_seconds` have passed; returns the seconds waited."""
        start = time.perf_counter()
        while time.perf_counter() - start < max_seconds:
            sample = cls()
            time.sleep(window)
            if sample.shares().get("other_cpu_share", 0.0) <= OTHERS_WARNING:
                break
        return time.perf_counter() - start

    def shares(self):
        end = self._sample()
        if self.start is None or end is None:
            return {}
        wall = (end[0] - self.start[0]) * (os.cpu_count() or 1)
        others = (end[1] - self.start[1]) - (end[3] - self.start[3])
        return {"other_cpu_share": max(0.0, others / wall), "steal_share": (end[2] - self.start[2]) / wall}


def compare(test, ref):
    """Max abs difference, NMSE and argmax agreement of two logit tensors [..., V]."""
    test, ref = test.double(), ref.double()
    diff = test - ref
    nmse = float((diff * diff).sum() / (ref * ref).sum().clamp_min(1e-300))
    return {
        "max_abs_diff": float(diff.abs().max()),
        "max_abs_ref": float(ref.abs().max()),
        "nmse": nmse,
        "argmax_agree": float((test.argmax(-1) == ref.argmax(-1)).double().mean()),
    }


# ------------------------------------------------------------------------------------------------
# The run


def run(args):
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        log(f"error: {e}; this example needs torch and transformers (pip install torch transformers)")
        return 2
    try:
        import hanpu
    except ImportError as e:
        log(f"error: {e}; build and install the package first: pip install . (from the repository root)")
        return 2

    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    torch.set_num_threads(threads)
    hanpu.set_num_threads(threads)
    dtype = getattr(torch, DTYPES[args.dtype])

    model = build_model(args, torch)  # float32 first: a bf16 run checks against it
    try:
        routing = GdnRouting(model)
    except RuntimeError as e:
        log(f"error: {e}")
        return 1
    from hanpu.integrations import transformers as hanpu_transformers

    family = hanpu_transformers.family_of_module(routing.modules[0].__name__)
    if family is None:
        log(f"{routing.modules[0].__name__} is not a family hanpu.integrations.transformers knows")
        return 1
    hanpu_chunk, hanpu_recurrent = hanpu_functions(family)
    paths = {
        "torch": (routing.torch_chunk, routing.torch_recurrent),
        "hanpu": (hanpu_chunk, hanpu_recurrent),
    }
    if args.route_override is not None:  # tests: route a known-wrong function to see the check fail
        paths["hanpu"] = args.route_override

    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (1, args.tokens), generator=gen)
    check_positions = args.tokens if args.check_positions == 0 else min(args.check_positions, args.tokens)
    stats = CallStats()
    result = {
        "model": args.model or f"random Qwen3.5 {args.config}",
        "layers": model.config.get_text_config().num_hidden_layers,
        "gdn_layers": routing.num_layers,
        "dtype": DTYPES[args.dtype],
        "tokens": args.tokens,
        "threads": threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hanpu": getattr(hanpu, "__version__", "?"),
    }
    failures = []

    def expect_calls(what, kind, expected):
        if stats.calls[kind] != expected:
            failures.append(f"{what}: expected {expected} {kind} GDN calls, saw {stats.calls[kind]}")

    if args.wait_quiet:
        log(f"waiting up to {args.wait_quiet:.0f} s for other processes to leave the CPUs ...")
        log(f"  waited {MachineUse.wait_until_quiet(args.wait_quiet):.0f} s")

    # 1. Checking runs (also the warm-ups) and greedy decode. The first run picks the greedy tokens;
    #    the others are fed the same tokens, so every decode step compares the paths on one input.
    #    A bf16 run first runs the fp32 model with the torch fallback: the reference both bf16
    #    paths are measured against.
    logits, step_logits, forced = {}, {}, None

    layer_check = LayerCheck(routing.torch_chunk, routing.torch_recurrent) if args.layer_check else None

    def checking_run(name, chunk_fn, recurrent_fn):
        nonlocal forced
        log(f"[{name}] checking prefill of {args.tokens} tokens (untimed warm-up) ...")
        if name == "hanpu" and layer_check is not None:
            chunk_fn, recurrent_fn = layer_check.wrap("chunk", chunk_fn), layer_check.wrap("recurrent", recurrent_fn)
        stats.reset()
        start = time.perf_counter()
        with routing.routed(chunk_fn, recurrent_fn, stats):
            out = model(ids, use_cache=True, logits_to_keep=check_positions)
            expect_calls(f"{name} prefill", "chunk", routing.num_layers)
            logits[name] = out.logits[0].float()
            cache = output_cache(out)
            log(f"  {time.perf_counter() - start:.2f} s; decoding {args.decode} tokens ...")
            stats.reset()
            step_logits[name] = []
            chosen = []
            next_id = out.logits[:, -1].argmax(-1)
            for step in range(args.decode):
                token = next_id if forced is None else forced[step]
                chosen.append(int(token))
                out = model(token.view(1, 1), cache=cache, use_cache=True)
                cache = output_cache(out)
                step_logits[name].append(out.logits[0, -1].float())
                next_id = out.logits[:, -1].argmax(-1)
            expect_calls(f"{name} decode", "recurrent", routing.num_layers * args.decode)
            expect_calls(f"{name} decode", "chunk", 0)
        if forced is None:
            forced = [torch.tensor(t) for t in chosen]
            result["decode_tokens"] = chosen
            result["decode_tokens_from"] = name

    with torch.inference_mode():
        if dtype != torch.float32:
            checking_run("fp32 torch", *paths["torch"])
            model.to(dtype)
        checking_run("hanpu", *paths["hanpu"])
        checking_run("torch", *paths["torch"])

    def check(what, hanpu_logits, torch_logits, fp32_logits):
        c = compare(hanpu_logits, torch_logits)
        if fp32_logits is None:
            c["limit"] = f"NMSE <= {FP32_NMSE:.0e}"
            if not c["nmse"] <= FP32_NMSE:  # `not <=` also catches NaN
                failures.append(f"{what} logits differ: NMSE {c['nmse']:.3e} > {FP32_NMSE:.0e}")
        else:
            c["nmse_vs_fp32"] = {"hanpu": compare(hanpu_logits, fp32_logits)["nmse"],
                                 "torch": compare(torch_logits, fp32_logits)["nmse"]}
            c["error_ratio"] = c["nmse_vs_fp32"]["hanpu"] / max(c["nmse_vs_fp32"]["torch"], 1e-300)
            c["discrepancy"] = c["nmse"] / max(c["nmse_vs_fp32"]["torch"], 1e-300)
            c["limit"] = f"NMSE(hanpu, torch) <= {BF16_DISCREPANCY} x NMSE(torch, fp32)"
            if not c["discrepancy"] <= BF16_DISCREPANCY:
                failures.append(f"{what} logits: hanpu's bf16 logits differ from the torch fallback's by NMSE "
                                f"{c['nmse']:.3e}, {c['discrepancy']:.2f}x the torch fallback's own distance from "
                                f"the fp32 model {c['nmse_vs_fp32']['torch']:.3e} (limit {BF16_DISCREPANCY}x)")
        return c

    if layer_check is not None:
        result["layer_check"] = layer_check.summary(failures)
    result["prefill_check"] = check("prefill", logits["hanpu"], logits["torch"], logits.get("fp32 torch"))
    result["prefill_check"]["positions"] = check_positions
    if args.decode:
        stacked = {name: torch.stack(steps) for name, steps in step_logits.items()}
        result["decode_check"] = check("decode", stacked["hanpu"], stacked["torch"], stacked.get("fp32 torch"))

    # 2. Timed prefills, the paths interleaved. The CPU use of other processes is recorded because
    #    other work on the machine slows the torch fallback far more than hanpu: its many small
    #    OpenMP regions each wait for every thread, and one descheduled thread stalls them all
    #    (a single 512-token GDN call on 2 threads went from ~0.06 s to 0.2-3.8 s at load 5), so the
    #    share of the machine that other processes used during the timed runs is measured and shown.
    machine = MachineUse()
    times = {name: {"total": [], "gdn": []} for name in paths}
    with torch.inference_mode():
        for rep in range(args.repeats):
            for name in ("torch", "hanpu"):
                stats.reset()
                with routing.routed(*paths[name], stats):
                    start = time.perf_counter()
                    model(ids, use_cache=True, logits_to_keep=1)
                    total = time.perf_counter() - start
                times[name]["total"].append(total)
                times[name]["gdn"].append(stats.seconds["chunk"])
                log(f"[{name}] prefill {rep + 1}/{args.repeats}: {total:.3f} s (GDN calls {stats.seconds['chunk']:.3f} s)")

    result.update(machine.shares())
    timing = {}
    for name, t in times.items():
        timing[name] = {
            "prefill_s": statistics.median(t["total"]),
            "gdn_s": statistics.median(t["gdn"]),
            "prefill_s_all": t["total"],
            "gdn_s_all": t["gdn"],
            "tokens_per_s": args.tokens / statistics.median(t["total"]),
        }
    result["timing"] = timing
    result["speedup_prefill"] = timing["torch"]["prefill_s"] / timing["hanpu"]["prefill_s"]
    result["speedup_gdn"] = timing["torch"]["gdn_s"] / timing["hanpu"]["gdn_s"]
    result["failures"] = failures

    print_report(result, sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 1 if failures else 0


def print_report(r, out):
    p = r["prefill_check"]
    lines = [
        "",
        f"{r['model']}: {r['layers']} layers ({r['gdn_layers']} GDN), {r['dtype']}, {r['tokens']} tokens, "
        f"{r['threads']} threads, median of {r['repeats']}",
        f"  logits, last {p['positions']} positions: max |diff| {p['max_abs_diff']:.3e} (max |logit| "
        f"{p['max_abs_ref']:.3g}), NMSE {p['nmse']:.3e}, argmax agree {100 * p['argmax_agree']:.1f}%",
    ]
    for what, c in (("prefill", p), ("decode", r.get("decode_check"))):
        if c and "nmse_vs_fp32" in c:
            lines.append(f"  {what} against the fp32 model: NMSE hanpu {c['nmse_vs_fp32']['hanpu']:.3e}, torch "
                         f"{c['nmse_vs_fp32']['torch']:.3e} (ratio {c['error_ratio']:.3f}); hanpu vs torch "
                         f"{c['discrepancy']:.3f}x torch's distance (limit {BF16_DISCREPANCY})")
    for kind, c in r.get("layer_check", {}).items():
        ratio = lambda xs: f"{min(xs):.3f}-{max(xs):.3f}x" if xs else "-"  # noqa: E731
        state = (f"; final states NMSE {c['worst_state_nmse']:.1e} (torch {c['torch_worst_state_nmse']:.1e})"
                 if "worst_state_nmse" in c else "")
        lines.append(f"  GDN {kind} calls vs fp64 reference ({c['calls']}): worst NMSE {c['worst_o_nmse']:.3e} "
                     f"(bound {c['worst_o_bound']:.3e}), torch {c['torch_worst_o_nmse']:.3e}; of the exact "
                     f"result's own rounding: hanpu {ratio(c['o_over_rounding'])}, torch "
                     f"{ratio(c['torch_o_over_rounding'])}{state}")
    d = r.get("decode_check")
    if d:
        lines.append(f"  decode {len(r['decode_tokens'])} tokens ({r['decode_tokens_from']}'s greedy picks, fed to all) "
                     f"{r['decode_tokens']}: max |diff| {d['max_abs_diff']:.3e}, "
                     f"NMSE {d['nmse']:.3e}, argmax agree {100 * d['argmax_agree']:.0f}%")
    t, h = r["timing"]["torch"], r["timing"]["hanpu"]
    lines += [
        f"  {'':24}{'torch fallback':>16}{'hanpu':>12}{'speedup':>10}",
        f"  {'whole prefill (s)':24}{t['prefill_s']:16.3f}{h['prefill_s']:12.3f}{r['speedup_prefill']:9.2f}x",
        f"  {'GDN calls only (s)':24}{t['gdn_s']:16.3f}{h['gdn_s']:12.3f}{r['speedup_gdn']:9.2f}x",
        f"  {'tokens/s':24}{t['tokens_per_s']:16.1f}{h['tokens_per_s']:12.1f}",
    ]
    others = r.get("other_cpu_share")
    if others is not None:
        lines.append(f"  other processes used {100 * others:.0f}% of the CPU time during the timed runs "
                     f"(hypervisor steal {100 * r['steal_share']:.0f}%)")
        if others > OTHERS_WARNING:
            lines.append("  warning: the machine was shared: the timings, the torch fallback's above all, are inflated")
    for failure in r["failures"]:
        lines.append(f"FAILED: {failure}")
    print("\n".join(lines), file=out, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="checkpoint directory (default: random weights of --config)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="0.8b",
                    help="shapes of the random model (default 0.8b: the Qwen3.5-0.8B text tower)")
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers of --config")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--tokens", type=int, default=512, help="prefill length (default 512)")
    ap.add_argument("--repeats", type=int, default=3, help="timed prefills per path (default 3)")
    ap.add_argument("--decode", type=int, default=4, help="greedy tokens decoded after the prefill (default 4)")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for torch and hanpu alike (default: every CPU this process may use)")
    ap.add_argument("--check-positions", type=int, default=128,
                    help="last positions whose logits are compared (default 128; 0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="on a shared machine: after building the model, wait up to SECONDS for other "
                         "processes to use under 10%% of the CPUs before running (default 0: no wait)")
    ap.add_argument("--no-layer-check", dest="layer_check", action="store_false",
                    help="skip checking every GDN call against the fp64 reference (it costs an fp64 "
                         "recurrence per call: seconds per layer at the 0.8B shapes)")
    ap.add_argument("--json", help="write the results as JSON to this file ('-' for stdout)")
    args = ap.parse_args(argv)
    for name in ("tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("decode", "threads", "layers", "check_positions", "wait_quiet"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    if args.model and args.layers:
        ap.error("--layers only applies to the random model, not to --model")
    args.route_override = None
    return args


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
