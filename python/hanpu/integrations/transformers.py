"""Route the linear-attention kernels of Hugging Face transformers' hybrid models to hanpu.

    import hanpu.integrations.transformers as hanpu_tf

    with hanpu_tf.routed():            # or hanpu_tf.enable() ... hanpu_tf.disable()
        out = model.generate(ids, max_new_tokens=16)
    hanpu_tf.stats()                    # calls per family and kernel: {"hanpu": n, "fallback": n}

What is routed (transformers 5.24; nothing in transformers is edited). Each family's
linear-attention layer calls two module-level functions of its modeling file, looked up as module
globals at every call: one chunked (prefill, and any call with more than one token) and one
token-by-token (a single-token decode step with a cached state):

    family                          modeling module                  functions
    qwen3_5, qwen3_5_text           models/qwen3_5/modeling_qwen3_5  torch_chunk_gated_delta_rule,
    qwen3_5_moe(_text)              models/qwen3_5_moe/...           torch_recurrent_gated_delta_rule (GDN)
    qwen3_next                      models/qwen3_next/...
    kimi_linear                     models/kimi_linear/...           chunk_kimi_delta_attention,
    bailing_hybrid                  models/bailing_hybrid/...        recurrent_kimi_delta_attention (KDA)

Each of those names is a wrapper (transformers' integrations/hub_kernels.py,
`use_kernel_func_from_hub_with_fallback`) that transformers resolved once at import: FLA's kernel
when `fla` imports (it needs triton), else the pure-torch function, kept as `__wrapped__`.
`enable()` replaces the module globals with hanpu-backed functions and `disable()` puts the
originals back, so every model built from those modules is routed, whichever of the two
transformers had picked. (The `kernels` hub package, when installed and asked for with
`use_kernels=True`, replaces whole layer forwards; those are not touched here.)

What hanpu computes is what transformers' torch functions compute: inputs [B, T, H, K] (q, k),
[B, T, HV, V] (v), a log decay g ([B, T, HV] for GDN, [B, T, H, K] for KDA), beta [B, T, HV];
scale K^-0.5; the state [B, HV, K, V] in fp32; q and k L2-normalised in the kernel when the layer
asks (all five do); the output in q's dtype. Bailing's safe gate with its lower bound is applied
by transformers before the kernel (BailingHybridForgetGate.forward: g = lower_bound *
sigmoid(exp(A_log) * (f_proj(x) + dt_bias))), so the kernel receives a plain per-channel log
decay in [lower_bound, 0] and hanpu's `chunk_kda` without `safe_gate` computes it exactly.

Anything else falls back to the function transformers itself would have called, with a
`TransformersFallbackWarning` naming the option: packed sequences (cu_seqlens, seq_idx,
cu_seq_lens_*, max_length_*: transformers' torch path refuses or ignores them, and the causal
convolution in front of the kernel would not keep them apart either), a chunk_size other than 64,
tensors that need a gradient while autograd records (hanpu's outputs carry none), tensors not on
the CPU, dtypes other than fp32/bf16/fp16, shapes that differ from the layout above, keyword
arguments this module does not know, and torch.compile / torch.export tracing. A transformers
whose functions have other parameters than the ones above is refused by `enable()` (RuntimeError
naming the function), so a changed signature is never routed blindly.
"""

import contextlib
import importlib
import inspect
import threading
import warnings

import hanpu

__all__ = ["FAMILIES", "TransformersFallbackWarning", "disable", "enable", "family_of_module", "is_enabled",
           "reset_stats", "routed", "routed_functions", "stats"]


class TransformersFallbackWarning(UserWarning):
    """A linear-attention call that hanpu did not take, run by transformers' own function instead."""


# family -> (modeling module, variant). qwen3_5_text and qwen3_5_moe_text (the text towers) are
# defined in the same modeling modules as their multimodal families.
FAMILIES = {
    "qwen3_5": ("transformers.models.qwen3_5.modeling_qwen3_5", "gdn"),
    "qwen3_5_moe": ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "gdn"),
    "qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", "gdn"),
    "kimi_linear": ("transformers.models.kimi_linear.modeling_kimi_linear", "kda"),
    "bailing_hybrid": ("transformers.models.bailing_hybrid.modeling_bailing_hybrid", "kda"),
}
ALIASES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}

