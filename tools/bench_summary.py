#!/usr/bin/env python3
"""Markdown summary of `hanpu bench --json-out` rows: per (variant, dtype, heads, T, threads) the
head-fused path's ms, GFLOP/s and share of the measured FMA peak, next to the FLA-style baseline
and the recurrent form on the same shapes (speedups = their ms / hanpu ms), and hanpu's extra
memory. Usage: python3 tools/bench_summary.py docs/bench/bench-full.json [--threads N]"""
import argparse
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json_file")
    ap.add_argument("--threads", type=int, default=None, help="only this thread count")
    a = ap.parse_args()
    rows = json.load(open(a.json_file))
    by = defaultdict(dict)
    for r in rows:
        by[(r["variant"], r["dtype"], r["heads"], r["T"], r["threads"])][r["path"]] = r
    print("| variant | dtype | H | T | thr | hanpu ms | GFLOP/s | % peak | vs fla | vs recurrent | extra MiB (hanpu / fla) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(by, key=lambda k: (k[0], k[1], k[2], k[4], k[3])):
        p = by[key]
        if "hanpu" not in p or (a.threads and key[4] != a.threads):
            continue
        h = p["hanpu"]
        fla = p.get("fla")
        rec = p.get("recurrent")
        sp = lambda o: f"{o['ms'] / h['ms']:.2f}x" if o else "-"
        mem = f"{h['extra_bytes'] / 2**20:.2f} / {fla['extra_bytes'] / 2**20:.0f}" if fla else f"{h['extra_bytes'] / 2**20:.2f}"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {h['ms']:.1f} | {h['gflops']:.0f} | "
              f"{100 * h['peak_fraction']:.1f}% | {sp(fla)} | {sp(rec)} | {mem} |")


if __name__ == "__main__":
    main()
