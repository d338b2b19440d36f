#!/usr/bin/env bash
# ARM64: cross-builds the CPU kernels' tests with Debian's aarch64 toolchain against Debian's
# multiarch arm64 packages and runs the LA, plan-execution and golden tests under qemu-user, once on
# the emulated CPU's best SIMD target and once on every other target Highway compiled for ARM64
# (HANPU_ISA, as scripts/test.sh does on x86). CI runs it after the sanitizer runs.
#
#   scripts/test_arm64.sh            (installs what it needs on Debian 12; run as root or with sudo)
#
# qemu-user emulates a CPU with SVE/SVE2 and SME ("max"); its speed says nothing about a real ARM64 core.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "test_arm64: adding the arm64 architecture to dpkg"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
packages=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libpcre2-dev:arm64
          libutf8proc-dev:arm64 libexpat1-dev:arm64 nlohmann-json3-dev libcli11-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "test_arm64: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

build=build/arm64
# HANPU_BUILD_SERVE=OFF: Debian's cpp-httplib has no multi-arch package; serve is not under test here.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHANPU_BUILD_SERVE=OFF \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchains/aarch64-linux-gnu.cmake" >/dev/null
# The three test programs link the CPU backend alone, and hanpu_isa_query answers what `hanpu isa`
# would: no model, server or CLI code is compiled for ARM64.
cmake --build "$build" --target hanpu_isa_query test_la test_plan_exec test_golden

run_arm64() { qemu-aarch64 -L / "$@"; }
target_of() { HANPU_ISA="$1" run_arm64 "$build/hanpu_isa_query" | sed -n 's/^kernels: \([^ ]*\).*/\1/p'; }
native=$(target_of native)
echo "== ARM64 under qemu-user: kernels on $native; HANPU_ISA choices: $(run_arm64 "$build/hanpu_isa_query" --choices | tr '\n' ' ')=="
# La[A-Z]: the LA kernels' suites (LaGrid, LaPaths, ...), not the Layering compile probes or the
# planner's LayoutDp, which do not depend on the ISA.
tests='^(La[A-Z]|PlanExec|Golden)'
results="$build/test-results"
mkdir -p "$results"
ctest --test-dir "$build" -R "$tests" -j2 --output-on-failure --output-junit "$PWD/$results/ctest-arm64-native.xml"
# SME (issue 38, item 4): qemu 7.2's default CPU has SME, so LaSme above ran the SME gram
# (src/cpu/gram_sme.cpp) at every streaming vector length Linux granted it (PR_SME_SET_VL: 16 to
# 256 bytes). It must not have skipped there; it must run on a CPU that implements one other
# length only (qemu's sme512 property: SVL 64 bytes) and has no FEAT_SME_FA64 (sme_fa64=off: qemu
# then raises SIGILL for an Advanced SIMD or scalar FP instruction in streaming mode, as such a
# core does), and skip, saying why, on a CPU without SME.
grep -q '<testcase name="LaSme[^>]*status="run"' "$results/ctest-arm64-native.xml" ||
  { echo "test_arm64: LaSme did not run on qemu's default CPU, which has SME"; exit 1; }
sme_run() { run_arm64 -cpu "$1" "$build/tests/test_la" --gtest_filter='LaSme.*' 2>&1; }
out=$(sme_run max,sme512=on,sme_fa64=off) && grep -q 'checked at 1 streaming vector length(s), from 64 to 64 bytes' <<<"$out" ||
  { echo "$out"; echo "test_arm64: LaSme failed or did not run at SVL 64 bytes (-cpu max,sme512=on,sme_fa64=off)"; exit 1; }
out=$(sme_run max,sme=off) && grep -q 'SKIPPED.*LaSme' <<<"$out" ||
  { echo "$out"; echo "test_arm64: LaSme did not skip on a CPU without SME (-cpu max,sme=off)"; exit 1; }
echo "== ARM64 under qemu-user: LaSme ran at SVL 64 bytes only without FA64 (-cpu max,sme512=on,sme_fa64=off) and skipped without SME =="
# Every other target once (Debian 12's arm64 Highway 1.0.3 compiles NEON only, so "portable" is
# NEON too and nothing runs twice).
done_targets=" $native "
for isa in $(run_arm64 "$build/hanpu_isa_query" --choices | sed 1d); do
  t=$(target_of "$isa")
  [[ $done_targets == *" $t "* ]] && { echo "(HANPU_ISA=$isa is $t again: not run twice)"; continue; }
  done_targets+="$t "
  echo "== ARM64 under qemu-user, HANPU_ISA=$isa ($t) =="
  HANPU_ISA="$isa" ctest --test-dir "$build" -R "$tests" -j2 --output-on-failure \
    --output-junit "$PWD/$results/ctest-arm64-$isa.xml"
done
