#!/usr/bin/env python3
"""Generate golden files for hanpu from flash-linear-attention's own naive references.

Writes small safetensors files into tests/golden/ (see tests/golden/README.md). Each file holds
the INPUTS under FLA's argument names (q, k, v, g, beta, and optionally initial_state,
cu_seqlens, A_log, dt_bias) in FLA's sequence-first layout [B, T, H, K], plus the EXPECTED
outputs `o_ref` [B, T, HV, V] and `final_state_ref` [N, HV, K, V], and string metadata
(variant, scale, l2norm, gate_in_kernel, beta_sigmoid, description, ...).

Reference semantics (FLA; per value head hv, q/k head hv // (HV/H)):
    S' = exp(g_t) S            (GDN, scalar gate)    or  diag(exp(g_t)) S   (KDA, per-K gate)
    S  = S' + k_t^T beta_t (v_t - k_t S')
    o_t = (scale q_t) S        scale = K ** -0.5 (FLA default)
Varlen: sequence n = tokens [cu_seqlens[n], cu_seqlens[n+1]) with its own initial_state[n]
and final_state[n].

Precision: FLA's naive references cast every input to float32 internally
(`.to(torch.float32)` / `.to(torch.float)`), so passing float64 does NOT give a float64
reference. `o_ref` and `final_state_ref` are therefore FLA-computed float32 and stored as
float32. The script additionally checks them against an independent float64 transcription of
the recurrence above (not stored) and checks naive_chunk_* against naive_recurrent_*.

How FLA is imported (no triton needed, the `fla` package __init__ is never executed):
  * fla/ops/gated_delta_rule/naive.py and fla/ops/kda/naive.py are loaded as stand-alone
    modules with importlib.util.spec_from_file_location (they import only torch, einops).
  * fla/ops/gated_delta_rule/gate.py and fla/ops/kda/gate.py import triton at module level,
    so the functions naive_gdn_gate / naive_kda_gate are extracted VERBATIM from those files
    with `ast` (ast.get_source_segment) and exec'd in a namespace holding only torch and
    torch.nn.functional as F.
  The FLA source tree is located with --fla-root, else $FLA_ROOT, else
  importlib.util.find_spec("fla") (locates an installed fla-core without importing it), else
  /tmp/pipchk/fla. Goldens in the repo were made with fla-core 0.6.0 (PyPI).

Environment used (CPU only; Python 3.11.7), see tools/requirements-goldens.txt:
    pip install --no-deps -r tools/requirements-goldens.txt
i.e. torch==2.15.0 (PyPI, +cu132 build) installed with --no-deps, plus the NVIDIA runtime
libraries its libtorch*.so link against that the machine did not already have:
    nvidia-cufile==1.17.1.22  nvidia-cusparselt-cu13==0.8.1  nvidia-nvshmem-cu13==3.7.2
    nvidia-nccl-cu13==2.30.7  (the nccl one is needed: the system libnccl lacks ncclCommResume)
The remaining CUDA libraries (cudart, cublas, cublasLt, cufft, cusparse, cudnn, nvrtc,
nvJitLink, cupti) were resolved from /usr/local/cuda-13.0/lib (ld.so.conf) on this machine.
Without them, use `pip install torch==2.15.0` (with dependencies) instead. No GPU is used.

Usage:
    python3 tools/make_fla_goldens.py [--out tests/golden] [--fla-root /path/containing/fla]
"""

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------
# Loading FLA's reference functions
# --------------------------------------------------------------------------------------------
def find_fla_root(cli_root):
    cands = []
    if cli_root:
        cands.append(cli_root)
    if os.environ.get("FLA_ROOT"):
        cands.append(os.environ["FLA_ROOT"])
    spec = importlib.util.find_spec("fla")  # top-level: locates, does not execute __init__
    if spec is not None and spec.submodule_search_locations:
        cands.append(os.path.dirname(list(spec.submodule_search_locations)[0]))
    cands.append("/tmp/pipchk/fla")
    for c in cands:
        if os.path.isfile(os.path.join(c, "fla", "ops", "gated_delta_rule", "naive.py")):
            return c
    sys.exit("cannot find the FLA sources (fla/ops/...); pass --fla-root or set FLA_ROOT")


