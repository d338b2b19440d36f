"""The HA-NPU planner and the NPU simulator from Python, as plain dicts (the JSON the CLI's
`hanpu plan -o` and `hanpu simulate --json` write; docs/SIMULATION.md explains the fields).

Devices are named by a bundled file (`devices()` lists them: "ascend310p", "ascend310b"), "host"
(this machine, detected; measured only when asked), a path to a device JSON file, or a dict in
the device schema.
"""

import json
import os

from . import _hanpu

_DEVICE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "devices")


def _bundled():
    if not os.path.isdir(_DEVICE_DIR):
        return {}
    return {f[:-5]: os.path.join(_DEVICE_DIR, f) for f in sorted(os.listdir(_DEVICE_DIR)) if f.endswith(".json")}


def devices():
    """The devices hanpu knows by name: {name: {"name", "kind", "description", "cores", "file"}},
    the bundled device files and "host" (this machine; file None)."""
    out = {}
    for name, path in _bundled().items():
        d = json.loads(_hanpu.load_device_json(path))
        out[name] = {"name": d["name"], "kind": d["kind"], "description": d["description"],
                     "cores": d["cores"]["value"], "file": path}
    out["host"] = {"name": "host", "kind": "cpu", "description": "this machine (detected; see device('host'))",
                   "cores": _hanpu.hardware_threads(), "file": None}
    return out


def _device_text(dev, measure_seconds=0.0, threads=0):
    """(JSON text, origin for error messages) of a device named/given as described above."""
    if isinstance(dev, dict):
        return json.dumps(dev), "device"
    if not isinstance(dev, (str, os.PathLike)):
        raise TypeError(f"device must be a name, a path or a dict, got {type(dev).__name__}")
    dev = os.fspath(dev)
    if dev == "host":
        return _hanpu.host_device_json(int(threads), float(measure_seconds)), "host"
    bundled = _bundled()
    if dev in bundled:
        return _hanpu.load_device_json(bundled[dev]), bundled[dev]
    if os.path.isfile(dev):
        return _hanpu.load_device_json(dev), dev
    raise ValueError(f"device: got {dev!r}, expected one of {sorted(bundled) + ['host']} or a device JSON file")


def device(name="ascend310p", *, measure_seconds=0.0, threads=0):
    """The full description of a device as a dict (every number a {"value", "source", "status"}
    quantity). For "host", measure_seconds > 0 measures the FMA peak and memory bandwidth."""
    text, origin = _device_text(name, measure_seconds, threads)
    return json.loads(_hanpu.check_device_json(text, origin))


def strategies():
    """Planning strategies: the baselines (vllm-ascend, fla, fla-megakernel, flashqla) and hanpu."""
    return list(_hanpu.strategy_names())


def ablation_steps():
    """The ablation from fla to hanpu, one optimisation at a time."""
    return list(_hanpu.ablation_names())


def _positive(name, x):
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected a positive int, got {x!r}")
    return x


def plan(device="ascend310p", variant="gdn", T=4096, heads=16, value_heads=None, batch=1, seqlens=None, K=128,
         V=128, initial_state=True, final_state=True, strategy="hanpu", cores=None):
    """Plans GDN/KDA prefill of `batch` sequences of T tokens (or of the given `seqlens`, varlen) with
    `heads` q/k heads, `value_heads` (default heads) value heads and head dims K, V on a device with a
    strategy. Returns the plan as a dict (kernels with their chunk programs, per-core work items,
    lifetimes, buffer peaks, layouts). Raises ValueError (hanpu.HanpuError) for an invalid problem
    or a plan that does not fit the device's buffers."""
    text, origin = _device_text(device)
    if seqlens is not None:
        seqlens = [int(s) for s in seqlens]
        varlen = True
    else:
        seqlens = [_positive("T", T)] * _positive("batch", batch)
        varlen = False
    H = _positive("heads", heads)
    HV = H if value_heads is None else _positive("value_heads", value_heads)
    return json.loads(_hanpu.plan_json(text, origin, str(variant), seqlens, varlen, H, HV, _positive("K", K),
                                       _positive("V", V), bool(initial_state), bool(final_state), str(strategy),
                                       0 if cores is None else _positive("cores", cores)))


def simulate(device="ascend310p", variant="gdn", T=4096, heads=16, value_heads=None, batch=1, seqlens=None, K=128,
             V=128, initial_state=True, final_state=True, strategy="hanpu", cores=None, plan=None, detail=False):
    """Simulates one strategy's plan of the problem (arguments as `plan`), or a given `plan` dict,
    on a device model. Returns a dict: strategy, device, latency_ms, energy_mj, GM traffic, MACs,
    matrix_utilization, peak buffer bytes, ...; detail=True adds per-operator and per-kernel figures.
    To compare strategies: {s: simulate(strategy=s)["latency_ms"] for s in strategies()}."""
    text, origin = _device_text(device)
    if plan is None:
        plan = globals()["plan"](device=json.loads(text), variant=variant, T=T, heads=heads, value_heads=value_heads,
                                 batch=batch, seqlens=seqlens, K=K, V=V, initial_state=initial_state,
                                 final_state=final_state, strategy=strategy, cores=cores)
    elif not isinstance(plan, dict):
        raise TypeError(f"plan must be a dict from hanpu.plan(), got {type(plan).__name__}")
    return json.loads(_hanpu.simulate_plan_json(text, origin, json.dumps(plan), bool(detail)))


def describe_plan(plan):
    """A human-readable summary of a plan dict (mapping, order, lifetimes, buffer peaks, layouts)."""
    return _hanpu.describe_plan(json.dumps(plan))
