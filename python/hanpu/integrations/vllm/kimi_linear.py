"""Kimi Linear (KimiLinearForCausalLM) on vLLM-CPU, built from vLLM's own parts with hanpu's KDA.

vLLM 0.32 registers KimiLinearForCausalLM from `vllm/models/kimi_k3` (nvidia/ and amd/ subpackages):
its KDA layer runs Triton kernels (convolution, chunked and recurrent KDA, the gated output norm),
its MLA picks a GPU MLA backend, its MoE a Kimi-K3 runner. None of that runs on the CPU. The plugin
registers `HanpuKimiLinearForCausalLM` under the same architecture name on the CPU platform only:

- **KDA layers:** `HanpuKimiDeltaAttention`, a subclass of vLLM's `KimiGatedDeltaNetAttention`
  (vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py) keeping its parameters, weight
  loaders (fused q/k/v/beta/f_a projection, fused conv weight, the 4-D or 1-D A_log) and state
  shapes, with a CPU forward: vLLM's CPU causal convolution on the conv-state pool, then the KDA
  rule (per-channel gate -exp(A_log) softplus(f_b(f_a(x)) + dt_bias), beta = sigmoid(b), q and k
  L2-normalised) through `_hanpu.la_slots(variant="kda")` on vLLM's recurrent-state pool in place,
  decodes and prefills in one step as vLLM's GDN metadata orders them. The output norm (RMS norm
  times sigmoid(gate), in fp32) is a few torch ops.
- **MLA layers:** Kimi Linear's MLA uses no rotary embedding (`mla_use_nope`), so the layer is
  plain multi-head attention once the latent is expanded with kv_b_proj. It runs through vLLM's
  `Attention` with its CPU backend (vLLM's CPU MLA backend takes only DeepSeek's 576-wide latent).
  q, k and v are zero-padded per head to the smallest head size that backend supports (zero
  columns add nothing to q.k; padded v columns are dropped), with the scale of the real qk width.
  The KV cache then holds expanded keys and values, not the latent: more memory per token.
- **MLP / MoE:** vLLM's `MergedColumnParallelLinear`/`RowParallelLinear` + `SiluAndMul` and
  `FusedMoEFactory` (grouped top-k over sigmoid or softmax scores with e_score_correction_bias,
  renormalised, routed_scaling_factor) with the shared experts, as vLLM's DeepSeek-V2 builds them.

Both config spellings are read: Moonshot's (`linear_attn_config` with 1-based `kda_layers`,
`first_k_dense_replace`, `mla_use_nope`) and transformers' (`layer_types`, `mlp_layer_types`,
`linear_num_heads`, ...; what tests/golden/kimi_linear_tiny has). What the classes here cannot run is
refused when the model is built, naming the option (check_supported): RoPE in MLA (`mla_use_nope`
false), MLA's output gate, the Kimi-K3 extensions (`routed_expert_hidden_size`,
`attn_res_block_size`, full-rank KDA gates), `use_kda_recoverssm`, speculative decoding, pipeline
parallelism. (A q LoRA, `q_lora_rank`, is run.)
"""

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from hanpu import _hanpu

from .gdn import _refuse, conv_taps, decode_threads, engine_array, hanpu_conv

ARCHITECTURE = "KimiLinearForCausalLM"


# ---------------------------------------------------------------------------------------------
# The configuration, in either spelling.


