/* SPDX-License-Identifier: MIT */
/*
 * micro_cxx.h - the percpuref::ref_ptr variant of the micro workload, seen
 * from C (implemented in micro_cxx.cpp).  The handle is opaque.
 */
#ifndef PERCPUREF_BENCH_MICRO_CXX_H
#define PERCPUREF_BENCH_MICRO_CXX_H

#include <percpuref/compiler.h>

PERCPUREF_BEGIN_DECLS

/* An owned object and one ref_ptr to it that every thread copies. */
void *micro_ref_ptr_new(void);
/* @n times: copy the shared ref_ptr into a local one and destroy the copy. */
void micro_ref_ptr_pairs(void *handle, unsigned int n);
/* Kills the owner, drops the shared ref_ptr, waits for the release: 0 when
 * the object was freed exactly then, -1 otherwise. */
int micro_ref_ptr_delete(void *handle);

PERCPUREF_END_DECLS

#endif
