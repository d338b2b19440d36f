#!/usr/bin/env python3
"""Fit the simulator's unknown fixed costs to the paper's measured GDN ablation, and report the
held-out cases without refitting (docs/SIMULATION.md, "Fixed costs and calibration").

The fit: the three constants below (FITTED) of a device file, minimising the sum of squared log
ratios simulated/measured over the four steps of the paper's ablation figure (arXiv 2609.32114,
evaluation, ablation: GDN, T = 1024, H = 16, K = V = 128 on the Ascend 310P: FLA 5.46 ms,
+mapping 1.91, +reordering 1.45, +layout 1.23). Only that row is fitted; every other number of the
device file is left as it is. The search is a plain Nelder-Mead over the logarithms of the
constants (deterministic start, no randomness), each evaluation one `hanpu simulate --ablation
--json` on a temporary copy of the device file.

  tools/calibrate_fixed_costs.py                 # fit, print the constants and residuals
  tools/calibrate_fixed_costs.py --write         # ... and store them in the device file(s)
  tools/calibrate_fixed_costs.py --held-out      # only the held-out report with the files' values
  tools/calibrate_fixed_costs.py --summary       # only section 8's one-line-per-case table

--write updates devices/ascend310p.json and copies the cycle-denominated constants to
devices/ascend310b.json (same DaVinci core family; its clock turns them into its own times).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_GDN_1K_16 = {  # ms, the paper's ablation figure (310P, GDN, T = 1024, H = 16)
    "fla": 5.46,
    "fla+mapping": 1.91,
    "fla+mapping+reordering": 1.45,
    "fla+mapping+reordering+layout": 1.23,
}
FITTED = ["dma_setup_cycles", "pipe_sync_cycles", "kernel_boundary_us"]
START = {"dma_setup_cycles": 500.0, "pipe_sync_cycles": 500.0, "kernel_boundary_us": 20.0, "gm_segment_cycles": 8.0,
         "vector_startup_cycles": 60.0}
FIT_SOURCE = ("fitted by tools/calibrate_fixed_costs.py to the HA-NPU paper's measured GDN ablation on the 310P "
              "(arXiv 2609.32114, evaluation, ablation figure: T = 1024, H = 16: FLA 5.46, +mapping 1.91, +reordering 1.45, "
              "+layout 1.23 ms), jointly with the other fitted constants; not measured directly")


def find_hanpu():
    for p in ("build/release/hanpu", "build/release/src/hanpu", "build/release/bin/hanpu"):
        full = os.path.join(ROOT, p)
        if os.path.exists(full):
            return full
    sys.exit("hanpu binary not found under build/release; build with cmake --preset release")


def simulate(hanpu, device, args):
    out = subprocess.run([hanpu, "simulate", "--device", device, "--json"] + args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def with_values(device_json, values):
    d = json.loads(json.dumps(device_json))
    for k, v in values.items():
        d.setdefault(k, {"source": "calibration trial", "status": "estimate"})
        d[k]["value"] = v
    return d


def ablation_times(hanpu, device_json, values, extra=("--T", "1024", "--heads", "16")):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(with_values(device_json, values), f)
        path = f.name
    try:
        rs = simulate(hanpu, path, ["--ablation"] + list(extra))
    finally:
        os.unlink(path)
    return {r["strategy"]: r["latency_ms"] for r in rs}


def objective(hanpu, device_json, logs):
    values = {k: math.exp(x) for k, x in zip(FITTED, logs)}
    t = ablation_times(hanpu, device_json, values)
    return sum(math.log(t[s] / m) ** 2 for s, m in PAPER_GDN_1K_16.items())


def nelder_mead(f, x0, step=0.7, iters=120, tol=1e-6):
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (step if j == i else 0) for j in range(n)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < tol:
            break
        centroid = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        refl = [centroid[j] + (centroid[j] - pts[-1][j]) for j in range(n)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [centroid[j] + 2 * (centroid[j] - pts[-1][j]) for j in range(n)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [centroid[j] + 0.5 * (pts[-1][j] - centroid[j]) for j in range(n)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(n)]
                    vals[i] = f(pts[i])
    best = min(range(n + 1), key=lambda i: vals[i])
    return pts[best], vals[best]


def held_out(hanpu, device_path, b_path):
    """Markdown tables of the held-out cases with the device files as they are."""
    lines = []

    def table(title, device, args, strategies):
        rs = simulate(hanpu, device, args)
        lines.append(f"\n{title}\n")
        lines.append("| strategy | latency ms | x vs previous | matrix util % (executed) | launches | GM MiB |")
        lines.append("|---|---|---|---|---|---|")
        prev = None
        for r in rs:
            if r.get("fits") is False:
                lines.append(f"| {r['strategy']} | {r['message']} | | | | |")
                continue
            x = "-" if prev is None or not strategies else f"{prev / r['latency_ms']:.2f}x"
            gm = (r["gm_read_bytes"] + r["gm_write_bytes"]) / 2**20
            lines.append(f"| {r['strategy']} | {r['latency_ms']:.3f} | {x} | {100 * r['matrix_utilization']:.2f} | "
                         f"{int(r['fixed_cost_events'].get('launches', 0))} | {gm:.1f} |")
            prev = r["latency_ms"]
        return {r["strategy"]: r.get("latency_ms") for r in rs}

    out = {}
    for variant in ("gdn", "kda"):
        for T, H in ((1024, 16), (4096, 16), (1024, 32), (1024, 48)):
            key = f"{variant} T={T} H={H}"
            out[key + " ablation"] = table(f"**310P {key}, ablation**", device_path,
                                           ["--ablation", "--variant", variant, "--T", str(T), "--heads", str(H)], True)
            out[key + " strategies"] = table(f"**310P {key}, strategies**", device_path,
                                             ["--strategies", "--variant", variant, "--T", str(T), "--heads", str(H)], False)
    out["310b gdn ablation"] = table("**310B gdn T=1024 H=16, ablation**", b_path, ["--ablation", "--T", "1024", "--heads", "16"], True)
    out["310b gdn strategies"] = table("**310B gdn T=1024 H=16, strategies**", b_path, ["--strategies", "--T", "1024", "--heads", "16"], False)
    print("\n".join(lines))
    return out


def summary(hanpu, device_path, b_path):
    """The one-line-per-case table of docs/SIMULATION.md section 8: the ablation's steps and
    speed-ups, HA-NPU against FLA and vLLM-Ascend, vLLM-Ascend's matrix utilization and kernels."""
    cases = [("GDN 1K H=16 (fitted)", device_path, "gdn", 1024, 16), ("GDN 4K H=16", device_path, "gdn", 4096, 16),
             ("GDN 1K H=32", device_path, "gdn", 1024, 32), ("GDN 1K H=48", device_path, "gdn", 1024, 48),
             ("KDA 1K H=16", device_path, "kda", 1024, 16), ("KDA 4K H=16", device_path, "kda", 4096, 16),
             ("KDA 1K H=32", device_path, "kda", 1024, 32), ("KDA 1K H=48", device_path, "kda", 1024, 48),
             ("310B GDN 1K H=16", b_path, "gdn", 1024, 16)]
    print("| case | FLA -> +mapping -> +reordering -> +layout (ms) | step speed-ups | HA-NPU vs FLA | vs vLLM-Ascend "
          "| vLLM-Ascend ms (kernels) | vLLM-Ascend matrix util. |")
    print("|---|---|---|---|---|---|---|")
    for name, dev, variant, T, H in cases:
        common = ["--variant", variant, "--T", str(T), "--heads", str(H)]
        ab = {r["strategy"]: r for r in simulate(hanpu, dev, ["--ablation"] + common)}
        st = {r["strategy"]: r for r in simulate(hanpu, dev, ["--strategies"] + common)}
        steps = [ab[s]["latency_ms"] for s in PAPER_GDN_1K_16]
        fmt = (lambda x: f"{x:.1f}") if steps[0] >= 20 else (lambda x: f"{x:.2f}")
        ups = ", ".join(f"{steps[i] / steps[i + 1]:.2f}x" for i in range(3))
        v = st["vllm-ascend"]
        print(f"| {name} | {' -> '.join(fmt(x) for x in steps)} | {ups} | {steps[0] / steps[3]:.1f}x | "
              f"{v['latency_ms'] / st['hanpu']['latency_ms']:.1f}x | {v['latency_ms']:.2f} ({v['kernels']}) | "
              f"{100 * v['matrix_utilization']:.2f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=os.path.join(ROOT, "devices/ascend310p.json"))
    ap.add_argument("--device-310b", default=os.path.join(ROOT, "devices/ascend310b.json"))
    ap.add_argument("--hanpu", default=None)
    ap.add_argument("--write", action="store_true", help="store the fitted constants in the device file(s)")
    ap.add_argument("--held-out", action="store_true", help="only report the held-out cases (no fit)")
    ap.add_argument("--summary", action="store_true", help="only the one-line-per-case table of docs/SIMULATION.md section 8 (no fit)")
    ap.add_argument("--fit", default=",".join(FITTED), help="comma-separated constants to fit (default: %(default)s)")
    a = ap.parse_args()
    FITTED[:] = a.fit.split(",")
    hanpu = a.hanpu or find_hanpu()
    if a.summary:
        summary(hanpu, a.device, a.device_310b)
        return
    if not a.held_out:
        device_json = json.load(open(a.device))
        x0 = [math.log(START[k]) for k in FITTED]
        evals = [0]

        def f(x):
            evals[0] += 1
            return objective(hanpu, device_json, x)

        x, val = nelder_mead(f, x0)
        values = {k: round(math.exp(v), 1) for k, v in zip(FITTED, x)}
        t = ablation_times(hanpu, device_json, values)
        print(f"fit after {evals[0]} evaluations, sum of squared log residuals {val:.5f}")
        for k, v in values.items():
            print(f"  {k} = {v}")
        print("| step | paper ms | simulated ms | residual |")
        print("|---|---|---|---|")
        for s, m in PAPER_GDN_1K_16.items():
            print(f"| {s} | {m:.2f} | {t[s]:.3f} | {100 * (t[s] / m - 1):+.1f}% |")
        if a.write:
            for k, v in values.items():
                device_json[k] = {"value": v, "source": FIT_SOURCE, "status": "derived"}
            with open(a.device, "w") as f:
                f.write(json.dumps(device_json, indent=2, ensure_ascii=False) + "\n")
            b = json.load(open(a.device_310b))
            for k, v in values.items():
                if k.endswith("_cycles"):
                    b[k] = {"value": v, "source": "the 310P's fitted value (same DaVinci core family, counted in cycles): " + FIT_SOURCE,
                            "status": "derived"}
                else:
                    b[k] = {"value": v, "source": "the 310P's fitted value taken as is (a kernel boundary on the same runtime): " + FIT_SOURCE,
                            "status": "derived"}
            with open(a.device_310b, "w") as f:
                f.write(json.dumps(b, indent=2, ensure_ascii=False) + "\n")
            print(f"written to {a.device} and {a.device_310b}")
    if a.held_out or a.write:
        held_out(hanpu, a.device, a.device_310b)


if __name__ == "__main__":
    main()
