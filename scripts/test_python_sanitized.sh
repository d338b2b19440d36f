#!/usr/bin/env bash
# The Python package's tests (python/tests) with the extension module built under AddressSanitizer
# and UndefinedBehaviorSanitizer (docs/RELIABILITY.md). CI runs it after the C++ suite under the
# same sanitizers.
#
# The module is built in the debug preset's tree (build/debug, ASan + UBSan, configured here with
# HANPU_BUILD_PYTHON=ON), so it links the same instrumented core the C++ suite ran on: no second
# build of the core. It is installed with the pure-Python package into build/debug/python-package
# and found through PYTHONPATH, leaving the normal install alone. The interpreter, numpy and torch
# are not instrumented, so the ASan runtime is preloaded into python3 (an instrumented module
# cannot be loaded into an uninstrumented process otherwise). Leak checking is off here: CPython
# and torch keep allocations alive until exit by design, and the C++ suite already runs
# LeakSanitizer over the same core. ASan aborts and UBSan halts on the first report.
#
#   scripts/test_python_sanitized.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
build=build/debug
echo "== Python package under ASan + UBSan: building the module in $build =="
cmake --preset debug -DHANPU_BUILD_PYTHON=ON >/dev/null
cmake --build --preset debug --target _hanpu
package="$PWD/$build/python-package"
rm -rf "$package"
cmake --install "$build" --component python --prefix "$package" >/dev/null
# The pure-Python package with its subpackages (hanpu.integrations, ...), as the wheel has it.
tar -C python --exclude=__pycache__ -cf - hanpu | tar -C "$package" -xf -

# The runtimes of the compiler that built the module (g++: libasan, libubsan), first in the process.
preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
for lib in $preload; do
  [[ -f $lib ]] || { echo "test_python_sanitized.sh: sanitizer runtime '$lib' not found (g++ -print-file-name)" >&2; exit 2; }
done

results=build/release/test-results
mkdir -p "$results"
echo "== Python package under ASan + UBSan: pytest =="
sanitized_env=(PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}" LD_PRELOAD="$preload")
# The instrumented module, not an installed one, must be what the tests import.
env "${sanitized_env[@]}" ASAN_OPTIONS=detect_leaks=0 "$python" -c \
  "import hanpu, sys; f = hanpu._hanpu.__file__; assert f.startswith(sys.argv[1]), f; print('testing', f)" "$package"
env "${sanitized_env[@]}" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  HANPU_TESTS_NO_SKIP="${HANPU_TESTS_NO_SKIP:-1}" \
  "$python" -m pytest -q -p no:cacheprovider python/tests --junitxml "$results/pytest-asan.xml" "$@"
