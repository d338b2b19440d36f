"""The plugin's GDN core (hanpu.integrations.vllm.gdn.gdn_attention_core) on a stand-in layer, no
engine: a mixed batch (two decode tokens, then a 70-token prefill from zeros and a 5-token prefill
continuing its slot) on vLLM's pools, against an fp64 pipeline (the convolution in numpy, then
hanpu.reference.gated_delta_rule on its rows). With bf16 activations on an AMX CPU the plugin's
convolution writes bf16 rows and the prefill's GEMMs run on AMX (docs/ACCURACY.md, "The engine's
GEMMs on AMX"): the reference then takes its fp64 rows rounded to bf16, as the plugin's rows are
(its fp32 result, within 2e-6 relative, rounded: a different rounding only within 2e-6 of a
midpoint). Bounds (normalized MSE): o 1e-5 (bf16) or 1e-10 (f32); states 1e-10, 1e-4 with Round."""

import types

import numpy as np
import pytest
import torch

import hanpu
from hanpu import _hanpu
from hanpu.integrations.vllm import gdn as plugin

H, K, W, SLOTS = 2, 64, 4, 8
D = 3 * H * K
DECODE_SLOTS, PREFILL_SLOTS, PREFILL_LENS, PREFILL_INIT = [3, 6], [1, 4], [70, 5], [False, True]


def nmse(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(((x - ref) ** 2).sum() / (ref ** 2).sum())


def stand_in(dtype, amx):
    torch.manual_seed(0)
    layer = types.SimpleNamespace(
        activation="silu", key_dim=H * K, value_dim=H * K, tp_size=1, head_k_dim=K, head_v_dim=K, num_k_heads=H,
        num_v_heads=H, conv1d=types.SimpleNamespace(weight=(0.3 * torch.randn(D, 1, W)).to(dtype), bias=None),
        A_log=torch.log(torch.rand(H) * 8 + 1), dt_bias=(0.1 * torch.randn(H)).to(dtype),
        hanpu_threads=2, hanpu_decode_threads=2, hanpu_amx=amx)
    layer.kv_cache = ((0.5 * torch.randn(SLOTS, W - 1, D)).to(dtype), (0.05 * torch.randn(SLOTS, H, K, K)).float())
    return layer


def reference(layer, x, b, a, lens, slots, cont, bf16_rows):
    """fp64: the outputs, each used slot's new conv state and recurrent state."""
    taps = layer.conv1d.weight.double().reshape(D, W).t().numpy()
    conv_pool = layer.kv_cache[0].double().numpy()
    ssm_pool = layer.kv_cache[1].double().numpy()
    xs = x.double().numpy()
    rows = np.zeros_like(xs)
    bos = np.concatenate([[0], np.cumsum(lens)])
    new_conv = {}
    for n, s in enumerate(slots):
        state = conv_pool[s] if cont[n] else np.zeros((W - 1, D))
        seq = np.concatenate([state, xs[bos[n]:bos[n + 1]]])
        for t in range(lens[n]):
            acc = (taps * seq[t:t + W]).sum(0)
            rows[bos[n] + t] = acc / (1 + np.exp(-acc))
        new_conv[s] = seq[-(W - 1):]
    if bf16_rows:
        rows = torch.from_numpy(rows).bfloat16().double().numpy()
    T = rows.shape[0]
    q = rows[:, :H * K].reshape(1, T, H, K)
    k = rows[:, H * K:2 * H * K].reshape(1, T, H, K)
    v = rows[:, 2 * H * K:].reshape(1, T, H, K)
    h0 = np.stack([ssm_pool[s] if cont[n] else np.zeros((H, K, K)) for n, s in enumerate(slots)])
    o, ht = hanpu.reference.gated_delta_rule(
        q, k, v, a.double().numpy()[None], b.double().numpy()[None], initial_state=h0, cu_seqlens=bos.astype(np.int64),
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=layer.A_log.double().numpy(),
        dt_bias=layer.dt_bias.double().numpy(), use_beta_sigmoid_in_kernel=True)
    return o[0], new_conv, {s: ht[n] for n, s in enumerate(slots)}


@pytest.mark.parametrize("dtype,amx", [(torch.bfloat16, "split"), (torch.bfloat16, "round"), (torch.float32, "split")],
                         ids=["bf16-split", "bf16-round", "f32"])
def test_mixed_batch_against_fp64(dtype, amx, monkeypatch):
    amx_here = amx if _hanpu.la_amx_usable() else None
    layer = stand_in(dtype, amx_here)
    lens = [1, 1] + PREFILL_LENS
    slots = DECODE_SLOTS + PREFILL_SLOTS
    cont = [True, True] + PREFILL_INIT
    T = sum(lens)
    x = torch.randn(T, D).to(dtype)
    b, a = torch.randn(T, H).to(dtype), torch.randn(T, H).to(dtype)
    out = torch.zeros(T, H, K, dtype=dtype)
    meta = types.SimpleNamespace(
        non_spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32),
        non_spec_query_start_loc=torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32),
        num_decodes=2, num_decode_tokens=2, num_prefills=2, num_prefill_tokens=sum(PREFILL_LENS),
        has_initial_state=torch.tensor(cont))
    bf16_rows = dtype == torch.bfloat16 and amx_here is not None
    ref_o, ref_conv, ref_ht = reference(layer, x, b, a, lens, slots, cont, bf16_rows)
    conv_before, ssm_before = layer.kv_cache[0].clone(), layer.kv_cache[1].clone()
    ran = []
    la_slots = _hanpu.la_slots
    monkeypatch.setattr(_hanpu, "la_slots", lambda *args, **kw: ran.append(la_slots(*args, **kw)))
    plugin.gdn_attention_core(layer, meta, x, b, a, out)
    if bf16_rows:
        assert ran == [None, f"amx-{amx}"], ran  # the decode part token by token, the prefill on AMX
    o_bound = 1e-5 if dtype == torch.bfloat16 else 1e-10
    state_bound = 1e-4 if bf16_rows and amx == "round" else 1e-10
    bos = np.concatenate([[0], np.cumsum(lens)])
    for n, s in enumerate(slots):
        rows = slice(bos[n], bos[n + 1])
        assert nmse(out[rows].double().numpy(), ref_o[rows]) < o_bound, f"sequence {n}: o"
        assert nmse(layer.kv_cache[1][s].numpy(), ref_ht[s]) < state_bound, f"sequence {n}: state"
        # the new conv states are input rows: exact
        assert np.array_equal(layer.kv_cache[0][s].double().numpy(), ref_conv[s]), f"sequence {n}: conv state"
    for s in set(range(SLOTS)) - set(slots):
        assert torch.equal(layer.kv_cache[0][s], conv_before[s]) and torch.equal(layer.kv_cache[1][s], ssm_before[s])
