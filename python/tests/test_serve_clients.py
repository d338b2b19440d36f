"""`hanpu serve` for real clients (docs/SERVE.md): Anthropic's Messages API driven by the real
`anthropic` client, the rest of the OpenAI surface (n, logprobs, echo, tool_choice, stop strings
across tokens) driven by the real `openai` client, the prefix cache across a whole conversation,
and the chat page at / in headless Chromium. The servers run the tiny goldens of tests/golden."""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from test_serve import CLI_ENV, GOLDEN, Server, checkpoint_with_template, visible

try:
    import anthropic
except ImportError:  # only the Anthropic tests need it (they skip; scripts/setup_tests.sh installs it)
    anthropic = None

TEMPLATES = Path(__file__).parent / "chat_templates"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def server():
    s = Server("qwen35_tiny", "--checkpoint-every", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def xml_server(tmp_path_factory):
    """qwen35_tiny with a Qwen3.5-style template: <think> opened in the prompt, XML tool calls."""
    d = checkpoint_with_template(tmp_path_factory.mktemp("xml"), (TEMPLATES / "qwen35_xml_tools.jinja").read_text())
    s = Server(str(d), "--checkpoint-every", "16")
    yield s
    s.stop()


def claude(server, api_key="none"):
    if anthropic is None:
        pytest.skip("the anthropic client is not installed: pip install -r python/requirements-test.txt")
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key=api_key, max_retries=0, timeout=60)


GREEDY = {"temperature": 0}


def ascii_of(text):
    return "".join(ch for ch in text if ch.isascii())  # the anthropic client no longer takes temperature: sent as an extra


# ---- Anthropic Messages ------------------------------------------------------------------------

def test_anthropic_message_is_the_chat_completion_and_streams_as_anthropic_does(server):
    system, msgs = "Be brief.", [{"role": "user", "content": "Name a colour."}]
    r = claude(server).messages.create(model="qwen35_tiny", max_tokens=12, system=system, messages=msgs, extra_body=GREEDY)
    o = server.client().chat.completions.create(model="qwen35_tiny", max_tokens=12, temperature=0,
                                                messages=[{"role": "system", "content": system}] + msgs)
    assert r.type == "message" and r.role == "assistant" and r.model == "qwen35_tiny"
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == o.choices[0].message.content, "the same prompt and greedy tokens as the OpenAI endpoint"
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[o.choices[0].finish_reason]
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == o.usage.prompt_tokens
    assert r.usage.output_tokens == o.usage.completion_tokens

    with claude(server).messages.stream(model="qwen35_tiny", max_tokens=12, system=system, messages=msgs,
                                        extra_body=GREEDY) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert visible(final.content[0].text) == visible(r.content[0].text) and final.stop_reason == r.stop_reason
    assert final.usage.output_tokens == r.usage.output_tokens
    # The raw event sequence (the client's own "text" events are derived from the deltas).
    raw = [e for e in events if e != "text"]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}

    # stop_sequences: a stop string from the greedy text ends it with stop_sequence named.
    text = visible(r.content[0].text)
    stop = text[3:5]
    s = claude(server).messages.create(model="qwen35_tiny", max_tokens=12, system=system, messages=msgs,
                                       stop_sequences=[stop], extra_body=GREEDY)
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == stop
    assert r.content[0].text.startswith(s.content[0].text) and stop not in s.content[0].text


