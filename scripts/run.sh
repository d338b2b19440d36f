#!/usr/bin/env bash
# Quick start, first command: install dependencies, build (Release), then the main job on an
# embedded default with no download: a whole Qwen3.5-0.8B-shaped model (random bf16 weights of the
# real shapes, built in memory) prefilling 512 and 2048 tokens and decoding, with where the time
# goes (GDN layers through the linear-attention engine, attention, MLPs, LM head).
# Extra arguments go to `hanpu bench-model` (e.g. -p 512 --json, or --model DIR for a checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
# Only the command line: the test suite's binaries are scripts/test.sh's to build.
cmake --build --preset release --target hanpu
if [ "$#" -eq 0 ]; then
  set -- -p 512,2048
fi
# The embedded default model unless the arguments name one (--model DIR or --synthetic NAME).
case " $* " in
  *" --model"* | *" --synthetic"*) ;;
  *) set -- --synthetic qwen3.5-0.8b "$@" ;;
esac
./build/release/hanpu bench-model "$@"
