"""The fp64 token-by-token references of GDN and KDA (hanpu::la_reference, the recurrences
of FLA's naive references with its in-kernel options): the oracle hanpu's own tests use. Inputs are read at their stored precision (so a
bf16 input is compared on the same rounded values) and everything is computed in float64.

Both return (o [B,T,HV,V], final_state [N,HV,K,V], or [N,HV,V,K] with state_v_first) as float64
numpy arrays, whatever the kind of the inputs.
"""

import numpy as np

from . import _arrays as A
from . import _hanpu


def _reference(variant, q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
               use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
               lower_bound=None):
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state),
                    ("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None:
            A.check_array(x, name)
    cu_seqlens = A.as_cu_seqlens(cu_seqlens)
    if initial_state is not None and state_v_first:
        initial_state = A.swap_last(initial_state)
    e = A.to_engine
    o, ht = _hanpu.la_reference(variant, e(q), e(k), e(v), e(g), e(beta), e(initial_state), e(cu_seqlens),
                                e(A_log), e(dt_bias), None if scale is None else float(scale),
                                bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
                                bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval),
                                None if lower_bound is None else float(lower_bound))
    if state_v_first:
        ht = np.ascontiguousarray(np.swapaxes(ht, -1, -2))
    return o, ht


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None,
                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False):
    """GDN in float64: S <- exp(g_t) S; S <- S + k_t^T beta_t (v_t - k_t S); o_t = scale q_t S."""
    return _reference("gdn", q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                      use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                      state_v_first)


def kda(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
        use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, state_v_first=False, lower_bound=None):
    """KDA in float64: as gated_delta_rule with a per-key-channel decay diag(exp(g_t)), g [B,T,HV,K]
    (with use_gate_in_kernel and lower_bound: g = lower_bound * sigmoid(exp(A_log) (g + dt_bias)))."""
    return _reference("kda", q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                      use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                      state_v_first, lower_bound)