def test_anthropic_thinking_tools_and_tool_results(xml_server):
    c = claude(xml_server)
    msgs = [{"role": "user", "content": "hi"}]
    # Thinking on: the template opens <think>, the tiny model never closes it, so the budget does
    # (1024 tokens, then the end of the block is forced): a thinking block, streamed as
    # thinking_delta events, then the answer's text.
    think = dict(model="qwen35_tiny", max_tokens=1060, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024},
                 extra_body={**GREEDY, "ignore_eos": True})
    r = c.messages.create(**think)
    assert [b.type for b in r.content] == ["thinking", "text"] and r.content[0].thinking and r.stop_reason == "max_tokens"
    with c.messages.stream(**think) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert ("content_block_delta", "thinking_delta") in kinds and ("content_block_delta", "signature_delta") in kinds
    # (Compared on ASCII: the tiny model writes random bytes, whose invalid UTF-8 is replaced per
    # event when streamed and once in the whole text otherwise, which can differ by a character.)
    # (The streamed thinking keeps the line feed before </think> that the whole message trims.)
    assert ascii_of(final.content[0].thinking).rstrip("\n") == ascii_of(r.content[0].thinking)
    # Thinking off (Anthropic's default): the template closes the block; the reply is text.
    off = c.messages.create(model="qwen35_tiny", max_tokens=8, messages=msgs, extra_body=GREEDY)
    assert [b.type for b in off.content] == ["text"]

    # A conversation with a tool call and its result renders as the same prompt the OpenAI
    # endpoint renders from the equivalent messages.
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": ""},
                                                 {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Oslo"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "-3 C"}]}]
    a = c.messages.create(model="qwen35_tiny", max_tokens=3, messages=history, tools=ANTHROPIC_TOOLS, extra_body=GREEDY)
    o = xml_server.client().chat.completions.create(
        model="qwen35_tiny", max_tokens=3, temperature=0, tools=TOOLS, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        messages=[history[0],
                  {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}])
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens == o.usage.prompt_tokens
    # tool_choice naming a tool: the reply is a call to it, constrained to its input_schema
    # (python/tests/test_serve_tool_calls.py has the rest).
    forced = c.messages.create(model="qwen35_tiny", max_tokens=80, messages=msgs, tools=ANTHROPIC_TOOLS,
                               tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    uses = [b for b in forced.content if b.type == "tool_use"]
    assert forced.stop_reason == "tool_use" and len(uses) >= 1, forced.content
    assert uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str), forced.content


def test_anthropic_errors_have_anthropics_shape():
    if anthropic is None:
        pytest.skip("the anthropic client is not installed: pip install -r python/requirements-test.txt")
    s = Server("qwen35_tiny", "--api-key", "sekret")
    try:
        c = claude(s, "sekret")
        msgs = [{"role": "user", "content": "hi"}]
        assert c.messages.create(model="qwen35_tiny", max_tokens=2, messages=msgs).usage.output_tokens >= 1
        with pytest.raises(anthropic.AuthenticationError) as e:
            claude(s, "wrong").messages.create(model="qwen35_tiny", max_tokens=2, messages=msgs)
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.NotFoundError) as e:
            c.messages.create(model="claude-x", max_tokens=2, messages=msgs)
        assert e.value.body["error"]["type"] == "not_found_error" and "claude-x" in e.value.body["error"]["message"]
        cases = [
            ({"model": "qwen35_tiny", "messages": msgs}, "max_tokens: Field required"),
            ({"model": "qwen35_tiny", "max_tokens": 0, "messages": msgs}, "max_tokens: must be at least 1"),
            ({"model": "qwen35_tiny", "max_tokens": 2, "messages": msgs, "frobnicate": 1}, "frobnicate: Extra inputs"),
            ({"model": "qwen35_tiny", "max_tokens": 2, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
            ({"model": "qwen35_tiny", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
             "messages[0].content[0].type: 'image' blocks are not supported"),
            ({"model": "qwen35_tiny", "max_tokens": 2000, "messages": msgs, "thinking": {"type": "enabled", "budget_tokens": 10}},
             "thinking.budget_tokens: must be at least 1024"),
            ({"model": "qwen35_tiny", "max_tokens": 2, "messages": msgs, "output_config": {"format": {"type": "json_schema"}}},
             "output_config.format"),
        ]
        for body, message in cases:
            status, got = s.request("POST", "/v1/messages", body, headers={"x-api-key": "sekret"})
            assert status == 400, (body, got)
            assert got["type"] == "error" and got["error"]["type"] == "invalid_request_error", got
            assert message in got["error"]["message"], (message, got)
        with pytest.raises(anthropic.BadRequestError):
            c.messages.create(model="qwen35_tiny", max_tokens=2, messages=[])
    finally:
        s.stop()


# ---- OpenAI chat completions and completions -----------------------------------------------------

def test_n_choices_share_the_prompt_and_match_single_requests_with_the_next_seeds(server):
    client = server.client()
    msgs = [{"role": "user", "content": "Tell me a story."}]
    sampling = dict(model="qwen35_tiny", messages=msgs, max_tokens=10, temperature=1.0, top_p=1.0)
    r = client.chat.completions.create(n=3, seed=7, **sampling)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(seed=7 + i, **sampling) for i in range(3)]
    assert [c.message.content for c in r.choices] == [s.choices[0].message.content for s in singles]
    assert len({c.message.content for c in r.choices}) > 1, "different seeds, different samples"
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    stream = client.chat.completions.create(n=3, seed=7, stream=True, stream_options={"include_usage": True}, **sampling)
    texts, usage, order = ["", "", ""], None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.delta.content:
                order.append(("text", c.index))
            if c.finish_reason:
                order.append(("end", c.index))
    assert texts == [c.message.content for c in r.choices]
    assert usage.completion_tokens == r.usage.completion_tokens
    # The choices decode together and their chunks interleave as they are generated: every
    # choice's text starts before the first choice ends (one after another, choices 1 and 2 would
    # start only after choice 0's end).
    first_end = order.index(next(e for e in order if e[0] == "end"))
    for i in range(3):
        if texts[i]:
            assert order.index(("text", i)) < first_end, order


def test_n_choices_stream_interleaved_with_logprobs_and_completions(server):
    """Interleaved n > 1 streams keep each choice's own pieces apart: chat with logprobs (each
    token's logprob in its choice's chunks) and /v1/completions (text and text_offset per choice)
    equal the whole responses choice by choice."""
    client = server.client()
    sampling = dict(model="qwen35_tiny", max_tokens=8, temperature=1.0, seed=11, n=2, extra_body={"ignore_eos": True})
    msgs = [{"role": "user", "content": "Two stories."}]
    whole = client.chat.completions.create(messages=msgs, logprobs=True, **sampling)
    tokens, texts, ends = [[], []], ["", ""], []
    for chunk in client.chat.completions.create(messages=msgs, logprobs=True, stream=True, **sampling):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.logprobs and c.logprobs.content:
                tokens[c.index] += [(t.token, t.logprob) for t in c.logprobs.content]
            if c.finish_reason:
                ends.append(c.index)
    assert sorted(ends) == [0, 1]
    for i in range(2):
        assert texts[i] == whole.choices[i].message.content
        assert tokens[i] == [(t.token, t.logprob) for t in whole.choices[i].logprobs.content]
    whole = client.completions.create(prompt="Once upon", logprobs=1, **sampling)
    texts, offsets = ["", ""], [[], []]
    for chunk in client.completions.create(prompt="Once upon", logprobs=1, stream=True, **sampling):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.logprobs:
                offsets[c.index] += c.logprobs.text_offset
    for i in range(2):
        assert texts[i] == whole.choices[i].text
        assert offsets[i] == whole.choices[i].logprobs.text_offset


def test_streamed_reasoning_and_content_equal_the_whole_message(xml_server):
    """The reasoning loses the line feeds at its start and end and the content those at its start,
    streamed as in the whole message: byte for byte the same fields. A thinking budget forces the
    template's "\n</think>\n\n" after `budget` tokens, so the line feeds around the tags are
    there (the thinking budget test checks that they are written)."""
    client = xml_server.client()
    msgs = [{"role": "user", "content": "Think, then answer."}]
    checked = 0
    for budget, seed in ((1, 1), (3, 2), (6, 3), (9, 4)):
        req = dict(model="qwen35_tiny", messages=msgs, max_tokens=24, temperature=1.0, seed=seed,
                   extra_body={"thinking_budget_tokens": budget, "ignore_eos": True})
        whole = client.chat.completions.create(**req).choices[0].message
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(**req, stream=True):
            for c in chunk.choices:
                reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                content += c.delta.content or ""
        assert reasoning == whole.model_extra["reasoning_content"], (budget, reasoning, whole)
        assert content == whole.content, (budget, content, whole)
        assert not content.startswith("\n") and not reasoning.endswith("\n")
        checked += 1
    assert checked == 4
    # Anthropic's thinking and text blocks, streamed and whole, are the same text (its smallest
    # budget is 1024 tokens).
    c = claude(xml_server)
    areq = dict(model="qwen35_tiny", max_tokens=1040, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024},
                extra_body={"ignore_eos": True, "temperature": 0})  # greedy: Anthropic takes no seed
    whole = c.messages.create(**areq)
    with c.messages.stream(**areq) as stream:
        streamed = stream.get_final_message()
    blocks = lambda m: [(b.type, b.thinking if b.type == "thinking" else b.text) for b in m.content]  # noqa: E731
    assert [t for t, _ in blocks(whole)] == ["thinking", "text"]
    assert blocks(streamed) == blocks(whole)


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def test_logprobs_match_the_models_log_softmax(server):
    hanpu = pytest.importorskip("hanpu")
    model = hanpu.Model.load(str(GOLDEN / "qwen35_tiny"))
    r = server.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": [5, 6, 7, 8], "max_tokens": 6,
                                                    "temperature": 0, "logprobs": 3})[1]
    ids = r["choices"][0]["token_ids"]
    lp = r["choices"][0]["logprobs"]
    logits = np.asarray(model.forward(model.new_state(), [5, 6, 7, 8] + ids, all_logits=True))
    for i, tok in enumerate(ids):
        want = log_softmax(logits[3 + i])
        assert abs(lp["token_logprobs"][i] - want[tok]) < 1e-3, (i, lp["token_logprobs"][i], want[tok])
        top = sorted(range(len(want)), key=lambda t: -want[t])[:3]
        # A dict by token text: unordered, and tokens that are parts of one UTF-8 character share
        # the text U+FFFD, so some may collapse into one entry.
        got = sorted(lp["top_logprobs"][i].values(), reverse=True)
        assert abs(got[0] - want[top[0]]) < 1e-3
        assert all(min(abs(g - want[t]) for t in top) < 1e-3 for g in got), (got, [want[t] for t in top])
    # Chat: logprobs.content with top_logprobs; greedy picks the most likely token.
    c = server.client().chat.completions.create(model="qwen35_tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=5, temperature=0, logprobs=True, top_logprobs=4)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 4 and e.logprob == e.top_logprobs[0].logprob
        assert sum(np.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-5
    streamed = [e for ch in server.client().chat.completions.create(
        model="qwen35_tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0, logprobs=True,
        top_logprobs=4, stream=True) if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]


def test_stop_string_across_a_token_boundary_and_echo(server):
    body = {"model": "qwen35_tiny", "prompt": "Hello world", "max_tokens": 30, "temperature": 0, "logprobs": 0}
    full = server.request("POST", "/v1/completions", body)[1]["choices"][0]
    tokens = full["logprobs"]["tokens"]
    # Two neighbouring tokens of plain ASCII: the stop string is the last character of one and
    # the first of the next.
    k = next(i for i in range(len(tokens) - 1)
             if tokens[i].isascii() and tokens[i + 1].isascii() and tokens[i].strip() and tokens[i + 1].strip())
    stop = tokens[k][-1] + tokens[k + 1][0]
    cut = server.request("POST", "/v1/completions", {**body, "stop": [stop]})[1]["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == full["text"][:full["text"].index(stop)]
    # Streamed, the text held back for a possible stop string comes out the same.
    stream = server.client().completions.create(model="qwen35_tiny", prompt="Hello world", max_tokens=30, temperature=0,
                                                stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in stream) == cut["text"]
    # echo: the prompt's text before the output.
    plain = server.request("POST", "/v1/completions", {**body, "logprobs": None})[1]["choices"][0]["text"]
    echoed = server.request("POST", "/v1/completions", {**body, "logprobs": None, "echo": True})[1]["choices"][0]["text"]
    assert echoed == "Hello world" + plain
    status, e = server.request("POST", "/v1/completions", {**body, "echo": True})
    assert status == 400 and e["error"]["param"] == "echo"


def test_tool_choice_required_and_named_and_refusals(xml_server, server):
    client = xml_server.client()
    msgs = [{"role": "user", "content": "Weather in Oslo?"}]
    named = client.chat.completions.create(model="qwen35_tiny", messages=msgs, tools=TOOLS, max_tokens=80, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           logprobs=True)
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    assert named.choices[0].finish_reason == "tool_calls" and not named.choices[0].message.content
    # The prompt ended with "<tool_call>\n<function=get_weather>\n": the reply goes on from there.
    assert "".join(t.token for t in named.choices[0].logprobs.content).startswith("<parameter=city>\n")
    assert not named.choices[0].message.reasoning_content if hasattr(named.choices[0].message, "reasoning_content") else True
    required = client.chat.completions.create(model="qwen35_tiny", messages=msgs, tools=TOOLS, max_tokens=80,
                                              temperature=0, tool_choice="required")
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather"
    streamed = {}  # index -> [name, arguments]: a call's first delta names it, its arguments come in pieces
    for c in client.chat.completions.create(model="qwen35_tiny", messages=msgs, tools=TOOLS, max_tokens=80, temperature=0,
                                            tool_choice="required", stream=True):
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            call = streamed.setdefault(d.index, [d.function.name, ""])
            call[1] += d.function.arguments or ""
    assert [tuple(streamed[i]) for i in sorted(streamed)] == \
        [(t.function.name, t.function.arguments) for t in required.choices[0].message.tool_calls]
    for kwargs, param in (({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS}, "tool_choice"),
                          ({"tool_choice": "required"}, "tool_choice"),
                          ({"tool_choice": "sometimes", "tools": TOOLS}, "tool_choice"),
                          ({"response_format": {"type": "json_object"}, "tools": TOOLS}, "response_format")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="qwen35_tiny", messages=msgs, max_tokens=2, **kwargs)
        assert e.value.body["param"] == param, e.value.body
    # The ChatML fallback renders no tools, so it cannot require a call.
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model="qwen35_tiny", messages=msgs, max_tokens=2, tools=TOOLS,
                                                tool_choice="required")


# A template that passes the tools without showing how a call is written: the family's registry
# row (hanpu/model_family.hpp) says it -- XML parameters for Qwen3.5, JSON for Qwen3-Next.
MARKERLESS_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("golden, call_start", [
    ("qwen35_tiny", "<parameter=city>\n"),  # after the prompt's "<tool_call>\n<function=get_weather>\n"
    ("qwen3next_tiny", '{"city":'),          # after '<tool_call>\n{"name": "get_weather", "arguments": '
])
def test_tool_call_format_from_the_family_row(tmp_path, golden, call_start):
    d = tmp_path / golden
    d.mkdir()
    for f in (GOLDEN / golden).iterdir():
        if f.name != "tokenizer_config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((GOLDEN / golden / "tokenizer_config.json").read_text())
    cfg["chat_template"] = MARKERLESS_TOOLS_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    s = Server(str(d))
    try:
        r = s.client().chat.completions.create(model=golden, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                               tools=TOOLS, max_tokens=80, temperature=0, logprobs=True,
                                               tool_choice={"type": "function", "function": {"name": "get_weather"}})
        generated = "".join(t.token for t in r.choices[0].logprobs.content)
        assert generated.startswith(call_start), generated
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    finally:
        s.stop()


# ---- the prefix cache across a conversation ------------------------------------------------------

def conversation_reuse(server, turns, template_kwargs=None, max_tokens=16):
    """Runs a chat turn by turn; returns per turn (prompt tokens, cached tokens, tokens of the new
    message alone) and the last reply."""
    client = server.client()
    history, out = [], []
    extra = {"chat_template_kwargs": template_kwargs} if template_kwargs else {}
    for text in turns:
        alone = client.chat.completions.create(model="qwen35_tiny", messages=[{"role": "user", "content": text}],
                                               max_tokens=1, temperature=0, extra_body=extra).usage.prompt_tokens
        history.append({"role": "user", "content": text})
        r = client.chat.completions.create(model="qwen35_tiny", messages=history, max_tokens=max_tokens, temperature=0,
                                           extra_body=extra)
        out.append((r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens, alone, r.usage.model_extra["hanpu_cache"]))
        msg = r.choices[0].message
        reply = {"role": "assistant", "content": msg.content}
        if getattr(msg, "reasoning_content", None) is not None:
            reply["reasoning_content"] = msg.reasoning_content
        history.append(reply)
    return out, r.choices[0].message.content


TURNS = ["Tell me about linear attention.", "And the recurrent state?", "How big is it?", "Thanks, one more thing.",
         "Summarise all of it."]


@pytest.mark.parametrize("template", [None, "qwen35_xml_tools.jinja"])
def test_each_turn_reuses_everything_before_its_new_message(tmp_path, template):
    """The previous reply is not recomputed: from the second turn on, every prompt token before the
    new user message comes from the cache (the new message's own tokens, measured as a
    conversation of its own, bound what is left), with ChatML and with a template that drops
    earlier turns' reasoning."""
    model = "qwen35_tiny" if template is None else str(
        checkpoint_with_template(tmp_path, (TEMPLATES / template).read_text()))
    s = Server(model, "--checkpoint-every", "512")
    try:
        turns, last = conversation_reuse(s, TURNS, {"enable_thinking": True} if template else None)
        for i, (prompt, cached, alone, cache) in enumerate(turns[1:], start=2):
            print(f"turn {i}: prompt {prompt} tokens, reused {cached} ({100 * cached / prompt:.1f}%), "
                  f"new message alone {alone} tokens: {cache}")
            assert cached >= prompt - alone, (i, prompt, cached, alone, cache)
            assert cache["result"] == "hit"
        # With the template that renders an earlier reply anew (its <think> block dropped), each
        # next-turn snapshot restores a snapshot taken at the very token where its prompt leaves the
        # request's (server.cpp: next_turn_divergence_length): nothing before that point is computed
        # twice, from the first turn on. (With ChatML the prompts part only inside the reply, whose
        # text, from a random model, holds replaced invalid UTF-8 and re-encodes to other tokens.)
        warm = [line for line in s.log().splitlines() if "next-turn snapshot" in line]
        assert len(warm) >= len(TURNS), warm
        if template:
            assert all("cache hit" in line for line in warm), warm
        # Exact: the last turn answers as a fresh server with nothing cached does (below).
    finally:
        s.stop()
    cold = Server(model, "--cache-mib", "0")
    try:
        _, cold_last = conversation_reuse(cold, TURNS, {"enable_thinking": True} if template else None)
        assert cold_last == last
    finally:
        cold.stop()


# ---- the chat page ---------------------------------------------------------------------------------

def test_chat_page_streams_a_reply_in_headless_chromium(server):
    status, page = server.request("GET", "/")
    assert status == 200 and "<title>hanpu chat</title>" in page and "http" not in page.split("<script>")[1].split("fetch(")[0]
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install -r python/requirements-test.txt")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup_tests.sh installs them)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    # The browser runs without the sanitizer runtime that scripts/test_python_sanitized.sh preloads.
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"), env=CLI_ENV)
    driver = webdriver.Chrome(service=service, options=opts)
    try:
        driver.get(f"http://127.0.0.1:{server.port}/")
        WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "model").text == "qwen35_tiny")
        # Greedy, so the page's reply can be compared with the API's.
        want = server.client().chat.completions.create(model="qwen35_tiny", max_tokens=300, temperature=0,
                                                       messages=[{"role": "user", "content": "Hello there"}])
        assert want.usage.completion_tokens >= 20, "a reply long enough to arrive in several pieces"
        for field, value in (("max_tokens", "300"), ("temperature", "0")):
            driver.find_element(By.ID, field).clear()
            driver.find_element(By.ID, field).send_keys(value)
        # Every change of the reply's text, as the page makes it: streamed means several.
        driver.execute_script("""
            window.hanpuSeen = [];
            new MutationObserver(() => {
              const c = document.querySelector('.assistant .content');
              if (c) window.hanpuSeen.push(c.textContent);
            }).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});""")
        driver.find_element(By.ID, "input").send_keys("Hello there")
        driver.find_element(By.ID, "send").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.CSS_SELECTOR, ".assistant .stats").text)
        stats = driver.find_element(By.CSS_SELECTOR, ".assistant .stats").text
        assert "tokens/s" in stats and "from the cache" in stats and f"{want.usage.completion_tokens} tokens" in stats, stats
        assert driver.find_element(By.CSS_SELECTOR, ".user").text == "Hello there"
        seen = [t for t in driver.execute_script("return window.hanpuSeen;") if t]
        final = driver.execute_script("return document.querySelector('.assistant .content').textContent;")
        assert final == want.choices[0].message.content
        growing = sorted(set(seen), key=len)
        assert len(growing) >= 2 and all(final.startswith(t) for t in growing), growing
    finally:
        driver.quit()


