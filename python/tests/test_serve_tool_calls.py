"""Constrained tool calls in `hanpu serve` (docs/SERVE.md, "Tool calls"): with tool_choice "required"
or a named function, the whole call is masked token by token (src/model/json_constraint_tools.cpp),
so even a random-weight model's reply parses as calls to the tools whose arguments follow their
`parameters` schemas (checked with PyPI jsonschema and its format checker), at every seed tried,
streamed and not, through the real `openai` and `anthropic` clients. Every family with a
tool-call format and a tokenizer in tests/golden: Qwen3.5 and Qwen3.5-MoE (XML parameters),
Qwen3-Next and a Ling-style template (JSON in <tool_call> tags), and Kimi's sections (on the
qwen35_tiny tokenizer: the Kimi Linear golden has none, so its markers are text here)."""

import json
from pathlib import Path

import openai
import pytest

from test_serve import GOLDEN, Server

jsonschema = pytest.importorskip("jsonschema")
try:
    import anthropic
except ImportError:
    anthropic = None

TEMPLATES = Path(__file__).parent / "chat_templates"

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "book_table", "description": "Book a table", "parameters": {
        "type": "object", "properties": {
            "when": {"type": "string", "format": "date-time"}, "guests": {"type": "integer"},
            "vip": {"type": "boolean"}, "budget": {"type": "number"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "address": {"$ref": "#/$defs/address"}},
        "required": ["when", "guests", "vip"],
        "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                              "required": ["street"]}}}}},
    {"type": "function", "function": {"name": "list_files", "description": "No arguments",
                                      "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# (golden, template): the format each template shows (src/serve/server.cpp picks it from its markers).
FAMILIES = {
    "qwen35_xml": ("qwen35_tiny", "qwen35_xml_tools.jinja"),
    "qwen35moe_xml": ("qwen35moe_tiny", "qwen35_xml_tools.jinja"),
    "qwen3next_json": ("qwen3next_tiny", "qwen_json_tools.jinja"),
    "ling_json": ("qwen3next_tiny", "ling_like.jinja"),
    "kimi_sections": ("qwen35_tiny", "kimi_like.jinja"),
}


def checkpoint(tmp, golden, template):
    d = tmp / golden
    d.mkdir(parents=True)
    for f in (GOLDEN / golden).iterdir():
        if f.name != "tokenizer_config.json":
            (d / f.name).symlink_to(f)
    cfg = json.loads((GOLDEN / golden / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (TEMPLATES / template).read_text()
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    started = {}
    try:
        for key, (golden, template) in FAMILIES.items():
            started[key] = (golden, Server(str(checkpoint(tmp_path_factory.mktemp(key), golden, template))))
        yield started
    finally:
        for _, s in started.values():
            s.stop()


def check_calls(calls, named, parallel):
    assert calls, "a required call"
    if not parallel:
        assert len(calls) == 1
    checker = jsonschema.FormatChecker()
    for c in calls:
        name, args = (c["name"], c["arguments"]) if isinstance(c, dict) else (c.function.name, c.function.arguments)
        assert name in SCHEMAS and (named is None or name == named), name
        jsonschema.validate(json.loads(args) if isinstance(args, str) else args, SCHEMAS[name], format_checker=checker)


def check_streamed_calls(client, kwargs, choice, named, parallel):
    """Streams the request and checks the tool_calls deltas: the first delta of each call carries
    its id, type and name; its arguments come in several pieces as the model writes them (not one
    block at the end), and the client's own stream accumulation gives exactly the non-streamed
    arguments (string equality)."""
    pieces, firsts, finish = {}, {}, None
    with client.chat.completions.stream(**kwargs) as stream:
        for event in stream:
            if event.type != "chunk":
                continue
            ch = event.chunk.choices[0]
            for d in ch.delta.tool_calls or []:
                if d.index not in firsts:
                    firsts[d.index] = d
                    assert d.id and d.type == "function" and d.function.name, d
                else:
                    assert d.id is None and d.function.name is None, d
                pieces.setdefault(d.index, []).append(d.function.arguments or "")
            finish = ch.finish_reason or finish
        final = stream.get_final_completion()
    assert finish == "tool_calls"
    streamed = final.choices[0].message.tool_calls
    check_calls(streamed, named, parallel)
    assert [(c.function.name, c.function.arguments) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    for i, c in enumerate(streamed):
        assert "".join(pieces[i]) == c.function.arguments
        if c.function.arguments != "{}":
            assert sum(1 for p in pieces[i] if p) >= 2, ("arguments in one block", pieces[i])


CHOICES = [("required", None), ({"type": "function", "function": {"name": "book_table"}}, "book_table"),
           ({"type": "function", "function": {"name": "get_weather"}}, "get_weather")]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_required_and_named_calls_parse_and_validate_at_every_seed(servers, family):
    golden, server = servers[family]
    client = server.client()
    msgs = [{"role": "user", "content": "Book a table for two and tell me the weather."}]
    for tool_choice, named in CHOICES:
        for seed in range(4):
            parallel = seed % 2 == 0
            kwargs = dict(model=golden, messages=msgs, tools=TOOLS, tool_choice=tool_choice, seed=seed, temperature=1.0,
                          max_tokens=300, parallel_tool_calls=parallel)
            r = client.chat.completions.create(**kwargs)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls", (family, tool_choice, seed, choice)
            assert not choice.message.content, (family, tool_choice, seed, choice.message.content)
            check_calls(choice.message.tool_calls, named, parallel)
            assert r.usage.completion_tokens <= 300
            if seed < 2:  # streamed: the same calls, argument by argument
                check_streamed_calls(client, kwargs, choice, named, parallel)


def test_a_tool_schema_the_grammar_refuses_is_a_400_naming_it(servers):
    golden, xml = servers["qwen35_xml"]
    msgs = [{"role": "user", "content": "hi"}]
    bad_minimum = [TOOLS[0], {"type": "function", "function": {"name": "age", "parameters": {
        "type": "object", "properties": {"years": {"type": "integer", "minimum": 0}}}}}]
    free_form = [{"type": "function", "function": {"name": "anything", "parameters": {"type": "object"}}}]
    bad_name = [{"type": "function", "function": {"name": "has space", "parameters": {"type": "object", "properties": {}}}}]
    cases = [
        (bad_minimum, "required", "tools[1].function.parameters/properties/years", ["minimum", "'age'"]),
        (bad_minimum, {"type": "function", "function": {"name": "age"}}, "tools[1].function.parameters/properties/years",
         ["minimum"]),
        (free_form, "required", "tools[0].function.parameters", ["properties", "XML"]),
        (bad_name, "required", "tools[0].function.name", ["name"]),
        (TOOLS, "required", "max_tokens", ["too few"]),
    ]
    for tools, tool_choice, param, words in cases:
        with pytest.raises(openai.BadRequestError) as e:
            xml.client().chat.completions.create(model=golden, messages=msgs, tools=tools, tool_choice=tool_choice,
                                                 max_tokens=20 if param == "max_tokens" else 100)
        assert e.value.body["param"] == param, e.value.body
        for w in words:
            assert w in e.value.body["message"], (w, e.value.body)
    with pytest.raises(openai.BadRequestError) as e:
        xml.client().chat.completions.create(model=golden, messages=msgs, tools=TOOLS, tool_choice="required",
                                             max_tokens=100, stop=["x"])
    assert e.value.body["param"] == "stop"
    # Not constrained (auto), the same tools are only rendered: no 400.
    xml.client().chat.completions.create(model=golden, messages=msgs, tools=bad_minimum, max_tokens=2)
    # The JSON format writes a free-form object as JSON: accepted there.
    golden_json, js = servers["qwen3next_json"]
    r = js.client().chat.completions.create(model=golden_json, messages=msgs, tools=free_form, tool_choice="required",
                                            max_tokens=100, seed=1)
    assert r.choices[0].message.tool_calls[0].function.name == "anything"
    assert isinstance(json.loads(r.choices[0].message.tool_calls[0].function.arguments), dict)


def claude(server):
    if anthropic is None:
        pytest.skip("the anthropic client is not installed: pip install -r python/requirements-test.txt")
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none", max_retries=0, timeout=60)


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


def check_anthropic_stream(c, kwargs, named, parallel):
    """Streams a Messages request: each call is a tool_use content_block_start, then its input in
    several input_json_delta pieces that the client's accumulation parses into the block's input."""
    partial = {}
    with c.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                assert event.content_block.name and event.content_block.id.startswith("toolu_")
                partial[event.index] = []
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial[event.index].append(event.delta.partial_json)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = {i: b for i, b in enumerate(final.content) if b.type == "tool_use"}
    assert sorted(uses) == sorted(partial)
    for i, b in uses.items():
        assert json.loads("".join(partial[i])) == b.input
        if b.input:
            assert len(partial[i]) >= 2, ("input in one piece", partial[i])
    check_calls([{"name": b.name, "arguments": b.input} for b in uses.values()], named, parallel)
    return final


def test_anthropic_tool_choice_any_and_tool_are_constrained_too(servers):
    golden, server = servers["qwen35_xml"]
    c = claude(server)
    msgs = [{"role": "user", "content": "Book a table."}]
    for tool_choice, named in (({"type": "any"}, None), ({"type": "tool", "name": "book_table"}, "book_table"),
                               ({"type": "any", "disable_parallel_tool_use": True}, None)):
        parallel = not tool_choice.get("disable_parallel_tool_use", False)
        for _ in range(3):
            kwargs = dict(model=golden, max_tokens=300, messages=msgs, tools=ANTHROPIC_TOOLS, tool_choice=tool_choice,
                          extra_body={"temperature": 1.0})  # (Anthropic's API has no seed: each run differs)
            r = c.messages.create(**kwargs)
            assert r.stop_reason == "tool_use", r
            uses = [b for b in r.content if b.type == "tool_use"]
            assert [b.type for b in r.content if b.type == "text" and b.text.strip()] == []
            check_calls([{"name": b.name, "arguments": b.input} for b in uses], named, parallel)
            check_anthropic_stream(c, kwargs, named, parallel)
    # A schema the grammar refuses: Anthropic's error shape, naming the Anthropic field.
    bad = [{"name": "age", "input_schema": {"type": "object", "properties": {"years": {"type": "integer", "maximum": 9}}}}]
    status, body = server.request("POST", "/v1/messages", {"model": golden, "max_tokens": 100, "messages": msgs,
                                                           "tools": bad, "tool_choice": {"type": "any"}})
    assert status == 400 and body["type"] == "error", body
    assert "tools[0].input_schema/properties/years" in body["error"]["message"] and "maximum" in body["error"]["message"]


def test_anthropic_output_config_format_is_json_schema_output(servers):
    golden, server = servers["qwen35_xml"]
    c = claude(server)
    schema = SCHEMAS["book_table"]
    msgs = [{"role": "user", "content": "JSON please."}]
    for _ in range(3):
        r = c.messages.create(model=golden, max_tokens=250, messages=msgs, extra_body={"temperature": 1.0, "output_config": {
            "format": {"type": "json_schema", "schema": schema}}})
        assert [b.type for b in r.content] == ["text"] and r.stop_reason == "end_turn", r
        jsonschema.validate(json.loads(r.content[0].text), schema, format_checker=jsonschema.FormatChecker())
    status, body = server.request("POST", "/v1/messages", {
        "model": golden, "max_tokens": 100, "messages": msgs,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {
            "n": {"type": "integer", "multipleOf": 2}}}}}})
    assert status == 400 and "output_config.format.schema/properties/n" in body["error"]["message"], body
    assert "multipleOf" in body["error"]["message"]


# ---- tool_choice "auto": a lazy grammar from the opening marker on (issue 35) ----

TRIGGERS = {"qwen35_xml": "<tool_call>", "qwen35moe_xml": "<tool_call>", "qwen3next_json": "<tool_call>",
            "ling_json": "<tool_call>", "kimi_sections": "<|tool_calls_section_begin|>"}
TRIGGER_ID = 316  # a merge token of the tiny tokenizers ("Qw"), made the marker below


def trigger_checkpoint(tmp, golden, template, trigger):
    """The golden with its template, and its last merge token ("Qw", id 316) replaced by the
    format's opening marker as an added (not special) token, as real Qwen and Kimi tokenizers have
    it: a random model can then be pushed towards writing a call with logit_bias."""
    d = checkpoint(tmp, golden, template)
    tok = json.loads((GOLDEN / golden / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    (old,) = [k for k, v in vocab.items() if v == TRIGGER_ID]
    del vocab[old]
    tok["model"]["merges"] = [m for m in tok["model"]["merges"] if "".join(m if isinstance(m, list) else m.split(" ")) != old]
    tok["added_tokens"].append({"id": TRIGGER_ID, "content": trigger, "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": False})
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return d


@pytest.fixture(scope="module")
def trigger_servers(tmp_path_factory):
    started = {}
    try:
        for key, (golden, template) in FAMILIES.items():
            d = trigger_checkpoint(tmp_path_factory.mktemp("trigger_" + key), golden, template, TRIGGERS[key])
            started[key] = (golden, Server(str(d)))
        yield started
    finally:
        for _, s in started.values():
            s.stop()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_calls_are_constrained_from_the_marker_on(trigger_servers, family):
    """tool_choice auto at temperature 1: free text until the model writes the marker (pushed there
    by logit_bias at several strengths), then every call it writes parses, names a tool and
    validates against its schema; streamed, the same calls come argument by argument."""
    golden, server = trigger_servers[family]
    client = server.client()
    msgs = [{"role": "user", "content": "Book a table for two and tell me the weather."}]
    calls_seen, free_text_seen = 0, 0
    for seed in range(6):
        parallel = seed % 2 == 0
        kwargs = dict(model=golden, messages=msgs, tools=TOOLS, seed=seed, temperature=1.0, max_tokens=300,
                      parallel_tool_calls=parallel, tool_choice="auto",
                      extra_body={"logit_bias": {str(TRIGGER_ID): [2.0, 4.0, 8.0][seed % 3]},
                                  "chat_template_kwargs": {"enable_thinking": False, "thinking": False}})
        r = client.chat.completions.create(**kwargs)
        choice = r.choices[0]
        calls = choice.message.tool_calls or []
        if calls:
            calls_seen += len(calls)
            check_calls(calls, None, parallel)
            assert choice.finish_reason == "tool_calls", choice
        if choice.message.content or not calls:
            free_text_seen += 1
            assert TRIGGERS[family] not in choice.message.content, "a call left unparsed in the content"
        if seed < 3 and calls:
            check_streamed_calls(client, kwargs, choice, None, parallel)
    assert calls_seen > 0, "the bias never led to a call: the test checked nothing"
    assert free_text_seen > 0, "every reply was nothing but calls: the replies are not free before the marker"


# ---- Anthropic: count_tokens, thinking budget ----

def test_anthropic_count_tokens_is_the_messages_prompt(servers):
    golden, server = servers["qwen35_xml"]
    c = claude(server)
    msgs = [{"role": "user", "content": "Book a table."}]
    for extra in ({}, {"tools": ANTHROPIC_TOOLS}, {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}},
                  {"system": "Be brief.", "thinking": {"type": "disabled"}}):
        n = c.messages.count_tokens(model=golden, messages=msgs, **extra).input_tokens
        r = c.messages.create(model=golden, max_tokens=40, messages=msgs, **extra)
        assert n == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0), (extra, n, r.usage)
    on = c.messages.count_tokens(model=golden, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024}).input_tokens
    off = c.messages.count_tokens(model=golden, messages=msgs, thinking={"type": "disabled"}).input_tokens
    assert on != off  # the template renders thinking on and off differently
    status, body = server.request("POST", "/v1/messages/count_tokens", {"model": golden, "messages": msgs, "stream": True})
    assert status == 400 and "'stream'" in body["error"]["message"], body
    status, body = server.request("POST", "/v1/messages/count_tokens", {"model": "other", "messages": msgs})
    assert status == 404 and body["type"] == "error", body


def test_thinking_budget_caps_the_reasoning(servers):
    golden, server = servers["qwen35_xml"]
    client = server.client()
    msgs = [{"role": "user", "content": "Think, then answer."}]
    # OpenAI side (the extension Anthropic's budget maps onto): exactly `budget` reasoning tokens,
    # then the forced end of the block, then the answer.
    for budget in (1, 5, 12):
        r = client.chat.completions.create(model=golden, messages=msgs, max_tokens=40, temperature=1.0, seed=budget,
                                           logprobs=True, extra_body={"thinking_budget_tokens": budget, "ignore_eos": True})
        m = r.choices[0].message
        pieces = [bytes(t.bytes) for t in r.choices[0].logprobs.content]  # bytes: a token may hold half a character
        thought = b"".join(pieces[:budget])
        assert b"".join(pieces).startswith(thought + b"\n</think>\n\n"), (budget, pieces[:budget + 6])
        try:
            assert m.model_extra["reasoning_content"] == thought.decode("utf-8").strip("\n")
        except UnicodeDecodeError:
            pass  # (the server's JSON replaces a cut character)
        assert m.content, "an answer follows the forced end of thinking"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=golden, messages=msgs, max_tokens=4, extra_body={"thinking_budget_tokens": -1})
    assert e.value.body["param"] == "thinking_budget_tokens"
    # Anthropic: budget_tokens (at least 1024, below max_tokens), validated by name.
    c = claude(server)
    r = c.messages.create(model=golden, max_tokens=1100, messages=msgs, thinking={"type": "enabled", "budget_tokens": 1024},
                          extra_body={"ignore_eos": True, "temperature": 1.0})
    assert [b.type for b in r.content] == ["thinking", "text"], [b.type for b in r.content]
    assert r.stop_reason == "max_tokens"
    for thinking, words in (({"type": "enabled", "budget_tokens": 100}, ["thinking.budget_tokens", "1024"]),
                            ({"type": "enabled", "budget_tokens": 2000}, ["thinking.budget_tokens", "max_tokens"]),
                            ({"type": "enabled"}, ["budget_tokens"])):
        status, body = server.request("POST", "/v1/messages", {"model": golden, "max_tokens": 1100, "messages": msgs,
                                                               "thinking": thinking})
        assert status == 400, body
        for w in words:
            assert w in body["error"]["message"], (w, body)
