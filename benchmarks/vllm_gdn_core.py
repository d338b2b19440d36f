"""The GDN layer's core as vLLM-CPU calls it (convolution + gated delta rule on the state pools),
vLLM's own (`_cpu_gdn_attention_nonspec`) against the hanpu plugin's (`gdn_attention_core`), with
the plugin's time split into its parts (docs/VLLM.md, Speed).

Run in the venv of scripts/setup_vllm.sh (vLLM-CPU and hanpu):

    OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=nobind build/vllm-venv/bin/python benchmarks/vllm_gdn_core.py

Qwen3.5-0.8B's GDN layer by default (16 key and value heads, K = V = 128, conv width 4, D = 6144
conv channels), bf16 activations, a bf16 conv-state pool in vLLM's default "SD" layout and an fp32
recurrent-state pool, as a bf16 model with the published config gets them; no model, no engine:
the layer is a stand-in object holding what the two cores read (weights, pools, vLLM's GDN
metadata). Cases: decode steps of 1, 4 and 16 requests; prefills of 1 x 256, 4 x 64 and 16 x 32
tokens (new sequences, has_initial_state false). Contenders run in turns (`--rounds`), each round
a run of calls; printed per case: the median per call of each side and the plugin's parts
(`conv`: hanpu's convolution with its hand-offs; `la_slots`: the engine call alone; `recurrence`:
la_slots with the Python around it).
"""

import argparse
import os
import statistics
import time
import types

import torch

from hanpu import _hanpu
from hanpu.integrations.vllm import gdn as plugin


def stand_in_layer(H, K, W, slots, threads):
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    D = 3 * H * K
    layer = types.SimpleNamespace(
        activation="silu", key_dim=H * K, value_dim=H * K, tp_size=1, head_k_dim=K, head_v_dim=K,
        num_k_heads=H, num_v_heads=H,
        conv1d=types.SimpleNamespace(weight=(0.3 * torch.randn(D, 1, W)).bfloat16(), bias=None),
        A_log=torch.log(torch.rand(H) * 8 + 1), dt_bias=(0.1 * torch.randn(H)).bfloat16(),  # as vLLM builds them
        hanpu_threads=threads, hanpu_decode_threads=plugin.decode_threads(threads), hanpu_amx=plugin.amx_setting())
    layer.rearrange_mixed_qkv = types.MethodType(QwenGatedDeltaNetAttention.rearrange_mixed_qkv, layer)
    layer.kv_cache = ((0.1 * torch.randn(slots, W - 1, D)).bfloat16(), (0.05 * torch.randn(slots, H, K, K)).float())
    return layer, D


def metadata(lens, decode):
    n = len(lens)
    loc = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    return types.SimpleNamespace(
        non_spec_state_indices_tensor=torch.arange(1, 1 + n, dtype=torch.int32) * 2, non_spec_query_start_loc=loc,
        num_decodes=n if decode else 0, num_decode_tokens=sum(lens) if decode else 0,
        num_prefills=0 if decode else n, num_prefill_tokens=0 if decode else sum(lens),
        has_initial_state=torch.zeros(n, dtype=torch.bool), num_actual_tokens=sum(lens),
        spec_sequence_masks=None, num_accepted_tokens=None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-calls", type=int, default=50)
    ap.add_argument("--prefill-calls", type=int, default=2)
    ap.add_argument("--no-omp-team", action="store_true",
                    help="hanpu's own thread pool instead of torch's OpenMP team (HANPU_VLLM_OMP_TEAM=0)")
    args = ap.parse_args()
    if args.no_omp_team:
        os.environ["HANPU_VLLM_OMP_TEAM"] = "0"
    print("plugin on torch's OpenMP team:", plugin.use_torch_openmp_team())
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as vllm_gdn

    torch.manual_seed(0)
    layer, D = stand_in_layer(args.heads, args.dim, 4, 40, torch.get_num_threads())
    H, K = args.heads, args.dim
    parts = {}

    def timed_part(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    plugin._conv_rows = timed_part("conv", plugin._conv_rows)
    plugin._recurrence_rows = timed_part("recurrence", plugin._recurrence_rows)
    la_slots = _hanpu.la_slots
    _hanpu.la_slots = timed_part("la_slots", la_slots)

    cases = [("decode", [1], True), ("decode", [1] * 4, True), ("decode", [1] * 16, True),
             ("prefill", [256], False), ("prefill", [64] * 4, False), ("prefill", [32] * 16, False)]
    for kind, lens, decode in cases:
        T = sum(lens)
        x = torch.randn(T, D).bfloat16()
        b, a = torch.randn(T, H).bfloat16(), torch.randn(T, H).bfloat16()
        out = torch.zeros(T, H, K, dtype=torch.bfloat16)
        meta = metadata(lens, decode)
        calls = args.decode_calls if decode else args.prefill_calls
        sides = {"vLLM": lambda: vllm_gdn._cpu_gdn_attention_nonspec(layer, meta, x, b, a, out),
                 "plugin": lambda: plugin.gdn_attention_core(layer, meta, x, b, a, out)}
        times = {name: [] for name in sides}
        plugin_parts = {}
        for fn in sides.values():
            fn()  # warm-up
        for _ in range(args.rounds):
            for name, fn in sides.items():
                parts.clear()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / calls)
                if name == "plugin":
                    for k, v in parts.items():
                        plugin_parts.setdefault(k, []).append(v / calls)
        med = {name: statistics.median(t) for name, t in times.items()}
        label = f"{kind} {len(lens)} x {lens[0]}"
        split = ", ".join(f"{k} {1e6 * statistics.median(v):.0f}" for k, v in plugin_parts.items())
        print(f"{label:18s} vLLM {1e6 * med['vLLM']:9.0f} us  plugin {1e6 * med['plugin']:9.0f} us  "
              f"({med['vLLM'] / med['plugin']:.2f}x; plugin parts, us: {split})", flush=True)


if __name__ == "__main__":
    main()
