#!/usr/bin/env python3
"""A 10-turn agent conversation against `hanpu serve` and llama.cpp's llama-server, side by side
(docs/SERVE.md "Benchmark", issue 35): time to first token per turn, warm (the conversation so far
cached) and cold (the same prompt with nothing cached), and the share of each prompt the server
reused from its cache.

The model: one checkpoint both servers load, made by tools/make_agent_bench_model.py (Qwen3.5-0.8B
shapes, random weights, a tokenizer of Qwen3.5's vocabulary size and a Qwen3.5-style chat template
with tools), e.g. its F16 GGUF for both. llama-server is llama.cpp's server (build llama.cpp with
`cmake -B build -DLLAMA_BUILD_SERVER=ON && cmake --build build --target llama-server`); pass its path
with --llama-server or $LLAMA_SERVER.

The conversation: a system prompt of about 2K tokens (agent instructions plus 8 tools with
JSON-schema parameters, rendered by the template), then TURNS turns. Each turn adds a user request,
an assistant tool call (scripted: a random-weight model does not write tool calls) and the tool's
result, and the model replies to that; the next turn resends the whole conversation with that reply
as an assistant message, then its own three messages. So every prompt is the previous prompt, its
reply, and new messages; the template decides the tokens (Qwen3.5's drops the think block of
assistant turns before the last user message, so the previous turn's tool call is rendered anew).
With jinja2 and tokenizers installed the script renders each prompt itself and counts the tokens
it shares with the same history followed by another user message ("before the new messages": what
a cache could reuse at most) and with the previous prompt. Greedy decoding, thinking off, MAX_TOKENS tokens per reply,
streamed; time to first token is measured at the first delta with text.

Cold: after the warm conversation, turns of --cold-turns are sent again with a nonce in the first
tool's name (the template renders the tools first), so no cached prefix applies (same length
within a few tokens).

Reuse: hanpu reports `usage.prompt_tokens_details.cached_tokens` (and `hanpu_cache`, why it
missed); llama-server reports `timings.cache_n` (tokens taken from its cache) and
`timings.prompt_n` (tokens computed).

  python3 scripts/bench_agent.py --model-dir DIR --hanpu-model DIR/model-f16.gguf \\
      --llama-model DIR/model-f16.gguf --llama-server PATH/llama-server --rounds 2 --out results/agent
  python3 scripts/bench_agent.py ... --servers hanpu --turns 3            # a quick look at one server
  python3 scripts/bench_agent.py --plot-only results/agent.json         # redraw the SVG

Writes OUT.json (every request) and OUT.svg (TTFT per turn, both servers), prints a table.
"""

import argparse
import http.client
import json
import os
import platform
import secrets
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "bench"

# ---------------------------------------------------------------------------------------------
# The conversation

TOOLS_SPEC = [
    ("read_file", "Read a text file of the repository and return its lines with line numbers.",
     {"path": ("string", "Path relative to the repository root."),
      "start_line": ("integer", "First line to return (1-based)."),
      "end_line": ("integer", "Last line to return, inclusive.")}, ["path"]),
    ("write_file", "Create or overwrite a file with the given content.",
     {"path": ("string", "Path relative to the repository root."), "content": ("string", "The whole new content.")},
     ["path", "content"]),
    ("edit_file", "Replace one exact occurrence of a string in a file.",
     {"path": ("string", "Path relative to the repository root."),
      "old_string": ("string", "Text to find; must occur exactly once."),
      "new_string": ("string", "Replacement text.")}, ["path", "old_string", "new_string"]),
    ("list_directory", "List the entries of a directory, directories first.",
     {"path": ("string", "Directory relative to the repository root."),
      "recursive": ("boolean", "Descend into subdirectories."),
      "max_entries": ("integer", "Stop after this many entries.")}, ["path"]),
    ("search_code", "Search the repository for a regular expression and return matching lines.",
     {"pattern": ("string", "A regular expression (RE2 syntax)."),
      "glob": ("string", "Only files matching this glob, e.g. src/**/*.cpp."),
      "case_sensitive": ("boolean", "Match case exactly."),
      "context_lines": ("integer", "Lines of context around each match.")}, ["pattern"]),
    ("run_command", "Run a shell command in the repository and return its exit status and output.",
     {"command": ("string", "The command line, run with bash -lc."),
      "timeout_seconds": ("integer", "Kill the command after this many seconds."),
      "workdir": ("string", "Directory to run in, relative to the repository root.")}, ["command"]),
    ("git", "Run a read-only git subcommand (status, diff, log, show, blame).",
     {"subcommand": ("string", "One of status, diff, log, show, blame."),
      "args": ("array", "Further arguments, one string each.")}, ["subcommand"]),
    ("fetch_url", "Fetch a web page and return it as plain text.",
     {"url": ("string", "An http or https URL."), "max_bytes": ("integer", "Truncate the text after this many bytes.")},
     ["url"]),
]