# ---- one generation path -------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["qwen35_tiny", "kimi_linear_tiny"])
def test_cli_python_and_server_generate_the_same_tokens(model):
    """The same prompt and sampling settings give the same tokens from `hanpu run`, the Python
    package's Model.generate and `hanpu serve` (hanpu/generator.hpp: one Generator behind all
    three), sampled at several seeds, and each stops at the same stop token."""
    hanpu = pytest.importorskip("hanpu")
    if not hasattr(hanpu.model._hanpu, "_generate"):
        pytest.fail("the installed hanpu package predates the Generator: pip install this tree")
    import subprocess

    from test_serve import hanpu_exe
    prompt = [5, 6, 7, 8, 9, 10, 11]
    m = hanpu.Model.load(str(GOLDEN / model))
    s = Server(model)
    try:
        for seed in (1, 2, 3):
            settings = {"temperature": 0.8, "top_k": 0, "top_p": 0.9, "seed": seed}
            cli = [int(t) for t in subprocess.run(
                [str(hanpu_exe()), "run", "--model", str(GOLDEN / model), "--ids", "--threads", "1", "--prompt-ids",
                 ",".join(map(str, prompt)), "-n", "40", "--temp", "0.8", "--top-k", "0", "--top-p", "0.9", "--seed",
                 str(seed)], capture_output=True, text=True, check=True, env=CLI_ENV).stdout.split()]
            py = m.generate(prompt, max_new_tokens=40, **settings)
            status, body = s.request("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 40,
                                                                  **settings})
            assert status == 200, body
            served = body["choices"][0]["token_ids"]
            stop = m.config["eos_token_ids"]
            py_out = py[:-1] if py and py[-1] in stop else py  # generate() keeps the stop token
            assert cli == py_out == served, (seed, cli, py, served)
    finally:
        s.stop()


