"""hanpu: linear attention (Gated DeltaNet, Kimi Delta Attention) on CPUs with the Python API of
flash-linear-attention (FLA), and the HA-NPU planner/simulator for edge NPUs. docs/PYTHON.md.

    import hanpu
    o, ht = hanpu.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    o1, ht = hanpu.fused_recurrent_gated_delta_rule(q1, k1, v1, g1, beta=b1, initial_state=ht,
                                                    output_final_state=True)
    hanpu.simulate(device="ascend310p", variant="gdn", T=4096, heads=16)["latency_ms"]
    m = hanpu.Model.load("checkpoint/"); m.generate(ids, max_new_tokens=16)
"""

from . import reference
from ._hanpu import HanpuError
from .ops import (
    chunk_gated_delta_rule,
    chunk_gdn,
    chunk_kda,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gdn,
    fused_recurrent_kda,
    get_num_threads,
    isa,
    set_num_threads,
)
from .model import WEIGHT_FORMATS, Model, ModelState, Tokenizer
from .planning import ablation_steps, describe_plan, device, devices, plan, simulate, strategies

__version__ = "0.1.0"

__all__ = [
    "HanpuError",
    "Model",
    "ModelState",
    "Tokenizer",
    "WEIGHT_FORMATS",
    "ablation_steps",
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_kda",
    "describe_plan",
    "device",
    "devices",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gdn",
    "fused_recurrent_kda",
    "get_num_threads",
    "isa",
    "plan",
    "reference",
    "set_num_threads",
    "simulate",
    "strategies",
]
