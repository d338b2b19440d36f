"""hanpu.plan / simulate / devices / device return plain dicts with the CLI's JSON fields and sane
values; errors become ValueError."""

import json

import pytest

import hanpu


def test_devices_lists_bundled_files_and_host():
    devs = hanpu.devices()
    assert {"ascend310p", "ascend310b", "host"} <= set(devs)
    for name, d in devs.items():
        assert set(d) == {"name", "kind", "description", "cores", "file"}
        assert d["cores"] >= 1
    assert devs["ascend310p"]["kind"] == "npu" and devs["host"]["kind"] == "cpu"
    full = hanpu.device("ascend310p")
    assert full["name"] == "ascend310p"
    assert {"cores", "clock_ghz", "matrix", "vector", "buffers", "paths"} <= set(full)
    assert full["cores"]["value"] == devs["ascend310p"]["cores"] and full["cores"]["source"]
    host = hanpu.device("host")
    assert host["kind"] == "cpu" and host["cores"]["value"] >= 1
    assert hanpu.device(full)["name"] == "ascend310p"  # a dict in the device schema is accepted too


def test_plan_is_a_json_dict():
    p = hanpu.plan(device="ascend310p", variant="gdn", T=1000, heads=4, value_heads=8, K=128, V=128)
    json.dumps(p)  # plain data
    assert p["strategy"] == "hanpu" and p["device"] == "ascend310p"
    assert p["problem"]["HV"] == 8 and p["problem"]["seqlens"] == [1000]
    assert p["kernels"] and all(k["cores"] for k in p["kernels"])
    assert "hanpu" in hanpu.describe_plan(p) or len(hanpu.describe_plan(p)) > 100
    v = hanpu.plan(variant="kda", seqlens=[100, 300, 7], heads=2)
    assert v["problem"]["varlen"] is True and v["problem"]["variant"] == "kda"


def test_simulate_hanpu_beats_fla_on_310p_at_4096():
    results = {s: hanpu.simulate(device="ascend310p", variant="gdn", T=4096, heads=16, strategy=s)
               for s in ("fla", "hanpu")}
    for s, r in results.items():
        assert r["strategy"] == s and r["device"] == "ascend310p" and r["T"] == 4096
        for key in ("latency_ms", "energy_mj", "gm_read_bytes", "gm_write_bytes", "macs", "matrix_utilization",
                    "peak_bytes", "peak_gm_bytes"):
            assert key in r, key
        assert r["latency_ms"] > 0 and r["energy_mj"] > 0 and 0 < r["matrix_utilization"] <= 1
        assert r["macs"] > 0 and r["gm_read_bytes"] > 0
    assert results["hanpu"]["latency_ms"] < results["fla"]["latency_ms"]
    # the same problem: the same useful work
    assert results["hanpu"]["macs"] == pytest.approx(results["fla"]["macs"], rel=0.25)


def test_simulate_a_given_plan_and_detail():
    p = hanpu.plan(device="ascend310b", T=512, heads=4, strategy="flashqla")
    r = hanpu.simulate(device="ascend310b", plan=p, detail=True)
    assert r["strategy"] == "flashqla" and r["device"] == "ascend310b"
    assert r["per_operator"] and r["kernels"]
    assert set(hanpu.strategies()) >= {"vllm-ascend", "fla", "fla-megakernel", "flashqla", "hanpu"}
    assert hanpu.ablation_steps()[0] == "fla"


def test_planning_errors():
    with pytest.raises(ValueError, match="device: got 'nosuch'"):
        hanpu.plan(device="nosuch")
    with pytest.raises(ValueError, match="variant"):
        hanpu.plan(variant="mamba")
    with pytest.raises(ValueError, match="HV"):
        hanpu.plan(heads=4, value_heads=6)
    with pytest.raises(ValueError, match="T: expected a positive int"):
        hanpu.simulate(T=0)
    with pytest.raises(ValueError):
        hanpu.plan(strategy="magic")
    with pytest.raises(TypeError):
        hanpu.simulate(plan="not a dict")
    with pytest.raises(ValueError, match="plan"):
        hanpu.simulate(device="ascend310p", plan={"kernels": 3})