def test_python_generate_stops_at_the_chat_end_marker_and_uses_the_checkpoint_template(tmp_path):
    hanpu = pytest.importorskip("hanpu")
    m = hanpu.Model.load(str(GOLDEN / "qwen35_tiny"))
    tok = hanpu.Tokenizer.from_dir(str(GOLDEN / "qwen35_tiny"))
    im_end = tok.token_to_id("<|im_end|>")
    # The default stop ids are the CLI's and the server's: the config's eos ids and the chat end marker.
    assert im_end in hanpu.model._hanpu._default_stop_ids(m._m, tok._t)
    assert im_end not in m.config["eos_token_ids"]
    # The checkpoint's template when it has one, as the server renders it.
    d = checkpoint_with_template(tmp_path, (TEMPLATES / "qwen35_xml_tools.jinja").read_text())
    t = hanpu.Tokenizer.from_dir(str(d))
    msgs = [{"role": "user", "content": "Weather in Oslo?"}]
    text = t.apply_chat_template(msgs, tools=TOOLS, enable_thinking=True)
    assert "<tools>" in text and text.endswith("<think>\n"), text
    s = Server(str(d))
    try:
        status, body = s.request("POST", "/v1/chat/completions", {"model": "qwen35_tiny", "messages": msgs, "tools": TOOLS,
                                                                  "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": True}})
        assert status == 200 and body["usage"]["prompt_tokens"] == len(t.encode(text)), body
    finally:
        s.stop()
    # Without a template: ChatML, as before.
    assert tok.apply_chat_template(msgs).startswith("<|im_start|>user\n")


