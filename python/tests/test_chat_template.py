"""hanpu's Jinja subset (src/model/jinja.cpp, `hanpu template render`) against jinja2 itself,
configured as transformers configures it for chat templates (src/transformers/utils/
chat_template_utils.py, _compile_jinja_template): ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loopcontrols extension, a tojson filter that is
json.dumps(x, ensure_ascii=False, indent, separators, sort_keys), and the globals raise_exception
and strftime_now. Every template in chat_templates/ is rendered on every context of
chat_templates/contexts.json by both; the outputs must match byte for byte, and a context jinja2
refuses must be refused by hanpu too."""
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

jinja2 = pytest.importorskip("jinja2")
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "chat_templates"
TEMPLATES = sorted(HERE.glob("*.jinja"))
CONTEXTS = json.loads((HERE / "contexts.json").read_text(encoding="utf-8"))


def hanpu_exe():
    exe = Path(os.environ.get("HANPU_EXE", REPO / "build" / "release" / "hanpu"))
    assert exe.exists(), f"{exe} missing: build with `cmake --build --preset release`"
    return exe


def reference_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def reference_render(source, context):
    try:
        return {"text": reference_env().from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as e:  # includes UndefinedError and raise_exception
        return {"error": f"{type(e).__name__}: {e}"}
    except (TypeError, ValueError, AttributeError, IndexError, KeyError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def hanpu_render(template, contexts, tmp_path):
    ctx_file = tmp_path / "contexts.json"
    ctx_file.write_text(json.dumps(contexts, ensure_ascii=False), encoding="utf-8")
    out = subprocess.run([str(hanpu_exe()), "template", "render", "--template", str(template), "--contexts", str(ctx_file)],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return json.loads(out.stdout)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_matches_jinja2(template, tmp_path):
    source = template.read_text(encoding="utf-8")
    ours = hanpu_render(template, CONTEXTS, tmp_path)
    assert len(ours) == len(CONTEXTS)
    rendered = 0
    for i, (context, got) in enumerate(zip(CONTEXTS, ours)):
        want = reference_render(source, context)
        if "error" in want:
            assert "error" in got, f"context {i}: jinja2 refused ({want['error']}), hanpu rendered {got['text'][:200]!r}"
            continue
        assert "text" in got, f"context {i}: jinja2 rendered, hanpu refused: {got['error']}"
        assert got["text"] == want["text"], f"context {i}: outputs differ"
        rendered += 1
    if template.stem != "errors":
        assert rendered > 0


def test_errors_template_both_ways(tmp_path):
    """errors.jinja renders on short conversations and fails (raise_exception, attribute of an
    undefined value) on others: both outcomes occur, and hanpu's messages name the line."""
    template = HERE / "errors.jinja"
    ours = hanpu_render(template, CONTEXTS, tmp_path)
    kinds = {"error" in r for r in ours}
    assert kinds == {True, False}
    for r in ours:
        if "error" in r:
            assert ", line " in r["error"], r["error"]
    assert any("raise_exception: Too many messages" in r.get("error", "") for r in ours)


SNIPPETS = [
    # (template, context): small cases beyond the files, each compared with jinja2
    ("{{ strftime_now('%Y-%m-%d') }}", {}),
    ("{% for i in range(3) %}{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}", {}),
    ("{{ x | tojson(indent=4) }}", {"x": {"a": [1, [2, {}], {"b": None}], "c": "d"}}),
    ("{{ x }} {{ x | string }} {{ x | tojson }}", {"x": [1.0, 0.5, 1e-05, 1e16, 12345.678, -0.0, 2 ** 53]}),
    ("{{ 'x' if a is defined and a else 'y' }}|{{ a.b is defined }}", {"a": {"c": 1}}),
    ("a\n{%- if true %}\nb\n{% endif -%}\n  c\n", {}),
    ("  {%- if true %} x {% endif %}\n{{ 'y' }}\n", {}),
    ("{% set l = [1, 2] %}{% set l2 = l + [3] %}{{ l }}{{ l2 }}", {}),
    ("{{ messages[0]['content'][0]['text'] | trim }}", {"messages": [{"content": [{"text": " t "}]}]}),
    ("{%- for m in messages %}{{ m.content.split('\\n')[-1] }}{% endfor %}", {"messages": [{"content": "a\nb"}]}),
    ("{{ '%s' }}", {}),
    ("{{ 'a' | replace('', '-') }}", {}),
    ("{{ ' x '.split(' ') }} {{ 'a  b'.split(None, 1) }} {{ ' a b '.rsplit(None, 1) }}", {}),
    # scoping, operators, Python printing, filters on edge values, refusals (both sides must refuse)
 ("{% macro m() %}{{ x }}{% endmacro %}{% set x = 5 %}{{ m() }}", {}),
 ("{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", {}),
 ("{% for i in [1,2] %}{% if loop.first %}{% set y = 'a' %}{% endif %}[{{ y }}]{% endfor %}", {}),
 ("{% for a in [1] %}{% for b in [2,3] %}{{ loop.index }}{{ a }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
 ("{{ 'abc' ~ [1] ~ {'a': 1} }}", {}),
 ("{{ x.y.z }}", {"x": {"y": None}}),
 ("{{ x | default }}", {}),
 ("{{ [1,2][1:] + [3] }}", {}),
 ("{{ d['a'] }} {{ d.a }} {{ d.get('b', 0) }}", {"d": {"a": {"k": [1, "s"]}}}),
 ("{{ 1 if 0 else 2 if 0 else 3 }}", {}),
 ("{{ not 1 == 2 }} {{ -2 ** 2 }} {{ (-2) ** 2 }} {{ 2 ** -1 }}", {}),
 ("{{ 'a' 'b' }}", {}),
 ("{{ 10 % 3 }} {{ 10.5 % 3 }} {{ -10.5 // 3 }} {{ 7 // 2.0 }}", {}),
 ("{{ 1 < 2 < 3 }}", {}),
 ("{{ x is sequence }} {{ x is iterable }}", {"x": {"a": 1}}),
 ("{{ 'x' is sequence }} {{ none is iterable }} {{ 1 is iterable }}", {}),
 ("{% set x = [3,1] %}{{ x|sort|first }} {{ x|length }} {{ x|max }}", {}),
 ("{{ messages|tojson }}", {"messages": [{"role": "user", "content": "a\u2028b\x7f\x01"}]}),
 ("{{ 'Ünï'|upper }} {{ 'ÀB'|lower }}", {}),
 ("{{ 1.0 }} {{ 100.0 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1/3 }} {{ 2.5e15 }} {{ 1e16 }}", {}),
 ("{{ [1,2,3]|join(', ') }} {{ ['a', none]|join }}", {}),
 ("{{ x|items|list }}", {"x": {}}),
 ("{{ x|selectattr('a')|list }}", {"x": [{"a": 1}, {"b": 2}, {"a": 0}]}),
 ("{{ x|map(attribute='a', default='-')|list }}", {"x": [{"a": 1}, {"b": 2}]}),
 ("{{ x|map(attribute='a')|list }}", {"x": [{"a": 1}, {"b": 2}]}),
 ("{{ range(3)|map('string')|join('-') }}", {}),
 ("{{ x|first }}", {"x": {"k": 1, "j": 2}}),
 ("{{ 'abc'|first }} {{ 'abc'|last }} {{ ''|first }}", {}),
 ("{{ 'a b'.split(' ')|length }} {{ 'a\\tb\\nc'.split() }}", {}),
 ("{{ x.content.startswith('<') }}", {"x": {"content": "<t>"}}),
 ("{{ 'hello world'.title() }} {{ 'HELLO'.capitalize() }}", {}),
 ("{%- for m in messages -%}\n  {{ m }}\n{%- endfor %}", {"messages": ["a", "b"]}),
 ("  {% if 1 %}\n  x\n  {% endif %}\n  y", {}),
 ("{% if 1 %}  \n x{% endif %}", {}),
 ("a {# c #} b\n{# c2 #}\nc", {}),
 ("{{ 'a' }}\n{% if 1 %}b{% endif %}\n{{ 'c' }}\n", {}),
 ("{%- set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }}{{ ns.b }}", {}),
 ("{{ namespace(a=1).a }}", {}),
 ("{% set d = dict(a=1, b='x') %}{{ d }}", {}),
 ("{{ true + 1 }} {{ 'a' == 'a' and 'b' }}", {}),
 ("{{ x['a'] is defined }} {{ x.a is none }}", {"x": {"a": None}}),
 ("{{ tools[0].function.parameters.properties | tojson(indent=2) }}", {"tools": [{"function": {"parameters": {"properties": {"a": {"type": "string", "enum": ["x", "y"]}}}}}]}),
 ("{{ 3 | round }} {{ 2.5 | round }} {{ 2.567 | round(2) }} {{ 2.5|int }} {{ -2.5|abs }}", {}),
 ("{% for x in 'ab' %}{{ x }}{% endfor %}{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}", {}),
 ("{% for i in range(3) %}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}", {}),
 ("{{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ (1, 2) == [1, 2] }}", {}),
 ("{{ 'abc'[-1] }} {{ 'abc'[5] }} {{ [1][-2] }}", {}),
 ("{% set a = 'x' %}{% set b %}{{ a }}y{% endset %}{{ b|length }}", {}),
 ("{{ x|unique|list }}", {"x": ["A", "a", "b", "B", 1, 1]}),
 ("{{ x|sort(attribute='n')|map(attribute='n')|list }}", {"x": [{"n": 2}, {"n": 1}]}),
 ("{{ 'a,b'.split(',', 0) }} {{ ''.split(',') }} {{ ''.split() }}", {}),
 ("{{ '  x  '.strip(' x') }}|{{ 'xyx'.strip('') }}", {}),
 ("{{ 'aaa'.replace('a', 'b', 2) }} {{ 'aaa'.count('aa') }}", {}),
 ("{{ undefined_thing.attr }}", {}),
 ("{{ none + 1 }}", {}),
 ("{{ [1] + 'a' }}", {}),
 ("{% for m in none %}{% endfor %}", {}),
 ("{{ 'x'|int(7) }} {{ '0x1A'|int(base=16) }} {{ '12'|int(base=8) }} {{ ' 5 '|int }}", {}),
 ("{{ 1e400 }}", {}),
 ("{{ x }}", {"x": 1.5e300}),
]


@pytest.mark.parametrize("i", range(len(SNIPPETS)))
def test_snippets_match_jinja2(i, tmp_path):
    source, context = SNIPPETS[i]
    template = tmp_path / "t.jinja"
    template.write_text(source, encoding="utf-8")
    got = hanpu_render(template, [context], tmp_path)[0]
    want = reference_render(source, context)
    assert ("error" in got) == ("error" in want), (got, want)
    if "text" in want:
        assert got["text"] == want["text"]


@pytest.mark.parametrize("source,construct", [
    ("{% if x %}", "'if' opened here is never closed"),
    ("{{ x | nosuchfilter }}", "unknown filter 'nosuchfilter'"),
    ("{% extends 'base' %}", "unsupported statement '{% extends %}'"),
    ("line1\n{{ x is nosuchtest }}", "line 2: unknown test 'nosuchtest'"),
    ("{% for %}", "expected a loop variable name"),
    ("{{ [1, 2 }}", "unexpected '}', expected ']'"),
    ("{{ (1 + 2 }}", "unexpected '}', expected ')'"),
    ("ok\n{{ x", "line 2: tag opened here is never closed"),
])
def test_errors_name_construct_and_line(source, construct, tmp_path):
    template = tmp_path / "bad.jinja"
    template.write_text(source, encoding="utf-8")
    out = subprocess.run([str(hanpu_exe()), "template", "render", "--template", str(template)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert construct in out.stderr, out.stderr


def test_template_sources_in_transformers_order(tmp_path):
    """chat_template.jinja wins over tokenizer_config.json; a named list gives "default" (and
    "tool_use" to requests with tools, see docs/SERVE.md); a special token is a variable."""
    def render(d):
        out = subprocess.run([str(hanpu_exe()), "template", "render", "--model", str(d)], capture_output=True, text=True, timeout=60)
        return out.stdout if out.returncode == 0 else "ERROR " + out.stderr

    cfg = {"eos_token": "<|end|>", "chat_template": [{"name": "tool_use", "template": "tools"},
                                                     {"name": "default", "template": "default {{ eos_token is defined }}"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert render(tmp_path) == "default True"  # the checkpoint's special tokens are variables, as in transformers
    (tmp_path / "chat_template.jinja").write_text("from the jinja file\n")
    assert render(tmp_path) == "from the jinja file"  # one trailing newline dropped, as jinja2 does
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "other", "template": "x"}]}))
    assert "without one named \"default\"" in render(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    assert "no chat template" in render(tmp_path)
