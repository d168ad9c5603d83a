#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what building, testing, benchmarking and plotting need, from
# Debian 12 packages, when any of it is missing.  Needs root (or sudo).
set -euo pipefail

# cargo, rustc and librust-cc-dev: the Rust bindings (bindings/rust builds
# offline from Debian's packaged crates); scdoc: the man pages; man-db:
# the install test renders them with man -l; clang: the public headers
# are checked with clang's warnings too (tests/compile).
packages=(build-essential clang cmake ninja-build pkg-config liburcu-dev valgrind spin
          python3 python3-matplotlib cargo rustc librust-cc-dev scdoc man-db
          # musl-gcc, and the oldest gcc and clang Debian 12 has: the library
          # compiles with each (tests/compile/check_compilers.sh), and clang
          # 13 compiles the fast paths (tests/CMakeLists.txt, clang13_)
          musl-tools gcc-11 clang-13
          # aarch64: cross toolchain, Debian's arm64 liburcu and C++ runtime
          # (multiarch), qemu-user to run the tests (scripts/test.sh)
          gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross
          liburcu-dev:arm64 libstdc++6:arm64 qemu-user-static)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
