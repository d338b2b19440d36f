"""`hanpu serve` (docs/SERVE.md) driven over loopback with the real `openai` client and with raw
HTTP: the endpoints, streaming, the same greedy output as `hanpu run`, concurrent clients,
cancellation, every class of bad request, authentication, the prefix cache, SIGTERM draining, and
a bounded load test. The servers run the tiny goldens of tests/golden."""

import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"


def hanpu_exe():
    """The CLI built by `cmake --build --preset release` (scripts/test.sh builds it before pytest);
    HANPU_EXE overrides. A missing binary fails the tests: it is part of what they test."""
    exe = Path(os.environ.get("HANPU_EXE", REPO / "build" / "release" / "hanpu"))
    if not exe.is_file():
        pytest.fail(f"{exe} does not exist: build it with `cmake --build --preset release --target hanpu`")
    return exe


# The server and `hanpu run` are the release CLI, not the Python module: a sanitizer runtime that
# scripts/test_python_sanitized.sh preloads for the module stays out of them.
CLI_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `hanpu serve` process on a free loopback port (model: a golden's name or a directory)."""

    def __init__(self, model="qwen35_tiny", *args):
        self.model = model
        model_dir = Path(model) if Path(model).is_absolute() else GOLDEN / model
        for _attempt in range(3):  # another process may take the free port first
            self.port = free_port()
            cmd = [str(hanpu_exe()), "serve", "--model", str(model_dir), "--port", str(self.port),
                   "--threads", "1", *args]
            # The log goes to a file: the server writes a line per request, which a pipe nobody
            # reads during the test would fill up and block on.
            self.log_file = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log_file, text=True, env=CLI_ENV)
            if self._wait_ready():
                return
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError(f"hanpu serve did not start: {self.log()}")

    def log(self):
        self.log_file.seek(0)
        return self.log_file.read()

    def _wait_ready(self):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _ = self.request("GET", "/health")
                if status == 200:
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def request(self, method, path, body=None, headers=None, raw=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = raw if raw is not None else (json.dumps(body) if body is not None else None)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            text = resp.read().decode("utf-8")
            return resp.status, (json.loads(text) if "json" in (resp.getheader("Content-Type") or "") else text)
        finally:
            conn.close()

    def metrics(self):
        status, text = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key, max_retries=0, timeout=60)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


