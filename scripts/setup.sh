#!/usr/bin/env bash
# Installs what hanpu needs to build and test on a fresh Debian 12 machine (run as root, or with
# sudo available). Idempotent: packages already present are skipped quickly.
set -euo pipefail

packages=(cmake ninja-build g++ libhwy-dev nlohmann-json3-dev libcli11-dev libgtest-dev)
packages+=(pkg-config libpcre2-dev libutf8proc-dev)  # tokenizer: split regex, NFC
packages+=(libexpat1-dev)  # test_report parses the SVG/HTML reports with expat
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
