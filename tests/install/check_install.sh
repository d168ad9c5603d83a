#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the build tree into a scratch DESTDIR under a prefix, then builds
# consumer.c against it as users would: with pkg-config (shared and static)
# and with CMake's find_package (percpuref::percpuref and
# percpuref::percpuref_static), from a copy of the installed tree in another
# place, which proves both relocatable; and with the source built inside
# the user's project (add_subdirectory), by the same target names.  Runs every consumer, and renders
# every installed man page with man -l, and checks that every exported
# function has one; then the uninstall target.
# Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$(cd "$2" && pwd)
stage=$(mktemp -d)
# The installations below rewrite the build's install_manifest.txt, which
# its uninstall target reads: the user's own installation's is put back.
# So do those of one component's installations (install_manifest_*.txt),
# and the name of the last one's component (install_manifest.component).
# A copy that fails stops the test before any installation ('+': find
# fails with cp).
manifest="$build/install_manifest.txt"
mkdir "$stage/manifests.saved"
find "$build" -maxdepth 1 -name 'install_manifest*' -exec cp -p -t "$stage/manifests.saved" {} +
trap 'rm -f "$build"/install_manifest*
      find "$stage/manifests.saved" -type f -exec mv -f {} "$build" \;
      rm -rf "$stage"' EXIT
DESTDIR="$stage" cmake --install "$build" --prefix /opt/percpuref >/dev/null
# Moved after installation: nothing may remember /opt/percpuref.
mv "$stage/opt/percpuref" "$stage/moved"
root="$stage/moved"
pcdir=$(dirname "$(find "$root" -name percpuref.pc)")
libdir=$(cd "$pcdir/.." && pwd)
test -f "$root/include/percpuref/percpu_ref.h"
test -f "$root/include/percpuref/percpuref.hpp"

export PKG_CONFIG_PATH="$pcdir"
cc -o "$stage/consumer" "$src/tests/install/consumer.c" $(pkg-config --cflags --libs percpuref) \
   -Wl,-rpath,"$libdir"
"$stage/consumer"
cc -o "$stage/consumer-static" "$src/tests/install/consumer.c" \
   $(pkg-config --cflags percpuref) "$libdir/libpercpuref.a" $(pkg-config --libs --static percpuref | sed 's/-lpercpuref//')
"$stage/consumer-static"
echo "ok - pkg-config: shared and static consumers"
# The soname carries the minor version while the version is 0.x: a program
# built against another minor version must not load this library.
version=$(pkg-config --modversion percpuref)
want_soname="libpercpuref.so.${version%.*}"
soname=$(objdump -p "$libdir/libpercpuref.so" | sed -n 's/^ *SONAME *//p')
loaded=$(ldd "$stage/consumer")
if [ "$soname" != "$want_soname" ] || ! grep -q "$want_soname" <<<"$loaded"; then
  echo "not ok - soname $soname, want $want_soname" >&2
  exit 1
