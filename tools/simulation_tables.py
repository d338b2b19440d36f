#!/usr/bin/env python3
"""Regenerates the tables of docs/SIMULATION.md from `hanpu simulate --json`.

Usage: tools/simulation_tables.py [--hanpu build/release/hanpu] [--device devices/ascend310p.json]
Prints Markdown to stdout. Runs in a few seconds (every simulation is well under a second).
"""
import argparse
import json
import subprocess


def run(exe, device, *args):
    out = subprocess.run([exe, "simulate", "--device", device, "--json", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def mib(b):
    return f"{b / 2**20:.1f}"


def kib(b):
    return f"{b / 2**10:.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hanpu", default="build/release/hanpu")
    ap.add_argument("--device", default="devices/ascend310p.json")
    a = ap.parse_args()

    print("### Strategies\n")
    print("| variant | T | H | strategy | latency ms | energy mJ | GM read MiB | GM write MiB | L1->L0 MiB | UB<->L1 MiB "
          "| peak UB KiB | peak L1 KiB | spill MiB | matrix util % (executed) | useful % | peak GM MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for variant in ("gdn", "kda"):
        for T in (1024, 4096):
            for H in (16, 32):
                for r in run(a.hanpu, a.device, "--variant", variant, "--T", str(T), "--heads", str(H), "--strategies", "all"):
                    pb = r["peak_bytes"]
                    print(f"| {variant} | {T} | {H} | {r['strategy']} | {r['latency_ms']:.3f} | {r['energy_mj']:.1f} | "
                          f"{mib(r['gm_read_bytes'])} | {mib(r['gm_write_bytes'])} | {mib(r['l1_to_l0_bytes'])} | "
                          f"{mib(r['ub_l1_bytes'])} | {kib(pb.get('UB', 0))} | {kib(pb.get('L1', 0))} | "
                          f"{mib(r['spill_bytes'])} | {100 * r['matrix_utilization']:.2f} | "
                          f"{100 * r['useful_matrix_utilization']:.2f} | {mib(r['peak_gm_bytes'])} |")

    print("\n### Ablation: what each technique changes (T = 1K and 4K, H = 16 and 32)\n")
    print("Each step's latency and the mechanisms behind it: GM traffic (mapping), L1->L0 and UB<->L1 traffic "
          "and the UB peak (reordering), bytes layout transforms read and write in UB and vector busy time (layout).\n")
    print("| variant | T | H | step | latency ms | x vs previous | GM MiB | L1->L0 MiB | UB<->L1 MiB | transform MiB "
          "| vector busy ms | matrix busy ms | peak UB KiB | spill MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for variant in ("gdn", "kda"):
        for T in (1024, 4096):
            for H in (16, 32):
                rs = run(a.hanpu, a.device, "--variant", variant, "--T", str(T), "--heads", str(H), "--ablation")
                prev = None
                for r in rs:
                    gain = f"{prev / r['latency_ms']:.2f}x" if prev else "-"
                    prev = r["latency_ms"]
                    print(f"| {variant} | {T} | {H} | {r['strategy']} | {r['latency_ms']:.3f} | {gain} | "
                          f"{mib(r['gm_read_bytes'] + r['gm_write_bytes'])} | {mib(r['l1_to_l0_bytes'])} | "
                          f"{mib(r['ub_l1_bytes'])} | {mib(r['transform_bytes'])} | "
                          f"{1e3 * r['busy_s'].get('vector', 0):.2f} | {1e3 * r['busy_s'].get('matrix', 0):.2f} | "
                          f"{kib(r['peak_bytes'].get('UB', 0))} | {mib(r['spill_bytes'])} |")

    print("\n### Peak GM memory vs T (GDN, H = 16, MiB)\n")
    print("| T | fla | flashqla | hanpu | inputs+outputs+states |")
    print("|---|---|---|---|---|")
    for T in (1024, 4096, 16384, 65536):
        row = {}
        for s in ("fla", "flashqla", "hanpu"):
            r = run(a.hanpu, a.device, "--variant", "gdn", "--T", str(T), "--heads", "16", "--strategy", s)[0]
            row[s] = r
        io = row["hanpu"]["peak_gm_bytes"] - row["hanpu"]["gm_intermediate_bytes"]
        print(f"| {T} | {mib(row['fla']['peak_gm_bytes'])} | {mib(row['flashqla']['peak_gm_bytes'])} | "
              f"{mib(row['hanpu']['peak_gm_bytes'])} | {mib(io)} |")


if __name__ == "__main__":
    main()