def tools():
    out = []
    for name, desc, params, required in TOOLS_SPEC:
        props = {}
        for p, (typ, pdesc) in params.items():
            props[p] = {"type": typ, "description": pdesc}
            if typ == "array":
                props[p]["items"] = {"type": "string"}
        out.append({"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object", "properties": props, "required": required}}})
    return out


RULES = [
    "You are a coding agent working in a C++ and Python repository on behalf of the user.",
    "Read the relevant files before you change anything, and keep every change small and reviewable.",
    "Prefer search_code and read_file over guessing; never invent a file path or a function name.",
    "When a command fails, read its output and fix the cause instead of retrying the same command.",
    "Run the tests that cover the code you touched, and report their result truthfully.",
    "Do not modify files outside the repository, and never run commands that need network access.",
    "Write comments that say why the code is the way it is, not what it does line by line.",
    "Errors must name the field, the value received and the value expected.",
    "Keep the user's coding style: four spaces in Python, two in C++, lines up to 120 characters.",
    "When you are unsure what the user wants, ask one precise question instead of guessing.",
    "Summarise at the end what you changed, what you tested and what is left to do.",
    "Tool results may be long; quote only the lines that matter in your answer.",
]

USER_MESSAGES = [
    "The server crashes when a request has an empty messages array. Find where the request is parsed.",
    "Show me how the tokenizer handles added tokens such as <tool_call>.",
    "Which tests cover the prefix cache? List them with one line each.",
    "Run the prefix cache tests and tell me if anything fails.",
    "The snapshot spacing should come from the command line. Where is --checkpoint-every read?",
    "Add a check that rejects --checkpoint-every values above --ctx, with a clear error.",
    "Now write a test for that check next to the existing option tests.",
    "Build the test target and run only the new test.",
    "Update the documentation of the option in docs/SERVE.md.",
    "Give me a summary of all changes and the exact commands to reproduce the test run.",
]

TOOL_CALLS = [
    ("search_code", {"pattern": "messages.*empty|parse_chat_request", "glob": "src/**/*.cpp"}),
    ("read_file", {"path": "src/model/tokenizer.cpp", "start_line": 120, "end_line": 170}),
    ("search_code", {"pattern": "TEST\\(PrefixCache", "glob": "tests/*.cpp", "context_lines": 0}),
    ("run_command", {"command": "ctest --test-dir build/release -R PrefixCache --output-on-failure", "timeout_seconds": 600}),
    ("search_code", {"pattern": "checkpoint-every", "glob": "src/**"}),
    ("edit_file", {"path": "src/cli/cmd_serve.cpp", "old_string": "opts.checkpoint_every = v;",
                   "new_string": "if (v > opts.ctx) throw Error(\"--checkpoint-every: \" + std::to_string(v));\nopts.checkpoint_every = v;"}),
    ("write_file", {"path": "tests/test_serve_options.cpp", "content": "TEST(ServeOptions, CheckpointEveryAboveCtx) {\n  EXPECT_THROW(parse({\"--checkpoint-every\", \"70000\"}), Error);\n}\n"}),
    ("run_command", {"command": "cmake --build --preset release --target test_serve_options && ctest -R ServeOptions"}),
    ("read_file", {"path": "docs/SERVE.md", "start_line": 20, "end_line": 60}),
    ("git", {"subcommand": "diff", "args": ["--stat"]}),
]


