/* SPDX-License-Identifier: MIT */
/*
 * The library's version, for code that must know at compile time whether
 * a call exists (percpuref_set_library_cpus() came in 0.4.3,
 * percpuref_fork_generation() in 0.4.23):
 *
 *   #if PERCPUREF_VERSION_NUMBER >= PERCPUREF_VERSION_OF(0, 4, 23)
 *
 * The build reads its version from here (CMakeLists.txt), so the two
 * cannot differ.  At run time the soname (libpercpuref.so.MAJOR.MINOR)
 * and the symbol versions (src/percpuref.map, from 0.4.24 on) keep a
 * program from loading a library older than the calls it makes.
 */
#ifndef PERCPUREF_VERSION_H
#define PERCPUREF_VERSION_H

#define PERCPUREF_VERSION_MAJOR 0
#define PERCPUREF_VERSION_MINOR 4
#define PERCPUREF_VERSION_PATCH 33
#define PERCPUREF_VERSION_OF(major, minor, patch) (((major) << 16) | ((minor) << 8) | (patch))
#define PERCPUREF_VERSION_NUMBER                                              \
	PERCPUREF_VERSION_OF(PERCPUREF_VERSION_MAJOR, PERCPUREF_VERSION_MINOR, \
			     PERCPUREF_VERSION_PATCH)

#endif
