"""hanpu as vLLM-CPU's linear-attention backend: a vLLM general plugin (docs/VLLM.md).

Installed with hanpu, it is found by vLLM through the `vllm.general_plugins` entry point `hanpu`
(pyproject.toml) and loaded in every vLLM process before the model is built. On the CPU platform it
replaces vLLM's Gated DeltaNet layer (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) by a subclass whose CPU
forward runs the convolution and the recurrent core through hanpu, on vLLM's own state pool, in
place (hanpu.integrations.vllm.gdn), and registers CPU model classes for Kimi Linear and Ling 3.0
(transformers' BailingHybridForCausalLM) built from vLLM's parts with hanpu's KDA
(hanpu.integrations.vllm.kimi_linear, hanpu.integrations.vllm.ling). Elsewhere (CUDA, ROCm, XPU)
it does nothing.

    HANPU_VLLM=0 vllm serve ...      # vLLM without the plugin (hanpu stays installed)
    VLLM_PLUGINS=hanpu vllm serve ... # vLLM's own switch: load only the plugins named

What vLLM asks for that hanpu cannot honour is refused with an error naming the option:
speculative decoding (its multi-slot state layout) when the model is built; LoRA on the GDN
projections and prefill checkpoint states (prefix caching that wants states inside a prefill) at
the first call. Prefix caching in vLLM's "align" mode (its default) runs.
"""

import os

__all__ = ["enabled", "register"]


def enabled():
    """Whether the plugin replaces vLLM's layers in this process (HANPU_VLLM unset or not "0")."""
    return os.environ.get("HANPU_VLLM", "1") != "0"


def register():
    """vLLM's general-plugin hook: called once per process, before any model is built."""
    if not enabled():
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from . import gdn, kimi_linear, ling

    gdn.register()
    kimi_linear.register()
    ling.register_config()
    ling.register()