# ---- structured output ------------------------------------------------------------------------------

# Schemas as clients send them: OpenAI strict style, pydantic's (with $defs, anyOf null, titles),
# recursion through $ref, enums of mixed types, formats.
JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
     "required": ["name", "age", "ok"], "additionalProperties": False},
    {"$defs": {"Item": {"properties": {"name": {"title": "Name", "type": "string"},
                                       "qty": {"title": "Qty", "type": "integer"}},
                        "required": ["name", "qty"], "title": "Item", "type": "object", "additionalProperties": False}},
     "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "type": "array", "maxItems": 3, "title": "Items"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
     "required": ["items", "note"], "title": "Order", "type": "object", "additionalProperties": False},
    {"$defs": {"t": {"type": "object", "properties": {"v": {"type": "integer"},
                                                      "c": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}},
                     "required": ["v"]}}, "$ref": "#/$defs/t"},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", 3, None]}, "tags": {"type": "array", "minItems": 2,
                                      "items": {"type": "string", "format": "date"}},
                                      "when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"},
                                      "n": {"type": ["number", "null"]}, "const": {"const": {"k": [1, "x"]}}},
     "required": ["color", "tags", "when", "id", "const"]},
    {"type": "object", "properties": {"meta": {"type": "object"}, "any": {}}, "required": ["meta", "any"]},
]


