#!/usr/bin/env bash
# Installs what hanpu needs to build and test on a fresh Debian 12 machine (run as root, or with
# sudo available). Idempotent: packages already present are skipped quickly.
set -euo pipefail

packages=(cmake ninja-build g++ ccache libhwy-dev nlohmann-json3-dev libcli11-dev libgtest-dev)
packages+=(pkg-config libpcre2-dev libutf8proc-dev)  # tokenizer: split regex, NFC
packages+=(libexpat1-dev)  # test_report parses the SVG/HTML reports with expat
packages+=(libcpp-httplib-dev)  # `hanpu serve`: the HTTP server library (src/serve/server.cpp)
packages+=(clang libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh; CI runs them briefly)
packages+=(libopenblas-dev libdnnl-dev)  # benchmarks/linear_libraries.cpp: the projections next to OpenBLAS and oneDNN
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

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
