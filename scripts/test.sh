#!/usr/bin/env bash
# Runs every test: installs dependencies, then builds and runs the suite in
# three configurations (plain, ASan+UBSan, TSan).  The plain build also runs
# each test on the fallback fast path (PERCPUREF_NO_RSEQ=1), under valgrind's
# leak check, and checks the installed library through pkg-config and
# CMake.  Then cargo test of the Rust bindings (unit tests and doctests),
# with Debian's cargo (/usr/bin/cargo, whatever else is on PATH).
# STRESS_SECONDS bounds each stress test (default here 8 s; valgrind runs 1 s).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
export STRESS_SECONDS=${STRESS_SECONDS:-8}

jobs=$(nproc)
status=0
for variant in plain address thread; do
  dir=build/test-$variant
  sanitize=$([ $variant = plain ] && echo "" || echo $variant)
  echo "=== $variant build"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DPERCPUREF_SANITIZE="$sanitize" >/dev/null
  cmake --build "$dir" -j "$jobs"
  # halt_on_error: a sanitizer report fails the test even if it recovers.
  if ! ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
       TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
       ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900; then
    status=1
  fi
done

echo "=== rust bindings"
if ! (cd bindings/rust && CARGO_TARGET_DIR="$PWD/../../build/cargo" /usr/bin/cargo test --offline); then
  status=1
fi
exit $status