def test_json_schema_output_validates_at_every_seed(server, xml_server):
    """response_format json_schema (strict): a random-weight model's output, masked token by token,
    parses and validates against the schema (PyPI jsonschema, with format checking) at every seed,
    streamed or not, closed within max_tokens, and ends the generation by itself."""
    import jsonschema
    msgs = [{"role": "user", "content": "Give me JSON."}]
    checker = jsonschema.FormatChecker()
    for s in (server, xml_server):
        client = s.client()
        for i, schema in enumerate(JSON_SCHEMAS):
            rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
            for seed in range(5):
                max_tokens = (150, 200)[seed % 2]
                r = client.chat.completions.create(model="qwen35_tiny", messages=msgs, seed=seed, temperature=1.0,
                                                   max_tokens=max_tokens, response_format=rf)
                content = r.choices[0].message.content
                doc = json.loads(content)
                jsonschema.validate(doc, schema, format_checker=checker)
                assert r.usage.completion_tokens <= max_tokens
                assert r.choices[0].finish_reason == "stop", "the document closed and ended the generation"
                assert not getattr(r.choices[0].message, "reasoning_content", None)
                if seed < 2:
                    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                        model="qwen35_tiny", messages=msgs, seed=seed, temperature=1.0, max_tokens=max_tokens, stream=True,
                        response_format=rf) if c.choices)
                    assert streamed == content


