#!/usr/bin/env bash
# The Python package's tests (python/tests) with the extension module built under AddressSanitizer
# and UndefinedBehaviorSanitizer (docs/RELIABILITY.md). CI runs it after the README's test command.
#
# The module and the core it links are instrumented; the interpreter, numpy and torch are not, so
# the ASan runtime is preloaded into python3 (an instrumented module cannot be loaded into an
# uninstrumented process otherwise). It is installed into its own virtual environment
# (build/asan-venv, with the system's site-packages for numpy/torch/transformers) so the normal
# install is left alone. Leak checking is off here: CPython and torch keep allocations alive until
# exit by design, and the C++ suite already runs LeakSanitizer over the same core (.ci/run).
# UBSan halts on the first report, ASan aborts on the first error: any report fails the run.
#
#   scripts/test_python_sanitized.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
venv=build/asan-venv
[[ -x $venv/bin/python ]] || "$python" -m venv --system-site-packages "$venv"

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
echo "== Python package under ASan + UBSan: building the module (build/python-asan) =="
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -C build-dir=build/python-asan \
  -C cmake.build-type=RelWithDebInfo \
  -C "cmake.define.CMAKE_CXX_FLAGS=$sanitize" \
  -C "cmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" \
  .

# The runtimes of the compiler that built the module (g++: libasan, libubsan), first in the process.
preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
for lib in $preload; do
  [[ -f $lib ]] || { echo "test_python_sanitized.sh: sanitizer runtime '$lib' not found (g++ -print-file-name)" >&2; exit 2; }
done

results=build/release/test-results
mkdir -p "$results"
echo "== Python package under ASan + UBSan: pytest =="
# torch's CPU capability probing and its own (uninstrumented) allocator are left alone; the checks
# that matter are on hanpu's module and core, which every test calls.
env LD_PRELOAD="$preload" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  HANPU_TESTS_NO_SKIP="${HANPU_TESTS_NO_SKIP:-1}" \
  "$venv/bin/python" -m pytest -q python/tests --junitxml "$results/pytest-asan.xml" "$@"
