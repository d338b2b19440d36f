"""Sampling penalties in `hanpu serve` (docs/SERVE.md, "Endpoints"): OpenAI's presence_penalty and
frequency_penalty over the generated tokens, and repetition_penalty (transformers' and llama.cpp's
rule) over the last repeat_last_n prompt and generated tokens. The C++ arithmetic
(hanpu::apply_penalties, src/model/sampler.cpp) is compared with a reference written here from the
formulas on random fixed logits; the server's range checks and an end-to-end effect are checked
with the `openai` client."""

import json
import os
import random
import subprocess
from pathlib import Path

import openai
import pytest

from test_serve import Server, hanpu_exe


def reference(logits, context, generated_from, presence, frequency, repetition, window):
    """OpenAI's formula (platform.openai.com, "Parameter details"): mu[j] -= c[j] * alpha_frequency +
    (c[j] > 0) * alpha_presence, c counting the generated tokens; before it, the repetition penalty of
    transformers' RepetitionPenaltyLogitsProcessor (score < 0 ? score * p : score / p) over the distinct
    tokens of the last `window` tokens of prompt + generated (-1: all), as llama.cpp's penalty_last_n."""
    out = list(logits)
    if repetition != 1:
        last = context if window < 0 else context[len(context) - min(window, len(context)):]
        for t in set(last):
            out[t] = out[t] * repetition if out[t] < 0 else out[t] / repetition
    counts = {}
    for t in context[generated_from:]:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        out[t] -= c * frequency + (1 if c > 0 else 0) * presence
    return out


def test_penalty_arithmetic_matches_the_reference(tmp_path):
    exe = Path(hanpu_exe()).parent / "tests" / "test_generator"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    rng = random.Random(5)
    cases = []
    for i in range(60):
        V = rng.choice([5, 17, 320])
        n = rng.randint(0, 40)
        context = [rng.randrange(V) for _ in range(n)]
        cases.append({
            "logits": [rng.uniform(-8, 8) if rng.random() > 0.05 else 0.0 for _ in range(V)],
            "context": context, "generated_from": rng.randint(0, n),
            "presence_penalty": rng.choice([0.0, rng.uniform(-2, 2)]),
            "frequency_penalty": rng.choice([0.0, rng.uniform(-2, 2)]),
            "repetition_penalty": rng.choice([1.0, rng.uniform(0.5, 2.0)]),
            "repetition_window": rng.choice([-1, 0, 1, 8, 64]),
        })
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, HANPU_PENALTY_CASES=str(tmp_path / "cases.json"), HANPU_PENALTY_OUT=str(tmp_path / "out.json"))
    r = subprocess.run([str(exe), "--gtest_filter=Penalties.DISABLED_CasesFromThePythonReference",
                        "--gtest_also_run_disabled_tests"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads((tmp_path / "out.json").read_text())
    assert len(got) == len(cases)
    for c, g in zip(cases, got):
        want = reference(c["logits"], c["context"], c["generated_from"], c["presence_penalty"], c["frequency_penalty"],
                         c["repetition_penalty"], c["repetition_window"])
        # float32 in C++ against float64 here
        assert g == pytest.approx(want, rel=1e-5, abs=1e-5), c


@pytest.fixture(scope="module")
def server():
    s = Server("qwen35_tiny")
    yield s
    s.stop()


def test_out_of_range_penalties_are_400s_naming_them(server):
    client = server.client()
    for field, value, words in [("presence_penalty", 2.5, ["2.5", "-2", "2"]), ("frequency_penalty", -3, ["-3", "-2.0 to 2.0"]),
                                ("repetition_penalty", 0, ["0", "more than 0"]), ("repetition_penalty", 11, ["11", "10"]),
                                ("repeat_last_n", -2, ["-2", "-1"])]:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="qwen35_tiny", prompt=[1, 2, 3], max_tokens=2, extra_body={field: value})
        body = e.value.body
        assert body["param"] == field, body
        for w in words:
            assert w in body["message"], (w, body)


def test_penalties_change_greedy_output_and_stop_repeats(server):
    """Greedy on the tiny golden repeats itself; a strong frequency penalty makes a token repeat
    far less (each repetition lowers its logit further), and a repetition penalty over the whole
    sequence changes the output too."""
    client = server.client()
    base = client.completions.create(model="qwen35_tiny", prompt=[5, 9, 12, 40], max_tokens=40, temperature=0)
    ids = base.choices[0].model_extra["token_ids"]
    pen = client.completions.create(model="qwen35_tiny", prompt=[5, 9, 12, 40], max_tokens=40, temperature=0,
                                    frequency_penalty=2.0, presence_penalty=2.0)
    pen_ids = pen.choices[0].model_extra["token_ids"]
    assert max(ids.count(t) for t in ids) > max(pen_ids.count(t) for t in pen_ids), (ids, pen_ids)
    rep = client.completions.create(model="qwen35_tiny", prompt=[5, 9, 12, 40], max_tokens=40, temperature=0,
                                    extra_body={"repetition_penalty": 3.0, "repeat_last_n": -1})
    assert rep.choices[0].model_extra["token_ids"] != ids
    # penalties 0 and 1 are the defaults: the same tokens
    same = client.completions.create(model="qwen35_tiny", prompt=[5, 9, 12, 40], max_tokens=40, temperature=0,
                                     frequency_penalty=0, presence_penalty=0, extra_body={"repetition_penalty": 1})
    assert same.choices[0].model_extra["token_ids"] == ids
