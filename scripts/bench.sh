#!/usr/bin/env bash
# Linear-attention benchmark: install dependencies, build (Release), run `hanpu bench` on built-in
# synthetic inputs. Extra arguments go to `hanpu bench` (e.g. --variant gdn --T 4096 --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target hanpu
./build/release/hanpu bench "$@"
