"""Ling 3.0 (transformers' BailingHybridForCausalLM) on vLLM-CPU: vLLM's parts, hanpu's KDA.

vLLM 0.32 has no class for transformers' `BailingHybridForCausalLM` spelling (per-layer
`layer_types` / `mlp_layer_types`, `linear_*` KDA geometry; what tests/golden/bailing_hybrid_tiny
has). Its own `BailingMoeV3ForCausalLM` (vllm/model_executor/models/bailing_moe_v3.py) places MLA
layers by `layer_group_size` only, runs its KDA through Triton (`chunk_kda`, `fused_kda_gate`) and
its MLA through vLLM's MLA backends, which on the CPU take only DeepSeek's 576-wide latent. The
plugin registers `HanpuBailingHybridForCausalLM` under `BailingHybridForCausalLM` on the CPU
platform, built as the Kimi Linear class is (kimi_linear.py):

- **KDA layers:** `HanpuLingDeltaAttention`, a subclass of vLLM's `BailingMoeV3KimiDeltaAttention`
  (its parameters and weight loaders: the fused q/k/v/b projection, full-rank f_proj and g_proj,
  separate q/k/v conv weights, per-head A_log, dt_bias, the gated output norm; its state shapes),
  with a CPU forward: vLLM's CPU causal convolution on the conv-state pool (the three conv weights
  side by side: vLLM keeps the q, k and v conv states side by side in one pool), then
  `_hanpu.la_slots(variant="kda")` on the recurrent-state pool in place, the gate
  `lower_bound * sigmoid(exp(A_log) (f + dt_bias))` (Ling's safe gate) in the kernel.
- **MLA layers:** the Kimi Linear class's MLA-as-MHA (kimi_linear.mla_class) with vLLM's rotary
  embedding for Ling's interleaved RoPE on the rotary part of q and the shared key (vLLM's
  bailing_moe_v3 builds the same one; handed 2-D tensors, which vLLM's CPU kernel needs:
  kimi_linear.rotate_mla) and the head-wise output gate sigmoid(g_proj(x)).
- **MLP / MoE:** kimi_linear.mlp_classes with Ling's names (gate.expert_bias; experts'
  gate_proj/up_proj/down_proj), sigmoid grouped top-k, routed_scaling_factor, shared experts.

Refused when the model is built, naming the option: speculative decoding, pipeline parallelism,
`use_kda_recoverssm`, a head gate other than head_wise, KDA LoRA gates, projection biases, a RoPE
type other than default, SwiGLU clamps, a hidden_act other than silu.
"""

import copy
import os
from collections.abc import Iterable

import torch
from torch import nn

from .gdn import _refuse, conv_taps, decode_threads, engine_array
from .kimi_linear import load_checkpoint_tensor, mla_class, mlp_classes

ARCHITECTURE = "BailingHybridForCausalLM"


