#!/usr/bin/env bash
# Quick start, second command: install dependencies, build (Release), run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
# The Python package: pip builds it (incrementally, in build/python/) and installs it, then its tests.
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-build-isolation .
python3 -m pytest -q python/tests