def _get(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def normalize_config(config):
    """Gives `config` the attributes the classes here read (Moonshot's names), from either spelling;
    returns it. Idempotent."""
    if getattr(config, "_hanpu_normalized", False):
        return config
    layers = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    lac = getattr(config, "linear_attn_config", None)
    if lac is None:
        if layer_types is None:
            raise ValueError("hanpu vLLM plugin: Kimi Linear config has neither linear_attn_config nor layer_types")
        if len(layer_types) != layers:
            raise ValueError(f"hanpu vLLM plugin: layer_types has {len(layer_types)} entries, expected "
                             f"num_hidden_layers = {layers}")
        lac = {
            "head_dim": config.linear_head_dim,
            "num_heads": config.linear_num_heads,
            "short_conv_kernel_size": _get(config, "linear_conv_kernel_dim", default=4),
            "kda_layers": [i + 1 for i, t in enumerate(layer_types) if t == "linear_attention"],
            "full_attn_layers": [i + 1 for i, t in enumerate(layer_types) if t == "full_attention"],
        }
        other = [t for t in layer_types if t not in ("linear_attention", "full_attention")]
        if other:
            raise ValueError(f"hanpu vLLM plugin: layer_types entry {other[0]!r} is not supported "
                             f"(expected linear_attention or full_attention)")
        config.linear_attn_config = lac
        # transformers' spelling: no rotary embedding in MLA at all.
        config.mla_use_nope = True
    kda = set(lac["kda_layers"])
    config.hanpu_kda_layers = [i for i in range(layers) if i + 1 in kda]
    mlp_types = getattr(config, "mlp_layer_types", None)
    experts = _get(config, "num_experts", "num_local_experts", "n_routed_experts")
    if mlp_types is not None:
        config.hanpu_sparse_layers = [i for i, t in enumerate(mlp_types) if t == "sparse"]
    else:
        first_dense = _get(config, "first_k_dense_replace", default=0)
        freq = _get(config, "moe_layer_freq", default=1)
        config.hanpu_sparse_layers = [i for i in range(layers)
                                      if experts and i >= first_dense and i % freq == 0]
    config.hanpu_num_experts = experts
    config.hanpu_top_k = _get(config, "num_experts_per_token", "num_experts_per_tok")
    config.hanpu_n_group = _get(config, "num_expert_group", "n_group", default=1)
    config.hanpu_topk_group = _get(config, "topk_group", default=1)
    config.hanpu_renormalize = _get(config, "moe_renormalize", "norm_topk_prob", default=True)
    config.hanpu_shared = _get(config, "num_shared_experts", "n_shared_experts", default=0)
    config.hanpu_router = _get(config, "moe_router_activation_func", default="sigmoid")
    config._hanpu_normalized = True
    return config


def check_supported(vllm_config):
    """Refuses, by name, what the classes here cannot run (called when the model is built)."""
    config = vllm_config.model_config.hf_config
    spec = vllm_config.speculative_config
    if spec is not None and spec.num_speculative_tokens:
        _refuse("speculative_config.num_speculative_tokens", spec.num_speculative_tokens,
                "vLLM keeps draft states in several slots per request")
    if getattr(vllm_config.cache_config, "use_kda_recoverssm", False):
        _refuse("cache_config.use_kda_recoverssm", True, "the KDA state-recovery record is not written")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        _refuse("pipeline_parallel_size", vllm_config.parallel_config.pipeline_parallel_size,
                "the CPU Kimi Linear model class runs all layers in one stage")
    if not getattr(config, "mla_use_nope", False):
        _refuse("mla_use_nope", getattr(config, "mla_use_nope", None),
                "MLA with a rotary embedding is not implemented (Kimi Linear uses none)")
    for option in ("routed_expert_hidden_size", "attn_res_block_size"):
        if getattr(config, option, None) is not None:
            _refuse(option, getattr(config, option), "a Kimi-K3 extension")
    if config.linear_attn_config.get("use_full_rank_gate", False):
        _refuse("linear_attn_config.use_full_rank_gate", True, "a Kimi-K3 extension")
    if config.hidden_act != "silu":
        _refuse("hidden_act", config.hidden_act, "expected silu")
    if getattr(config, "mla_use_output_gate", False):
        _refuse("mla_use_output_gate", True, "MLA's output gate is not implemented")


# ---------------------------------------------------------------------------------------------
# KDA: vLLM's layer, hanpu's core.


def kda_core(layer, metadata, mixed_qkv, g, beta, out):
    """The convolution and the KDA rule for one step's tokens: conv states and recurrent states
    (vLLM's pools, slot per request) updated in place, out [tokens, H, V] written."""
    conv_state, ssm_state = layer.kv_cache[0], layer.kv_cache[1]
    taps = layer.hanpu_conv_taps()
    pool, A_log, dt_bias = layer.hanpu_arrays(ssm_state)
    heads, dim = layer.local_num_heads, layer.head_dim
    e = engine_array

    def run(lo, hi, indices, loc, has_initial, threads):
        slots = e(indices)
        # hanpu's causal convolution (SiLU, no bias) on vLLM's conv-state pool: fp32 [tokens, 3 H dim]
        x = hanpu_conv(layer, mixed_qkv[lo:hi], conv_state, slots, has_initial, loc, taps, threads)
        q, k, v = (x[:, i * heads * dim:(i + 1) * heads * dim].reshape(1, hi - lo, heads, dim) for i in range(3))
        _hanpu.la_slots("kda", q, k, v, e(g[lo:hi].unsqueeze(0)), e(beta[lo:hi].unsqueeze(0)), pool,
                        slots, e(has_initial), e(loc), A_log, dt_bias, e(out[lo:hi].unsqueeze(0)), None,
                        True, True, True, False, "auto", threads, lower_bound=layer.gate_lower_bound)

    state_indices = metadata.non_spec_state_indices_tensor
    query_start_loc = metadata.non_spec_query_start_loc
    nd, ndt = metadata.num_decodes, metadata.num_decode_tokens
    np_, npt = metadata.num_prefills, metadata.num_prefill_tokens
    if nd > 0:
        run(0, ndt, state_indices[:nd], query_start_loc[:nd + 1], None,
            layer.hanpu_decode_threads if nd == 1 else layer.hanpu_threads)
    if np_ > 0:
        has_initial = metadata.has_initial_state[nd:nd + np_].contiguous()
        run(ndt, ndt + npt, state_indices[nd:nd + np_], query_start_loc[nd:nd + np_ + 1] - ndt, has_initial,
            layer.hanpu_threads)


def _kda_op(mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, core_attn_out: torch.Tensor,
            layer_name: str) -> None:
    from vllm.forward_context import get_forward_context
    from vllm.utils.torch_utils import _resolve_layer_name

    context = get_forward_context()
    if context.attn_metadata is None:  # vLLM's profile run: no states yet
        return
    layer = context.no_compile_layers[_resolve_layer_name(layer_name)]
    metadata = context.attn_metadata.get(layer.prefix)
    if metadata is None or metadata.num_actual_tokens == 0:
        return
    if getattr(metadata, "checkpoint", None) is not None:
        _refuse("GDNAttentionMetadata.checkpoint", "prefill checkpoints",
                "states at block boundaries inside a prefill are not written")
    if metadata.spec_sequence_masks is not None:
        _refuse("speculative decoding", "spec_sequence_masks", "draft tokens are not run")
    n = metadata.num_actual_tokens
    kda_core(layer, metadata, mixed_qkv[:n].contiguous(), g[:n].contiguous(), beta[:n].contiguous(),
             core_attn_out[:n])


def _layer_class():
    import os

    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import KimiGatedDeltaNetAttention
    from vllm.utils.torch_utils import _encode_layer_name

    class HanpuKimiDeltaAttention(KimiGatedDeltaNetAttention):
        """vLLM's KimiGatedDeltaNetAttention with a CPU forward through hanpu (module docstring)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.hanpu_threads = torch.get_num_threads()
            # As for GDN (gdn.decode_threads): a single request's decode step.
            self.hanpu_decode_threads = decode_threads(self.hanpu_threads)
            self.hanpu_eps = self.layer_norm_epsilon

        def hanpu_conv_taps(self):
            """The conv weight as the engine's fp32 taps (gdn.conv_taps), made once."""
            if getattr(self, "_hanpu_conv_taps", None) is None:
                self._hanpu_conv_taps = conv_taps(self.conv1d.weight)
            return self._hanpu_conv_taps[1]

        def hanpu_arrays(self, ssm_state):
            key = (ssm_state.data_ptr(), self.A_log.data_ptr(), self.dt_bias.data_ptr())
            cached = getattr(self, "_hanpu_arrays", None)
            if cached is None or cached[0] != key:
                cached = (key, engine_array(ssm_state), engine_array(self.A_log.detach().float().contiguous()),
                          engine_array(self.dt_bias.detach().float().contiguous()))
                self._hanpu_arrays = cached
            return cached[1:]

        def forward(self, hidden_states, positions=None):
            tokens = hidden_states.size(0)
            projected = self.in_proj_qkvgfab(hidden_states)[0]
            mixed_qkv, beta, f_a = projected.split(
                [3 * self.local_projection_size, self.local_num_heads, self.head_dim], dim=-1)
            gate = self.g_b_proj(self.g_a_proj(hidden_states)[0])[0]
            g = self.f_b_proj(f_a)[0].unflatten(-1, (self.local_num_heads, self.head_dim))
            out = torch.zeros((tokens, self.local_num_heads, self.head_dim), dtype=hidden_states.dtype,
                              device=hidden_states.device)
            torch.ops.vllm.hanpu_kda_attention_core(mixed_qkv, g, beta, out, _encode_layer_name(self.prefix))
            # The output norm: RMS norm over each head (fp32), times the weight, times sigmoid(gate).
            x = out.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.hanpu_eps)
            x = x * self.o_norm.weight.float() * torch.sigmoid(gate.unflatten(-1, (self.local_num_heads, -1)).float())
            return self.o_proj(x.to(hidden_states.dtype).flatten(1))[0]

    return HanpuKimiDeltaAttention


