#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check_build_refusals.sh - percpuref-sys's build.rs checks src/lib.rs
# against the C headers (a prototype, a function type, a constant); this
# shows that each check can fail.  A copy of the workspace is built once as
# it is (it must build), then once per declaration made wrong: the build
# must fail with the static assertion that names it, or with build.rs's
# refusal of what it cannot check; and once with a const fn and a
# commented-out constant, which it must leave alone.  Run from anywhere;
# uses Debian's cargo and rustc, offline, as scripts/test.sh does.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# build NAME [SED]: builds a copy of the workspace whose src/lib.rs went
# through SED; its output in $tmp/NAME.log, its exit status returned.
build() {
	rm -rf "$tmp/rust"
	cp -r "$here" "$tmp/rust"
	[ $# -lt 2 ] || sed -i "$2" "$tmp/rust/percpuref-sys/src/lib.rs"
	(cd "$tmp/rust" && PERCPUREF_SOURCE_DIR="$repo" CARGO_TARGET_DIR="$repo/build/cargo-refusals" \
		RUSTC=/usr/bin/rustc /usr/bin/cargo build --offline -p percpuref-sys) \
		>"$tmp/$1.log" 2>&1
}

# refused WHAT SED MESSAGE: the build with SED applied fails, saying MESSAGE.
refused() {
	if ! grep -q . <(sed -n "$2p" "$here/percpuref-sys/src/lib.rs"); then
		echo "FAIL: $1: the edit matches nothing in src/lib.rs (out of date?)"
		fails=$((fails + 1))
	elif build "$1" "$2"; then
		echo "FAIL: $1: the build passed"
		fails=$((fails + 1))
	elif grep -qF "$3" "$tmp/$1.log"; then
		echo "ok: $1: refused, \"$3\""
	else
		echo "FAIL: $1: the build failed, but not saying \"$3\":"
		grep -m3 'error' "$tmp/$1.log" | sed 's/^/  /'
		fails=$((fails + 1))
	fi
}

if build unchanged; then
	echo "ok: the crate as it is builds"
else
	echo "FAIL: the crate as it is does not build:"
	tail -5 "$tmp/unchanged.log" | sed 's/^/  /'
	exit 1
fi
refused "a constant with another value" 's/pub const EALREADY: c_int = 114;/pub const EALREADY: c_int = 113;/' \
	"src/lib.rs: const EALREADY is not the C headers' value"
refused "a flag with another value" 's/pub const PERCPU_REF_INIT_DEAD: c_uint = 1 << 1;/pub const PERCPU_REF_INIT_DEAD: c_uint = 1 << 3;/' \
	"src/lib.rs: const PERCPU_REF_INIT_DEAD is not the C headers' value"
refused "a parameter of another type" 's/pub fn percpu_ref_poll(flags: c_uint) -> c_int;/pub fn percpu_ref_poll(flags: c_int) -> c_int;/' \
	"src/lib.rs: fn percpu_ref_poll disagrees with its C prototype"
refused "a return of another type" 's/pub fn percpu_ref_is_zero(r: \*mut percpu_ref) -> bool;/pub fn percpu_ref_is_zero(r: *mut percpu_ref) -> c_int;/' \
	"src/lib.rs: fn percpu_ref_is_zero disagrees with its C prototype"
refused "a function type with another parameter" 's/pub type percpu_ref_func_t = unsafe extern "C" fn(\*mut percpu_ref);/pub type percpu_ref_func_t = unsafe extern "C" fn(*mut c_void);/' \
	"src/lib.rs: type percpu_ref_func_t"
refused "a constant C has no counterpart for" 's/^pub const EPERM: c_int = 1;/&\npub const ABI_WORDS: usize = 8;/' \
	"only c_int and c_uint constants have a C counterpart here"
refused "a value C would read otherwise" 's/pub const PERCPU_REF_POLL_WAIT: c_uint = 1;/pub const PERCPU_REF_POLL_WAIT: c_uint = 1u32;/' \
	"the value must be a number, or a number shifted left by one"
refused "a constant under #[cfg]" 's/^pub const EDEADLK: c_int = 35;/#[cfg(target_arch = "mips")]\npub const EDEADLK: c_int = 45;\n#[cfg(not(target_arch = "mips"))]\n&/' \
	"has a #[cfg]: build.rs checks every constant on every target"
# ... while what is no constant of C's is left alone: a const fn, and a
# declaration in a block comment.
what="a const fn and a commented-out constant"
if build accepted 's/^pub const EPERM: c_int = 1;/&\npub const fn percpuref_sys_flag(x: c_uint) -> c_uint { x }\n\/* pub const GONE: c_uint = 8; *\//'; then
	echo "ok: $what: built"
else
	echo "FAIL: $what: refused:"
	grep -m3 'error\|panicked' "$tmp/accepted.log" | sed 's/^/  /'
	fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