def _first(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def normalize_config(config):
    """Gives `config` the hanpu_* attributes the classes here (and kimi_linear's MoE) read, from
    transformers' or the published spelling; returns it. Idempotent."""
    if getattr(config, "_hanpu_normalized", False):
        return config
    layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types is not None:
        if len(types) != layers or any(t not in ("linear_attention", "full_attention") for t in types):
            raise ValueError(f"hanpu vLLM plugin: layer_types {types!r}: expected {layers} entries, each "
                             f"linear_attention or full_attention")
        config.hanpu_kda_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
    else:
        group = _first(config, "layer_group_size", default=6)
        if layers % group:
            raise ValueError(f"hanpu vLLM plugin: num_hidden_layers {layers} is not a multiple of layer_group_size "
                             f"{group} and there is no layer_types (transformers and vLLM place the last layers "
                             f"differently); give layer_types")
        config.hanpu_kda_layers = [i for i in range(layers) if (i + 1) % group]
    mlp_types = getattr(config, "mlp_layer_types", None)
    if mlp_types is not None:
        config.hanpu_sparse_layers = [i for i, t in enumerate(mlp_types) if t == "sparse"]
    else:
        first_dense = _first(config, "first_k_dense_replace", default=2)
        config.hanpu_sparse_layers = list(range(first_dense, layers))
    # KDA geometry: transformers' config writes linear_*; the published configs have head_dim,
    # num_attention_heads and short_conv_kernel_size (src/model/family_bailing_hybrid.cpp).
    config.hanpu_kda_heads = _first(config, "linear_num_heads", "num_attention_heads")
    config.hanpu_kda_dim = _first(config, "linear_head_dim", "head_dim", default=128)
    config.hanpu_kda_conv = _first(config, "linear_conv_kernel_dim", "short_conv_kernel_size", default=4)
    config.hanpu_num_experts = _first(config, "num_experts", "num_local_experts")
    config.hanpu_top_k = _first(config, "num_experts_per_token", "num_experts_per_tok", default=8)
    config.hanpu_n_group = _first(config, "num_expert_group", "n_group", default=1)
    config.hanpu_topk_group = _first(config, "topk_group", default=1)
    config.hanpu_renormalize = _first(config, "moe_renormalize", default=True)
    config.hanpu_shared = _first(config, "num_shared_experts", "n_shared_experts", default=0)
    shared_width = _first(config, "moe_shared_expert_intermediate_size", "moe_intermediate_size")
    config.hanpu_shared_intermediate = shared_width * config.hanpu_shared if config.hanpu_shared else None
    config.hanpu_router = "sigmoid"
    if getattr(config, "routed_scaling_factor", None) is None:
        config.routed_scaling_factor = 1.0
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
                "the CPU Ling model class runs all layers in one stage")
    gate = getattr(config, "gated_attention_proj_granularity_type", "head_wise")
    if gate != "head_wise":
        _refuse("gated_attention_proj_granularity_type", gate, "only the head-wise MLA gate is implemented")
    if getattr(config, "no_kda_lora", True) is False or getattr(config, "use_kda_lora", False):
        _refuse("no_kda_lora", False, "low-rank KDA gate projections are not implemented")
    for option in ("use_bias", "use_qkv_bias"):
        if getattr(config, option, False):
            _refuse(option, True, "projections with biases are not implemented")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        _refuse("rope_parameters.rope_type", rope.get("rope_type"), "only default RoPE is implemented")
    for option in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        if any(v not in (None, 0) for v in (getattr(config, option, None) or [])):
            _refuse(option, getattr(config, option), "SwiGLU clamps are not implemented")
    if config.hidden_act != "silu":
        _refuse("hidden_act", config.hidden_act, "expected silu")


def _kda_class():
    from vllm.model_executor.models.bailing_moe_v3 import BailingMoeV3KimiDeltaAttention
    from vllm.utils.torch_utils import _encode_layer_name

    class HanpuLingDeltaAttention(BailingMoeV3KimiDeltaAttention):
        """vLLM's BailingMoeV3KimiDeltaAttention with a CPU forward through hanpu (module docstring)."""

        def __init__(self, config, **kwargs):
            # vLLM's layer reads the KDA geometry from num_attention_heads / head_dim /
            # short_conv_kernel_size (the published spelling): hand it a copy that has them.
            kda_config = copy.copy(config)
            kda_config.num_attention_heads = config.hanpu_kda_heads
            kda_config.head_dim = config.hanpu_kda_dim
            kda_config.short_conv_kernel_size = config.hanpu_kda_conv
            kda_config.no_kda_lora = True
            super().__init__(kda_config, **kwargs)
            self.hanpu_threads = torch.get_num_threads()
            # As for GDN (gdn.decode_threads): a single request's decode step.
            self.hanpu_decode_threads = decode_threads(self.hanpu_threads)
            self.gate_lower_bound = self.lower_bound if self.safe_gate else None
            self.hanpu_eps = config.rms_norm_eps

        def hanpu_conv_taps(self):
            """The q, k and v conv weights side by side (vLLM keeps the q, k and v conv states side by
            side in one pool) as the engine's fp32 taps (gdn.conv_taps), made once."""
            if getattr(self, "_hanpu_conv_taps", None) is None:
                w = torch.cat([c.weight.detach() for c in (self.q_conv1d, self.k_conv1d, self.v_conv1d)])
                self._hanpu_conv_taps = conv_taps(w)
            return self._hanpu_conv_taps[1]

        def hanpu_arrays(self, ssm_state):
            key = (ssm_state.data_ptr(), self.A_log.data_ptr(), self.dt_bias.data_ptr())
            cached = getattr(self, "_hanpu_arrays", None)
            if cached is None or cached[0] != key:
                cached = (key, engine_array(ssm_state), engine_array(self.A_log.detach().float().flatten().contiguous()),
                          engine_array(self.dt_bias.detach().float().contiguous()))
                self._hanpu_arrays = cached
            return cached[1:]

        def forward(self, hidden_states, positions=None, output=None):
            tokens = hidden_states.size(0)
            size = self.projection_size_per_partition
            if self.separate_b_proj:
                mixed_qkv = self.qkv_proj(hidden_states)[0]
                beta = self.b_proj(hidden_states)[0]
            else:
                mixed_qkv, beta = self.qkvb_proj(hidden_states)[0].split([3 * size, self.local_num_heads], dim=-1)
            g = self.f_proj(hidden_states)[0].unflatten(-1, (self.local_num_heads, self.head_dim))
            gate = self.g_proj(hidden_states)[0]
            out = torch.zeros((tokens, self.local_num_heads, self.head_dim), dtype=hidden_states.dtype,
                              device=hidden_states.device)
            torch.ops.vllm.hanpu_kda_attention_core(mixed_qkv, g, beta, out, _encode_layer_name(self.prefix))
            # The gated output norm (vLLM's FusedRMSNormGated, sigmoid): RMS norm over each head
            # (fp32), times the weight, times sigmoid(gate).
            x = out.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.hanpu_eps)
            x = x * self.o_norm.weight.float() * torch.sigmoid(gate.unflatten(-1, (self.local_num_heads, -1)).float())
            result = self.o_proj(x.to(hidden_states.dtype).flatten(1))[0]
            if output is None:
                return result
            output[:] = result

    return HanpuLingDeltaAttention