def fla_version(root):
    for name in os.listdir(root):
        if name.startswith("fla_core-") and name.endswith(".dist-info"):
            return name[len("fla_core-"):-len(".dist-info")]
    try:
        import importlib.metadata as md
        return md.version("fla-core")
    except Exception:
        return "unknown"


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_function_verbatim(path, func_name):
    """Extract one top-level function's source from `path` and exec it with torch / F only."""
    src = open(path).read()
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == func_name:
            seg = ast.get_source_segment(src, node)
            ns = {"torch": torch, "F": F}
            exec(compile(seg, f"{path}:{func_name}", "exec"), ns)
            return ns[func_name]
    raise RuntimeError(f"{func_name} not found in {path}")


def sha256_short(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Independent float64 transcription of the recurrence (check only, never stored)
# --------------------------------------------------------------------------------------------
def recurrence_f64(q, k, v, g, beta, scale, h0, cu_seqlens=None):
    """q,k [B,T,H,K]; v [B,T,HV,V]; g [B,T,HV] or [B,T,HV,K]; beta [B,T,HV]; h0 [N,HV,K,V]|None."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    if cu_seqlens is None:
        segs = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        segs = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    hT = torch.zeros(len(segs), HV, K, V, dtype=torch.float64)
    for n, (b, s, e) in enumerate(segs):
        for hv in range(HV):
            h = hv // G
            S = h0[n, hv].double().clone() if h0 is not None else torch.zeros(K, V, dtype=torch.float64)
            for t in range(s, e):
                gt = g[b, t, hv]
                S = S * (gt.exp()[:, None] if gt.dim() == 1 else gt.exp())
                kt = k[b, t, h]
                S = S + torch.outer(kt, beta[b, t, hv] * (v[b, t, hv] - kt @ S))
                o[b, t, hv] = (scale * q[b, t, h]) @ S
            hT[n, hv] = S
    return o, hT


def l2norm_fla(x):
    """FLA's l2norm (fla/modules/norm/l2norm.py): y = x * 1/sqrt(sum(x^2) + 1e-6), fp32 math.
    Kept in fp32 (the recurrent kernels normalize in-register; no rounding back to bf16)."""
    x = x.float()
    return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))


_ST_DTYPE = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16",
             torch.float16: "F16", torch.int64: "I64", torch.int32: "I32"}


def save_safetensors_deterministic(tensors, path, metadata):
    """Byte-reproducible safetensors writer (safetensors.torch.save_file emits the JSON header
    keys in a random order, so its files differ run to run even with identical tensors).
    Format: u64-LE header size, JSON header (sorted keys, space-padded to a multiple of 8),
    then the raw little-endian tensor bytes in sorted-name order. Files are read back with
    safetensors.safe_open below to prove they are valid."""
    header, blobs, off = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, sort_keys=False, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.chmod(path, 0o644)


def maxerr(a, b):
    return (a.double() - b.double()).abs().max().item()


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden"))
    ap.add_argument("--fla-root", default=None)
    args = ap.parse_args()

    root = find_fla_root(args.fla_root)
    ver = fla_version(root)
    p_gdn_naive = os.path.join(root, "fla/ops/gated_delta_rule/naive.py")
    p_kda_naive = os.path.join(root, "fla/ops/kda/naive.py")
    p_gdn_gate = os.path.join(root, "fla/ops/gated_delta_rule/gate.py")
    p_kda_gate = os.path.join(root, "fla/ops/kda/gate.py")
    gdn_naive = load_module(p_gdn_naive, "fla_gdn_naive")
    kda_naive = load_module(p_kda_naive, "fla_kda_naive")
    naive_recurrent_gated_delta_rule = gdn_naive.naive_recurrent_gated_delta_rule
    naive_chunk_gated_delta_rule = gdn_naive.naive_chunk_gated_delta_rule
    naive_recurrent_kda = kda_naive.naive_recurrent_kda
    naive_chunk_kda = kda_naive.naive_chunk_kda
    naive_gdn_gate = load_function_verbatim(p_gdn_gate, "naive_gdn_gate")
    naive_kda_gate = load_function_verbatim(p_kda_gate, "naive_kda_gate")
    print(f"FLA sources: {root} (fla-core {ver}); torch {torch.__version__}")

    common_meta = {
        "fla_version": ver,
        "torch_version": torch.__version__,
        "ref_dtype": "float32",
        "generator": "tools/make_fla_goldens.py",
        # sha256[:16] of the FLA files the reference functions were taken from
        "fla_src_sha256": " ".join(
            f"{os.path.relpath(p, root)}={sha256_short(p)}"
            for p in (p_gdn_naive, p_kda_naive, p_gdn_gate, p_kda_gate)),
    }
    os.makedirs(args.out, exist_ok=True)
    checks = []

    def save(name, tensors, meta, o_ref, hT_ref, chk):
        tensors = dict(tensors)
        tensors["o_ref"] = o_ref.float().contiguous()
        tensors["final_state_ref"] = hT_ref.float().contiguous()
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        md = dict(common_meta)
        md.update(meta)
        md = {k: str(v) for k, v in md.items()}
        path = os.path.join(args.out, name + ".safetensors")
        save_safetensors_deterministic(tensors, path, md)
        # independent float64 check
        o64, h64 = chk
        e_o, e_h = maxerr(o_ref, o64), maxerr(hT_ref, h64)
        checks.append((name, e_o, e_h))
        print(f"[{name}] wrote {path} ({os.path.getsize(path)} bytes); "
              f"FLA fp32 ref vs fp64 transcription: max|do|={e_o:.2e} max|dS|={e_h:.2e}")

    # ---------------------------------------------------------------- gdn_basic
    torch.manual_seed(1001)
    B, T, H, HV, K, V = 2, 75, 2, 4, 32, 32
    G = HV // H
    q = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    k = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    v = torch.randn(B, T, HV, V)
    g = F.logsigmoid(torch.rand(B, T, HV))
    beta = torch.rand(B, T, HV).sigmoid()
    h0 = torch.randn(B, HV, K, V)
    scale = K ** -0.5
    # FLA's naive GDN reference has no GVA support: expand q,k to HV heads (as FLA tests do).
    qe, ke = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    o_ref, hT_ref = naive_recurrent_gated_delta_rule(
        q=qe, k=ke, v=v, beta=beta, g=g, scale=scale, initial_state=h0, output_final_state=True)
    # sanity: naive_chunk vs naive_recurrent
    o_c, hT_c = naive_chunk_gated_delta_rule(
        q=qe, k=ke, v=v, g=g, beta=beta, scale=scale, initial_state=h0, output_final_state=True)
    print(f"[gdn_basic] naive_chunk_gated_delta_rule vs naive_recurrent: "
          f"max|do|={maxerr(o_c, o_ref):.2e} max|dS|={maxerr(hT_c, hT_ref):.2e}")
    assert maxerr(o_c, o_ref) < 1e-3 and maxerr(hT_c, hT_ref) < 1e-3
    save("gdn_basic",
         dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0),
         dict(variant="gdn", scale=repr(scale), l2norm="0", gate_in_kernel="0", beta_sigmoid="0",
              seed="1001",
              reference="fla/ops/gated_delta_rule/naive.py:naive_recurrent_gated_delta_rule",
              description=(
                  "GDN, B=2 T=75 H=2 HV=4 (GVA, q/k head = hv // 2) K=V=32, fp32 inputs. "
                  "q,k already L2-normalized (F.normalize) in the file; g = logsigmoid(rand) [B,T,HV]; "
                  "beta = sigmoid(rand) [B,T,HV]; random initial_state [B,HV,K,V]. Reference: "
                  "naive_recurrent_gated_delta_rule on q,k repeat_interleave'd to HV heads.")),
         o_ref, hT_ref, recurrence_f64(q, k, v, g, beta, scale, h0))

    # ---------------------------------------------------------------- gdn_bf16_gate
    torch.manual_seed(1002)
    B, T, H, HV, K, V = 2, 130, 2, 2, 64, 48
    q = torch.randn(B, T, H, K).bfloat16()          # un-normalized (l2norm=1)
    k = torch.randn(B, T, H, K).bfloat16()
    v = torch.randn(B, T, HV, V).bfloat16()
    g_raw = torch.randn(B, T, HV) * 1.5              # raw pre-activation gate, fp32
    g_raw[0, 7, :] = 25.0                            # softplus linear branch (x > 20): decay ~ 0
    g_raw[1, 60, 0] = -30.0                          # softplus ~ 1e-13: decay ~ 1
    beta = torch.rand(B, T, HV).sigmoid()            # already activated, fp32
    A_log = torch.empty(HV).uniform_(1.0, 16.0).log()  # Mamba-style A in [1, 16]
    dt_bias = torch.randn(HV) * 0.5 - 3.0            # softplus(g + dt_bias) mostly ~0.01..0.5
    scale = K ** -0.5
    g_act = naive_gdn_gate(g_raw, A_log, dt_bias)   # fp32, [B,T,HV]
    qn, kn = l2norm_fla(q), l2norm_fla(k)            # fp32 from the bf16-rounded values
    o_ref, hT_ref = naive_recurrent_gated_delta_rule(
        q=qn, k=kn, v=v.float(), beta=beta, g=g_act, scale=scale, initial_state=None,
        output_final_state=True)
    save("gdn_bf16_gate",
         dict(q=q, k=k, v=v, g=g_raw, beta=beta, A_log=A_log, dt_bias=dt_bias),
         dict(variant="gdn", scale=repr(scale), l2norm="1", gate_in_kernel="1", beta_sigmoid="0",
              seed="1002",
              reference="naive_gdn_gate + l2norm(fp32, eps=1e-6) + naive_recurrent_gated_delta_rule",
              description=(
                  "GDN, B=2 T=130 H=HV=2 K=64 V=48. q,k,v stored BF16; q,k NOT normalized "
                  "(use_qk_l2norm_in_kernel: reference uses x/sqrt(sum x^2 + 1e-6) in fp32 of the "
                  "bf16 values, no re-rounding). use_gate_in_kernel: g is the RAW gate (fp32), "
                  "activated g = -exp(A_log[hv]) * softplus(g + dt_bias[hv]) via FLA naive_gdn_gate "
                  "in fp32 (raw g[0,7,:]=25 hits softplus's x>20 branch, g[1,60,0]=-30). "
                  "beta fp32 already in (0,1). No initial_state (zero state).")),
         o_ref, hT_ref, recurrence_f64(qn, kn, v, g_act, beta, scale, None))

    # ---------------------------------------------------------------- gdn_varlen
    torch.manual_seed(1003)
    cu_seqlens = torch.tensor([0, 15, 100, 165], dtype=torch.int64)
    N, T = len(cu_seqlens) - 1, int(cu_seqlens[-1])
    B, H, HV, K, V = 1, 1, 2, 16, 16
    G = HV // H
    q = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    k = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    v = torch.randn(B, T, HV, V)
    g = F.logsigmoid(torch.rand(B, T, HV))
    g[0, 0, :] = 0.0          # exact-zero gates (no decay) at the first token of seq 0
    g[0, 40:44, 0] = 0.0      # ... and a run inside seq 1, value head 0
    g[0, 120, 1] = 0.0        # ... and one inside seq 2, value head 1
    g[0, 50, :] = -1000.0     # mask: exp(-1000) == 0 -> state reset inside seq 1 (both heads)
    g[0, 130, 0] = -1000.0    # mask inside seq 2, head 0 only
    beta = torch.rand(B, T, HV).sigmoid()
    h0 = torch.randn(N, HV, K, V)
    scale = K ** -0.5
    qe, ke = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    os_, hs_ = [], []
    for n in range(N):
        s, e = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        o_n, h_n = naive_recurrent_gated_delta_rule(
            q=qe[:, s:e], k=ke[:, s:e], v=v[:, s:e], beta=beta[:, s:e], g=g[:, s:e], scale=scale,
            initial_state=h0[n:n + 1], output_final_state=True)
        os_.append(o_n)
        hs_.append(h_n)
    o_ref, hT_ref = torch.cat(os_, dim=1), torch.cat(hs_, dim=0)
    save("gdn_varlen",
         dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu_seqlens),
         dict(variant="gdn", scale=repr(scale), l2norm="0", gate_in_kernel="0", beta_sigmoid="0",
              seed="1003",
              reference="naive_recurrent_gated_delta_rule per sequence, outputs concatenated",
              description=(
                  "GDN varlen, B=1, cu_seqlens=[0,15,100,165] (N=3), H=1 HV=2 (GVA) K=V=16, fp32. "
                  "q,k L2-normalized in the file; g = logsigmoid(rand) with exact zeros at "
                  "(t=0, all hv), (t=40..43, hv=0), (t=120, hv=1) and -1000 masks at (t=50, all hv) "
                  "and (t=130, hv=0); beta = sigmoid(rand); initial_state [N,HV,K,V] per sequence; "
                  "final_state_ref [N,HV,K,V]. Reference runs each sequence separately.")),
         o_ref, hT_ref, recurrence_f64(q, k, v, g, beta, scale, h0, cu_seqlens))

    # ---------------------------------------------------------------- kda_basic
    torch.manual_seed(1004)
    B, T, H, HV, K, V = 2, 70, 2, 2, 32, 32
    q = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    k = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    v = torch.randn(B, T, HV, V)
    g = F.logsigmoid(torch.randn(B, T, HV, K))
    beta = torch.rand(B, T, HV).sigmoid()
    h0 = torch.randn(B, HV, K, V)
    scale = K ** -0.5
    o_ref, hT_ref = naive_recurrent_kda(
        q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=h0, output_final_state=True)
    # sanity: naive_chunk_kda needs T % 64 == 0 -> zero-pad to 128 (k=v=g=beta=0 leaves S unchanged)
    pad = (-T) % 64
    padt = lambda x: torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], dim=1)
    o_c, hT_c = naive_chunk_kda(
        q=padt(q), k=padt(k), v=padt(v), g=padt(g), beta=padt(beta), scale=scale,
        initial_state=h0, output_final_state=True)
    print(f"[kda_basic] naive_chunk_kda vs naive_recurrent_kda: "
          f"max|do|={maxerr(o_c[:, :T], o_ref):.2e} max|dS|={maxerr(hT_c, hT_ref):.2e}")
    assert maxerr(o_c[:, :T], o_ref) < 1e-3 and maxerr(hT_c, hT_ref) < 1e-3
    save("kda_basic",
         dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0),
         dict(variant="kda", scale=repr(scale), l2norm="0", gate_in_kernel="0", beta_sigmoid="0",
              seed="1004", reference="fla/ops/kda/naive.py:naive_recurrent_kda",
              description=(
                  "KDA, B=2 T=70 H=HV=2 K=V=32, fp32. q,k L2-normalized in the file; "
                  "g = logsigmoid(randn) per key channel [B,T,HV,K]; beta = sigmoid(rand) [B,T,HV]; "
                  "random initial_state [B,HV,K,V].")),
         o_ref, hT_ref, recurrence_f64(q, k, v, g, beta, scale, h0))

    # ---------------------------------------------------------------- kda_gate_varlen
    torch.manual_seed(1005)
    cu_seqlens = torch.tensor([0, 15, 80], dtype=torch.int64)
    N, T = len(cu_seqlens) - 1, int(cu_seqlens[-1])
    B, H, HV, K, V = 1, 2, 4, 24, 24
    q = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    k = F.normalize(torch.randn(B, T, H, K), p=2, dim=-1)
    v = torch.randn(B, T, HV, V)
    g_raw = torch.randn(B, T, HV, K) * 1.5           # raw gate, fp32
    g_raw[0, 20, 1, :5] = 25.0                       # softplus linear branch (x > 20)
    g_raw[0, 70, 3, 10] = -30.0                      # softplus ~ 1e-13
    A_log = torch.empty(HV).uniform_(1.0, 16.0).log()  # Mamba-style A in [1, 16]
    dt_bias = torch.randn(HV * K) * 0.5 - 3.0
    beta_raw = torch.randn(B, T, HV) * 2.0           # raw, sigmoid applied "in kernel"
    h0 = torch.randn(N, HV, K, V)
    scale = K ** -0.5
    g_act = naive_kda_gate(g_raw, A_log, dt_bias)   # fp32 [B,T,HV,K]
    beta_act = beta_raw.float().sigmoid()
    os_, hs_ = [], []
    for n in range(N):
        s, e = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        # GVA handled inside naive_recurrent_kda (q,k repeat_interleave(HV//H, dim=2))
        o_n, h_n = naive_recurrent_kda(
            q=q[:, s:e], k=k[:, s:e], v=v[:, s:e], g=g_act[:, s:e], beta=beta_act[:, s:e],
            scale=scale, initial_state=h0[n:n + 1], output_final_state=True)
        os_.append(o_n)
        hs_.append(h_n)
    o_ref, hT_ref = torch.cat(os_, dim=1), torch.cat(hs_, dim=0)
    save("kda_gate_varlen",
         dict(q=q, k=k, v=v, g=g_raw, beta=beta_raw, initial_state=h0, cu_seqlens=cu_seqlens,
              A_log=A_log, dt_bias=dt_bias),
         dict(variant="kda", scale=repr(scale), l2norm="0", gate_in_kernel="1", beta_sigmoid="1",
              seed="1005",
              reference="naive_kda_gate + sigmoid(beta) + naive_recurrent_kda per sequence",
              description=(
                  "KDA varlen, B=1, cu_seqlens=[0,15,80] (N=2), H=2 HV=4 (GVA, q/k head = hv // 2) "
                  "K=V=24, fp32. q,k L2-normalized in the file. use_gate_in_kernel: g is RAW "
                  "[B,T,HV,K]; activated g = -exp(A_log[hv]) * softplus(g + dt_bias.view(HV,K)[hv]) "
                  "via FLA naive_kda_gate (A_log [HV], dt_bias [HV*K]; raw g[0,20,1,:5]=25, "
                  "g[0,70,3,10]=-30). use_beta_sigmoid_in_kernel: "
                  "beta is RAW, reference uses sigmoid(beta). initial_state [N,HV,K,V] per sequence.")),
         o_ref, hT_ref, recurrence_f64(q, k, v, g_act, beta_act, scale, h0, cu_seqlens))

    # ---------------------------------------------------------------- verify
    bad = [c for c in checks if c[1] > 1e-4 or c[2] > 1e-4]
    for name, _, _ in checks:
        path = os.path.join(args.out, name + ".safetensors")
        with safe_open(path, framework="pt") as f:
            md = f.metadata()
            assert set(f.keys()) >= {"q", "k", "v", "g", "beta", "o_ref", "final_state_ref"}, name
            for key in ("variant", "scale", "l2norm", "gate_in_kernel", "beta_sigmoid", "description"):
                assert key in md, (name, key)
            assert not any(torch.isnan(f.get_tensor(t)).any() for t in f.keys()), name
    total = sum(os.path.getsize(os.path.join(args.out, c[0] + ".safetensors")) for c in checks)
    print(f"total size {total} bytes")
    if bad:
        sys.exit(f"fp32 FLA reference disagrees with fp64 transcription: {bad}")


if __name__ == "__main__":
    main()