@pytest.fixture(scope="module")
def server():
    s = Server("qwen35_tiny", "--checkpoint-every", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def kimi_server():
    s = Server("kimi_linear_tiny")
    yield s
    s.stop()


def run_ids(model, *args):
    """Greedy token ids `hanpu run` prints for the same prompt."""
    out = subprocess.run([str(hanpu_exe()), "run", "--model", str(GOLDEN / model), "--greedy", "--ids", "--threads", "1",
                          *args], capture_output=True, text=True, check=True, env=CLI_ENV)
    return [int(t) for t in out.stdout.split()]


def visible(text):
    # The tiny models emit arbitrary bytes; invalid UTF-8 becomes U+FFFD on both sides, but not
    # necessarily one for one, so the comparison is on the valid characters.
    return text.replace("\ufffd", "")


def test_models_and_health(server):
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["qwen35_tiny"]


def test_completion_ids_match_hanpu_run(server, kimi_server):
    status, body = server.request("POST", "/v1/completions",
                                  {"model": "qwen35_tiny", "prompt": "Hello world", "max_tokens": 12, "temperature": 0})
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == run_ids("qwen35_tiny", "--prompt", "Hello world", "-n", "12")
    assert body["usage"]["prompt_tokens"] == 7
    assert body["usage"]["total_tokens"] == 7 + body["usage"]["completion_tokens"]
    # A checkpoint without a tokenizer: prompt and output as token ids.
    status, body = kimi_server.request("POST", "/v1/completions",
                                       {"model": "kimi_linear_tiny", "prompt": [5, 6, 7, 8], "max_tokens": 10,
                                        "temperature": 0})
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == run_ids("kimi_linear_tiny", "--prompt-ids", "5,6,7,8", "-n", "10")


def test_chat_matches_hanpu_run_and_streams_the_same(server):
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model="qwen35_tiny", messages=messages, max_tokens=20, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    out = subprocess.run([str(hanpu_exe()), "run", "--model", str(GOLDEN / "qwen35_tiny"), "--chat", "--greedy",
                          "--threads", "1", "--system", "Be brief.", "--prompt", "Name a colour.", "-n", "20"],
                         capture_output=True, check=True, env=CLI_ENV)
    assert visible(text) == visible(out.stdout.decode("utf-8", "replace").rstrip("\n"))

    chunks = list(client.chat.completions.create(model="qwen35_tiny", messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason


def test_raw_sse_stream_ends_with_done(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "qwen35_tiny", "prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0, "stream": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    events = [line for line in resp.read().decode().split("\n\n") if line]
    conn.close()
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-1]]
    ids = [t for p in payloads for t in p["choices"][0].get("token_ids", [])]
    assert ids == run_ids("qwen35_tiny", "--prompt-ids", "1,2,3", "-n", "8")
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_sampling_seed_and_stop(server):
    body = {"model": "qwen35_tiny", "prompt": [4, 5, 6], "max_tokens": 16, "temperature": 0.9, "top_p": 0.9,
            "top_k": 50, "seed": 1234}
    a = server.request("POST", "/v1/completions", body)[1]
    b = server.request("POST", "/v1/completions", body)[1]
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"], "the same seed gives the same tokens"
    # A stop string cuts the text before it and ends with finish_reason "stop".
    full = server.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": "Hello world",
                                                       "max_tokens": 30, "temperature": 0})[1]["choices"][0]["text"]
    chars = visible(full)
    assert len(chars) >= 4
    stop = chars[2:4]
    r = server.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": "Hello world", "max_tokens": 30,
                                                    "temperature": 0, "stop": [stop]})[1]
    assert r["choices"][0]["finish_reason"] == "stop"
    assert stop not in r["choices"][0]["text"]
    assert full.startswith(r["choices"][0]["text"])