def tool_result(turn):
    """A deterministic tool output of about 140 tokens: code-like lines as a search or a file read returns."""
    lines = []
    for i in range(3):
        n = 37 * turn + 11 * i
        lines.append(f"src/serve/module_{turn}_{i}.cpp:{n}:  if (request.field_{i} > limit_{turn}) "
                     f"throw Error(\"field_{i}: got \" + std::to_string(request.field_{i}));")
    return "\n".join(lines)


def system_prompt(words):
    """The agent's instructions, RULES repeated with numbered sections up to about `words` words."""
    out, n, section = [], 0, 1
    while n < words:
        out.append(f"## Section {section}")
        for r in RULES:
            out.append(f"- {r}")
            n += len(r.split())
        section += 1
    return "\n".join(out)


def turn_messages(k):
    """The messages turn k (0-based) adds: the user's request, the assistant's tool call (scripted)
    and the tool's result. The model's reply then follows the tool result."""
    name, args = TOOL_CALLS[k % len(TOOL_CALLS)]
    call_id = f"call_{k:03d}"
    return [{"role": "user", "content": USER_MESSAGES[k % len(USER_MESSAGES)]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": tool_result(k)}]


# ---------------------------------------------------------------------------------------------
# Client-side rendering (optional: jinja2 + tokenizers), to check the shared prefix


class Renderer:
    """Renders messages as transformers' apply_chat_template does (jinja2's sandbox, trim_blocks,
    lstrip_blocks, loop controls, tojson as json.dumps) and tokenizes with the tokenizer.json."""

    def __init__(self, model_dir):
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
        import tokenizers
        cfg = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, ensure_ascii=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env.globals["raise_exception"] = raise_exception
        jinja_file = Path(model_dir) / "chat_template.jinja"
        if jinja_file.exists():
            text = jinja_file.read_text()
        elif isinstance(cfg.get("chat_template"), str):
            text = cfg["chat_template"]
        else:
            raise ValueError(f"--model-dir {model_dir}: no chat_template.jinja and no chat_template string in "
                             "tokenizer_config.json, expected the template the servers render")
        self.template = env.from_string(text)
        self.tok = tokenizers.Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

    def tokens(self, messages, tools, generation_prompt):
        msgs = json.loads(json.dumps(messages))
        for m in msgs:  # arguments as objects, as the servers pass them to the template
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        text = self.template.render(messages=msgs, tools=tools, add_generation_prompt=generation_prompt,
                                    enable_thinking=False)
        return self.tok.encode(text, add_special_tokens=False).ids


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Servers


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, kind, cmd, port, log_path):
        self.kind, self.cmd, self.port = kind, cmd, port
        self.log = open(log_path, "w")
        self.log.write("$ " + shlex.join(cmd) + "\n")
        self.log.flush()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 900
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None:
                sys.exit(f"{kind} exited with status {self.proc.returncode} while starting; see {log_path}")
            if time.time() > deadline:
                self.stop()
                sys.exit(f"{kind} did not answer /health within 900 s; see {log_path}")
            time.sleep(0.5)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def chat(port, messages, tool_list, max_tokens):
    """One streamed chat request. Returns ttft (first delta with text), total time, the reply's
    content, and the cache figures the server reported."""
    body = {"model": MODEL, "messages": messages, "tools": tool_list, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    ttft, content, reasoning, usage, timings, buf = None, "", "", None, None, b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: "):]
                if data == b"[DONE]":
                    continue
                payload = json.loads(data)
                if payload.get("usage"):
                    usage = payload["usage"]
                if payload.get("timings"):
                    timings = payload["timings"]
                for choice in payload.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                    if (text or delta.get("tool_calls")) and ttft is None:
                        ttft = time.perf_counter() - t0
                    content += delta.get("content") or ""
                    reasoning += delta.get("reasoning_content") or ""
    total = time.perf_counter() - t0
    conn.close()
    r = {"ttft_s": ttft if ttft is not None else total, "total_s": total, "reply": content,
         "reasoning": reasoning, "usage": usage, "timings": timings}
    if timings and "cache_n" in timings:  # llama-server
        r["reused"] = timings["cache_n"]
        r["computed"] = timings["prompt_n"]
        r["prompt_tokens"] = timings["cache_n"] + timings["prompt_n"]
        r["server_prompt_ms"] = timings.get("prompt_ms")
    else:  # hanpu (and any server that reports OpenAI's cached_tokens)
        if not usage:
            raise RuntimeError("the server sent neither `usage` (stream_options.include_usage) nor llama-server's "
                               "`timings`, expected one of them to count the reused prompt tokens")
        r["prompt_tokens"] = usage["prompt_tokens"]
        r["reused"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        r["computed"] = r["prompt_tokens"] - r["reused"]
        r["cache_note"] = usage.get("hanpu_cache")
    return r


def run_conversation(server, a, renderer, nonce_turns):
    tool_list = tools()
    system = system_prompt(a.system_words)
    messages = [{"role": "system", "content": system}] + turn_messages(0)
    turns, prev_tokens = [], None
    for k in range(a.turns):
        if k > 0:
            time.sleep(a.gap)  # the agent runs the tool / the user types
            history = messages + [{"role": "assistant", "content": turns[-1]["reply"]}]
            messages = history + turn_messages(k)
        t = {"turn": k + 1}
        if renderer:
            toks = renderer.tokens(messages, tool_list, True)
            t["rendered_prompt_tokens"] = len(toks)
            if k > 0:
                # What a cache can know before the new messages arrive: the tokens this prompt shares
                # with the same history continued by another message (the reply's turn and its end).
                probe = renderer.tokens(history + [{"role": "user", "content": "A different question."}], tool_list, True)
                t["before_new_messages"] = common_prefix(toks, probe)
                t["shared_with_previous_prompt"] = common_prefix(toks, prev_tokens)
            else:
                t["before_new_messages"] = t["shared_with_previous_prompt"] = 0
            prev_tokens = toks
        r = chat(server.port, messages, tool_list, a.max_tokens)
        t.update(r)
        turns.append(t)
        print(f"  {server.kind:<6} turn {k + 1:>2}: prompt {t['prompt_tokens']:>5}  reused {t['reused']:>5}  "
              f"TTFT {t['ttft_s']:7.2f} s" + (f"  rendered here {t['rendered_prompt_tokens']}, before the new messages "
                                              f"{t['before_new_messages']}, shared with the previous prompt "
                                              f"{t['shared_with_previous_prompt']}" if renderer else ""),
              flush=True)
    colds = []
    for k in nonce_turns:
        if k > len(turns):
            continue
        msgs = messages_for(turns, k, system)
        # The template renders the tools first: a nonce in the first tool's name changes the prompt
        # from about its 10th token on, so nothing cached applies.
        cold_tools = json.loads(json.dumps(tool_list))
        cold_tools[0]["function"]["name"] += "_" + secrets.token_hex(4)
        r = chat(server.port, msgs, cold_tools, a.max_tokens)
        r["turn"] = k
        colds.append(r)
        print(f"  {server.kind:<6} cold {k:>2}: prompt {r['prompt_tokens']:>5}  reused {r['reused']:>5}  "
              f"TTFT {r['ttft_s']:7.2f} s", flush=True)
    return turns, colds


def messages_for(turns, k, system):
    """The messages of turn k (1-based) of a finished conversation, from its recorded replies."""
    messages = [{"role": "system", "content": system}] + turn_messages(0)
    for j in range(1, k):
        messages += [{"role": "assistant", "content": turns[j - 1]["reply"]}] + turn_messages(j)
    return messages


def server_command(kind, a, port, extra):
    if kind == "hanpu":
        return [a.hanpu, "serve", "--model", a.hanpu_model, "--model-name", MODEL, "--port", str(port),
                "--threads", str(a.threads), "--cache-mib", str(a.hanpu_cache_mib), "--ctx", str(a.ctx),
                "--max-prompt-tokens", str(a.ctx)] + extra
    return [a.llama_server, "-m", a.llama_model, "--alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(a.threads), "-c", str(a.ctx), "-np", "1", "--jinja"] + extra


# ---------------------------------------------------------------------------------------------
# Report


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(results):
    """Per (server, variant): per turn medians over rounds."""
    out = {}
    for run in results["runs"]:
        key = f"{run['server']}" + (f" [{run['variant']}]" if run["variant"] != "default" else "")
        s = out.setdefault(key, {"server": run["server"], "variant": run["variant"], "flags": run["flags"], "turns": {}})
        for t in run["turns"]:
            row = s["turns"].setdefault(t["turn"], {"ttft": [], "reused": [], "prompt": [], "before": [], "cold": []})
            row["ttft"].append(t["ttft_s"])
            row["reused"].append(t["reused"])
            row["prompt"].append(t["prompt_tokens"])
            row["before"].append(t.get("before_new_messages"))
        for c in run["cold"]:
            s["turns"].setdefault(c["turn"], {"ttft": [], "reused": [], "prompt": [], "before": [], "cold": []})["cold"].append(c["ttft_s"])
    return out


def print_table(results):
    summ = summarize(results)
    keys = list(summ)
    turns = sorted({t for s in summ.values() for t in s["turns"]})
    print("\nmedians over rounds; reused = prompt tokens the server took from its cache")
    head = f"{'turn':>4}"
    for k in keys:
        head += f" | {k[:22]:>22}: prompt  reused  %before  TTFT s  cold s"
    print(head)
    for t in turns:
        line = f"{t:>4}"
        for k in keys:
            r = summ[k]["turns"].get(t)
            if not r:
                line += " | " + " " * 68
                continue
            p, u, b, w, c = median(r["prompt"]), median(r["reused"]), median(r["before"]), median(r["ttft"]), median(r["cold"])
            share = f"{100 * u / b:7.1f}" if b else "      -"
            line += (f" | {'':>22}  {p:>6.0f}  {u:>6.0f}  {share}  {w:>6.2f}  " + (f"{c:>6.2f}" if c else "     -"))
        print(line)
    if "hanpu" in summ:
        for k in keys:
            if k == "hanpu":
                continue
            print(f"\nside by side: hanpu against {k} (warm TTFT s, ratio = {k} / hanpu; reused % of the tokens before "
                  f"the new messages)")
            print(f"{'turn':>4} {'hanpu':>8} {k[:14]:>14} {'ratio':>7} {'hanpu %':>8} {k[:10] + ' %':>12}")
            for t in turns:
                h, o = summ["hanpu"]["turns"].get(t), summ[k]["turns"].get(t)
                if not h or not o or not h["ttft"] or not o["ttft"]:
                    continue
                hw, ow = median(h["ttft"]), median(o["ttft"])
                b = median(h["before"])
                hs = f"{100 * median(h['reused']) / b:8.1f}" if b else "       -"
                os_ = f"{100 * median(o['reused']) / b:12.1f}" if b else "           -"
                print(f"{t:>4} {hw:>8.2f} {ow:>14.2f} {ow / hw:>6.1f}x {hs} {os_}")
            ratios = [median(summ[k]["turns"][t]["ttft"]) / median(summ["hanpu"]["turns"][t]["ttft"])
                      for t in turns if t >= 2 and t in summ[k]["turns"] and t in summ["hanpu"]["turns"]]
            if ratios:
                print(f"{k} TTFT / hanpu TTFT, turns 2+: median {statistics.median(ratios):.1f}x, "
                      f"range {min(ratios):.1f}-{max(ratios):.1f}x")


def svg_plot(results, path):
    """TTFT per turn, one line per server (warm: solid, medians over rounds; cold: dashed), log y."""
    import math
    summ = summarize(results)
    colours = ["#1f63b4", "#e8741a", "#2e9e44", "#c0392b", "#8e44ad", "#7f8c8d"]
    W, H, L, R, T, B = 760, 420, 70, 250, 40, 50
    series = []
    for i, (k, s) in enumerate(summ.items()):
        warm = [(t, median(r["ttft"])) for t, r in sorted(s["turns"].items()) if r["ttft"]]
        cold = [(t, median(r["cold"])) for t, r in sorted(s["turns"].items()) if r["cold"]]
        series.append((k + " warm", colours[i % len(colours)], "", warm))
        if cold:
            series.append((k + " cold", colours[i % len(colours)], "6,4", cold))
    ys = [y for _, _, _, pts in series for _, y in pts if y]
    if not ys:
        return
    turns = sorted({t for _, _, _, pts in series for t, _ in pts})
    lo, hi = 10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys)))
    xmap = lambda t: L + (W - L - R) * (t - turns[0]) / max(1, turns[-1] - turns[0])
    ymap = lambda v: T + (H - T - B) * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="14" font-weight="bold">Time to first token per turn, {results["config"]["turns"]}-turn agent conversation</text>']
    d = lo
    while d <= hi * 1.001:
        for m in (1, 2, 5):
            v = d * m
            if lo <= v <= hi:
                y = ymap(v)
                o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>')
                o.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
        d *= 10
    for t in turns:
        x = xmap(t)
        o.append(f'<line x1="{x:.1f}" y1="{H - B}" x2="{x:.1f}" y2="{H - B + 4}" stroke="#000"/>')
        o.append(f'<text x="{x:.1f}" y="{H - B + 18}" text-anchor="middle">{t}</text>')
    o.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#000"/>')
    o.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#000"/>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">turn</text>')
    o.append(f'<text transform="translate(18,{(T + H - B) / 2}) rotate(-90)" text-anchor="middle">TTFT, seconds (log)</text>')
    for i, (name, colour, dash, pts) in enumerate(series):
        pts = [(t, y) for t, y in pts if y]
        poly = " ".join(f"{xmap(t):.1f},{ymap(y):.1f}" for t, y in pts)
        o.append(f'<polyline points="{poly}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>')
        for t, y in pts:
            o.append(f'<circle cx="{xmap(t):.1f}" cy="{ymap(y):.1f}" r="3" fill="{colour}"><title>{name}, turn {t}: {y:.2f} s</title></circle>')
        ly = T + 10 + 20 * i
        o.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 45}" y2="{ly}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>')
        o.append(f'<text x="{W - R + 50}" y="{ly + 4}">{name}</text>')
    m = results.get("machine", {})
    o.append(f'<text x="{W - R + 15}" y="{H - B - 30}" font-size="10" fill="#555">{m.get("cpu", "")[:36]}</text>')
    o.append(f'<text x="{W - R + 15}" y="{H - B - 16}" font-size="10" fill="#555">{results["config"]["threads"]} threads, {results.get("date", "")[:16]}</text>')
    o.append("</svg>")
    Path(path).write_text("\n".join(o) + "\n")