def _model_class():
    from vllm.model_executor.layers.fused_moe import fused_moe_make_expert_params_mapping
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateCopyFuncCalculator, MambaStateDtypeCalculator, MambaStateShapeCalculator)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from vllm.model_executor.models.bailing_moe_v3 import _build_mla_rotary_embedding
    from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
    from vllm.model_executor.models.utils import extract_layer_index, make_layers, maybe_prefix

    KDA = _kda_class()
    MLA = mla_class()
    MLP, MoE = mlp_classes()
    EXPERT_NAMES = ("gate_proj", "down_proj", "up_proj")

    class DecoderLayer(nn.Module):
        def __init__(self, config, vllm_config, prefix):
            super().__init__()
            index = extract_layer_index(prefix)
            quant_config = vllm_config.quant_config
            self.is_kda = index in config.hanpu_kda_layers
            # Named as the checkpoint names them (attention., mlp.), so loading needs no mapping.
            if self.is_kda:
                self.attention = KDA(config, quant_config=quant_config, layer_id=index, prefix=f"{prefix}.attention",
                                     model_config=vllm_config.model_config, cache_config=vllm_config.cache_config)
            else:
                self.attention = MLA(config, vllm_config.cache_config, quant_config, f"{prefix}.attention",
                                     rotary_emb=_build_mla_rotary_embedding(config, config.qk_rope_head_dim),
                                     head_gate=True)
            if index in config.hanpu_sparse_layers:
                self.mlp = MoE(config, quant_config, f"{prefix}.mlp", bias_name="expert_bias", ckpt_names=EXPERT_NAMES)
            else:
                self.mlp = MLP(config.hidden_size, config.intermediate_size, quant_config, f"{prefix}.mlp")
            self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

        def forward(self, positions, hidden_states, residual):
            if residual is None:
                residual = hidden_states
                hidden_states = self.input_layernorm(hidden_states)
            else:
                hidden_states, residual = self.input_layernorm(hidden_states, residual)
            hidden_states = self.attention(hidden_states, positions)
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            return self.mlp(hidden_states), residual

    class Model(nn.Module):
        def __init__(self, vllm_config, prefix):
            super().__init__()
            config = vllm_config.model_config.hf_config
            self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
            self.start_layer, self.end_layer, self.layers = make_layers(
                config.num_hidden_layers, lambda prefix: DecoderLayer(config, vllm_config, prefix),
                prefix=f"{prefix}.layers")
            self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

        def forward(self, input_ids, positions, inputs_embeds=None):
            hidden_states = inputs_embeds if inputs_embeds is not None else self.word_embeddings(input_ids)
            residual = None
            for layer in self.layers:
                hidden_states, residual = layer(positions, hidden_states, residual)
            hidden_states, _ = self.norm(hidden_states, residual)
            return hidden_states

    class HanpuBailingHybridForCausalLM(nn.Module, HasInnerState, IsHybrid):
        """Ling 3.0 for vLLM-CPU (module docstring)."""

        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()
            normalize_config(vllm_config.model_config.hf_config)
            check_supported(vllm_config)
            config = vllm_config.model_config.hf_config
            self.config = config
            self.model = Model(vllm_config, maybe_prefix(prefix, "model"))
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
            if getattr(config, "tie_word_embeddings", False):
                self.lm_head = self.lm_head.tie_weights(self.model.word_embeddings)
            self.logits_processor = LogitsProcessor(config.vocab_size)

        def embed_input_ids(self, input_ids):
            return self.model.word_embeddings(input_ids)

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
            return MambaStateShapeCalculator.kda_state_shape(
                vllm_config.parallel_config.tensor_parallel_size, config.hanpu_kda_heads, config.hanpu_kda_dim,
                conv_kernel_size=config.hanpu_kda_conv, num_spec=0)

        @classmethod
        def get_mamba_state_copy_func(cls):
            return MambaStateCopyFuncCalculator.kda_state_copy_func()

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            config = self.config
            kda_layers = set(config.hanpu_kda_layers)
            qkvb = [("q_proj", 0), ("k_proj", 1), ("v_proj", 2), ("b_proj", 3)]
            mlp_stacked = [(".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1)]
            experts = fused_moe_make_expert_params_mapping(
                self, ckpt_gate_proj_name=EXPERT_NAMES[0], ckpt_down_proj_name=EXPERT_NAMES[1],
                ckpt_up_proj_name=EXPERT_NAMES[2], num_experts=config.hanpu_num_experts or 0)
            params = dict(self.named_parameters())
            loaded = set()
            for name, weight in weights:
                parts = name.split(".")
                layer = int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None
                if name.startswith(("mtp.", "model.mtp")) or (layer is not None and layer >= config.num_hidden_layers):
                    continue  # the MTP layer past the model's depth
                # Both attention kinds name their output projection dense (published KDA: o_proj).
                name = name.replace(".attention.dense.", ".attention.o_proj.")
                target, shard = name, None
                if layer in kda_layers and ".attention." in name:
                    # q, k, v (and b, unless vLLM keeps it apart: fp8 checkpoints) are one fused parameter.
                    separate_b = self.model.layers[layer].attention.separate_b_proj
                    for ckpt, s in qkvb:
                        if f".attention.{ckpt}." in name and not (separate_b and ckpt == "b_proj"):
                            fused = "qkv_proj" if separate_b else "qkvb_proj"
                            target, shard = name.replace(f".attention.{ckpt}.", f".attention.{fused}."), s
                            break
                if shard is None and ".mlp." in name and ".experts." not in name:
                    for ckpt, param, s in mlp_stacked:
                        if ckpt in name:
                            target, shard = name.replace(ckpt, param), s
                            break
                load_checkpoint_tensor(params, loaded, name, weight, target, shard, experts, "HanpuBailingHybridForCausalLM")
            return loaded

    return HanpuBailingHybridForCausalLM


_MODEL = None


def model_class():
    """The model class (made on first use: it imports vLLM's model parts)."""
    global _MODEL
    if _MODEL is None:
        _MODEL = _model_class()
    return _MODEL


def __getattr__(name):
    # vLLM's registry resolves "hanpu.integrations.vllm.ling:HanpuBailingHybridForCausalLM" lazily.
    if name == "HanpuBailingHybridForCausalLM":
        return model_class()
    raise AttributeError(name)


_REGISTERED = False


def register():
    """Registers the model class under transformers' architecture name (once). The KDA core op is
    kimi_linear's (registered by kimi_linear.register)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, f"{__name__}:HanpuBailingHybridForCausalLM")
    _REGISTERED = True


def _config_class():
    """A config class for model_type bailing_hybrid when the installed transformers has none
    (transformers 5.19, which vLLM-CPU 0.32 installs, predates BailingHybridConfig): it keeps every
    key of config.json as an attribute, which is all the classes here read."""
    from transformers import PretrainedConfig

    class HanpuBailingHybridConfig(PretrainedConfig):
        model_type = "bailing_hybrid"

    return HanpuBailingHybridConfig


def register_config():
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if "bailing_hybrid" not in CONFIG_MAPPING:
        AutoConfig.register("bailing_hybrid", _config_class())