def test_prefix_cache_reuses_the_previous_turn(server):
    client = server.client()
    before = server.metrics()
    history = [{"role": "user", "content": "Tell me about linear attention and recurrent states, at length."}]
    first = client.chat.completions.create(model="qwen35_tiny", messages=history, max_tokens=8, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And the cache?"}]
    second = client.chat.completions.create(model="qwen35_tiny", messages=history, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The first turn's conversation (before its generation prompt) is a prefix of the second's.
    assert cached >= first.usage.prompt_tokens - 30, (cached, first.usage.prompt_tokens)
    after = server.metrics()
    assert after["hanpu_cache_hits_total"] > before["hanpu_cache_hits_total"]
    assert after["hanpu_cache_tokens_reused_total"] - before["hanpu_cache_tokens_reused_total"] >= cached
    # Exact: the same answer as with nothing cached (a fresh server).
    cold = Server("qwen35_tiny", "--cache-mib", "0")
    try:
        again = cold.client().chat.completions.create(model="qwen35_tiny", messages=history, max_tokens=8,
                                                      temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens == 0
        assert again.choices[0].message.content == second.choices[0].message.content
    finally:
        cold.stop()


def test_concurrent_clients_get_their_own_answers(server):
    prompts = [[10 + i, 20 + i, 30 + i, 40 + i] for i in range(6)]

    def ask(p):
        return server.request("POST", "/v1/completions",
                              {"model": "qwen35_tiny", "prompt": p, "max_tokens": 24, "temperature": 0})[1]

    alone = [ask(p)["choices"][0]["token_ids"] for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        together = [r["choices"][0]["token_ids"] for r in pool.map(ask, prompts)]
    assert together == alone


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_client_disconnect_cancels_the_request(server):
    before = server.metrics()["hanpu_requests_cancelled_total"]
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"model": "qwen35_tiny", "prompt": [1, 2, 3], "max_tokens": 30000, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data: " not in received:
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    sock.close()
    assert wait_for(lambda: server.metrics()["hanpu_requests_cancelled_total"] == before + 1), server.metrics()
    m = server.metrics()
    assert m["hanpu_requests_running"] == 0 and m["hanpu_state_bytes"] == 0
    # 30000 tokens would have taken seconds; the sequence stopped long before.
    assert server.request("GET", "/health")[0] == 200


def test_non_streaming_client_disconnect_cancels_the_request(server):
    """A non-streaming request whose client leaves is cancelled too: while it waits the server
    writes a space (valid before JSON) every 0.5 s, and the write that fails cancels it."""
    before = server.metrics()["hanpu_requests_cancelled_total"]
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"model": "qwen35_tiny", "prompt": [1, 2, 3], "max_tokens": 30000, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"\r\n\r\n" not in received:  # the headers (status 200) come first
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received
    sock.close()
    assert wait_for(lambda: server.metrics()["hanpu_requests_cancelled_total"] == before + 1), server.metrics()
    m = server.metrics()
    assert m["hanpu_requests_running"] == 0 and m["hanpu_state_bytes"] == 0
    assert server.request("GET", "/health")[0] == 200


def error_of(status_body):
    status, body = status_body
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return status, body["error"]


def test_every_bad_request_class_is_a_4xx_in_openai_shape(server, kimi_server):
    post = lambda body, **kw: error_of(server.request("POST", kw.get("path", "/v1/chat/completions"), body,
                                                      raw=kw.get("raw")))
    msgs = [{"role": "user", "content": "hi"}]
    status, e = post(None, raw='{"model": "qwen35_tiny", "messages": [')
    assert status == 400 and "not valid JSON" in e["message"]
    status, e = post(None, raw="[1, 2]")
    assert status == 400 and "JSON object" in e["message"]
    status, e = post({"model": "qwen35_tiny", "messages": msgs, "temperature": "hot"})
    assert status == 400 and e["param"] == "temperature" and "expected a number, got string" in e["message"]
    status, e = post({"model": "qwen35_tiny", "messages": msgs, "temperature": 3})
    assert status == 400 and e["param"] == "temperature" and "out of range" in e["message"]
    status, e = post({"model": "qwen35_tiny", "messages": msgs, "max_tokens": 2.5})
    assert status == 400 and e["param"] == "max_tokens"
    status, e = post({"model": "qwen35_tiny", "messages": "hi"})
    assert status == 400 and e["param"] == "messages"
    status, e = post({"model": "qwen35_tiny", "messages": [{"role": "robot", "content": "hi"}]})
    assert status == 400 and "robot" in e["message"]
    status, e = post({"model": "qwen35_tiny", "messages": msgs, "frobnicate": 1})
    assert status == 400 and e["message"] == "Unrecognized request argument supplied: frobnicate"
    status, e = post({"model": "gpt-4o", "messages": msgs})
    assert status == 404 and e["code"] == "model_not_found" and "gpt-4o" in e["message"]
    status, e = post({"messages": msgs})
    assert status == 400 and e["param"] == "model"
    status, e = post({"model": "qwen35_tiny"})
    assert status == 400 and e["param"] == "messages"
    status, e = post({"model": "qwen35_tiny", "prompt": [1, 999999]}, path="/v1/completions")
    assert status == 400 and "outside the vocabulary" in e["message"]
    status, e = post({"model": "qwen35_tiny", "prompt": [[1, 2], [3]]}, path="/v1/completions")
    assert status == 400 and e["param"] == "prompt"
    status, e = post({"model": "qwen35_tiny", "messages": msgs, "max_tokens": 40000})
    assert status == 400 and e["param"] == "max_tokens"
    status, e = post({"model": "qwen35_tiny", "prompt": [1] * 32768, "max_tokens": 10}, path="/v1/completions")
    assert status == 400 and e["code"] == "context_length_exceeded"
    status, e = error_of(server.request("GET", "/v1/nothing"))
    assert status == 404
    # A model without a tokenizer has no chat.
    status, e = error_of(kimi_server.request("POST", "/v1/chat/completions", {"model": "kimi_linear_tiny",
                                                                              "messages": msgs}))
    assert status == 400 and "no tokenizer" in e["message"]
    # The openai client raises its typed errors for them.
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="nope", messages=msgs)
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model="qwen35_tiny", messages=msgs, temperature=-1)
    # ... and the server keeps serving.
    r = server.client().chat.completions.create(model="qwen35_tiny", messages=msgs, max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def checkpoint_with_template(tmp_path, template):
    """qwen35_tiny with its tokenizer_config.json replaced by one carrying `template`."""
    d = tmp_path / "qwen35_tiny"
    d.mkdir(parents=True)
    for f in (GOLDEN / "qwen35_tiny").iterdir():
        if f.name != "tokenizer_config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((GOLDEN / "qwen35_tiny" / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_chat_template_is_rendered_and_unrenderable_ones_refused(tmp_path):
    msgs = [{"role": "user", "content": "hi"}]
    # Any template in hanpu's Jinja subset is rendered (a Llama-2 style one here) ...
    llama = checkpoint_with_template(tmp_path / "a", "{% for message in messages %}[INST] {{ message.content }} "
                                     "[/INST]{% endfor %}")
    # ... one outside it is refused by construct and line; completions still work.
    bad = checkpoint_with_template(tmp_path / "b", "{% for message in messages %}\n{% extends 'x' %}{% endfor %}")
    for d, ok in ((llama, True), (bad, False)):
        s = Server(str(d))
        try:
            status, body = s.request("POST", "/v1/chat/completions", {"model": "qwen35_tiny", "messages": msgs,
                                                                      "max_tokens": 3})
            if ok:
                assert status == 200, body
            else:
                assert status == 400 and body["error"]["code"] == "unsupported_chat_template", body
                assert "line 2" in body["error"]["message"] and "extends" in body["error"]["message"]
                assert s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": "hi",
                                                             "max_tokens": 3})[0] == 200
        finally:
            s.stop()


def test_chat_template_gets_tools_tool_calls_and_kwargs(tmp_path):
    """The checkpoint's template sees messages (tool calls, tool results, reasoning), tools and
    chat_template_kwargs as sent; the prompt it renders is what jinja2 renders (same token count as
    `hanpu tokenize` of jinja2's text); raise_exception in it is a 400 naming the message."""
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    template = (Path(__file__).parent / "chat_templates" / "qwen_json_tools.jinja").read_text()
    template = "{%- if messages[-1].role == 'system' %}{{ raise_exception('system last') }}{% endif %}" + template
    d = checkpoint_with_template(tmp_path, template)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    want = env.from_string(template).render(messages=msgs, tools=tools, documents=None, add_generation_prompt=True,
                                            enable_thinking=False, eos_token=cfg.get("eos_token"),
                                            pad_token=cfg.get("pad_token"))
    (tmp_path / "want.txt").write_text(want)
    ids = subprocess.run([str(hanpu_exe()), "tokenize", "--tokenizer", str(GOLDEN / "qwen35_tiny"), "--ids", "--file",
                          str(tmp_path / "want.txt")], capture_output=True, text=True, check=True).stdout.strip().split(",")
    s = Server(str(d))
    try:
        status, body = s.request("POST", "/v1/chat/completions", {
            "model": "qwen35_tiny", "messages": msgs, "tools": tools, "tool_choice": "auto", "max_tokens": 2,
            "chat_template_kwargs": {"enable_thinking": False}})
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == len(ids)
        status, body = s.request("POST", "/v1/chat/completions", {
            "model": "qwen35_tiny", "messages": msgs + [{"role": "system", "content": "x"}], "max_tokens": 2})
        assert status == 400 and "raise_exception: system last" in body["error"]["message"], body
    finally:
        s.stop()


def test_chat_reply_split_into_reasoning_content(tmp_path):
    """With a template that opens <think> in the prompt (qwen35_xml_tools.jinja, thinking on by
    default), the tiny model's reply never closes it: all of it is reasoning_content, in the whole
    response and in the stream; with enable_thinking false the prompt closes the block and the
    reply is content."""
    d = checkpoint_with_template(tmp_path, (Path(__file__).parent / "chat_templates" / "qwen35_xml_tools.jinja").read_text())
    s = Server(str(d))
    try:
        req = {"model": "qwen35_tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
               "temperature": 0, "ignore_eos": True}
        status, body = s.request("POST", "/v1/chat/completions", req)
        assert status == 200, body
        msg = body["choices"][0]["message"]
        assert msg["content"] == "" and msg["reasoning_content"], msg
        status, off = s.request("POST", "/v1/chat/completions", {**req, "chat_template_kwargs": {"enable_thinking": False}})
        assert status == 200 and off["choices"][0]["message"]["content"] and "reasoning_content" not in off["choices"][0]["message"]
        stream = s.client().chat.completions.create(**{k: v for k, v in req.items() if k != "ignore_eos"}, stream=True,
                                                    extra_body={"ignore_eos": True})
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in stream if c.choices)
        assert reasoning.strip("\n") == msg["reasoning_content"]
    finally:
        s.stop()


