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
