#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang, ASan + UBSan) and runs each for a bounded
# time, starting from the committed seeds in tests/fuzz/corpus/<target>/ (read-only; new inputs go
# to build/fuzz/corpus/<target>/) and the reproducers of past findings in
# tests/fuzz/regressions/<target>/ (replayed first, so a regression shows at once). Prints
# executions and findings per target; exits non-zero if any target found a crash, a leak, a
# sanitizer report or a timeout (the reproducer is kept in build/fuzz/findings/).
# docs/RELIABILITY.md records the figures.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, all targets)
#   FUZZ_JOBS=2 scripts/fuzz.sh 3600                        (long run, 2 processes per target)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(safetensors_header gguf_header gguf_model device_json plan_json config_json tokenizer_json tokenizer_encode chat_template json_schema tool_call_grammar anthropic_request)
jobs="${FUZZ_JOBS:-1}"

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (Debian: apt-get install clang libclang-rt-dev)" >&2; exit 2; }
nice -n 5 cmake --preset fuzz >/dev/null
nice -n 5 cmake --build --preset fuzz --target $(printf 'fuzz_%s ' "${targets[@]}")

# libFuzzer truncates every input, seeds included, to -max_len. 64 KiB covers the headers, JSON and
# text the other readers take; the whole-model GGUF seeds (the tiny goldens as files, 26-563 KiB)
# would be cut inside their tensor data, so that target never reached the model mapping past the
# header: it gets 1 MiB.
declare -A max_len=([gguf_model]=1048576)

mkdir -p build/fuzz/findings
status=0
printf '%-20s %12s %10s %8s %s\n' target executions exec/s corpus findings
for t in "${targets[@]}"; do
  work="build/fuzz/corpus/$t"
  mkdir -p "$work"
  log="build/fuzz/$t.log"
  # -jobs makes libFuzzer fork workers that log to ./fuzz-N.log; one job runs in this process.
  parallel=()
  [[ $jobs -gt 1 ]] && parallel=(-jobs="$jobs" -workers="$jobs")
  # -rss_limit_mb / -timeout: a reader using GBs or seconds on one input is a finding too.
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build/fuzz/tests/fuzz/fuzz_$t" "$work" "tests/fuzz/corpus/$t" $([[ -d tests/fuzz/regressions/$t ]] && echo "tests/fuzz/regressions/$t") \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len[$t]:-65536}" -print_final_stats=1 \
    "${parallel[@]}" -artifact_prefix="build/fuzz/findings/$t-" >"$log" 2>&1
  rc=$?
  set -e
  [[ $jobs -gt 1 ]] && cat fuzz-*.log >>"$log" 2>/dev/null && rm -f fuzz-*.log
  execs=$(grep -h 'stat::number_of_executed_units' "$log" | awk '{s+=$2} END {print s+0}')
  rate=$(grep -h 'stat::average_exec_per_sec' "$log" | awk '{s+=$2} END {print s+0}')
  corpus=$(find "$work" -type f | wc -l)
  findings=$(find build/fuzz/findings -name "$t-*" -type f | wc -l)
  printf '%-20s %12s %10s %8s %s\n' "$t" "$execs" "$rate" "$corpus" "$findings (exit $rc; log $log)"
  [[ $rc -eq 0 && $findings -eq 0 ]] || status=1
done
exit $status