fi
echo "ok - soname $soname"
# Every symbol the library defines carries a version of its own, and a
# program records the one it needs: the loader refuses a library older
# than the calls it makes at start-up, not at the first such call.
unversioned=$(objdump -T "$libdir/libpercpuref.so" | awk '$0 ~ /^[0-9a-f]+ / && !/\*UND\*/ &&
              $(NF-1) !~ /^PERCPUREF_0\.[0-9]+(\.[0-9]+)?$/ { print $NF }')
if [ -n "$unversioned" ]; then
  echo "not ok - symbols without a PERCPUREF_ version: $unversioned" >&2
  exit 1
fi
if ! grep -q "PERCPUREF_${version%.*}\b" <<<"$(objdump -p "$stage/consumer")"; then
  echo "not ok - the consumer records no PERCPUREF_${version%.*} version need" >&2
  exit 1
fi
# A function a later 0.4.x added carries that release's node, which the
# consumer (it calls one) then needs: an older library is refused.
if ! grep -q ' PERCPUREF_0\.4\.26 *percpuref_fence_method$' <<<"$(objdump -T "$libdir/libpercpuref.so")" ||
   ! grep -q 'PERCPUREF_0\.4\.26$' <<<"$(objdump -p "$stage/consumer")"; then
  echo "not ok - percpuref_fence_method is not PERCPUREF_0.4.26, or the consumer does not need it" >&2
  exit 1
fi
# 0.4.30's release entry, which every inline put calls.
if ! grep -q ' PERCPUREF_0\.4\.30 *__percpu_ref_release_life$' <<<"$(objdump -T "$libdir/libpercpuref.so")" ||
   ! grep -q 'PERCPUREF_0\.4\.30$' <<<"$(objdump -p "$stage/consumer")"; then
  echo "not ok - __percpu_ref_release_life is not PERCPUREF_0.4.30, or the consumer does not need it" >&2
  exit 1
fi
echo "ok - symbol versions: every symbol PERCPUREF_${version%.*}(.N), needed by the consumer"
# The headers' version is the build's.
header_version=$(printf '#include <percpuref/percpu_ref.h>\nPERCPUREF_VERSION_MAJOR.PERCPUREF_VERSION_MINOR.PERCPUREF_VERSION_PATCH\n' |
                 cc -E -P $(pkg-config --cflags percpuref) - | tail -n 1 | tr -d ' ')
if [ "$header_version" != "$version" ]; then
  echo "not ok - percpuref/version.h says $header_version, pkg-config $version" >&2
  exit 1
fi
echo "ok - version.h: $header_version"

cmake -S "$src/tests/install/cmake_consumer" -B "$stage/cmake-build" -G Ninja \
      -DCMAKE_PREFIX_PATH="$root" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$stage/cmake-build" >/dev/null
"$stage/cmake-build/consumer_shared"
"$stage/cmake-build/consumer_static"
# grep -q on ldd's output, not on a pipe from it: with pipefail, a grep that
# stops at its first match can make ldd die of SIGPIPE and the test read "no".
if grep -q libpercpuref <<<"$(ldd "$stage/cmake-build/consumer_static")"; then
  echo "not ok - percpuref::percpuref_static links the shared library" >&2
  exit 1
fi
echo "ok - find_package: percpuref::percpuref and percpuref::percpuref_static"

# Where pkg-config finds no liburcu-bp: an optional find_package() goes on
# without percpuref, and a REQUIRED one fails saying why; with it (the
# control), the same project finds the package.
no_pc="$stage/no-pkgconfig"
mkdir "$no_pc"
optional_configure() { # BUILD_DIR [CMAKE_ARGS...]
  local dir=$1
  shift
  cmake -S "$src/tests/install/optional_consumer" -B "$stage/$dir" \
        -DCMAKE_PREFIX_PATH="$root" "$@" 2>&1
}
if ! out=$(PKG_CONFIG_LIBDIR="$no_pc" PKG_CONFIG_PATH= optional_configure optional-none) ||
   ! grep -q "percpuref: not found" <<<"$out"; then
  echo "not ok - an optional find_package without liburcu-bp: $out" >&2
  exit 1
fi
if out=$(PKG_CONFIG_LIBDIR="$no_pc" PKG_CONFIG_PATH= \
         optional_configure required-none -DPERCPUREF_REQUIRED=ON) ||
   ! grep -q "needs liburcu-bp, which pkg-config did not find" <<<"$out"; then
  echo "not ok - a REQUIRED find_package without liburcu-bp: $out" >&2
  exit 1
fi
if ! out=$(optional_configure optional-found) || ! grep -q "percpuref: found" <<<"$out"; then
  echo "not ok - an optional find_package with liburcu-bp: $out" >&2
  exit 1
fi
echo "ok - find_package without liburcu-bp: not found (optional), refused with the reason (REQUIRED)"

# Built in a user's tree: the same targets by the same names, and nothing
# of percpuref's own but the libraries (no scdoc needed, no tests built).
cmake -S "$src/tests/install/subdir_consumer" -B "$stage/subdir-build" -G Ninja \
      -DPERCPUREF_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=$(cmake --build "$stage/subdir-build" --target help)
for extra in percpuref-bench test_percpu_ref example_; do
  if grep -q -- "$extra" <<<"$targets"; then
    echo "not ok - add_subdirectory builds percpuref's $extra too" >&2
    exit 1
  fi
done
cmake --build "$stage/subdir-build" >/dev/null
"$stage/subdir-build/consumer_shared"
"$stage/subdir-build/consumer_static"
echo "ok - add_subdirectory: percpuref::percpuref and percpuref::percpuref_static, the library alone"

# The .pc file's paths: no doubled slash (the prefix ended in one).
if grep -q '//' <(grep -v '^#' "$pcdir/percpuref.pc"); then
  echo "not ok - percpuref.pc: $(grep -v '^#' "$pcdir/percpuref.pc" | grep '//')" >&2
  exit 1
fi

# option_on NAME: the build has the CMake option NAME on (its cache, with
# CMake's true values).
option_on() {
  local value
  value=$(sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt")
  case ${value^^} in ON | 1 | TRUE | YES | Y) return 0 ;; esac
  return 1
}

if option_on PERCPUREF_MAN; then
  mandir="$root/share/man/man3"
  pages=0
  # PAGE GUIDE pairs: each guide a page names in share/doc/percpuref,
  # checked with the installed guides below.
  man_guides=()
  # Each page's render at 200 columns, for the exported functions' check.
  declare -A rendered_200
  for family in percpu_ref percpu_ref_managed percpu_rcuref kref rcuref hcount; do
    test -f "$mandir/$family.3" || { echo "not ok - no man page $family(3)" >&2; exit 1; }
  done
  for page in "$mandir"/*.3; do
    # A page renders without warnings and names its family in NAME (the
    # one-line .so pages render the page they include).
    rendered_80=$(cd "$root/share/man" && MANWIDTH=80 man --warnings -P cat -l "$page" 2>"$stage/warnings")
    if [ -s "$stage/warnings" ]; then
      echo "not ok - man -l $page: $(cat "$stage/warnings")" >&2
      exit 1
    fi
    name=$(basename "$page" .3)
    rendered=$(cd "$root/share/man" && MANWIDTH=200 man -P cat -l "$page")
    rendered_200[$page]=$rendered
    grep -q -- "$name" <<<"$rendered" ||
      { echo "not ok - man -l $page does not render $name" >&2; exit 1; }
    # Every name of a family page's NAME whole at 80 columns (the .so
    # pages render one of those): groff's man macros, loaded at .TH,
    # turned hyphenation back on, and "per-\ncpu_ref_get_many" cannot be
    # copied into a program.
    if ! grep -q '^\.so ' "$page"; then
      names=$(sed -n '/^\.SH NAME/,/^\.SH [^N]/{/^[^.]/p}' "$page" | sed 's/ - .*//; s/,/ /g')
      name_80=$(sed -n '/^NAME/,/^[A-Z]/{/^ /p}' <<<"$rendered_80" | tr '\n' ' ')
      test -n "$names" || { echo "not ok - no NAME line in $page" >&2; exit 1; }
      for each in $names; do
        grep -qE -- "(^| )$each(,| |$)" <<<"$name_80" ||
          { echo "not ok - man -l $page at 80 columns splits $each in NAME: $name_80" >&2; exit 1; }
      done
    fi
    for guide in $(grep -o 'docs/[a-z_0-9]*\.md in share/doc/percpuref' <<<"$rendered" | cut -d' ' -f1); do
      man_guides+=("$page" "$guide")
    done
    pages=$((pages + 1))
  done
  echo "ok - $pages man pages render with man -l"
  # Every function the installed headers export has a page that names it
  # with its parentheses (its family's, through the link a NAME line makes),
  # but for the slow paths their inline fast paths call (__name,
  # name_slowpath).  Declarations are read with their lines joined: one
  # split after its return type is still found.
  exported=$(cat "$root"/include/percpuref/*.h | tr '\n' ' ')
  exported=$(grep -o 'PERCPUREF_API[^(;]*(' <<<"$exported" |
             sed -E 's/.*[ *]([A-Za-z_0-9]+)[(]$/\1/' | grep -v -e '^__' -e '_slowpath$' | sort -u)
  test -n "$exported" || { echo "not ok - no exported function found in the headers" >&2; exit 1; }
  missing=""
  for fn in $exported; do
    page="$mandir/$fn.3"
    if ! test -f "$page" || ! grep -q -- "$fn(" <<<"${rendered_200[$page]}"; then
      missing="$missing $fn"
    fi
  done
  if [ -n "$missing" ]; then
    echo "not ok - exported functions without a man page that names them:$missing" >&2
    exit 1
  fi
  echo "ok - every exported function ($(wc -w <<<"$exported")) has a man page"
else
  echo "ok - # SKIP PERCPUREF_MAN is off: no man pages installed"
fi

if option_on PERCPUREF_DOCS; then
  # The guides the man pages and the headers' comments point to, the README,
  # the licence and the examples' sources, in share/doc/percpuref.
  docdir="$root/share/doc/percpuref"
  docs=0
  for f in "$src"/docs/*.md "$src/README.md" "$src/LICENSE" "$src"/examples/*.[ch]; do
    name=${f#"$src"/}
    cmp -s "$f" "$docdir/$name" || { echo "not ok - $docdir/$name is not $f" >&2; exit 1; }
    docs=$((docs + 1))
  done
  if option_on PERCPUREF_MAN; then
    named=$((${#man_guides[@]} / 2))
    for ((i = 0; i < ${#man_guides[@]}; i += 2)); do
      test -f "$docdir/${man_guides[i + 1]}" ||
        { echo "not ok - ${man_guides[i]} names ${man_guides[i + 1]}, not installed" >&2; exit 1; }
    done
    test "$named" -ge 6 || { echo "not ok - the man pages name $named guides in share/doc/percpuref" >&2; exit 1; }
  fi
  # Each installed example is the complete program the man pages call it:
  # built from there as C11 against the installed library, warnings as
  # errors, and run.
  for example in "$docdir"/examples/*.c; do
    name=$(basename "$example" .c)
    cc -std=c11 -Wall -Wextra -Werror -o "$stage/example-$name" "$example" \
       $(pkg-config --cflags --libs percpuref) -Wl,-rpath,"$libdir" ||
      { echo "not ok - the installed $name.c does not build as C11" >&2; exit 1; }
    "$stage/example-$name" >/dev/null || { echo "not ok - the installed $name.c failed" >&2; exit 1; }
  done
  echo "ok - $docs files in share/doc/percpuref, laid out as in the source: README, LICENSE, docs/, examples/"
else
  echo "ok - # SKIP PERCPUREF_DOCS is off: no guides installed"
fi

# The uninstall target removes what an installation wrote, staged with the
# same DESTDIR: no file is left, nor the package's own directories, but a
# user's file beside its headers, and its directory, stay.  The stage's path
# has a blank and a "[" (a path with "[" once made two manifest lines one,
# and a glob saw a directory empty that was not).  A second run, which
# finds every file gone, fails saying so, as does one without a manifest.
again="$stage/again [1"
DESTDIR="$again" cmake --install "$build" --prefix /opt/prefix >/dev/null
installed=$(find "$again" ! -type d | wc -l)
echo mine >"$again/opt/prefix/include/mine.h"
mkdir -p "$again/opt/prefix/include/percpuref-extra"
DESTDIR="$again" cmake --build "$build" --target uninstall >/dev/null
left=$(find "$again" ! -type d -o -type d -name percpuref)
if [ "$installed" -lt 10 ] || [ "$left" != "$again/opt/prefix/include/mine.h" ] ||
   [ ! -d "$again/opt/prefix/include/percpuref-extra" ]; then
  echo "not ok - uninstall of $installed installed files left: $left" >&2
  exit 1
fi
mkdir -p "$again/opt/prefix/include/percpuref"
echo mine >"$again/opt/prefix/include/percpuref/mine.h"
DESTDIR="$again" cmake --install "$build" --prefix /opt/prefix >/dev/null
DESTDIR="$again" cmake --build "$build" --target uninstall >/dev/null
if [ ! -f "$again/opt/prefix/include/percpuref/mine.h" ]; then
  echo "not ok - uninstall removed a user's file among the headers" >&2
  exit 1
fi
if again_out=$(DESTDIR="$again" cmake --build "$build" --target uninstall 2>&1) ||
   ! grep -q 'uninstall: none of the [0-9]* files' <<<"$again_out"; then
  echo "not ok - a second uninstall: $again_out" >&2
  exit 1
fi
if err=$(cmake -DMANIFEST="$stage/no-manifest" -P "$src/cmake/uninstall.cmake" 2>&1) ||
   ! grep -q 'no-manifest not found' <<<"$err"; then
  echo "not ok - uninstall without a manifest: $err" >&2
  exit 1
fi
echo "ok - uninstall: $installed files removed, a user's files kept"

# CMake's messages, wrapped at blanks, on one line.
flat() {
  local line
  line=$(tr -s ' \n' '  ' <<<"$1")
  printf '%s' "${line% }"
}
# A prefix with a newline or a ';' is refused before anything is
# installed, and the manifest is left as it was: it lists a path a line
# (CMake writes it from a list), and an uninstall removed another
# installation's files, named by one half of such a path.  So is such an
# installation directory, when the build is configured.
other="$stage/other"
DESTDIR="$other" cmake --install "$build" --prefix /opt/prefix >/dev/null
cp "$manifest" "$stage/manifest.other"
for sep in $'\n' ';'; do
  if err=$(cmake --install "$build" --prefix "$stage/split$sep$other/opt/prefix" 2>&1) ||
     ! grep -qF 'prefix holds a newline or' <<<"$(flat "$err")" ||
     [ -n "$(find "$stage" -maxdepth 1 -name 'split*')" ] ||
     ! cmp -s "$manifest" "$stage/manifest.other"; then
    echo "not ok - an installation into a prefix with '$sep': $err" >&2
    exit 1
  fi
done
if err=$(cmake -S "$src" -B "$stage/split-build" -DCMAKE_INSTALL_INCLUDEDIR="include;$other" \
           -DPERCPUREF_TESTS=OFF -DPERCPUREF_EXAMPLES=OFF -DPERCPUREF_BENCH=OFF \
           -DPERCPUREF_MAN=OFF 2>&1) ||
   ! grep -qF "$(flat "CMAKE_INSTALL_INCLUDEDIR ('include;$other') holds a newline or ';'")" \
     <<<"$(flat "$err")"; then
  echo "not ok - a build configured with an include directory with ';': $err" >&2
  exit 1
fi
# A listed file that cannot be removed (here a directory that is not
# empty) fails the target, naming it, once every other file is removed.
header="$other/opt/prefix/include/percpuref/percpu_ref.h"
rm "$header"
mkdir "$header"
echo mine >"$header/mine"
if err=$(DESTDIR="$other" cmake --build "$build" --target uninstall 2>&1) ||
   ! grep -qF "$(flat "cannot remove $header")" <<<"$(flat "$err")" ||
   ! grep -qF '1 could not be' <<<"$(flat "$err")" ||
   [ "$(find "$other" ! -type d)" != "$header/mine" ]; then
  echo "not ok - an uninstall with a file it cannot remove: $err" >&2
  exit 1
fi
# None removable, all there: said so, not "none is there".
printf '%s\n' "$header" >"$stage/manifest.unremovable"
if err=$(cmake -DMANIFEST="$stage/manifest.unremovable" -P "$src/cmake/uninstall.cmake" 2>&1) ||
   ! grep -qF '0 of 1 files removed, 1 could not be' <<<"$(flat "$err")"; then
  echo "not ok - an uninstall that can remove none of its files: $err" >&2
  exit 1
fi
# DESTDIR as the installation read it: a relative one is refused (the
# target runs in the build directory), a backslash is a slash, a ':' a
# ':' (file(TO_CMAKE_PATH) made it a ';'), a leading '~' $HOME.
# Installs under DESTDIR=$1, as a user writes it, whose files land in $2,
# with the installation's further arguments after them: as many as the
# first installation above; then an uninstall with the same DESTDIR
# leaves none.
uninstalls_all() {
  local files err=
  DESTDIR="$1" cmake --install "$build" --prefix /opt/prefix "${@:3}" >/dev/null
  files=$(find "$2" ! -type d | wc -l)
  if [ "$files" != "$installed" ] ||
     ! err=$(DESTDIR="$1" cmake --build "$build" --target uninstall 2>&1) ||
     [ -n "$(find "$2" ! -type d)" ]; then
    echo "not ok - DESTDIR='$1': $files files installed, not all uninstalled: $err" >&2
    exit 1
  fi
}
build_abs=$(cd "$build" && pwd)
(cd "$stage" && DESTDIR=rel cmake --install "$build_abs" --prefix /opt/prefix >/dev/null)
rel_files=$(find "$stage/rel" ! -type d | wc -l)
if [ "$rel_files" != "$installed" ] ||
   err=$(DESTDIR=rel cmake --build "$build" --target uninstall 2>&1) ||
   ! grep -qF "DESTDIR 'rel' is relative" <<<"$(flat "$err")" ||
   [ "$(find "$stage/rel" ! -type d | wc -l)" != "$rel_files" ]; then
  echo "not ok - an uninstall with a relative DESTDIR ($rel_files files): $err" >&2
  exit 1
fi
uninstalls_all "$stage/rel" "$stage/rel"
uninstalls_all "$stage/back\\slash:colon" "$stage/back/slash:colon"
# A DESTDIR of '~/…' (quoted: the shell left the '~') is under $HOME.
HOME="$stage/home" uninstalls_all '~/tilde' "$stage/home/tilde"
# An installation of one component (all of ours is "Unspecified") writes
# install_manifest_Unspecified.txt, not install_manifest.txt (another
# prefix here, so that the latter names none of its files): the
# uninstall reads the last installation's manifest, whichever wrote it,
# even where both have the same time (a coarse clock: FAT, some NFS).
uninstalls_all "$stage/component" "$stage/component" --component Unspecified --prefix /opt/component
uninstalls_all "$stage/after-component" "$stage/after-component"
DESTDIR="$stage/tie" cmake --install "$build" --prefix /opt/component --component Unspecified >/dev/null
touch -r "$build/install_manifest_Unspecified.txt" "$manifest"
if ! err=$(DESTDIR="$stage/tie" cmake --build "$build" --target uninstall 2>&1) ||
   [ -n "$(find "$stage/tie" ! -type d)" ]; then
  echo "not ok - a component's installation, its manifest as old as the other: $err" >&2
  exit 1
fi
echo "ok - uninstall: a newline or ';' in the prefix refused, a file it cannot remove named, DESTDIR as installed, one component's installation"
