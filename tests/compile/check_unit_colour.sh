#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# PERCPUREF_UNIT_COLOUR (include/percpuref/this_cpu.h) moves every CPU's
# copy of a counter, and the header's inline sequences compute that address:
# a program built with another value than its library's would add to the
# wrong words.  So the variables the sequences read carry the value in
# their names.  With the install check's consumer (tests/install/consumer.c)
# against the library: built with the library's value it links; built with
# another (none, or 64 more or less) it fails to link, naming such a
# variable, wherever the header inlines a sequence (aarch64 without
# PERCPUREF_ARM64_RSEQ inlines none: the library computes every address);
# a value not a multiple of 64, or one in parentheses, stops at the
# header's #error.
# Usage: check_unit_colour.sh CC NM INCLUDE_DIR LIBRARY LIBRARY_COLOUR [ARG...]
# ARGs: what else a consumer of the library is compiled and linked with
# (liburcu's include directories and libraries, the library's other public
# definitions: PERCPUREF_ARM64_RSEQ).
set -u
if (($# < 5)) || [ -z "$1" ] || [ -z "$2" ]; then
	echo "usage: check_unit_colour.sh CC NM INCLUDE_DIR LIBRARY LIBRARY_COLOUR [ARG...]" >&2
	exit 2
fi
cc=$1
nm=$2
include=$3
library=$4
colour=$5
shift 5
consumer=$(dirname "$0")/../install/consumer.c
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
status=0
flag() { (($1)) && echo "-DPERCPUREF_UNIT_COLOUR=$1"; }
# The ARGs sorted: -I and -D flags compile, the rest link; empty ones (a
# definition the build has not) dropped.
cflags=() libs=()
for arg; do
	case $arg in
	"") ;;
	-I* | -D*) cflags+=("$arg") ;;
	*) libs+=("$arg") ;;
	esac
done
build() {
	"$cc" -pthread -I"$include" $(flag "$1") "${cflags[@]}" "$consumer" -o "$work/consumer" \
		"$library" "${libs[@]}" 2>&1
}
# refused COLOUR PATTERN WHAT: building with COLOUR must fail, saying PATTERN.
refused() {
	local out
	if out=$(build "$1"); then
		echo "not ok - $3: it built"
		status=1
	elif grep -Eq -- "$2" <<<"$out"; then
		echo "ok - $3"
	else
		echo "not ok - $3, but not for that reason: $out"
		status=1
	fi
}
if out=$(build "$colour"); then
	echo "ok - built with the library's colour ($colour), a program links"
else
	echo "not ok - built with the library's colour ($colour), a program does not link: $out"
	status=1
fi
others=$( ((colour)) && echo 0 || echo 64)
((colour + 64 < 65536)) && others+=" $((colour + 64))"
((colour >= 64)) && others+=" $((colour - 64))"
for other in $(tr ' ' '\n' <<<"$others" | sort -un); do
	if ! out=$("$cc" -c -I"$include" $(flag "$other") "${cflags[@]}" "$consumer" -o "$work/consumer.o" 2>&1); then
		echo "not ok - colour $other: the consumer does not compile: $out"
		status=1
		continue
	fi
	if ! "$nm" -u "$work/consumer.o" | grep -Eq 'percpuref_(this_cpu_params|nr_cpu_units)'; then
		echo "ok - # skip colour $other: no inline sequence here reads the layout"
		continue
	fi
	refused "$other" 'percpuref_(this_cpu_params|nr_cpu_units)' \
		"built with colour $other against the library's $colour, it fails to link"
done
refused 100 'PERCPUREF_UNIT_COLOUR: a multiple of 64' \
	"a colour not a multiple of 64 stops at the header's #error"
refused '(64)' 'PERCPUREF_UNIT_COLOUR: spell it as a plain decimal' \
	"a parenthesised colour stops at the header's #error, not at the names' pasting"
exit $status
