#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every test: installs dependencies, then builds and runs the suite in
# three configurations (plain, ASan+UBSan, TSan).  Each runs every test on
# the three fast paths: glibc's rseq, the library's own rseq areas
# (GLIBC_TUNABLES=glibc.pthread.rseq=0) and the fallback (PERCPUREF_NO_RSEQ=1);
# under the sanitizers the stress tests run on the first and the last
# (tests/CMakeLists.txt says why).
# The plain build also runs them under valgrind's leak check, the SPIN
# models, and checks the installed library through pkg-config and CMake.
# Then cargo test of the Rust bindings (unit tests and doctests, and a
# build of each declaration made wrong, which must fail), with
# Debian's cargo and rustc (/usr/bin, whatever else is on PATH: cargo runs
# the rustc it finds first, and a rustup one would hide that the crates
# must build with the Rust 1.63 a fresh Debian 12 has).  Then an
# aarch64 cross build runs the suite under qemu-user (the fallback path:
# qemu-user has no rseq) and the aarch64 rseq sequence is compiled.
# STRESS_SECONDS (whole seconds) bounds each stress test: 6 s by default in
# the plain build, half of it (rounded up) under the sanitizers, two thirds
# (rounded up) under qemu, 1 s under valgrind.  The sanitizers slow every
# access 2-15 times, so their runs see fewer interleavings a second than the
# plain build's; what they add (a race TSan sees without the two accesses
# colliding, a use ASan sees after a free) shows in fewer of them.  Under
# qemu, more: stress_deferred (a lost wake-up) and stress_hcount (a charge
# past the limit) catch their broken variants only there, where a
# sequentially consistent store may pass a later load, after thousands of
# rounds (4 s, as before).  The default was 8 s (4 s under the sanitizers
# and qemu) until the whole run took 27 m 13 s on the 2-vCPU guest; at 6 s
# it took 26 m 47 s there with a stress test more (the kernel's background
# builds take most of the CPU time the stress tests leave; the tracker's
# host ran the 8 s suite in 1,517 s).  A soak: STRESS_SECONDS=60.  Under qemu each test runs once, the
# fallback being the only fast path there.
# Each stage prints its wall time, and the last lines sum them up: the
# whole command must stay under ~25 minutes on 2 CPUs.
# Then kernel/run.sh builds the kernel patch series on linux-source-6.12 and
# runs checkpatch, its KUnit suites (UML and x86_64 under qemu), sparse and
# W=1 over the C files it touches, and its boot test; KERNEL_TESTS=0 skips that part.  As root, the kernel's packages are
# installed first (kernel/run.sh --install), and its source is then
# unpacked and patched, and its two KUnit kernels built, in the background
# from there on (kernel/run.sh --prepare, at nice 19 and idle I/O priority,
# log in build/kernel-prepare.log): it runs on the CPU time that installing
# the other packages and the userspace stages leave idle, and barely slows
# them.  On a fresh Debian 12 (a debootstrap chroot) installing the
# userspace packages took 132 s, a CPU's worth that the kernel's builds
# now share, where they started after it.  (Not as another user: sudo
# would ask for a password where nobody sees it.)
set -euo pipefail
cd "$(dirname "$0")/.."
# It takes no argument: "--help" or "--quick" started the whole run (apt,
# five builds, the kernel series as root), ignoring it.
if (($#)); then
  echo "usage: [STRESS_SECONDS=N] [KERNEL_TESTS=0|1] scripts/test.sh" >&2
  exit 2
fi
# Only 0 skipped the kernel series: "no", "false" or "off" ran it.
if [[ ${KERNEL_TESTS:-1} != [01] ]]; then
  echo "scripts/test.sh: KERNEL_TESTS=$KERNEL_TESTS: want 0 (skip the kernel series) or 1" >&2
  exit 2
fi
export STRESS_SECONDS=${STRESS_SECONDS:-6}
if ! [[ $STRESS_SECONDS =~ ^[1-9][0-9]{0,5}$ ]]; then
  echo "scripts/test.sh: STRESS_SECONDS=$STRESS_SECONDS: want whole seconds, 1 to 999999" >&2
  exit 2
fi

# stage NAME: starts timing a stage (and ends the previous one's); the
# times are printed at the end.
stage_names=()
stage_secs=()
stage_start=$SECONDS
stage() {
  if [ ${#stage_names[@]} -ne 0 ]; then
    stage_secs+=($((SECONDS - stage_start)))
  fi
  stage_names+=("$1")
  stage_start=$SECONDS
  echo "=== $1"
}

kernel_prepare=""
if [ "${KERNEL_TESTS:-1}" != 0 ] && [ "$(id -u)" -eq 0 ]; then
  stage "kernel series: its packages"
  # If apt fails here, the full run installs them again and reports it;
  # no preparation then, which would run apt beside deps.sh.
  if kernel/run.sh --install; then
    mkdir -p build
    # Its own process group (setsid), so that an early exit stops its tar,
    # git and make too, not only the shell that runs them.  A new session
    # is a new scheduler autogroup, and the kernel shares the CPUs fairly
    # between autogroups whatever their tasks' nice values (a niced build
    # got half the CPUs from the suites): the group itself is niced.
    setsid sh -c 'echo 19 2>/dev/null >/proc/self/autogroup
                  exec nice -n 19 ionice -c 3 kernel/run.sh --prepare' \
      >build/kernel-prepare.log 2>&1 </dev/null &
    kernel_prepare=$!
    trap 'kill -- -"$kernel_prepare" 2>/dev/null || true' EXIT
  fi
fi
stage "packages"
scripts/deps.sh

jobs=$(nproc)
half_stress_seconds=$(( (STRESS_SECONDS + 1) / 2 ))
qemu_stress_seconds=$(( (2 * STRESS_SECONDS + 2) / 3 ))
# configure_and_build DIR CMAKE_ARGS... [-- TARGETS...]: false if either
# step fails; every target without TARGETS.
configure_and_build() {
  local dir=$1 args=() targets=()
  shift
  while (($#)) && [ "$1" != -- ]; do
    args+=("$1")
    shift
  done
  (($#)) && shift && targets=(--target "$@")
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${args[@]}" >/dev/null &&
    cmake --build "$dir" -j "$jobs" "${targets[@]}"
}
# A stage that fails is named at the end, and the others still run: a
# build that failed (one sanitizer's, say) ended the script at once.
failed=()
for variant in plain address thread; do
  dir=build/test-$variant
  sanitize=$([ $variant = plain ] && echo "" || echo $variant)
  stress_seconds=$([ $variant = plain ] && echo "$STRESS_SECONDS" || echo "$half_stress_seconds")
  stage "$variant build"
  if ! configure_and_build "$dir" -DPERCPUREF_SANITIZE="$sanitize"; then
    failed+=("$variant build")
    continue
  fi
  stage "$variant tests (stress tests ${stress_seconds} s each)"
  # halt_on_error: a sanitizer report fails the test even if it recovers.
  if ! STRESS_SECONDS=$stress_seconds ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
       TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
       ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900; then
    failed+=("$variant tests")
  fi
done

stage "rust bindings"
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
stage "aarch64 cross build"
if ! configure_and_build "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
                         -DVALGRIND=VALGRIND-NOTFOUND -DSPIN=SPIN-NOTFOUND; then
  failed+=("aarch64 build")
else
  stage "aarch64 tests under qemu-user (stress tests ${qemu_stress_seconds} s each)"
  if ! STRESS_SECONDS=$qemu_stress_seconds \
       ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900 \
             -E '^(install_check|bench_cli|bench_topology|bench_bundle|bench_py_tools)$'; then
    failed+=("aarch64 tests")
  fi
fi
stage "aarch64 rseq sequence (PERCPUREF_ARM64_RSEQ=ON): compiled, not run"
# The libraries and the fast paths' unit test: what inlines the sequence
# (the whole tree took 25-52 s, its tests never run); and the same with
# the units spaced (PERCPUREF_UNIT_COLOUR, below: the sequence's madd).
for colour in 0 64; do
  dir=build/test-aarch64-rseq
  suffix=""
  if ((colour)); then
    dir+=-colour
    suffix=", units spaced"
  fi
  if ! configure_and_build "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
                           -DPERCPUREF_ARM64_RSEQ=ON -DPERCPUREF_UNIT_COLOUR=$colour \
                           -DVALGRIND=VALGRIND-NOTFOUND -DSPIN=SPIN-NOTFOUND \
                           -- percpuref percpuref_static test_fast_path stress_percpu_ref; then
    failed+=("aarch64 rseq build$suffix")
  fi
  # pkg-config's consumers get the choice the targets pass on: without it
  # they call the library for every get and put (it was missing).
  cflags=$(sed -n 's/^Cflags: //p' "$dir/percpuref.pc")
  if [[ " $cflags " != *" -DPERCPUREF_ARM64_RSEQ=1 "* ]] ||
     { ((colour)) && [[ " $cflags " != *" -DPERCPUREF_UNIT_COLOUR=$colour "* ]]; }; then
    echo "percpuref.pc's Cflags lack the build's defines: $cflags" >&2
    failed+=("aarch64 rseq percpuref.pc$suffix")
  fi
done
stage "measurement build options set otherwise: the layout's and the allocator's tests"
# The build options that change a layout, in one tree: the per-CPU units
# spaced (PERCPUREF_UNIT_COLOUR=64, which changes what the headers'
# sequences compute), the counters a cache line apart
# (PERCPUREF_COUNTER_STRIDE=64), magazines of 128 slots
# (PERCPUREF_MAGAZINE_SLOTS), one kept in a thread's own depot
# (PERCPUREF_THREAD_DEPOT_MAGAZINES) and 16 switch stripes
# (PERCPUREF_SWITCH_STRIPE_BITS: refs share them far more than with the
# default 2^14): docs/lent-16core.md measured with most of them.
# The tests of the layout and the allocator (which take the build's
# values from src/internal.h), the fast paths (gcc, static, clang where
# found), the managed refs and the stripes, on the three fast paths; the
# check that a program built with another colour fails to link; and the
# installed library's consumers (pkg-config, CMake: they must get the
# colour).  The whole tree, since the install needs it.  The last four
# are internal: CMAKE_C_FLAGS, as a measurement build sets them.
if ! configure_and_build build/test-options -DPERCPUREF_UNIT_COLOUR=64 \
                         "-DCMAKE_C_FLAGS=-DPERCPUREF_COUNTER_STRIDE=64 -DPERCPUREF_MAGAZINE_SLOTS=128 -DPERCPUREF_THREAD_DEPOT_MAGAZINES=1 -DPERCPUREF_SWITCH_STRIPE_BITS=4" \
                         -DVALGRIND=VALGRIND-NOTFOUND -DSPIN=SPIN-NOTFOUND; then
  failed+=("build options build")
elif ! ctest --test-dir build/test-options --output-on-failure -j "$jobs" --timeout 900 \
             -R '^((ownrseq_|norseq_)?(test_percpu_ref|test_alloc_sweep|test_unbacked_units|test_fast_path|static_test_fast_path|clang_test_fast_path|test_managed|stress_percpu_ref|stress_stripe_mates)|check_unit_colour|install_check)$'; then
  failed+=("build options tests")
fi

if [ "${KERNEL_TESTS:-1}" != 0 ]; then
  if [ -n "$kernel_prepare" ]; then
    stage "kernel series: what the background preparation has left to do"
    # A failed preparation is repeated, and reported, by the full run.
    wait "$kernel_prepare" || true
    trap - EXIT
    cat build/kernel-prepare.log
  fi
  stage "kernel series"
  kernel/run.sh || failed+=("kernel series")
fi
stage_secs+=($((SECONDS - stage_start)))
echo "=== wall time of each stage (s):"
for i in "${!stage_names[@]}"; do
  printf '%6d  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"
done
printf '%6d  in all (from the start, dependencies included)\n' "$SECONDS"
if [ ${#failed[@]} -ne 0 ]; then
  printf '=== FAILED stages:'
  printf ' [%s]' "${failed[@]}"
  printf '\n'
  exit 1
fi
echo "=== every stage passed"
