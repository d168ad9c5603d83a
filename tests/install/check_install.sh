#!/usr/bin/env bash
# Installs the build tree into a scratch DESTDIR under a prefix, then builds
# consumer.c against it with pkg-config, statically and dynamically, and runs
# both.  Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR="$stage" cmake --install "$build" --prefix /opt/percpuref >/dev/null
root="$stage/opt/percpuref"
pcdir=$(dirname "$(find "$root" -name percpuref.pc)")
libdir=$(cd "$pcdir/.." && pwd)
test -f "$root/include/percpuref/percpu_ref.h"
export PKG_CONFIG_PATH="$pcdir"
cc -o "$stage/consumer" "$src/tests/install/consumer.c" $(pkg-config --cflags --libs percpuref) \
   -Wl,-rpath,"$libdir"
"$stage/consumer"
cc -o "$stage/consumer-static" "$src/tests/install/consumer.c" \
   $(pkg-config --cflags percpuref) "$libdir/libpercpuref.a" $(pkg-config --libs --static percpuref | sed 's/-lpercpuref//')
"$stage/consumer-static"
echo "ok - installed headers, shared and static library, pkg-config"
