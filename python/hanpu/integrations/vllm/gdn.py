"""vLLM's Gated DeltaNet layer (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) with hanpu's CPU kernels.

vLLM 0.32 builds each GDN layer as `QwenGatedDeltaNetAttention`, a PluggableLayer: registering
an out-of-tree class under that name makes vLLM build `HanpuGatedDeltaNetAttention` instead. It
keeps every parameter, weight loader and the state shapes of vLLM's class and changes only the
CPU forward's core, the part vLLM runs as its custom op `cpu_gdn_attention_core`
(vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py):

- the causal convolution in front of the recurrence, through `hanpu._hanpu.causal_conv_slots` on
  vLLM's conv-state pool in place (vLLM's own convolution for a layer with a conv bias or another
  activation). Its output rows are bf16 with bf16 activations on an AMX CPU (vLLM's own precision;
  the prefill's GEMMs then run on AMX, HANPU_VLLM_AMX), else fp32;
- the gated delta rule (gate -exp(A_log) softplus(a + dt_bias), beta sigmoid(b), q and k
  L2-normalised, scale K^-0.5) through `hanpu._hanpu.la_slots`: decode tokens token by token,
  prefill chunks head-fused, on the recurrent-state pool itself. vLLM declares that pool
  [slots, HV, V, K] but its CPU kernels read it as [slots, HV, K, V] (a view, not a transpose);
  hanpu reads it the same way, so states pass between the two freely.

Unlike vLLM's own CPU kernels (bf16 only, head dims 64 and 128 only) any dtype and head dim
hanpu runs is accepted. The core is registered as the torch custom op
`torch.ops.vllm.hanpu_gdn_attention_core` (vLLM's `direct_register_custom_op`), so that vLLM's
compiled mode treats it as one opaque call, as it does vLLM's own. hanpu's parallel work runs on
torch's OpenMP team (use_torch_openmp_team), whose workers spin-wait on the other cores between
torch ops.
"""

import os

import numpy as np
import torch

from hanpu import _hanpu

_REGISTERED = False
# The in-tree layer replaced (its class name is the key of vLLM's out-of-tree registry).
LAYER_NAME = "QwenGatedDeltaNetAttention"


def _refuse(option, got, why):
    raise NotImplementedError(f"hanpu vLLM plugin: {option} = {got!r} is not supported ({why}); "
                              f"set HANPU_VLLM=0 to run vLLM's own layer")


def conv_taps(weight):
    """A conv weight ([D, 1, W] or [D, W]) as the engine's taps: (tensor, engine array) of fp32
    [W, D], tap j of every channel in row j (what `_hanpu.causal_conv_slots` takes)."""
    taps = weight.detach().reshape(weight.size(0), weight.size(-1)).t().float().contiguous()
    return taps, engine_array(taps)


def _conv_taps(layer):
    """The GDN conv weight's taps (conv_taps), made once per layer: the plain weight, or the
    unpacked copy vLLM keeps next to a weight it packed for its C++ kernel (AVX512-BF16 or Arm bf16
    machines). None when the layer's convolution is not one the engine's conv runs (a bias, or an
    activation other than SiLU): vLLM's then runs."""
    cached = getattr(layer, "_hanpu_conv_taps", None)
    if cached is None:
        weight = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
        if weight is None:
            weight = layer.conv1d.weight
        ok = layer.conv1d.bias is None and layer.activation in ("silu", "swish")
        cached = layer._hanpu_conv_taps = conv_taps(weight) if ok else (None, None)
    return cached[1]


