#!/usr/bin/env python3
"""hanpu against llama.cpp on the same GGUF files, interleaved (issue 34; docs/PERFORMANCE.md,
"GGUF files: hanpu against llama.cpp on the same file").

Per round and file: `hanpu bench-model --model FILE -p P --decode-tokens N --json`, then
`llama-bench -m FILE -p P -n N -o json -r 1`, so the two programs of one row run minutes apart
under the same conditions. Prints the table (tokens/s per round, the range of the ratios, hanpu's
decode against the read probe bench-model measured in the same run, the load average before each
run), writes every raw row with --json-out and a bar chart of the ratios with --svg.

    python3 benchmarks/gguf_vs_llama_cpp.py --llama-cpp DIR F1.gguf F2.gguf [--rounds 2] [--svg out.svg]
        [--hanpu-env lanes:HANPU_GGUF_LAYOUT=lanes --hanpu-env file:HANPU_GGUF_LAYOUT=file] [--isa avx2]

DIR holds llama-bench (the peer build's bin/). --isa caps hanpu's kernels (`hanpu --isa X`, as
HANPU_ISA): with `--isa avx2` on a wider machine, give DIR an AVX2-only peer build (the peers
script's PEERS_ISA=avx2); the ISA hanpu reports is kept per row. hanpu's decode is timed after the first prompt
length's prefill, llama.cpp's `tg` from an empty context (llama-bench's definition). Python 3.11
standard library only; the SVG is written by hand.
"""
import argparse
import html
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"prefill": 2.0, "decode": 1.15}  # issue 34's ratios; decode also >= 85% of the probe


def load_average():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_json_lines(cmd, env=None):
    """The JSON values a command prints: bench-model one object per line, llama-bench one array."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, **env} if env else None).stdout
    text = out.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def parse_variant(text):
    """--hanpu-env LABEL:NAME=VALUE[,NAME=VALUE...] -> (label, {NAME: VALUE})."""
    label, sep, assignments = text.partition(":")
    env = {}
    for a in assignments.split(",") if sep else []:
        name, eq, value = a.partition("=")
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"--hanpu-env {text!r}: expected LABEL:NAME=VALUE[,NAME=VALUE...]")
        env[name] = value
    if not label:
        raise argparse.ArgumentTypeError(f"--hanpu-env {text!r}: the label before ':' is empty")
    return label, env


def one_round(args, path, prompts, variants):
    """Each hanpu variant, then llama.cpp, on one file: one row per variant, {"hanpu": {...},
    "llama": {...}} of tokens/s, llama.cpp's run shared by the variants of the round."""
    p_list = ",".join(str(p) for p in prompts)
    rows = []
    for label, env in variants:
        row = {"file": os.path.basename(path) + (f" ({label})" if label else ""), "env": env}
        row["hanpu_load"] = load_average()
        isa = ["--isa", args.isa] if args.isa else []
        hrows = run_json_lines([args.hanpu, *isa, "bench-model", "--model", path, "-p", p_list, "--decode-tokens",
                                str(args.decode), "--threads", str(args.threads), "--json"], env)
        by_prompt = {r["prompt_tokens"]: r for r in hrows}
        first = by_prompt[prompts[0]]
        row["hanpu"] = {f"pp{p}": by_prompt[p]["prefill_tokens_per_s"] for p in prompts}
        row["hanpu"]["tg"] = first["decode_tokens_per_s"]
        row["hanpu_isa"] = first.get("isa")
        # prompt tokens per CPU second x threads: what the threads did while they ran (load-robust)
        row["hanpu_cpu"] = {f"pp{p}": p / (by_prompt[p]["prefill_cpu_ms"] / 1000) * args.threads
                            for p in prompts if by_prompt[p].get("prefill_cpu_ms")}
        row["hanpu_decode_gbs"] = first["decode_weight_gbs"]
        row["probe_gbs"] = first["machine_read_bandwidth_gbs"]
        rows.append(row)
    llama_load = load_average()
    lrows = run_json_lines([os.path.join(args.llama_cpp, "llama-bench"), "-m", path, "-p", p_list, "-n",
                            str(args.decode), "-t", str(args.threads), "-r", "1", "-o", "json"])
    llama = {}
    for r in lrows:
        key = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else "tg"
        llama[key] = r["avg_ts"]
    for row in rows:
        row["llama_load"], row["llama"] = llama_load, llama
    return rows


