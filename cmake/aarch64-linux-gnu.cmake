# SPDX-License-Identifier: MIT
# Cross build for aarch64 with Debian's cross toolchain (gcc-aarch64-linux-gnu,
# g++-aarch64-linux-gnu) against Debian's arm64 liburcu (liburcu-dev:arm64,
# multiarch); tests run under qemu-user (qemu-user-static).  See
# scripts/deps.sh and scripts/test.sh.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# The tests load the multiarch libc6:arm64, whose ld.so and libc.so.6 match:
# run them with no QEMU_LD_PREFIX.  A prefix of /usr/aarch64-linux-gnu makes
# qemu take the cross package's ld.so with the multiarch libc (the prefix
# has no ld.so.cache), a mismatched pair whose first pthread_create spins
# for ever, with or without this library.  One program, not a list: the
# tests spawn it themselves (PERCPUREF_TEST_EMULATOR, tests/CMakeLists.txt).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# The arm64 .pc files only; never the build machine's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
