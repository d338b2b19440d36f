#!/usr/bin/env bash
# Concurrency soak under ThreadSanitizer (issue 15, item 4): builds test_soak with the "tsan"
# preset and runs it with many rounds (4 caller threads of random GDN/KDA problems, paths, thread
# counts and plans against the fp64 reference; two models run from 4 threads). Any data race
# TSan reports fails the run (halt_on_error).
#
#   scripts/soak.sh [ROUNDS]     (default 200 rounds per caller thread)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-200}"
nice -n 5 cmake --preset tsan >/dev/null
nice -n 5 cmake --build --preset tsan --target test_soak
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" HANPU_SOAK_ROUNDS="$rounds" \
  HANPU_SOURCE_DIR="$PWD" build/tsan/tests/test_soak
