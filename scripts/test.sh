#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every test: installs dependencies, then builds and runs the suite in
# three configurations (plain, ASan+UBSan, TSan).  Each runs every test on
# the three fast paths: glibc's rseq, the library's own rseq areas
# (GLIBC_TUNABLES=glibc.pthread.rseq=0) and the fallback (PERCPUREF_NO_RSEQ=1).
# The plain build also runs them under valgrind's leak check, the SPIN
# models, and checks the installed library through pkg-config and CMake.
# Then cargo test of the Rust bindings (unit tests and doctests, and a
# build of each declaration made wrong, which must fail), with
# Debian's cargo and rustc (/usr/bin, whatever else is on PATH: cargo runs
# the rustc it finds first, and a rustup one would hide that the crates
# must build with the Rust 1.63 a fresh Debian 12 has).  Then an
# aarch64 cross build runs the suite under qemu-user (the fallback path:
# qemu-user has no rseq) and the aarch64 rseq sequence is compiled.
# STRESS_SECONDS bounds each stress test (default here 8 s, 4 s under
# qemu; valgrind runs 1 s).
# Then kernel/run.sh builds the kernel patch series on linux-source-6.12 and
# runs checkpatch, its KUnit suites (UML and x86_64 under qemu) and its boot
# test; KERNEL_TESTS=0 skips that part.  As root, its source is installed,
# unpacked and patched in the background meanwhile (kernel/run.sh
# --prepare, niced, log in build/kernel-prepare.log): a minute of one CPU
# off the run's length.  (Not as another user: sudo would ask for a
# password where nobody sees it.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
export STRESS_SECONDS=${STRESS_SECONDS:-8}

kernel_prepare=""
if [ "${KERNEL_TESTS:-1}" != 0 ] && [ "$(id -u)" -eq 0 ]; then
  mkdir -p build
  # Its own process group (setsid), so that an early exit stops its tar,
  # git and apt too, not only the shell that runs them.
  setsid nice -n 19 kernel/run.sh --prepare >build/kernel-prepare.log 2>&1 </dev/null &
  kernel_prepare=$!
  trap 'kill -- -"$kernel_prepare" 2>/dev/null || true' EXIT
fi

jobs=$(nproc)
# configure_and_build DIR CMAKE_ARGS...: false if either step fails.
configure_and_build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null &&
    cmake --build "$dir" -j "$jobs"
}
# A stage that fails is named at the end, and the others still run: a
# build that failed (one sanitizer's, say) ended the script at once.
failed=()
for variant in plain address thread; do
  dir=build/test-$variant
  sanitize=$([ $variant = plain ] && echo "" || echo $variant)
  echo "=== $variant build"
  if ! configure_and_build "$dir" -DPERCPUREF_SANITIZE="$sanitize"; then
    failed+=("$variant build")
    continue
  fi
  # halt_on_error: a sanitizer report fails the test even if it recovers.
  if ! ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
       TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
       ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900; then
    failed+=("$variant tests")
  fi
done

echo "=== rust bindings"
if ! (cd bindings/rust && CARGO_TARGET_DIR="$PWD/../../build/cargo" RUSTC=/usr/bin/rustc \
      RUSTDOC=/usr/bin/rustdoc /usr/bin/cargo test --offline); then
  failed+=("rust bindings")
fi
# build.rs's checks of the declarations against the headers can fail.
if ! bindings/rust/check_build_refusals.sh; then
  failed+=("rust bindings: build refusals")
fi

# Scripts that run the binary directly (no emulator) and the host
# install check (a host consumer) do not apply to a cross build.
dir=build/test-aarch64
echo "=== aarch64 cross build, tests under qemu-user"
if ! configure_and_build "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
                         -DVALGRIND=VALGRIND-NOTFOUND -DSPIN=SPIN-NOTFOUND; then
  failed+=("aarch64 build")
elif ! STRESS_SECONDS=$(( STRESS_SECONDS < 4 ? STRESS_SECONDS : 4 )) \
       ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900 \
             -E '^(install_check|bench_cli|bench_topology|bench_bundle|bench_py_tools)$'; then
  failed+=("aarch64 tests")
fi
echo "=== aarch64 rseq sequence (PERCPUREF_ARM64_RSEQ=ON): compiled, not run"
if ! configure_and_build build/test-aarch64-rseq -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
                         -DPERCPUREF_ARM64_RSEQ=ON -DVALGRIND=VALGRIND-NOTFOUND -DSPIN=SPIN-NOTFOUND; then
  failed+=("aarch64 rseq build")
fi

if [ "${KERNEL_TESTS:-1}" != 0 ]; then
  echo "=== kernel series"
  if [ -n "$kernel_prepare" ]; then
    # A failed preparation is repeated, and reported, by the full run.
    wait "$kernel_prepare" || true
    trap - EXIT
    cat build/kernel-prepare.log
  fi
  kernel/run.sh || failed+=("kernel series")
fi
if [ ${#failed[@]} -ne 0 ]; then
  printf '=== FAILED stages:'
  printf ' [%s]' "${failed[@]}"
  printf '\n'
  exit 1
fi
echo "=== every stage passed"