def test_limits_body_prompt_and_queue():
    s = Server("qwen35_tiny", "--max-body-bytes", "2048", "--max-prompt-tokens", "64", "--parallel", "1",
               "--max-queue", "1")
    try:
        status, e = error_of(s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": [1] * 1000}))
        assert status == 413 and "2048" in e["message"]
        status, e = error_of(s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": [1] * 65}))
        assert status == 400 and e["code"] == "context_length_exceeded" and "65 tokens" in e["message"]
        # One running and one queued request fill it (each would take seconds); the next gets 429.
        long = {"model": "qwen35_tiny", "prompt": [1, 2], "max_tokens": 30000, "temperature": 0, "ignore_eos": True,
                "stream": True}
        conns = []
        for _ in range(2):
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            c.request("POST", "/v1/completions", body=json.dumps(long))
            conns.append(c)
        assert wait_for(lambda: s.metrics()["hanpu_requests_running"] + s.metrics()["hanpu_requests_waiting"] == 2)
        status, e = error_of(s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": [1]}))
        assert status == 429 and e["type"] == "rate_limit_error"
        assert conns[0].getresponse().status == 200
        for c in conns:
            c.close()  # cancels both
        assert wait_for(lambda: s.metrics()["hanpu_requests_running"] + s.metrics()["hanpu_requests_waiting"] == 0)
        assert s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": [1], "max_tokens": 2})[0] == 200
    finally:
        s.stop()


def test_api_key():
    s = Server("qwen35_tiny", "--api-key", "sekrit")
    try:
        body = {"model": "qwen35_tiny", "prompt": [1, 2], "max_tokens": 2}
        status, e = error_of(s.request("POST", "/v1/completions", body))
        assert status == 401 and e["code"] == "invalid_api_key"
        status, e = error_of(s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"}))
        assert status == 401
        assert s.request("GET", "/metrics")[0] == 401
        assert s.request("POST", "/v1/completions", body, headers={"Authorization": "Bearer sekrit"})[0] == 200
        assert s.request("GET", "/health")[0] == 200  # liveness probes carry no key
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.client("sekrit").models.list().data[0].id == "qwen35_tiny"
    finally:
        s.stop()


def test_sigterm_drains_running_requests_and_exits_0():
    s = Server("qwen35_tiny")
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "qwen35_tiny", "prompt": [1, 2], "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
         "stream": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.read1(100)
    assert first.startswith(b"data: ")
    s.proc.send_signal(signal.SIGTERM)
    rest = (first + resp.read()).decode()
    conn.close()
    assert rest.endswith("data: [DONE]\n\n")
    tokens = sum(len(json.loads(e[6:])["choices"][0].get("token_ids", []))
                 for e in rest.split("\n\n") if e.startswith("data: {"))
    assert tokens == 3000, "the running request finished in full"
    assert s.proc.wait(timeout=20) == 0
    assert "draining" in s.log()
    s.stop()


# About half a second on the tiny model, so it runs on every ISA pass of scripts/test.sh (a skip
# would fail that run).
def test_load_200_requests_from_4_clients():
    # A small cache budget, so the cache fills early and RSS must settle rather than follow it.
    s = Server("qwen35_tiny", "--cache-mib", "2", "--checkpoint-every", "8")
    try:
        prompts = [[(7 * i + j) % 300 + 1 for j in range(5 + i % 7)] for i in range(10)]
        body = lambda p: {"model": "qwen35_tiny", "prompt": p, "max_tokens": 12, "temperature": 0}
        expected = [s.request("POST", "/v1/completions", body(p))[1]["choices"][0]["token_ids"] for p in prompts]
        client = s.client()
        rss = []

        def worker(w):
            errors = []
            for i in range(50):
                k = (w * 50 + i) % len(prompts)
                if i % 5 == 4:  # some through the openai client, streaming
                    text = "".join(c.choices[0].text for c in client.completions.create(
                        model="qwen35_tiny", prompt=prompts[k], max_tokens=12, temperature=0, stream=True))
                    got = None
                else:
                    status, r = s.request("POST", "/v1/completions", body(prompts[k]))
                    if status != 200:
                        errors.append((status, r))
                        continue
                    got = r["choices"][0]["token_ids"]
                    text = r["choices"][0]["text"]
                if got is not None and got != expected[k]:
                    errors.append(("mixed-up response", k, got, expected[k]))
                if w == 0 and i in (25, 49):
                    rss.append(s.rss_bytes())
                assert text is not None
            return errors

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            errors = [e for errs in pool.map(worker, range(4)) for e in errs]
        assert errors == []
        m = s.metrics()
        assert m["hanpu_requests_finished_total"] >= 210
        assert m["hanpu_requests_running"] == 0 and m["hanpu_state_bytes"] == 0
        assert m["hanpu_cache_bytes"] <= 2 << 20
        # Settled: the second half of the run grew RSS by less than 8 MiB (a leak of even one
        # tiny-model state per request would be ~100 states, several MiB, plus their buffers).
        assert rss[1] - rss[0] < 8 << 20, rss
    finally:
        s.stop()


def test_startup_errors_name_the_problem():
    run = lambda *args: subprocess.run([str(hanpu_exe()), "serve", *args], capture_output=True, text=True, timeout=60,
                                       env=CLI_ENV)
    r = run()
    assert r.returncode == 1 and "give exactly one of --model and --synthetic" in r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run("--model", str(GOLDEN / "qwen35_tiny"), "--port", str(port))
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr
    r = run("--model", str(GOLDEN / "qwen35_tiny"), "--ctx", "100", "--max-prompt-tokens", "200")
    assert r.returncode == 1 and "--max-prompt-tokens 200 is more than --ctx 100" in r.stderr


@pytest.mark.parametrize("model", ["qwen35_tiny", "qwen3next_tiny", "qwen35moe_tiny", "kimi_linear_tiny",
                                   "bailing_hybrid_tiny"])
def test_every_family_generates_what_hanpu_run_does(model):
    s = Server(model)
    try:
        prompt = [3, 14, 15, 92, 65, 35, 89, 79]
        body = {"model": model, "prompt": prompt, "max_tokens": 10, "temperature": 0}
        first = s.request("POST", "/v1/completions", body)[1]
        assert first["choices"][0]["token_ids"] == run_ids(model, "--prompt-ids", ",".join(map(str, prompt)), "-n", "10")
        # Again, with the prompt's prefix now cached: the same tokens.
        again = s.request("POST", "/v1/completions", dict(body, prompt=prompt + [7]))[1]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt)
        assert again["choices"][0]["token_ids"] == run_ids(model, "--prompt-ids", ",".join(map(str, prompt + [7])),
                                                           "-n", "10")
    finally:
        s.stop()
