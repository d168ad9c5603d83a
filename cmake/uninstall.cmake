# SPDX-License-Identifier: MIT
# The uninstall target (cmake -P, from CMakeLists.txt): removes every file
# the build's last installation listed in its manifest, which names them
# without DESTDIR (a staged installation is removed with the same
# DESTDIR), then each of the package's own directories (include/percpuref,
# <libdir>/cmake/percpuref, share/doc/percpuref, its docs and examples)
# that this leaves empty.  A file already gone is said; one that cannot be
# removed is said and fails the target once the others are removed, and
# so does a manifest none of whose files is there (uninstalled already,
# another DESTDIR, or a later installation of this build elsewhere, which
# rewrote the manifest).  Nothing else is touched: shared directories
# (lib, share/man/man3) stay.  DESTDIR is read as the installation read
# it (backslashes are slashes, a leading '~' the home directory), and must
# be absolute: the target runs in the build directory, not where the
# installation ran.
#
# The target gives BUILD_DIR: the manifest is the one the last
# installation of our files wrote (an installation of another component
# installs none and leaves the name alone), install_manifest.txt, or
# install_manifest_<C>.txt for an installation of component C
# (`--component Unspecified`: every file of ours is in that one), as its
# last rule wrote C in install_manifest.component (CMakeLists.txt).  Not
# the newer file: two installations in one tick of a coarse clock (FAT,
# some NFS) tie.  A build directory whose last installation predates that
# rule has no name: install_manifest.txt, as before.  -DMANIFEST names
# one instead.
#
# The manifest is read line by line as text, never as a CMake list, and
# directories are removed by rmdir, which refuses one that is not empty:
# a path with "[" in it made a list of two lines one entry, and a glob
# that saw a pattern in it found a directory empty that was not.
if(NOT DEFINED MANIFEST)
  set(MANIFEST "${BUILD_DIR}/install_manifest.txt")
  if(EXISTS "${BUILD_DIR}/install_manifest.component")
    file(READ "${BUILD_DIR}/install_manifest.component" component)
    if(NOT component STREQUAL "")
      set(MANIFEST "${BUILD_DIR}/install_manifest_${component}.txt")
    endif()
  endif()
endif()
if(NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "uninstall: ${MANIFEST} not found: nothing was installed from this "
                      "build directory (cmake --install writes it)")
endif()
# Not file(TO_CMAKE_PATH): it reads a list of paths, a ':' a separator.
# A leading '~' is the home directory, as the installation took it.
string(REPLACE "\\" "/" destdir "$ENV{DESTDIR}")
if(destdir MATCHES "^~(/|$)" AND DEFINED ENV{HOME})
  string(SUBSTRING "${destdir}" 1 -1 destdir_below_home)
  set(destdir "$ENV{HOME}${destdir_below_home}")
endif()
if(NOT destdir STREQUAL "" AND NOT IS_ABSOLUTE "${destdir}")
  message(FATAL_ERROR "uninstall: DESTDIR '${destdir}' is relative: give it as an absolute "
                      "path (this runs in the build directory, not where the installation ran)")
endif()
file(READ "${MANIFEST}" manifest)
set(listed 0)
set(removed 0)
set(failed 0)
while(NOT manifest STREQUAL "")
  string(FIND "${manifest}" "\n" eol)
  if(eol EQUAL -1)
    set(file "${manifest}")
    set(manifest "")
  else()
    string(SUBSTRING "${manifest}" 0 ${eol} file)
    math(EXPR next "${eol} + 1")
    string(SUBSTRING "${manifest}" ${next} -1 manifest)
  endif()
  if(file STREQUAL "")
    continue()
  endif()
  math(EXPR listed "${listed} + 1")
  set(path "${destdir}${file}")
  if(NOT EXISTS "${path}" AND NOT IS_SYMLINK "${path}")
    message(STATUS "Already gone: ${path}")
    continue()
  endif()
  file(REMOVE "${path}")
  if(EXISTS "${path}" OR IS_SYMLINK "${path}")
    message(SEND_ERROR "uninstall: cannot remove ${path}")
    math(EXPR failed "${failed} + 1")
    continue()
  endif()
  message(STATUS "Removed: ${path}")
  math(EXPR removed "${removed} + 1")
  # The package's own directories: one named percpuref, and the docs or
  # examples inside one (share/doc/percpuref/docs), then that percpuref;
  # no other directory inside a percpuref (lib, under a prefix of that
  # name).  Each rmdir fails, quietly, while the directory holds anything
  # else.  A walk up, not a list of the two: a list whose items hold an
  # unmatched "[" reads as one item (cmake -P: "a [1;b" is one).
  get_filename_component(dir "${path}" DIRECTORY)
  foreach(level RANGE 1)
    get_filename_component(dir_name "${dir}" NAME)
    get_filename_component(parent "${dir}" DIRECTORY)
    get_filename_component(parent_name "${parent}" NAME)
    if(NOT dir_name STREQUAL "percpuref" AND
       NOT (level EQUAL 0 AND dir_name MATCHES "^(docs|examples)$" AND
            parent_name STREQUAL "percpuref"))
      break()
    endif()
    execute_process(COMMAND rmdir "${dir}" RESULT_VARIABLE not_empty
                    OUTPUT_QUIET ERROR_QUIET)
    if(not_empty)
      break()
    endif()
    message(STATUS "Removed: ${dir}/")
    if(dir_name STREQUAL "percpuref")
      break()
    endif()
    set(dir "${parent}")
  endforeach()
endwhile()
if(failed)
  message(FATAL_ERROR "uninstall: ${removed} of ${listed} files removed, ${failed} could "
                      "not be (above)")
endif()
if(listed AND NOT removed)
  message(FATAL_ERROR "uninstall: none of the ${listed} files ${MANIFEST} lists is there "
                      "(DESTDIR '${destdir}'): uninstalled already, or installed "
                      "elsewhere since (the manifest is the build's last installation's)")
endif()
message(STATUS "uninstall: ${removed} of ${listed} files removed")