# The module-level names each variant's layers call, and the parameters (in order) their torch
# functions have in transformers 5.24; `enable()` checks the installed ones against these.
FUNCTION_NAMES = {
    "gdn": {"chunk": "torch_chunk_gated_delta_rule", "recurrent": "torch_recurrent_gated_delta_rule"},
    "kda": {"chunk": "chunk_kimi_delta_attention", "recurrent": "recurrent_kimi_delta_attention"},
}
EXPECTED_PARAMETERS = {
    ("gdn", "chunk"): ("query", "key", "value", "g", "beta", "chunk_size", "initial_state", "output_final_state",
                       "use_qk_l2norm_in_kernel", "kwargs"),
    ("gdn", "recurrent"): ("query", "key", "value", "g", "beta", "initial_state", "output_final_state",
                           "use_qk_l2norm_in_kernel", "kwargs"),
    ("kda", "chunk"): ("query", "key", "value", "g", "beta", "chunk_size", "initial_state", "output_final_state",
                       "use_qk_l2norm_in_kernel", "kwargs"),
    ("kda", "recurrent"): ("query", "key", "value", "g", "beta", "initial_state", "output_final_state",
                           "use_qk_l2norm_in_kernel", "kwargs"),
}

# The layers forward their remaining TransformersKwargs (transformers' utils/generic.py) to the
# kernel. These carry no linear-attention option and the torch functions ignore them, so hanpu
# does too (position_embeddings: the rotary (cos, sin) pair bailing_hybrid's decoder layer hands
# every mixer, models/bailing_hybrid/modeling_bailing_hybrid.py). The packed-sequence ones are options: any of them not None falls back.
IGNORED_KWARGS = frozenset({"num_items_in_batch", "output_hidden_states", "output_attentions", "output_router_logits",
                            "position_ids", "position_embeddings", "is_causal", "use_cache", "cache_position",
                            "return_dict"})
