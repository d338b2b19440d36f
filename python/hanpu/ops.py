"""GDN and KDA with flash-linear-attention's names, arguments and defaults, on the CPU.

Each function mirrors its FLA namesake (fla.ops.gated_delta_rule / fla.ops.kda, docs/PYTHON.md):
same positional order, same keyword names and defaults, same return value (o, final_state or
None), and FLA's ValueError messages for the checks FLA makes. The chunk_* functions run hanpu's
head-fused chunked path, the fused_recurrent_* functions the token-by-token recurrence; both
return the same result up to fp32 rounding.

Differences from FLA (docs/PYTHON.md): inputs may be numpy arrays or CPU torch tensors, and fp32
inputs are fine; options hanpu does not implement raise NotImplementedError naming the option;
unknown keyword arguments raise TypeError (FLA silently ignores them); no autograd (outputs
carry no gradient).
"""

import json
import warnings

from . import _arrays as A
from . import _hanpu

_num_threads = 0  # 0: every hardware thread this process may run on


def set_num_threads(n):
    """Threads the functions use from now on (default: all the process may run on)."""
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    _num_threads = n


def get_num_threads():
    """Threads the functions use."""
    return _num_threads if _num_threads > 0 else _hanpu.hardware_threads()


def isa():
    """The SIMD target the kernels dispatch to: a dict with `target` (Highway's name, e.g. "AVX2"),
    `requested` (the environment variable HANPU_ISA, "" when unset: the best target this CPU has),
    `native` (no cap: the AMX / AVX512-BF16 kernels may run) and `choices` (values HANPU_ISA
    accepts here). Set HANPU_ISA before importing hanpu, e.g. HANPU_ISA=avx2 to run the AVX2 code
    on an AVX-512 machine; a bad value raises ValueError naming it."""
    return dict(_hanpu.isa())


def _unexpected(fname, kwargs):
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(f"{fname}() got an unexpected keyword argument '{name}'")


def _not_implemented(fname, option, why):
    raise NotImplementedError(f"{fname}: `{option}` is not supported by hanpu ({why})")


