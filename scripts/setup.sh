#!/usr/bin/env bash
# Installs what hanpu needs to build and run its main job (scripts/run.sh) on a fresh Debian 12
# machine (run as root, or with sudo available): Debian packages only, no Python packages. What the
# tests add (clang for the fuzz targets, the libraries the benchmarks compare with, torch,
# transformers, fla-core ...) is scripts/setup_tests.sh. Idempotent: packages already present are
# skipped quickly.
set -euo pipefail

packages=(cmake ninja-build g++ ccache libhwy-dev nlohmann-json3-dev libcli11-dev libgtest-dev)
packages+=(pkg-config libpcre2-dev libutf8proc-dev)  # tokenizer: split regex, NFC
packages+=(libexpat1-dev)  # test_report parses the SVG/HTML reports with expat (small; configure finds it)
packages+=(libcpp-httplib-dev)  # `hanpu serve`: the HTTP server library (src/serve/server.cpp)
source "$(dirname "$0")/apt_install.sh"
apt_install "${packages[@]}"