def hanpu_conv(layer, mixed_qkv, conv_state, slots, has_initial_state, query_start_loc, taps, threads, bf16=False):
    """The causal convolution with SiLU through `_hanpu.causal_conv_slots` on vLLM's conv-state pool
    (layer.kv_cache[0] as vLLM allocated it), in place: returns the [tokens, D] output, a numpy view
    of a buffer shared by every layer (valid until the next call): fp32, or with `bf16` its bf16
    rounding as the engine array (uint16 bits, "bf16")."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    # vLLM's "SD" layout is [slots, W-1, D]; "DS" ([slots, D, W-1]) goes as the transposed view.
    if is_conv_state_dim_first():
        conv_state = conv_state.transpose(1, 2)
    out = _conv_out(*mixed_qkv.shape, bf16=bf16)
    e = engine_array
    _hanpu.causal_conv_slots(e(mixed_qkv), _pool_array(layer, conv_state), slots, e(has_initial_state),
                             e(query_start_loc), taps, out, threads)
    return out


def amx_setting():
    """HANPU_VLLM_AMX: how the prefill's GEMMs run on AMX ("split" by default, "round", or "off":
    ExecOptions::amx, docs/ACCURACY.md); None where the engine cannot run them (no usable AMX)."""
    setting = os.environ.get("HANPU_VLLM_AMX", "split")
    if setting not in ("off", "round", "split"):
        _refuse("HANPU_VLLM_AMX", setting, 'expected "off", "round" or "split"')
    return setting if setting != "off" and _hanpu.la_amx_usable() else None


_TEAM = [None]  # whether the engine runs on torch's OpenMP team; None: not set up yet


def _torch_openmp_path():
    """The path of the OpenMP runtime torch loaded (libgomp, or libiomp5), from /proc/self/maps;
    None if there is none (or no /proc)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if line.rstrip().endswith((".so", ".so.1")) and "/" in line}
    except OSError:
        return None
    found = sorted(p for p in paths if os.path.basename(p).startswith(("libgomp", "libiomp5")))
    # torch's own copy first (wheels bundle a renamed libgomp next to libtorch_cpu)
    found.sort(key=lambda p: "torch" not in p)
    return found[0] if found else None


def use_torch_openmp_team():
    """Once per process: the engine's parallel work (convolution, recurrence) runs on torch's
    OpenMP team rather than on hanpu's own pool (`_hanpu.use_openmp_team`). torch's workers
    spin-wait on the other cores after every torch op; hanpu's pool would share those cores with
    them (docs/VLLM.md). HANPU_VLLM_OMP_TEAM=0 keeps hanpu's pool. Returns whether the team is used."""
    if _TEAM[0] is None:
        _TEAM[0] = False
        if os.environ.get("HANPU_VLLM_OMP_TEAM", "1") != "0":
            path = _torch_openmp_path()
            if path is not None:
                _TEAM[0] = _hanpu.use_openmp_team(path)
    return _TEAM[0]


def decode_threads(threads):
    """Threads for a single request's decode step: HANPU_VLLM_DECODE_THREADS if set; else all of
    them on torch's OpenMP team (use_torch_openmp_team: its workers are awake, a hand-off costs
    microseconds), one on hanpu's own pool (its second thread would meet torch's spinning worker)."""
    n = int(os.environ.get("HANPU_VLLM_DECODE_THREADS", threads if use_torch_openmp_team() else 1))
    if n < 1:
        _refuse("HANPU_VLLM_DECODE_THREADS", n, "expected a positive thread count")
    return n


def _bf16_rows(layer, mixed_qkv):
    """Whether the conv writes bf16 rows for the recurrence: bf16 activations (vLLM's own precision
    then: its conv output is bf16) on a CPU whose AMX runs the engine's GEMMs on them. fp32
    activations keep fp32 rows."""
    return mixed_qkv.dtype == torch.bfloat16 and layer.hanpu_amx is not None


# The convolution's fp32 output, one buffer per process grown as needed: it is read by the
# recurrence right after the convolution, before the next layer's convolution writes it. A fresh
# [tokens, 6144] fp32 tensor per call (Qwen3.5-0.8B, 6 MiB for 256 tokens) cost more in page faults
# than the convolution itself (2-core Zen 3: 9 of 12 ms).
# bf16 rows (the bits as uint16) have a buffer of their own.
_CONV_OUT = {False: np.empty(0, np.float32), True: np.empty(0, np.uint16)}


def _conv_out(tokens, dim, bf16=False):
    """A [tokens, dim] numpy view of the shared conv-output buffer: fp32, or bf16 as the engine
    array (uint16 bits, "bf16")."""
    if _CONV_OUT[bf16].size < tokens * dim:
        _CONV_OUT[bf16] = np.empty(tokens * dim, _CONV_OUT[bf16].dtype)
    view = _CONV_OUT[bf16][:tokens * dim].reshape(tokens, dim)
    return (view, "bf16") if bf16 else view


def _pool_array(layer, conv_state):
    """The engine array of the conv-state pool view, made once per layer (re-made if vLLM
    re-allocates the pool)."""
    key = (conv_state.data_ptr(), conv_state.stride())
    cached = getattr(layer, "_hanpu_conv_pool", None)
    if cached is None or cached[0] != key:
        cached = (key, engine_array(conv_state))
        layer._hanpu_conv_pool = cached
    return cached[1]