# ---------------------------------------------------------------------------------------------
# MLA as multi-head attention, MLP, MoE, the model.


def padded_head_size(width):
    """The smallest head size of vLLM's CPU attention backend that holds `width` columns."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = sorted(CPUAttentionBackend.get_supported_head_sizes())
    for size in sizes:
        if size >= width:
            return size
    raise ValueError(f"hanpu vLLM plugin: MLA head width {width} exceeds vLLM's CPU attention head sizes {sizes}")


_MLP_CLASSES = None


def mlp_classes():
    """(MLP, MoE): the dense SwiGLU MLP and the routed + shared experts (grouped top-k over sigmoid
    or softmax scores with a score-correction bias), from vLLM's parts; shared by the Kimi Linear
    and Ling model classes."""
    global _MLP_CLASSES
    if _MLP_CLASSES is not None:
        return _MLP_CLASSES
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory, GateLinear
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

    class MLP(nn.Module):
        def __init__(self, hidden, intermediate, quant_config, prefix, reduce_results=True):
            super().__init__()
            self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2, bias=False,
                                                           quant_config=quant_config, prefix=f"{prefix}.gate_up_proj")
            self.down_proj = RowParallelLinear(intermediate, hidden, bias=False, quant_config=quant_config,
                                               reduce_results=reduce_results, prefix=f"{prefix}.down_proj")
            self.act_fn = SiluAndMul()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_up_proj(x)[0]))[0]

    class MoE(nn.Module):
        """Routed experts plus shared experts, as vLLM's DeepseekV2MoE builds them."""

        def __init__(self, config, quant_config, prefix, bias_name="e_score_correction_bias",
                     ckpt_names=("w1", "w2", "w3")):
            super().__init__()
            n = config.hanpu_num_experts
            self.gate = GateLinear(config.hidden_size, n, out_dtype=torch.float32, prefix=f"{prefix}.gate")
            # The router's score-correction bias, under the checkpoint's name for it.
            bias = nn.Parameter(torch.zeros(n, dtype=torch.float32))
            setattr(self.gate, bias_name, bias)
            self.shared_experts = None
            if config.hanpu_shared:
                width = getattr(config, "hanpu_shared_intermediate", None) or config.moe_intermediate_size * config.hanpu_shared
                self.shared_experts = MLP(config.hidden_size, width,
                                          quant_config, f"{prefix}.shared_experts", reduce_results=False)
            self.experts = FusedMoEFactory(
                shared_experts=self.shared_experts, gate=self.gate, num_experts=n, top_k=config.hanpu_top_k,
                hidden_size=config.hidden_size, intermediate_size=config.moe_intermediate_size,
                renormalize=config.hanpu_renormalize, quant_config=quant_config, use_grouped_topk=True,
                num_expert_group=config.hanpu_n_group, topk_group=config.hanpu_topk_group,
                prefix=f"{prefix}.experts", scoring_func=config.hanpu_router,
                routed_scaling_factor=config.routed_scaling_factor,
                e_score_correction_bias=bias, ckpt_names=ckpt_names,
                router_logits_dtype=torch.float32)

        def forward(self, x):
            return self.experts(hidden_states=x, router_logits=x)

    _MLP_CLASSES = (MLP, MoE)
    return _MLP_CLASSES