PACKED_KWARGS = ("cu_seqlens", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

_HANPU = {
    ("gdn", "chunk"): "chunk_gated_delta_rule",
    ("gdn", "recurrent"): "fused_recurrent_gated_delta_rule",
    ("kda", "chunk"): "chunk_kda",
    ("kda", "recurrent"): "fused_recurrent_kda",
}

_lock = threading.RLock()
_saved = {}  # (module name, function name) -> the original global, while routed
_resolved = {}  # (module name, function name) -> transformers' function as first seen here
_stats = {}  # (family, kind) -> {"hanpu": n, "fallback": n}


def _family_name(family):
    family = ALIASES.get(family, family)
    if family not in FAMILIES:
        raise ValueError(f"unknown transformers family {family!r}; supported: "
                         f"{', '.join(sorted([*FAMILIES, *ALIASES]))}")
    return family


def _torch_function(fn):
    """The pure-torch function under transformers' dispatch wrapper(s)."""
    return inspect.unwrap(fn)


def _check_signature(module, name, variant, kind):
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RuntimeError(f"{module.__name__} has no function {name}: this transformers version calls its "
                           f"{variant.upper()} kernels differently; hanpu.integrations.transformers needs updating")
    params = tuple(inspect.signature(_torch_function(fn)).parameters)
    if params != EXPECTED_PARAMETERS[(variant, kind)]:
        raise RuntimeError(f"{module.__name__}.{name} has parameters {params}, expected "
                           f"{EXPECTED_PARAMETERS[(variant, kind)]}: not routed to hanpu (the arguments could be "
                           f"misread); hanpu.integrations.transformers needs updating")
    _resolved.setdefault((module.__name__, name), fn)
    return fn


def enable(families=None):
    """Routes the linear-attention kernels of `families` (default: all of FAMILIES) to hanpu until
    `disable()`. Imports their modeling modules. Returns the families routed. A family whose
    modeling module cannot be imported raises ImportError naming it; calling enable() again is
    harmless (nothing is wrapped twice)."""
    names = list(FAMILIES) if families is None else [_family_name(f) for f in families]
    with _lock:
        plan = []
        for family in names:
            module_name, variant = FAMILIES[family]
            try:
                module = importlib.import_module(module_name)
            except ImportError as e:
                raise ImportError(f"transformers family {family!r}: cannot import {module_name} ({e}); "
                                  f"transformers 5.24 or later defines it") from e
            for kind, name in FUNCTION_NAMES[variant].items():
                if (module_name, name) in _saved:
                    continue
                original = _check_signature(module, name, variant, kind)
                plan.append((module, name, original, _make_routed(family, variant, kind, original)))
        for module, name, original, fn in plan:  # all checked first: nothing half-routed on an error
            _saved[(module.__name__, name)] = original
            setattr(module, name, fn)
    return names


def disable(families=None):
    """Puts back transformers' own functions for `families` (default: every routed one)."""
    names = list(FAMILIES) if families is None else [_family_name(f) for f in families]
    with _lock:
        for family in names:
            module_name, variant = FAMILIES[family]
            for name in FUNCTION_NAMES[variant].values():
                original = _saved.pop((module_name, name), None)
                if original is not None:
                    setattr(importlib.import_module(module_name), name, original)


def is_enabled(family):
    """Whether `family`'s kernels are routed to hanpu now."""
    module_name, variant = FAMILIES[_family_name(family)]
    with _lock:
        return all((module_name, n) in _saved for n in FUNCTION_NAMES[variant].values())


@contextlib.contextmanager
def routed(families=None):
    """`with routed(): ...` routes like enable() inside the block; on leaving it, exactly what was
    not routed before the block is put back (so blocks nest, and an enable() from outside stays)."""
    names = list(FAMILIES) if families is None else [_family_name(f) for f in families]
    with _lock:
        before = {f for f in names if is_enabled(f)}
        enable(names)
    try:
        yield
    finally:
        disable([f for f in names if f not in before])


def routed_functions(family):
    """{"chunk": fn, "recurrent": fn}: the hanpu-backed functions enable() installs for `family`,
    without installing them (for code that does its own swapping, e.g. to time the calls, as
    examples/qwen35_transformers.py does). They fall back to transformers' own functions."""
    family = _family_name(family)
    module_name, variant = FAMILIES[family]
    module = importlib.import_module(module_name)
    result = {}
    with _lock:
        for kind, name in FUNCTION_NAMES[variant].items():
            # transformers' function as this module first saw it: by now the global may be another
            # caller's wrapper (the example's timer), whose (*args, **kwargs) would be refused.
            original = _resolved.get((module_name, name)) or _check_signature(module, name, variant, kind)
            result[kind] = _make_routed(family, variant, kind, original)
    return result


def family_of_module(module_name):
    """The family whose linear-attention layers are defined in `module_name`, or None."""
    for family, (name, _) in FAMILIES.items():
        if name == module_name:
            return family
    return None


def stats():
    """Calls since the last reset_stats(), per (family, kind) with kind "chunk" or "recurrent":
    {"hanpu": calls hanpu computed, "fallback": calls handed to transformers' own function}."""
    with _lock:
        return {key: dict(counts) for key, counts in _stats.items()}


def reset_stats():
    with _lock:
        _stats.clear()


def _count(family, kind, path):
    with _lock:
        counts = _stats.setdefault((family, kind), {"hanpu": 0, "fallback": 0})
        counts[path] += 1


def _tracing(torch):
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling():
        return True
    dynamo = getattr(torch, "_dynamo", None)
    return bool(dynamo is not None and getattr(dynamo, "is_compiling", lambda: False)())


def _unsupported(variant, kind, args, extra):
    """Why hanpu cannot take this call (a string naming the option), or None."""
    import torch

    if _tracing(torch):
        return "torch.compile / torch.export tracing (hanpu's functions are opaque to the tracer)"
    for key, value in extra.items():
        if key in PACKED_KWARGS:
            if value is not None:
                return f"`{key}` (packed sequences)"
        elif key not in IGNORED_KWARGS:
            return f"the keyword argument `{key}`, which hanpu.integrations.transformers does not know"
    q, k, v, g, beta = (args[n] for n in ("query", "key", "value", "g", "beta"))
    h0 = args.get("initial_state")
    tensors = {"query": q, "key": k, "value": v, "g": g, "beta": beta, "initial_state": h0}
    for name, x in tensors.items():
        if x is None and name == "initial_state":
            continue
        if not isinstance(x, torch.Tensor):
            return f"`{name}` of type {type(x).__name__} (expected a torch tensor)"
        if x.device.type != "cpu":
            return f"`{name}` on device {x.device} (hanpu runs on the CPU)"
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"`{name}` of dtype {x.dtype} (hanpu takes float32, bfloat16 and float16 here)"
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors.values()):
        return "autograd (inputs that require grad; hanpu's outputs carry no gradient)"
    if kind == "chunk" and args.get("chunk_size", 64) != 64:
        return f"`chunk_size`={args['chunk_size']} (hanpu's chunked path uses 64, transformers' default)"
    if not isinstance(args.get("use_qk_l2norm_in_kernel", False), bool):
        return f"`use_qk_l2norm_in_kernel`={args['use_qk_l2norm_in_kernel']!r} (expected a bool)"
    if not isinstance(args.get("output_final_state", False), bool):
        return f"`output_final_state`={args['output_final_state']!r} (expected a bool)"
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        return (f"the shapes query {list(q.shape)}, key {list(k.shape)}, value {list(v.shape)} "
                f"(expected [B, T, H, K], [B, T, H, K], [B, T, HV, V])")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if variant == "gdn":
        if HV % H != 0:
            return f"{HV} value heads for {H} query/key heads (not a multiple)"
        g_shape = (B, T, HV)
    else:
        if HV != H:  # transformers' KDA functions have no grouped value heads
            return f"{HV} value heads for {H} query/key heads (transformers' KDA has equal counts)"
        g_shape = (B, T, H, K)
    if tuple(g.shape) != g_shape:
        return f"`g` of shape {list(g.shape)} (expected {list(g_shape)})"
    if tuple(beta.shape) != (B, T, HV):
        return f"`beta` of shape {list(beta.shape)} (expected {[B, T, HV]})"
    if h0 is not None and tuple(h0.shape) != (B, HV, K, V):
        return f"`initial_state` of shape {list(h0.shape)} (expected [B, HV, K, V] = {[B, HV, K, V]})"
    return None