def _vllm_conv(layer, mixed_qkv, conv_state, state_indices, query_start_loc, has_initial_state, decode):
    """vLLM's causal convolution, as vLLM's `_cpu_gdn_attention_nonspec` runs it."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.model_executor.layers.mamba.ops.cpu import causal_conv1d as conv_torch
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as vllm_gdn

    silu = layer.activation == "silu"
    # vLLM packs the conv weight for its C++ kernel at load time (bf16, width 4, AVX512-BF16 or
    # Arm bf16) and keeps the plain one next to it; a layer without it has plain weights.
    packed = hasattr(layer.conv1d, "_cpu_unpacked_conv_weight")
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(1, 2)  # a view: (slots, dim, width - 1)
    if packed:
        if decode:
            return vllm_gdn._causal_conv1d_update_cpu(
                x=mixed_qkv, conv_states=conv_state, weight=layer.conv1d.weight, bias=layer.conv1d.bias,
                silu_activation=silu, conv_state_indices=state_indices, is_weight_packed=True)
        return vllm_gdn._causal_conv1d_fwd_cpu(
            x=mixed_qkv.transpose(0, 1), weight=layer.conv1d.weight, bias=layer.conv1d.bias, conv_states=conv_state,
            query_start_loc=query_start_loc, cache_indices=state_indices, has_initial_state=has_initial_state,
            silu_activation=silu, is_weight_packed=True).transpose(0, 1)
    weight = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    if decode:
        return conv_torch.causal_conv1d_update_cpu(
            x=mixed_qkv, conv_state=conv_state, weight=weight, bias=layer.conv1d.bias, activation=layer.activation,
            conv_state_indices=state_indices)
    return conv_torch.causal_conv1d_fn_cpu(
        x=mixed_qkv.transpose(0, 1), weight=weight, bias=layer.conv1d.bias, conv_states=conv_state,
        query_start_loc=query_start_loc, cache_indices=state_indices, has_initial_state=has_initial_state,
        activation=layer.activation).transpose(0, 1)


def engine_array(x):
    """What the engine is handed for torch tensor x (None stays None): a numpy view of the same
    memory, bf16 as its uint16 bits tagged "bf16" (hanpu's spelling, python/src/arrays.cpp). With
    torch 2.13 a tensor's DLPack export costs about 3.5 us and its numpy view about 2 us (2-core
    Zen 4): a decode call passes about a dozen tensors, and the engine's own work for one token of
    a small layer is a few microseconds."""
    if x is None:
        return None
    if x.dtype == torch.bfloat16:
        return (x.view(torch.uint16).numpy(), "bf16")
    return x.numpy()


def _layer_arrays(layer, ssm_state):
    """The engine arrays of the tensors that live as long as the layer (the state pool, A_log,
    dt_bias), made once: re-made only if vLLM re-allocates one of them."""
    key = (ssm_state.data_ptr(), layer.A_log.data_ptr(), layer.dt_bias.data_ptr())
    cached = getattr(layer, "_hanpu_arrays", None)
    if cached is None or cached[0] != key:
        cached = (key, engine_array(ssm_state), engine_array(layer.A_log.detach()), engine_array(layer.dt_bias.detach()))
        layer._hanpu_arrays = cached
    return cached[1:]


def _recurrence(layer, mixed_qkv, b, a, out, ssm_state, state_indices, query_start_loc, has_initial_state, threads,
                slots=None):
    """The gated delta rule for one part of the batch after vLLM's convolution (torch tensors): reads
    and updates ssm_state[state_indices] in place and writes out [tokens, HV, V]; slots: the engine
    array of state_indices, if made."""
    key_dim = layer.key_dim // layer.tp_size
    e = engine_array
    q = e(mixed_qkv[:, :key_dim].unflatten(-1, (-1, layer.head_k_dim)).unsqueeze(0))
    k = e(mixed_qkv[:, key_dim:2 * key_dim].unflatten(-1, (-1, layer.head_k_dim)).unsqueeze(0))
    v = e(mixed_qkv[:, 2 * key_dim:].unflatten(-1, (-1, layer.head_v_dim)).unsqueeze(0))
    pool, A_log, dt_bias = _layer_arrays(layer, ssm_state)
    _hanpu.la_slots("gdn", q, k, v, e(a.unsqueeze(0)), e(b.unsqueeze(0)), pool,
                    slots if slots is not None else e(state_indices), e(has_initial_state), e(query_start_loc), A_log,
                    dt_bias, e(out.unsqueeze(0)), None, True, True, True, False, "auto", threads,
                    amx=layer.hanpu_amx or "off")


def _layer_state(layer):
    """The engine arrays that live as long as the layer: the conv-state pool (vLLM's DS layout as
    the transposed view), the recurrent-state pool read as [S,HV,K,V], A_log and dt_bias. Made once,
    re-made if vLLM binds other tensors: checked by identity, which costs next to nothing (making
    them costs some 10 us of torch calls per layer and step)."""
    conv_state, ssm_state = layer.kv_cache[0], layer.kv_cache[1]
    key = (conv_state, ssm_state, layer.A_log, layer.dt_bias)
    cached = getattr(layer, "_hanpu_state", None)
    if cached is not None and all(x is y for x, y in zip(cached[0], key)):
        return cached[1]
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    pool = conv_state.transpose(1, 2) if is_conv_state_dim_first() else conv_state
    S, HV, V, K = ssm_state.shape
    arrays = (engine_array(pool), engine_array(ssm_state.view(S, HV, K, V)), engine_array(layer.A_log.detach()),
              engine_array(layer.dt_bias.detach()))
    layer._hanpu_state = (key, arrays)
    return arrays


def _rows(x, lo, hi):
    """Rows lo:hi of an engine array (a bf16 one is (uint16 bits, "bf16"))."""
    return (x[0][lo:hi], "bf16") if isinstance(x, tuple) else x[lo:hi]


def _batch1(x):
    """An engine array with a leading batch axis of 1."""
    return (x[0][None], "bf16") if isinstance(x, tuple) else x[None]


def _conv_rows(x, conv_pool, slots, has_initial, loc, taps, threads, bf16):
    """hanpu's convolution of one part of the batch, all engine arrays: the shared output rows
    (_conv_out; bf16 ones as (uint16 bits, "bf16"))."""
    out = _conv_out(*(x[0] if isinstance(x, tuple) else x).shape, bf16=bf16)
    _hanpu.causal_conv_slots(x, conv_pool, slots, has_initial, loc, taps, out, threads)
    return out


def _recurrence_rows(layer, rows, b, a, out, pool, A_log, dt_bias, slots, has_initial, loc, threads):
    """The gated delta rule of one part of the batch on hanpu's conv rows, all engine arrays: q, k
    and v are numpy views of the rows."""
    key_dim = layer.key_dim // layer.tp_size
    bf16 = isinstance(rows, tuple)
    r = rows[0] if bf16 else rows
    T = r.shape[0]
    q = r[:, :key_dim].reshape(1, T, -1, layer.head_k_dim)
    k = r[:, key_dim:2 * key_dim].reshape(1, T, -1, layer.head_k_dim)
    v = r[:, 2 * key_dim:].reshape(1, T, -1, layer.head_v_dim)
    if bf16:
        q, k, v = (q, "bf16"), (k, "bf16"), (v, "bf16")
    _hanpu.la_slots("gdn", q, k, v, _batch1(a), _batch1(b), pool, slots, has_initial, loc, A_log, dt_bias, _batch1(out),
                    None, True, True, True, False, "auto", threads, amx=layer.hanpu_amx or "off")


def _core_on_arrays(layer, m, mixed_qkv, b, a, core_attn_out, taps):
    """gdn_attention_core with hanpu's convolution: every tensor becomes an engine array once (a
    torch-to-numpy hand-off is about 2 us, a torch slice about 1 us; numpy's slices cost a fraction
    of that), then both parts of the batch run on numpy views."""
    e = engine_array
    conv_pool, pool, A_log, dt_bias = _layer_state(layer)
    x, bb, aa, out = e(mixed_qkv), e(b), e(a), e(core_attn_out)
    idx, loc = e(m.non_spec_state_indices_tensor), e(m.non_spec_query_start_loc)
    bf16 = _bf16_rows(layer, mixed_qkv)
    nd, ndt, npf, npt = m.num_decodes, m.num_decode_tokens, m.num_prefills, m.num_prefill_tokens
    if nd > 0:
        threads = layer.hanpu_decode_threads if nd == 1 else layer.hanpu_threads
        slots, dloc = idx[:nd], loc[:nd + 1]
        rows = _conv_rows(_rows(x, 0, ndt), conv_pool, slots, None, dloc, taps, threads, bf16)
        _recurrence_rows(layer, rows, _rows(bb, 0, ndt), _rows(aa, 0, ndt), _rows(out, 0, ndt), pool, A_log, dt_bias,
                         slots, None, dloc, threads)
    if npf > 0:
        end = ndt + npt
        slots, ploc = idx[nd:nd + npf], loc[nd:nd + npf + 1] - loc.dtype.type(ndt)
        has_initial = np.ascontiguousarray(e(m.has_initial_state)[nd:nd + npf])
        rows = _conv_rows(_rows(x, ndt, end), conv_pool, slots, has_initial, ploc, taps, layer.hanpu_threads, bf16)
        _recurrence_rows(layer, rows, _rows(bb, ndt, end), _rows(aa, ndt, end), _rows(out, ndt, end), pool, A_log,
                         dt_bias, slots, has_initial, ploc, layer.hanpu_threads)


def gdn_attention_core(layer, attn_metadata, mixed_qkv, b, a, core_attn_out):
    """What vLLM's `cpu_gdn_attention_core` computes (non-speculative), with hanpu's kernels.
    The batch is ordered decodes first, then prefills (vLLM's GDN metadata builder)."""
    taps = _conv_taps(layer)
    if taps is not None:
        return _core_on_arrays(layer, attn_metadata, mixed_qkv, b, a, core_attn_out, taps)
    # vLLM's convolution (a conv bias, or another activation), on torch tensors
    state_indices = attn_metadata.non_spec_state_indices_tensor
    query_start_loc = attn_metadata.non_spec_query_start_loc
    conv_state = layer.kv_cache[0]
    ssm_state = layer.kv_cache[1]
    slots, heads, v_dim, k_dim = ssm_state.shape
    ssm_state = ssm_state.view(slots, heads, k_dim, v_dim)  # vLLM's kernels' reading, see above
    num_decodes, num_decode_tokens = attn_metadata.num_decodes, attn_metadata.num_decode_tokens
    num_prefills, num_prefill_tokens = attn_metadata.num_prefills, attn_metadata.num_prefill_tokens
    if num_decodes > 0:
        indices = state_indices[:num_decodes]
        loc = query_start_loc[:num_decodes + 1]
        slots = engine_array(indices)
        threads = layer.hanpu_decode_threads if num_decodes == 1 else layer.hanpu_threads
        x = _vllm_conv(layer, mixed_qkv[:num_decode_tokens], conv_state, indices, loc, None, True)
        _recurrence(layer, x, b[:num_decode_tokens], a[:num_decode_tokens], core_attn_out[:num_decode_tokens],
                    ssm_state, indices, loc, None, threads, slots=slots)
    if num_prefills > 0:
        end = num_decode_tokens + num_prefill_tokens
        indices = state_indices[num_decodes:num_decodes + num_prefills]
        loc = query_start_loc[num_decodes:num_decodes + num_prefills + 1] - num_decode_tokens
        has_initial = attn_metadata.has_initial_state[num_decodes:num_decodes + num_prefills]
        slots = engine_array(indices)
        x = _vllm_conv(layer, mixed_qkv[num_decode_tokens:end], conv_state, indices, loc, has_initial, False)
        _recurrence(layer, x, b[num_decode_tokens:end], a[num_decode_tokens:end], core_attn_out[num_decode_tokens:end],
                    ssm_state, indices, loc, has_initial.contiguous(), layer.hanpu_threads, slots=slots)


def _core_op(mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor,
             layer_name: str) -> None:
    from vllm.forward_context import get_forward_context
    from vllm.utils.torch_utils import _resolve_layer_name

    layer_name = _resolve_layer_name(layer_name)
    context = get_forward_context()
    attn_metadata = context.attn_metadata
    if attn_metadata is None:  # vLLM's profile run: no states yet
        return
    layer = context.no_compile_layers[layer_name]
    metadata = attn_metadata[layer.prefix]
    if metadata.num_actual_tokens == 0:
        return
    if getattr(metadata, "checkpoint", None) is not None:
        # Checkpoint slots inside a prefill (prefix caching that saves states mid-prefill), which
        # vLLM's own CPU kernels do not write either: refused rather than silently skipped.
        _refuse("GDNAttentionMetadata.checkpoint", "prefill checkpoints",
                "states at block boundaries inside a prefill are not written")
    # Contiguous token rows, as vLLM's core makes them: its C++ convolution reads x [dim, tokens] as
    # the transpose of a row-major [tokens, dim] (mixed_qkv is a column slice of the projection).
    gdn_attention_core(layer, metadata, mixed_qkv.contiguous(), b.contiguous(), a.contiguous(), core_attn_out)


def _register_op():
    from vllm.utils.torch_utils import LayerNameType, direct_register_custom_op

    # The annotation vLLM's own op has (a str, or vLLM's LayerName wrapper when enabled).
    _core_op.__annotations__["layer_name"] = LayerNameType
    direct_register_custom_op(op_name="hanpu_gdn_attention_core", op_func=_core_op, mutates_args=["core_attn_out"])


def _layer_class():
    from einops import rearrange
    from vllm.model_executor.custom_op import PluggableLayer
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.utils.torch_utils import _encode_layer_name

    class HanpuGatedDeltaNetAttention(QwenGatedDeltaNetAttention):
        """vLLM's QwenGatedDeltaNetAttention with hanpu's CPU core (module docstring)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.num_spec > 0:
                _refuse("speculative_config.num_speculative_tokens", self.num_spec,
                        "vLLM keeps draft states in several slots per request")
            # Prefix caching: vLLM 0.32 has the modes "none" and "align" (its default with
            # enable_prefix_caching). "align" keeps one state per request in the slot of its current
            # block and copies states between slots itself: what the kernels here read and write.
            # Checkpoint states inside a prefill are refused per call (_core_op).
            # Prefill chunks: as many threads as vLLM's torch (OMP_NUM_THREADS / VLLM_CPU_OMP_THREADS_BIND).
            self.hanpu_threads = torch.get_num_threads()
            # A decode step of a single request: about 60 us of work per layer (16 heads of 128),
            # on all threads when hanpu runs on torch's OpenMP team (decode_threads; 2-core Xeon:
            # la_slots 40 us against 62 us on one thread), else on one: handing half of it to
            # hanpu's own second worker cost more than it saved while torch's OpenMP worker,
            # spin-waiting after the previous torch op, held that core (benchmarks/
            # vllm_gdn_kernels.py, idle 2-core Zen 4: 58.6 us on 1 thread against 74-77 us on 2).
            self.hanpu_decode_threads = decode_threads(self.hanpu_threads)
            # bf16 activations on an AMX CPU: the conv writes bf16 rows and the prefill's GEMMs run
            # on AMX (amx_setting, _bf16_rows).
            self.hanpu_amx = amx_setting()

        def forward_cpu(self, hidden_states):
            if hasattr(self, "in_proj_qkv"):
                _refuse("enable_lora", True, "LoRA splits the GDN input projection")
            mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            if self.gqa_interleaved_layout:  # Qwen3-Next: unpack the interleaved GQA layout
                query, key, value, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
                query, key, value = (rearrange(x, "l p d -> l (p d)") for x in (query, key, value))
                mixed_qkv = torch.cat((query, key, value), dim=-1)
            else:  # Qwen3.5: [q, k, v, z] and [b, a]
                qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
                z_size = self.value_dim // self.tp_size
                mixed_qkv, z = mixed_qkvz.split([qkv_size, z_size], dim=-1)
                z = z.reshape(z.size(0), -1, self.head_v_dim)
                b, a = ba.chunk(2, dim=-1)
            core_attn_out = torch.zeros((hidden_states.size(0), self.num_v_heads // self.tp_size, self.head_v_dim),
                                        dtype=hidden_states.dtype, device=hidden_states.device)
            torch.ops.vllm.hanpu_gdn_attention_core(mixed_qkv, b, a, core_attn_out, _encode_layer_name(self.prefix))
            return self._output_projection(core_attn_out, z)

    PluggableLayer.register_oot(HanpuGatedDeltaNetAttention, name=LAYER_NAME)
    return HanpuGatedDeltaNetAttention


def register():
    """Registers the custom op and the layer (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    use_torch_openmp_team()
    _register_op()
    _layer_class()
    _REGISTERED = True