def rotate_mla(rotary_emb, positions, q_pe, k_pe):
    """q_pe [tokens, heads, rope] and the shared k_pe [tokens, 1, rope] rotated by vLLM's rotary
    embedding `rotary_emb`; returns new tensors of those shapes.

    They are handed over as 2-D [tokens, heads * rope] and [tokens, rope]: vLLM-CPU 0.32's C++
    rotary kernel (`rotary_embedding`, csrc/cpu/pos_encoding.cpp, what the CPU forward of vLLM's
    RotaryEmbedding calls in eager mode) takes the token count as numel / size(-1), the head count as
    size(-1) / head_size and the token stride as stride(-2). A 3-D q of several heads is then read
    as tokens * heads one-head tokens: head h of token i is rotated with the position of token
    i * heads + h, past the end of `positions` for the later tokens (whatever memory lies there).
    That was Ling's wrong tokens in the mixed batch (docs/VLLM.md); a 1-head key was right."""
    t, heads, rope = q_pe.shape
    q_pe, k_pe = rotary_emb(positions, q_pe.reshape(t, heads * rope).contiguous(),
                            k_pe.reshape(t, rope).contiguous())
    return q_pe.view(t, heads, rope), k_pe.view(t, 1, rope)


_MLA_CLASS = None


def mla_class():
    """MultiHeadLatentAsMHA: MLA run as multi-head attention through vLLM's CPU attention backend
    (module docstring); shared by the Kimi Linear and Ling model classes."""
    global _MLA_CLASS
    if _MLA_CLASS is not None:
        return _MLA_CLASS
    from vllm.distributed import get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear

    class MultiHeadLatentAsMHA(nn.Module):
        """MLA as multi-head attention over the expanded latent (module docstring). With
        `rotary_emb` (Ling) the rotary part of q and of the shared key is rotated first, with
        `head_gate` (Ling) each head's output is scaled by sigmoid(g_proj(x)) before o_proj."""

        def __init__(self, config, cache_config, quant_config, prefix, rotary_emb=None, head_gate=False):
            super().__init__()
            tp = get_tensor_model_parallel_world_size()
            self.heads = config.num_attention_heads // tp
            self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
            self.v_dim, self.rank = config.v_head_dim, config.kv_lora_rank
            self.qk_dim = self.nope + self.rope
            self.padded = padded_head_size(max(self.qk_dim, self.v_dim))
            total = config.num_attention_heads
            self.q_lora_rank = getattr(config, "q_lora_rank", None)
            if self.q_lora_rank is None:
                self.q_proj = ColumnParallelLinear(config.hidden_size, total * self.qk_dim, bias=False,
                                                   quant_config=quant_config, prefix=f"{prefix}.q_proj")
            else:
                self.q_a_proj = ReplicatedLinear(config.hidden_size, self.q_lora_rank, bias=False,
                                                 quant_config=quant_config, prefix=f"{prefix}.q_a_proj")
                self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps=config.rms_norm_eps)
                self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, total * self.qk_dim, bias=False,
                                                     quant_config=quant_config, prefix=f"{prefix}.q_b_proj")
            self.kv_a_proj_with_mqa = ReplicatedLinear(config.hidden_size, self.rank + self.rope, bias=False,
                                                       quant_config=quant_config,
                                                       prefix=f"{prefix}.kv_a_proj_with_mqa")
            self.kv_a_layernorm = RMSNorm(self.rank, eps=config.rms_norm_eps)
            self.kv_b_proj = ColumnParallelLinear(self.rank, total * (self.nope + self.v_dim), bias=False,
                                                  quant_config=quant_config, prefix=f"{prefix}.kv_b_proj")
            self.o_proj = RowParallelLinear(total * self.v_dim, config.hidden_size, bias=False,
                                            quant_config=quant_config, prefix=f"{prefix}.o_proj")
            self.rotary_emb = rotary_emb
            self.g_proj = None
            if head_gate:
                self.g_proj = ColumnParallelLinear(config.hidden_size, total, bias=False, quant_config=quant_config,
                                                   prefix=f"{prefix}.g_proj")
            self.attn = Attention(self.heads, self.padded, self.qk_dim ** -0.5, num_kv_heads=self.heads,
                                  cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn")

        def forward(self, hidden_states, positions=None):
            t = hidden_states.size(0)
            if self.q_lora_rank is None:
                q = self.q_proj(hidden_states)[0]
            else:
                q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)[0]))[0]
            q = q.view(t, self.heads, self.qk_dim)
            latent, k_pe = self.kv_a_proj_with_mqa(hidden_states)[0].split([self.rank, self.rope], dim=-1)
            kv = self.kv_b_proj(self.kv_a_layernorm(latent.contiguous()))[0].view(t, self.heads, self.nope + self.v_dim)
            k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
            k_pe = k_pe.unsqueeze(1)
            if self.rotary_emb is not None:
                q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
                q_pe, k_pe = rotate_mla(self.rotary_emb, positions, q_pe, k_pe)
                q = torch.cat([q_nope, q_pe], dim=-1)
            k = torch.cat([k_nope, k_pe.expand(t, self.heads, self.rope)], dim=-1)
            pad_qk, pad_v = self.padded - self.qk_dim, self.padded - self.v_dim
            q, k, v = F.pad(q, (0, pad_qk)), F.pad(k, (0, pad_qk)), F.pad(v, (0, pad_v))
            out = self.attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1))
            out = out.view(t, self.heads, self.padded)[..., :self.v_dim]
            if self.g_proj is not None:
                out = out * torch.sigmoid(self.g_proj(hidden_states)[0].float()).to(out.dtype).unsqueeze(-1)
            return self.o_proj(out.reshape(t, -1))[0]

    _MLA_CLASS = MultiHeadLatentAsMHA
    return _MLA_CLASS