def machine():
    cpu = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="hanpu,llama", help="which servers, in the order of each round (alternated)")
    ap.add_argument("--hanpu", default=str(REPO / "build" / "release" / "hanpu"), help="hanpu binary")
    ap.add_argument("--hanpu-model", help="what hanpu serves (a checkpoint directory or a .gguf)")
    ap.add_argument("--hanpu-args", default="", help="more options for hanpu serve")
    ap.add_argument("--hanpu-cache-mib", type=int, default=4096)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", "llama-server"),
                    help="llama.cpp's llama-server binary (default $LLAMA_SERVER, else from PATH)")
    ap.add_argument("--llama-model", help="the .gguf llama-server serves")
    ap.add_argument("--llama-variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="a llama-server configuration to run as well, e.g. 'reuse=--cache-reuse 256 "
                         "--ctx-checkpoints 64' (repeatable; 'default=' is always run)")
    ap.add_argument("--variants-rounds", type=int, default=1, help="rounds of the --llama-variant runs (warm only)")
    ap.add_argument("--model-dir", help="the checkpoint directory (tokenizer.json, tokenizer_config.json) for the "
                                        "client-side prefix check; needs jinja2 and tokenizers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384, help="context of both servers")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per reply")
    ap.add_argument("--system-words", type=int, default=700, help="words of instructions in the system prompt "
                                                                   "(700 + the tools: about 2K tokens)")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="seconds between a reply and the next request (an agent running its tool, a user typing); "
                         "hanpu prefills the next turn's prefix from its snapshots in this time, so with 0 that work "
                         "is in the next turn's TTFT")
    ap.add_argument("--cold-turns", default="1,2,4,6,8,10", help="turns to repeat cold (comma list; '' for none)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="agent_bench", help="writes OUT.json, OUT.svg and OUT-<server>-<round>.log")
    ap.add_argument("--plot-only", metavar="JSON", help="redraw the SVG and table of a results file")
    a = ap.parse_args()

    if a.plot_only:
        results = json.loads(Path(a.plot_only).read_text())
        print_table(results)
        svg_plot(results, Path(a.plot_only).with_suffix(".svg"))
        return
    servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    for s in servers:
        if s not in ("hanpu", "llama"):
            ap.error(f"--servers: unknown server '{s}', expected hanpu or llama")
    if "hanpu" in servers and not a.hanpu_model:
        ap.error("--hanpu-model is required with the hanpu server")
    if "llama" in servers and not a.llama_model:
        ap.error("--llama-model is required with the llama server")
    cold_turns = [int(x) for x in a.cold_turns.split(",") if x.strip()]
    renderer = None
    if a.model_dir:
        try:
            renderer = Renderer(a.model_dir)
        except ImportError as e:
            print(f"no client-side prefix check ({e}); pip install jinja2 tokenizers for it")
    variants = [("default", [])]
    for v in a.llama_variant:
        name, _, flags = v.partition("=")
        if name != "default":
            variants.append((name, shlex.split(flags)))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "load_before": os.getloadavg(), "config": {k: v for k, v in vars(a).items() if k != "plot_only"},
               "runs": []}

    def one_run(kind, variant, flags, rnd, colds):
        port = free_port()
        log = f"{out}-{kind}-{variant}-{rnd}.log"
        extra = flags + (shlex.split(a.hanpu_args) if kind == "hanpu" else [])
        load0 = os.getloadavg()
        server = Server(kind, server_command(kind, a, port, extra), port, log)
        print(f"round {rnd}: {kind} [{variant}] {shlex.join(server.cmd)}", flush=True)
        try:
            turns, cold = run_conversation(server, a, renderer, colds)
        finally:
            server.stop()
        results["runs"].append({"server": kind, "variant": variant, "flags": shlex.join(server.cmd), "round": rnd,
                                "load_before": load0, "load_after": os.getloadavg(), "turns": turns, "cold": cold})
        Path(f"{out}.json").write_text(json.dumps(results, indent=1))

    for rnd in range(1, a.rounds + 1):
        order = servers if rnd % 2 == 1 else servers[::-1]
        for kind in order:
            one_run(kind, "default", [], rnd, cold_turns)
    for name, flags in variants[1:]:
        for rnd in range(1, a.variants_rounds + 1):
            one_run("llama", name, flags, rnd, [])
    results["load_after"] = os.getloadavg()
    results["summary"] = {k: {"flags": s["flags"], "turns": {t: {"ttft_s": median(r["ttft"]), "reused": median(r["reused"]),
                                                                 "prompt_tokens": median(r["prompt"]),
                                                                 "before_new_messages": median(r["before"]),
                                                                 "cold_ttft_s": median(r["cold"])}
                                                             for t, r in s["turns"].items()}}
                          for k, s in summarize(results).items()}
    Path(f"{out}.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    svg_plot(results, f"{out}.svg")
    print(f"\nwrote {out}.json and {out}.svg; load average before {results['load_before']}, after {results['load_after']}")


if __name__ == "__main__":
    main()
