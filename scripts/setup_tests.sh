#!/usr/bin/env bash
# What the tests and benchmarks add to scripts/setup.sh (which scripts/test.sh runs first): clang
# for the libFuzzer targets, OpenBLAS and oneDNN for the linear-layer comparison benchmark, and the
# Python packages (pytest, the openai client, torch, fla-core, transformers, each pinned). The main
# job (scripts/run.sh) needs none of them. Idempotent: only what is missing is installed.
set -euo pipefail
source "$(dirname "$0")/apt_install.sh"
packages=(clang libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh; CI runs them briefly)
packages+=(libopenblas-dev libdnnl-dev)  # benchmarks/linear_libraries.cpp: the projections next to OpenBLAS and oneDNN
packages+=(chromium chromium-driver)  # python/tests/test_serve_clients.py: hanpu serve's chat page in headless Chromium
apt_install "${packages[@]}"

# Python package (docs/PYTHON.md): its build backend and test requirements from PyPI, then torch and
# fla-core for the torch/FLA tests with the --no-deps recipe of tools/requirements-goldens.txt, then
# transformers for the example's tests (python/requirements-transformers.txt, also --no-deps).
# Only unsatisfied lines reach pip (a second run makes no pip call); a failing install fails setup.
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
pip_install() {
  echo "setup: pip installing $*"
  "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"
}
# (the check runs in a command substitution of its own, so a failing check stops setup too)
py_missing=$("$python" "$repo/python/missing_requirements.py" "$repo/python/requirements-test.txt")
if [ -n "$py_missing" ]; then pip_install $py_missing; fi
py_missing=$("$python" "$repo/python/missing_requirements.py" --present-ok "$repo/tools/requirements-goldens.txt")
if [ -n "$py_missing" ]; then pip_install --no-deps $py_missing; fi
# transformers for the example's tests, pinned with everything it imports (no test may skip for a
# missing package: scripts/test.sh fails on such a skip).
py_missing=$("$python" "$repo/python/missing_requirements.py" "$repo/python/requirements-transformers.txt")
if [ -n "$py_missing" ]; then pip_install --no-deps $py_missing; fi
# Every pinned package must import together (a pin that no longer fits fails here, not in a test).
"$python" -c "import torch, transformers, numpy, ml_dtypes, einops, safetensors; transformers.Qwen3_5ForCausalLM" \
  || { echo "setup: the pinned Python packages do not import together" >&2; exit 1; }
