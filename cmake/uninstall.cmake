# SPDX-License-Identifier: MIT
# The uninstall target (cmake -P, from CMakeLists.txt): removes every file
# the build's last installation listed in MANIFEST (its
# install_manifest.txt, which names them without DESTDIR: a staged
# installation is removed with the same DESTDIR), then the package's own
# directories (include/percpuref, <libdir>/cmake/percpuref) where that
# left them empty.  A file already gone is said, not an error; one that
# cannot be removed is.  Nothing else is touched: shared directories
# (lib, share/man/man3) stay.
if(NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "uninstall: ${MANIFEST} not found: nothing was installed from this "
                      "build directory (cmake --install writes it)")
endif()
file(STRINGS "${MANIFEST}" installed)
set(own_dirs "")
set(removed 0)
foreach(file IN LISTS installed)
  set(path "$ENV{DESTDIR}${file}")
  get_filename_component(dir "${path}" DIRECTORY)
  get_filename_component(dir_name "${dir}" NAME)
  if(dir_name STREQUAL "percpuref")
    list(APPEND own_dirs "${dir}")
  endif()
  if(NOT EXISTS "${path}" AND NOT IS_SYMLINK "${path}")
    message(STATUS "Already gone: ${path}")
    continue()
  endif()
  file(REMOVE "${path}")
  if(EXISTS "${path}" OR IS_SYMLINK "${path}")
    message(FATAL_ERROR "uninstall: cannot remove ${path}")
  endif()
  message(STATUS "Removed: ${path}")
  math(EXPR removed "${removed} + 1")
endforeach()
list(REMOVE_DUPLICATES own_dirs)
foreach(dir IN LISTS own_dirs)
  file(GLOB left "${dir}/*")
  if(IS_DIRECTORY "${dir}" AND NOT left)
    file(REMOVE_RECURSE "${dir}")
    message(STATUS "Removed: ${dir}/")
  endif()
endforeach()
message(STATUS "uninstall: ${removed} files removed")