def test_json_schema_tight_budget_and_refusals(server, xml_server):
    """The shortest document fits exactly max_tokens; fewer is refused on max_tokens. Keywords that
    cannot be enforced get a 400 whose param points into the schema and whose message names the
    keyword: never unconstrained output."""
    import jsonschema
    client = server.client()
    msgs = [{"role": "user", "content": "Give me JSON."}]
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}  # shortest: {"a":""}, 8 bytes
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    for seed in range(6):
        r = client.chat.completions.create(model="qwen35_tiny", messages=msgs, seed=seed, temperature=1.0, max_tokens=8,
                                           response_format=rf)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        assert r.usage.completion_tokens <= 8 and r.choices[0].finish_reason == "stop"
    bad = [
        ({"response_format": rf, "max_tokens": 7}, "max_tokens", "too few"),
        ({"response_format": rf, "stop": ["}"]}, "stop", "stop"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}}}},
         "response_format.json_schema.schema/properties/age", "minimum"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"e": {"type": "string", "format": "email"}}}}}},
         "response_format.json_schema.schema/properties/e", "format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"v": {"oneOf": [{"type": "string"}]}}}}}},
         "response_format.json_schema.schema/properties/v", "oneOf"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}},
         "response_format.json_schema.schema", "root"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema",
         "schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "json_schema"),
    ]
    for kwargs, param, word in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="qwen35_tiny", messages=msgs, **{"max_tokens": 50, **kwargs})
        assert e.value.body["param"] == param, e.value.body
        assert word in e.value.body["message"], e.value.body
    with pytest.raises(openai.BadRequestError) as e:  # a template with tools: a document or tool calls, not both
        xml_server.client().chat.completions.create(model="qwen35_tiny", messages=msgs, max_tokens=50, response_format=rf,
                                                    tools=TOOLS)
    assert e.value.body["param"] == "response_format" and "tools" in e.value.body["message"], e.value.body


