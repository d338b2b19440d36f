#!/usr/bin/env python3
"""Plot the JSON rows of `hanpu bench --json-out FILE` as one self-contained SVG.

Usage:
    python3 tools/plot_bench.py IN.json -o OUT.svg [--html OUT.html]

Python 3.11 standard library only; the SVG text is written by hand.

Figure 1 (top): a grid of small panels, one per (variant, dtype); the first row uses the largest
thread count in the rows, the second row (if present) threads=1. x = T (log2), y = achieved fraction
of the FP32 FMA peak measured in the same run. One line per (path, heads): colour = path,
dash + marker = heads. Dashed reference line at the per-variant target (GDN 50 %, KDA 40 %).

Figure 2 (below): extra memory (extra_bytes, MiB, log scale) vs T per path, at the largest head
count and the largest thread count of each (variant, dtype) panel.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from pathlib import Path

# ----------------------------------------------------------------------------------------------
# Style

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
FS = 12  # base font size, px
PATH_ORDER = ["hanpu", "fla", "recurrent"]
PATH_COLOUR = {"hanpu": "#1f63b4", "fla": "#e8741a", "recurrent": "#2e9e44"}
EXTRA_COLOURS = ["#8e44ad", "#c0392b", "#7f8c8d", "#16a085"]
VARIANT_ORDER = ["gdn", "kda"]
DTYPE_ORDER = ["f32", "bf16", "f16"]
TARGETS = {"gdn": (0.50, "target GDN"), "kda": (0.40, "target KDA")}
# heads styles: (stroke-dasharray, marker)
HEAD_STYLES = [("", "circle"), ("7,3", "square"), ("2,2.5", "triangle"), ("9,3,2,3", "diamond")]

# Panel geometry (px)
PW, PH = 290, 215  # plot area of one panel
ML, MR, MT, MB = 52, 14, 40, 44  # margins around the plot area inside a panel cell
LEGEND_W = 175
PAGE_MARGIN = 16

REQUIRED = ("variant", "path", "T", "heads", "dtype", "threads")


def esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def fmt_t(t: float) -> str:
    t = int(round(t))
    if t >= 1024 and t % 1024 == 0:
        k = t // 1024
        return f"{k // 1024}M" if k >= 1024 and k % 1024 == 0 else f"{k}K"
    return str(t)


def fmt_mib(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    if v >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def order_key(value: str, order: list[str]) -> tuple[int, str]:
    return (order.index(value) if value in order else len(order), str(value))


def path_colour(path: str, all_paths: list[str]) -> str:
    if path in PATH_COLOUR:
        return PATH_COLOUR[path]
    others = [p for p in all_paths if p not in PATH_COLOUR]
    return EXTRA_COLOURS[others.index(path) % len(EXTRA_COLOURS)]


# ----------------------------------------------------------------------------------------------
# SVG helpers


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x, y, s, size=FS, anchor="start", weight="normal", fill="#222", extra="") -> None:
        self.add(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}"{extra}>{esc(s)}</text>'
        )

    def line(self, x1, y1, x2, y2, stroke="#000", width=1.0, dash="", extra="") -> None:
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
            f'stroke-width="{width}"{d}{extra}/>'
        )

    def polyline(self, pts, stroke, width=1.8, dash="") -> None:
        if len(pts) < 2:
            return
        d = f' stroke-dasharray="{dash}"' if dash else ""
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.add(
            f'<polyline points="{p}" fill="none" stroke="{stroke}" stroke-width="{width}" '
            f'stroke-linejoin="round"{d}/>'
        )

    def marker(self, kind, x, y, colour, r=3.6, tip: str = "") -> None:
        t = f"<title>{esc(tip)}</title>" if tip else ""
        common = f'fill="{colour}" stroke="#fff" stroke-width="0.8"'
        if kind == "square":
            s = r * 0.9
            self.add(f'<rect x="{x - s:.1f}" y="{y - s:.1f}" width="{2 * s:.1f}" height="{2 * s:.1f}" {common}>{t}</rect>')
        elif kind == "triangle":
            s = r * 1.25
            pts = f"{x:.1f},{y - s:.1f} {x - s:.1f},{y + s * 0.8:.1f} {x + s:.1f},{y + s * 0.8:.1f}"
            self.add(f'<polygon points="{pts}" {common}>{t}</polygon>')
        elif kind == "diamond":
            s = r * 1.3
            pts = f"{x:.1f},{y - s:.1f} {x + s:.1f},{y:.1f} {x:.1f},{y + s:.1f} {x - s:.1f},{y:.1f}"
            self.add(f'<polygon points="{pts}" {common}>{t}</polygon>')
        else:
            self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {common}>{t}</circle>')


# ----------------------------------------------------------------------------------------------
# Axes


def log2_ticks(tmin: float, tmax: float) -> list[float]:
    lo, hi = math.floor(math.log2(tmin)), math.ceil(math.log2(tmax))
    return [2.0**e for e in range(lo, hi + 1)]


class XAxis:
    """log2 axis over T, padded by a quarter octave on each side."""

    def __init__(self, ts: list[float], x0: float, width: float) -> None:
        lo, hi = math.log2(min(ts)), math.log2(max(ts))
        if hi - lo < 1:
            mid = (lo + hi) / 2
            lo, hi = mid - 0.75, mid + 0.75
        self.lo, self.hi = lo - 0.25, hi + 0.25
        self.x0, self.w = x0, width
        ticks = [t for t in log2_ticks(2**self.lo, 2**self.hi) if self.lo <= math.log2(t) <= self.hi]
        # Label every power of two, thinned to at most 8 labels; also label T values off the grid.
        step = max(1, math.ceil(len(ticks) / 8))
        self.ticks = [(t, i % step == 0) for i, t in enumerate(ticks)]
        pow2 = set(ticks)
        for t in sorted(set(ts)):
            if t not in pow2:
                self.ticks.append((t, True))

    def __call__(self, t: float) -> float:
        return self.x0 + (math.log2(t) - self.lo) / (self.hi - self.lo) * self.w


def draw_frame(svg: Svg, x0, y0, xa: XAxis, yticks, ymap, ylabel_fmt, title, xlabel="T (tokens, log2)") -> None:
    # background + gridlines
    svg.add(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="#fbfbfb" stroke="none"/>')
    for v, major in yticks:
        y = ymap(v)
        svg.line(x0, y, x0 + PW, y, stroke="#dcdcdc" if major else "#efefef", width=1)
        if major:
            svg.line(x0 - 4, y, x0, y, stroke="#444")
            svg.text(x0 - 7, y + 4, ylabel_fmt(v), size=FS - 1, anchor="end", fill="#333")
    for t, lab in xa.ticks:
        x = xa(t)
        svg.line(x, y0, x, y0 + PH, stroke="#e6e6e6", width=1)
        svg.line(x, y0 + PH, x, y0 + PH + 4, stroke="#444")
        if lab:
            svg.text(x, y0 + PH + 17, fmt_t(t), size=FS - 1, anchor="middle", fill="#333")
    svg.add(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#888" stroke-width="1"/>')
    svg.text(x0 + PW / 2, y0 + PH + 34, xlabel, size=FS - 1, anchor="middle", fill="#555")
    svg.text(x0 + PW / 2, y0 - 10, title, size=FS + 1, anchor="middle", weight="bold")


# ----------------------------------------------------------------------------------------------
# Data


def load_rows(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        sys.exit(f"plot_bench: {path}: not valid JSON ({e}); is the benchmark still writing it?")
    if not isinstance(data, list):
        sys.exit(f"plot_bench: {path}: expected a JSON array of row objects")
    rows = []
    skipped = 0
    for r in data:
        if not isinstance(r, dict) or any(k not in r for k in REQUIRED):
            skipped += 1
            continue
        try:
            r["T"], r["heads"], r["threads"] = int(r["T"]), int(r["heads"]), int(r["threads"])
        except (TypeError, ValueError):
            skipped += 1
            continue
        if r["T"] < 1:
            skipped += 1
            continue
        rows.append(r)
    if skipped:
        print(f"plot_bench: skipped {skipped} malformed row(s)", file=sys.stderr)
    if not rows:
        sys.exit(f"plot_bench: {path}: no usable rows")
    return rows


def num(r: dict, key: str) -> float | None:
    v = r.get(key)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


# ----------------------------------------------------------------------------------------------
# Figure


def build_svg(rows: list[dict], source_name: str) -> str:
    panels = sorted(
        {(r["variant"], r["dtype"]) for r in rows},
        key=lambda vd: (order_key(vd[0], VARIANT_ORDER), order_key(vd[1], DTYPE_ORDER)),
    )
    threads_all = sorted({r["threads"] for r in rows})
    tmax = threads_all[-1]
    thread_rows = [tmax] + ([1] if 1 in threads_all and tmax != 1 else [])
    all_paths = sorted({r["path"] for r in rows}, key=lambda p: order_key(p, PATH_ORDER))
    all_heads = sorted({r["heads"] for r in rows})
    head_style = {h: HEAD_STYLES[i % len(HEAD_STYLES)] for i, h in enumerate(all_heads)}
    all_ts = sorted({float(r["T"]) for r in rows})

    ncols = len(panels)
    cell_w, cell_h = ML + PW + MR, MT + PH + MB
    grid_w = ncols * cell_w
    width = PAGE_MARGIN * 2 + grid_w + LEGEND_W

    # ---- header text from the rows
    peaks: dict[int, float] = {}
    for r in rows:
        p = num(r, "peak_gflops")
        if p is not None:
            peaks.setdefault(r["threads"], p)
    bws = [b for r in rows if (b := num(r, "mem_bandwidth_gbs")) is not None]
    dims = sorted({(r.get("K"), r.get("V")) for r in rows}, key=str)
    peak_txt = ", ".join(
        f"{peaks[t]:.1f} GFLOP/s ({t} thread{'s' if t > 1 else ''})" for t in sorted(peaks)
    ) or "n/a"
    bw_txt = f"{max(bws):.1f} GB/s" if bws else "n/a"
    dim_txt = "; ".join(f"K={k}, V={v}" for k, v in dims)

    header = [
        ("hanpu bench: achieved fraction of the measured FP32 FMA peak", FS + 5, "bold", "#222"),
        (f"measured FP32 FMA peak: {peak_txt}   ·   memory read bandwidth: {bw_txt}", FS, "normal", "#222"),
        (f"{len(rows)} rows from {source_name}   ·   {dim_txt}   ·   y = GFLOP/s ÷ peak for the same thread count",
         FS - 1, "normal", "#555"),
    ]
    # rough text width estimate (0.6 em per character) so a single-panel figure still fits its header
    width = max(width, *(int(len(t) * sz * 0.6) + 2 * PAGE_MARGIN for t, sz, _, _ in header))

    svg = Svg()
    y = PAGE_MARGIN + 18
    for i, (t, sz, wt, col) in enumerate(header):
        if i:
            y += 20 if i == 1 else 17
        svg.text(PAGE_MARGIN, y, t, size=sz, weight=wt, fill=col)
    y += 14

    # ---- figure 1: peak fraction
    grid_top = y
    ymax_frac = max([1.0] + [f for r in rows if (f := num(r, "peak_fraction")) is not None])
    ytop = 1.0 if ymax_frac <= 1.0 else math.ceil(ymax_frac * 10) / 10
    yticks = [(i / 10, i % 2 == 0) for i in range(0, int(round(ytop * 10)) + 1)]
    for ri, th in enumerate(thread_rows):
        for ci, (var, dt) in enumerate(panels):
            x0 = PAGE_MARGIN + ci * cell_w + ML
            y0 = grid_top + ri * cell_h + MT
            sub = [r for r in rows if r["variant"] == var and r["dtype"] == dt and r["threads"] == th]
            xa = XAxis(all_ts, x0, PW)

            def ymap(v, y0=y0):
                return y0 + PH - v / ytop * PH

            title = f"{var.upper()} · {dt} · {th} thread{'s' if th > 1 else ''}"
            draw_frame(svg, x0, y0, xa, yticks, ymap, lambda v: f"{v * 100:.0f}%", title)
            if ci == 0:
                cy = y0 + PH / 2
                svg.text(x0 - 40, cy, "% of FMA peak", size=FS - 1, anchor="middle", fill="#555",
                         extra=f' transform="rotate(-90 {x0 - 40:.1f} {cy:.1f})"')
            target = TARGETS.get(var)
            if target and target[0] <= ytop:
                svg.line(x0, ymap(target[0]), x0 + PW, ymap(target[0]), stroke="#c0392b", width=1.3, dash="6,4")
            if not sub:
                svg.text(x0 + PW / 2, y0 + PH / 2, "no rows", size=FS, anchor="middle", fill="#999")
            for p in all_paths:
                for h in all_heads:
                    pts = sorted(
                        (r["T"], f, r) for r in sub
                        if r["path"] == p and r["heads"] == h and (f := num(r, "peak_fraction")) is not None
                    )
                    if not pts:
                        continue
                    dash, mk = head_style[h]
                    col = path_colour(p, all_paths)
                    xy = [(xa(t), ymap(min(f, ytop))) for t, f, _ in pts]
                    svg.polyline(xy, col, dash=dash)
                    for (t, f, r), (px, py) in zip(pts, xy):
                        g = num(r, "gflops")
                        ms = num(r, "ms")
                        tip = (f"{p} H={h} T={t} {dt} {th}thr: {f * 100:.1f}% of peak"
                               + (f", {g:.1f} GFLOP/s" if g is not None else "")
                               + (f", {ms:.2f} ms" if ms is not None else ""))
                        svg.marker(mk, px, py, col, tip=tip)
            if target and target[0] <= ytop:
                # label above the line, on top of the data, with a halo so crossing lines don't hide it
                svg.text(x0 + PW - 4, ymap(target[0]) - 5, f"{target[1]} {target[0] * 100:.0f}%", size=FS - 1,
                         anchor="end", fill="#c0392b",
                         extra=' paint-order="stroke" stroke="#fbfbfb" stroke-width="3.5" stroke-linejoin="round"')

    # ---- legend (right of the grid, shared)
    lx = PAGE_MARGIN + grid_w + 8
    ly = grid_top + MT + 4
    svg.add(f'<rect x="{lx - 6}" y="{ly - 16}" width="{LEGEND_W - 10}" '
            f'height="{20 * (len(all_paths) + len(all_heads)) + 108}" fill="#fff" stroke="#ccc" rx="4"/>')
    svg.text(lx, ly, "path (colour)", size=FS, weight="bold")
    ly += 8
    for p in all_paths:
        ly += 20
        col = path_colour(p, all_paths)
        svg.line(lx, ly - 4, lx + 34, ly - 4, stroke=col, width=2.5)
        svg.marker("circle", lx + 17, ly - 4, col)
        svg.text(lx + 42, ly, p, size=FS)
    ly += 30
    svg.text(lx, ly, "heads (dash, marker)", size=FS, weight="bold")
    ly += 8
    for h in all_heads:
        ly += 20
        dash, mk = head_style[h]
        svg.line(lx, ly - 4, lx + 34, ly - 4, stroke="#555", width=1.8, dash=dash)
        svg.marker(mk, lx + 17, ly - 4, "#555")
        svg.text(lx + 42, ly, f"H = {h}", size=FS)
    ly += 30
    svg.line(lx, ly - 4, lx + 34, ly - 4, stroke="#c0392b", width=1.3, dash="6,4")
    svg.text(lx + 42, ly, "target", size=FS, fill="#c0392b")

    y = grid_top + len(thread_rows) * cell_h + 20

    # ---- figure 2: extra memory
    svg.line(PAGE_MARGIN, y - 6, width - PAGE_MARGIN, y - 6, stroke="#ccc")
    y += 18
    svg.text(PAGE_MARGIN, y, "Extra memory (scratch allocated beyond inputs/outputs) vs T", size=FS + 4, weight="bold")
    y += 18
    svg.text(PAGE_MARGIN, y,
             f"extra_bytes in MiB, log scale; largest head count per panel, {tmax} thread{'s' if tmax > 1 else ''}. "
             "A flat line = memory independent of sequence length.", size=FS - 1, fill="#555")
    y += 6
    mem_top = y
    mem_rows = [r for r in rows if r["threads"] == tmax]
    vals = [b / 2**20 for r in mem_rows if (b := num(r, "extra_bytes")) is not None and b > 0]
    nonpos = sum(1 for r in mem_rows if (b := num(r, "extra_bytes")) is not None and b <= 0)
    if vals:
        dlo = math.floor(math.log10(min(vals)))
        dhi = math.ceil(math.log10(max(vals)))
        if dhi == dlo:
            dhi += 1
        mticks = []
        for d in range(dlo, dhi + 1):
            mticks.append((10.0**d, True))
            if d < dhi:
                mticks += [(m * 10.0**d, False) for m in (2, 5)]
        for ci, (var, dt) in enumerate(panels):
            x0 = PAGE_MARGIN + ci * cell_w + ML
            y0 = mem_top + MT
            sub = [r for r in mem_rows if r["variant"] == var and r["dtype"] == dt]
            hmax = max((r["heads"] for r in sub), default=None)
            sub = [r for r in sub if r["heads"] == hmax]
            xa = XAxis(all_ts, x0, PW)

            def mmap(v, y0=y0):
                return y0 + PH - (math.log10(v) - dlo) / (dhi - dlo) * PH

            title = f"{var.upper()} · {dt}" + (f" · H = {hmax}" if hmax is not None else "")
            draw_frame(svg, x0, y0, xa, mticks, mmap, fmt_mib, title)
            if ci == 0:
                cy = y0 + PH / 2
                svg.text(x0 - 40, cy, "extra MiB", size=FS - 1, anchor="middle", fill="#555",
                         extra=f' transform="rotate(-90 {x0 - 40:.1f} {cy:.1f})"')
            if not sub:
                svg.text(x0 + PW / 2, y0 + PH / 2, "no rows", size=FS, anchor="middle", fill="#999")
                continue
            ends = []
            for p in all_paths:
                pts = sorted(
                    (r["T"], b / 2**20) for r in sub
                    if r["path"] == p and (b := num(r, "extra_bytes")) is not None and b > 0
                )
                if not pts:
                    continue
                col = path_colour(p, all_paths)
                xy = [(xa(t), mmap(v)) for t, v in pts]
                svg.polyline(xy, col, width=2)
                for (t, v), (px, py) in zip(pts, xy):
                    svg.marker("circle", px, py, col, tip=f"{p} H={hmax} T={t}: {v:.3g} MiB")
                ends.append([xy[-1][0], xy[-1][1], fmt_mib(pts[-1][1]) + " MiB", col])
            # value labels at the last point of each line, nudged apart vertically
            # label baseline: above-left of the last point, or below it when that would leave the frame
            for e in ends:
                e[1] = e[1] - 7 if e[1] - 7 > y0 + 14 else e[1] + 17
            ends.sort(key=lambda e: e[1])
            for i in range(1, len(ends)):
                if ends[i][1] - ends[i - 1][1] < 14:
                    ends[i][1] = ends[i - 1][1] + 14
            for ex, ey, lab, col in ends:
                anchor_right = ex > x0 + PW - 90
                svg.text(ex - 6 if anchor_right else ex + 7, ey, lab,
                         size=FS - 1, anchor="end" if anchor_right else "start", fill=col, weight="bold",
                         extra=' paint-order="stroke" stroke="#fbfbfb" stroke-width="3"')
        # memory legend: paths only
        lx = PAGE_MARGIN + grid_w + 8
        ly = mem_top + MT + 4
        svg.text(lx, ly, "path", size=FS, weight="bold")
        ly += 8
        for p in all_paths:
            ly += 20
            col = path_colour(p, all_paths)
            svg.line(lx, ly - 4, lx + 34, ly - 4, stroke=col, width=2.5)
            svg.marker("circle", lx + 17, ly - 4, col)
            svg.text(lx + 42, ly, p, size=FS)
        if nonpos:
            ly += 28
            svg.text(lx, ly, f"({nonpos} row(s) with 0 B", size=FS - 1, fill="#777")
            svg.text(lx, ly + 15, "not shown on log axis)", size=FS - 1, fill="#777")
        y = mem_top + cell_h
    else:
        svg.text(PAGE_MARGIN, y + 24, "no positive extra_bytes values in the rows", size=FS, fill="#999")
        y += 40

    height = int(y + PAGE_MARGIN)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{FONT}">\n'
        f'<rect width="100%" height="100%" fill="#ffffff"/>\n'
    )
    return head + "\n".join(svg.parts) + "\n</svg>\n"


def build_html(svg_text: str, rows: list[dict], title: str) -> str:
    cols = ["variant", "path", "dtype", "T", "heads", "threads", "ms", "tokens_per_s", "gflops",
            "peak_fraction", "extra_bytes", "reps"]

    def cell(r, c):
        v = r.get(c, "")
        if c == "peak_fraction" and isinstance(v, (int, float)):
            return f"{v * 100:.1f}%"
        if c == "extra_bytes" and isinstance(v, (int, float)):
            return f"{v / 2**20:.2f} MiB"
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    body_rows = "\n".join(
        "<tr>" + "".join(f"<td>{esc(cell(r, c))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: DejaVu Sans, Helvetica, Arial, sans-serif; font-size: 13px; margin: 16px; color: #222; }}
svg {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; margin-top: 8px; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; }}
th {{ background: #f3f3f3; }}
</style></head><body>
<h2>{esc(title)}</h2>
{svg_text}
<details><summary>{len(rows)} rows</summary>
<table><tr>{"".join(f"<th>{esc(c)}</th>" for c in cols)}</tr>
{body_rows}
</table></details>
</body></html>
"""


def main() -> None:
    ap = argparse.ArgumentParser(description="Plot `hanpu bench --json-out` rows as a self-contained SVG.")
    ap.add_argument("input", type=Path, help="JSON file written by `hanpu bench --json-out`")
    ap.add_argument("-o", "--output", type=Path, required=True, help="output SVG file")
    ap.add_argument("--html", type=Path, help="also write an HTML page embedding the SVG")
    a = ap.parse_args()

    rows = load_rows(a.input)
    svg_text = build_svg(rows, a.input.name)
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(svg_text, encoding="utf-8")
    print(f"plot_bench: wrote {a.output} ({len(rows)} rows)")
    if a.html:
        a.html.parent.mkdir(parents=True, exist_ok=True)
        a.html.write_text(build_html(svg_text, rows, f"hanpu bench: {a.input.name}"), encoding="utf-8")
        print(f"plot_bench: wrote {a.html}")


if __name__ == "__main__":
    main()
