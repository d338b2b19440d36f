#!/usr/bin/env bash
# Quick start, second command: install dependencies, build (Release), run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
