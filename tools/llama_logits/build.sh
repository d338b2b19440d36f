#!/usr/bin/env bash
# Compiles llama_logits.cpp (and llama_tokenize.cpp, next to its output) against a llama.cpp
# source tree and its build.
#   tools/llama_logits/build.sh LLAMA_CPP_DIR [BUILD_SUBDIR] [OUT]
# LLAMA_CPP_DIR: llama.cpp's sources (include/llama.h, ggml/include/); BUILD_SUBDIR: the build
# under it whose bin/ holds libllama.so and libggml*.so (default build-noamx, the peer scripts'
# build); OUT: the executable (default build/llama_logits in this repo). The rpath points at that
# bin/ so the tool runs without LD_LIBRARY_PATH. Prints the executable's path.
set -euo pipefail
src=${1:?usage: build.sh LLAMA_CPP_DIR [BUILD_SUBDIR] [OUT]}
bin="$src/${2:-build-noamx}/bin"
here=$(cd "$(dirname "$0")" && pwd)
out=${3:-$here/../../build/llama_logits}
for f in "$src/include/llama.h" "$src/ggml/include/ggml.h" "$bin/libllama.so"; do
  [ -e "$f" ] || { echo "build.sh: '$f' not found (LLAMA_CPP_DIR=$src, build bin $bin)" >&2; exit 1; }
done
mkdir -p "$(dirname "$out")"
${CXX:-g++} -std=c++17 -O2 -Wall -Wextra -I"$src/include" -I"$src/ggml/include" "$here/llama_logits.cpp" \
  -o "$out" -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin"
${CXX:-g++} -std=c++17 -O2 -Wall -Wextra -I"$src/include" -I"$src/ggml/include" "$here/llama_tokenize.cpp" \
  -o "$(dirname "$out")/llama_tokenize" -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin"
echo "$out"
