#!/usr/bin/env bash
# Quick start, second command: install dependencies, build (Release), run the test suite (CTest +
# the Python package's pytest) on the best SIMD target of this CPU, then again with the kernels
# capped at AVX2 (where the CPU has it and its best target is wider) and at the portable C++ target (HANPU_ISA, include/hanpu/isa.hpp),
# and the LA kernels' tests on every other target the CPU runs, so that a test passing on one ISA
# only is caught. Ends with the skipped tests and their reasons and
# one line of counts over every run. Arguments go to each ctest run (e.g. -R LaGrid).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_tests.sh
cmake --preset release >/dev/null
cmake --build --preset release
# The Python package: pip builds it (incrementally, in build/python-<wheel tag>/, reusing the release build's objects through ccache) and installs it.
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-build-isolation .

results="$PWD/build/release/test-results"
# Test processes run one per core: the suite is hundreds of short single-threaded cases, and none
# depends on having the machine to itself (no wall-clock bounds; temp files named per process).
test_jobs=$(nproc)
rm -rf "$results"
mkdir -p "$results"
# setup_tests.sh installed every package the tests use: a test that still skips for one fails the run.
export HANPU_TESTS_NO_SKIP=1
summary_args=()
run_suite() {  # LABEL HANPU_ISA [ctest args]
  local label="$1" isa="$2"
  shift 2
  echo "== test suite: HANPU_ISA=${isa:-native} =="
  HANPU_ISA="$isa" ctest --preset release -j "$test_jobs" --output-junit "$results/ctest-$label.xml" "$@"
  # torch (the transformers tests' baseline) capped alike, so that the AVX2 run also runs torch's
  # and oneDNN's AVX2 code, as an AVX2-only machine would (its bf16 arithmetic differs by CPU).
  local torch_env=()
  [ "$isa" = avx2 ] && torch_env=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
  env HANPU_ISA="$isa" "${torch_env[@]}" python3 -m pytest -q python/tests --junitxml "$results/pytest-$label.xml"
  summary_args+=("ctest/$label=$results/ctest-$label.xml" "pytest/$label=$results/pytest-$label.xml")
}
run_suite native "" "$@"
# On an AVX2-only CPU (Zen 3) the native run already ran the AVX2 kernels, and torch its AVX2 code:
# a second identical run finds nothing the first did not.
native_target=$(python3 -c "import hanpu; print(hanpu.isa()['target'])")
if [ "$native_target" = AVX2 ]; then
  echo "== test suite: no separate AVX2 run (the native target is AVX2) =="
elif HANPU_ISA=avx2 build/release/hanpu device --host --measure-seconds 0.01 >/dev/null 2>&1; then
  run_suite avx2 avx2 "$@"
else
  echo "== test suite: no AVX2 run (this CPU cannot run the AVX2 target) =="
fi
run_suite portable portable "$@"
# The LA kernels' tests (the random grid against the fp64 reference, every path, plan execution,
# FLA's goldens) also on every other target this CPU runs (SSE4, SSSE3, ... : seconds each).
# (choices: native, the runnable targets best first, portable; the best one is native's, the last
# one portable's.)
for isa in $(python3 -c "import hanpu; print(' '.join(hanpu.isa()['choices'][2:-2]))"); do
  [ "$isa" = avx2 ] && continue
  echo "== LA tests: HANPU_ISA=$isa =="
  # La[A-Z]: the LA kernels' suites (LaGrid, LaPaths, ...), not the Layering compile probes or the
  # planner's LayoutDp, which do not depend on the ISA.
  HANPU_ISA="$isa" ctest --preset release -j "$test_jobs" -R '^(La[A-Z]|PlanExec|Golden)' --output-junit "$results/ctest-la-$isa.xml"
  summary_args+=("ctest-la/$isa=$results/ctest-la-$isa.xml")
done
python3 scripts/test_summary.py "${summary_args[@]}"
