"""Runs vLLM once, greedy, and prints the generated token ids as JSON (one vLLM engine per process:
vLLM keeps process-wide state, so each configuration of the tests gets a process of its own).

    python vllm_generate.py '{"model": DIR, "dtype": "float32", "prompts": [[ids], ...], "max_tokens": 8,
                              "llm": {extra keyword arguments of vllm.LLM}}'

Prints RESULT_PREFIX + {"tokens": [[ids], ...], "gdn_layer": class name of the first GDN layer built,
"model_class": the model class vLLM built, when the spec asks with "model_class": true, "logprobs": per
request and generated token {token id: logprob} of the top "logprobs" tokens, when the spec asks,
"num_cached_tokens": per request, the prompt tokens vLLM took from its prefix cache} on one line.
"gdn_shards": per worker, what gdn_shard gives (the heads of its first linear-attention layer and
the tensor-parallel size), when the spec asks with "gdn_shards": true. With "sequential": true the prompts are generated one after the other (one generate call each). The plugin is loaded by vLLM itself through the entry point (HANPU_VLLM=0: not used).
"""

import importlib
import json
import sys

# vLLM logs to stdout too: the result is the line starting with this.
RESULT_PREFIX = "HANPU_VLLM_RESULT "


def model_class_name(model):
    """The class name of this worker's model."""
    return type(model).__name__


def gdn_shard(model):
    """[value heads, tensor-parallel size] of the first linear-attention layer (GDN or KDA) of this
    worker's model, and for KDA models the first MLA layer's heads: [KDA heads, MLA heads, size]."""
    for module in model.modules():
        if type(module).__name__ == "HanpuGatedDeltaNetAttention":
            return [module.num_v_heads // module.tp_size, module.tp_size]
        if type(module).__name__ == "HanpuKimiDeltaAttention":
            mla = next(m for m in model.modules() if type(m).__name__ == "MultiHeadLatentAsMHA")
            return [module.local_num_heads, mla.heads, module.tp_size]
    return None


def main():
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.model_executor.custom_op import op_registry_oot

    kwargs = dict(model=spec["model"], dtype=spec["dtype"], skip_tokenizer_init=True, max_model_len=512, seed=0,
                  enforce_eager=True)
    kwargs.update(spec.get("llm", {}))
    llm = LLM(**kwargs)
    # "logprobs": k also returns, per generated token, the log-probabilities of vLLM's k most likely
    # tokens and of the token chosen ({token id: logprob}).
    params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True,
                            logprobs=spec.get("logprobs"))
    requests = [{"prompt_token_ids": p} for p in spec["prompts"]]
    if spec.get("sequential"):
        # One generate call per prompt, in order: a later prompt can hit the prefix cache that an
        # earlier one filled.
        outputs = [llm.generate([r], params, use_tqdm=False)[0] for r in requests]
    else:
        outputs = llm.generate(requests, params, use_tqdm=False)
    layer = op_registry_oot.get("QwenGatedDeltaNetAttention")
    # The class vLLM built (multiprocessing needs VLLM_ALLOW_INSECURE_SERIALIZATION for a function).
    # Functions handed to the workers by reference (module vllm_generate): with tensor parallelism vLLM
    # pickles them once more for its workers, which neither a lambda nor a function of __main__ survives.
    here = importlib.import_module("vllm_generate")
    model_class = llm.apply_model(here.model_class_name)[0] if spec.get("model_class") else None
    gdn_shards = llm.apply_model(here.gdn_shard) if spec.get("gdn_shards") else None
    print(RESULT_PREFIX + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs],
                      "gdn_layer": layer.__name__ if layer is not None else "QwenGatedDeltaNetAttention",
                      "model_class": model_class,
                      "num_cached_tokens": [o.num_cached_tokens for o in outputs],
                      "gdn_shards": gdn_shards,
                      "logprobs": [[{str(t): p.logprob for t, p in step.items()} for step in o.outputs[0].logprobs]
                                   for o in outputs] if spec.get("logprobs") else None}))


if __name__ == "__main__":
    main()