def test_json_object_output_parses_at_every_seed(server, xml_server):
    """response_format json_object: a random-weight model's output, masked token by token, is
    always one JSON object, closed within max_tokens, streamed or not; with a template that opens
    <think>, the block is closed first and the object is the content."""
    msgs = [{"role": "user", "content": "Give me JSON."}]
    for s in (server, xml_server):
        client = s.client()
        for seed in range(12):
            max_tokens = (2, 3, 7, 40)[seed % 4]
            r = client.chat.completions.create(model="qwen35_tiny", messages=msgs, seed=seed, temperature=1.0,
                                               max_tokens=max_tokens, response_format={"type": "json_object"})
            content = r.choices[0].message.content
            assert isinstance(json.loads(content), dict), (seed, content)
            assert r.usage.completion_tokens <= max_tokens
            assert r.choices[0].finish_reason == "stop", "the object closed and ended the generation"
            assert not getattr(r.choices[0].message, "reasoning_content", None)
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="qwen35_tiny", messages=msgs, seed=seed, temperature=1.0, max_tokens=max_tokens, stream=True,
                response_format={"type": "json_object"}) if c.choices)
            assert streamed == content
    client = server.client()
    for kwargs, param in (({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
                           "response_format.json_schema.schema"),
                          ({"response_format": {"type": "json_object"}, "max_tokens": 1}, "max_tokens"),
                          ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="qwen35_tiny", messages=msgs, **{"max_tokens": 5, **kwargs})
        assert e.value.body["param"] == param, e.value.body


def test_a_prompt_differing_in_its_last_tokens_reuses_up_to_the_last_chunk_boundary():
    """Two completions that differ only in their last tokens: the second restores the snapshot at
    the last --prefill-chunk boundary of the first, though --checkpoint-every (512) left none
    below the difference; a difference in the very last token restores all but it."""
    s = Server("qwen35_tiny", "--prefill-chunk", "64")
    try:
        base = [(7 * i + 3) % 300 for i in range(150)]
        first = s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": base, "max_tokens": 2})[1]
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        edited = base[:140] + [(base[140] + 1) % 300] + base[141:]
        second = s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": edited, "max_tokens": 2,
                                                        "temperature": 0})[1]
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 128, second["usage"]
        assert second["usage"]["hanpu_cache"]["result"] == "partial", second["usage"]
        # The same prompt again, and one differing in its last token: all but the last token.
        again = s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": edited, "max_tokens": 2,
                                                       "temperature": 0})[1]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 149
        assert again["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]
        last = edited[:-1] + [(edited[-1] + 1) % 300]
        assert s.request("POST", "/v1/completions", {"model": "qwen35_tiny", "prompt": last, "max_tokens": 2}
                         )[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 149
    finally:
        s.stop()