def _state_layout(state_v_first, kwargs):
    """FLA's deprecated spelling `transpose_state_layout`, accepted with FLA's warning."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                      DeprecationWarning, stacklevel=3)
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    return state_v_first


def _check_varlen(q, initial_state, cu_seqlens):
    """FLA's checks for cu_seqlens, with FLA's messages."""
    if cu_seqlens is None:
        return
    if q.shape[0] != 1:
        raise ValueError(
            f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
            f"Please flatten variable-length inputs before processing.")
    if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise ValueError(
            f"The number of initial states is expected to be equal to the number of input sequences, "
            f"i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")


def _plan_text(plan):
    """plan=: a plan dict (hanpu.plan(device="host", ...)) or its JSON text; None plans for the host."""
    if plan is None:
        return ""
    if isinstance(plan, dict):
        return json.dumps(plan)
    if isinstance(plan, str):
        return plan
    raise TypeError(f"`plan` must be a dict (hanpu.plan(...)) or JSON text, got {type(plan).__name__}")


def _run(variant, fname, path, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, gate_in_kernel,
         A_log, dt_bias, beta_sigmoid, allow_neg_eigval, state_v_first, cu_seqlens, o_like, plan=None,
         lower_bound=None):
    """Checks arguments the way FLA does, allocates o (dtype of o_like) and the fp32 final state in
    the kind of q, and runs the engine on `path` ("hanpu" head-fused chunks, "recurrent")."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        A.check_array(x, name)
        if name in ("q", "k", "v") and len(x.shape) != 4:
            layout = "[B, T, H, K]" if name != "v" else "[B, T, HV, V]"
            raise ValueError(f"`{name}` must have shape {layout}, got {list(x.shape)}")
    for name, x in (("initial_state", initial_state), ("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None:
            A.check_array(x, name)
    cu_seqlens = A.as_cu_seqlens(cu_seqlens)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same number of heads, "
                         f"but got q.shape[2]={q.shape[2]} and k.shape[2]={k.shape[2]}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        raise ValueError(f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by "
                         f"num_heads (H={H}), but got HV % H = {HV % H if H else HV}")
    _check_varlen(q, initial_state, cu_seqlens)
    if allow_neg_eigval and not beta_sigmoid:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    if gate_in_kernel and A_log is None and lower_bound is None:
        raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not set.")
    if not gate_in_kernel:
        A_log = dt_bias = None  # FLA ignores them without the in-kernel gate
        if lower_bound is not None:
            # FLA ignores it too (it bounds the in-kernel gate only); a bound that does nothing is
            # almost always a mistake, so it is refused rather than dropped.
            raise ValueError("`lower_bound` bounds the gate computed in kernel; it needs `use_gate_in_kernel=True` "
                             "(without it g is the finished log decay: clamp g yourself)")
    if lower_bound is not None:
        lower_bound = float(lower_bound)
    if scale is not None:
        scale = float(scale)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    h0 = initial_state
    if h0 is not None and state_v_first:
        if tuple(h0.shape) != (N, HV, V, K):
            raise ValueError(f"`initial_state` must have shape [N, HV, V, K]={[N, HV, V, K]} "
                             f"(state_v_first=True), got {list(h0.shape)}")
        h0 = A.swap_last(h0)  # the engine addresses the transposed layout through strides
    o = A.empty_like_kind(q, (B, T, HV, V), dtype_of=o_like)
    final_state = ht = None
    if output_final_state:
        final_state = A.empty_like_kind(q, (N, HV, V, K) if state_v_first else (N, HV, K, V), float32=True)
        ht = A.swap_last(final_state) if state_v_first else final_state
    e = A.to_engine
    _hanpu.la_prefill(variant, e(q), e(k), e(v), e(g), e(beta), e(h0), e(cu_seqlens), e(A_log), e(dt_bias),
                      e(o), e(ht), scale, bool(l2norm), bool(gate_in_kernel), bool(beta_sigmoid),
                      bool(allow_neg_eigval), path, _num_threads, _plan_text(plan), lower_bound)
    return o, final_state


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, *, chunk_size=64, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           plan=None, **kwargs):
    """Gated DeltaNet prefill, chunked (hanpu's head-fused CPU path). As FLA's
    `fla.ops.gated_delta_rule.chunk_gated_delta_rule`:

    q, k [B,T,H,K]; v [B,T,HV,V] (HV a multiple of H); g [B,T,HV] log decay (raw pre-activation
    with use_gate_in_kernel, then A_log [HV] and optional dt_bias [HV]); beta [B,T,HV];
    initial_state [N,HV,K,V] ([N,HV,V,K] with state_v_first); cu_seqlens [N+1] with B = 1.
    Returns (o [B,T,HV,V] in q's dtype, final_state fp32 or None).
    cu_seqlens_cpu and chunk_indices are accepted (FLA's GPU-side hints; nothing to precompute on
    the CPU). chunk_size must be 64; cp_context (context parallelism) is not supported.
    plan (hanpu's own): a plan dict from hanpu.plan(device="host", ...) (or its JSON text) to run
    instead of the host plan made for these shapes; refused, naming the field, if it does not fit.
    """
    fname = "chunk_gated_delta_rule"
    state_v_first = _state_layout(state_v_first, kwargs)
    _unexpected(fname, kwargs)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got {chunk_size}.")
    if chunk_size != 64:
        _not_implemented(fname, "chunk_size", f"got {chunk_size}; hanpu's chunked path uses 64")
    if cp_context is not None:
        _not_implemented(fname, "cp_context", "context parallelism across devices")
    return _run("gdn", fname, "hanpu", q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                allow_neg_eigval, state_v_first, cu_seqlens, o_like=q, plan=plan)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """Gated DeltaNet, token by token (decode, or short prefill). As FLA's
    `fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule`: g None means no decay, beta None
    means ones; gk [B,T,HV,K] (a per-key-channel log decay, added to g) is supported without the
    in-kernel gate; gv and a per-value-channel beta [B,T,HV,V] are not.
    Returns (o [B,T,HV,V] in v's dtype, final_state fp32 or None).
    """
    fname = "fused_recurrent_gated_delta_rule"
    state_v_first = _state_layout(state_v_first, kwargs)
    _unexpected(fname, kwargs)
    if gv is not None:
        _not_implemented(fname, "gv", "per-value-channel decay")
    for name, x, layout in (("q", q, "[B, T, H, K]"), ("v", v, "[B, T, HV, V]")):
        A.check_array(x, name)
        if len(x.shape) != 4:
            raise ValueError(f"`{name}` must have shape {layout}, got {list(x.shape)}")
    B, T, HV = v.shape[0], v.shape[1], v.shape[2]
    if beta is None:
        beta = A.full_like_kind(q, (B, T, HV), 1.0)
    else:
        A.check_array(beta, "beta")
        if len(beta.shape) == 4:
            _not_implemented(fname, "beta", "a per-value-channel beta [B, T, HV, V]; pass [B, T, HV]")
    if use_gate_in_kernel and g is None:
        raise ValueError("`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
    variant = "gdn"
    if gk is not None:
        if use_gate_in_kernel:
            _not_implemented(fname, "gk", "together with use_gate_in_kernel=True")
        A.check_array(gk, "gk")
        if g is not None:
            A.check_array(g, "g")
            g = gk.float() + g.float()[..., None] if A.is_torch(gk) else gk.astype("float32") + g[..., None]
        else:
            g = gk
        variant = "kda"  # a per-key-channel decay is exactly KDA's recurrence
    elif g is None:
        g = A.full_like_kind(q, (B, T, HV), 0.0)
    return _run(variant, fname, "recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                allow_neg_eigval, state_v_first, cu_seqlens, o_like=v)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, *, chunk_size=64, A_log=None, dt_bias=None,
              plan=None, **kwargs):
    """Kimi Delta Attention prefill, chunked (hanpu's head-fused CPU path). As FLA's
    `fla.ops.kda.chunk_kda`: g [B,T,HV,K] per-key-channel log decay (raw with use_gate_in_kernel,
    then A_log [HV] and dt_bias [HV*K]); other tensors as chunk_gated_delta_rule.
    Returns (o [B,T,HV,V] in q's dtype, final_state fp32 or None).
    lower_bound (with use_gate_in_kernel): the lower-bounded gate
    g = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) (A_log optional: rate 1), as FLA's
    fla/ops/kda/gate.py. safe_gate only selects FLA's kernel for gates bounded in [lower_bound, 0);
    hanpu's kernels are exact for any gate, so it changes nothing here beyond FLA's checks
    (with use_gate_in_kernel it needs lower_bound in [-5, 0)).
    Not supported: return_intermediate_states, cp_context, chunk_size 32.
    disable_recompute (backward only), use_graph and max_num_seqs (Ascend graph mode) have no
    effect here, as in FLA off the NPU. plan: as chunk_gated_delta_rule's.
    """
    fname = "chunk_kda"
    state_v_first = _state_layout(state_v_first, kwargs)
    _unexpected(fname, kwargs)
    if chunk_size not in (32, 64):
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    if chunk_size != 64:
        _not_implemented(fname, "chunk_size", f"got {chunk_size}; hanpu's chunked path uses 64")
    if safe_gate and use_gate_in_kernel:  # FLA's checks and messages (fla/ops/kda/chunk.py)
        if lower_bound is None:
            raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    if return_intermediate_states:
        _not_implemented(fname, "return_intermediate_states", "per-chunk states are never materialized")
    if cp_context is not None:
        _not_implemented(fname, "cp_context", "context parallelism across devices")
    return _run("kda", fname, "hanpu", q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                allow_neg_eigval, state_v_first, cu_seqlens, o_like=q, plan=plan, lower_bound=lower_bound)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """Kimi Delta Attention, token by token. As FLA's `fla.ops.kda.fused_recurrent_kda`.
    Returns (o [B,T,HV,V] in v's dtype, final_state fp32 or None). lower_bound as chunk_kda's.
    """
    fname = "fused_recurrent_kda"
    state_v_first = _state_layout(state_v_first, kwargs)
    _unexpected(fname, kwargs)
    return _run("kda", fname, "recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                allow_neg_eigval, state_v_first, cu_seqlens, o_like=v, lower_bound=lower_bound)


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
