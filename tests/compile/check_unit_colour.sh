#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# PERCPUREF_UNIT_COLOUR (include/percpuref/this_cpu.h) moves every CPU's
# copy of a counter, and the header's inline sequences compute that address:
# a program built with another value than its library's would add to the
# wrong words.  So the variables the sequences read are named after it.
# Checks, against a library built without it: that a program built without
# it links; that one built with it fails to link, naming the renamed
# variable; that a value not a multiple of 64 stops at the header's #error.
# Usage: check_unit_colour.sh CC INCLUDE_DIR LIBRARY
set -u
cc=$1
include=$2
library=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/consumer.c" <<'SRC'
#include <percpuref/percpu_ref.h>
static void release(struct percpu_ref *ref) { (void)ref; }
int main(void)
{
	struct percpu_ref ref;

	if (percpu_ref_init(&ref, release, 0))
		return 1;
	percpu_ref_get(&ref);
	percpu_ref_put(&ref);
	percpu_ref_kill(&ref);
	percpu_ref_exit(&ref);
	return 0;
}
SRC
status=0
build() {
	"$cc" -pthread -I"$include" "$@" "$work/consumer.c" -o "$work/consumer" "$library" 2>&1
}
if out=$(build); then
	echo "ok - a program built with the library's colour (none) links"
else
	echo "not ok - a program built with the library's colour does not link: $out"
	status=1
fi
out=$(build -DPERCPUREF_UNIT_COLOUR=64)
if [ $? -ne 0 ] && grep -q '_coloured' <<<"$out"; then
	echo "ok - a program built with PERCPUREF_UNIT_COLOUR=64 fails to link, naming the coloured variable"
else
	echo "not ok - a program built with another colour was not refused: $out"
	status=1
fi
out=$(build -DPERCPUREF_UNIT_COLOUR=100)
if [ $? -ne 0 ] && grep -q 'PERCPUREF_UNIT_COLOUR: a multiple of 64' <<<"$out"; then
	echo "ok - a colour not a multiple of 64 stops at the header's #error"
else
	echo "not ok - PERCPUREF_UNIT_COLOUR=100 was not refused: $out"
	status=1
fi
exit $status