def _model_classes():
    from vllm.model_executor.layers.fused_moe import fused_moe_make_expert_params_mapping
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateCopyFuncCalculator, MambaStateDtypeCalculator, MambaStateShapeCalculator)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
    from vllm.model_executor.models.utils import extract_layer_index, make_layers, maybe_prefix

    KDA = _layer_class()

    MLP, MoE = mlp_classes()

    MultiHeadLatentAsMHA = mla_class()

    class DecoderLayer(nn.Module):
        def __init__(self, config, vllm_config, prefix):
            super().__init__()
            index = extract_layer_index(prefix)
            quant_config = vllm_config.quant_config
            if index in config.hanpu_kda_layers:
                self.self_attn = KDA(config, vllm_config, prefix=f"{prefix}.self_attn")
            else:
                self.self_attn = MultiHeadLatentAsMHA(config, vllm_config.cache_config, quant_config,
                                                      f"{prefix}.self_attn")
            # Checkpoints name both dense and sparse MLPs block_sparse_moe (Moonshot's dense layers:
            # mlp, renamed when loading).
            if index in config.hanpu_sparse_layers:
                self.block_sparse_moe = MoE(config, quant_config, f"{prefix}.block_sparse_moe")
            else:
                self.block_sparse_moe = MLP(config.hidden_size, config.intermediate_size, quant_config,
                                            f"{prefix}.block_sparse_moe")
            self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

        def forward(self, positions, hidden_states, residual):
            if residual is None:
                residual = hidden_states
                hidden_states = self.input_layernorm(hidden_states)
            else:
                hidden_states, residual = self.input_layernorm(hidden_states, residual)
            hidden_states = self.self_attn(hidden_states, positions)
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            return self.block_sparse_moe(hidden_states), residual

    class Model(nn.Module):
        def __init__(self, vllm_config, prefix):
            super().__init__()
            config = vllm_config.model_config.hf_config
            self.config = config
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
            self.start_layer, self.end_layer, self.layers = make_layers(
                config.num_hidden_layers, lambda prefix: DecoderLayer(config, vllm_config, prefix),
                prefix=f"{prefix}.layers")
            self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

        def forward(self, input_ids, positions, inputs_embeds=None):
            hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
            residual = None
            for layer in self.layers:
                hidden_states, residual = layer(positions, hidden_states, residual)
            hidden_states, _ = self.norm(hidden_states, residual)
            return hidden_states

    class HanpuKimiLinearForCausalLM(nn.Module, HasInnerState, IsHybrid):
        """Kimi Linear for vLLM-CPU (module docstring)."""

        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()
            normalize_config(vllm_config.model_config.hf_config)
            check_supported(vllm_config)
            config = vllm_config.model_config.hf_config
            self.config = config
            self.model = Model(vllm_config, maybe_prefix(prefix, "model"))
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
            if getattr(config, "tie_word_embeddings", False):
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
            self.logits_processor = LogitsProcessor(config.vocab_size)

        def embed_input_ids(self, input_ids):
            return self.model.embed_tokens(input_ids)

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
            return self.model(input_ids, positions, inputs_embeds)

        def compute_logits(self, hidden_states):
            return self.logits_processor(self.lm_head, hidden_states)

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vllm_config):
            return MambaStateDtypeCalculator.kda_state_dtype(
                vllm_config.model_config.dtype, vllm_config.cache_config.mamba_cache_dtype,
                vllm_config.cache_config.mamba_ssm_cache_dtype)

        @classmethod
        def get_mamba_state_shape_from_config(cls, vllm_config):
            config = normalize_config(vllm_config.model_config.hf_config)
            lac = config.linear_attn_config
            return MambaStateShapeCalculator.kda_state_shape(
                vllm_config.parallel_config.tensor_parallel_size, lac["num_heads"], lac["head_dim"],
                conv_kernel_size=lac["short_conv_kernel_size"], num_spec=0)

        @classmethod
        def get_mamba_state_copy_func(cls):
            return MambaStateCopyFuncCalculator.kda_state_copy_func()

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            config = self.config
            kda_layers = set(config.hanpu_kda_layers)
            # checkpoint name -> (parameter name, shard) for the KDA layers' fused parameters
            kda_stacked = [("q_proj", "in_proj_qkvgfab", 0), ("k_proj", "in_proj_qkvgfab", 1),
                           ("v_proj", "in_proj_qkvgfab", 2), ("b_proj", "in_proj_qkvgfab", 3),
                           ("f_a_proj", "in_proj_qkvgfab", 4), ("q_conv1d", "conv1d", 0),
                           ("k_conv1d", "conv1d", 1), ("v_conv1d", "conv1d", 2)]
            mlp_stacked = [(".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1)]
            experts = fused_moe_make_expert_params_mapping(
                self, ckpt_gate_proj_name="w1", ckpt_down_proj_name="w2", ckpt_up_proj_name="w3",
                num_experts=config.hanpu_num_experts or 0)
            params = dict(self.named_parameters())
            loaded = set()
            for name, weight in weights:
                if name.startswith("model.mtp") or "rotary_emb.inv_freq" in name:
                    continue
                name = name.replace(".mlp.", ".block_sparse_moe.")
                # transformers' spelling keeps the gate's A_log and dt_bias under forget_gate.
                name = name.replace(".forget_gate.", ".")
                parts = name.split(".")
                layer = int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None
                if layer is not None and layer >= config.num_hidden_layers:
                    continue  # an MTP layer past the model's depth
                target, shard = name, None
                if layer in kda_layers and ".self_attn." in name:
                    for ckpt, param, s in kda_stacked:
                        if f".self_attn.{ckpt}." in name:
                            target, shard = name.replace(f".self_attn.{ckpt}.", f".self_attn.{param}."), s
                            break
                if shard is None and ".block_sparse_moe." in name and ".experts." not in name:
                    for ckpt, param, s in mlp_stacked:
                        if ckpt in name:
                            target, shard = name.replace(ckpt, param), s
                            break
                load_checkpoint_tensor(params, loaded, name, weight, target, shard, experts, "HanpuKimiLinearForCausalLM")
            return loaded

    return HanpuKimiLinearForCausalLM


def load_checkpoint_tensor(params, loaded, name, weight, target, shard, experts, model_name):
    """Loads one checkpoint tensor into the KDA model classes' parameters (Kimi Linear's and Ling's).

    The caller has mapped the checkpoint's name: `target, shard` name a shard of a fused parameter
    (shard None: not fused). Otherwise a routed expert's weight goes through vLLM's expert mapping
    (`experts`, from fused_moe_make_expert_params_mapping) and any other tensor into the parameter
    of its own name. Adds what it loaded to `loaded`; a tensor with no parameter is an error that
    names it and the model class.
    """
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    if shard is not None:
        param = params[target]
        param.weight_loader(param, weight, shard)
        loaded.add(target)
        return
    if ".experts." in name and ".shared_experts." not in name:
        for param_name, weight_name, expert_id, expert_shard in experts:
            if weight_name not in name:
                continue
            target = name.replace(weight_name, param_name)
            param = params[target]
            if param.weight_loader(param, weight, target, shard_id=expert_shard, expert_id=expert_id,
                                   return_success=True):
                loaded.add(target)
                return
        raise ValueError(f"hanpu vLLM plugin: expert weight {name!r} matches no expert parameter")
    if name not in params:
        raise ValueError(f"hanpu vLLM plugin: checkpoint tensor {name!r} has no parameter in {model_name}")
    param = params[name]
    getattr(param, "weight_loader", default_weight_loader)(param, weight)
    loaded.add(name)


_MODEL = None


def model_class():
    """The model class (made on first use: it imports vLLM's model parts)."""
    global _MODEL
    if _MODEL is None:
        _MODEL = _model_classes()
    return _MODEL


def __getattr__(name):
    # vLLM's registry resolves "hanpu.integrations.vllm.kimi_linear:HanpuKimiLinearForCausalLM" lazily.
    if name == "HanpuKimiLinearForCausalLM":
        return model_class()
    raise AttributeError(name)


_REGISTERED = False


def register():
    """Registers the KDA core op and the model class under vLLM's architecture name (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from vllm import ModelRegistry
    from vllm.utils.torch_utils import LayerNameType, direct_register_custom_op

    _kda_op.__annotations__["layer_name"] = LayerNameType
    direct_register_custom_op(op_name="hanpu_kda_attention_core", op_func=_kda_op, mutates_args=["core_attn_out"])
    ModelRegistry.register_model(ARCHITECTURE, f"{__name__}:HanpuKimiLinearForCausalLM")
    _REGISTERED = True