def _make_routed(family, variant, kind, original):
    signature = inspect.signature(_torch_function(original))
    hanpu_fn = getattr(hanpu, _HANPU[(variant, kind)])
    label = f"{family} {FUNCTION_NAMES[variant][kind]}"

    def fallback(reason, args, kwargs):
        warnings.warn(f"{label}: {reason}: not routed to hanpu, running transformers' own function",
                      TransformersFallbackWarning, stacklevel=3)
        _count(family, kind, "fallback")
        return original(*args, **kwargs)

    def routed_call(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            return fallback(f"arguments that do not fit {signature} ({e})", args, kwargs)
        named = dict(bound.arguments)
        extra = named.pop("kwargs", {})
        reason = _unsupported(variant, kind, named, extra)
        if reason is not None:
            return fallback(reason, args, kwargs)
        q = named["query"]
        try:
            # g and beta by name: fused_recurrent_gated_delta_rule's fifth parameter is gk, as in FLA.
            o, state = hanpu_fn(q, named["key"], named["value"], g=named["g"], beta=named["beta"],
                                initial_state=named.get("initial_state"),
                                output_final_state=named.get("output_final_state", False),
                                use_qk_l2norm_in_kernel=named.get("use_qk_l2norm_in_kernel", False))
        except NotImplementedError as e:  # an option hanpu's functions refuse, named in the message
            return fallback(str(e), args, kwargs)
        _count(family, kind, "hanpu")
        if o.dtype != q.dtype:  # transformers returns the output in the query's dtype
            o = o.to(q.dtype)
        return o, state

    routed_call.__name__ = routed_call.__qualname__ = f"hanpu_{FUNCTION_NAMES[variant][kind]}"
    routed_call.__doc__ = f"{label} computed by hanpu.{_HANPU[(variant, kind)]} (hanpu.integrations.transformers)."
    routed_call.hanpu_original = original
    return routed_call