def ratio_range(rows, key):
    ratios = [r["hanpu"][key] / r["llama"][key] for r in rows if r["llama"].get(key)]
    if not ratios:
        return None, None
    return min(ratios), max(ratios)


def fmt_range(lo, hi):
    if lo is None:
        return "-"
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"


def table(results, prompts):
    keys = [f"pp{p}" for p in prompts] + ["tg"]
    head = ["file"]
    for k in keys:
        name = f"prefill {k[2:]}" if k != "tg" else "decode"
        head += [f"{name}: hanpu / llama.cpp", "ratio"]
    head.append("hanpu decode, % of the read probe")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in results.items():
        cells = [name]
        for k in keys:
            h = ", ".join(f"{r['hanpu'][k]:.1f}" for r in rows)
            ll = ", ".join(f"{r['llama'].get(k, 0):.1f}" for r in rows)
            cells += [f"{h} / {ll}", fmt_range(*ratio_range(rows, k))]
        cells.append(", ".join(f"{100 * r['hanpu_decode_gbs'] / r['probe_gbs']:.0f}% ({r['probe_gbs']:.1f} GB/s)"
                               for r in rows))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def svg(results, prompts, title):
    """Grouped bars: per file, the ratio range (min..max over rounds) of each measure, with the
    issue's target lines."""
    keys = [f"pp{p}" for p in prompts] + ["tg"]
    colours = ["#1f63b4", "#5b9bd5", "#e8741a", "#2e9e44"]
    files = list(results)
    w_bar, left, top, h = 26, 60, 40, 260
    # Room for each file's name under its group (about 7 px a character at 12 px).
    gap = max(30, 7 * max(len(f.replace(".gguf", "")) for f in files) - len(keys) * w_bar + 12)
    width = max(720, left + len(files) * (len(keys) * w_bar + gap) + 180)
    ymax = max(2.2, max((ratio_range(rows, k)[1] or 0) for rows in results.values() for k in keys) * 1.1)
    y = lambda v: top + h - v / ymax * h  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + h + 90}" '
           f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">',
           f'<text x="{left}" y="20" font-size="14">{html.escape(title)}</text>']
    for v in [0.5 * i for i in range(int(ymax / 0.5) + 1)]:
        out.append(f'<line x1="{left}" x2="{width - 170}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}x</text>')
    for name, target in TARGETS.items():
        out.append(f'<line x1="{left}" x2="{width - 170}" y1="{y(target):.1f}" y2="{y(target):.1f}" '
                   f'stroke="#c0392b" stroke-dasharray="6,3"/>')
        out.append(f'<text x="{width - 165}" y="{y(target) + 4:.1f}" fill="#c0392b">target {name} {target}x</text>')
    for i, f in enumerate(files):
        x0 = left + gap / 2 + i * (len(keys) * w_bar + gap)
        for j, k in enumerate(keys):
            lo, hi = ratio_range(results[f], k)
            if lo is None:
                continue
            x = x0 + j * w_bar
            out.append(f'<rect x="{x:.1f}" y="{y(lo):.1f}" width="{w_bar - 4}" height="{y(0) - y(lo):.1f}" '
                       f'fill="{colours[j % len(colours)]}"/>')
            if hi > lo:  # the spread over rounds, as a lighter cap
                out.append(f'<rect x="{x:.1f}" y="{y(hi):.1f}" width="{w_bar - 4}" height="{y(lo) - y(hi):.1f}" '
                           f'fill="{colours[j % len(colours)]}" opacity="0.35"/>')
        out.append(f'<text x="{x0 + len(keys) * w_bar / 2:.1f}" y="{top + h + 18}" text-anchor="middle">'
                   f'{html.escape(f.replace(".gguf", ""))}</text>')
    for j, k in enumerate(keys):
        label = f"prefill {k[2:]}" if k != "tg" else "decode"
        out.append(f'<rect x="{left + j * 120}" y="{top + h + 40}" width="12" height="12" fill="{colours[j]}"/>')
        out.append(f'<text x="{left + j * 120 + 16}" y="{top + h + 50}">{label}</text>')
    out.append(f'<text x="{left}" y="{top + h + 75}" fill="#555">hanpu tokens/s over llama.cpp\'s on the same file; '
               'solid: lowest round, light: up to the highest</text>')
    out.append("</svg>")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="GGUF files")
    ap.add_argument("--llama-cpp", required=True, help="directory with llama-bench")
    ap.add_argument("--hanpu", default=os.path.join(REPO, "build", "release", "hanpu"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-p", "--prompts", default="512,2048")
    ap.add_argument("-n", "--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hanpu-env", action="append", type=parse_variant, default=[],
                    help="LABEL:NAME=VALUE[,...]: run hanpu once per such variant with these environment "
                         "variables (e.g. lanes:HANPU_GGUF_LAYOUT=lanes); default one run as is")
    ap.add_argument("--isa", help="hanpu's --isa (e.g. avx2; default: native)")
    ap.add_argument("--json-out")
    ap.add_argument("--svg")
    args = ap.parse_args()
    prompts = [int(p) for p in args.prompts.split(",")]
    for f in args.files:
        if not os.path.isfile(f):
            sys.exit(f"gguf_vs_llama_cpp: {f}: no such file")
    if not os.access(os.path.join(args.llama_cpp, "llama-bench"), os.X_OK):
        sys.exit(f"gguf_vs_llama_cpp: --llama-cpp {args.llama_cpp}: no executable llama-bench there")
    variants = args.hanpu_env or [("", {})]
    results = {}
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for r in range(args.rounds):
        for f in args.files:
            t0 = time.time()
            for row in one_round(args, f, prompts, variants):
                results.setdefault(row["file"], []).append(row)
            print(f"round {r + 1}/{args.rounds} {os.path.basename(f)}: load {row['hanpu_load']:.1f}/"
                  f"{row['llama_load']:.1f}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            if args.json_out:  # the rows so far, so that a run cut short keeps them
                with open(args.json_out, "w") as out:
                    json.dump({"start_utc": start, "threads": args.threads, "isa": args.isa or "native",
                               "partial": True, "rows": results}, out, indent=1)
    end = time.strftime("%H:%M", time.gmtime())
    isas = sorted({r.get("hanpu_isa") or "?" for rows in results.values() for r in rows})
    print(f"{args.rounds} interleaved rounds, {start}-{end} UTC, {args.threads} threads, hanpu kernels "
          f"{', '.join(isas)}; tokens/s per round")
    print(table(results, prompts))
    for name, rows in results.items():
        cpu = "; ".join(", ".join(f"{k} {v:.1f}" for k, v in r.get("hanpu_cpu", {}).items()) for r in rows)
        print(f"{name}: hanpu prefill tokens per CPU second x {args.threads}: {cpu}")
    loads = [x for rows in results.values() for r in rows for x in (r["hanpu_load"], r["llama_load"])]
    print(f"load average before the runs: {min(loads):.1f}-{max(loads):.1f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"start_utc": start, "end_utc": end, "threads": args.threads, "isa": args.isa or "native",
                       "rows": results}, f, indent=1)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(results, prompts, f"hanpu / llama.cpp on the same GGUF file, {start}-{end} UTC"))


if __name__ == "__main__":
    main()
