#!/usr/bin/env python3
"""Benchmark of `hanpu serve` (docs/SERVE.md, docs/PERFORMANCE.md): a multi-turn chat on
Qwen3.5-0.8B shapes (synthetic random weights, so token ids instead of text) with a long system
prompt and growing turns.

  1. Time to first token per turn, warm (the conversation so far is in the prefix cache) against
     cold (a prompt of the same length that shares nothing cached), and their ratio.
  2. Throughput with 1, 2 and 4 concurrent clients, each asking system prompt + its own question.

Starts its own server (`hanpu serve --synthetic PRESET`) unless --url is given.

  python3 scripts/bench_serve.py                      # the defaults below, ~10 minutes on 2 cores
  python3 scripts/bench_serve.py --system-tokens 512 --turns 2 --clients 1,2   # a quick look
"""

import argparse
import concurrent.futures
import http.client
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_completion(host, port, prompt, max_tokens):
    """One streamed /v1/completions request: (ttft seconds, total seconds, tokens, cached tokens, ids)."""
    conn = http.client.HTTPConnection(host, port, timeout=3600)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]}")
    ttft, ids, usage, buf = None, [], None, b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event[len(b"data: "):]
            if data == b"[DONE]":
                continue
            payload = json.loads(data)
            if payload.get("usage"):
                usage = payload["usage"]
            for choice in payload["choices"]:
                if choice.get("token_ids"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    ids += choice["token_ids"]
    total = time.perf_counter() - t0
    conn.close()
    return ttft, total, len(ids), usage["prompt_tokens_details"]["cached_tokens"], ids


def metrics(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l and not l.startswith("#")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (host:port) serving model id 'bench'; default: start one")
    ap.add_argument("--preset", default="qwen3.5-0.8b", help="synthetic preset of the server it starts")
    ap.add_argument("--threads", type=int, default=0, help="server threads (default all)")
    ap.add_argument("--system-tokens", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--user-tokens", type=int, default=64, help="new user tokens per turn")
    ap.add_argument("--reply-tokens", type=int, default=16, help="generated tokens per turn")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=248320, help="ids are drawn below this (Qwen3.5's vocabulary)")
    ap.add_argument("--server-args", default="", help="more options for the server it starts, e.g. --no-batch-decode")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()

    proc = None
    if a.url:
        host, port = a.url.rsplit(":", 1)
        port = int(port)
    else:
        host, port = "127.0.0.1", free_port()
        cmd = [str(REPO / "build" / "release" / "hanpu"), "serve", "--synthetic", a.preset, "--model-name", MODEL,
               "--port", str(port), "--cache-mib", "4096", "--parallel", "4"]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        cmd += a.server_args.split()
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        deadline = time.time() + 600
        while True:
            try:
                metrics(host, port)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    sys.exit("the server did not start")
                time.sleep(0.5)
    rng = random.Random(1)
    toks = lambda n: [rng.randrange(10, a.vocab) for _ in range(n)]
    results = {"preset": a.preset, "server_args": a.server_args, "system_tokens": a.system_tokens, "user_tokens": a.user_tokens,
               "reply_tokens": a.reply_tokens, "turns": [], "throughput": []}
    try:
        # 1. Multi-turn: warm turn k against a cold prompt of the same length.
        system = toks(a.system_tokens)
        history = list(system)
        print(f"multi-turn chat, {a.preset} shapes, system prompt {a.system_tokens} tokens, +{a.user_tokens} user "
              f"and {a.reply_tokens} reply tokens per turn")
        print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'warm TTFT s':>12} {'cold TTFT s':>12} {'cold/warm':>10}")
        for turn in range(1, a.turns + 1):
            prompt = history + toks(a.user_tokens)
            warm_ttft, _, _, cached, ids = stream_completion(host, port, prompt, a.reply_tokens)
            # Cold: the same length with a first token no other prompt has (conversation ids are >= 10),
            # so no snapshot applies.
            cold_prompt = [turn] + prompt[1:]
            cold_ttft, _, _, cold_cached, _ = stream_completion(host, port, cold_prompt, 1)
            assert cold_cached == 0, cold_cached
            row = {"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": cached, "warm_ttft_s": warm_ttft,
                   "cold_ttft_s": cold_ttft, "ratio": cold_ttft / warm_ttft}
            results["turns"].append(row)
            print(f"{turn:>4} {len(prompt):>7} {cached:>7} {warm_ttft:>12.2f} {cold_ttft:>12.2f} {row['ratio']:>10.1f}")
            history = prompt + ids
        m = metrics(host, port)
        results["snapshot_ms_mean"] = 1e3 * m["hanpu_cache_snapshot_seconds_total"] / max(1, m["hanpu_cache_snapshots_total"])
        results["restore_ms_mean"] = 1e3 * m["hanpu_cache_restore_seconds_total"] / max(
            1, m["hanpu_cache_hits_total"] + m["hanpu_cache_misses_total"])
        print(f"snapshot (state copy into the cache) {results['snapshot_ms_mean']:.1f} ms mean over "
              f"{m['hanpu_cache_snapshots_total']:.0f}; lookup + restore {results['restore_ms_mean']:.1f} ms mean")

        # 2. Throughput: c clients at once, each system prompt + its own question, reply_tokens each.
        print(f"\nthroughput: each request = the {a.system_tokens}-token system prompt (cached) + {a.user_tokens} "
              f"own tokens, {a.reply_tokens} generated")
        print(f"{'clients':>7} {'requests':>8} {'wall s':>8} {'gen tok/s':>10} {'mean TTFT s':>12} {'mean latency s':>15}")
        stream_completion(host, port, system + toks(1), 1)  # the system prompt's snapshots, if no turn made them
        for c in [int(x) for x in a.clients.split(",")]:
            prompts = [system + toks(a.user_tokens) for _ in range(c * a.requests_per_client)]

            def client(i):
                return [stream_completion(host, port, prompts[i * a.requests_per_client + r], a.reply_tokens)
                        for r in range(a.requests_per_client)]

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(c) as pool:
                runs = [r for rs in pool.map(client, range(c)) for r in rs]
            wall = time.perf_counter() - t0
            gen = sum(r[2] for r in runs)
            row = {"clients": c, "requests": len(runs), "wall_s": wall, "generated_tokens_per_s": gen / wall,
                   "mean_ttft_s": sum(r[0] for r in runs) / len(runs), "mean_latency_s": sum(r[1] for r in runs) / len(runs)}
            results["throughput"].append(row)
            print(f"{c:>7} {len(runs):>8} {wall:>8.1f} {row['generated_tokens_per_s']:>10.2f} {row['mean_ttft_s']:>12.2f} "
                  f"{row['mean_latency_s']:>15.2f}")
        m = metrics(host, port)
        results["peak_rss_mib"] = m["hanpu_process_resident_memory_bytes"] / 2**20
        results["cache_mib"] = m["hanpu_cache_bytes"] / 2**20
        print(f"\nserver RSS {results['peak_rss_mib']:.0f} MiB, prefix cache {results['cache_mib']:.0f} MiB in "
              f"{m['hanpu_cache_entries']:.0f} snapshots")
    finally:
        if proc:
            proc.terminate()
            proc.wait()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
