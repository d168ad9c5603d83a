#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds and tests the kernel series in kernel/patches/ on Debian 12's
# linux-source-6.12:
#   1. installs the source and the build packages with apt if missing;
#   2. unpacks the source into kernel/build/ (git-ignored, reused) as a git
#      tree whose "base" tag tracks the licences, the headers and the files
#      the series reads, and ignores the rest;
#   3. applies the series with git am (left alone when the tree already
#      holds exactly this series, so that builds stay incremental);
#   4. runs scripts/checkpatch.pl --strict on every patch (fails on errors);
#   5. runs the KUnit suites on UML (one CPU) and on x86_64 under qemu (TCG,
#      2 CPUs, CONFIG_SMP=y);
#   6. builds every C file the series creates or changes with W=1 and
#      sparse (C=2) in that x86_64 tree, and fails on a warning the
#      unpatched source does not give (sparse-base.txt, compared line by
#      line, not counted);
#   7. boots that x86_64 kernel under qemu with 2 CPUs and the static init of
#      kernel/boot/init.c, and fails if any of its checks fails.
#
# --prepare: steps 2-3 (step 1 only checks: missing packages fail it), then
# the two KUnit kernels built (kunit.py build, UML then x86_64), and no
# test.  scripts/test.sh runs it in the background at the lowest priority while the userspace suites run: it
# takes the CPU time they leave idle (cmake's configure steps, links, tests
# that sleep), and step 5's builds then find little or nothing left to do.
# A build that fails here is only logged: step 5 builds again and reports.
#
# --install: step 1 alone.  scripts/test.sh runs it first, before the
# userspace suites' packages are installed, so that the preparation can
# run while they are (apt's lock admits one installation at a time).
#
# --prefixes (not part of the test command): builds the x86_64 kernel for
# every prefix of the series and boots the unpatched and the fully patched
# kernel, printing the boot checks whose results differ.
#
# Environment: JOBS (default nproc), KERNEL_BUILD (default kernel/build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${KERNEL_BUILD:-$here/build}
# Absolute: kunit.py runs in the source tree (its --build_dir, make's O=),
# the logs, the .config check and boot_test read from here; a relative
# KERNEL_BUILD built the kernels under the source and booted nothing.
[[ $build == /* ]] || build=$PWD/$build
src=$build/linux-source-6.12
jobs=${JOBS:-$(nproc)}
if ! [[ $jobs =~ ^[1-9][0-9]{0,3}$ ]]; then
	echo "kernel/run.sh: JOBS=$jobs: want a whole number of jobs, 1 to 9999" >&2
	exit 2
fi
kunitconfig=$here/percpuref.kunitconfig
x86config=$here/x86_64.kunitconfig
kernel_args=(lsm=apparmor)
boot_append="console=ttyS0 panic=-1 lsm=apparmor kunit.enable=0 rdinit=/init"

log() { printf '=== kernel: %s\n' "$*" >&2; }
now() { date +%s; }

install_deps() {
	local packages=(linux-source-6.12 build-essential bc bison flex libelf-dev
			libssl-dev cpio xz-utils python3 python3-ply python3-git git kmod
			qemu-system-x86 sparse)
	local missing=() p sudo=""
	for p in "${packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
			grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return
	# The background preparation runs beside scripts/deps.sh's apt: it
	# installs nothing (--install did); the full run installs and reports.
	if [ "${1:-}" = --prepare ]; then
		log "missing ${missing[*]}: not installed by --prepare"
		return 1
	fi
	log "installing ${missing[*]}"
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# untar_source DIR: Debian's linux-source-6.12 tarball, unpacked as DIR
# (through DIR.tmp: a DIR is always whole).
untar_source() {
	local dir=$1
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp"
	tar -xf /usr/src/linux-source-6.12.tar.xz -C "$dir.tmp"
	mv "$dir.tmp/linux-source-6.12" "$dir"
	rmdir "$dir.tmp"
}

unpack() {
	# The tag is the last step: a tree whose unpacking was cut short is
	# unpacked again.
	git --git-dir="$src/.git" rev-parse -q --verify refs/tags/base >/dev/null 2>&1 && return
	log "unpacking linux-source-6.12 into $build"
	rm -rf "$src"
	untar_source "$src"
	# git tracks only what it must, everything else being ignored:
	# adding all 90,000 files cost a minute of CPU, and their loose
	# objects a background "git gc" after git am, both taken from the
	# test suites running meanwhile.  What it must: the files the series
	# reads (cover_series_paths), and what checkpatch reads through git,
	# the licences (spdxcheck.py: without them it fails on stderr and
	# passes every SPDX line) and the headers (the CamelCase names it
	# knows).
	git -C "$src" init -q
	echo '*' >"$src/.git/info/exclude"
	git -C "$src" config status.showUntrackedFiles no
	git -C "$src" add -f LICENSES include
	git -C "$src" -c user.name=base -c user.email=base@localhost \
		commit -q -m "linux-source-6.12 (Debian): licences, headers, the files the series reads"
	git -C "$src" tag base
}

series() { ls "$here"/patches/[0-9][0-9][0-9][0-9]-*.patch | grep -v /0000-; }

# The files of the source the series reads: those it modifies, deletes,
# renames or copies, not those it creates (new files, the targets of
# renames and copies) or an earlier patch created.  A name with spaces is
# read whole; one git quotes (unusual characters) is left out, and git am
# then stops on it, naming it.
series_paths() {
	# shellcheck disable=SC2046
	awk '
	function flush() { if (p != "" && !(p in made)) print p; p = "" }
	/^diff --git a\// {
		flush()
		# "a/X b/X" (a rename: "a/X b/Y", named below)
		if (match($0, /^diff --git a\/.* b\//) &&
		    substr($0, 14, RLENGTH - 16) == substr($0, RLENGTH + 1))
			p = substr($0, RLENGTH + 1)
		next
	}
	/^new file mode / { made[p] = 1; p = ""; next }
	/^(rename|copy) from / { p = substr($0, index($0, " from ") + 6); next }
	/^(rename|copy) to / { made[substr($0, index($0, " to ") + 4)] = 1; next }
	END { flush() }' $(series) | sort -u
}

# Adds to the base commit the files the series reads that it does not
# track yet (a tree unpacked before this scheme tracks them all).  An
# untracked file is as unpacked: git am patches only files in its index,
# and a file the series creates is tracked from then on.  A file left
# where the series creates one (git am killed between writing it and its
# index) is not the source's: git am stops on it, naming it.  Files the
# series never reads are not looked at: an edit of one stays.
cover_series_paths() {
	local p missing=() index tree commit
	while read -r p; do
		[ -f "$src/$p" ] &&
		! git -C "$src" cat-file -e "base:$p" 2>/dev/null &&
		! git -C "$src" ls-files --error-unmatch -- "$p" >/dev/null 2>&1 &&
			missing+=("$p")
	done < <(series_paths)
	[ ${#missing[@]} -eq 0 ] && return
	log "base: tracking ${#missing[@]} more files of the source"
	index=$(mktemp)
	GIT_INDEX_FILE=$index git -C "$src" read-tree base
	GIT_INDEX_FILE=$index git -C "$src" add -f -- "${missing[@]}"
	tree=$(GIT_INDEX_FILE=$index git -C "$src" write-tree)
	rm -f "$index"
	commit=$(git -C "$src" -c user.name=base -c user.email=base@localhost \
		commit-tree "$tree" -p base -m "base: $(printf '%s ' "${missing[@]}")")
	git -C "$src" tag -f base "$commit" >/dev/null
}

# The tree the first $1 patches make, applied to a scratch index.
series_tree() {
	local n=$1 index p i=0
	index=$(mktemp)
	GIT_INDEX_FILE=$index git -C "$src" read-tree base
	for p in $(series); do
		[ "$i" -lt "$n" ] || break
		GIT_INDEX_FILE=$index git -C "$src" apply --cached "$p" || { rm -f "$index"; return 1; }
		i=$((i + 1))
	done
	GIT_INDEX_FILE=$index git -C "$src" write-tree
	rm -f "$index"
}

# Applies the first $1 patches (default: all) unless the tree holds them.
# Files whose content the new series leaves as it was keep their mtime, so
# make rebuilds only what changed (percpu-refcount.h is everywhere).
apply_series() {
	local n=${1:-$(series | wc -l)} want f
	local -A stamp
	cover_series_paths
	# A patch that does not apply: git am below names it.
	want=$(series_tree "$n") || want=none
	if [ "$(git -C "$src" rev-parse 'HEAD^{tree}')" = "$want" ] &&
	   git -C "$src" diff --quiet HEAD; then
		log "tree already holds the first $n patches ($(git -C "$src" rev-parse --short HEAD))"
		return
	fi
	log "applying the first $n patches with git am"
	for f in $(git -C "$src" diff --name-only base; git -C "$src" diff --name-only base HEAD); do
		[ -f "$src/$f" ] &&
			stamp[$f]="$(git -C "$src" hash-object "$f") $(stat -c %Y "$src/$f")"
	done
	git -C "$src" am --abort >/dev/null 2>&1 || true
	# No "git clean": the untracked files are the source.
	git -C "$src" checkout -q -f -B series base
	if [ "$n" -gt 0 ]; then
		# shellcheck disable=SC2046
		git -C "$src" -c user.name=percpuref -c user.email=percpuref@localhost \
			am -q $(series | head -n "$n")
	fi
	for f in "${!stamp[@]}"; do
		[ -f "$src/$f" ] &&
		[ "$(git -C "$src" hash-object "$f")" = "${stamp[$f]% *}" ] &&
			touch -d "@${stamp[$f]#* }" "$src/$f"
	done
	return 0
}

run_checkpatch() {
	local p out errors=0 warnings=0 checks=0 e w c
	for p in $(series); do
		# Debian's python3 has python3-ply for checkpatch's spdxcheck.py
		out=$(cd "$src" && PATH=/usr/bin:$PATH ./scripts/checkpatch.pl --strict \
			--show-types "$p" 2>&1 || true)
		e='' w='' c=''
		read -r e w c < <(sed -n 's/^total: \([0-9]*\) errors, \([0-9]*\) warnings, \([0-9]*\) checks.*/\1 \2 \3/p' <<<"$out")
		# A checkpatch that ended early, or whose helper failed (a
		# spdxcheck.py that fails passes every SPDX line): an error.
		if [ -z "$e" ] || grep -q '^Traceback' <<<"$out"; then
			printf 'checkpatch %s: did not run through:\n' "$(basename "$p")"
			{ grep -E '^[A-Za-z.]*(Error|Exception)\b' <<<"$out" | sort -u ||
			  tail -n 5 <<<"$out"; } | sed 's/^/    /'
			e=$((${e:-0} + 1)) w=${w:-0} c=${c:-0}
		fi
		printf 'checkpatch %s: %s errors, %s warnings, %s checks\n' \
			"$(basename "$p")" "$e" "$w" "$c"
		grep -E '^(ERROR|WARNING|CHECK):' <<<"$out" | sed 's/^/    /' || true
		errors=$((errors + e)) warnings=$((warnings + w)) checks=$((checks + c))
	done
	printf 'checkpatch total: %d errors, %d warnings, %d checks\n' \
		"$errors" "$warnings" "$checks"
	[ "$errors" -eq 0 ]
}

# The kunit.py options that choose each kernel (its architecture, build
# directory, configuration), for its build and for its run.
uml_opts=(--build_dir="$build/uml" --kunitconfig="$kunitconfig")
x86_opts=(--arch=x86_64 --build_dir="$build/x86" --kunitconfig="$kunitconfig"
	  --kunitconfig="$x86config")

# kunit_py LOG VERB OPTS...: tools/testing/kunit/kunit.py VERB in the
# source tree, its output in LOG; its exit status.
kunit_py() {
	local out=$1 verb=$2; shift 2
	(cd "$src" && python3 tools/testing/kunit/kunit.py "$verb" --jobs="$jobs" "$@") \
		>"$out" 2>&1
}

# prebuild WHAT OPTS...: kunit.py build, logged; never fails.
prebuild() {
	local what=$1 t0 status=0; shift
	t0=$(now)
	kunit_py "$build/kunit-$what-prebuild.log" build "$@" || status=$?
	log "$what kernel built ahead: exit $status, $(($(now) - t0)) s (log: $build/kunit-$what-prebuild.log)"
}

kunit() {
	local what=$1; shift
	local t0 status=0
	t0=$(now)
	kunit_py "$build/kunit-$what.log" run --timeout=900 \
		"${kernel_args[@]/#/--kernel_args=}" "$@" || status=$?
	grep -E '=+ .*(percpu|apparmor|ucounts).* =+$|Testing complete|Elapsed time|FAILED|CRASHED|SKIPPED' \
		"$build/kunit-$what.log" || true
	# what passing cases report: the torture verdicts, the CPUs used
	grep -a -E '# torture.*: busted|get/put pairs on' "$build/$what/test.log" || true
	log "KUnit on $what: exit $status, $(($(now) - t0)) s (log: $build/kunit-$what.log)"
	return $status
}

kunit_uml() { kunit uml "${uml_opts[@]}"; }

kunit_x86() { kunit x86 "${x86_opts[@]}" --qemu_args='-smp 2'; }

# The C files the series creates or changes.
series_c_files() {
	local patches
	patches=$(series)
	[ -n "$patches" ] && grep -h '^+++ b/.*\.c$' $patches | sed 's|^+++ b/||' | LC_ALL=C sort -u
}

# sparse_warnings FILE: the warnings (and errors) that W=1 and sparse
# (make C=2) give in the source's files while building FILE's object in the
# x86_64 test kernel's tree, as "FILE: PATH: warning: TEXT" lines without
# the line and column (a line the series moves keeps its warning), sorted;
# the build's own output on standard error when it fails.
sparse_warnings() {
	local f=$1 out
	out=$(make -C "$src" O="$build/x86" ARCH=x86_64 C=2 W=1 "${f%.c}.o" 2>&1) ||
		{ printf '%s\n' "$out" >&2; return 1; }
	{ grep -E "^$src/[^:]*:[0-9]+:[0-9]+: (warning|error):" <<<"$out" || true; } |
		sed -E "s|^$src/([^:]*):[0-9]+:[0-9]+: |$f: \\1: |" | LC_ALL=C sort
}

# lines TEXT: TEXT as lines, each ended by a newline; nothing when empty.
lines() { [ -z "$1" ] || printf '%s\n' "$1"; }

# W=1 and sparse over the series' C files: a warning the unpatched source
# does not give (kernel/sparse-base.txt, those of its files that give any,
# with Debian 12's sparse 0.6.4), or one it gives more often, fails; a
# warning the series removes does not hide one it adds.
run_sparse() {
	local files f now base added status=0
	files=$(series_c_files) || true
	if [ -z "$files" ]; then
		echo "sparse: no C file in the series"
		return 1
	fi
	# The tree's own preparation once, outside any file's figures.
	if ! make -s -C "$src" O="$build/x86" ARCH=x86_64 prepare >"$build/sparse.log" 2>&1; then
		echo "sparse: make prepare failed (log: $build/sparse.log)"
		return 1
	fi
	for f in $files; do
		if ! now=$(sparse_warnings "$f" 2>"$build/sparse.log"); then
			printf 'sparse %s: the build failed:\n' "$f"
			tail -n 20 "$build/sparse.log" | sed 's/^/  /'
			status=1
			continue
		fi
		base=$(awk -v p="$f: " 'index($0, p) == 1' "$here/sparse-base.txt" | LC_ALL=C sort)
		added=$(LC_ALL=C comm -23 <(lines "$now") <(lines "$base"))
		printf 'sparse %s: %d warnings (unpatched %d)\n' "$f" "$(lines "$now" | wc -l)" \
			"$(lines "$base" | wc -l)"
		if [ -n "$added" ]; then
			printf '%s\n' "$added" | sed 's/^/  new: /'
			status=1
		fi
	done
	return $status
}

initramfs() {
	local dir=$build/boot
	mkdir -p "$dir"
	gcc -static -O2 -Wall -Wextra -Werror -o "$dir/init" "$here/boot/init.c"
	cat >"$dir/initramfs.list" <<-LIST
	dir /dev 0755 0 0
	nod /dev/console 0600 0 0 c 5 1
	file /init $dir/init 0755 0 0
	LIST
	"$build/x86/usr/gen_init_cpio" "$dir/initramfs.list" >"$dir/initramfs.cpio"
}

# Boots $1 (a bzImage) and leaves the BOOTTEST lines in $2.
boot() {
	local image=$1 out=$2 t0
	t0=$(now)
	timeout 600 qemu-system-x86_64 -nographic -no-reboot -bios qboot.rom -m 512 -smp 2 \
		-kernel "$image" -initrd "$build/boot/initramfs.cpio" \
		-append "$boot_append" </dev/null >"$out.log" 2>&1 || true
	grep -a '^BOOTTEST' "$out.log" | tr -d '\r' >"$out" || true
	log "boot of $image: $(($(now) - t0)) s (log: $out.log)"
}

boot_test() {
	local out=$build/boot/patched
	initramfs
	boot "$build/x86/arch/x86/boot/bzImage" "$out"
	cat "$out"
	grep -q '^BOOTTEST done: [0-9]* passed, 0 failed' "$out"
}

# Builds $2 (a source tree) for x86_64 in $1 from the test kernel's .config;
# options the tree does not know are dropped.
build_x86_plain() {
	local out=$1 tree=$2
	mkdir -p "$out"
	[ "$out" = "$build/x86" ] || cp "$build/x86/.config" "$out/.config"
	make -s -C "$tree" O="$out" ARCH=x86_64 olddefconfig >/dev/null
	make -s -C "$tree" O="$out" ARCH=x86_64 -j"$jobs" >"$out.log" 2>&1
}

prefixes() {
	local total i status=0
	total=$(series | wc -l)
	[ -f "$build/x86/.config" ] || kunit_x86 >/dev/null || true
	for ((i = total - 1; i >= 1; i--)); do
		apply_series "$i"
		log "building x86_64 with the first $i patches"
		if build_x86_plain "$build/x86" "$src"; then
			log "prefix $i builds"
		else
			log "prefix $i does not build (log: $build/x86.log)"
			status=1
		fi
	done
	apply_series
	log "building the x86_64 test kernel with the whole series"
	kunit_x86 || status=1
	initramfs
	[ -d "$build/linux-base" ] || untar_source "$build/linux-base"
	log "building the unpatched x86_64 kernel"
	build_x86_plain "$build/x86-base" "$build/linux-base" || status=1
	boot "$build/x86-base/arch/x86/boot/bzImage" "$build/boot/unpatched"
	boot "$build/x86/arch/x86/boot/bzImage" "$build/boot/patched"
	log "boot checks, unpatched (<) against patched (>):"
	diff <(sed 's/ (.*//' "$build/boot/unpatched") \
	     <(sed 's/ (.*//' "$build/boot/patched") || true
	return $status
}

main() {
	local t0 status=0 step
	# One at most: "--install --prefixes" ran --install alone, saying
	# nothing.  An empty one is refused too, as scripts/test.sh does: it
	# ran the whole series.
	case $#:${1-} in
	0: | 1:--install | 1:--prepare | 1:--prefixes) ;;
	*)
		echo "usage: kernel/run.sh [--install | --prepare | --prefixes]" >&2
		return 2 ;;
	esac
	t0=$(now)
	install_deps "${1:-}"
	[ "${1:-}" = --install ] && return
	unpack
	apply_series
	case ${1:-} in
	--prepare)
		log "prepared in $(($(now) - t0)) s"
		prebuild uml "${uml_opts[@]}"
		prebuild x86 "${x86_opts[@]}"
		return ;;
	--prefixes)
		prefixes
		return ;;
	esac
	for step in run_checkpatch kunit_uml kunit_x86 run_sparse boot_test; do
		log "$step"
		if ! "$step"; then
			log "$step FAILED"
			status=1
		fi
	done
	log "done in $(($(now) - t0)) s, status $status"
	return $status
}

main "$@"
